//! The `verify` step (DESIGN.md §1 step 8, seed 000's execute-verify-stop): after a call whose tool
//! the policy gives a postcondition has run and succeeded, the gate reads the state back and
//! decides, not the model. CONTINUE: the condition holds, and the tool's result goes back marked
//! `verified: true`. STOP: the state diverged, or could not be read or judged. ROLLBACK: it
//! diverged and the policy names a compensating tool, which the gate calls. Each decision is a
//! `verify` record in the audit log and a count on the gate ([`Gate::verify_counts`]).
//!
//! The read and the compensating call are calls of their own through the corridor, as the same
//! caller: each is decided by the policy (visibility, tier, arguments), audited, and can be refused.
//! They carry the verified call's `request_id` and a `verify_of` field naming it, take no
//! idempotency key, never wait for a person (a read that needs approval is a read that could not be
//! made), and are never verified in turn. Only a read that ran counts as an observation: a refusal,
//! a failure, a replay or a result that is not JSON is "could not be read", which stops.
//!
//! Design decision: the step runs after the call's own outcome record, not before it as DESIGN.md
//! §1 lists it. The mutation happened; its `allow / committed` record must be durable before the
//! gate makes further calls about it, or a crash during the read or the rollback would leave an
//! effect with no record of it (and the log would show a read of a write it has no line for). It
//! also keeps the log in the order things happened: the mutation, the read, the decision, then the
//! compensating call. The decision is recorded before the compensating call is made, as an intent
//! is before an effect; a decision that cannot be recorded stops, and nothing more is called.
//!
//! [`Gate::verify_counts`]: crate::gate::Gate::verify_counts

use std::ops::ControlFlow;

use rmcp::model::{CallToolResult, ContentBlock};
use serde_json::{Map, Value};
use toolgate_core::answer::{Check, Rollback, Unverified};
use toolgate_core::audit::Decision;
use toolgate_core::policy::Postcondition;
use toolgate_core::sanitize;

use super::answer::{self, VERIFIED_META};
use super::{Answer, CallState, Corridor, from_upstream};

/// What the gate decided after reading back a call's effect, as an in-process caller (the agent)
/// sees it in [`Outcome::verify`](super::Outcome::verify): `verify_continue`, `verify_stop` or
/// `verify_rollback`, and on anything but [`Check::Continue`] the caller ends its run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verify {
    /// Continue, stop or rollback.
    pub decision: Check,
    /// For [`Check::Rollback`]: whether the compensating call ran and succeeded (`false`: it was
    /// refused, failed or its outcome is unknown, and the effect may still be there). `None` for
    /// the other decisions.
    pub rolled_back: Option<bool>,
}

/// What the read showed, judged against the condition.
enum Judged {
    /// The condition holds.
    Holds,
    /// The read ran and the condition is false for what it returned.
    Diverged { observed: Value },
    /// The read could not be made, did not run, gave nothing to judge, or the condition could not
    /// be evaluated on it (`observed`: what it returned, if it ran).
    Unreadable { why: String, observed: Value },
}

