//! The corridor (DESIGN.md §1): the one path every `tools/call` walks, in order.
//!
//! kill switch → visibility and argument rules (-32602) → schema (isError) → tier, escalation,
//! budget, gate switch → approval → execute with timeout and cancellation → audit. Each refusal is
//! audited before it is answered; a store that cannot answer means the call does not run.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rmcp::model::{CallToolResult, ErrorCode, ProgressNotificationParam};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer};
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;
use toolgate_core::audit::{Decision, Outcome};
use toolgate_core::canonical;
use toolgate_core::policy::{Action, Denial, Situation, Tier, Verdict};
use toolgate_core::principal::Principal;
use toolgate_core::schema::ToolSchema;
use toolgate_store::approval::{Approval, NewApproval, Status};

use super::Gate;
use crate::outcome;
use crate::toolset::{Call, Toolset};

/// How often a held call looks at its approval row.
const APPROVAL_POLL: Duration = Duration::from_millis(200);

/// Everything the corridor needs besides the call.
pub(super) struct Corridor<'a> {
    pub(super) gate: &'a Gate,
    pub(super) toolset: &'a dyn Toolset,
    pub(super) schemas: &'a BTreeMap<String, ToolSchema>,
}

impl Corridor<'_> {
    pub(super) async fn call(
        &self,
        name: &str,
        arguments: Map<String, Value>,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let gate = self.gate;
        let registered = self.toolset.has(name);
        let killswitch = match gate.state() {
            None => false,
            Some(state) => match state.killswitch_on().await {
                Ok(on) => on,
                Err(error) => {
                    // The switch cannot be read: behave as if it were on.
                    tracing::error!(error = %error, "kill switch unreadable; refusing");
                    true
                }
            },
        };
        if killswitch {
            let denial = Denial {
                tool: name.to_owned(),
                rule: "killswitch".to_owned(),
            };
            return Err(gate.refuse(name, &arguments, denial, false).await);
        }
        gate.admit(name, &arguments, registered).await?;
        let args = Value::Object(arguments.clone());
        if let Some(schema) = self.schemas.get(name)
            && let Err(invalid) = schema.validate(&args)
        {
            let event = gate.event(
                name,
                &arguments,
                Decision::Deny,
                Outcome::InvalidArgs,
                "schema",
            );
            if !gate.record(event).await {
                return Ok(outcome::audit_unavailable(name));
            }
            let reason = gate
                .redactor()
                .redact(&format!("invalid arguments for {name}: {invalid}"))
                .into_owned();
            let detail = json!({"status": "invalid_args", "rule": "schema", "policy_sha256": gate.policy().sha256()});
            return Ok(outcome::tool_error(reason, detail));
        }

        let principal = gate.principal().clone();
        let policy = gate.policy();
        let assessment = policy.assess(name, &arguments, &principal);
        for why in &assessment.undecided {
            tracing::warn!(tool = name, condition = %why, "escalation condition undecidable; counted as matched");
        }
        let over_budget = if assessment.tier == Tier::Medium {
            !self.charge_budget(&principal).await
        } else {
            false
        };
        let situation = Situation {
            killswitch: false,
            gate_open: gate.gate_open(name),
            over_budget,
        };
        let verdict = policy.decide(name, &assessment, situation);
        match verdict.action {
            Action::Deny => {
                let denial = Denial {
                    tool: name.to_owned(),
                    rule: verdict.rule.clone(),
                };
                Err(gate.refuse(name, &arguments, denial, false).await)
            }
            Action::RefuseWithDryRun => Ok(self.refuse_gated(name, &arguments, &verdict).await),
            Action::NeedsApproval => {
                self.approval(name, arguments, &principal, &verdict, context)
                    .await
            }
            Action::Run => {
                self.execute(name, arguments, &principal, &verdict, &context.ct)
                    .await
            }
        }
    }

    /// Counts a medium call; false when the principal is over budget or the store cannot say (then
    /// the call needs a person, which is the safe side).
    async fn charge_budget(&self, principal: &Principal) -> bool {
        let Some(state) = self.gate.state() else {
            return true;
        };
        let defaults = self.gate.policy().defaults();
        let window = i64::try_from(defaults.medium_window.as_millis()).unwrap_or(i64::MAX);
        match state
            .charge_budget(&principal.sub, defaults.medium_budget, window, now_ms())
            .await
        {
            Ok(within) => within,
            Err(error) => {
                tracing::error!(error = %error, "budget store unavailable; treating as over budget");
                false
            }
        }
    }

    /// What a refused or held call would have done: the tool's own dry run, or a preview.
    fn dry_run(&self, name: &str, arguments: &Map<String, Value>, verdict: &Verdict) -> Value {
        let redactor = self.gate.redactor();
        match self.toolset.dry_run(name, arguments) {
            Some(preview) => redactor.redact_value(&preview),
            None => json!({
                "would": format!("call {name} with the arguments below"),
                "arguments": redactor.redact_value(&Value::Object(arguments.clone())),
                "reversible": Value::Null,
                "rule": verdict.rule,
                "tier": verdict.tier.as_str(),
                "synthesised": true,
            }),
        }
    }

    async fn refuse_gated(
        &self,
        name: &str,
        arguments: &Map<String, Value>,
        verdict: &Verdict,
    ) -> CallToolResult {
        let gate = self.gate;
        let env = gate.policy().gate_env(name);
        let event = gate.event(
            name,
            arguments,
            Decision::Refuse,
            Outcome::DryRun,
            &verdict.rule,
        );
        if !gate.record(event).await {
            return outcome::audit_unavailable(name);
        }
        let reason =
            format!("{name} is gated: it stays off until {env} is set in the server's environment");
        outcome::tool_error(
            format!("{reason}. Nothing was done. Dry run attached."),
            json!({
                "status": "refused",
                "reason": reason,
                "rule": verdict.rule,
                "policy_sha256": gate.policy().sha256(),
                "enable": format!("restart the server with {env}=1 (accepted: 1 true yes on enable enabled allow)"),
                "gate_env": env,
                "dry_run": self.dry_run(name, arguments, verdict),
            }),
        )
    }

    /// Runs the handler with the tool's timeout and the caller's cancellation, then audits.
    async fn execute(
        &self,
        name: &str,
        arguments: Map<String, Value>,
        principal: &Principal,
        verdict: &Verdict,
        ct: &CancellationToken,
    ) -> Result<CallToolResult, ErrorData> {
        let gate = self.gate;
        let policy = gate.policy();
        let timeout = policy
            .rule(name)
            .and_then(|r| r.timeout)
            .unwrap_or(policy.defaults().timeout);
        let handler_ct = ct.child_token();
        let call = Call {
            gate,
            name,
            arguments: arguments.clone(),
            principal,
            rule: &verdict.rule,
            ct: handler_ct.clone(),
        };
        let run = tokio::time::timeout(timeout, self.toolset.call(call));
        // `biased`: a cancellation that raced the handler's own (cancelled) answer is still a
        // cancellation, whichever future the runtime happened to see first.
        let (result, outcome) = tokio::select! {
            biased;
            () = ct.cancelled() => {
                handler_ct.cancel();
                (Err(ErrorData::internal_error("cancelled by the client", None)), Outcome::Cancelled)
            }
            finished = run => match finished {
                Ok(Ok(result)) => {
                    let outcome = if result.is_error == Some(true) { Outcome::Failed } else { Outcome::Committed };
                    (Ok(result), outcome)
                }
                // A refusal the handler repeated (defence in depth) stays a protocol error; any
                // other handler error is a failure the model should read, with secrets removed.
                Ok(Err(error)) if error.code == ErrorCode::INVALID_PARAMS => (Err(error), Outcome::NotExecuted),
                Ok(Err(error)) => {
                    let reason = gate.redactor().redact(&format!("{name} failed: {}", error.message)).into_owned();
                    (Ok(outcome::tool_error(reason, json!({"status": "failed"}))), Outcome::Failed)
                }
                Err(_) => {
                    handler_ct.cancel();
                    let reason = format!("{name} timed out after {} ms; it may not have finished", timeout.as_millis());
                    (Ok(outcome::tool_error(reason, json!({"status": "timeout"}))), Outcome::Timeout)
                }
            },
        };
        if !self.toolset.records_itself(name) {
            let event = gate
                .event(name, &arguments, Decision::Allow, outcome, &verdict.rule)
                .with("tier", verdict.tier.as_str());
            if !gate.record(event).await && outcome != Outcome::Cancelled {
                return Ok(outcome::audit_unavailable(name));
            }
        }
        result.map(|r| redact_result(gate, r))
    }

    /// High-tier calls: find or open the approval for this exact call, hold the call for a bounded
    /// time, and run it once when a person approves.
    async fn approval(
        &self,
        name: &str,
        arguments: Map<String, Value>,
        principal: &Principal,
        verdict: &Verdict,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let gate = self.gate;
        let Some(store) = gate.approvals() else {
            let event = gate.event(
                name,
                &arguments,
                Decision::Deny,
                Outcome::NotExecuted,
                "approvals_unavailable",
            );
            gate.record(event).await;
            return Ok(outcome::tool_error(
                format!(
                    "{name} needs a person's approval and this server has no approval queue; nothing was done"
                ),
                json!({"status": "refused", "rule": verdict.rule}),
            ));
        };
        let policy = gate.policy();
        let fingerprint = fingerprint(principal, name, &arguments, policy.sha256());
        let ttl = i64::try_from(policy.defaults().approval_ttl.as_millis()).unwrap_or(i64::MAX);
        let now = now_ms();
        let latest = store
            .latest_for(&fingerprint, now)
            .await
            .map_err(store_error)?;
        let row = match latest {
            Some(row) if row.status == Status::Approved => {
                return self
                    .run_approved(name, arguments, principal, verdict, row, context)
                    .await;
            }
            Some(row)
                if matches!(row.status, Status::Denied | Status::Expired)
                    && now - row.decided_at.unwrap_or(row.expires_at) < ttl =>
            {
                return Ok(self.refused_by_person(name, &arguments, &row).await);
            }
            Some(row) if row.status == Status::Pending => row,
            _ => {
                let new = NewApproval {
                    fingerprint: fingerprint.clone(),
                    requester: principal.sub.clone(),
                    tool: name.to_owned(),
                    args_redacted: gate
                        .redactor()
                        .redact_value(&Value::Object(arguments.clone())),
                    tier: verdict.tier.as_str().to_owned(),
                    reason: format!("{} (rule {})", approval_reason(verdict), verdict.rule),
                    dry_run: self.dry_run(name, &arguments, verdict),
                    policy_sha256: policy.sha256().to_owned(),
                    expires_at: now.saturating_add(ttl),
                };
                let (row, created) = store.request(new, now).await.map_err(store_error)?;
                if created {
                    let event = gate
                        .event(
                            name,
                            &arguments,
                            Decision::Approval,
                            Outcome::Requested,
                            &verdict.rule,
                        )
                        .with("approval_id", row.id.as_str())
                        .with("tier", verdict.tier.as_str());
                    if !gate.record(event).await {
                        return Ok(outcome::audit_unavailable(name));
                    }
                }
                row
            }
        };
        // Hold the call open for a bounded time, with progress when the client asked for it.
        let wait = policy.defaults().approval_wait;
        let started = tokio::time::Instant::now();
        let token = context.meta.get_progress_token();
        let mut tick = 0_u32;
        loop {
            if started.elapsed() >= wait {
                return Ok(pending(&row));
            }
            tokio::select! {
                () = tokio::time::sleep(APPROVAL_POLL) => {}
                () = context.ct.cancelled() => {
                    // The approval stays pending; the client may call again later.
                    return Err(ErrorData::internal_error("cancelled by the client", None));
                }
            }
            tick += 1;
            if let Some(token) = &token
                && tick.is_multiple_of(5)
            {
                let message = format!(
                    "waiting for approval {} ({} s)",
                    row.id,
                    started.elapsed().as_secs()
                );
                let param = ProgressNotificationParam::new(token.clone(), f64::from(tick))
                    .with_message(message);
                let _ = context.peer.notify_progress(param).await;
            }
            let Some(current) = store.get(&row.id, now_ms()).await.map_err(store_error)? else {
                return Ok(pending(&row));
            };
            match current.status {
                Status::Pending => {}
                Status::Approved => {
                    return self
                        .run_approved(name, arguments, principal, verdict, current, context)
                        .await;
                }
                Status::Denied | Status::Expired => {
                    return Ok(self.refused_by_person(name, &arguments, &current).await);
                }
            }
        }
    }

    /// Runs an approved call exactly once; a repeat replays the stored result.
    async fn run_approved(
        &self,
        name: &str,
        arguments: Map<String, Value>,
        principal: &Principal,
        verdict: &Verdict,
        row: Approval,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let gate = self.gate;
        let store = gate
            .approvals()
            .ok_or_else(|| store_error("approval store vanished"))?;
        if store
            .consume(&row.id, now_ms())
            .await
            .map_err(store_error)?
        {
            let approved = Verdict {
                rule: format!(
                    "approval {} by {}",
                    row.id,
                    row.decided_by.clone().unwrap_or_default()
                ),
                ..verdict.clone()
            };
            let result = self
                .execute(name, arguments, principal, &approved, &context.ct)
                .await?;
            let stored = serde_json::to_value(&result).unwrap_or(Value::Null);
            if let Err(error) = store.store_result(&row.id, &stored).await {
                tracing::error!(error = %error, approval = %row.id, "result of an approved call not stored; repeats will report in doubt");
            }
            return Ok(result);
        }
        // Already used: the one execution happened, or is happening in another copy of this call.
        // Wait (bounded by the tool's timeout) for its stored result rather than guess.
        let policy = gate.policy();
        let limit = policy
            .rule(name)
            .and_then(|r| r.timeout)
            .unwrap_or(policy.defaults().timeout);
        let started = tokio::time::Instant::now();
        let mut row = row;
        while row.result.is_none() && started.elapsed() < limit {
            tokio::select! {
                () = tokio::time::sleep(APPROVAL_POLL) => {}
                () = context.ct.cancelled() => return Err(ErrorData::internal_error("cancelled by the client", None)),
            }
            match store.get(&row.id, now_ms()).await.map_err(store_error)? {
                Some(current) => row = current,
                None => break,
            }
        }
        let event = gate
            .event(
                name,
                &arguments,
                Decision::Allow,
                Outcome::Replay,
                &verdict.rule,
            )
            .with("approval_id", row.id.as_str());
        gate.record(event).await;
        match row
            .result
            .and_then(|r| serde_json::from_value::<CallToolResult>(r).ok())
        {
            Some(result) => Ok(result),
            None => Ok(outcome::tool_error(
                format!(
                    "{name}: approval {} was already used by one execution whose result is not recorded; outcome unknown: verify before retrying",
                    row.id
                ),
                json!({"status": "in_doubt", "approval_id": row.id}),
            )),
        }
    }

    async fn refused_by_person(
        &self,
        name: &str,
        arguments: &Map<String, Value>,
        row: &Approval,
    ) -> CallToolResult {
        let outcome_kind = if row.status == Status::Expired {
            Outcome::Expired
        } else {
            Outcome::Denied
        };
        let event = self
            .gate
            .event(
                name,
                arguments,
                Decision::Approval,
                outcome_kind,
                "approval",
            )
            .with("approval_id", row.id.as_str());
        self.gate.record(event).await;
        let how = if row.status == Status::Expired {
            format!("approval {} expired without a decision", row.id)
        } else {
            format!(
                "approval {} was denied by {}",
                row.id,
                row.decided_by.as_deref().unwrap_or("a person")
            )
        };
        outcome::tool_error(
            format!(
                "{name} was not run: {how}. Do not retry this action. Tell the user it needs a person."
            ),
            json!({
                "status": row.status.as_str(),
                "approval_id": row.id,
                "decided_by": row.decided_by,
                "reason": row.decision_reason,
                "rule": "approval",
                "policy_sha256": row.policy_sha256,
            }),
        )
    }
}

