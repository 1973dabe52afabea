//! The `approve` step: a call that needs a person finds or opens the approval row for its exact
//! fingerprint, is held open for a bounded time (with progress when asked), and goes on to run once
//! when a person approves; a repeat after that run replays the stored answer, a denial or expiry is
//! final. The rules themselves (first decision wins, no self-approval, expiry, single use) are the
//! store's (`toolgate_store::approval`); this file only walks them. A store that cannot answer
//! means the call does not run.

use std::ops::ControlFlow::{Break, Continue};
use std::time::Duration;

use rmcp::model::{CallToolResult, GetExtensions as _, ProgressNotificationParam};
use serde_json::Value;
use toolgate_core::answer::{Pending, PersonRefusal};
use toolgate_core::policy::{Action, Verdict, fingerprint};
use toolgate_core::time::now_ms;
use toolgate_store::approval::{Approval, ApprovalStore, NewApproval, Status};

use super::admit::approval_reason;
use super::{Answer, CallState, Corridor, Flow, pause};

/// How often a held call looks at its approval row.
const APPROVAL_POLL: Duration = Duration::from_millis(200);

/// Progress is sent every this many polls (once a second).
const PROGRESS_EVERY: u32 = 5;

impl Corridor<'_> {
    /// Lets a call that needs no person through; otherwise holds it until a person decides, the
    /// wait ends (pending answer) or the server shuts down (pending answer at once).
    pub(super) async fn approve(&self, call: &mut CallState<'_>) -> Flow {
        // Most calls need no person: look before cloning the verdict.
        let Some(verdict) = call
            .verdict
            .as_ref()
            .filter(|v| v.action == Action::NeedsApproval)
            .cloned()
        else {
            return Continue(());
        };
        let Some(store) = self.gate.approvals() else {
            return Break(Answer::NotRun {
                rule: "approvals_unavailable".to_owned(),
                why: "it needs a person's approval and this server has no approval queue"
                    .to_owned(),
            });
        };
        let policy = self.gate.policy();
        let print = fingerprint(
            self.gate.principal(),
            call.name,
            call.arguments(),
            policy.sha256(),
        );
        let ttl = i64::try_from(policy.defaults().approval_ttl.as_millis()).unwrap_or(i64::MAX);
        let now = now_ms();
        let row = match answered(store.latest_for(&print, now).await)? {
            Some(row) if row.status == Status::Approved => {
                return self.approved(call, &verdict, store, row).await;
            }
            Some(row)
                if matches!(row.status, Status::Denied | Status::Expired)
                    && now - row.decided_at.unwrap_or(row.expires_at) < ttl =>
            {
                return Break(refused_by_person(call, &row));
            }
            Some(row) if row.status == Status::Pending => row,
            _ => {
                if let Some(why) = &call.approvals_closed {
                    return Break(Answer::NotRun {
                        rule: "approvals.closed".to_owned(),
                        why: why.clone(),
                    });
                }
                self.open_request(call, &verdict, store, print, ttl).await?
            }
        };
        let current = if call.hold {
            // Boxed: only a held call waits here, and every call's `approve` would be as large.
            Box::pin(self.hold(call, store, row)).await?
        } else {
            row
        };
        match current.status {
            Status::Approved => self.approved(call, &verdict, store, current).await,
            Status::Denied | Status::Expired => Break(refused_by_person(call, &current)),
            Status::Pending => Break(pending(&current)),
        }
    }

    /// Opens the approval request for this exact call and records that it was asked for.
    async fn open_request(
        &self,
        call: &mut CallState<'_>,
        verdict: &Verdict,
        store: &ApprovalStore,
        fingerprint: String,
        ttl: i64,
    ) -> Flow<Approval> {
        let policy = self.gate.policy();
        let now = now_ms();
        let new = NewApproval {
            fingerprint,
            requester: self.gate.principal().sub.clone(),
            tool: call.name.to_owned(),
            args_redacted: self.gate.redactor().redact_value(&call.arguments),
            tier: verdict.tier.as_str().to_owned(),
            reason: format!("{} (rule {})", approval_reason(verdict), verdict.rule),
            dry_run: self.dry_run(call, verdict).await,
            policy_sha256: policy.sha256().to_owned(),
            expires_at: now.saturating_add(ttl),
            approvers: policy.approvers(call.name).allowed.clone(),
            approvals_required: policy.approvers(call.name).required,
        };
        // Boxed: a store's future is kilobytes (module `corridor`, "Sizes").
        let (row, created) = answered(Box::pin(store.request(new, now)).await)?;
        if created {
            let asked: Answer<CallToolResult> = Answer::Pending(pending_of(&row));
            let event = self
                .event(call, &asked)
                .with("approval_id", row.id.as_str());
            if let Err(unavailable) = self.gate.record(event).await {
                return Break(Answer::NotRun {
                    rule: "audit.unavailable".to_owned(),
                    why: unavailable.to_string(),
                });
            }
            // Only a new row: a retry that attached to it was announced already. Queued, never
            // awaited, so a slow receiver cannot hold up the call (notify/mod.rs).
            #[cfg(feature = "notify")]
            if let Some(notifier) = self.gate.notifier() {
                notifier.requested(&row);
            }
        }
        Continue(row)
    }

    /// Holds the call open for the policy's bounded wait, with progress when the client asked for
    /// it; returns the row as it stands when a person decided or the wait ended.
    async fn hold(
        &self,
        call: &CallState<'_>,
        store: &ApprovalStore,
        row: Approval,
    ) -> Flow<Approval> {
        let wait = self.gate.policy().defaults().approval_wait;
        self.point_to_console(call, &row);
        let started = tokio::time::Instant::now();
        let mut tick = 0_u32;
        let mut row = row;
        while started.elapsed() < wait {
            tokio::select! {
                // Shutdown first: once the grace is over the transport cancels the call too, and
                // a held call is owed its pending answer.
                biased;
                () = call.shutdown.cancelled() => return Continue(row),
                waited = pause(APPROVAL_POLL, &call.ct) => {
                    // The approval stays pending; the client may call again later.
                    if waited.is_err() {
                        return Break(Answer::Cancelled);
                    }
                }
            }
            tick += 1;
            if let (Some(caller), Some(token)) = (&call.caller, &call.progress)
                && tick.is_multiple_of(PROGRESS_EVERY)
            {
                let message = format!(
                    "waiting for approval {} ({} s)",
                    row.id,
                    started.elapsed().as_secs()
                );
                let param = ProgressNotificationParam::new(token.clone(), f64::from(tick))
                    .with_message(message);
                let _ = caller.peer.notify_progress(param).await;
            }
            match answered(store.get(&row.id, now_ms()).await)? {
                Some(current) if current.status == Status::Pending => row = current,
                Some(current) => return Continue(current),
                None => break,
            }
        }
        Continue(row)
    }

    /// Sends a caller that is held for a person, and can open a link, the console's page of the
    /// request (URL-mode elicitation, MCP 2025-11-25): an `initialize`-era client that declared
    /// `elicitation.url`, on a gate that knows the console. Not awaited: the person may take
    /// their time, and the call goes on waiting for the decision whatever the client answers
    /// (a 2026-07-28 client has no requests from the server; it can take a task instead).
    fn point_to_console(&self, call: &CallState<'_>, row: &Approval) {
        let Some(caller) = &call.caller else { return };
        let url_mode = caller
            .capabilities
            .elicitation
            .as_ref()
            .is_some_and(|elicitation| elicitation.url.is_some());
        let Some(link) = self
            .gate
            .console_link(&row.id)
            .filter(|_| url_mode && !caller.modern)
        else {
            return;
        };
        let message = format!(
            "{} needs a person's approval (request {}). Open the approvals console to see what it would do and who may decide.",
            row.tool, row.id
        );
        let params = rmcp::model::ElicitRequestParams::UrlElicitationParams {
            meta: None,
            message,
            url: link,
            elicitation_id: row.id.clone(),
        };
        let mut request =
            rmcp::model::ServerRequest::ElicitRequest(rmcp::model::ElicitRequest::new(params));
        // On the stream of the held call, where the client expects its questions.
        request
            .extensions_mut()
            .insert(rmcp::service::OriginatingRequestId(
                caller.request_id.clone(),
            ));
        let peer = caller.peer.clone();
        let approval = row.id.clone();
        let limit = self.gate.policy().defaults().approval_ttl;
        tokio::spawn(async move {
            match tokio::time::timeout(limit, peer.send_request(request)).await {
                Ok(Ok(answer)) => {
                    tracing::info!(approval = %approval, answer = ?answer, "the caller was shown the console's page of its request");
                }
                Ok(Err(error)) => {
                    tracing::info!(approval = %approval, error = %error, "the caller did not take the console's link");
                }
                Err(_) => {}
            }
        });
    }

    /// An approved call runs exactly once: the first to consume the approval goes on to run
    /// under it; a repeat waits (bounded by the tool's timeout) for that run's stored answer and
    /// replays it, or says the outcome is unknown.
    async fn approved(
        &self,
        call: &mut CallState<'_>,
        verdict: &Verdict,
        store: &ApprovalStore,
        row: Approval,
    ) -> Flow {
        call.detail
            .push(("approval_id", Value::from(row.id.as_str())));
        if answered(store.consume(&row.id, now_ms()).await)? {
            call.verdict = Some(Verdict {
                action: Action::Run,
                rule: format!(
                    "approval {} by {}",
                    row.id,
                    row.decided_by.clone().unwrap_or_default()
                ),
                ..verdict.clone()
            });
            call.approval = Some(row.id);
            return Continue(());
        }
        let limit = self.timeout(call.name);
        let started = tokio::time::Instant::now();
        let mut row = row;
        while row.result.is_none() && started.elapsed() < limit {
            if pause(APPROVAL_POLL, &call.ct).await.is_err() {
                return Break(Answer::Cancelled);
            }
            match answered(store.get(&row.id, now_ms()).await)? {
                Some(current) => row = current,
                None => break,
            }
        }
        let stored = row
            .result
            .and_then(|r| serde_json::from_value::<CallToolResult>(r).ok());
        Break(match stored {
            Some(result) => Answer::Replay(result),
            None => Answer::InDoubt {
                why: format!(
                    "approval {} was already used by one execution whose result is not recorded",
                    row.id
                ),
            },
        })
    }

    /// Keeps the answer of a run made under an approval, so that repeats of the call replay it.
    pub(super) async fn keep_approved_result(&self, id: &str, result: &CallToolResult) {
        let Some(store) = self.gate.approvals() else {
            return;
        };
        let stored = serde_json::to_value(result).unwrap_or(Value::Null);
        if let Err(error) = store.store_result(id, &stored).await {
            tracing::error!(error = %error, approval = %id, "result of an approved call not stored; repeats will report in doubt");
        }
    }
}

