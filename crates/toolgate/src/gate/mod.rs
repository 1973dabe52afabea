//! The gate as handlers and the corridor see it: the loaded policy, the journal its decisions land
//! in, the approval queue, the kill switch and budgets, the redactor, and the gate switches.
//!
//! Stores are optional so that a server with nothing that needs them (the seed's ledger) runs on the
//! journal alone; a call that needs a store that is not there does not run (fail closed).
//!
//! It sits below both the corridor and the toolset contract and knows neither: a handler's `Call`
//! carries the gate, the corridor walks calls through it, and neither import runs back here.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use serde_json::{Map, Value};
use toolgate_core::answer::Check;
use toolgate_core::audit::{Decision, Event, Outcome};
use toolgate_core::canonical;
use toolgate_core::policy::{Denial, Policy};
use toolgate_core::principal::Principal;
use toolgate_core::redact::Redactor;
use toolgate_store::Location;
use toolgate_store::approval::ApprovalStore;
use toolgate_store::idempotency::IdempotencyStore;
use toolgate_store::journal::{Durability, Journal, JournalError, Receipt};
use toolgate_store::ledger::Ledger;
use toolgate_store::state::StateStore;

mod limits;
mod live;
mod metrics;
mod ready;

pub use limits::RateLimits;
pub use live::{ReloadError, Reloaded};
pub(crate) use metrics::{Laps, UNKNOWN_TOOL};
pub use metrics::{Metrics, upstream_series};
pub use ready::{Probe, Readiness};

pub use toolgate_core::policy::{ENABLING, enabling};

/// Why a gate could not be opened on a data directory.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The journal (audit log and write-ahead log) could not be opened or repaired.
    #[error("cannot open the journal in {dir}: {source}")]
    Journal {
        /// The data directory, as given.
        dir: PathBuf,
        /// Why the journal did not open.
        #[source]
        source: JournalError,
    },
    /// The database of approvals, kill switch, budgets and idempotency keys could not be opened.
    #[error("cannot open the state database in {location}: {source}")]
    Store {
        /// The data directory, or the database's URL without its password.
        location: String,
        /// Why the database did not open.
        #[source]
        source: toolgate_store::approval::StoreError,
    },
}

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
    /// Postcondition decisions per tool since start, shared by every caller of this gate.
    verifies: Arc<Mutex<BTreeMap<(String, Check), u64>>>,
    /// Calls and audit appends counted since start, shared by every caller of this gate.
    metrics: Arc<Metrics>,
    /// Announces new approval requests; shared by every caller of this gate.
    #[cfg(feature = "notify")]
    notifier: Option<crate::notify::Notifier>,
    /// The approvals console's base URL, where a held call's request can be seen and decided.
    console: Option<Arc<str>>,
    /// The central audit ledger replicas share; when set, decisions are recorded there instead
    /// of in the journal's local file.
    ledger: Option<Ledger>,
    /// The policy in force when it can be reloaded (`live.rs`); `policy` is then the one this
    /// clone was made with.
    live: Option<Arc<live::Live>>,
}

