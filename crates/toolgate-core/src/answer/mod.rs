//! The corridor's answer to one `tools/call` (DESIGN.md §4): one variant per row of the outcome table.
//!
//! Every step of the corridor ends a call with an [`Answer`] or lets it go on; nothing else decides
//! what a call's outcome was. From the answer, and only from it, come the audit record's decision and
//! outcome ([`Kind::audit`]), whether the effect happened ([`Kind::executed`]), the wire form
//! ([`Kind::wire`]) and the words the model reads ([`Answer::message`]). The adapter (rmcp) turns an
//! answer into bytes in one file; `toolgate policy explain` prints [`Kind::describe`]. Keeping the
//! three facts in one value is what stops them contradicting each other: an `executed: false`
//! beside a text that says "it may not have finished" cannot be written here.
//!
//! The tool's own result type is a parameter (`R`), so this module knows no MCP SDK type.

use serde_json::{Map, Value, json};

use crate::audit::{Decision, Outcome};
use crate::policy::Denial;
use crate::time::rfc3339;

/// Whether the call's effect happened, as every error answer tells the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Executed {
    /// Nothing ran: calling again is safe.
    No,
    /// It ran (and may have failed after doing something).
    Yes,
    /// It may have run: verify before retrying.
    Unknown,
}

impl Executed {
    /// `false`, `true` or `"unknown"`, as the structured content carries it.
    #[must_use]
    pub fn to_json(self) -> Value {
        match self {
            Self::No => Value::Bool(false),
            Self::Yes => Value::Bool(true),
            Self::Unknown => Value::String("unknown".to_owned()),
        }
    }
}

/// How an answer travels to the client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wire {
    /// A JSON-RPC error with this code (-32602: the tool does not exist for the caller, or a policy
    /// argument rule refused the call).
    RpcError(i32),
    /// A result with `isError: true`, the reason as text and in structured content with `executed`.
    ErrorResult,
    /// The tool's own result.
    Result,
    /// No response (the client cancelled; the protocol says not to answer).
    NoResponse,
    /// A JSON-RPC error as the upstream sent it: its code, message and data (redacted).
    UpstreamError,
}

/// JSON-RPC "invalid params".
pub const INVALID_PARAMS: i32 = -32602;

/// A call held for a person: what the pending answer tells the caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pending {
    /// The approval request's id, which a person approves or denies.
    pub approval_id: String,
    /// Unix milliseconds after which the request expires (expiry is denial).
    pub expires_at_ms: i64,
    /// The tier that asks for a person, as [`Tier::as_str`](crate::policy::Tier::as_str) writes it.
    pub tier: String,
    /// Why the policy asks for approval, with the rule that decided it.
    pub reason: String,
    /// SHA-256 of the policy that asked; the approval holds only under that policy.
    pub policy_sha256: String,
}

/// A person's "no", or nobody's answer in time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PersonRefusal {
    /// The approval request that was refused or expired.
    pub approval_id: String,
    /// True when nobody decided before the request expired.
    pub expired: bool,
    /// Who denied it, as the approval queue recorded them; `None` when it expired.
    pub decided_by: Option<String>,
    /// The reason the person gave with the denial, if any.
    pub reason: Option<String>,
    /// SHA-256 of the policy the request was made under.
    pub policy_sha256: String,
}

/// What the gate decided once a mutation's postcondition was checked (seed 000's
/// execute-verify-stop, DESIGN.md §1 step 8). The harness decides, never the model: "the tool
/// returned success" is not an observation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Check {
    /// The read showed the state the policy expects: the caller may go on.
    Continue,
    /// The state diverged, or could not be read or judged: the caller ends its run.
    Stop,
    /// The state diverged and the policy names a compensating tool, which was called (through the
    /// gate); the caller ends its run all the same.
    Rollback,
}

impl Check {
    /// `continue`, `stop` or `rollback`: the verify record's outcome and the answer's `decision`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        self.outcome().as_str()
    }

    /// The outcome of the `verify` audit record.
    #[must_use]
    pub fn outcome(self) -> Outcome {
        match self {
            Self::Continue => Outcome::Continue,
            Self::Stop => Outcome::Stop,
            Self::Rollback => Outcome::Rollback,
        }
    }
}

