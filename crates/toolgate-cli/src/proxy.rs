//! `toolgate proxy`: the gate in front of existing MCP servers (the gateway), on stdio.
//!
//! Upstreams come from `-- COMMAND…` (one, named by `--name`), repeated `--upstream NAME=…`, or
//! `--config FILE`. The lock file (`--lock`, or the policy's path with `.lock` when it exists)
//! pins tool definitions; without one the gateway says so at start and pins nothing.

use std::env::VarError;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, bail};
use rmcp::model::Tool;
use toolgate::gateway::{self, Gateway, Lock, Target, Upstream, UpstreamSpec};
use toolgate::toolset::Toolset;
use toolgate_core::redact::Redactor;
use toolgate_core::secret::Secret;
use toolgate_store::journal::Durability;

use crate::gate::{self, check_policy, load_policy};

/// Where the upstreams are; shared by `proxy` and `pin`.
#[derive(Debug, clap::Args)]
pub(crate) struct Upstreams {
    /// Upstreams from a TOML file: `[upstreams.NAME]` with `command` + `args` (+ `env`, `cwd`), or
    /// `url` (+ `bearer_env`).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// An upstream as `NAME=COMMAND ARGS…` (quoted like a shell) or `NAME=https://…/mcp`.
    /// Repeatable; with more than one upstream, tools are named `NAME__tool`.
    #[arg(long = "upstream", value_name = "NAME=COMMAND")]
    upstreams: Vec<String>,
    /// Name of the upstream given after `--` (audit records, lock file).
    #[arg(long, value_name = "NAME")]
    name: Option<String>,
    /// The upstream to start: everything after `--`.
    #[arg(last = true, value_name = "COMMAND")]
    command: Vec<String>,
}

impl Upstreams {
    /// Whether any upstream was named.
    pub(crate) fn given(&self) -> bool {
        self.config.is_some() || !self.upstreams.is_empty() || !self.command.is_empty()
    }

    /// The upstreams named, each HTTP upstream with the bearer token its `bearer_env` names.
    pub(crate) fn specs(&self) -> anyhow::Result<Vec<UpstreamSpec>> {
        let mut specs = Vec::new();
        if let Some(path) = &self.config {
            specs.extend(gateway::from_file(path)?);
        }
        for flag in &self.upstreams {
            specs.push(gateway::from_flag(flag)?);
        }
        if !self.command.is_empty() {
            let name = match &self.name {
                Some(name) => name.clone(),
                None => default_name(&self.command[0]),
            };
            specs.push(gateway::from_command(&name, &self.command)?);
        }
        if specs.is_empty() {
            bail!("no upstream: give `-- COMMAND…`, --upstream NAME=… or --config FILE");
        }
        let mut names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
        names.sort_unstable();
        if let Some(pair) = names.windows(2).find(|w| w[0] == w[1]) {
            bail!("two upstreams are named {:?}", pair[0]);
        }
        specs.into_iter().map(with_token).collect()
    }

    /// Starts each upstream once and reads its tools (for `pin` and `policy check`), in the
    /// order given, each with its upstream's name.
    pub(crate) async fn probe(&self) -> anyhow::Result<Vec<(String, Vec<Tool>)>> {
        let specs = self.specs()?;
        // Nothing here is gated, but an upstream's stderr is logged: keep its token out of it.
        crate::logging::use_redactor(Arc::new(Redactor::new(tokens(&specs))));
        let mut fetched = Vec::new();
        for spec in specs {
            let name = spec.name.clone();
            let tools = Upstream::probe(spec)
                .await
                .with_context(|| format!("upstream {name}"))?;
            fetched.push((name, tools));
        }
        Ok(fetched)
    }
}

