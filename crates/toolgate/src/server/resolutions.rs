//! Audit records for what people do from other processes: approval decisions and the kill switch.
//!
//! A person decides in another process (`toolgate approvals approve`, `toolgate killswitch on`),
//! which cannot write to the audit log: the server holds its lock. So the server notices decisions,
//! expiries and switch changes itself and records each once: `approval / approved | denied |
//! expired` with the approver and reason (the store marks a row when its record is durable, so a
//! restart neither loses nor repeats one), and `control / switch_on | switch_off` with who flipped
//! it.

use std::time::Duration;

use serde_json::Value;
use toolgate_core::audit::{Decision, Event, Outcome};
use toolgate_store::approval::Status;

use toolgate_core::time::now_ms;

use super::Gate;

/// How often decided approvals are looked for.
const EVERY: Duration = Duration::from_millis(500);

/// [`audit_resolutions`] on a task of its own while a server serves: stopped when dropped.
#[derive(Debug)]
pub struct Sweeper(tokio::task::JoinHandle<()>);

impl Sweeper {
    /// Starts recording `gate`'s resolutions.
    #[must_use]
    pub fn start(gate: &Gate) -> Self {
        Self(tokio::spawn(audit_resolutions(gate.clone())))
    }
}

impl Drop for Sweeper {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Runs until the task is dropped; records every resolved approval once, and each change of the
/// kill switch it sees (flips faster than its period collapse into the last one).
pub async fn audit_resolutions(gate: Gate) {
    let mut switch = match gate.state() {
        Some(state) => state.killswitch().await.ok(),
        None => None,
    };
    loop {
        if let (Some(state), Some(seen)) = (gate.state(), switch.as_ref())
            && let Ok(now) = state.killswitch().await
            && now.changed_at != seen.changed_at
        {
            let outcome = if now.on {
                Outcome::SwitchOn
            } else {
                Outcome::SwitchOff
            };
            let event = Event {
                request_id: "killswitch".to_owned(),
                method: "killswitch/set".to_owned(),
                name: "killswitch".to_owned(),
                decision: Decision::Control,
                outcome,
                args_digest: toolgate_core::canonical::digest(&serde_json::json!({"on": now.on})),
                detail: Default::default(),
            }
            .with(
                "changed_by",
                now.changed_by.clone().map_or(Value::Null, Value::from),
            )
            .with(
                "changed_at",
                now.changed_at.map_or(Value::Null, Value::from),
            )
            .with("rule", "killswitch")
            .with("policy_sha256", gate.current().policy().sha256());
            if gate.record(event).await.is_ok() {
                switch = Some(now);
            }
        }
        record_resolutions(&gate).await;
        tokio::time::sleep(EVERY).await;
    }
}

/// Records every approval decided (or expired) since the last pass, once each: what the sweeper
/// does every period, and what an agent does before it acts on a decision, so the decision is in
/// the chain before the call it allowed.
pub async fn record_resolutions(gate: &Gate) {
    let Some(store) = gate.approvals() else {
        return;
    };
    match store.unaudited_resolutions(now_ms()).await {
        Ok(rows) => {
            for row in rows {
                let outcome = match row.status {
                    Status::Approved => Outcome::Approved,
                    Status::Denied => Outcome::Denied,
                    Status::Expired => Outcome::Expired,
                    Status::Pending => continue,
                };
                let event = Event {
                    request_id: row.id.clone(),
                    method: "approvals/resolve".to_owned(),
                    name: row.tool.clone(),
                    decision: Decision::Approval,
                    outcome,
                    args_digest: toolgate_core::canonical::digest(&row.args_redacted),
                    detail: Default::default(),
                }
                .with("approval_id", row.id.as_str())
                .with(
                    "approver",
                    row.decided_by.clone().map_or(Value::Null, Value::from),
                )
                .with(
                    "reason",
                    row.decision_reason.clone().map_or(Value::Null, Value::from),
                )
                .with("requester", row.requester.as_str())
                .with("policy_sha256", row.policy_sha256.as_str())
                .with("rule", "approval");
                if gate.record(event).await.is_ok()
                    && let Err(error) = store.mark_resolution_audited(&row.id).await
                {
                    tracing::error!(error = %error, approval = %row.id, "resolution audited but not marked; it may be recorded twice");
                }
            }
        }
        Err(error) => tracing::error!(error = %error, "cannot read approval resolutions"),
    }
}
