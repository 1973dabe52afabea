//! The steps that make the effect: `claim` the idempotency key, `run` the tool with its timeout and
//! the caller's cancellation, `settle` the key with what became of the run.
//!
//! Idempotency (DESIGN.md §1 step 6) is the gate's, for every tool the policy gives an
//! `idempotency_key` (an argument's value, or `"*"` for the canonical arguments): the claim row in
//! `toolgate.db` is the intent, committed before the call is forwarded; the outcome completes or
//! releases it after. Same key after success replays the stored answer; same key with other
//! arguments is refused; a key whose call never reported back (a crash, an upstream that died or
//! timed out mid-call) is *in doubt* and is not run again, unless the policy says the tool is
//! `idempotent` (its own backend dedupes). Tools that commit their own records (the ledger) keep
//! their own idempotency and are not claimed twice.

use std::ops::ControlFlow::{Break, Continue};
use std::time::Duration;

use rmcp::model::CallToolResult;
use serde_json::{Map, Value};
use toolgate_core::time::now_ms;
use toolgate_store::idempotency::{Claim, Key};

use super::answer::Kind;
use super::{Answer, CallState, Corridor, Flow, pause};
use crate::toolset::{Call, CallError};

/// How often a call waits on another copy of itself that holds the same idempotency key.
const IN_FLIGHT_POLL: Duration = Duration::from_millis(100);

/// The named crash point between a keyed call's run and the record of its outcome (feature
/// `failpoints` only).
const SETTLE_CRASH: &str = "corridor.before_settle";

/// `idempotency_key = "*"`: the call's canonical arguments are its key.
const WHOLE_ARGUMENTS: &str = "*";

