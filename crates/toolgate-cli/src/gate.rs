//! The wiring `serve`, `proxy` and `agent` share: their common flags, the policy loaded and checked
//! against the tools served, the gate opened on the data directory (journal repaired after a crash,
//! approval queue, state and idempotency stores, redactor, open gate switches, the local caller,
//! approval notifications), and the loop that serves it on stdio or HTTP.
//!
//! All three build the same gate the same way, so a difference between the kit and the gateway
//! is always in what they serve, never in how they are gated. The secrets come in from here (files
//! the flags name, credentials the caller read from the environment): the library never reads
//! either.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use toolgate::notify::{self, Notifier};
use toolgate::server::Gate;
use toolgate::{GateServer, stdio, toolset};
use toolgate_core::policy::Policy;
use toolgate_core::redact::Redactor;
use toolgate_core::secret::Secret;
use toolgate_store::Location;
use toolgate_store::journal::Durability;
use toolgate_store::ledger::Ledger;

/// The flags of a gated server, the same for `serve` and `proxy`.
#[derive(Debug, clap::Args)]
// Flattened into commands whose own flags are `Args` too: an argument group of the same name
// would collide, and nothing here needs one.
#[group(skip)]
pub(crate) struct Args {
    /// Policy file: version 2 TOML, or the seed's policy.json (version 1). Read once at start.
    /// With `proxy`, `defaults.tier = "blocked"` keeps a new upstream tool invisible until the
    /// policy names it.
    #[arg(long, value_name = "FILE")]
    pub(crate) policy: PathBuf,
    /// Data directory: audit.jsonl, toolgate.db (approvals, kill switch, budgets, idempotency
    /// keys) and the toolsets' own state (ledger.wal, …) live here. Created if missing.
    #[arg(long, value_name = "DIR")]
    pub(crate) data: PathBuf,
    /// A file holding one secret (e.g. an API key the tools use): its value is redacted from every
    /// log line, error and echoed argument. Repeatable. Read at start, never printed.
    #[arg(long = "secret-file", value_name = "FILE")]
    secret_files: Vec<PathBuf>,
    /// Seconds to let calls already received finish after stdin closes or SIGINT/SIGTERM
    /// arrives (calls held for an approval answer pending at once); notifications still being
    /// delivered get as long again.
    #[arg(long, value_name = "SECS", default_value_t = 5.0)]
    grace: f64,
    /// POST a signed JSON notification to URL each time a call opens an approval request
    /// (https, or plain http to this machine). Needs --webhook-secret-file.
    #[arg(long, value_name = "URL", requires = "webhook_secret_file")]
    webhook: Option<String>,
    /// A file holding the webhook's signing secret (HMAC-SHA256, at least 16 characters; trimmed).
    /// Read at start, never printed, redacted from every log line.
    #[arg(long, value_name = "FILE", requires = "webhook")]
    webhook_secret_file: Option<PathBuf>,
    /// A file holding a Slack incoming-webhook URL: each new approval request is posted there.
    /// The URL is a credential: read at start, never printed, redacted from every log line.
    #[arg(long, value_name = "FILE")]
    slack_webhook_file: Option<PathBuf>,
    /// Base URL of the approvals console: notifications link to URL/approvals/ID, and a caller
    /// held for a person that declared URL-mode elicitation is sent that page.
    #[arg(long, value_name = "URL")]
    console_url: Option<String>,
    /// Serve Prometheus metrics at http://ADDR/metrics (`PORT` or `HOST:PORT`), on a listener of
    /// their own: calls by tool, decision and outcome, latencies, the approval queue, the kill
    /// switch, readiness. They name every served tool: keep ADDR loopback or internal.
    #[arg(long, value_name = "ADDR")]
    pub(crate) metrics: Option<String>,
    #[command(flatten)]
    pub(crate) store: crate::store::StoreArgs,
    /// With --store postgres://…: sign a checkpoint of the central audit ledger (record count,
    /// head, time) with this Ed25519 private key (PKCS#8 PEM, `openssl genpkey -algorithm
    /// ed25519`). Needs --checkpoint-sink.
    #[arg(long, value_name = "FILE", requires = "checkpoint_sink")]
    checkpoint_key: Option<PathBuf>,
    /// Where each checkpoint goes besides the ledger: a file (JSON lines appended and synced,
    /// kept away from the database) or an http(s) URL it is POSTed to.
    #[arg(long, value_name = "FILE|URL", requires = "checkpoint_key")]
    checkpoint_sink: Option<String>,
    /// Checkpoint after this many records…
    #[arg(long, value_name = "N", default_value_t = 1000)]
    checkpoint_every: u64,
    /// …or after this long, whichever comes first (`30s`, `5m`, `1h`).
    #[arg(long, value_name = "DURATION", default_value = "60s")]
    checkpoint_interval: String,
}