/// Characters of the observed state an unverified answer quotes; the rest is cut, and says so.
pub const OBSERVED_MAX_CHARS: usize = 4_096;

/// A mutation that ran and whose postcondition did not hold or could not be checked.
#[derive(Clone, Debug, PartialEq)]
pub struct Unverified {
    /// [`Check::Stop`] or [`Check::Rollback`].
    pub decision: Check,
    /// True when the read succeeded and showed a state the postcondition refuses; false when the
    /// state could not be read, or the postcondition could not be evaluated on it.
    pub diverged: bool,
    /// Why, in words (redacted): what the read showed or why it could not be read or judged.
    pub why: String,
    /// What the read observed (redacted and capped, see [`Unverified::observed_capped`]); null
    /// when nothing could be read.
    pub observed: Value,
    /// The postcondition as the policy writes it (its CEL source).
    pub expected: String,
    /// The compensating call, for [`Check::Rollback`]: its tool, and whether it ran and succeeded.
    pub rollback: Option<Rollback>,
}

/// The compensating call of a rollback.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rollback {
    /// The compensating tool the policy names.
    pub tool: String,
    /// Whether it ran and succeeded; otherwise what it answered is in `why`.
    pub done: bool,
    /// What became of it, in words (redacted): its status, or its error.
    pub why: String,
}

impl Unverified {
    /// `observed` as an answer may quote it: the value when its JSON text is short enough, else
    /// the start of that text, cut at [`OBSERVED_MAX_CHARS`] characters and marked as cut.
    #[must_use]
    pub fn observed_capped(observed: Value) -> Value {
        let text = observed.to_string();
        let total = text.chars().count();
        if total <= OBSERVED_MAX_CHARS {
            return observed;
        }
        let head: String = text.chars().take(OBSERVED_MAX_CHARS).collect();
        json!({
            "truncated": true,
            "chars": total,
            "head": head,
        })
    }
}

