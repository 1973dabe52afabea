//! The PostgreSQL backend: one database that every replica of a server shares, so that an approval
//! decided through one replica, a key claimed on another and the kill switch set through a third
//! are one state.
//!
//! Owns the connection pool, the schema (numbered migrations, applied at start under an advisory
//! lock so that of several replicas starting together exactly one migrates), and this process's
//! lease: the row of `toolgate_owners` that says this process run is alive.
//!
//! Design decision, the lease: on SQLite a key in flight under another process run's id can only
//! be a dead run's (one serving process per data directory), but replicas are live beside each
//! other. Each process renews its row every [`RENEW`] to [`LEASE`] ahead; a key in flight under an
//! owner whose lease ran out is a dead run's, and in doubt, while under a live owner it is a call
//! running on another replica. A replica killed mid-call is read as dead one lease later, never
//! sooner, so its call is never run again while it might still be running. The times are the
//! processes' own clocks, which must agree to well within the lease (one machine, or NTP).

use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

use crate::error::StoreError;

/// How long a process counts as alive after it last renewed its lease.
const LEASE: Duration = Duration::from_secs(5);
/// How often a process renews its lease.
const RENEW: Duration = Duration::from_secs(1);

/// How long a statement may wait for a connection from the pool before failing (fail closed).
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);

/// Key of the advisory lock the migrations run under (any constant, the same in every build).
const MIGRATION_LOCK: i64 = 0x746f_6f6c_6761_7465; // "toolgate"

/// Migration `i` takes the database from version `i` to `i + 1`. Only additions, as for SQLite.
const MIGRATIONS: [&str; 2] = [SCHEMA_V1, SCHEMA_V2];

/// The version of a database whose schema is complete.
pub(crate) const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// Every table of SQLite's five migrations, in PostgreSQL's types: integers are `BIGINT` (unix
/// milliseconds, counts), flags `BOOLEAN`, JSON is text as in SQLite, so one statement text and
/// one decoder serve both. The constraints are the same rules: the partial unique index is "one
/// pending row per call", the primary keys are "one claim per key" and "one vote per decider".
const SCHEMA_V1: &str = "
CREATE TABLE approvals (
    seq             BIGINT  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
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
    created_at      BIGINT  NOT NULL,
    expires_at      BIGINT  NOT NULL,
    decided_by      TEXT,
    decided_at      BIGINT,
    decision_reason TEXT,
    used_at         BIGINT  CHECK (used_at IS NULL OR status = 'approved'),
    result          TEXT    CHECK (result IS NULL OR used_at IS NOT NULL),
    resolution_audited BOOLEAN NOT NULL DEFAULT FALSE,
    approvers       TEXT,
    approvals_required BIGINT NOT NULL DEFAULT 1 CHECK (approvals_required >= 1)
);
CREATE UNIQUE INDEX approvals_one_pending ON approvals (fingerprint) WHERE status = 'pending';
CREATE INDEX approvals_by_fingerprint ON approvals (fingerprint, seq);
CREATE INDEX approvals_pending_expiry ON approvals (expires_at) WHERE status = 'pending';
CREATE INDEX approvals_unaudited ON approvals (seq)
    WHERE status <> 'pending' AND NOT resolution_audited;

CREATE TABLE approval_votes (
    approval_id TEXT    NOT NULL,
    decider     TEXT    NOT NULL,
    verdict     TEXT    NOT NULL CHECK (verdict IN ('approve', 'deny')),
    reason      TEXT,
    at          BIGINT  NOT NULL,
    PRIMARY KEY (approval_id, decider)
);

CREATE TABLE killswitch (
    id         BIGINT  PRIMARY KEY CHECK (id = 1),
    engaged    BOOLEAN NOT NULL,
    changed_by TEXT,
    changed_at BIGINT
);
INSERT INTO killswitch (id, engaged) VALUES (1, FALSE);

CREATE TABLE killswitch_principals (
    principal  TEXT    PRIMARY KEY,
    changed_by TEXT    NOT NULL,
    changed_at BIGINT  NOT NULL
);

CREATE TABLE budget_charges (
    principal TEXT    NOT NULL,
    at        BIGINT  NOT NULL
);
CREATE INDEX budget_by_principal ON budget_charges (principal, at);

CREATE TABLE idempotency (
    principal   TEXT    NOT NULL,
    tool        TEXT    NOT NULL,
    key         TEXT    NOT NULL,
    args_digest TEXT    NOT NULL,
    state       TEXT    NOT NULL CHECK (state IN ('in_flight', 'done', 'in_doubt')),
    owner       TEXT    NOT NULL,
    result      TEXT    CHECK ((result IS NOT NULL) = (state = 'done')),
    created_at  BIGINT  NOT NULL,
    updated_at  BIGINT  NOT NULL,
    PRIMARY KEY (principal, tool, key)
);
CREATE INDEX idempotency_unresolved ON idempotency (created_at) WHERE state <> 'done';

