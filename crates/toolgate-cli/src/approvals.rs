//! `toolgate approvals list | show | approve | deny`: a person decides, from another process, while
//! the server runs. The rules (first decision wins, no self-approval, expiry is denial, only the
//! policy's approvers, two distinct approvers where the policy asks for two) are enforced by the
//! store under its write lock, so two people deciding at once cannot both win. `--as human:NAME`
//! is the user NAME for the policy's `user:NAME` entries; a terminal vouches for no group.
//! Exit 0 done (or the vote counted and more are needed), 1 the decision was refused (already
//! decided, expired, self-approval, not an approver, already voted, unknown id), 2 the store
//! cannot be opened.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use serde_json::{Value, json};
use toolgate_core::time::{now_ms, rfc3339};
use toolgate_store::approval::{Approval, ApprovalStore, DecideError, Status, Verdict, Vote};

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
    /// Pending approvals (with --all, decided ones too): tool, arguments (redacted), requester,
    /// tier, why it needs approval, dry run, time left.
    List {
        #[arg(long)]
        all: bool,
    },
    /// One approval in full.
    Show { id: String },
    /// Approve: the call runs once, the next time its caller asks (or at once if it is waiting).
    Approve {
        id: String,
        /// Who decides (default `human:<os user>`). The requester can never decide its own request.
        #[arg(long = "as", value_name = "IDENTITY")]
        identity: Option<String>,
        #[arg(long)]
        reason: Option<String>,
    },
    /// Per tool, how approval requests ended over a window, flagging tools approved nearly
    /// always (approval fatigue: the policy's `defaults.approval_fatigue`, default 0.9).
    Stats {
        /// The window, back from now: `7d`, `24h`, `30m`.
        #[arg(long, default_value = "7d")]
        window: String,
        /// The policy whose `approval_fatigue` threshold applies.
        #[arg(long, value_name = "FILE")]
        policy: Option<PathBuf>,
        /// Flag a tool only once this many of its requests ended.
        #[arg(long, default_value_t = 10)]
        min_decided: u64,
    },
    /// Deny: the caller is told not to retry.
    Deny {
        id: String,
        #[arg(long = "as", value_name = "IDENTITY")]
        identity: Option<String>,
        #[arg(long)]
        reason: String,
    },
}

