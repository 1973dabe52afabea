//! `toolgate agent run | resume | runs`: seed 003's gated agent on this gate. The model is a plan
//! file (`--plan`, the scripted model) or any OpenAI-compatible Chat Completions API (`--model`
//! with `--base-url`); its tools are a built-in toolset (`--toolset`) or upstream MCP servers
//! configured as for `proxy`; every call it makes walks the corridor as `agent:NAME`.
//!
//! The run's events are JSON lines on stdout; logs go to stderr. Exit codes: 0 the run finished;
//! 3 it paused for an approval (the approval id and how to resume are on stderr); 1 it was
//! aborted or the model failed; 2 it could not run.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::json;
use toolgate::agent::openai::{ChatCompletions, Config};
use toolgate::agent::scripted::Scripted;
use toolgate::agent::{Agent, Ending, EventLog, Model, Report, Settings};
use toolgate::gateway::Gateway;
use toolgate::notify::Notifier;
use toolgate::toolset::Toolset;
use toolgate_core::principal::Principal;
use toolgate_core::secret::Secret;
use toolgate_core::time::rfc3339;
use toolgate_demos as demos;
use toolgate_store::journal::Durability;
use toolgate_store::runs::RunStore;

use crate::gate::{self, check_policy, load_policy};
use crate::proxy::{Upstreams, lock_for, tokens};

/// The exit code of a run that paused for a person's decision.
pub(crate) const PAUSED: u8 = 3;

#[derive(Debug, clap::Subcommand)]
pub(crate) enum Command {
    /// Start a run for TASK and drive it until it finishes, pauses for an approval, or is
    /// aborted.
    Run(RunArgs),
    /// Go on with a paused, failed or crashed run (with the flags it was started with).
    Resume(ResumeArgs),
    /// List the runs on a data directory and where each stands.
    Runs(RunsArgs),
}

#[derive(Debug, clap::Args)]
pub(crate) struct RunArgs {
    /// What the user asks the agent to do.
    task: String,
    #[command(flatten)]
    agent: AgentArgs,
}

#[derive(Debug, clap::Args)]
pub(crate) struct ResumeArgs {
    /// The run's id, as `run_started` and `toolgate agent runs` show it.
    run: String,
    #[command(flatten)]
    agent: AgentArgs,
}

#[derive(Debug, clap::Args)]
pub(crate) struct RunsArgs {
    /// The data directory (where toolgate.db lives).
    #[arg(long, value_name = "DIR", default_value = ".")]
    data: PathBuf,
    #[command(flatten)]
    store: crate::store::StoreArgs,
    /// At most this many runs, newest first.
    #[arg(long, default_value_t = 50)]
    limit: u32,
    /// One JSON object per run instead of a table.
    #[arg(long)]
    json: bool,
}

/// What an agent is: its name, model, tools and limits, the same for `run` and `resume`.
#[derive(Debug, clap::Args)]
#[group(skip)]
pub(crate) struct AgentArgs {
    #[command(flatten)]
    gate: gate::Args,
    /// The agent's name: its principal is `agent:NAME` (budgets, approvals, kill switch, audit).
    #[arg(long = "agent", value_name = "NAME", default_value = "agent")]
    agent_name: String,
    /// A built-in toolset (ledger, notes, orders, helpdesk, docs); or give upstreams as for
    /// `proxy`.
    #[arg(long, value_name = "NAME")]
    toolset: Option<String>,
    #[command(flatten)]
    upstreams: Upstreams,
    /// The scripted model: a plan file (`{"steps": [{"name": …, "arguments": {…}}, …]}`).
    #[arg(long, value_name = "FILE", conflicts_with = "model")]
    plan: Option<PathBuf>,
    /// An OpenAI-compatible Chat Completions model, by the name its API knows it by.
    #[arg(long, value_name = "MODEL", requires = "base_url")]
    model: Option<String>,
    /// The API's base URL (requests go to BASE_URL/chat/completions).
    #[arg(long, value_name = "URL")]
    base_url: Option<String>,
    /// A file holding the API key (read once, never printed).
    #[arg(long, value_name = "FILE", conflicts_with = "api_key_env")]
    api_key_file: Option<PathBuf>,
    /// The name of an environment variable holding the API key.
    #[arg(long, value_name = "VAR")]
    api_key_env: Option<String>,
    /// The system prompt for the model.
    #[arg(long, value_name = "TEXT")]
    system: Option<String>,
    /// Seconds one request to the model may take.
    #[arg(long, value_name = "SECS", default_value_t = 60.0)]
    model_timeout: f64,
    /// Model turns a run may take before it is aborted.
    #[arg(long, default_value_t = 8)]
    max_steps: u32,
    /// Approval requests one run may open.
    #[arg(long, default_value_t = 3)]
    max_pending: u32,
    /// Hold the run while a person decides, up to SECS, instead of pausing it (exit 3).
    #[arg(long, value_name = "SECS")]
    wait: Option<f64>,
}

pub(crate) async fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Run(args) => {
            let (agent, notifier) = build(&args.agent).await?;
            let report = agent.start(&args.task).await;
            // A run that paused for a person exits at once: its announcement goes out first.
            gate::settle(notifier.as_ref(), args.agent.gate.grace()?).await;
            Ok(finish(&report?, &args.agent))
        }
        Command::Resume(args) => {
            let (agent, notifier) = build(&args.agent).await?;
            let report = agent.resume(&args.run).await;
            gate::settle(notifier.as_ref(), args.agent.gate.grace()?).await;
            Ok(finish(&report?, &args.agent))
        }
        Command::Runs(args) => list(&args).await,
    }
}