/// What a call came to. `R` is the tool's own result (the adapter's result type).
#[derive(Clone, Debug, PartialEq)]
pub enum Answer<R> {
    /// The tool does not exist for this caller (hidden, denied, blocked, unknown, withheld, the kill
    /// switch), or a policy argument rule refused the call. `visible`: the caller may see the tool,
    /// so the answer may name the rule.
    Denied {
        /// The tool and the rule that refused it.
        denial: Denial,
        /// The caller may see the tool; otherwise the rule is withheld as `visibility`.
        visible: bool,
    },
    /// The arguments do not fit the tool's schema (or a business check the model can correct).
    Invalid {
        /// The rule that refused, e.g. `schema` or `tools.NAME.idempotency_key`.
        rule: String,
        /// What is wrong, in words the model can act on (redacted).
        reason: String,
    },
    /// The caller's bucket for this tool is empty.
    RateLimited {
        /// Seconds until the bucket holds a call again.
        retry_after_s: u64,
    },
    /// A gated tool whose switch is off: what it would have done (seed 004's refusal).
    DryRun {
        /// The rule that refused, `tools.NAME.gated`.
        rule: String,
        /// The environment variable that turns the tool on (see
        /// [`Policy::gate_env`](crate::policy::Policy::gate_env)).
        gate_env: String,
        /// What the call would have done, as the tool's dry run describes it, with
        /// `preview_available` saying whether it is the tool's own (`false`: the gate could only
        /// show the arguments).
        preview: Value,
        /// The refused tool's description, so that a person reading the refusal knows what it is.
        tool_description: Option<String>,
        /// The arguments the call was made with, redacted.
        arguments: Value,
    },
    /// Waiting for a person.
    Pending(Pending),
    /// A person denied the call, or nobody decided in time.
    RefusedByPerson(PersonRefusal),
    /// The tool ran; its result (with `verified: true` when the policy's postcondition was read
    /// back and held).
    Ran(R),
    /// The tool ran, and then its postcondition did not hold or could not be checked: the caller
    /// must stop (and a compensating call was made when the policy names one).
    Unverified(Unverified),
    /// The stored result of an earlier run with the same key (or approval); nothing ran again.
    Replay(R),
    /// The tool ran and answered with an error of its own (passed on, redacted).
    ToolError(R),
    /// The tool ran and failed; the reason in words (redacted).
    Failed {
        /// Why it failed (redacted).
        reason: String,
    },
    /// The idempotency key was used before with other arguments; nothing ran.
    Conflict {
        /// The idempotency key that was reused.
        key: String,
        /// The rule that refused, `tools.NAME.idempotency_key`.
        rule: String,
    },
    /// The effect may or may not have happened.
    InDoubt {
        /// What left the outcome unknown.
        why: String,
    },
    /// The handler started and did not finish within its timeout: it may have had an effect.
    Timeout {
        /// The timeout that ran out, in milliseconds.
        after_ms: u64,
    },
    /// Another copy of this call holds its idempotency key and has not finished.
    InFlight {
        /// The idempotency key the other call holds.
        key: String,
    },
    /// The client cancelled the call.
    Cancelled,
    /// Not run because something the call needs cannot answer (a store, the audit log, an
    /// upstream); nothing was attempted.
    NotRun {
        /// The rule to record, e.g. `audit.unavailable` or `approvals_unavailable`.
        rule: String,
        /// What could not answer, in words the model reads.
        why: String,
    },
    /// The tool needs the caller's input before it can finish (MCP's `input_required` result,
    /// passed on as the upstream gave it); the caller retries with its answers.
    InputRequired(Value),
    /// The upstream refused the request with a JSON-RPC error of its own (an unknown tool, a
    /// capability the caller lacks): passed on as it was, redacted.
    Rejected {
        /// The upstream's JSON-RPC error code.
        code: i32,
        /// The upstream's error message (redacted).
        message: String,
        /// The upstream's error data, if it sent any (redacted).
        data: Option<Value>,
    },
    /// The upstream runs the call on as a task (the MCP tasks extension, for a caller that
    /// declared it): its task, passed on as the upstream gave it. The effect has started and has
    /// not ended, so it is recorded in doubt until its end is seen. `replay`: the task an earlier
    /// call with the same idempotency key became; nothing was sent again.
    Task {
        /// The task object as the upstream gave it.
        task: Value,
        /// The task is an earlier call's, found by its idempotency key; nothing was sent again.
        replay: bool,
    },
}

/// An [`Answer`] without its payload: what the table of DESIGN.md §4 is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// [`Answer::Denied`].
    Denied,
    /// [`Answer::Invalid`].
    Invalid,
    /// [`Answer::RateLimited`].
    RateLimited,
    /// [`Answer::DryRun`].
    DryRun,
    /// [`Answer::Pending`].
    Pending,
    /// [`Answer::RefusedByPerson`] with a person's denial.
    DeniedByPerson,
    /// [`Answer::RefusedByPerson`] because nobody decided before the request expired.
    Expired,
    /// [`Answer::Ran`].
    Ran,
    /// [`Answer::Replay`], or an [`Answer::Task`] replayed by its idempotency key.
    Replay,
    /// [`Answer::ToolError`].
    ToolError,
    /// [`Answer::Failed`].
    Failed,
    /// [`Answer::Conflict`].
    Conflict,
    /// [`Answer::InDoubt`].
    InDoubt,
    /// [`Answer::Timeout`].
    Timeout,
    /// [`Answer::InFlight`].
    InFlight,
    /// [`Answer::Cancelled`].
    Cancelled,
    /// [`Answer::NotRun`].
    NotRun,
    /// [`Answer::InputRequired`].
    InputRequired,
    /// [`Answer::Rejected`].
    Rejected,
    /// [`Answer::Task`] for a new task.
    Task,
    /// [`Answer::Unverified`].
    Unverified,
}