/// A store answer, or the end of the call when the store did not answer.
fn answered<T, E: std::fmt::Display>(result: Result<T, E>) -> Flow<T> {
    match result {
        Ok(value) => Continue(value),
        Err(error) => Break(unavailable(error)),
    }
}

/// The approval store did not answer: the call does not run.
fn unavailable(error: impl std::fmt::Display) -> Answer<CallToolResult> {
    tracing::error!(error = %error, "approval store unavailable; call not run");
    Answer::NotRun {
        rule: "approvals.unavailable".to_owned(),
        why: "the approval store did not answer".to_owned(),
    }
}

fn pending_of(row: &Approval) -> Pending {
    Pending {
        approval_id: row.id.clone(),
        expires_at_ms: row.expires_at,
        tier: row.tier.clone(),
        reason: row.reason.clone(),
        policy_sha256: row.policy_sha256.clone(),
    }
}

fn pending(row: &Approval) -> Answer<CallToolResult> {
    Answer::Pending(pending_of(row))
}

fn refused_by_person(call: &mut CallState<'_>, row: &Approval) -> Answer<CallToolResult> {
    call.detail
        .push(("approval_id", Value::from(row.id.as_str())));
    Answer::RefusedByPerson(PersonRefusal {
        approval_id: row.id.clone(),
        expired: row.status == Status::Expired,
        decided_by: row.decided_by.clone(),
        reason: row.decision_reason.clone(),
        policy_sha256: row.policy_sha256.clone(),
    })
}