/// The agent the flags describe, on its gate, and the gate's notifier (to settle before exit).
async fn build(args: &AgentArgs) -> anyhow::Result<(Agent, Option<Notifier>)> {
    let model = model(args)?;
    let policy = load_policy(&args.gate.policy)?;
    let specs = match (&args.toolset, args.upstreams.given()) {
        (Some(_), true) => bail!("give either --toolset or upstreams, not both"),
        (None, false) => bail!("no tools: give --toolset NAME, or upstreams as for `proxy`"),
        (Some(_), false) => Vec::new(),
        (None, true) => args.upstreams.specs()?,
    };
    let principal = Principal::new(Agent::principal(&args.agent_name));
    let gate = gate::open(&args.gate, policy, Durability::Synced, tokens(&specs))
        .await?
        .with_principal(principal);
    let toolset: Arc<dyn Toolset> = match &args.toolset {
        Some(name) => Arc::from(demos::by_name(
            name,
            &args.gate.data,
            &demos::Options::default(),
        )?),
        None => {
            let lock = lock_for(&args.gate.policy, None)?;
            // The gateway audits what its upstreams ask of the caller under the agent's gate.
            Arc::new(Gateway::start(specs, lock, gate.clone()).await)
        }
    };
    for warning in check_policy(gate.policy(), toolset.as_ref())? {
        tracing::warn!(%warning, "policy");
    }
    let settings = Settings {
        max_steps: args.max_steps,
        max_pending: args.max_pending,
        wait: args
            .wait
            .map(Duration::try_from_secs_f64)
            .transpose()
            .context("--wait must be a non-negative number of seconds")?,
    };
    let notifier = gate.notifier().cloned();
    let agent = Agent::new(gate, toolset, model, &args.gate.data, EventLog::stdout())?
        .with_settings(settings);
    Ok((agent, notifier))
}

/// The scripted model of `--plan`, or the Chat Completions adapter of `--model`.
fn model(args: &AgentArgs) -> anyhow::Result<Arc<dyn Model>> {
    if let Some(plan) = &args.plan {
        return Ok(Arc::new(Scripted::from_file(plan)?));
    }
    let (Some(name), Some(base_url)) = (&args.model, &args.base_url) else {
        bail!("no model: give --plan FILE, or --model NAME with --base-url URL");
    };
    let mut config = Config::new(base_url.clone(), name.clone());
    config.api_key = api_key(args)?;
    config.system.clone_from(&args.system);
    config.timeout = Duration::try_from_secs_f64(args.model_timeout)
        .context("--model-timeout must be a non-negative number of seconds")?;
    Ok(Arc::new(ChatCompletions::new(config)?))
}

/// The API key from the file or the variable named, if either is.
fn api_key(args: &AgentArgs) -> anyhow::Result<Option<Secret>> {
    if let Some(file) = &args.api_key_file {
        let value = std::fs::read_to_string(file)
            .with_context(|| format!("cannot read the API key file {}", file.display()))?;
        return Ok(Some(Secret::new(value.trim().to_owned())));
    }
    let Some(var) = &args.api_key_env else {
        return Ok(None);
    };
    // The variable's name is given on the command line; its value is the user's credential.
    #[allow(clippy::disallowed_methods)]
    let value = std::env::var(var).with_context(|| format!("the variable {var} is not set"))?;
    Ok(Some(Secret::new(value.trim().to_owned())))
}

/// The exit code for how the run ended, with what a person needs to know on stderr.
fn finish(report: &Report, args: &AgentArgs) -> ExitCode {
    let run = &report.run_id;
    match &report.ending {
        Ending::Finished(_) => ExitCode::SUCCESS,
        Ending::Paused { approval_id } => {
            eprintln!(
                "toolgate: run {run} paused: approval {approval_id} waits for a person \
                 (toolgate approvals approve {approval_id} --data {data}); then: toolgate agent \
                 resume {run} with the same flags",
                data = args.gate.data.display()
            );
            ExitCode::from(PAUSED)
        }
        Ending::Aborted(why) => {
            eprintln!("toolgate: run {run} aborted: {why}");
            ExitCode::FAILURE
        }
        Ending::Failed(why) => {
            eprintln!("toolgate: run {run} stopped: {why}; resume it once the model answers");
            ExitCode::FAILURE
        }
    }
}

async fn list(args: &RunsArgs) -> anyhow::Result<ExitCode> {
    let store = RunStore::beside(&args.store.approvals(&args.data).await?);
    let runs = store
        .list(args.limit)
        .await
        .context("cannot list the runs")?;
    let mut out = std::io::stdout().lock();
    for run in runs {
        if args.json {
            let line = json!({
                "run_id": run.id,
                "agent": run.agent,
                "status": run.status.as_str(),
                "approval_id": run.approval_id,
                "steps": run.steps,
                "input": run.input,
                "outcome": run.outcome,
                "created_at": rfc3339(run.created_at),
                "updated_at": rfc3339(run.updated_at),
            });
            writeln!(out, "{line}")?;
        } else {
            let waiting = run
                .approval_id
                .map(|id| format!(" (waits for {id})"))
                .unwrap_or_default();
            writeln!(
                out,
                "{}  {:<8} {:<20} steps {:<3} {}{waiting}",
                run.id,
                run.status.as_str(),
                run.agent,
                run.steps,
                rfc3339(run.updated_at),
            )?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