impl Kind {
    /// Every kind, for tables and tests.
    pub const ALL: [Kind; 21] = [
        Kind::Denied,
        Kind::Invalid,
        Kind::RateLimited,
        Kind::DryRun,
        Kind::Pending,
        Kind::DeniedByPerson,
        Kind::Expired,
        Kind::Ran,
        Kind::Replay,
        Kind::ToolError,
        Kind::Failed,
        Kind::Conflict,
        Kind::InDoubt,
        Kind::Timeout,
        Kind::InFlight,
        Kind::Cancelled,
        Kind::NotRun,
        Kind::InputRequired,
        Kind::Rejected,
        Kind::Task,
        Kind::Unverified,
    ];

    /// The audit record's decision and outcome.
    #[must_use]
    pub fn audit(self) -> (Decision, Outcome) {
        match self {
            Self::Denied | Self::NotRun | Self::InFlight => (Decision::Deny, Outcome::NotExecuted),
            Self::Invalid => (Decision::Deny, Outcome::InvalidArgs),
            Self::RateLimited => (Decision::Deny, Outcome::RateLimited),
            Self::Conflict => (Decision::Deny, Outcome::Conflict),
            Self::DryRun => (Decision::Refuse, Outcome::DryRun),
            Self::Pending => (Decision::Approval, Outcome::Requested),
            Self::DeniedByPerson => (Decision::Approval, Outcome::Denied),
            Self::Expired => (Decision::Approval, Outcome::Expired),
            // The mutation itself did happen; its postcondition is a `verify` record of its own.
            Self::Ran | Self::Unverified => (Decision::Allow, Outcome::Committed),
            Self::Replay => (Decision::Allow, Outcome::Replay),
            Self::ToolError | Self::Failed => (Decision::Allow, Outcome::Failed),
            Self::InDoubt => (Decision::Allow, Outcome::InDoubt),
            Self::Timeout => (Decision::Allow, Outcome::Timeout),
            Self::Cancelled => (Decision::Allow, Outcome::Cancelled),
            Self::InputRequired => (Decision::Allow, Outcome::InputRequired),
            Self::Rejected => (Decision::Allow, Outcome::Failed),
            // Started and not ended: neither committed nor failed yet. Its end, when the gateway
            // sees it, is a record of its own.
            Self::Task => (Decision::Allow, Outcome::InDoubt),
        }
    }

    /// Whether the effect happened. A mutation cut off after its handler started is `Unknown`,
    /// never `No`: a model told "not executed" retries a payment that went through.
    #[must_use]
    pub fn executed(self) -> Executed {
        match self {
            Self::Denied
            | Self::Invalid
            | Self::RateLimited
            | Self::DryRun
            | Self::Pending
            | Self::DeniedByPerson
            | Self::Expired
            | Self::Conflict
            | Self::NotRun => Executed::No,
            // The tool has not finished: it waits for the caller's answers to go on.
            Self::InputRequired => Executed::No,
            // It was sent, and answered with a protocol error: like a failure of the tool.
            Self::Rejected => Executed::Yes,
            Self::Ran | Self::ToolError | Self::Failed | Self::Unverified => Executed::Yes,
            // A replay ran once, earlier; this call did nothing new, and says so in its status.
            Self::Replay => Executed::Yes,
            // Another copy of the call holds the key and may be mid-effect; a cancelled handler
            // may have done its work before it noticed.
            Self::InDoubt | Self::Timeout | Self::InFlight | Self::Cancelled => Executed::Unknown,
            // It runs on upstream: it may be anywhere between not begun and done.
            Self::Task => Executed::Unknown,
        }
    }

    /// How the answer travels.
    #[must_use]
    pub fn wire(self) -> Wire {
        match self {
            Self::Denied => Wire::RpcError(INVALID_PARAMS),
            Self::Ran | Self::Replay | Self::ToolError | Self::InputRequired | Self::Task => {
                Wire::Result
            }
            Self::Cancelled => Wire::NoResponse,
            Self::Rejected => Wire::UpstreamError,
            _ => Wire::ErrorResult,
        }
    }

