//! `toolgate policy check | explain`: validate a policy, and show how it decides one call.
//! Exit 0 valid (check) or decided (explain), 2 the policy or the arguments cannot be used.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use serde_json::{Map, Value, json};
use toolgate::gateway::exposed_name;
use toolgate::toolset::Catalog;
use toolgate_core::answer::Kind;
use toolgate_core::policy::Action;
use toolgate_core::principal::Principal;
use toolgate_demos as demos;

use crate::gate::{check_policy, env_var, load_policy};
use crate::proxy::Upstreams;

#[derive(Debug, clap::Subcommand)]
pub(crate) enum Command {
    /// Validate a policy file, and check it against a toolset's tools (schemas, argument names,
    /// escalation conditions). Prints warnings; exit 0 when it can be served.
    Check {
        file: PathBuf,
        /// The toolset it will be served with (default: the policy's `name` when it names a
        /// built-in toolset, else ledger).
        #[arg(long, conflicts_with_all = ["upstreams", "config", "command"])]
        toolset: Option<String>,
        /// Or the upstreams it will gate (as for `toolgate proxy`): each is started once and its
        /// tools are read, so the policy is checked against them.
        #[command(flatten)]
        upstreams: Upstreams,
    },
    /// Show the decision for one call: tier before and after escalation, the rule that decided,
    /// and what happens next. Budget and kill switch are taken as fresh (not read from a server).
    Explain {
        file: PathBuf,
        /// Tool name.
        tool: String,
        /// Arguments as a JSON object, e.g. '{"order_id":"ord_1001","amount":49}'.
        args: String,
        /// The caller (default: the local user, `local:<user>`).
        #[arg(long = "as", value_name = "PRINCIPAL")]
        principal: Option<String>,
        /// The toolset it will be served with (default as for `check`).
        #[arg(long)]
        toolset: Option<String>,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
}

pub(crate) async fn run(command: Command) -> anyhow::Result<ExitCode> {
    let scratch = tempfile::tempdir().context("cannot create a scratch directory")?;
    match command {
        Command::Check {
            file,
            toolset,
            upstreams,
        } => {
            let (policy, warnings) = if upstreams.given() {
                load_checked_upstreams(&file, &upstreams).await?
            } else {
                load_checked(&file, toolset.as_deref(), scratch.path())?
            };
            let mut out = std::io::stdout().lock();
            for warning in &warnings {
                writeln!(out, "warning: {warning}")?;
            }
            writeln!(
                out,
                "ok: {} (version {}, sha256 {})",
                file.display(),
                policy.version(),
                policy.sha256()
            )?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Explain {
            file,
            tool,
            args,
            principal,
            toolset,
            json: as_json,
        } => {
            let mut out = std::io::stdout().lock();
            let (policy, _) = load_checked(&file, toolset.as_deref(), scratch.path())?;
            let arguments: Map<String, Value> = match serde_json::from_str(&args) {
                Ok(Value::Object(map)) => map,
                _ => bail!("ARGS must be a JSON object, e.g. '{{\"amount\": 49}}'"),
            };
            let principal =
                principal.map_or_else(toolgate::identity::local_principal, Principal::new);
            let gate_open =
                env_var(&policy.gate_env(&tool)).is_some_and(|v| toolgate::corridor::enabling(&v));
            // The answer the corridor would give, described by the same `Kind` that maps it to
            // the wire and the audit record, so explain cannot drift from what a call gets.
            let (report, text) = match policy.admit(&tool, &arguments) {
                Err(denial) => {
                    let kind = Kind::Denied;
                    (
                        json!({"decision": "deny", "answer": kind.describe(), "audit": audit_of(kind), "rule": denial.rule}),
                        format!(
                            "decision: deny\nanswer: {}\nrule: {}\n",
                            kind.describe(),
                            denial.rule
                        ),
                    )
                }
                Ok(()) => {
                    let assessment = policy.assess(&tool, &arguments, &principal);
                    let verdict = policy.decide(&tool, &assessment, gate_open);
                    let (kind, next) = match verdict.action {
                        Action::Run => (Kind::Ran, "runs".to_owned()),
                        Action::ChargeBudget => (
                            Kind::Ran,
                            format!(
                                "runs while the caller's budget of {} unattended medium calls per {} s lasts, then waits for a person",
                                policy.defaults().medium_budget,
                                policy.defaults().medium_window.as_secs()
                            ),
                        ),
                        Action::Deny => (Kind::Denied, "deny".to_owned()),
                        Action::RefuseWithDryRun => (
                            Kind::DryRun,
                            format!(
                                "refused with a dry run until {} is set",
                                policy.gate_env(&tool)
                            ),
                        ),
                        Action::NeedsApproval => {
                            (Kind::Pending, "waits for a person's approval".to_owned())
                        }
                    };
                    let report = json!({
                        "decision": verdict.action,
                        "answer": kind.describe(),
                        "audit": audit_of(kind),
                        "tier_declared": assessment.declared.as_str(),
                        "tier": verdict.tier.as_str(),
                        "rule": verdict.rule,
                        "undecided_conditions": assessment.undecided,
                        "principal": principal.sub,
                    });
                    let mut text = format!(
                        "decision: {next}\nanswer: {}\ntier: {} -> {}\nrule: {}\n",
                        kind.describe(),
                        assessment.declared.as_str(),
                        verdict.tier.as_str(),
                        verdict.rule
                    );
                    for why in &assessment.undecided {
                        text.push_str(&format!("undecidable (counted as matched): {why}\n"));
                    }
                    (report, text)
                }
            };
            if as_json {
                let mut report = report;
                report["policy_sha256"] = json!(policy.sha256());
                report["tool"] = json!(tool);
                writeln!(out, "{report}")?;
            } else {
                write!(out, "{text}")?;
                writeln!(
                    out,
                    "policy: {} (sha256 {})",
                    file.display(),
                    policy.sha256()
                )?;
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// The audit record's `decision/outcome` for an answer of `kind`.
fn audit_of(kind: Kind) -> String {
    let (decision, outcome) = kind.audit();
    format!("{}/{}", decision.as_str(), outcome.as_str())
}

/// The policy, checked against the tools the upstreams offer now (named as `toolgate proxy`
/// names them). A tool whose schema does not compile is a warning: the proxy would withhold it.
async fn load_checked_upstreams(
    file: &Path,
    upstreams: &Upstreams,
) -> anyhow::Result<(toolgate_core::policy::Policy, Vec<String>)> {
    let policy = load_policy(file)?;
    let fetched = upstreams.probe().await?;
    let prefixed = fetched.len() > 1;
    let mut tools = Vec::new();
    for (upstream, offered) in fetched {
        tools.extend(offered.into_iter().map(|mut tool| {
            tool.name = exposed_name(&upstream, &tool.name, prefixed).into();
            tool
        }));
    }
    let catalog = Catalog::new(tools);
    let mut warnings = policy
        .check_tools(&catalog.argument_types())
        .context("policy does not fit the upstreams' tools")?;
    for (name, why) in catalog.all_withheld() {
        warnings.push(format!(
            "upstream tool {name} would be withheld: {}",
            why.reason
        ));
    }
    Ok((policy, warnings))
}

/// The policy, checked against the toolset (built in a scratch directory: nothing of a real data
/// directory is touched).
fn load_checked(
    file: &Path,
    toolset: Option<&str>,
    scratch: &Path,
) -> anyhow::Result<(toolgate_core::policy::Policy, Vec<String>)> {
    let policy = load_policy(file)?;
    let toolset = toolset.unwrap_or(match policy.name() {
        Some(name @ ("ledger" | "notes" | "orders" | "helpdesk" | "docs")) => name,
        _ => "ledger",
    });
    let tools = demos::by_name(toolset, scratch, &demos::Options::default())?;
    let warnings = check_policy(&policy, tools.as_ref())?;
    Ok((policy, warnings))
}
