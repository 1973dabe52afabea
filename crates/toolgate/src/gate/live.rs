//! Policy reload: a new policy replaces the one in force while the server runs, for the calls that
//! start after it, never for a call already on its way.
//!
//! Owns the cell every clone of a gate shares and the swap. It does not read files or signals
//! (the command does, and checks the new policy against the tools first): it only takes a policy
//! that is already valid, and records the change in the audit log with both hashes.
//!
//! Design decision: a call works on its own clone of the gate, taken when it starts; the swap
//! replaces what the next clone is made from. So "calls in flight finish under the policy they
//! started with" is not a rule anyone must remember, it is how a clone works, and the swap is one
//! pointer store under a lock nobody holds for longer than that.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::{Arc, Mutex};

use toolgate_core::audit::{Decision, Event, Outcome};
use toolgate_core::policy::{Policy, enabling};

use super::{AuditUnavailable, Gate};

/// Reads a gate switch's variable (the environment, for the command).
pub(super) type Lookup = dyn Fn(&str) -> Option<String> + Send + Sync;

/// The policy in force and what is derived from it, shared by every clone of a gate.
pub(super) struct Live {
    current: Mutex<Arc<Snapshot>>,
    lookup: Arc<Lookup>,
}

/// One policy with its open gate switches.
#[derive(Debug)]
pub(super) struct Snapshot {
    pub(super) policy: Arc<Policy>,
    pub(super) open_gates: Arc<BTreeSet<String>>,
}

impl fmt::Debug for Live {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Live")
            .field("current", &crate::lock(&self.current).policy.sha256())
            .finish_non_exhaustive()
    }
}

impl Live {
    pub(super) fn new(policy: Arc<Policy>, lookup: Arc<Lookup>) -> Self {
        let open_gates = Arc::new(open_gates(&policy, &*lookup));
        Self {
            current: Mutex::new(Arc::new(Snapshot { policy, open_gates })),
            lookup,
        }
    }

    pub(super) fn load(&self) -> Arc<Snapshot> {
        Arc::clone(&crate::lock(&self.current))
    }
}

/// The variables of `policy`'s gated tools that `lookup` finds set to an enabling value.
pub(super) fn open_gates(
    policy: &Policy,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> BTreeSet<String> {
    policy
        .tools()
        .filter(|(_, rule)| rule.gated)
        .map(|(name, _)| policy.gate_env(name))
        .filter(|env| lookup(env).is_some_and(|value| enabling(&value)))
        .collect()
}

/// What a reload did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reloaded {
    /// The SHA-256 of the policy that was in force.
    pub old_sha256: String,
    /// The SHA-256 of the policy in force now.
    pub new_sha256: String,
}

/// Why a reload changed nothing.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// The gate was not made reloadable ([`Gate::reloadable`]).
    #[error("this gate's policy is fixed")]
    Fixed,
    /// The new policy is the one in force (same hash): nothing to do, nothing recorded.
    #[error("the policy is unchanged")]
    Unchanged,
    /// The change could not be recorded, so it was not made (every decision is audited, a change
    /// of who decides too).
    #[error(transparent)]
    Unrecorded(#[from] AuditUnavailable),
}

impl Gate {
    /// Lets this gate's policy be replaced while it serves ([`Gate::reload`]); `lookup` reads the
    /// gate switches of the policies to come, as [`Gate::with_switches`] read the first one's.
    #[must_use]
    pub fn reloadable(
        mut self,
        lookup: impl Fn(&str) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.live = Some(Arc::new(Live::new(
            Arc::clone(&self.policy),
            Arc::new(lookup),
        )));
        self
    }

    /// This gate with the policy in force now: itself when nothing was reloaded since it was made,
    /// else a clone on the new policy. What a call starts from, and keeps to its end.
    #[must_use]
    pub fn current(&self) -> std::borrow::Cow<'_, Gate> {
        let Some(live) = &self.live else {
            return std::borrow::Cow::Borrowed(self);
        };
        let snapshot = live.load();
        if Arc::ptr_eq(&snapshot.policy, &self.policy) {
            return std::borrow::Cow::Borrowed(self);
        }
        let mut gate = self.clone();
        gate.policy = Arc::clone(&snapshot.policy);
        gate.open_gates = Arc::clone(&snapshot.open_gates);
        std::borrow::Cow::Owned(gate)
    }

    /// Puts `policy` in force for every call that starts from now on (calls already running keep
    /// theirs), after recording the change with the old and the new policy's hash. The caller has
    /// checked it against the served tools.
    ///
    /// # Errors
    /// The gate is not reloadable, the policy is the one in force, or the change could not be
    /// recorded (then the old policy stays).
    pub async fn reload(&self, policy: Policy, by: &str) -> Result<Reloaded, ReloadError> {
        let live = self.live.as_ref().ok_or(ReloadError::Fixed)?;
        let old = live.load();
        if old.policy.sha256() == policy.sha256() {
            return Err(ReloadError::Unchanged);
        }
        let reloaded = Reloaded {
            old_sha256: old.policy.sha256().to_owned(),
            new_sha256: policy.sha256().to_owned(),
        };
        self.record(policy_event(
            Outcome::PolicyLoaded,
            &reloaded.old_sha256,
            &reloaded.new_sha256,
            by,
        ))
        .await?;
        let policy = Arc::new(policy);
        let open_gates = Arc::new(open_gates(&policy, &*live.lookup));
        *crate::lock(&live.current) = Arc::new(Snapshot { policy, open_gates });
        self.metrics.policy_reload(true);
        Ok(reloaded)
    }

    /// Records that a new policy (`new_sha256`, the file's hash) was read and refused; the one in
    /// force stays.
    ///
    /// # Errors
    /// The record could not be written.
    pub async fn record_refused_policy(
        &self,
        new_sha256: &str,
        by: &str,
        why: &str,
    ) -> Result<(), AuditUnavailable> {
        self.metrics.policy_reload(false);
        let old = self.current().policy().sha256().to_owned();
        let event = policy_event(Outcome::PolicyRefused, &old, new_sha256, by).with("reason", why);
        self.record(event).await.map(drop)
    }
}

fn policy_event(outcome: Outcome, old: &str, new: &str, by: &str) -> Event {
    Event {
        request_id: "policy".to_owned(),
        method: "policy/reload".to_owned(),
        name: "policy".to_owned(),
        decision: Decision::Control,
        outcome,
        args_digest: toolgate_core::canonical::digest(&serde_json::json!({"sha256": new})),
        detail: Default::default(),
    }
    .with("old_policy_sha256", old)
    .with("policy_sha256", new)
    .with("rule", "policy.reload")
    .with("changed_by", by)
}