impl Corridor<'_> {
    /// Claims the call's idempotency key when the policy names one; another copy of the same call
    /// in this process is waited for (bounded by the tool's timeout) rather than run twice.
    pub(super) async fn claim(&self, call: &mut CallState<'_>) -> Flow {
        let Some(key) = self.idempotency_key(call)? else {
            return Continue(());
        };
        let gate = self.gate;
        let Some(store) = gate.idempotency() else {
            return Break(Answer::NotRun {
                rule: "idempotency.unavailable".to_owned(),
                why: "this server has no idempotency store".to_owned(),
            });
        };
        let retry_in_doubt = gate.policy().rule(call.name).is_some_and(|r| r.idempotent);
        let id = Key {
            principal: &gate.principal().sub,
            tool: call.name,
            key: &key,
        };
        let limit = tokio::time::Instant::now() + self.timeout(call.name);
        loop {
            // Boxed: a store's future is kilobytes (module `corridor`, "Sizes").
            let claim =
                Box::pin(store.claim(id, &call.digest, gate.owner(), retry_in_doubt, now_ms()))
                    .await;
            match claim {
                Err(error) => {
                    tracing::error!(error = %error, tool = call.name, "idempotency store unavailable; not run");
                    return Break(Answer::NotRun {
                        rule: "idempotency.unavailable".to_owned(),
                        why: "the idempotency store did not answer".to_owned(),
                    });
                }
                Ok(Claim::Claimed) => break,
                Ok(Claim::Replay(stored)) if is_task(&stored) => {
                    return Break(self.replay_task(call, stored));
                }
                Ok(Claim::Replay(stored)) => {
                    return Break(match serde_json::from_value::<CallToolResult>(stored) {
                        Ok(result) => Answer::Replay(result),
                        Err(_) => Answer::InDoubt {
                            why: "its stored result could not be read back".to_owned(),
                        },
                    });
                }
                Ok(Claim::Conflict) => {
                    return Break(Answer::Conflict {
                        rule: format!("tools.{}.idempotency_key", call.name),
                        key,
                    });
                }
                Ok(Claim::InDoubt) => {
                    call.detail.push(("forwarded", Value::Bool(false)));
                    return Break(Answer::InDoubt {
                        why: format!(
                            "an earlier call with idempotency key {key:?} was sent and never reported back; it was not sent again"
                        ),
                    });
                }
                Ok(Claim::InFlight) => {
                    if tokio::time::Instant::now() >= limit {
                        return Break(Answer::InFlight { key });
                    }
                    if pause(IN_FLIGHT_POLL, &call.ct).await.is_err() {
                        return Break(Answer::Cancelled);
                    }
                }
            }
        }
        call.key = Some(key);
        Continue(())
    }

    /// The key the policy names for this call, else the caller's own: `None` when there is
    /// neither (or the tool keeps its own), an invalid-arguments answer when the argument that
    /// should carry the policy's key is missing.
    fn idempotency_key(&self, call: &CallState<'_>) -> Flow<Option<String>> {
        let name = call.name;
        if self.toolset.records_itself(name) {
            return Continue(None);
        }
        let Some(arg) = self
            .gate
            .policy()
            .rule(name)
            .and_then(|r| r.idempotency_key.as_deref())
        else {
            // The caller's own key for this call (the agent's, one per tool call), if it gave one.
            return Continue(call.own_key.clone());
        };
        if arg == WHOLE_ARGUMENTS {
            return Continue(Some(call.digest.clone()));
        }
        match call.arguments().get(arg) {
            Some(Value::String(key)) if !key.is_empty() => Continue(Some(key.clone())),
            Some(Value::Number(key)) => Continue(Some(key.to_string())),
            _ => Break(Answer::Invalid {
                rule: format!("tools.{name}.idempotency_key"),
                reason: format!(
                    "{name} needs an idempotency key in its {arg:?} argument (a non-empty string); nothing was done"
                ),
            }),
        }
    }

    /// One run of the handler with the tool's timeout and the caller's cancellation. The handler
    /// takes the arguments; the records after it use the digest and label made at the start.
    pub(super) async fn run(&self, call: &mut CallState<'_>) -> Answer<CallToolResult> {
        call.started = true;
        let name = call.name;
        let timeout = self.timeout(name);
        let handler_ct = call.ct.child_token();
        let arguments = match std::mem::take(&mut call.arguments) {
            Value::Object(map) => map,
            _ => Map::new(),
        };
        if !call.nested && self.gate.policy().postcondition(name).is_some() {
            // The postcondition's read and condition are built from them after the run.
            call.kept = Some(arguments.clone());
        }
        let handler = Call {
            gate: self.gate,
            name,
            arguments,
            args_digest: &call.digest,
            principal: self.gate.principal(),
            rule: call.rule(),
            ct: handler_ct.clone(),
            caller: call.caller.clone(),
            progress_token: call.progress.clone(),
        };
        let run = tokio::time::timeout(timeout, self.toolset.call(handler));
        let redact = |text: String| self.gate.redactor().redact(&text).into_owned();
        // `biased`: a cancellation that raced the handler's own (cancelled) answer is still a
        // cancellation, whichever future the runtime happened to see first.
        tokio::select! {
            biased;
            () = call.ct.cancelled() => {
                handler_ct.cancel();
                if call.shutdown.is_cancelled() {
                    // Cut off by the server's own shutdown (the grace ran out), not by the
                    // client: the caller is still waiting and must not read this as not run.
                    Answer::InDoubt {
                        why: "the server shut down before the call finished".to_owned(),
                    }
                } else {
                    Answer::Cancelled
                }
            }
            // tokio-util marks children cancelled before their parent: a handler watching its
            // token can give up, and this branch be polled, before `ct` reads cancelled. A
            // handler that did not succeed while its token was cancelled was cancelled.
            finished = run => match finished {
                Ok(Ok(result)) if result.is_error == Some(true) && handler_ct.is_cancelled() => {
                    Answer::Cancelled
                }
                Ok(Err(_)) if handler_ct.is_cancelled() => Answer::Cancelled,
                Ok(Ok(result)) if result.is_error == Some(true) => Answer::ToolError(result),
                Ok(Ok(result)) => Answer::Ran(result),
                // A refusal the handler repeated (defence in depth) stays a protocol error.
                Ok(Err(CallError::Refused { denial, visible })) => Answer::Denied { denial, visible },
                Ok(Err(CallError::Failed(why))) => Answer::Failed {
                    reason: redact(format!("{name} failed: {why}")),
                },
                Ok(Err(CallError::Unavailable(why))) => Answer::NotRun {
                    rule: "unavailable".to_owned(),
                    why: redact(why),
                },
                Ok(Err(CallError::InDoubt(why))) => Answer::InDoubt { why: redact(why) },
                Ok(Err(CallError::Rejected(error))) => Answer::Rejected {
                    code: error.code.0,
                    message: error.message.into_owned(),
                    data: error.data,
                },
                Ok(Err(CallError::Task(task))) => Answer::Task {
                    task: serde_json::to_value(task).unwrap_or(Value::Null),
                    replay: false,
                },
                Ok(Err(CallError::NeedsInput(asked))) => {
                    Answer::InputRequired(serde_json::to_value(asked).unwrap_or(Value::Null))
                }
                Err(_) => {
                    handler_ct.cancel();
                    Answer::Timeout {
                        after_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
                    }
                }
            },
        }
    }

    /// A retry of a call that became a task: the same task, when the toolset still follows it
    /// for this caller and the caller can take a task; otherwise in doubt (the task may have
    /// done its work), and nothing is sent again either way.
    fn replay_task(&self, call: &CallState<'_>, stored: Value) -> Answer<CallToolResult> {
        let id = stored
            .get("taskId")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let takes_tasks = call
            .caller
            .as_ref()
            .is_some_and(|c| c.modern && c.capabilities.supports_tasks());
        let followed = self.toolset.tracks_task(&self.gate.principal().sub, &id);
        match (takes_tasks, followed) {
            (true, true) => Answer::Task {
                task: stored,
                replay: true,
            },
            (false, true) => Answer::InDoubt {
                why: format!(
                    "an earlier call with this idempotency key runs on as task {id}; call again declaring the tasks extension to follow it"
                ),
            },
            (_, false) => Answer::InDoubt {
                why: format!(
                    "an earlier call with this idempotency key became task {id}, which this server no longer follows; it was not sent again"
                ),
            },
        }
    }

    /// Completes the claimed key with the answer, releases it when nothing happened, or marks it
    /// in doubt when the run was cut off: a retry then replays, runs, or reports in doubt.
    pub(super) async fn settle(&self, call: &CallState<'_>, answer: &Answer<CallToolResult>) {
        let (Some(key), Some(store)) = (&call.key, self.gate.idempotency()) else {
            return;
        };
        // The crash tests' cut: the tool ran, its key is still in flight (a SIGKILL here must
        // leave the key in doubt for every other process, never free to run again).
        toolgate_store::journal::crash_point(SETTLE_CRASH);
        let gate = self.gate;
        let id = Key {
            principal: &gate.principal().sub,
            tool: call.name,
            key,
        };
        let settled = match answer {
            Answer::Ran(result) => {
                let stored = serde_json::to_value(result).unwrap_or(Value::Null);
                store.complete(id, gate.owner(), &stored, now_ms()).await
            }
            // The effect is under way as a task: a retry gets the same task back, never a second
            // effect ([`Corridor::replay_task`]).
            Answer::Task { task, .. } => store.complete(id, gate.owner(), task, now_ms()).await,
            // It reported failure, or nothing was attempted: a retry may run it again.
            _ if matches!(
                answer.kind(),
                Kind::ToolError
                    | Kind::Failed
                    | Kind::NotRun
                    | Kind::Denied
                    | Kind::InputRequired
                    | Kind::Rejected
            ) =>
            {
                store.release(id, gate.owner()).await
            }
            // Cancelled, timed out or cut off: it may have happened.
            _ => store.mark_in_doubt(id, gate.owner(), now_ms()).await,
        };
        if let Err(error) = settled {
            tracing::error!(error = %error, tool = call.name, key = %key, "outcome of an idempotent call not stored; a retry will wait or report in doubt");
        }
    }
}

/// A stored answer that is a task (`resultType: "task"`), not a tool's result.
fn is_task(stored: &Value) -> bool {
    stored.get("resultType").and_then(Value::as_str) == Some("task")
}