    /// The `status` an error answer carries in its structured content.
    #[must_use]
    pub fn status(self) -> &'static str {
        match self {
            Self::Denied => "denied",
            Self::Invalid => "invalid_args",
            Self::RateLimited => "rate_limited",
            Self::DryRun => "refused",
            Self::Pending => "pending_approval",
            Self::DeniedByPerson => "denied",
            Self::Expired => "expired",
            Self::Ran => "committed",
            Self::Replay => "replay",
            Self::ToolError | Self::Failed => "failed",
            Self::Conflict => "conflict",
            Self::InDoubt => "in_doubt",
            Self::Timeout => "timeout",
            Self::InFlight => "in_flight",
            Self::Cancelled => "cancelled",
            Self::NotRun => "not_run",
            Self::InputRequired => "input_required",
            Self::Rejected => "rejected",
            Self::Task => "task",
            Self::Unverified => "unverified",
        }
    }

    /// One line for a person: what the client gets (`toolgate policy explain` prints it).
    #[must_use]
    pub fn describe(self) -> &'static str {
        match self {
            Self::Denied => "refused with JSON-RPC error -32602 before anything runs",
            Self::Invalid => "an isError result naming the invalid arguments; nothing runs",
            Self::RateLimited => {
                "an isError result: rate limit reached, retry after N s; nothing runs"
            }
            Self::DryRun => {
                "an isError result with the dry run and how to enable the tool; nothing runs"
            }
            Self::Pending => {
                "waits for a person's approval: held open for a bounded time, then a pending answer with the approval id"
            }
            Self::DeniedByPerson | Self::Expired => {
                "an isError result: do not retry this action, tell the user it needs a person"
            }
            Self::Ran => "runs: the tool's result",
            Self::Replay => "the stored result of the first run, marked replay; nothing runs again",
            Self::ToolError | Self::Failed => {
                "runs and failed: an isError result with the real reason"
            }
            Self::Conflict => {
                "an isError result: the idempotency key was used with other arguments"
            }
            Self::InDoubt | Self::Timeout => {
                "an isError result: outcome unknown, verify before retrying"
            }
            Self::InFlight => "an isError result: the same call is still running, call again later",
            Self::Cancelled => "no response (cancelled by the client)",
            Self::NotRun => "an isError result: not run because a store it needs cannot answer",
            Self::InputRequired => {
                "an input_required result: the caller answers the tool's questions and calls again"
            }
            Self::Rejected => "the upstream's own JSON-RPC error, its code, message and data kept",
            Self::Task => {
                "the upstream's task (tasks extension): the caller follows it with tasks/get"
            }
            Self::Unverified => {
                "runs, then its postcondition did not hold or could not be read: an isError result with observed and expected, and stop (after the declared rollback, if any)"
            }
        }
    }
}

impl<R> Answer<R> {
    /// The row of the outcome table this answer is; a refusal splits by `expired`, a task by
    /// `replay`.
    #[must_use]
    pub fn kind(&self) -> Kind {
        match self {
            Self::Denied { .. } => Kind::Denied,
            Self::Invalid { .. } => Kind::Invalid,
            Self::RateLimited { .. } => Kind::RateLimited,
            Self::DryRun { .. } => Kind::DryRun,
            Self::Pending(_) => Kind::Pending,
            Self::RefusedByPerson(refusal) if refusal.expired => Kind::Expired,
            Self::RefusedByPerson(_) => Kind::DeniedByPerson,
            Self::Ran(_) => Kind::Ran,
            Self::Replay(_) => Kind::Replay,
            Self::ToolError(_) => Kind::ToolError,
            Self::Failed { .. } => Kind::Failed,
            Self::Conflict { .. } => Kind::Conflict,
            Self::InDoubt { .. } => Kind::InDoubt,
            Self::Timeout { .. } => Kind::Timeout,
            Self::InFlight { .. } => Kind::InFlight,
            Self::Cancelled => Kind::Cancelled,
            Self::NotRun { .. } => Kind::NotRun,
            Self::InputRequired(_) => Kind::InputRequired,
            Self::Rejected { .. } => Kind::Rejected,
            Self::Task { replay: true, .. } => Kind::Replay,
            Self::Task { .. } => Kind::Task,
            Self::Unverified(_) => Kind::Unverified,
        }
    }

