//! The SQLite backend: `toolgate.db` in the data directory, the embedded default for one server.
//!
//! Owns the file (`toolgate.db` in the data directory), its connection settings and its schema.
//! It must not hold any rule of its own: the rules live in the statements of [`crate::approval`],
//! [`crate::state`] and [`crate::idempotency`], which is why every table here is shaped so that one
//! conditional statement can enforce one rule (DESIGN.md §6).
//!
//! Several processes open this file at once (the server, and `toolgate approvals approve` in a
//! person's terminal), so nothing here may assume it is alone: WAL lets readers run beside the one
//! writer, `synchronous=FULL` makes every acknowledged decision survive a power cut, and the schema
//! is created under `BEGIN IMMEDIATE` with a `user_version` check so that two first opens cannot
//! both create it, and an older binary refuses a newer file instead of misreading it.
//!
//! The schema grows by numbered migrations ([`MIGRATIONS`]), each run once, in order, in the same
//! transaction as the version check: a fresh file gets all of them in one commit, an older file
//! is upgraded in place, and of several processes opening an old file together exactly one
//! upgrades it. Migrations only add (tables, indexes), so a process of the previous version that
//! opened the file before the upgrade keeps working beside it until it restarts.

use std::path::Path;
use std::time::{Duration, Instant};

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqliteSynchronous};

use crate::error::StoreError;

/// File name of the database inside the data directory.
pub const DB_FILE: &str = "toolgate.db";

/// How long a statement waits for another process's write lock before failing. Generous: with
/// `synchronous=FULL` every commit is a flush, and dozens of deciders or a loaded disk can queue
/// behind each other for seconds; failing a person's decision for that would be worse than waiting.
const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

/// Migration `i` takes a file from `user_version` `i` to `i + 1`, and ends by writing that version.
const MIGRATIONS: [&str; 6] = [
    SCHEMA_V1, SCHEMA_V2, SCHEMA_V3, SCHEMA_V4, SCHEMA_V5, SCHEMA_V6,
];

/// The `user_version` of a file whose schema is complete: the number of migrations.
pub(crate) const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// `seq` is the insertion order: "newest" means last inserted, not the largest `created_at`,
/// because `created_at` comes from the clocks of several processes.
///
/// The partial unique index is the "one pending row per call" rule: a retry of a pending call
/// cannot open a second row, whatever the callers do. JSON columns hold serde_json text.
pub(crate) const SCHEMA_V1: &str = "
CREATE TABLE approvals (
    seq             INTEGER PRIMARY KEY,
    id              TEXT    NOT NULL UNIQUE,
    fingerprint     TEXT    NOT NULL,
    requester       TEXT    NOT NULL,
    tool            TEXT    NOT NULL,
    args_redacted   TEXT    NOT NULL,
    tier            TEXT    NOT NULL,
    reason          TEXT    NOT NULL,
    dry_run         TEXT    NOT NULL,
    policy_sha256   TEXT    NOT NULL,
    status          TEXT    NOT NULL
                    CHECK (status IN ('pending', 'approved', 'denied', 'expired')),
    created_at      INTEGER NOT NULL,
    expires_at      INTEGER NOT NULL,
    decided_by      TEXT,
    decided_at      INTEGER,
    decision_reason TEXT,
    used_at         INTEGER CHECK (used_at IS NULL OR status = 'approved'),
    result          TEXT    CHECK (result IS NULL OR used_at IS NOT NULL),
    -- Set once the serving process has written this row's resolution to its audit log.
    resolution_audited INTEGER NOT NULL DEFAULT 0
);
CREATE UNIQUE INDEX approvals_one_pending ON approvals (fingerprint) WHERE status = 'pending';
CREATE INDEX approvals_by_fingerprint ON approvals (fingerprint, seq);
CREATE INDEX approvals_pending_expiry ON approvals (expires_at) WHERE status = 'pending';
CREATE INDEX approvals_unaudited ON approvals (seq) WHERE status <> 'pending' AND resolution_audited = 0;

