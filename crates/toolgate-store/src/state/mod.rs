//! Gate-wide state that must hold across processes and restarts: the kill switch and the
//! per-principal budget of medium-tier calls.
//!
//! Owns the `killswitch` and `budget_charges` tables of `toolgate.db` (the same file as the
//! approval queue, opened through the same code). It does not decide what the switch stops or
//! what the budget allows: the gate and the policy do, and a read error here must stop gated
//! calls (fail closed), never count as "switch off" or "within budget".
//!
//! Design decision: the budget is a sliding window of one row per counted call, and the check
//! and the count are one `INSERT … SELECT … WHERE (count) < limit`. SQLite runs a write statement
//! under its one write lock, so the count it tests is the count it extends: concurrent chargers in
//! several processes can never together pass the limit, which a read in Rust followed by an insert
//! could.

#[cfg(test)]
mod tests;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use sqlx::sqlite::SqlitePool;

use crate::error::StoreError;

/// Charges older than this are pruned only if they are also outside the caller's window, so a
/// policy reload that lengthens a short window still sees the last day of charges.
const PRUNE_HORIZON_MS: i64 = 24 * 60 * 60 * 1000;

/// The kill switch: while on, the gate runs no gated call.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct KillSwitch {
    /// Whether the switch is on: no gated call runs.
    pub on: bool,
    /// Who last turned it on or off; `None` if no one ever has.
    pub changed_by: Option<String>,
    /// When it last changed state (unix milliseconds).
    pub changed_at: Option<i64>,
}

/// Kill switch and budgets in `dir/toolgate.db`; cheap to clone.
#[derive(Clone, Debug)]
pub struct StateStore {
    pool: SqlitePool,
    /// `dir/killswitch.stamp`, rewritten after every change of the switch.
    stamp: PathBuf,
    /// The switch as last read, with the stamp it was read under.
    cached: Arc<Mutex<Option<(Stamp, bool)>>>,
}

/// What identifies one version of the stamp file: each write renames a new file into place, so the
/// inode changes even where mtimes are coarse.
type Stamp = (SystemTime, u64, u64);

/// Name of the file whose change tells a running server to re-read the switch.
pub const KILLSWITCH_STAMP: &str = "killswitch.stamp";

impl StateStore {
    /// Opens (creating if needed) `dir/toolgate.db`, creating or upgrading its schema, with a
    /// connection of its own ([`StateStore::beside`] shares the approval queue's instead), and
    /// creates `dir/killswitch.stamp` if it is missing.
    ///
    /// # Errors
    /// [`StoreError::CreateDir`] or [`StoreError::Open`]: the directory or database cannot be
    /// used; [`StoreError::SchemaTooNew`]: the file was written by a newer toolgate;
    /// [`StoreError::Stamp`]: the stamp cannot be created.
    pub async fn open(dir: &Path) -> Result<Self, StoreError> {
        Self::with_pool(dir, crate::db::open_pool(dir).await?)
    }

    /// The state store over the approval queue's connections (one pool per process is enough);
    /// `dir` is the data directory the queue was opened in, where the stamp lives.
    ///
    /// # Errors
    /// [`StoreError::Stamp`]: the kill switch stamp cannot be created.
    pub fn beside(
        approvals: &crate::approval::ApprovalStore,
        dir: &Path,
    ) -> Result<Self, StoreError> {
        Self::with_pool(dir, approvals.pool().clone())
    }

    fn with_pool(dir: &Path, pool: SqlitePool) -> Result<Self, StoreError> {
        let stamp = dir.join(KILLSWITCH_STAMP);
        if !stamp.exists() {
            // Without a stamp every call would query the database.
            std::fs::write(&stamp, "0\n").map_err(|source| StoreError::Stamp {
                path: stamp.clone(),
                source,
            })?;
        }
        Ok(Self {
            pool,
            stamp,
            cached: Arc::new(Mutex::new(None)),
        })
    }

    /// Whether the switch is on, for the gate's check on every call. The database is read only
    /// when the stamp file changed since the last read (a `stat`, ~1 µs, instead of a query,
    /// ~25 µs); `set_killswitch` rewrites the stamp after it commits and before it returns, so a
    /// call that starts after `toolgate killswitch on` has returned always sees the switch on.
    ///
    /// # Errors
    /// The database could not answer; the caller must then treat the switch as on.
    pub async fn killswitch_on(&self) -> Result<bool, StoreError> {
        let stamp = std::fs::metadata(&self.stamp).ok().map(|m| {
            (
                m.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                m.len(),
                m.ino(),
            )
        });
        if let Some(stamp) = stamp
            && let Some((seen, on)) = *self.cached.lock().unwrap_or_else(PoisonError::into_inner)
            && seen == stamp
        {
            return Ok(on);
        }
        let on = self.killswitch().await?.on;
        if let Some(stamp) = stamp {
            *self.cached.lock().unwrap_or_else(PoisonError::into_inner) = Some((stamp, on));
        }
        Ok(on)
    }