impl Args {
    /// `--grace` as a duration.
    pub(crate) fn grace(&self) -> anyhow::Result<Duration> {
        Duration::try_from_secs_f64(self.grace).context("--grace must be a non-negative number")
    }
}

/// Loads and validates a policy file (version 1 JSON or version 2 TOML).
pub(crate) fn load_policy(path: &Path) -> anyhow::Result<Policy> {
    let bytes =
        std::fs::read(path).with_context(|| format!("cannot read policy {}", path.display()))?;
    Policy::from_bytes(&bytes).with_context(|| format!("cannot load policy {}", path.display()))
}

/// Checks the policy against the tools really served: errors stop start-up, warnings are returned.
pub(crate) fn check_policy(
    policy: &Policy,
    toolset: &dyn toolset::Toolset,
) -> anyhow::Result<Vec<String>> {
    let catalog = toolset.catalog();
    policy
        .check_tools(&catalog.argument_types())
        .context("policy does not fit the served tools")
}

/// A gate variable's value in this process's environment.
pub(crate) fn env_var(name: &str) -> Option<String> {
    // A gate switch is an environment variable by design (seed 004): the person starting the
    // server opens it, and the library is told which are open.
    #[allow(clippy::disallowed_methods)]
    std::env::var(name).ok()
}

/// Everything a gate needs from the data directory: the journal (repaired after a crash), the
/// approval queue, the state and idempotency stores; the redactor, which knows the secrets of
/// `--secret-file` and `credentials` (the command's own, such as upstream tokens) and is
/// installed for the log too; gate switches.
pub(crate) async fn open(
    args: &Args,
    policy: Policy,
    durability: Durability,
    credentials: impl IntoIterator<Item = Secret>,
) -> anyhow::Result<Gate> {
    // First: a bad URL or a missing file stops start-up before the journal or database opens.
    let (notifications, notify_secrets) = notifications(args)?;
    let location = args.store.location(&args.data)?;
    let mut secrets = read_secrets(&args.secret_files)?;
    secrets.extend(credentials);
    secrets.extend(args.store.secret());
    secrets.extend(notify_secrets);
    let redactor = Redactor::new(secrets);
    crate::logging::use_redactor(Arc::new(redactor.clone()));
    let mut gate = Gate::open_at(policy, &args.data, &location, durability)
        .await?
        .with_redactor(redactor)
        .with_switches(env_var)
        .reloadable(env_var)
        .with_principal(toolgate::identity::local_principal());
    if let (Location::Postgres(_), Some(approvals)) = (&location, gate.approvals()) {
        // Replicas share one chain: every decision of every replica lands in it, in commit order.
        let ledger = Ledger::beside(approvals).context("cannot open the central audit ledger")?;
        gate = gate.with_ledger(ledger);
    } else if args.checkpoint_key.is_some() {
        anyhow::bail!(
            "--checkpoint-key signs the central audit ledger: it needs --store postgres://…"
        );
    }
    if let Some(base) = &args.console_url {
        // Checked by `notifications` above, as the links of the messages are.
        gate = gate.with_console(base);
    }
    let Some(config) = notifications else {
        return Ok(gate);
    };
    let notifier = Notifier::start(config).context("cannot start approval notifications")?;
    tracing::info!(
        channels = notifier.channels(),
        "new approval requests are announced"
    );
    Ok(gate.with_notifier(notifier))
}

/// Checks the flags that name files and URLs (notifications) without opening anything, for a
/// command that writes to the data directory before it opens the gate: a bad flag then changes
/// nothing on disk.
pub(crate) fn check(args: &Args) -> anyhow::Result<()> {
    notifications(args).map(drop)
}

/// The notification targets the flags name, read and checked, and the secrets they hold (the
/// webhook's key, the Slack URL) for the redactor; `None` when no target is named.
fn notifications(args: &Args) -> anyhow::Result<(Option<notify::Config>, Vec<Secret>)> {
    let mut config = notify::Config::new();
    let mut secrets = Vec::new();
    if let (Some(url), Some(file)) = (&args.webhook, &args.webhook_secret_file) {
        let secret = read_secret(file, "webhook secret file")?;
        let webhook = notify::Webhook::new(url, &secret).map_err(|error| {
            let flag = match error {
                notify::ConfigError::WeakSecret { .. } => {
                    format!("--webhook-secret-file {}", file.display())
                }
                _ => "--webhook".to_owned(),
            };
            anyhow::Error::new(error).context(flag)
        })?;
        config = config.with_webhook(webhook);
        secrets.push(secret);
    }
    if let Some(file) = &args.slack_webhook_file {
        let url = read_secret(file, "Slack webhook file")?;
        // The error names the file, never the URL in it.
        let slack = notify::Slack::new(&url)
            .with_context(|| format!("--slack-webhook-file {}", file.display()))?;
        config = config.with_slack(slack);
        secrets.push(url);
    }
    if let Some(base) = &args.console_url {
        config = config.with_console(notify::Console::new(base).context("--console-url")?);
    }
    Ok(((!config.is_empty()).then_some(config), secrets))
}

