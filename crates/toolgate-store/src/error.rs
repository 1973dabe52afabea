//! The error of the SQLite stores: the approval queue, the kill switch and budgets, and the
//! idempotency keys, and of [`crate::db`], which opens the database they share.
//!
//! In a file of its own, at the crate's root, because every one of those modules returns it: kept
//! in `approval`, it made `db` import `approval`, which imports `db`.

use std::io;
use std::path::PathBuf;

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