CREATE TABLE killswitch (
    id         INTEGER PRIMARY KEY CHECK (id = 1),
    engaged    INTEGER NOT NULL CHECK (engaged IN (0, 1)),
    changed_by TEXT,
    changed_at INTEGER
);
INSERT INTO killswitch (id, engaged) VALUES (1, 0);

CREATE TABLE budget_charges (
    principal TEXT    NOT NULL,
    at        INTEGER NOT NULL
);
CREATE INDEX budget_by_principal ON budget_charges (principal, at);

PRAGMA user_version = 1;
";

/// The idempotency keys of mutations forwarded upstream (see [`crate::idempotency`]).
///
/// The primary key is the "one claim per key" rule; `result` is present exactly when the call is
/// done, so a replay never reads a missing result. `WITHOUT ROWID`: every lookup is by the full
/// primary key, which is then the table itself instead of an index beside it.
const SCHEMA_V2: &str = "
CREATE TABLE idempotency (
    principal   TEXT    NOT NULL,
    tool        TEXT    NOT NULL,
    key         TEXT    NOT NULL,
    args_digest TEXT    NOT NULL,
    state       TEXT    NOT NULL CHECK (state IN ('in_flight', 'done', 'in_doubt')),
    -- Boot id of the process run that claimed the key (or took it over).
    owner       TEXT    NOT NULL,
    result      TEXT    CHECK ((result IS NOT NULL) = (state = 'done')),
    created_at  INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL,
    PRIMARY KEY (principal, tool, key)
) WITHOUT ROWID;
CREATE INDEX idempotency_unresolved ON idempotency (created_at) WHERE state <> 'done';

PRAGMA user_version = 2;
";

/// The kill switch for one principal (an agent), and the agents' runs (see [`crate::state`] and
/// [`crate::runs`]).
///
/// A principal is switched off by its row being there: turning it back on deletes the row, so
/// the check is one lookup by primary key. A run's `state` is the JSON the agent loop resumes
/// from; a finished or aborted run is final (the store refuses to change it).
const SCHEMA_V3: &str = "
CREATE TABLE killswitch_principals (
    principal  TEXT    PRIMARY KEY,
    changed_by TEXT    NOT NULL,
    changed_at INTEGER NOT NULL
) WITHOUT ROWID;

CREATE TABLE agent_runs (
    seq         INTEGER PRIMARY KEY,
    id          TEXT    NOT NULL UNIQUE,
    agent       TEXT    NOT NULL,
    status      TEXT    NOT NULL
                CHECK (status IN ('running', 'paused', 'finished', 'aborted', 'failed')),
    -- The approval a paused run waits for.
    approval_id TEXT    CHECK (approval_id IS NULL OR status = 'paused'),
    input       TEXT    NOT NULL,
    state       TEXT    NOT NULL,
    steps       INTEGER NOT NULL,
    -- The final answer, or why the run was aborted or failed.
    outcome     TEXT,
    created_at  INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL
);
CREATE INDEX agent_runs_by_status ON agent_runs (status, seq);

PRAGMA user_version = 3;
";

/// Who may decide an approval, and how many must agree (issue 14): the row keeps what the policy
/// said when it was requested, and every decision is a vote. The primary key is "one vote per
/// decider": the same approver twice counts once. An approval with `approvals_required = 1` and no
/// list behaves exactly as before.
const SCHEMA_V4: &str = "
ALTER TABLE approvals ADD COLUMN approvers TEXT;
ALTER TABLE approvals ADD COLUMN approvals_required INTEGER NOT NULL DEFAULT 1
    CHECK (approvals_required >= 1);

CREATE TABLE approval_votes (
    approval_id TEXT    NOT NULL,
    decider     TEXT    NOT NULL,
    verdict     TEXT    NOT NULL CHECK (verdict IN ('approve', 'deny')),
    reason      TEXT,
    at          INTEGER NOT NULL,
    PRIMARY KEY (approval_id, decider)
) WITHOUT ROWID;

PRAGMA user_version = 4;
";