    /// The rule to record for this answer, when the answer itself names one.
    #[must_use]
    pub fn rule(&self) -> Option<&str> {
        match self {
            Self::Denied { denial, .. } => Some(&denial.rule),
            Self::Invalid { rule, .. }
            | Self::DryRun { rule, .. }
            | Self::Conflict { rule, .. }
            | Self::NotRun { rule, .. } => Some(rule),
            Self::RateLimited { .. } => Some("rate_limit"),
            Self::RefusedByPerson(_) => Some("approval"),
            Self::InFlight { .. } => Some("idempotency.in_flight"),
            _ => None,
        }
    }

    /// The text the model reads, for every answer that is not the tool's own result (`None` for
    /// those and for a cancelled call).
    #[must_use]
    pub fn message(&self, tool: &str) -> Option<String> {
        Some(match self {
            Self::Denied {
                denial,
                visible: true,
            } => {
                format!("tool denied: {} (policy rule {})", denial.tool, denial.rule)
            }
            Self::Denied { denial, .. } => format!("tool denied: {}", denial.tool),
            Self::Invalid { reason, .. } | Self::Failed { reason } => reason.clone(),
            Self::RateLimited { retry_after_s } => {
                format!("rate limit reached, retry after {retry_after_s} s")
            }
            Self::DryRun { gate_env, .. } => format!(
                "REFUSED (gated off). Nothing was executed.\nTool: {tool}\nSet {gate_env}=1 in this server's environment to enable it."
            ),
            Self::Pending(pending) => format!(
                "{tool} needs a person's approval: approval {} pending until {}; call again with the same arguments after it is decided",
                pending.approval_id,
                rfc3339(pending.expires_at_ms)
            ),
            Self::RefusedByPerson(refusal) => {
                let how = if refusal.expired {
                    format!(
                        "approval {} expired without a decision",
                        refusal.approval_id
                    )
                } else {
                    format!(
                        "approval {} was denied by {}",
                        refusal.approval_id,
                        refusal.decided_by.as_deref().unwrap_or("a person")
                    )
                };
                format!(
                    "{tool} was not run: {how}. Do not retry this action. Tell the user it needs a person."
                )
            }
            Self::Conflict { key, .. } => format!(
                "{tool}: idempotency key {key:?} was already used with other arguments; nothing was done. Use a new key for a new action."
            ),
            Self::InDoubt { why } => {
                format!("{tool}: outcome unknown: verify before retrying ({why})")
            }
            Self::Timeout { after_ms } => format!(
                "{tool}: outcome unknown: verify before retrying (it timed out after {after_ms} ms and may have finished its work)"
            ),
            Self::InFlight { key } => format!(
                "{tool}: a call with idempotency key {key:?} is still running; call again later to get its result"
            ),
            Self::NotRun { why, .. } => format!("{tool} was not run: {why}"),
            Self::Unverified(unverified) => unverified.message(tool),
            Self::Ran(_)
            | Self::Replay(_)
            | Self::ToolError(_)
            | Self::InputRequired(_)
            | Self::Task { .. }
            | Self::Cancelled => return None,
            Self::Rejected { message, .. } => message.clone(),
        })
    }