/// `spec` with the token of its `bearer_env`, read from this process's environment: the
/// upstream's own credential, never anything a caller of the gateway presents. A variable that
/// is not set stops start-up, as the environment cannot change while the gateway runs.
fn with_token(spec: UpstreamSpec) -> anyhow::Result<UpstreamSpec> {
    let Target::Http {
        bearer_env: Some(var),
        ..
    } = &spec.target
    else {
        return Ok(spec);
    };
    // The one credential the configuration names by variable: read here, at the edge, so the
    // library holds it only as a `Secret`.
    #[allow(clippy::disallowed_methods)]
    let token = match std::env::var(var) {
        Ok(token) => token,
        Err(VarError::NotPresent) => bail!(
            "upstream {}: {var} (the upstream's bearer token) is not set",
            spec.name
        ),
        Err(VarError::NotUnicode(_)) => bail!(
            "upstream {}: {var} (the upstream's bearer token) is not valid Unicode",
            spec.name
        ),
    };
    Ok(spec.with_bearer(Secret::new(token)))
}

/// The upstreams' bearer tokens, for the redactor.
pub(crate) fn tokens(specs: &[UpstreamSpec]) -> Vec<Secret> {
    specs
        .iter()
        .filter_map(|spec| match &spec.target {
            Target::Http { bearer, .. } => bearer.clone(),
            Target::Command { .. } | Target::InProcess(_) => None,
        })
        .collect()
}

/// The command's file name, reduced to the characters an upstream name may hold.
fn default_name(program: &str) -> String {
    let base = Path::new(program)
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let name: String = base
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .take(32)
        .collect();
    if name.trim_matches('-').is_empty() {
        "upstream".to_owned()
    } else {
        name
    }
}

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    gate: gate::Args,
    /// Lock file of pinned tool definitions (default: the policy's path with `.lock`, if it exists).
    #[arg(long, value_name = "FILE")]
    lock: Option<PathBuf>,
    /// `synced`: every audit record is on disk before its call is answered. `buffered`: written
    /// in order before the answer, flushed by the OS (a power cut can lose the newest records).
    #[arg(long, value_name = "MODE", default_value = "synced")]
    audit: AuditMode,
    #[command(flatten)]
    upstreams: Upstreams,
    #[command(flatten)]
    pub(crate) http: crate::http::HttpArgs,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum AuditMode {
    Synced,
    Buffered,
}

pub(crate) async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let policy = load_policy(&args.gate.policy)?;
    let specs = args.upstreams.specs()?;
    let lock = lock_for(&args.gate.policy, args.lock.as_deref())?;
    // A bad --grace fails here, before anything is opened.
    args.gate.grace()?;
    let policy_sha256 = policy.sha256().to_owned();
    let durability = match args.audit {
        AuditMode::Synced => Durability::Synced,
        AuditMode::Buffered => {
            tracing::warn!("audit records are buffered: a power cut can lose the newest ones");
            Durability::Buffered
        }
    };
    let gate = gate::open(&args.gate, policy, durability, tokens(&specs)).await?;
    let names: Vec<String> = specs.iter().map(|s| s.name.clone()).collect();
    let gateway = Gateway::start(specs, lock, gate.clone()).await;
    for warning in check_policy(gate.policy(), &gateway)? {
        tracing::warn!(%warning, "policy");
    }
    tracing::info!(
        policy_sha256,
        data = %args.gate.data.display(),
        upstreams = ?names,
        tools = gateway.catalog().tools().len(),
        head = %gate.journal().head(),
        "toolgate proxy serving"
    );
    gate::serve(gate, Arc::new(gateway), &args.gate, &args.http).await
}

/// The lock to enforce: the one named, else the policy's own if it exists, else none (said
/// loudly: nothing is pinned).
pub(crate) fn lock_for(policy: &Path, named: Option<&Path>) -> anyhow::Result<Option<Lock>> {
    if let Some(path) = named {
        return Ok(Some(Lock::load(path)?));
    }
    let default = gateway::default_lock_path(policy);
    if default.exists() {
        return Ok(Some(Lock::load(&default)?));
    }
    tracing::warn!(
        expected = %default.display(),
        "no lock file: upstream tool definitions are not pinned; run `toolgate pin` to pin them"
    );
    Ok(None)
}