/// Issue 14: the approvals console's logins ([`crate::console`]: one-time login links, OpenID
/// Connect sign-ins under way, the sessions they open) and the calls held for a person that
/// became tasks ([`crate::tasks`]). Only SHA-256 digests of the secrets are kept, so a copy of the file
/// logs nobody in. `used_at` set once, by one conditional update, is "a link works once", for
/// every process and replica that reads this file.
const SCHEMA_V5: &str = "
CREATE TABLE console_logins (
    token_sha256 TEXT    PRIMARY KEY,
    identity     TEXT    NOT NULL,
    created_at   INTEGER NOT NULL,
    expires_at   INTEGER NOT NULL,
    used_at      INTEGER
) WITHOUT ROWID;

CREATE TABLE console_sessions (
    id_sha256  TEXT    PRIMARY KEY,
    identity   TEXT    NOT NULL,
    -- JSON array of the groups the login vouched for (none for a login link).
    groups     TEXT    NOT NULL,
    via        TEXT    NOT NULL CHECK (via IN ('link', 'oidc')),
    created_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    ended_at   INTEGER
) WITHOUT ROWID;

-- OpenID Connect sign-ins under way: the state's digest, and the nonce and PKCE verifier the
-- callback needs. A row is deleted by the one callback that uses it, so a replayed state finds
-- nothing.
CREATE TABLE console_oidc_logins (
    state_sha256  TEXT    PRIMARY KEY,
    nonce         TEXT    NOT NULL,
    code_verifier TEXT    NOT NULL,
    next          TEXT    NOT NULL,
    expires_at    INTEGER NOT NULL
) WITHOUT ROWID;

-- Calls held for a person that became tasks (the MCP tasks extension; see crate::tasks). The
-- arguments are what runs once the approval is granted, kept only while the task works: its end
-- writes the outcome and clears them.
CREATE TABLE approval_tasks (
    id          TEXT    PRIMARY KEY,
    principal   TEXT    NOT NULL,
    tool        TEXT    NOT NULL,
    arguments   TEXT    NOT NULL,
    approval_id TEXT    NOT NULL,
    status      TEXT    NOT NULL
                CHECK (status IN ('working', 'completed', 'failed', 'cancelled')),
    -- The call's result (completed) or JSON-RPC error (failed).
    outcome     TEXT    CHECK ((outcome IS NOT NULL) = (status IN ('completed', 'failed'))),
    created_at  INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL
) WITHOUT ROWID;

PRAGMA user_version = 5;
";

/// Issue 15: the leases of process runs that claim idempotency keys, which PostgreSQL's replicas
/// renew (see [`crate::db::postgres`]). One serving process owns a data directory, so nothing
/// renews a lease here and the table stays empty: every other owner reads as dead, as before,
/// and the idempotency rules are one statement text for both databases. And the rate buckets
/// replicas share ([`crate::state::StateStore::take_rate`]), which one process keeps in memory
/// instead; the table is here so that the rule is one text on every backend.
const SCHEMA_V6: &str = "
CREATE TABLE toolgate_owners (
    owner       TEXT    PRIMARY KEY,
    alive_until INTEGER NOT NULL
) WITHOUT ROWID;

CREATE TABLE rate_buckets (
    principal TEXT    NOT NULL,
    tool      TEXT    NOT NULL,
    quota     TEXT    NOT NULL,
    full_at   INTEGER NOT NULL,
    PRIMARY KEY (principal, tool, quota)
) WITHOUT ROWID;

PRAGMA user_version = 6;
";