-- The lease of each process run that claims keys (see the module header).
CREATE TABLE toolgate_owners (
    owner       TEXT    PRIMARY KEY,
    alive_until BIGINT  NOT NULL
);

-- One rate bucket per principal, tool and quota, shared by every replica: when it is full again.
CREATE TABLE rate_buckets (
    principal TEXT    NOT NULL,
    tool      TEXT    NOT NULL,
    quota     TEXT    NOT NULL,
    full_at   BIGINT  NOT NULL,
    PRIMARY KEY (principal, tool, quota)
);

CREATE TABLE agent_runs (
    seq         BIGINT  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id          TEXT    NOT NULL UNIQUE,
    agent       TEXT    NOT NULL,
    status      TEXT    NOT NULL
                CHECK (status IN ('running', 'paused', 'finished', 'aborted', 'failed')),
    approval_id TEXT    CHECK (approval_id IS NULL OR status = 'paused'),
    input       TEXT    NOT NULL,
    state       TEXT    NOT NULL,
    steps       BIGINT  NOT NULL,
    outcome     TEXT,
    created_at  BIGINT  NOT NULL,
    updated_at  BIGINT  NOT NULL
);
CREATE INDEX agent_runs_by_status ON agent_runs (status, seq);

CREATE TABLE console_logins (
    token_sha256 TEXT    PRIMARY KEY,
    identity     TEXT    NOT NULL,
    created_at   BIGINT  NOT NULL,
    expires_at   BIGINT  NOT NULL,
    used_at      BIGINT
);

CREATE TABLE console_sessions (
    id_sha256  TEXT    PRIMARY KEY,
    identity   TEXT    NOT NULL,
    groups     TEXT    NOT NULL,
    via        TEXT    NOT NULL CHECK (via IN ('link', 'oidc')),
    created_at BIGINT  NOT NULL,
    expires_at BIGINT  NOT NULL,
    ended_at   BIGINT
);

CREATE TABLE console_oidc_logins (
    state_sha256  TEXT    PRIMARY KEY,
    nonce         TEXT    NOT NULL,
    code_verifier TEXT    NOT NULL,
    next          TEXT    NOT NULL,
    expires_at    BIGINT  NOT NULL
);

CREATE TABLE approval_tasks (
    id          TEXT    PRIMARY KEY,
    principal   TEXT    NOT NULL,
    tool        TEXT    NOT NULL,
    arguments   TEXT    NOT NULL,
    approval_id TEXT    NOT NULL,
    status      TEXT    NOT NULL
                CHECK (status IN ('working', 'completed', 'failed', 'cancelled')),
    outcome     TEXT    CHECK ((outcome IS NOT NULL) = (status IN ('completed', 'failed'))),
    created_at  BIGINT  NOT NULL,
    updated_at  BIGINT  NOT NULL,
    expires_at  BIGINT  NOT NULL
);
";

/// The central audit ledger (see [`crate::ledger`]): one row per record in chain order, the head
/// every batch locks and moves on, and the signed checkpoints. The primary keys are the chain's
/// rules: one record per position, one checkpoint per count.
const SCHEMA_V2: &str = "
CREATE TABLE audit_ledger (
    seq         BIGINT  PRIMARY KEY CHECK (seq >= 1),
    line        TEXT    NOT NULL,
    sha256      TEXT    NOT NULL,
    appended_at BIGINT  NOT NULL
);
CREATE INDEX audit_ledger_by_time ON audit_ledger (appended_at);

CREATE TABLE audit_head (
    id      BIGINT  PRIMARY KEY CHECK (id = 1),
    seq     BIGINT  NOT NULL,
    sha256  TEXT    NOT NULL
);
INSERT INTO audit_head (id, seq, sha256)
VALUES (1, 0, '0000000000000000000000000000000000000000000000000000000000000000');

CREATE TABLE audit_checkpoints (
    count     BIGINT  PRIMARY KEY,
    head      TEXT    NOT NULL,
    time      BIGINT  NOT NULL,
    key_id    TEXT    NOT NULL,
    signature TEXT    NOT NULL
);
";

/// A pool on the shared database, and this process's lease in it; cheap to clone.
#[derive(Clone, Debug)]
pub(crate) struct Postgres {
    pool: PgPool,
    /// Renews the lease while any clone lives; aborted with the last one.
    _lease: std::sync::Arc<Renewer>,
}

#[derive(Debug)]
struct Renewer(tokio::task::JoinHandle<()>);