/// Signs checkpoints of the central ledger while the server runs, when a key is given.
fn checkpoints(
    gate: &Gate,
    args: &Args,
) -> anyhow::Result<Option<crate::checkpoint::CheckpointTask>> {
    let (Some(key), Some(sink), Some(ledger)) =
        (&args.checkpoint_key, &args.checkpoint_sink, gate.ledger())
    else {
        return Ok(None);
    };
    let signer = crate::checkpoint::Signer::from_file(key)?;
    let interval = toolgate_core::policy::parse_duration(&args.checkpoint_interval)
        .filter(|d| !d.is_zero())
        .context("--checkpoint-interval takes a duration like 30s, 5m, 1h")?;
    anyhow::ensure!(
        args.checkpoint_every > 0,
        "--checkpoint-every must be at least 1"
    );
    let every = crate::checkpoint::Every {
        records: args.checkpoint_every,
        interval,
    };
    tracing::info!(every = args.checkpoint_every, interval = %args.checkpoint_interval, "signing audit checkpoints");
    Ok(Some(crate::checkpoint::start(
        ledger.clone(),
        signer,
        crate::checkpoint::Sink::parse(sink),
        every,
    )))
}

/// Gives notifications still being delivered up to `limit` before the process exits, and says
/// how many did not make it (their approvals stay decidable all the same).
pub(crate) async fn settle(notifier: Option<&Notifier>, limit: Duration) {
    let Some(notifier) = notifier else {
        return;
    };
    let undelivered = notifier.drain(limit).await;
    if undelivered > 0 {
        tracing::warn!(
            undelivered,
            waited_ms = u64::try_from(limit.as_millis()).unwrap_or(u64::MAX),
            "approval notifications still undelivered at exit"
        );
    }
}

/// One secret per `--secret-file`, trimmed.
fn read_secrets(files: &[PathBuf]) -> anyhow::Result<Vec<Secret>> {
    files
        .iter()
        .map(|file| read_secret(file, "secret file"))
        .collect()
}

/// The secret in `file`, trimmed; `what` names the file in the error.
fn read_secret(file: &Path, what: &str) -> anyhow::Result<Secret> {
    let value = std::fs::read_to_string(file)
        .with_context(|| format!("cannot read {what} {}", file.display()))?;
    Ok(Secret::new(value.trim().to_owned()))
}

/// Serves `toolset` behind `gate` on stdio until stdin closes or SIGINT/SIGTERM, or on HTTP
/// (`--http`) until SIGINT/SIGTERM; then calls already received get the grace period to finish.
pub(crate) async fn serve(
    gate: Gate,
    toolset: Arc<dyn toolset::Toolset>,
    args: &Args,
    http: &crate::http::HttpArgs,
) -> anyhow::Result<ExitCode> {
    let (data, grace) = (args.data.as_path(), args.grace()?);
    let scraper = match args.metrics.as_deref() {
        Some(address) => Some(crate::metrics::start(&gate, &toolset, address).await?),
        None => None,
    };
    let journal = gate.journal().clone();
    let notifier = gate.notifier().cloned();
    let _checkpoints = checkpoints(&gate, args)?;
    let _reloader = crate::reload::start(gate.clone(), Arc::clone(&toolset), args.policy.clone())?;
    let sweeper = toolgate::server::Sweeper::start(&gate);
    let server = GateServer::new(gate, toolset);
    if http.enabled() {
        crate::http::serve(server, http, data, grace).await?;
    } else {
        stdio::serve(server, grace)
            .await
            .context("stdio transport failed")?;
    }
    drop(sweeper);
    if let Some(scraper) = scraper {
        scraper.abort();
    }
    settle(notifier.as_ref(), grace).await;
    let stats = journal.stats();
    tracing::info!(
        records = stats.records,
        syncs = stats.syncs,
        batches = stats.batches,
        lone = stats.lone,
        head = %journal.head(),
        "journal stats at exit"
    );
    Ok(ExitCode::SUCCESS)
}
