//! Execution in the corridor: claim the idempotency key, run the tool with its timeout and the
//! caller's cancellation, clean the result, record the outcome, answer.
//!
//! Idempotency (DESIGN.md §1 step 6) is the gate's, for every tool the policy gives an
//! `idempotency_key` (an argument's value, or `"*"` for the canonical arguments): the claim row in
//! `toolgate.db` is the intent, committed before the call is forwarded; the outcome completes or
//! releases it after. Same key after success replays the stored answer; same key with other
//! arguments is refused; a key whose call never reported back (a crash, an upstream that died or
//! timed out mid-call) is *in doubt* and is not run again, unless the policy says the tool is
//! `idempotent` (its own backend dedupes). Tools that commit their own records (the ledger) keep
//! their own idempotency and are not claimed twice.

use std::borrow::Cow;
use std::time::Duration;

use rmcp::model::CallToolResult;
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer};
use serde_json::{Map, Value, json};
use toolgate_core::audit::{Decision, Outcome};
use toolgate_core::canonical;
use toolgate_core::policy::Verdict;
use toolgate_core::principal::Principal;
use toolgate_core::sanitize;
use toolgate_store::idempotency::{Claim, Key};

use super::corridor::{Corridor, now_ms};
use crate::outcome;
use crate::toolset::{Call, CallError};

/// How often a call waits on another copy of itself that holds the same idempotency key.
const IN_FLIGHT_POLL: Duration = Duration::from_millis(100);

/// `idempotency_key = "*"`: the call's canonical arguments are its key.
const WHOLE_ARGUMENTS: &str = "*";

/// What became of one run of a tool, before it is answered.
struct Ran {
    /// The answer, or the JSON-RPC error a repeated refusal keeps.
    answer: Result<CallToolResult, ErrorData>,
    outcome: Outcome,
}