impl Drop for Renewer {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Postgres {
    /// Connects to `url`, creates or upgrades the schema, and takes this process's lease.
    ///
    /// # Errors
    /// [`StoreError::Connect`]: the server cannot be reached or refused the login, or a
    /// migration failed; [`StoreError::DatabaseTooNew`]: a newer toolgate migrated it.
    pub(crate) async fn connect(url: &str) -> Result<Self, StoreError> {
        let database = without_password(url);
        let failed = |source| StoreError::Connect {
            database: database.clone(),
            source,
        };
        let options: PgConnectOptions = url.parse().map_err(failed)?;
        let pool = PgPoolOptions::new()
            .max_connections(8)
            .min_connections(0)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .idle_timeout(Duration::from_secs(60))
            .connect_with(options)
            .await
            .map_err(failed)?;
        match migrate(&pool).await {
            Ok(None) => {}
            Ok(Some(found)) => {
                return Err(StoreError::DatabaseTooNew {
                    database,
                    found,
                    supported: SCHEMA_VERSION,
                });
            }
            Err(source) => return Err(failed(source)),
        }
        let owner = crate::idempotency::boot_id();
        renew(&pool, &owner).await.map_err(failed)?;
        let renewer = tokio::spawn({
            let pool = pool.clone();
            async move {
                let mut ticks = tokio::time::interval(RENEW);
                ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    ticks.tick().await;
                    if let Err(error) = renew(&pool, &owner).await {
                        // Keys this run claims stay in flight under it; after the lease runs
                        // out other replicas read them as in doubt, never as free to run.
                        tracing::warn!(error = %error, "cannot renew this process's lease");
                    }
                }
            }
        });
        Ok(Self {
            pool,
            _lease: std::sync::Arc::new(Renewer(renewer)),
        })
    }

    /// The connections.
    pub(crate) fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Whether the database answers now: a read of the schema version.
    pub(crate) async fn answers(&self) -> Result<(), StoreError> {
        sqlx::query_scalar::<_, i64>("SELECT version FROM toolgate_schema")
            .fetch_one(&self.pool)
            .await
            .map(drop)
            .map_err(StoreError::query("the database does not answer"))
    }
}

/// Applies the migrations this database lacks, under an advisory lock held by the transaction
/// (released at its end, or when a crashed connection closes). `Some(version)`: the database is
/// newer than this build, and nothing was changed.
async fn migrate(pool: &PgPool) -> Result<Option<i64>, sqlx::Error> {
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(MIGRATION_LOCK)
        .execute(&mut *tx)
        .await?;
    sqlx::raw_sql("CREATE TABLE IF NOT EXISTS toolgate_schema (version BIGINT NOT NULL)")
        .execute(&mut *tx)
        .await?;
    let found: Option<i64> = sqlx::query_scalar("SELECT version FROM toolgate_schema")
        .fetch_optional(&mut *tx)
        .await?;
    let done = found.unwrap_or(0);
    let Some(pending) = usize::try_from(done)
        .ok()
        .and_then(|done| MIGRATIONS.get(done..))
    else {
        return Ok(Some(done));
    };
    if pending.is_empty() {
        tx.rollback().await?;
        return Ok(None);
    }
    for migration in pending {
        sqlx::raw_sql(*migration).execute(&mut *tx).await?;
    }
    if found.is_none() {
        sqlx::query("INSERT INTO toolgate_schema (version) VALUES ($1)")
            .bind(SCHEMA_VERSION)
            .execute(&mut *tx)
            .await?;
    } else {
        sqlx::query("UPDATE toolgate_schema SET version = $1")
            .bind(SCHEMA_VERSION)
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok(None)
}

/// Extends `owner`'s lease to [`LEASE`] from now.
async fn renew(pool: &PgPool, owner: &str) -> Result<(), sqlx::Error> {
    let now = toolgate_core::time::now_ms();
    let until = now + i64::try_from(LEASE.as_millis()).unwrap_or(i64::MAX);
    sqlx::query(
        "INSERT INTO toolgate_owners (owner, alive_until) VALUES ($1, $2)
         ON CONFLICT (owner) DO UPDATE SET alive_until = excluded.alive_until",
    )
    .bind(owner)
    .bind(until)
    .execute(pool)
    .await
    .map(drop)
}

/// `url` with any password removed, for messages: `postgres://user@host/db`.
pub(crate) fn without_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "postgres://…".to_owned();
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let authority = match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split_once(':').map_or(userinfo, |(user, _)| user);
            format!("{user}@{host}")
        }
        None => authority.to_owned(),
    };
    // The query may carry `password=…` too; it is not needed to say which database this is.
    let tail = tail.split_once('?').map_or(tail, |(path, _)| path);
    format!("{scheme}://{authority}{tail}")
}

#[cfg(test)]
mod tests {
    use super::without_password;

    #[test]
    fn a_password_never_reaches_a_message() {
        for (url, shown) in [
            (
                "postgres://tg:s3cret@db.internal:5432/gate",
                "postgres://tg@db.internal:5432/gate",
            ),
            (
                "postgresql://db/gate?user=tg&password=s3cret",
                "postgresql://db/gate",
            ),
            ("postgres://127.0.0.1/test", "postgres://127.0.0.1/test"),
            ("postgres://a:b:c@h", "postgres://a@h"),
        ] {
            assert_eq!(without_password(url), shown);
            assert!(!without_password(url).contains("s3cret"));
        }
    }
}