fn pending(row: &Approval) -> CallToolResult {
    let until = rfc3339(row.expires_at);
    outcome::tool_error(
        format!(
            "{} needs a person's approval: approval {} pending until {until}; call again with the same arguments after it is decided",
            row.tool, row.id
        ),
        json!({
            "status": "pending_approval",
            "approval_id": row.id,
            "expires_at": until,
            "tier": row.tier,
            "reason": row.reason,
            "policy_sha256": row.policy_sha256,
        }),
    )
}

fn approval_reason(verdict: &Verdict) -> String {
    if verdict.rule == "defaults.medium_budget" {
        "the caller's budget of unattended medium calls is used up".to_owned()
    } else if verdict.declared == Tier::High {
        "the tool is high risk".to_owned()
    } else {
        format!(
            "the arguments raise it from {} to {}",
            verdict.declared.as_str(),
            verdict.tier.as_str()
        )
    }
}

/// Binds an approval to exactly this call: who, what, with which arguments, under which policy.
#[must_use]
pub fn fingerprint(
    principal: &Principal,
    tool: &str,
    arguments: &Map<String, Value>,
    policy_sha256: &str,
) -> String {
    canonical::digest(&json!({
        "principal": principal.sub,
        "tool": tool,
        "arguments": arguments,
        "policy_sha256": policy_sha256,
    }))
}

/// Secrets in a tool's result never reach the client. One pass over the serialised result decides;
/// only a result that holds something secret-shaped is rebuilt.
fn redact_result(gate: &Gate, result: CallToolResult) -> CallToolResult {
    let Ok(text) = serde_json::to_string(&result) else {
        return result;
    };
    if matches!(gate.redactor().redact(&text), std::borrow::Cow::Borrowed(_)) {
        return result;
    }
    let value = serde_json::to_value(&result).unwrap_or(Value::Null);
    match serde_json::from_value::<CallToolResult>(gate.redactor().redact_value(&value)) {
        Ok(clean) => clean,
        // Never send what could not be cleaned.
        Err(_) => outcome::tool_error(
            "the result held secrets and could not be redacted; withheld",
            json!({}),
        ),
    }
}

fn store_error(error: impl std::fmt::Display) -> ErrorData {
    tracing::error!(error = %error, "approval store unavailable; call not run");
    ErrorData::internal_error("approval store unavailable; the call was not run", None)
}

/// Unix milliseconds now.
#[must_use]
pub fn now_ms() -> i64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
}

/// `2026-11-30T09:52:58Z` from unix milliseconds (civil-from-days, proleptic Gregorian).
#[must_use]
pub fn rfc3339(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}