impl Gate {
    /// A gate with the journal only; the caller is `local:unknown` until [`Gate::with_principal`].
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
            verifies: Arc::default(),
            metrics: Arc::default(),
            #[cfg(feature = "notify")]
            notifier: None,
            console: None,
            ledger: None,
            live: None,
        }
    }

    /// A gate on the data directory `dir` (created if missing): the journal, repaired after a
    /// crash (what was repaired is logged), and beside it the approval queue, the state store
    /// (kill switch, budgets) and the idempotency keys. What `toolgate serve`, `toolgate proxy`
    /// and a kit server open.
    ///
    /// # Errors
    /// The directory, the journal or the database cannot be opened; nothing is served then.
    pub async fn open(
        policy: Policy,
        dir: &Path,
        durability: Durability,
    ) -> Result<Self, OpenError> {
        Self::open_at(policy, dir, &Location::Dir(dir.to_owned()), durability).await
    }

    /// [`Gate::open`] with the approval queue, the state store and the idempotency keys where
    /// `store` says: the data directory's `toolgate.db`, or a PostgreSQL database that every
    /// replica of a server shares. The journal stays in `dir`.
    ///
    /// # Errors
    /// The directory, the journal or the database cannot be opened; nothing is served then.
    pub async fn open_at(
        policy: Policy,
        dir: &Path,
        store: &Location,
        durability: Durability,
    ) -> Result<Self, OpenError> {
        let (journal, recovery) =
            Journal::open_with(dir, durability).map_err(|source| OpenError::Journal {
                dir: dir.to_owned(),
                source,
            })?;
        if let Some((aside, bytes)) = &recovery.torn_audit {
            tracing::warn!(moved_to = %aside.display(), bytes, "torn audit tail moved aside; recovery record appended");
        }
        if recovery.torn_wal_bytes > 0 || recovery.replayed > 0 {
            tracing::warn!(
                torn_wal_bytes = recovery.torn_wal_bytes,
                replayed = recovery.replayed,
                "journal repaired after a crash"
            );
        }
        let failed = |source| OpenError::Store {
            location: store.to_string(),
            source,
        };
        let approvals = ApprovalStore::at(store).await.map_err(failed)?;
        let state = StateStore::beside(&approvals, dir).map_err(failed)?;
        let idempotency = IdempotencyStore::beside(&approvals);
        Ok(Self::new(policy, journal)
            .with_approvals(approvals)
            .with_state(state)
            .with_idempotency(idempotency))
    }

    /// Opens the gate switches of the policy's gated tools whose variable `lookup` finds set to
    /// an enabling value ([`enabling`]); the others stay off.
    #[must_use]
    pub fn with_switches(self, lookup: impl Fn(&str) -> Option<String>) -> Self {
        let open = live::open_gates(&self.policy, &lookup);
        self.with_open_gates(open)
    }

    /// Where idempotency keys are claimed; without it, a tool the policy gives a key does not run.
    #[must_use]
    pub fn with_idempotency(mut self, store: IdempotencyStore) -> Self {
        self.idempotency = Some(store);
        self
    }

    /// Where idempotency keys are claimed, if this gate has such a store.
    #[must_use]
    pub fn idempotency(&self) -> Option<&IdempotencyStore> {
        self.idempotency.as_ref()
    }

    /// This process run's id for idempotency claims.
    #[must_use]
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// Records every decision in the central ledger of a shared store (one chain for every
    /// replica) instead of the journal's `audit.jsonl`. The journal stays for the effects a
    /// toolset commits with its own record (the seed's ledger toolset), which one process owns.
    #[must_use]
    pub fn with_ledger(mut self, ledger: Ledger) -> Self {
        self.ledger = Some(ledger);
        self
    }

    /// The central audit ledger, if decisions are recorded there.
    #[must_use]
    pub fn ledger(&self) -> Option<&Ledger> {
        self.ledger.as_ref()
    }

    /// Where calls that need a person's approval wait; without it, such a call does not run.
    #[must_use]
    pub fn with_approvals(mut self, store: ApprovalStore) -> Self {
        self.approvals = Some(store);
        self
    }

    /// Who hears about each new approval request (a signed webhook, a Slack message); without it,
    /// a request waits to be found with `toolgate approvals list` or in the console.
    #[cfg(feature = "notify")]
    #[must_use]
    pub fn with_notifier(mut self, notifier: crate::notify::Notifier) -> Self {
        self.notifier = Some(notifier);
        self
    }

    /// The approvals console's base URL (`https://gate.example.com/console`): a caller held for a
    /// person that can open a link is sent its request's page there (URL-mode elicitation).
    #[must_use]
    pub fn with_console(mut self, base: &str) -> Self {
        self.console = Some(Arc::from(base.trim_end_matches('/')));
        self
    }

    /// The console page of approval `id`, when this gate knows the console.
    #[must_use]
    pub fn console_link(&self, id: &str) -> Option<String> {
        self.console
            .as_deref()
            .map(|base| format!("{base}/approvals/{id}"))
    }

    /// What announces new approval requests, if this gate has it.
    #[cfg(feature = "notify")]
    #[must_use]
    pub fn notifier(&self) -> Option<&crate::notify::Notifier> {
        self.notifier.as_ref()
    }

    /// Where the kill switch and the per-principal budgets are kept; without it, neither is
    /// checked.
    #[must_use]
    pub fn with_state(mut self, store: StateStore) -> Self {
        self.state = Some(store);
        self
    }

    /// What scrubs secrets from results, error messages, previews and echoed arguments before
    /// they leave the gate; the default knows the built-in credential shapes, no secret values.
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

    /// The policy every call through this gate is decided by.
    #[must_use]
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The journal decisions and outcomes are recorded in.
    #[must_use]
    pub fn journal(&self) -> &Journal {
        &self.journal
    }

    /// The approval queue, if this gate has one.
    #[must_use]
    pub fn approvals(&self) -> Option<&ApprovalStore> {
        self.approvals.as_ref()
    }

    /// The kill switch and budget store, if this gate has one.
    #[must_use]
    pub fn state(&self) -> Option<&StateStore> {
        self.state.as_ref()
    }

    /// The redactor applied to results, error messages, previews and echoed arguments.
    #[must_use]
    pub fn redactor(&self) -> &Redactor {
        &self.redactor
    }

    /// Who calls through this gate; `local:unknown` until [`with_principal`](Self::with_principal).
    #[must_use]
    pub fn principal(&self) -> &Principal {
        &self.principal
    }

    /// The rate-limit buckets, shared by every clone of this gate.
    #[must_use]
    pub fn limits(&self) -> &RateLimits {
        &self.limits
    }

    /// How many times each tool's postcondition ended in each decision (continue, stop, rollback)
    /// since this gate was made, across all its callers: the counter by tool and decision that
    /// `/metrics` is to expose (seed 000: "emit metrics for each decision"). A tool that was never
    /// verified has no entry.
    #[must_use]
    pub fn verify_counts(&self) -> BTreeMap<(String, Check), u64> {
        self.verifies
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Counts one postcondition decision for `tool`.
    pub(crate) fn count_verify(&self, tool: &str, decision: Check) {
        let mut counts = self.verifies.lock().unwrap_or_else(PoisonError::into_inner);
        *counts.entry((tool.to_owned(), decision)).or_default() += 1;
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

    /// Visibility and argument rules for a call: the denial, and whether the tool is visible to
    /// the caller (then the answer may name the rule). Nothing is recorded here. A handler repeats
    /// the check with `toolset::Call::admit`.
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
        let start = std::time::Instant::now();
        if let Some(ledger) = &self.ledger {
            let appended = ledger.append(event).await;
            self.metrics.audit_append(start.elapsed());
            return appended
                .map(|appended| Receipt {
                    sha256: appended.sha256,
                })
                .map_err(|error| {
                    tracing::error!(error = %error, "audit record could not be appended to the central ledger");
                    AuditUnavailable::LedgerRefused
                });
        }
        let recorded = self.journal.record(event).await;
        self.metrics.audit_append(start.elapsed());
        recorded.map_err(|error| {
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

    /// The counters this gate (and every clone of it) keeps.
    pub(crate) fn metrics(&self) -> &Metrics {
        &self.metrics
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
    /// The central ledger did not commit the record (its database did not answer); a later
    /// record may get through.
    #[error("the central audit ledger did not take the record")]
    LedgerRefused,
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