    /// Structured fields of an error answer besides `error`, `status` and `executed`.
    #[must_use]
    pub fn detail(&self, policy_sha256: &str) -> Map<String, Value> {
        let value = match self {
            Self::Denied { denial, visible } => {
                let rule = if *visible {
                    denial.rule.as_str()
                } else {
                    "visibility"
                };
                json!({"rule": rule, "policy_sha256": policy_sha256})
            }
            Self::Invalid { rule, .. } => json!({"rule": rule, "policy_sha256": policy_sha256}),
            Self::RateLimited { retry_after_s } => {
                json!({"retry_after_s": retry_after_s, "rule": "rate_limit"})
            }
            Self::DryRun {
                rule,
                gate_env,
                preview,
                tool_description,
                arguments,
            } => {
                // The rule is `tools.NAME.gated` (`Policy::decide`).
                let tool = rule
                    .strip_prefix("tools.")
                    .and_then(|r| r.strip_suffix(".gated"))
                    .unwrap_or(rule);
                json!({
                    "ok": false,
                    "reason": "gated",
                    "tool": tool,
                    "message": format!("\"{tool}\" is gated off. Its handler did NOT run and nothing was changed."),
                    "enable_with": {
                        "env_var": gate_env,
                        "set_to": "1",
                        "accepted": crate::policy::ENABLING,
                        "scope": "this server's process environment",
                    },
                    "default_state": format!("disabled: {gate_env} is unset or not set to an enabling value"),
                    "dry_run": preview,
                    "tool_description": tool_description,
                    "arguments_received": arguments,
                    "rule": rule,
                    "policy_sha256": policy_sha256,
                    "gate_env": gate_env,
                })
            }
            Self::Pending(pending) => json!({
                "approval_id": pending.approval_id,
                "expires_at": rfc3339(pending.expires_at_ms),
                "tier": pending.tier,
                "reason": pending.reason,
                "policy_sha256": pending.policy_sha256,
            }),
            Self::RefusedByPerson(refusal) => json!({
                "approval_id": refusal.approval_id,
                "decided_by": refusal.decided_by,
                "reason": refusal.reason,
                "rule": "approval",
                "policy_sha256": refusal.policy_sha256,
            }),
            Self::Conflict { rule, .. } | Self::NotRun { rule, .. } => json!({"rule": rule}),
            Self::InDoubt { why } => json!({"why": why}),
            Self::Timeout { after_ms } => json!({"timeout_ms": after_ms}),
            Self::InFlight { key } => json!({"idempotency_key": key}),
            Self::Unverified(unverified) => {
                let mut detail = json!({
                    "decision": unverified.decision.as_str(),
                    "diverged": unverified.diverged,
                    "why": unverified.why,
                    "observed": unverified.observed,
                    "expected": unverified.expected,
                });
                if let Some(rollback) = &unverified.rollback {
                    detail["rollback"] = json!({
                        "tool": rollback.tool,
                        "rolled_back": rollback.done,
                        "why": rollback.why,
                    });
                    detail["rolled_back"] = json!(rollback.done);
                }
                detail
            }
            Self::Failed { .. }
            | Self::Ran(_)
            | Self::Replay(_)
            | Self::ToolError(_)
            | Self::InputRequired(_)
            | Self::Rejected { .. }
            | Self::Task { .. }
            | Self::Cancelled => json!({}),
        };
        match value {
            Value::Object(map) => map,
            _ => Map::new(),
        }
    }

    /// What a lost audit record makes of this answer: an answer whose handler started becomes in
    /// doubt (the effect may be there, its record is not); a refusal stays the refusal it was.
    #[must_use]
    pub fn unrecorded(self, why: &str) -> Self {
        match self.kind() {
            Kind::Ran
            | Kind::Replay
            | Kind::ToolError
            | Kind::Failed
            | Kind::Timeout
            | Kind::Rejected
            | Kind::Task
            | Kind::Unverified
            | Kind::InDoubt => Self::InDoubt {
                why: format!("its audit record could not be written: {why}"),
            },
            _ => self,
        }
    }
}

impl Unverified {
    /// The words the model reads: what ran, why it is not verified, what was done about it, and
    /// that it must stop.
    fn message(&self, tool: &str) -> String {
        let what = if self.diverged {
            "its postcondition did not hold: the observed state diverged from what was expected"
        } else {
            "its postcondition could not be checked: the state could not be read or judged"
        };
        let rollback = match &self.rollback {
            Some(Rollback {
                tool: undo,
                done: true,
                why,
            }) => format!(" It was rolled back with {undo} ({why})."),
            Some(Rollback {
                tool: undo, why, ..
            }) => format!(
                " The rollback with {undo} did not succeed ({why}): its effect may still be there."
            ),
            None => String::new(),
        };
        format!(
            "{tool} ran but {what} ({}).{rollback} Stop: do not continue with dependent steps; tell the user.",
            self.why
        )
    }
}

#[cfg(test)]
mod tests;
