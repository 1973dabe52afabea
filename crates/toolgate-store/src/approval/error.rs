//! Errors of the approval queue's decisions; the database's own errors are [`StoreError`].

use super::Status;
use crate::error::StoreError;

/// Why a decision was refused; the messages are read by the person who ran
/// `toolgate approvals approve|deny`.
#[derive(Debug, thiserror::Error)]
pub enum DecideError {
    #[error("no approval with id {id}")]
    NotFound { id: String },
    #[error("approval {id} was already {status}{}", by_whom(by.as_deref()))]
    AlreadyDecided {
        id: String,
        status: Status,
        by: Option<String>,
    },
    #[error("approval {id} expired before it was decided; the call was denied")]
    Expired { id: String },
    #[error("approval {id} cannot be decided by the principal that requested it")]
    SelfApproval { id: String },
    #[error(transparent)]
    Store(#[from] StoreError),
}

fn by_whom(by: Option<&str>) -> String {
    by.map(|by| format!(" by {by}")).unwrap_or_default()
}
