//! The gate as handlers and the corridor see it: the loaded policy, the journal its decisions land
//! in, the approval queue, the kill switch and budgets, the redactor, and the gate switches.
//!
//! Stores are optional so that a server with nothing that needs them (the seed's ledger) runs on the
//! journal alone; a call that needs a store that is not there does not run (fail closed).

use std::collections::BTreeSet;
use std::sync::Arc;

use serde_json::{Map, Value};
use toolgate_core::audit::{Decision, Event, Outcome};
use toolgate_core::canonical;
use toolgate_core::policy::{Denial, Policy};
use toolgate_core::principal::Principal;
use toolgate_core::redact::Redactor;
use toolgate_store::approval::ApprovalStore;
use toolgate_store::idempotency::IdempotencyStore;
use toolgate_store::journal::{Journal, JournalError, Receipt};
use toolgate_store::state::StateStore;

use super::limits::RateLimits;
use crate::toolset::CallError;

/// Policy, stores and switches; cloned into every call.
#[derive(Clone, Debug)]
pub struct Gate {
    policy: Arc<Policy>,
    journal: Journal,
    approvals: Option<ApprovalStore>,
    state: Option<StateStore>,
    redactor: Arc<Redactor>,
    open_gates: Arc<BTreeSet<String>>,
    principal: Principal,
    idempotency: Option<IdempotencyStore>,
    /// This process run's id, which owns the idempotency keys it claims: a key still in flight
    /// under another run's id was cut off by a crash.
    owner: Arc<str>,
    /// Token buckets per principal and tool, shared by every caller of this gate.
    limits: Arc<RateLimits>,
}

impl Gate {
    /// A gate with the journal only; the caller is the local user `local:<name>`.
    #[must_use]
    pub fn new(policy: Policy, journal: Journal) -> Self {
        Self {
            policy: Arc::new(policy),
            journal,
            approvals: None,
            state: None,
            redactor: Arc::new(Redactor::default()),
            open_gates: Arc::new(BTreeSet::new()),
            principal: Principal::new("local:unknown"),
            idempotency: None,
            owner: Arc::from(toolgate_store::idempotency::boot_id()),
            limits: Arc::default(),
        }
    }

    /// Where idempotency keys are claimed; without it, a tool the policy gives a key does not run.
    #[must_use]
    pub fn with_idempotency(mut self, store: IdempotencyStore) -> Self {
        self.idempotency = Some(store);
        self
    }

    #[must_use]
    pub fn idempotency(&self) -> Option<&IdempotencyStore> {
        self.idempotency.as_ref()
    }

    /// This process run's id for idempotency claims.
    #[must_use]
    pub fn owner(&self) -> &str {
        &self.owner
    }

    #[must_use]
    pub fn with_approvals(mut self, store: ApprovalStore) -> Self {
        self.approvals = Some(store);
        self
    }

    #[must_use]
    pub fn with_state(mut self, store: StateStore) -> Self {
        self.state = Some(store);
        self
    }

    #[must_use]
    pub fn with_redactor(mut self, redactor: Redactor) -> Self {
        self.redactor = Arc::new(redactor);
        self
    }

    /// Environment variables that are set to an enabling value (read by the CLI at start).
    #[must_use]
    pub fn with_open_gates(mut self, open: BTreeSet<String>) -> Self {
        self.open_gates = Arc::new(open);
        self
    }

    /// Who calls on this connection (stdio: the local user the server runs as); on HTTP each
    /// request gets a copy of the gate with its token's principal.
    #[must_use]
    pub fn with_principal(mut self, principal: Principal) -> Self {
        self.principal = principal;
        self
    }

    #[must_use]
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    #[must_use]
    pub fn journal(&self) -> &Journal {
        &self.journal
    }

    #[must_use]
    pub fn approvals(&self) -> Option<&ApprovalStore> {
        self.approvals.as_ref()
    }

    #[must_use]
    pub fn state(&self) -> Option<&StateStore> {
        self.state.as_ref()
    }

    #[must_use]
    pub fn redactor(&self) -> &Redactor {
        &self.redactor
    }

    #[must_use]
    pub fn principal(&self) -> &Principal {
        &self.principal
    }

    #[must_use]
    pub fn limits(&self) -> &RateLimits {
        &self.limits
    }

    /// Whether the caller may see and call `tool`: the policy shows it, and the caller's token
    /// carries the scope it needs (on HTTP).
    #[must_use]
    pub fn visible(&self, tool: &str) -> bool {
        self.policy.visible(tool) && self.principal.may(self.policy.scope(tool))
    }

    /// Whether `tool`'s gate switch is on.
    #[must_use]
    pub fn gate_open(&self, tool: &str) -> bool {
        // The variable's name is built from the policy on every call; with no switch on (the
        // usual case) there is nothing to look it up in.
        !self.open_gates.is_empty() && self.open_gates.contains(&self.policy.gate_env(tool))
    }

