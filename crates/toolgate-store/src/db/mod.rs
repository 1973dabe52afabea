//! The database the approval queue, the kill switch, the budgets, the idempotency keys, the tasks,
//! the agents' runs and the console share, on one of three backends: SQLite in the data directory
//! (one server, the embedded default), PostgreSQL (replicas behind a load balancer sharing one
//! state), or memory (fast tests of the corridor, nothing durable).
//!
//! Owns the connection to each backend, its schema and migrations ([`sqlite`], [`postgres`]), and
//! the in-memory tables ([`memory`]). It holds no rule of its own: every rule is written once per
//! backend in the module of its concept ([`crate::approval`], [`crate::idempotency`], …), as the
//! condition of the one statement that changes the row (SQL) or under the one lock of the tables
//! (memory), so that no caller can race it.
//!
//! Design decision: a closed `enum` of backends, not a trait object per store. The two SQL
//! backends run the same statement text wherever the dialects agree (placeholders are `$N`, which
//! both drivers take; booleans are `TRUE` / `NOT x`; counts use `FILTER`), and [`on_db!`] type
//! checks one body against each driver, so a rule reads once for both; where they differ (how a
//! writer serialises, how a row is locked), [`WritePool`] names the difference. A trait per store
//! would write every statement twice and box every future on the hot path, for backends nobody
//! outside this crate can add without also proving the rules hold there.

pub(crate) mod memory;
pub(crate) mod postgres;
pub(crate) mod sqlite;

use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use sqlx::postgres::PgPool;
use sqlx::sqlite::SqlitePool;

use crate::error::StoreError;

pub use sqlite::DB_FILE;

/// A connection to the shared database; cheap to clone.
#[derive(Clone, Debug)]
pub(crate) enum Db {
    /// `toolgate.db` in the data directory.
    Sqlite(SqlitePool),
    /// A PostgreSQL database that several replicas share.
    Postgres(postgres::Postgres),
    /// Tables in this process's memory.
    Memory(Arc<Mutex<memory::Tables>>),
}

impl Db {
    /// Whether the database answers now: a read of the schema's version, which needs a
    /// connection and the database itself (a file deleted under a running server fails here,
    /// where `SELECT 1` would not).
    pub(crate) async fn answers(&self) -> Result<(), StoreError> {
        match self {
            Self::Sqlite(pool) => sqlite::answers(pool).await,
            Self::Postgres(pg) => pg.answers().await,
            Self::Memory(_) => Ok(()),
        }
    }

    /// The in-memory tables, locked (a poisoned lock still holds whole rows: every change to
    /// them is made by code that cannot panic halfway through a rule).
    pub(crate) fn tables(tables: &Mutex<memory::Tables>) -> MutexGuard<'_, memory::Tables> {
        tables.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The SQLite pool, for tests that read the file directly.
    #[cfg(test)]
    pub(crate) fn sqlite(&self) -> &SqlitePool {
        match self {
            Self::Sqlite(pool) => pool,
            other => panic!("a {} database, not SQLite", other.kind()),
        }
    }

    /// Which backend, for messages and metrics: `sqlite`, `postgres` or `memory`.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Self::Sqlite(_) => "sqlite",
            Self::Postgres(_) => "postgres",
            Self::Memory(_) => "memory",
        }
    }
}

/// Runs a body once per backend: `|pool|` is bound to the SQL pool (the body is type-checked
/// against the SQLite and the PostgreSQL driver in turn, so one statement text serves both), and
/// `|tables|` to the locked in-memory tables.
macro_rules! on_db {
    ($db:expr, |$pool:ident| $sql:expr, |$tables:ident| $memory:expr $(,)?) => {
        match $db {
            $crate::db::Db::Sqlite($pool) => $sql,
            $crate::db::Db::Postgres(pg) => {
                let $pool = pg.pool();
                $sql
            }
            $crate::db::Db::Memory(tables) => {
                #[allow(
                    unused_mut,
                    reason = "only the rules that change a row need it mutable"
                )]
                let mut $tables = $crate::db::Db::tables(tables);
                $memory
            }
        }
    };
}
pub(crate) use on_db;

/// What the two SQL backends do differently when a rule spans more than one statement.
pub(crate) trait WritePool {
    /// The driver.
    type Database: sqlx::Database;

    /// A transaction that holds the database's write lock from its first statement (SQLite:
    /// `BEGIN IMMEDIATE`, so a read in it sees what the writes after it will change); PostgreSQL
    /// takes row locks as it goes instead (see [`WritePool::ROW_LOCK`] and
    /// [`WritePool::serialise`]).
    async fn begin_write(&self) -> Result<sqlx::Transaction<'static, Self::Database>, sqlx::Error>;

    /// Appended to a `SELECT` of the row a transaction is about to change: PostgreSQL's
    /// `FOR UPDATE`, so that a second decider waits for the first; nothing in SQLite, whose
    /// transaction already holds the only write lock.
    const ROW_LOCK: &'static str;

    /// Makes every transaction that passes the same `key` run one after the other, for a rule
    /// over rows that may not exist yet (a count of budget charges): a transaction-scoped
    /// advisory lock in PostgreSQL; nothing in SQLite (the write lock already does it).
    async fn serialise(
        &self,
        tx: &mut sqlx::Transaction<'static, Self::Database>,
        key: &str,
    ) -> Result<(), sqlx::Error>;
}

