//! `toolgate pin`: connect to each upstream once, read its tools, and write the lock file that
//! `toolgate proxy` enforces. Prints what changed against the lock it replaces, so the person
//! pinning sees exactly which definitions they are accepting.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use toolgate::gateway::{self, Lock};

use crate::proxy::Upstreams;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The policy the lock goes with (its path with `.lock` is the default lock file).
    #[arg(long, value_name = "FILE")]
    policy: PathBuf,
    /// Where to write the lock (default: the policy's path with `.lock`).
    #[arg(long, value_name = "FILE")]
    lock: Option<PathBuf>,
    #[command(flatten)]
    upstreams: Upstreams,
}

pub(crate) async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let path = args
        .lock
        .clone()
        .unwrap_or_else(|| gateway::default_lock_path(&args.policy));
    let old = if path.exists() {
        Some(Lock::load(&path)?)
    } else {
        None
    };
    let fetched = args.upstreams.probe().await?;
    let lock = Lock::of(fetched.iter().map(|(n, t)| (n.as_str(), t.as_slice())));
    let mut report = String::new();
    for (upstream, tools) in &fetched {
        for tool in tools {
            let word = match old.as_ref().map(|o| o.check(upstream, tool)) {
                None | Some(gateway::Pin::New { .. }) => "added",
                Some(gateway::Pin::Changed { .. }) => "CHANGED",
                Some(gateway::Pin::Matches) => "unchanged",
            };
            let _ = writeln!(report, "{word:9} {upstream}/{}", tool.name);
        }
    }
    lock.save(&path)?;
    let count: usize = fetched.iter().map(|(_, t)| t.len()).sum();
    let _ = writeln!(report, "pinned {count} tools in {}", path.display());
    std::io::stdout()
        .lock()
        .write_all(report.as_bytes())
        .context("cannot write to stdout")?;
    Ok(ExitCode::SUCCESS)
}