/// Opens (creating if needed) `dir/toolgate.db` with its schema.
pub(crate) async fn open_pool(dir: &Path) -> Result<SqlitePool, StoreError> {
    // Blocking, but once per process at start, before any call is served.
    std::fs::create_dir_all(dir).map_err(|source| StoreError::CreateDir {
        path: dir.to_path_buf(),
        source,
    })?;
    let path = dir.join(DB_FILE);
    let options = SqliteConnectOptions::new()
        .filename(&path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Full)
        .foreign_keys(true)
        .busy_timeout(BUSY_TIMEOUT)
        // 512 KiB of page cache per connection instead of 2 MiB: the tables are small.
        .pragma("cache_size", "-512");

    // Switching a new file to WAL takes an exclusive lock that SQLite does not wait for (the busy
    // timeout does not apply), so two processes opening a fresh file together can see "database
    // is locked" once. Retry for as long as a statement would have waited.
    let deadline = Instant::now() + BUSY_TIMEOUT;
    loop {
        match connect_and_migrate(&options).await {
            Err(Attempt::Busy(source)) if Instant::now() < deadline => {
                tracing::debug!(error = %source, "database busy while opening; retrying");
                // tokio's `time` feature comes with sqlx's `runtime-tokio`.
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(Attempt::Busy(source) | Attempt::Failed(source)) => {
                return Err(StoreError::Open { path, source });
            }
            Err(Attempt::TooNew(found)) => {
                return Err(StoreError::SchemaTooNew {
                    path,
                    found,
                    supported: SCHEMA_VERSION,
                });
            }
            Ok(pool) => return Ok(pool),
        }
    }
}

enum Attempt {
    Busy(sqlx::Error),
    Failed(sqlx::Error),
    TooNew(i64),
}

impl From<sqlx::Error> for Attempt {
    fn from(error: sqlx::Error) -> Self {
        if is_busy(&error) {
            Self::Busy(error)
        } else {
            Self::Failed(error)
        }
    }
}

async fn connect_and_migrate(options: &SqliteConnectOptions) -> Result<SqlitePool, Attempt> {
    // One connection per process. SQLite has one writer per file and every commit here is a
    // flush, so more connections add no write throughput; they only race for the write lock,
    // and a loser sleeps in SQLite's busy handler (1 ms, 2 ms, … 100 ms) instead of queueing:
    // with 16 calls in flight through the gateway, p99 went from a few ms to 65-87 ms. With one,
    // callers wait in the pool's FIFO queue. Other processes (a person's `toolgate approvals`)
    // still meet the busy timeout, which is rare and fine. It also keeps an idle gate small.
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(1)
        .min_connections(0)
        .idle_timeout(Duration::from_secs(30))
        .connect_with(options.clone())
        .await?;
    // IMMEDIATE takes the write lock before reading the version, so of two opens of an old (or
    // new) file one migrates it and the other then sees the current version.
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
    let (version,): (i64,) = sqlx::query_as("PRAGMA user_version")
        .fetch_one(&mut *tx)
        .await?;
    if version == SCHEMA_VERSION {
        tx.rollback().await?;
        return Ok(pool);
    }
    // A negative version is no version of ours either: refuse it like a newer one.
    let Some(pending) = usize::try_from(version)
        .ok()
        .and_then(|done| MIGRATIONS.get(done..))
    else {
        return Err(Attempt::TooNew(version));
    };
    for migration in pending {
        sqlx::raw_sql(*migration).execute(&mut *tx).await?;
    }
    tx.commit().await?;
    Ok(pool)
}

/// `SQLITE_BUSY` or `SQLITE_LOCKED`, any extended code.
fn is_busy(error: &sqlx::Error) -> bool {
    const SQLITE_BUSY: i32 = 5;
    const SQLITE_LOCKED: i32 = 6;
    error
        .as_database_error()
        .and_then(|e| e.code())
        .and_then(|code| code.parse::<i32>().ok())
        .is_some_and(|code| matches!(code & 0xff, SQLITE_BUSY | SQLITE_LOCKED))
}

/// Whether the database answers now: a read of the file's header (its schema version) through the
/// pool, which needs a connection, the file and its read lock. For readiness probes; a file
/// deleted or unreadable under a running server fails here, where `SELECT 1` would not.
///
/// # Errors
/// The database could not answer.
pub(crate) async fn answers(pool: &SqlitePool) -> Result<(), StoreError> {
    sqlx::query_scalar::<_, i64>("PRAGMA user_version")
        .fetch_one(pool)
        .await
        .map(drop)
        .map_err(StoreError::query("the database does not answer"))
}