    /// The switch as last set by anyone, in any process.
    ///
    /// # Errors
    /// The database could not answer; the caller must then treat the switch as on.
    pub async fn killswitch(&self) -> Result<KillSwitch, StoreError> {
        let (engaged, changed_by, changed_at): (bool, Option<String>, Option<i64>) =
            sqlx::query_as("SELECT engaged, changed_by, changed_at FROM killswitch WHERE id = 1")
                .fetch_one(&self.pool)
                .await
                .map_err(StoreError::query("cannot read the kill switch"))?;
        Ok(KillSwitch {
            on: engaged,
            changed_by,
            changed_at,
        })
    }

    /// Turns the switch on or off and returns its state. Setting the state it is already in
    /// changes nothing, so `changed_by` keeps naming whoever actually flipped it.
    ///
    /// # Errors
    /// The database could not answer; the switch may or may not have changed.
    pub async fn set_killswitch(
        &self,
        on: bool,
        by: &str,
        now: i64,
    ) -> Result<KillSwitch, StoreError> {
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(StoreError::query("cannot start changing the kill switch"))?;
        sqlx::query(
            "INSERT INTO killswitch (id, engaged, changed_by, changed_at) VALUES (1, ?1, ?2, ?3)
             ON CONFLICT (id) DO UPDATE
             SET engaged = excluded.engaged, changed_by = excluded.changed_by,
                 changed_at = excluded.changed_at
             WHERE engaged <> excluded.engaged",
        )
        .bind(on)
        .bind(by)
        .bind(now)
        .execute(&mut *tx)
        .await
        .map_err(StoreError::query("cannot change the kill switch"))?;
        let (engaged, changed_by, changed_at): (bool, Option<String>, Option<i64>) =
            sqlx::query_as("SELECT engaged, changed_by, changed_at FROM killswitch WHERE id = 1")
                .fetch_one(&mut *tx)
                .await
                .map_err(StoreError::query("cannot read the kill switch"))?;
        tx.commit()
            .await
            .map_err(StoreError::query("cannot commit the kill switch"))?;
        // A new stamp (a new inode, renamed into place) makes every server re-read the switch on
        // its next call.
        let fresh = self
            .stamp
            .with_extension(format!("stamp.{}", uuid_like(now)));
        std::fs::write(&fresh, format!("{now} {engaged}\n"))
            .and_then(|()| std::fs::rename(&fresh, &self.stamp))
            .map_err(|source| StoreError::Stamp {
                path: self.stamp.clone(),
                source,
            })?;
        Ok(KillSwitch {
            on: engaged,
            changed_by,
            changed_at,
        })
    }

    /// Counts one medium-tier call of `principal` if fewer than `limit` were counted in the
    /// window ending at `now`; `true` means within budget (and counted), `false` means over
    /// budget (and nothing counted).
    ///
    /// Charges stamped after `now` (another process whose clock runs ahead) count too: a clock
    /// difference must not buy extra calls.
    ///
    /// # Errors
    /// The database could not answer; the caller must then refuse the call.
    pub async fn charge_budget(
        &self,
        principal: &str,
        limit: u32,
        window_ms: i64,
        now: i64,
    ) -> Result<bool, StoreError> {
        // One transaction for the prune and the charge: one commit, so one sync, per call.
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(StoreError::query("cannot start charging the budget"))?;
        sqlx::query("DELETE FROM budget_charges WHERE principal = ?1 AND at <= ?2 - max(?3, ?4)")
            .bind(principal)
            .bind(now)
            .bind(window_ms)
            .bind(PRUNE_HORIZON_MS)
            .execute(&mut *tx)
            .await
            .map_err(StoreError::query("cannot prune old budget charges"))?;
        let charged = sqlx::query(
            "INSERT INTO budget_charges (principal, at)
             SELECT ?1, ?2
             WHERE (SELECT count(*) FROM budget_charges WHERE principal = ?1 AND at > ?2 - ?3) < ?4",
        )
        .bind(principal)
        .bind(now)
        .bind(window_ms)
        .bind(i64::from(limit))
        .execute(&mut *tx)
        .await
        .map_err(StoreError::query("cannot charge the budget"))?;
        tx.commit()
            .await
            .map_err(StoreError::query("cannot commit the budget charge"))?;
        Ok(charged.rows_affected() == 1)
    }
}

/// Varies the stamp's content (and often its length) even when two changes share a millisecond.
fn uuid_like(now: i64) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{}-{n}-{now:x}", std::process::id())
}
