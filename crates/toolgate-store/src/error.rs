//! The error of the stores: the approval queue, the kill switch and budgets, and the
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
    /// The data directory did not exist and could not be created.
    #[error("cannot create the data directory {}", path.display())]
    CreateDir {
        /// The data directory.
        path: PathBuf,
        /// Why it could not be created.
        #[source]
        source: io::Error,
    },
    /// The database file could not be opened, switched to WAL, or migrated (still busy after the
    /// busy timeout, unreadable, not a database, …).
    #[error("cannot open the database {}", path.display())]
    Open {
        /// The database file, `toolgate.db` in the data directory.
        path: PathBuf,
        /// What SQLite or the driver said.
        #[source]
        source: sqlx::Error,
    },
    /// The file's schema (`PRAGMA user_version`) is one this build does not know: written by a
    /// newer toolgate, or negative. Nothing was changed; it is refused rather than misread.
    #[error(
        "the database {} has schema version {found}, newer than this toolgate understands \
         ({supported}); upgrade toolgate",
        path.display()
    )]
    SchemaTooNew {
        /// The database file.
        path: PathBuf,
        /// The file's `user_version`.
        found: i64,
        /// The newest `user_version` this build knows.
        supported: i64,
    },
    /// The PostgreSQL server could not be reached, refused the login, or could not be migrated.
    #[error("cannot use the database {database}")]
    Connect {
        /// The database's URL, without its password.
        database: String,
        /// What the server or the driver said.
        #[source]
        source: sqlx::Error,
    },
    /// The PostgreSQL database was migrated by a newer toolgate. Nothing was changed.
    #[error(
        "the database {database} has schema version {found}, newer than this toolgate \
         understands ({supported}); upgrade toolgate"
    )]
    DatabaseTooNew {
        /// The database's URL, without its password.
        database: String,
        /// The version recorded in it.
        found: i64,
        /// The newest version this build knows.
        supported: i64,
    },
    /// The in-memory backend keeps only what the corridor needs (approvals, the kill switch and
    /// budgets, idempotency keys); this store needs SQLite or PostgreSQL.
    #[error("the {what} need a database (SQLite or PostgreSQL), not memory")]
    NotInMemory {
        /// What was asked for, e.g. "agent runs".
        what: &'static str,
    },
    /// What was asked for exists only on a store replicas share (PostgreSQL).
    #[error("the {what} needs a shared store (--store postgres://…)")]
    NotShared {
        /// What was asked for, e.g. "central audit ledger".
        what: &'static str,
    },
    /// A file being written for the store (an export, an archive) could not be written.
    #[error("cannot write the output")]
    Write {
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A statement or transaction failed, or a row could not be decoded; whether it changed
    /// anything is said by the method that returned it.
    #[error("{context}")]
    Query {
        /// What was being done, for the message (e.g. "cannot claim the idempotency key").
        context: &'static str,
        /// What SQLite or the driver said.
        #[source]
        source: sqlx::Error,
    },
    /// An approval row holds a value this build cannot read (malformed JSON, an unknown status).
    #[error("approval {id} has a corrupt {column} column: {reason}")]
    Corrupt {
        /// The approval's id.
        id: String,
        /// The column that could not be read.
        column: &'static str,
        /// What was wrong with it.
        reason: String,
    },
    /// [`ApprovalStore::store_result`](crate::approval::ApprovalStore::store_result) found no
    /// claimed execution to attach the result to, or one that already holds a different result.
    #[error("approval {id} was not claimed for an execution, or already holds another result")]
    NoExecution {
        /// The approval's id.
        id: String,
    },
    /// [`TaskStore::finish`](crate::tasks::TaskStore::finish): the task is not there (any more).
    #[error("task {id} is gone")]
    NoTask {
        /// The task's id.
        id: String,
    },
    /// An agent run's row holds a value this build cannot read (malformed state, an unknown
    /// status).
    #[error("run {id} cannot be read: {reason}")]
    RunCorrupt {
        /// The run's id.
        id: String,
        /// What was wrong with it.
        reason: String,
    },
    /// A run with this id already exists.
    #[error("run {id} already exists")]
    RunExists {
        /// The run's id.
        id: String,
    },
    /// The kill switch's stamp file could not be created or replaced. When this follows a change
    /// of the switch, the change is committed but running servers may not see it until their
    /// stamp changes again.
    #[error("cannot write the kill switch stamp {}", path.display())]
    Stamp {
        /// The stamp file, `killswitch.stamp` in the data directory.
        path: PathBuf,
        /// Why it could not be written.
        #[source]
        source: io::Error,
    },
}

impl StoreError {
    pub(crate) fn query(context: &'static str) -> impl FnOnce(sqlx::Error) -> Self {
        move |source| Self::Query { context, source }
    }
}