impl WritePool for SqlitePool {
    type Database = sqlx::Sqlite;
    const ROW_LOCK: &'static str = "";

    async fn begin_write(&self) -> Result<sqlx::Transaction<'static, sqlx::Sqlite>, sqlx::Error> {
        self.begin_with("BEGIN IMMEDIATE").await
    }

    async fn serialise(
        &self,
        _tx: &mut sqlx::Transaction<'static, sqlx::Sqlite>,
        _key: &str,
    ) -> Result<(), sqlx::Error> {
        Ok(())
    }
}

impl WritePool for PgPool {
    type Database = sqlx::Postgres;
    const ROW_LOCK: &'static str = " FOR UPDATE";

    async fn begin_write(&self) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, sqlx::Error> {
        self.begin().await
    }

    async fn serialise(
        &self,
        tx: &mut sqlx::Transaction<'static, sqlx::Postgres>,
        key: &str,
    ) -> Result<(), sqlx::Error> {
        sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
            .bind(key)
            .execute(&mut **tx)
            .await
            .map(drop)
    }
}

/// `sql` with the row lock of `pool`'s backend appended (see [`WritePool::ROW_LOCK`]).
pub(crate) fn locking<P: WritePool>(_pool: &P, sql: &'static str) -> sqlx::AssertSqlSafe<String> {
    // Both parts are literals of this crate: nothing a caller sent is in the text.
    sqlx::AssertSqlSafe(format!("{sql}{}", P::ROW_LOCK))
}

/// Reads typed columns by name from a row of either SQL backend, with the store's error.
pub(crate) trait Columns {
    /// A text column.
    fn text(&self, column: &'static str) -> Result<String, StoreError>;
    /// A text column that may be NULL.
    fn text_or_null(&self, column: &'static str) -> Result<Option<String>, StoreError>;
    /// An integer column.
    fn int(&self, column: &'static str) -> Result<i64, StoreError>;
    /// An integer column that may be NULL.
    fn int_or_null(&self, column: &'static str) -> Result<Option<i64>, StoreError>;
    /// A boolean column (SQLite: an integer).
    fn flag(&self, column: &'static str) -> Result<bool, StoreError>;
}

macro_rules! columns_for {
    ($row:ty) => {
        impl Columns for $row {
            fn text(&self, column: &'static str) -> Result<String, StoreError> {
                sqlx::Row::try_get(self, column).map_err(StoreError::query("cannot read a row"))
            }
            fn text_or_null(&self, column: &'static str) -> Result<Option<String>, StoreError> {
                sqlx::Row::try_get(self, column).map_err(StoreError::query("cannot read a row"))
            }
            fn int(&self, column: &'static str) -> Result<i64, StoreError> {
                sqlx::Row::try_get(self, column).map_err(StoreError::query("cannot read a row"))
            }
            fn int_or_null(&self, column: &'static str) -> Result<Option<i64>, StoreError> {
                sqlx::Row::try_get(self, column).map_err(StoreError::query("cannot read a row"))
            }
            fn flag(&self, column: &'static str) -> Result<bool, StoreError> {
                sqlx::Row::try_get(self, column).map_err(StoreError::query("cannot read a row"))
            }
        }
    };
}
columns_for!(sqlx::sqlite::SqliteRow);
columns_for!(sqlx::postgres::PgRow);

/// Where the shared state lives: what `--store` names.
#[derive(Clone, PartialEq, Eq)]
pub enum Location {
    /// `toolgate.db` in this data directory (the default: no server to run).
    Dir(PathBuf),
    /// A PostgreSQL database, by its `postgres://` URL (which may carry a password: it is never
    /// printed, see the `Display` of this type).
    Postgres(String),
    /// This process's memory: nothing survives it, nothing else sees it. For tests.
    Memory,
}

impl Location {
    /// Reads what `--store` was given: a `postgres://` or `postgresql://` URL, `memory:`, or
    /// anything else as a data directory.
    #[must_use]
    pub fn parse(value: &str) -> Self {
        if value.starts_with("postgres://") || value.starts_with("postgresql://") {
            Self::Postgres(value.to_owned())
        } else if value == "memory:" {
            Self::Memory
        } else {
            Self::Dir(PathBuf::from(value))
        }
    }

    /// Opens the database here, creating or upgrading its schema.
    ///
    /// # Errors
    /// The directory, file or server cannot be used, or its schema is newer than this build's.
    pub(crate) async fn open(&self) -> Result<Db, StoreError> {
        match self {
            Self::Dir(dir) => Ok(Db::Sqlite(sqlite::open_pool(dir).await?)),
            Self::Postgres(url) => Ok(Db::Postgres(postgres::Postgres::connect(url).await?)),
            Self::Memory => Ok(Db::Memory(Arc::default())),
        }
    }
}

/// The location without a password: `postgres://user@host:port/db`, a directory, `memory:`.
impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Dir(dir) => write!(f, "{}", dir.display()),
            Self::Postgres(url) => f.write_str(&postgres::without_password(url)),
            Self::Memory => f.write_str("memory:"),
        }
    }
}

impl fmt::Debug for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Location({self})")
    }
}
