//! `toolgate serve`: load the policy, check it against the toolset, open the journal (repairing a
//! crash's leftovers) and the approval/state database, then serve stdio.

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, bail};
use toolgate_demos as demos;
use toolgate_store::journal::Durability;

use crate::gate::{self, check_policy, load_policy};

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    gate: gate::Args,
    /// Built-in toolset to serve: ledger, notes, orders, helpdesk or docs.
    #[arg(long, default_value = "ledger")]
    toolset: String,
    /// docs toolset: a host `fetch_doc` may fetch from, on port 443, or on the port given as
    /// HOST:PORT (an IPv6 address in brackets). Repeatable; default: the built-in documentation
    /// sites.
    #[arg(long = "docs-host", value_name = "HOST[:PORT]")]
    docs_hosts: Vec<String>,
    #[command(flatten)]
    pub(crate) http: crate::http::HttpArgs,
}

pub(crate) async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let policy = load_policy(&args.gate.policy)?;
    gate::check(&args.gate)?;
    // Check against a scratch instance first: a policy that does not fit changes nothing on disk.
    let scratch = tempfile::tempdir().context("cannot create a scratch directory")?;
    let options = demos::Options {
        docs_hosts: args.docs_hosts.clone(),
        ..demos::Options::default()
    };
    let probe = demos::by_name(&args.toolset, scratch.path(), &options)?;
    // A kit toolset must offer every tool it registers (a gateway withholds instead).
    if let Some((name, why)) = probe.catalog().all_withheld().iter().next() {
        bail!("tool {name}: {}", why.reason);
    }
    for warning in check_policy(&policy, probe.as_ref())? {
        tracing::warn!(%warning, "policy");
    }
    drop((probe, scratch));
    let toolset = demos::by_name(&args.toolset, &args.gate.data, &options)?;
    // A bad --grace fails here, before anything is opened.
    args.gate.grace()?;
    let policy_sha256 = policy.sha256().to_owned();
    let gate = gate::open(&args.gate, policy, Durability::Synced, []).await?;
    tracing::info!(
        policy_sha256,
        data = %args.gate.data.display(),
        toolset = %args.toolset,
        head = %gate.journal().head(),
        "toolgate serving"
    );
    gate::serve(gate, Arc::from(toolset), &args.gate, &args.http).await
}