impl Corridor<'_> {
    /// Runs an admitted call once: idempotency first when the policy names a key, then the tool.
    pub(super) async fn execute(
        &self,
        name: &str,
        arguments: Map<String, Value>,
        principal: &Principal,
        verdict: &Verdict,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let (key, digest) = match self.idempotency_key(name, &arguments) {
            Ok(Some(keyed)) => keyed,
            Ok(None) => return self.run(name, arguments, principal, verdict, context).await,
            Err(refusal) => return Ok(refusal),
        };
        let gate = self.gate;
        let Some(store) = gate.idempotency() else {
            return Ok(self
                .not_run(
                    name,
                    &arguments,
                    "idempotency.unavailable",
                    "this server has no idempotency store",
                )
                .await);
        };
        let retry_in_doubt = gate.policy().rule(name).is_some_and(|r| r.idempotent);
        let id = Key {
            principal: &principal.sub,
            tool: name,
            key: &key,
        };
        let limit = tokio::time::Instant::now() + self.timeout(name);
        loop {
            let claim = store
                .claim(id, &digest, gate.owner(), retry_in_doubt, now_ms())
                .await;
            match claim {
                Err(error) => {
                    tracing::error!(error = %error, tool = name, "idempotency store unavailable; not run");
                    return Ok(self
                        .not_run(
                            name,
                            &arguments,
                            "idempotency.unavailable",
                            "the idempotency store did not answer",
                        )
                        .await);
                }
                Ok(Claim::Claimed) => break,
                Ok(Claim::Replay(stored)) => {
                    return Ok(self.replay(name, &arguments, verdict, stored).await);
                }
                Ok(Claim::Conflict) => return Ok(self.conflict(name, &arguments, &key).await),
                Ok(Claim::InDoubt) => {
                    return Ok(self.in_doubt(name, &arguments, verdict, &key).await);
                }
                Ok(Claim::InFlight) => {
                    // Another copy of this call is running in this process: wait for its answer
                    // rather than run the effect twice.
                    if tokio::time::Instant::now() >= limit {
                        let reason = format!(
                            "{name}: a call with idempotency key {key:?} is still running; call again later to get its result"
                        );
                        return Ok(outcome::tool_error(reason, json!({"status": "in_flight"})));
                    }
                    tokio::select! {
                        () = tokio::time::sleep(IN_FLIGHT_POLL) => {}
                        () = context.ct.cancelled() => {
                            return Err(ErrorData::internal_error("cancelled by the client", None));
                        }
                    }
                }
            }
        }
        let ran = self
            .attempt(name, arguments.clone(), principal, verdict, context)
            .await;
        let settled = match (&ran.outcome, &ran.answer) {
            (Outcome::Committed, Ok(result)) => {
                let stored = serde_json::to_value(result).unwrap_or(Value::Null);
                store.complete(id, gate.owner(), &stored, now_ms()).await
            }
            // It reported failure, or nothing was attempted: a retry may run it again.
            (Outcome::Failed | Outcome::NotExecuted, _) => store.release(id, gate.owner()).await,
            // Cancelled, timed out or cut off: it may have happened.
            _ => store.mark_in_doubt(id, gate.owner(), now_ms()).await,
        };
        if let Err(error) = settled {
            tracing::error!(error = %error, tool = name, key = %key, "outcome of an idempotent call not stored; a retry will wait or report in doubt");
        }
        self.answer(name, &arguments, verdict, ran).await
    }

    /// Runs the tool without an idempotency key, then records and answers.
    async fn run(
        &self,
        name: &str,
        arguments: Map<String, Value>,
        principal: &Principal,
        verdict: &Verdict,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let ran = self
            .attempt(name, arguments.clone(), principal, verdict, context)
            .await;
        self.answer(name, &arguments, verdict, ran).await
    }

    /// The tool's timeout from the policy.
    pub(super) fn timeout(&self, name: &str) -> Duration {
        let policy = self.gate.policy();
        policy
            .rule(name)
            .and_then(|r| r.timeout)
            .unwrap_or(policy.defaults().timeout)
    }

    /// One run of the handler with the tool's timeout and the caller's cancellation; the answer
    /// is redacted, and sanitised when the policy marks the tool's output untrusted.
    async fn attempt(
        &self,
        name: &str,
        arguments: Map<String, Value>,
        principal: &Principal,
        verdict: &Verdict,
        context: &RequestContext<RoleServer>,
    ) -> Ran {
        let gate = self.gate;
        let timeout = self.timeout(name);
        let ct = &context.ct;
        let handler_ct = ct.child_token();
        let call = Call {
            gate,
            name,
            arguments,
            principal,
            rule: &verdict.rule,
            ct: handler_ct.clone(),
            peer: Some(context.peer.clone()),
            progress_token: context.meta.get_progress_token(),
        };
        let run = tokio::time::timeout(timeout, self.toolset.call(call));
        let cancelled = || {
            (
                Err(ErrorData::internal_error("cancelled by the client", None)),
                Outcome::Cancelled,
            )
        };
        // `biased`: a cancellation that raced the handler's own (cancelled) answer is still a
        // cancellation, whichever future the runtime happened to see first.
        let (answer, outcome) = tokio::select! {
            biased;
            () = ct.cancelled() => {
                handler_ct.cancel();
                cancelled()
            }
            // tokio-util marks children cancelled before their parent: a handler watching its
            // token can give up, and this branch be polled, before `ct` reads cancelled. A
            // handler that did not succeed while its token was cancelled was cancelled.
            finished = run => match finished {
                Ok(Ok(result)) if result.is_error == Some(true) && handler_ct.is_cancelled() => {
                    cancelled()
                }
                Ok(Err(_)) if handler_ct.is_cancelled() => cancelled(),
                Ok(Ok(result)) => {
                    let outcome = if result.is_error == Some(true) { Outcome::Failed } else { Outcome::Committed };
                    (Ok(result), outcome)
                }
                // A refusal the handler repeated (defence in depth) stays a protocol error.
                Ok(Err(CallError::Refused(error))) => (Err(error), Outcome::NotExecuted),
                Ok(Err(CallError::Failed(why))) => {
                    let reason = gate.redactor().redact(&format!("{name} failed: {why}")).into_owned();
                    (Ok(outcome::tool_error(reason, json!({"status": "failed"}))), Outcome::Failed)
                }
                Ok(Err(CallError::Unavailable(why))) => {
                    let reason = gate.redactor().redact(&format!("{name} was not run: {why}")).into_owned();
                    (Ok(outcome::tool_error(reason, json!({"status": "unavailable"}))), Outcome::NotExecuted)
                }
                Ok(Err(CallError::InDoubt(why))) => {
                    let why = gate.redactor().redact(&why).into_owned();
                    (Ok(outcome::in_doubt(name, &why)), Outcome::InDoubt)
                }
                Err(_) => {
                    handler_ct.cancel();
                    let reason = format!("{name} timed out after {} ms; it may not have finished", timeout.as_millis());
                    (Ok(outcome::tool_error(reason, json!({"status": "timeout"}))), Outcome::Timeout)
                }
            },
        };
        let answer = answer.map(|result| self.clean(name, result));
        Ran { answer, outcome }
    }

    /// Records the outcome (unless the tool records itself), then answers. An outcome that cannot
    /// be recorded is not answered as success (fail closed).
    async fn answer(
        &self,
        name: &str,
        arguments: &Map<String, Value>,
        verdict: &Verdict,
        ran: Ran,
    ) -> Result<CallToolResult, ErrorData> {
        if !self.toolset.records_itself(name) {
            let event = self
                .event(name, arguments, Decision::Allow, ran.outcome, &verdict.rule)
                .with("tier", verdict.tier.as_str());
            if !self.gate.record(event).await && ran.outcome != Outcome::Cancelled {
                return Ok(outcome::audit_unavailable(name));
            }
        }
        ran.answer
    }

    /// The key the policy names for this call and the digest of the arguments it is bound to:
    /// `Ok(None)` when the tool has none (or keeps its own), an `isError` answer when the argument
    /// that should carry it is missing.
    fn idempotency_key(
        &self,
        name: &str,
        arguments: &Map<String, Value>,
    ) -> Result<Option<(String, String)>, CallToolResult> {
        let Some(arg) = self
            .gate
            .policy()
            .rule(name)
            .and_then(|r| r.idempotency_key.as_deref())
        else {
            return Ok(None);
        };
        if self.toolset.records_itself(name) {
            return Ok(None);
        }
        let digest = canonical::digest(&Value::Object(arguments.clone()));
        if arg == WHOLE_ARGUMENTS {
            return Ok(Some((digest.clone(), digest)));
        }
        match arguments.get(arg) {
            Some(Value::String(key)) if !key.is_empty() => Ok(Some((key.clone(), digest))),
            Some(Value::Number(key)) => Ok(Some((key.to_string(), digest))),
            _ => Err(outcome::tool_error(
                format!(
                    "{name} needs an idempotency key in its {arg:?} argument (a non-empty string); nothing was done"
                ),
                json!({"status": "invalid_args", "rule": format!("tools.{name}.idempotency_key")}),
            )),
        }
    }

    /// The answer stored for this key, marked as a replay; nothing is run.
    async fn replay(
        &self,
        name: &str,
        arguments: &Map<String, Value>,
        verdict: &Verdict,
        stored: Value,
    ) -> CallToolResult {
        let event = self
            .event(
                name,
                arguments,
                Decision::Allow,
                Outcome::Replay,
                &verdict.rule,
            )
            .with("tier", verdict.tier.as_str());
        if !self.gate.record(event).await {
            return outcome::audit_unavailable(name);
        }
        match serde_json::from_value::<CallToolResult>(stored) {
            Ok(mut result) => {
                let mut meta = result.meta.take().unwrap_or_default();
                meta.0
                    .insert("io.toolgate/status".to_owned(), json!("replay"));
                result.meta = Some(meta);
                result
            }
            Err(_) => outcome::in_doubt(name, "its stored result could not be read back"),
        }
    }

    async fn conflict(
        &self,
        name: &str,
        arguments: &Map<String, Value>,
        key: &str,
    ) -> CallToolResult {
        let rule = format!("tools.{name}.idempotency_key");
        let event = self.event(name, arguments, Decision::Deny, Outcome::Conflict, &rule);
        if !self.gate.record(event).await {
            return outcome::audit_unavailable(name);
        }
        outcome::tool_error(
            format!(
                "{name}: idempotency key {key:?} was already used with other arguments; nothing was done. Use a new key for a new action."
            ),
            json!({"status": "conflict", "rule": rule}),
        )
    }

    async fn in_doubt(
        &self,
        name: &str,
        arguments: &Map<String, Value>,
        verdict: &Verdict,
        key: &str,
    ) -> CallToolResult {
        let event = self
            .event(
                name,
                arguments,
                Decision::Allow,
                Outcome::InDoubt,
                &verdict.rule,
            )
            .with("forwarded", false);
        if !self.gate.record(event).await {
            return outcome::audit_unavailable(name);
        }
        outcome::in_doubt(
            name,
            &format!(
                "an earlier call with idempotency key {key:?} was sent and never reported back; it was not sent again"
            ),
        )
    }

    /// A call the gate could not run for want of a store: audited and refused.
    async fn not_run(
        &self,
        name: &str,
        arguments: &Map<String, Value>,
        rule: &str,
        why: &str,
    ) -> CallToolResult {
        let event = self.event(name, arguments, Decision::Deny, Outcome::NotExecuted, rule);
        self.gate.record(event).await;
        outcome::tool_error(
            format!("{name} was not run: {why}"),
            json!({"status": "refused", "rule": rule}),
        )
    }

    /// Secrets never reach the client; untrusted output is sanitised and labelled.
    fn clean(&self, name: &str, result: CallToolResult) -> CallToolResult {
        let untrusted = self
            .gate
            .policy()
            .rule(name)
            .is_some_and(|r| r.untrusted_output);
        if untrusted {
            let source = match &self.origin {
                Some(upstream) => format!("upstream {upstream}, tool {name}"),
                None => format!("tool {name}"),
            };
            return sanitise_result(self.gate.redactor(), &source, result);
        }
        redact_result(self.gate.redactor(), result)
    }
}

