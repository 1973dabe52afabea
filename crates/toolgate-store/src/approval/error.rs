//! Errors of the approval queue's decisions; the database's own errors are [`StoreError`].

use super::Status;
use crate::error::StoreError;

/// Why a decision was refused; the messages are read by the person who ran
/// `toolgate approvals approve|deny`.
#[derive(Debug, thiserror::Error)]
///
/// Every variant but [`DecideError::Store`] means the row was left exactly as it was.
pub enum DecideError {
    /// No row has this id.
    #[error("no approval with id {id}")]
    NotFound {
        /// The id asked for.
        id: String,
    },
    /// Someone decided first (first decision wins).
    #[error("approval {id} was already {status}{}", by_whom(by.as_deref()))]
    AlreadyDecided {
        /// The approval's id.
        id: String,
        /// The decision that stands: [`Status::Approved`] or [`Status::Denied`].
        status: Status,
        /// Who made it.
        by: Option<String>,
    },
    /// The decision came at or after `expires_at`: the row is expired, which is a denial.
    #[error("approval {id} expired before it was decided; the call was denied")]
    Expired {
        /// The approval's id.
        id: String,
    },
    /// The decider is the principal that made the call.
    #[error("approval {id} cannot be decided by the principal that requested it")]
    SelfApproval {
        /// The approval's id.
        id: String,
    },
    /// The policy names who may decide this approval, and the decider is not among them.
    #[error("{decider} may not decide approval {id}: its approvers are {}", approvers.join(", "))]
    NotAnApprover {
        /// The approval's id.
        id: String,
        /// Who tried.
        decider: String,
        /// Who may (`user:NAME` / `group:NAME`).
        approvers: Vec<String>,
    },
    /// This decider already voted on this approval; one person counts once.
    #[error("{decider} already decided approval {id}; another approver must decide it")]
    AlreadyVoted {
        /// The approval's id.
        id: String,
        /// Who tried again.
        decider: String,
    },
    /// The database could not answer; the decision may or may not have been recorded.
    #[error(transparent)]
    Store(#[from] StoreError),
}

fn by_whom(by: Option<&str>) -> String {
    by.map(|by| format!(" by {by}")).unwrap_or_default()
}
