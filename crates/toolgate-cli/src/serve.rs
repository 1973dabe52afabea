//! `toolgate serve`: load the policy, check it against the toolset, open the journal (repairing a
//! crash's leftovers) and the approval/state database, then serve stdio.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use toolgate::server::Gate;
use toolgate::{GateServer, stdio, toolset};
use toolgate_core::policy::Policy;
use toolgate_core::principal::Principal;
use toolgate_core::redact::Redactor;
use toolgate_core::secret::Secret;
use toolgate_store::approval::ApprovalStore;
use toolgate_store::idempotency::IdempotencyStore;
use toolgate_store::journal::{Durability, Journal};
use toolgate_store::state::StateStore;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Policy file: the seed's policy.json (version 1) or a policy.toml (version 2). Read once at
    /// start.
    #[arg(long, value_name = "FILE")]
    policy: PathBuf,
    /// Data directory: audit.jsonl, ledger.wal and toolgate.db (approvals, kill switch, budgets)
    /// live here. Created if missing.
    #[arg(long, value_name = "DIR")]
    data: PathBuf,
    /// Built-in toolset to serve: ledger, notes or orders.
    #[arg(long, default_value = "ledger")]
    toolset: String,
    /// A file holding one secret (e.g. an API key the tools use): its value is redacted from every
    /// log line, error and echoed argument. Repeatable. Read at start, never printed.
    #[arg(long = "secret-file", value_name = "FILE")]
    secret_files: Vec<PathBuf>,
    /// Seconds to let calls already received finish after stdin closes or SIGINT/SIGTERM
    /// arrives (on stdio, calls held for an approval answer pending at once).
    #[arg(long, value_name = "SECS", default_value_t = 5.0)]
    grace: f64,
    /// docs toolset: a host `fetch_doc` may fetch from. Repeatable; default: the built-in
    /// documentation sites.
    #[arg(long = "docs-host", value_name = "HOST")]
    docs_hosts: Vec<String>,
    #[command(flatten)]
    http: crate::http::HttpArgs,
}

/// Loads and validates a policy file (version 1 JSON or version 2 TOML).
pub(crate) fn load_policy(path: &Path) -> anyhow::Result<Policy> {
    let bytes =
        std::fs::read(path).with_context(|| format!("cannot read policy {}", path.display()))?;
    Policy::from_bytes(&bytes).with_context(|| format!("cannot load policy {}", path.display()))
}

/// Checks the policy against the tools really served: errors stop start-up, warnings are logged.
pub(crate) fn check_policy(
    policy: &Policy,
    toolset: &dyn toolset::Toolset,
) -> anyhow::Result<Vec<String>> {
    let catalog = toolset.catalog();
    policy
        .check_tools(&catalog.argument_types())
        .context("policy does not fit the served tools")
}

/// The values of a gate variable that switch a gated tool on (seed 004), in any case.
const ENABLING: &[&str] = &["1", "true", "yes", "on", "enable", "enabled", "allow"];

/// Gate variables of this policy that are set to an enabling value in the environment.
pub(crate) fn open_gates(policy: &Policy) -> BTreeSet<String> {
    policy
        .tools()
        .filter(|(_, rule)| rule.gated)
        .map(|(name, _)| policy.gate_env(name))
        .filter(|env| {
            std::env::var(env)
                .is_ok_and(|v| ENABLING.iter().any(|e| v.trim().eq_ignore_ascii_case(e)))
        })
        .collect()
}

/// Who calls on stdio: the local user this process runs as.
pub(crate) fn local_principal() -> Principal {
    Principal::new(format!("local:{}", crate::identity::os_user()))
}

fn redactor(files: &[PathBuf]) -> anyhow::Result<Redactor> {
    let mut secrets = Vec::new();
    for file in files {
        let value = std::fs::read_to_string(file)
            .with_context(|| format!("cannot read secret file {}", file.display()))?;
        secrets.push(Secret::new(value.trim().to_owned()));
    }
    Ok(Redactor::new(secrets))
}

pub(crate) async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let policy = load_policy(&args.policy)?;
    // Check against a scratch instance first: a policy that does not fit changes nothing on disk.
    let scratch = tempfile::tempdir().context("cannot create a scratch directory")?;
    let options = toolset::Options {
        docs_hosts: args.docs_hosts.clone(),
        ..toolset::Options::default()
    };
    let probe = toolset::by_name(&args.toolset, scratch.path(), &options)?;
    // A kit toolset must offer every tool it registers (a gateway withholds instead).
    if let Some((name, why)) = probe.catalog().all_withheld().iter().next() {
        bail!("tool {name}: {}", why.reason);
    }
    for warning in check_policy(&policy, probe.as_ref())? {
        tracing::warn!(%warning, "policy");
    }
    drop((probe, scratch));
    let toolset = toolset::by_name(&args.toolset, &args.data, &options)?;
    let grace =
        Duration::try_from_secs_f64(args.grace).context("--grace must be a non-negative number")?;
    let policy_sha256 = policy.sha256().to_owned();
    let gate = open_gate(policy, &args.data, &args.secret_files, Durability::Synced).await?;
    tracing::info!(
        policy_sha256,
        data = %args.data.display(),
        toolset = %args.toolset,
        head = %gate.journal().head(),
        "toolgate serving"
    );
    serve_gate(gate, Arc::from(toolset), grace, &args.http).await
}

/// Everything a gate needs from the data directory: the journal (repaired after a crash), the
/// approval queue, the state and idempotency stores; secrets for the redactor; gate switches.
pub(crate) async fn open_gate(
    policy: Policy,
    data: &Path,
    secret_files: &[PathBuf],
    durability: Durability,
) -> anyhow::Result<Gate> {
    let redactor = redactor(secret_files)?;
    crate::logging::use_redactor(std::sync::Arc::new(redactor.clone()));
    let (journal, recovery) = Journal::open_with(data, durability)
        .with_context(|| format!("cannot open data directory {}", data.display()))?;
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
    let approvals = ApprovalStore::open(data)
        .await
        .context("cannot open the approval queue")?;
    let state = StateStore::beside(&approvals, data).context("cannot open the state store")?;
    let idempotency = IdempotencyStore::beside(&approvals);
    let open = open_gates(&policy);
    Ok(Gate::new(policy, journal)
        .with_approvals(approvals)
        .with_state(state)
        .with_idempotency(idempotency)
        .with_redactor(redactor)
        .with_open_gates(open)
        .with_principal(local_principal()))
}

/// Serves `toolset` behind `gate` on stdio until stdin closes or SIGINT/SIGTERM, or on HTTP
/// (`--http`) until SIGINT/SIGTERM; then calls already received get the grace period to finish.
pub(crate) async fn serve_gate(
    gate: Gate,
    toolset: Arc<dyn toolset::Toolset>,
    grace: Duration,
    http: &crate::http::HttpArgs,
) -> anyhow::Result<ExitCode> {
    let journal = gate.journal().clone();
    let sweeper = tokio::spawn(toolgate::server::audit_resolutions(gate.clone()));
    let server = GateServer::new(gate, toolset);
    if http.enabled() {
        crate::http::serve(server, http, grace).await?;
    } else {
        stdio::serve(server, grace)
            .await
            .context("stdio transport failed")?;
    }
    sweeper.abort();
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