/// Secrets in a tool's result never reach the client. One pass over the serialised result decides;
/// only a result that holds something secret-shaped is rebuilt.
fn redact_result(
    redactor: &toolgate_core::redact::Redactor,
    result: CallToolResult,
) -> CallToolResult {
    let Ok(text) = serde_json::to_string(&result) else {
        return result;
    };
    if matches!(redactor.redact(&text), Cow::Borrowed(_)) {
        return result;
    }
    let value = serde_json::to_value(&result).unwrap_or(Value::Null);
    rebuild(&redactor.redact_value(&value))
}

/// Output the policy marks untrusted: every text the model will read (text blocks, embedded
/// resource text, link names and descriptions, structured content) has control, bidi and
/// invisible characters stripped and secrets redacted, is capped, and text blocks are wrapped in a
/// labelled untrusted-content envelope. Binary blocks pass as they are.
fn sanitise_result(
    redactor: &toolgate_core::redact::Redactor,
    source: &str,
    result: CallToolResult,
) -> CallToolResult {
    let mut value = serde_json::to_value(&result).unwrap_or(Value::Null);
    let mut report = sanitize::Report::default();
    let max = sanitize::DEFAULT_MAX_CHARS;
    if let Some(Value::Array(blocks)) = value.get_mut("content") {
        for block in blocks {
            let Value::Object(block) = block else {
                continue;
            };
            if let Some(Value::String(text)) = block.get_mut("text") {
                let clean = sanitize::clean_text(text, redactor, max, &mut report);
                *text = sanitize::envelope(source, &clean);
            }
            if let Some(Value::Object(resource)) = block.get_mut("resource")
                && let Some(Value::String(text)) = resource.get_mut("text")
            {
                let clean = sanitize::clean_text(text, redactor, max, &mut report);
                *text = sanitize::envelope(source, &clean);
            }
            for field in ["name", "title", "description"] {
                if let Some(Value::String(text)) = block.get_mut(field) {
                    *text = sanitize::clean_text(text, redactor, max, &mut report);
                }
            }
        }
    }
    if let Some(structured) = value.get_mut("structuredContent") {
        *structured = sanitize::clean_value(structured, redactor, max, &mut report);
    }
    if let Value::Object(map) = &mut value {
        let meta = map
            .entry("_meta")
            .or_insert_with(|| Value::Object(Map::new()));
        if let Value::Object(meta) = meta {
            meta.insert(
                "io.toolgate/untrusted".to_owned(),
                json!({"source": source, "removed": report.removed, "truncated": report.truncated, "redacted": report.redacted}),
            );
        }
    }
    rebuild(&value)
}

/// A cleaned result back in rmcp's type; what cannot be rebuilt is withheld, never sent raw.
fn rebuild(value: &Value) -> CallToolResult {
    serde_json::from_value::<CallToolResult>(value.clone()).unwrap_or_else(|_| {
        outcome::tool_error(
            "the result could not be cleaned for the client; withheld",
            json!({}),
        )
    })
}