    /// Visibility and argument rules for a call, for handlers that repeat the gate's check
    /// (defence in depth, seed 000). Nothing is recorded here: the corridor records the refusal
    /// once, as it records every answer.
    ///
    /// # Errors
    /// [`CallError::Refused`] with the denial, to return from the handler.
    pub fn admit(
        &self,
        tool: &str,
        arguments: &Map<String, Value>,
        registered: bool,
    ) -> Result<(), CallError> {
        self.admission(tool, arguments, registered)
            .map_err(|(denial, visible)| CallError::Refused { denial, visible })
    }

    /// The decision of [`Gate::admit`]: the denial, and whether the tool is visible to the caller
    /// (then the answer may name the rule).
    ///
    /// # Errors
    /// The call is refused.
    pub fn admission(
        &self,
        tool: &str,
        arguments: &Map<String, Value>,
        registered: bool,
    ) -> Result<(), (Denial, bool)> {
        match self.policy.admit(tool, arguments) {
            // The HTTP layer answers a missing scope with 403 before this; here it is the
            // defence in depth, and reads like a tool that does not exist.
            Ok(()) if registered && !self.principal.may(self.policy.scope(tool)) => Err((
                Denial {
                    tool: tool.to_owned(),
                    rule: "scope".to_owned(),
                },
                false,
            )),
            Ok(()) if registered => Ok(()),
            Ok(()) => Err((
                Denial {
                    tool: tool.to_owned(),
                    rule: "unknown_tool".to_owned(),
                },
                false,
            )),
            Err(denial) => {
                let visible = registered && self.visible(tool);
                Err((denial, visible))
            }
        }
    }

    /// An audit event for a call to `tool`, naming the rule and the policy it was decided under.
    #[must_use]
    pub fn event(
        &self,
        tool: &str,
        arguments: &Map<String, Value>,
        decision: Decision,
        outcome: Outcome,
        rule: &str,
    ) -> Event {
        self.event_digested(
            tool,
            request_label(arguments),
            canonical::digest_object(arguments),
            decision,
            outcome,
            rule,
        )
    }

    /// [`Gate::event`] with the arguments' digest computed once by the caller.
    #[must_use]
    pub fn event_digested(
        &self,
        tool: &str,
        request_id: String,
        args_digest: String,
        decision: Decision,
        outcome: Outcome,
        rule: &str,
    ) -> Event {
        let event = Event::tool_call_digested(request_id, tool, decision, outcome, args_digest)
            .with("rule", rule)
            .with("policy_sha256", self.policy.sha256())
            .with("principal", self.principal.sub.as_str());
        match &self.principal.client_id {
            Some(client) => event.with("client_id", client.as_str()),
            None => event,
        }
    }

    /// Records `event` durably. The result must be looked at: a record that could not be written
    /// means the answer it was for must not be given as if it had been (fail closed).
    ///
    /// # Errors
    /// The journal could not make the record durable; the error says whether only a restart
    /// can bring it back.
    #[must_use = "an unrecorded decision must not be answered as if it were recorded"]
    pub async fn record(&self, event: Event) -> Result<Receipt, AuditUnavailable> {
        self.journal.record(event).await.map_err(|error| {
            // The failure itself was logged once, at error, by the journal's writer; every
            // refusal after it would only repeat that line.
            if matches!(error, JournalError::Poisoned) {
                tracing::debug!(error = %error, "audit record refused: the journal has failed");
            } else {
                tracing::error!(error = %error, "audit record could not be written");
            }
            AuditUnavailable::from(&error)
        })
    }

    /// Whether the audit journal can still take records: after a failed write or sync it refuses
    /// everything until the process restarts, so calls are refused before they run.
    #[must_use]
    pub fn audit_failed(&self) -> bool {
        self.journal.failed()
    }
}

/// The audit log did not take a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AuditUnavailable {
    /// A write or sync failed; nothing is recorded until the server restarts.
    #[error(
        "the audit log is unavailable: a write or sync failed; the server refuses every call until it is restarted"
    )]
    NeedsRestart,
    /// The journal could not be reached (shutting down).
    #[error("the audit log is unavailable")]
    Closed,
}

impl From<&JournalError> for AuditUnavailable {
    fn from(error: &JournalError) -> Self {
        match error {
            JournalError::Closed => Self::Closed,
            _ => Self::NeedsRestart,
        }
    }
}

/// The `request_id` an audit record carries: the call's own `request_id` argument when it has one
/// (seed 000), else `missing`.
#[must_use]
pub fn request_label(arguments: &Map<String, Value>) -> String {
    match arguments.get("request_id") {
        Some(Value::String(id)) => id.clone(),
        Some(other) => other.to_string(),
        None => "missing".to_owned(),
    }
}