impl Corridor<'_> {
    /// Verifies a call that ran, when the policy gives its tool a postcondition; any other answer
    /// (a refusal, a failure, a replay, which was verified when it first ran) passes unchanged.
    pub(super) async fn verify(
        &self,
        call: &mut CallState<'_>,
        answer: Answer<CallToolResult>,
    ) -> Answer<CallToolResult> {
        if call.nested {
            return answer;
        }
        let result = match answer {
            Answer::Ran(result) => result,
            other => return other,
        };
        let gate = self.gate;
        let Some(rule) = gate.policy().postcondition(call.name) else {
            return Answer::Ran(result);
        };
        let args = call.kept.take().unwrap_or_default();
        // Boxed, as below: each holds a whole corridor (module `corridor`, "Sizes"), and most
        // calls have no postcondition.
        let judged = Box::pin(self.judge(call, rule, &args)).await;
        let (decision, diverged, why, observed) = match judged {
            Judged::Holds => {
                return match self.record(call, rule, Check::Continue, None).await {
                    Ok(()) => {
                        self.decided(call, Check::Continue, None);
                        Answer::Ran(verified(result))
                    }
                    Err(why) => {
                        self.decided(call, Check::Stop, None);
                        self.unverified(call, rule, Check::Stop, false, why, Value::Null, None)
                    }
                };
            }
            Judged::Diverged { observed } => {
                let decision = match rule.rollback {
                    Some(_) => Check::Rollback,
                    None => Check::Stop,
                };
                let why = format!(
                    "{} shows a state where `{}` is false",
                    rule.read,
                    rule.expect.source()
                );
                (decision, true, why, observed)
            }
            Judged::Unreadable { why, observed } => (Check::Stop, false, why, observed),
        };
        if let Err(lost) = self.record(call, rule, decision, Some(&why)).await {
            // Nothing more is called that the log cannot show: not even the compensating call.
            self.decided(call, Check::Stop, None);
            let why = format!("{why}; {lost}");
            return self.unverified(call, rule, Check::Stop, diverged, why, observed, None);
        }
        let rollback = match (&rule.rollback, decision) {
            (Some(compensation), Check::Rollback) => {
                Some(Box::pin(self.compensate(call, compensation, &args)).await)
            }
            _ => None,
        };
        self.decided(call, decision, rollback.as_ref().map(|r| r.done));
        self.unverified(call, rule, decision, diverged, why, observed, rollback)
    }

    /// Reads the state back and judges it against the condition.
    async fn judge(
        &self,
        call: &CallState<'_>,
        rule: &Postcondition,
        args: &Map<String, Value>,
    ) -> Judged {
        let read = rule.read.as_str();
        let unreadable = |why: String| Judged::Unreadable {
            why,
            observed: Value::Null,
        };
        let arguments = match rule.read_arguments(args) {
            Ok(arguments) => arguments,
            Err(error) => {
                return unreadable(format!(
                    "the arguments of {read} could not be built: {error}"
                ));
            }
        };
        let result = match self.nested(call, read, arguments).await {
            Answer::Ran(result) => result,
            other => {
                let said = self.said(read, &other);
                return unreadable(format!("{read} could not be read: {said}"));
            }
        };
        let Some(observed) = observation(&result) else {
            return unreadable(format!(
                "{read} returned neither structured content nor JSON text"
            ));
        };
        match rule.expect.holds(args, &observed) {
            Ok(true) => Judged::Holds,
            Ok(false) => Judged::Diverged { observed },
            Err(error) => Judged::Unreadable {
                why: format!(
                    "`{}` could not be evaluated on what {read} returned: {error}",
                    rule.expect.source()
                ),
                observed,
            },
        }
    }

    /// Calls the compensating tool through the corridor: whether it ran and succeeded, and what
    /// it said.
    async fn compensate(
        &self,
        call: &CallState<'_>,
        compensation: &toolgate_core::policy::Compensation,
        args: &Map<String, Value>,
    ) -> Rollback {
        let tool = compensation.tool.clone();
        let arguments = match compensation.arguments(args) {
            Ok(arguments) => arguments,
            Err(error) => {
                return Rollback {
                    tool,
                    done: false,
                    why: format!("its arguments could not be built: {error}"),
                };
            }
        };
        let answer = self.nested(call, &tool, arguments).await;
        let done = matches!(answer, Answer::Ran(_));
        let why = if done {
            "it ran and reported success".to_owned()
        } else {
            self.said(&tool, &answer)
        };
        tracing::warn!(tool = call.name, compensation = %tool, done, "postcondition failed; rolled back");
        Rollback { tool, done, why }
    }

    /// One call the gate makes itself about `call` (a read or a compensating call): the corridor's
    /// steps and outcome record, as the same caller, without an idempotency key, a person to wait
    /// for, cleaning or a verification of its own.
    async fn nested(
        &self,
        call: &CallState<'_>,
        tool: &str,
        arguments: Map<String, Value>,
    ) -> Answer<CallToolResult> {
        let corridor = Corridor::new(self.gate, self.toolset, tool);
        let why = format!(
            "it needs a person's approval, and the gate's own check of {} does not wait for one",
            call.name
        );
        let mut nested = CallState::new(
            tool,
            arguments,
            call.ct.child_token(),
            call.shutdown.clone(),
        )
        .unheld()
        .with_approvals_closed(Some(why));
        nested.nested = true;
        nested.label.clone_from(&call.label);
        nested.detail.push(("verify_of", Value::from(call.name)));
        let mut laps = self.gate.metrics().laps();
        let answer = match corridor.walk(&mut nested, &mut laps).await {
            ControlFlow::Break(answer) | ControlFlow::Continue(answer) => answer,
        };
        let answer = corridor.audit(&nested, answer).await;
        if let Some(id) = &nested.approval
            && let Ok(rmcp::model::CallToolResponse::Complete(result)) =
                answer::to_wire(answer.clone(), tool, self.gate.policy().sha256())
        {
            // A person's earlier approval of this exact call was used: repeats replay its answer.
            corridor.keep_approved_result(id, &result).await;
        }
        answer
    }

    /// The `verify` record of `call`: the decision, the read it was made on and why.
    async fn record(
        &self,
        call: &CallState<'_>,
        rule: &Postcondition,
        decision: Check,
        why: Option<&str>,
    ) -> Result<(), String> {
        let mut event = self
            .gate
            .event_digested(
                call.name,
                call.label.clone(),
                call.digest.clone(),
                Decision::Verify,
                decision.outcome(),
                &format!("tools.{}.verify", call.name),
            )
            .with("read", rule.read.as_str());
        if let Some(why) = why {
            event = event.with("why", self.gate.redactor().redact(why).as_ref());
        }
        if let (Some(compensation), Check::Rollback) = (&rule.rollback, decision) {
            event = event.with("rollback", compensation.tool.as_str());
        }
        let event = from_upstream(event, self.origin.as_deref());
        self.gate
            .record(event)
            .await
            .map(|_| ())
            .map_err(|unavailable| format!("the decision could not be recorded: {unavailable}"))
    }

    /// Keeps the decision for the caller and counts it.
    fn decided(&self, call: &mut CallState<'_>, decision: Check, rolled_back: Option<bool>) {
        self.gate.count_verify(call.name, decision);
        if decision != Check::Continue {
            tracing::warn!(
                tool = call.name,
                decision = decision.as_str(),
                "postcondition not verified; stop"
            );
        }
        call.verify = Some(Verify {
            decision,
            rolled_back,
        });
    }

    /// The answer for a call that ran and is not verified: what was observed (as the caller may
    /// see it) against what was expected, and what was done.
    #[expect(
        clippy::too_many_arguments,
        reason = "the fields of one answer, each computed by a different branch of `verify`"
    )]
    fn unverified(
        &self,
        call: &CallState<'_>,
        rule: &Postcondition,
        decision: Check,
        diverged: bool,
        why: String,
        observed: Value,
        rollback: Option<Rollback>,
    ) -> Answer<CallToolResult> {
        let redactor = self.gate.redactor();
        let untrusted = self
            .gate
            .policy()
            .rule(&rule.read)
            .is_some_and(|r| r.untrusted_output);
        let observed = if untrusted {
            let mut report = sanitize::Report::default();
            sanitize::clean_value(
                &observed,
                redactor,
                sanitize::DEFAULT_MAX_CHARS,
                &mut report,
            )
        } else {
            redactor.redact_value_echoing(&observed, &call.echoes)
        };
        let rollback = rollback.map(|r| Rollback {
            why: redactor.redact(&r.why).into_owned(),
            ..r
        });
        Answer::Unverified(Unverified {
            decision,
            diverged,
            why: redactor.redact_echoing(&why, &call.echoes).into_owned(),
            observed: Unverified::observed_capped(observed),
            expected: rule.expect.source().to_owned(),
            rollback,
        })
    }

    /// What a nested call's answer said, in one line: the tool's own error, else the gate's
    /// message (which names a rule only where the caller may see the tool), else its status.
    fn said(&self, tool: &str, answer: &Answer<CallToolResult>) -> String {
        let status = answer.kind().status();
        let text = match answer {
            Answer::ToolError(result) | Answer::Replay(result) => {
                first_text(result).map(|text| format!("{status}: {text}"))
            }
            Answer::DryRun { gate_env, .. } => Some(format!(
                "it is gated off until {gate_env} is set in the server's environment"
            )),
            other => other.message(tool),
        };
        let text = text.unwrap_or_else(|| status.to_owned());
        let line = text.lines().next().unwrap_or_default();
        self.gate.redactor().redact(line).into_owned()
    }
}

