//! `toolgate serve`: load the policy, open the journal (repairing a crash's leftovers), serve stdio.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, anyhow};
use toolgate::server::Gate;
use toolgate::{GateServer, stdio, toolset};
use toolgate_core::policy::Policy;
use toolgate_store::journal::Journal;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Policy file (the seed's policy.json, version 1). Read once at start.
    #[arg(long, value_name = "FILE")]
    policy: PathBuf,
    /// Data directory: audit.jsonl and ledger.wal live here. Created if missing.
    #[arg(long, value_name = "DIR")]
    data: PathBuf,
    /// Built-in toolset to serve.
    #[arg(long, default_value = "ledger")]
    toolset: String,
    /// Seconds to let calls already received finish after stdin closes.
    #[arg(long, value_name = "SECS", default_value_t = 5.0)]
    grace: f64,
}

/// Loads and validates a policy file.
pub(crate) fn load_policy(path: &std::path::Path) -> anyhow::Result<Policy> {
    let bytes =
        std::fs::read(path).with_context(|| format!("cannot read policy {}", path.display()))?;
    Policy::from_json(&bytes).with_context(|| format!("cannot load policy {}", path.display()))
}

pub(crate) async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let policy = load_policy(&args.policy)?;
    let toolset = toolset::by_name(&args.toolset).map_err(|e| anyhow!(e))?;
    let grace =
        Duration::try_from_secs_f64(args.grace).context("--grace must be a non-negative number")?;
    let (journal, recovery) = Journal::open(&args.data)
        .with_context(|| format!("cannot open data directory {}", args.data.display()))?;
    if let Some((aside, bytes)) = &recovery.torn_audit {
        tracing::warn!(moved_to = %aside.display(), bytes, "torn audit tail moved aside; recovery record appended");
    }
    if recovery.torn_wal_bytes > 0 || recovery.replayed > 0 {
        tracing::warn!(
            torn_wal_bytes = recovery.torn_wal_bytes,
            replayed = recovery.replayed,
            "journal repaired after a crash"
        );
    }
    tracing::info!(
        policy_sha256 = policy.sha256(),
        data = %args.data.display(),
        toolset = %args.toolset,
        head = %journal.head(),
        "toolgate serving on stdio"
    );
    let server = GateServer::new(Gate::new(policy, journal.clone()), Arc::from(toolset));
    stdio::serve(server, grace)
        .await
        .context("stdio transport failed")?;
    let stats = journal.stats();
    tracing::info!(
        records = stats.records,
        syncs = stats.syncs,
        batches = stats.batches,
        head = %journal.head(),
        "journal stats at exit"
    );
    Ok(ExitCode::SUCCESS)
}
