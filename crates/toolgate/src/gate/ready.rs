//! Readiness: whether this gate can decide a call now. The policy is loaded, the audit journal
//! still takes records, and every store the corridor reads answers. What `/readyz` reports.
//!
//! Why a probe of its own: a gate that is not ready already refuses every call (fail closed), but a
//! load balancer should learn that from a cheap request before it sends a caller there. The probe
//! reads, never writes: it must not add load to a store that is struggling, nor leave traces.

use std::time::Duration;

use toolgate_store::approval::StoreError;

use super::Gate;

/// The result of each check, in a fixed order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Readiness {
    /// Every check made, passed or not.
    pub checks: Vec<Probe>,
}

/// One check of [`Gate::readiness`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Probe {
    /// What was checked: `policy`, `audit`, `approvals`, `state`, `idempotency`, and `ledger`
    /// when the audit log is the central one.
    pub name: &'static str,
    /// Whether it passed.
    pub ok: bool,
    /// For a person: the policy's hash, or why the check failed (never a secret or a path).
    pub detail: String,
}

impl Readiness {
    /// Whether every check passed.
    #[must_use]
    pub fn ready(&self) -> bool {
        self.checks.iter().all(|probe| probe.ok)
    }
}

impl Gate {
    /// Checks the policy, the journal and each store this gate has, giving each store `within` to
    /// answer (a store wedged behind a lock is as good as down to a caller).
    pub async fn readiness(&self, within: Duration) -> Readiness {
        let mut checks = vec![
            Probe {
                name: "policy",
                ok: true,
                detail: format!("sha256 {}", self.current().policy().sha256()),
            },
            Probe {
                name: "audit",
                ok: !self.audit_failed(),
                detail: if self.audit_failed() {
                    super::AuditUnavailable::NeedsRestart.to_string()
                } else {
                    "takes records".to_owned()
                },
            },
        ];
        if let Some(ledger) = &self.ledger {
            checks.push(probe("ledger", within, ledger.answers()).await);
        }
        if let Some(store) = &self.approvals {
            checks.push(probe("approvals", within, store.answers()).await);
        }
        if let Some(store) = &self.state {
            checks.push(probe("state", within, store.answers()).await);
        }
        if let Some(store) = &self.idempotency {
            checks.push(probe("idempotency", within, store.answers()).await);
        }
        Readiness { checks }
    }
}

async fn probe(
    name: &'static str,
    within: Duration,
    answers: impl Future<Output = Result<(), StoreError>>,
) -> Probe {
    let (ok, detail) = match tokio::time::timeout(within, answers).await {
        Ok(Ok(())) => (true, "answers".to_owned()),
        Ok(Err(error)) => {
            tracing::warn!(store = name, error = %error, "readiness: a store does not answer");
            (false, error.to_string())
        }
        Err(_) => (false, format!("no answer within {} ms", within.as_millis())),
    };
    Probe { name, ok, detail }
}
