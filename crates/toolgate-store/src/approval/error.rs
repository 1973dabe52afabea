//! Errors of the approval queue and of the state sharing its database.

use std::io;
use std::path::PathBuf;

use super::Status;

/// The database could not answer. A gated call that gets one of these does not run: an unknown
/// approval is no approval, and an unreadable kill switch counts as on.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot create the data directory {}", path.display())]
    CreateDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot open the database {}", path.display())]
    Open {
        path: PathBuf,
        #[source]
        source: sqlx::Error,
    },
    #[error(
        "the database {} has schema version {found}, newer than this toolgate understands \
         ({supported}); upgrade toolgate",
        path.display()
    )]
    SchemaTooNew {
        path: PathBuf,
        found: i64,
        supported: i64,
    },
    #[error("{context}")]
    Query {
        context: &'static str,
        #[source]
        source: sqlx::Error,
    },
    #[error("approval {id} has a corrupt {column} column: {reason}")]
    Corrupt {
        id: String,
        column: &'static str,
        reason: String,
    },
    #[error("approval {id} was not claimed for an execution, or already holds another result")]
    NoExecution { id: String },
    #[error("cannot write the kill switch stamp {}", path.display())]
    Stamp {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

impl StoreError {
    pub(crate) fn query(context: &'static str) -> impl FnOnce(sqlx::Error) -> Self {
        move |source| Self::Query { context, source }
    }
}

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
