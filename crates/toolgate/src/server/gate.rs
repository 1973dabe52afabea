//! The gate as handlers and the corridor see it: the loaded policy, the journal its decisions land
//! in, the approval queue, the kill switch and budgets, the redactor, and the gate switches.
//!
//! Stores are optional so that a server with nothing that needs them (the seed's ledger) runs on the
//! journal alone; a call that needs a store that is not there does not run (fail closed).

use std::collections::BTreeSet;
use std::sync::Arc;

use rmcp::ErrorData;
use serde_json::{Map, Value};
use toolgate_core::audit::{Decision, Event, Outcome};
use toolgate_core::policy::{Denial, Policy};
use toolgate_core::principal::Principal;
use toolgate_core::redact::Redactor;
use toolgate_store::approval::ApprovalStore;
use toolgate_store::idempotency::IdempotencyStore;
use toolgate_store::journal::Journal;
use toolgate_store::state::StateStore;

use super::limits::RateLimits;
use crate::outcome;

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
        self.open_gates.contains(&self.policy.gate_env(tool))
    }

    /// Visibility and argument rules for a call. A refusal is audited `deny / not_executed` and
    /// answered -32602; it stays a refusal even when the audit cannot be written (fail closed).
    ///
    /// # Errors
    /// The -32602 error to send instead of running anything.
    pub async fn admit(
        &self,
        tool: &str,
        arguments: &Map<String, Value>,
        registered: bool,
    ) -> Result<(), ErrorData> {
        match self.admission(tool, arguments, registered) {
            Ok(()) => Ok(()),
            Err((denial, visible)) => Err(self.refuse(tool, arguments, denial, visible).await),
        }
    }

    /// The decision of [`Gate::admit`] without its audit record: the denial, and whether the tool
    /// is visible to the caller (then the answer may name the rule).
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

    /// Audits a refusal before dispatch and builds the -32602 answer.
    pub async fn refuse(
        &self,
        tool: &str,
        arguments: &Map<String, Value>,
        denial: Denial,
        visible: bool,
    ) -> ErrorData {
        let event = self.event(
            tool,
            arguments,
            Decision::Deny,
            Outcome::NotExecuted,
            &denial.rule,
        );
        self.refuse_recorded(event, &denial, visible).await
    }

    /// Records `event` (a `deny / not_executed`) and builds the -32602 answer for `denial`.
    pub async fn refuse_recorded(&self, event: Event, denial: &Denial, visible: bool) -> ErrorData {
        if let Err(error) = self.journal.record(event).await {
            tracing::error!(tool = %denial.tool, error = %error, "denial could not be audited; refusing anyway");
        }
        tracing::info!(tool = %denial.tool, rule = %denial.rule, "call denied before dispatch");
        outcome::denied(denial, visible, self.policy.sha256())
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
        let event = Event::tool_call(
            request_label(arguments),
            tool,
            decision,
            outcome,
            &Value::Object(arguments.clone()),
        )
        .with("rule", rule)
        .with("policy_sha256", self.policy.sha256())
        .with("principal", self.principal.sub.as_str());
        match &self.principal.client_id {
            Some(client) => event.with("client_id", client.as_str()),
            None => event,
        }
    }

    /// Records `event`; on failure logs it and returns false (the caller decides what fails closed).
    pub async fn record(&self, event: Event) -> bool {
        match self.journal.record(event).await {
            Ok(_) => true,
            Err(error) => {
                tracing::error!(error = %error, "audit record could not be written");
                false
            }
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
