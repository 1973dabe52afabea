//! `toolgate keys list | forget`: the idempotency keys whose outcome nobody recorded.
//!
//! A call that was forwarded and never reported back (the gateway crashed, the upstream died or
//! timed out mid-call) leaves its key *in doubt*: retries are answered "outcome unknown: verify
//! before retrying" and are not sent again. A person checks the upstream, then either leaves the
//! key (the effect happened; retries stay refused) or forgets it (it did not; the next retry runs).
//! Exit 0 done, 1 nothing to forget under that key, 2 the store cannot be opened.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use serde_json::Value;
use toolgate_core::time::rfc3339;
use toolgate_store::idempotency::IdempotencyStore;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The server's data directory (where toolgate.db lives).
    #[arg(long, value_name = "DIR", global = true, default_value = ".")]
    data: PathBuf,
    #[command(flatten)]
    store: crate::store::StoreArgs,
    /// Print JSON instead of text.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Keys in doubt, and keys still in flight (a running server's own calls show here too).
    List,
    /// Forget a key in doubt after checking that its effect did not happen: the next retry runs.
    Forget {
        #[arg(long)]
        principal: String,
        #[arg(long)]
        tool: String,
        #[arg(long)]
        key: String,
    },
}

pub(crate) async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let store = IdempotencyStore::beside(&args.store.approvals(&args.data).await?);
    let mut out = std::io::stdout().lock();
    match args.command {
        Command::List => {
            // No owner of ours: every unfinished key is listed.
            let rows = store.unresolved("").await.context("cannot list keys")?;
            if args.json {
                let rows = serde_json::to_value(&rows).unwrap_or(Value::Null);
                writeln!(out, "{rows}")?;
            } else if rows.is_empty() {
                writeln!(out, "no keys in doubt or in flight")?;
            } else {
                for row in &rows {
                    writeln!(
                        out,
                        "{:9} principal={} tool={} key={} since {}",
                        row.state.as_str(),
                        row.principal,
                        row.tool,
                        row.key,
                        rfc3339(row.updated_at)
                    )?;
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Forget {
            principal,
            tool,
            key,
        } => {
            if store
                .forget(&principal, &tool, &key)
                .await
                .context("cannot forget the key")?
            {
                writeln!(out, "forgot {tool} key {key:?}: the next retry runs")?;
                Ok(ExitCode::SUCCESS)
            } else {
                drop(out);
                eprintln!(
                    "toolgate: no key in doubt or in flight under {tool} {key:?} for {principal}"
                );
                Ok(ExitCode::from(1))
            }
        }
    }
}