pub(crate) async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let store = args.store.approvals(&args.data).await?;
    let now = now_ms();
    let mut out = std::io::stdout().lock();
    match args.command {
        Command::List { all } => {
            let rows = store
                .list(all, now)
                .await
                .context("cannot list approvals")?;
            let mut listed = Vec::with_capacity(rows.len());
            for row in rows {
                let votes = store
                    .votes(&row.id)
                    .await
                    .context("cannot read the votes")?;
                listed.push((row, votes));
            }
            if args.json {
                let rows: Vec<Value> = listed
                    .iter()
                    .map(|(row, votes)| describe(row, votes, now))
                    .collect();
                writeln!(out, "{}", Value::Array(rows))?;
            } else if listed.is_empty() {
                writeln!(out, "no {}approvals", if all { "" } else { "pending " })?;
            } else {
                for (row, votes) in &listed {
                    writeln!(out, "{}", summary(row, votes, now))?;
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Stats {
            window,
            policy,
            min_decided,
        } => {
            let window = toolgate_core::policy::parse_duration(&window)
                .with_context(|| format!("--window {window:?} is not a duration like 7d or 24h"))?;
            let threshold = match policy {
                Some(path) => crate::gate::load_policy(&path)?.defaults().approval_fatigue,
                None => toolgate_core::policy::Defaults::default().approval_fatigue,
            };
            let window_ms = i64::try_from(window.as_millis()).unwrap_or(i64::MAX);
            let stats = store
                .stats(now.saturating_sub(window_ms), now)
                .await
                .context("cannot count approvals")?;
            for tool in &stats {
                let fatigued = tool.decided() >= min_decided && tool.approval_rate() >= threshold;
                if args.json {
                    let line = json!({
                        "tool": tool.tool,
                        "approved": tool.approved,
                        "denied": tool.denied,
                        "expired": tool.expired,
                        "pending": tool.pending,
                        "approval_rate": tool.approval_rate(),
                        "fatigue": fatigued,
                    });
                    writeln!(out, "{line}")?;
                } else {
                    writeln!(
                        out,
                        "{:<24} approved {:>4}  denied {:>4}  expired {:>4}  pending {:>4}  {:>5.1}% approved{}",
                        tool.tool,
                        tool.approved,
                        tool.denied,
                        tool.expired,
                        tool.pending,
                        tool.approval_rate() * 100.0,
                        if fatigued {
                            "  FATIGUE: approved nearly always; raise its threshold or look closer"
                        } else {
                            ""
                        }
                    )?;
                }
            }
            if stats.is_empty() && !args.json {
                writeln!(out, "no approval requests in the window")?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Show { id } => match store
            .get(&id, now)
            .await
            .context("cannot read the approval")?
        {
            Some(row) => {
                let votes = store
                    .votes(&row.id)
                    .await
                    .context("cannot read the votes")?;
                let value = describe(&row, &votes, now);
                if args.json {
                    writeln!(out, "{value}")?;
                } else {
                    writeln!(out, "{}", serde_json::to_string_pretty(&value)?)?;
                }
                Ok(ExitCode::SUCCESS)
            }
            None => {
                eprintln!("toolgate: no approval with id {id}");
                Ok(ExitCode::from(1))
            }
        },
        Command::Approve {
            id,
            identity,
            reason,
        } => {
            decide(
                &store,
                &id,
                identity,
                Verdict::Approve,
                reason.as_deref(),
                args.json,
            )
            .await
        }
        Command::Deny {
            id,
            identity,
            reason,
        } => {
            decide(
                &store,
                &id,
                identity,
                Verdict::Deny,
                Some(&reason),
                args.json,
            )
            .await
        }
    }
}

async fn decide(
    store: &ApprovalStore,
    id: &str,
    identity: Option<String>,
    verdict: Verdict,
    reason: Option<&str>,
    as_json: bool,
) -> anyhow::Result<ExitCode> {
    let identity = identity.unwrap_or_else(toolgate::identity::human);
    let mut out = std::io::stdout().lock();
    match store.decide(id, &identity, verdict, reason, now_ms()).await {
        Ok(row) => {
            if as_json {
                let votes = store
                    .votes(&row.id)
                    .await
                    .context("cannot read the votes")?;
                writeln!(out, "{}", describe(&row, &votes, now_ms()))?;
            } else if row.status == Status::Pending {
                writeln!(
                    out,
                    "{} approved by {identity}: {}; {} approvals are needed, the others must come from other approvers",
                    row.id, row.tool, row.approvals_required
                )?;
            } else {
                writeln!(
                    out,
                    "{} {} by {}: {} ({})",
                    row.id,
                    row.status.as_str(),
                    row.decided_by.as_deref().unwrap_or(&identity),
                    row.tool,
                    row.reason
                )?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(DecideError::Store(error)) => Err(error).context("cannot record the decision"),
        Err(refused) => {
            if as_json {
                writeln!(
                    out,
                    "{}",
                    json!({"id": id, "decided": false, "error": refused.to_string()})
                )?;
            } else {
                eprintln!("toolgate: {refused}");
            }
            Ok(ExitCode::from(1))
        }
    }
}

fn time_left(row: &Approval, now: i64) -> String {
    let left = (row.expires_at - now).max(0) / 1000;
    format!("{}m{:02}s", left / 60, left % 60)
}

fn summary(row: &Approval, votes: &[Vote], now: i64) -> String {
    let would = row
        .dry_run
        .get("would")
        .and_then(Value::as_str)
        .unwrap_or("");
    let mut who = match (&row.approvers, row.approvals_required) {
        (None, 1) => String::new(),
        (None, n) => format!("\n    needs: {n} distinct approvers"),
        (Some(list), n) => format!("\n    needs: {n} of {}", list.join(", ")),
    };
    if !votes.is_empty() && row.approvals_required > 1 {
        let cast: Vec<String> = votes
            .iter()
            .map(|v| {
                let verdict = if v.approve { "approved" } else { "denied" };
                format!("{} {verdict}", v.decider)
            })
            .collect();
        who.push_str(&format!("\n    so far: {}", cast.join(", ")));
    }
    format!(
        "{id}  {status:<8} {tool}  tier {tier}  by {requester}  {left} left\n    args: {args}\n    why: {reason}\n    would: {would}{who}",
        id = row.id,
        status = row.status.as_str(),
        tool = row.tool,
        tier = row.tier,
        requester = row.requester,
        left = time_left(row, now),
        args = row.args_redacted,
        reason = row.reason,
    )
}

fn describe(row: &Approval, votes: &[Vote], now: i64) -> Value {
    let votes: Vec<Value> = votes
        .iter()
        .map(|v| {
            json!({
                "decider": v.decider,
                "verdict": if v.approve { "approve" } else { "deny" },
                "reason": v.reason,
                "at": rfc3339(v.at),
            })
        })
        .collect();
    json!({
        "id": row.id,
        "status": row.status.as_str(),
        "tool": row.tool,
        "arguments": row.args_redacted,
        "requester": row.requester,
        "tier": row.tier,
        "reason": row.reason,
        "dry_run": row.dry_run,
        "created_at": rfc3339(row.created_at),
        "expires_at": rfc3339(row.expires_at),
        "seconds_left": ((row.expires_at - now).max(0)) / 1000,
        "decided_by": row.decided_by,
        "decided_at": row.decided_at.map(rfc3339),
        "decision_reason": row.decision_reason,
        "used": row.used_at.is_some(),
        "approvers": row.approvers,
        "approvals_required": row.approvals_required,
        "votes": votes,
        "policy_sha256": row.policy_sha256,
    })
}
