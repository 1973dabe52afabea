//! Approvals in the corridor: a high-tier call finds or opens the approval row for its exact
//! fingerprint, is held open for a bounded time (with progress when asked), and runs once when a
//! person approves; repeats replay the stored result, a denial or expiry is answered as final.
//! The rules themselves (first decision wins, no self-approval, expiry, single use) are the
//! store's (`toolgate_store::approval`); this file only walks them.

use std::time::Duration;

use rmcp::model::{CallToolResult, ProgressNotificationParam};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer};
use serde_json::{Map, Value, json};
use toolgate_core::audit::{Decision, Outcome};
use toolgate_core::policy::{Tier, Verdict};
use toolgate_core::principal::Principal;
use toolgate_store::approval::{Approval, NewApproval, Status};

use super::corridor::{Corridor, fingerprint, now_ms, rfc3339, store_error};
use crate::outcome;

/// How often a held call looks at its approval row.
const APPROVAL_POLL: Duration = Duration::from_millis(200);

impl Corridor<'_> {
    /// High-tier calls: find or open the approval for this exact call, hold the call for a bounded
    /// time, and run it once when a person approves.
    pub(super) async fn approval(
        &self,
        name: &str,
        arguments: Map<String, Value>,
        principal: &Principal,
        verdict: &Verdict,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let gate = self.gate;
        let Some(store) = gate.approvals() else {
            let event = self.event(
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
                    dry_run: self.dry_run(name, &arguments, verdict).await,
                    policy_sha256: policy.sha256().to_owned(),
                    expires_at: now.saturating_add(ttl),
                };
                let (row, created) = store.request(new, now).await.map_err(store_error)?;
                if created {
                    let event = self
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
                .execute(name, arguments, principal, &approved, context)
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
        let event = self
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