/// What a read returned, as the condition's `result`: its structured content, else its one text
/// block when that is JSON.
fn observation(result: &CallToolResult) -> Option<Value> {
    if let Some(structured) = &result.structured_content {
        return Some(structured.clone());
    }
    let mut texts = result.content.iter().filter_map(ContentBlock::as_text);
    match (texts.next(), texts.next()) {
        (Some(only), None) => serde_json::from_str(&only.text).ok(),
        _ => None,
    }
}

/// The text of a result's first text block.
fn first_text(result: &CallToolResult) -> Option<&str> {
    result
        .content
        .iter()
        .find_map(ContentBlock::as_text)
        .map(|t| t.text.as_str())
}

/// A result whose postcondition held: `verified: true` in its structured content (and in the text
/// that mirrors it) and in `_meta`.
fn verified(mut result: CallToolResult) -> CallToolResult {
    if let Some(Value::Object(structured)) = result.structured_content.as_mut() {
        let before = Value::Object(structured.clone());
        structured.insert("verified".to_owned(), Value::Bool(true));
        let after = Value::Object(structured.clone());
        // `CallToolResult::structured` mirrors the object as one text block for clients that read
        // only text; a mirror left as it was would say something else than the object.
        if let [ContentBlock::Text(text)] = result.content.as_mut_slice()
            && serde_json::from_str::<Value>(&text.text).is_ok_and(|v| v == before)
        {
            text.text = after.to_string();
        }
    }
    let mut meta = result.meta.take().unwrap_or_default();
    meta.0.insert(VERIFIED_META.to_owned(), Value::Bool(true));
    result.meta = Some(meta);
    result
}
