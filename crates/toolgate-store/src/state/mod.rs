//! Gate-wide state that must hold across processes and restarts: the kill switch (for everyone,
//! and for one principal such as an agent) and the per-principal budget of medium-tier calls.
//!
//! Owns the `killswitch`, `killswitch_principals` and `budget_charges` tables of `toolgate.db` (the same file as the
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

use std::collections::BTreeSet;
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
    /// The switches as last read, with the stamp they were read under.
    cached: Arc<Mutex<Option<Cached>>>,
}

/// The switches as read under one stamp.
type Cached = (Stamp, Arc<Switches>);

/// Every switch that is on, as read together.
#[derive(Debug, Default)]
struct Switches {
    all: bool,
    principals: BTreeSet<String>,
}

/// What the kill switch stops for one caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Blocked {
    /// The switch for everyone is on.
    All,
    /// The switch for this principal is on.
    Principal,
}

/// The kill switch of one principal that is on.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct PrincipalSwitch {
    /// The principal whose every call is blocked (e.g. `agent:support-bot`).
    pub principal: String,
    /// Who turned it on.
    pub changed_by: String,
    /// When (unix milliseconds).
    pub changed_at: i64,
}

/// What identifies one version of the stamp file: each write renames a new file into place, so the
/// inode changes even where mtimes are coarse.
type Stamp = (SystemTime, u64, u64);

/// Name of the file whose change tells a running server to re-read the switch.
pub const KILLSWITCH_STAMP: &str = "killswitch.stamp";

impl StateStore {
    /// Whether the database answers now (for a readiness probe).
    ///
    /// # Errors
    /// The database could not answer.
    pub async fn answers(&self) -> Result<(), StoreError> {
        crate::db::answers(&self.pool).await
    }

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
        Ok(self.switches().await?.all)
    }

    /// Whether a switch stops `principal`'s calls: the one for everyone, or its own. Read as
    /// [`StateStore::killswitch_on`] reads, from the database only after a change.
    ///
    /// # Errors
    /// The database could not answer; the caller must then treat the principal as blocked.
    pub async fn blocks(&self, principal: &str) -> Result<Option<Blocked>, StoreError> {
        let switches = self.switches().await?;
        Ok(if switches.all {
            Some(Blocked::All)
        } else if switches.principals.contains(principal) {
            Some(Blocked::Principal)
        } else {
            None
        })
    }

    /// Every switch, from the cache while the stamp file is unchanged.
    async fn switches(&self) -> Result<Arc<Switches>, StoreError> {
        let stamp = std::fs::metadata(&self.stamp).ok().map(|m| {
            (
                m.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                m.len(),
                m.ino(),
            )
        });
        if let Some(stamp) = stamp
            && let Some((seen, switches)) =
                &*self.cached.lock().unwrap_or_else(PoisonError::into_inner)
            && *seen == stamp
        {
            return Ok(Arc::clone(switches));
        }
        let switches = Arc::new(Switches {
            all: self.killswitch().await?.on,
            principals: self
                .principal_switches()
                .await?
                .into_iter()
                .map(|s| s.principal)
                .collect(),
        });
        if let Some(stamp) = stamp {
            *self.cached.lock().unwrap_or_else(PoisonError::into_inner) =
                Some((stamp, Arc::clone(&switches)));
        }
        Ok(switches)
    }

    /// The principals whose own switch is on, oldest first.
    ///
    /// # Errors
    /// The database could not answer.
    pub async fn principal_switches(&self) -> Result<Vec<PrincipalSwitch>, StoreError> {
        let rows: Vec<(String, String, i64)> = sqlx::query_as(
            "SELECT principal, changed_by, changed_at FROM killswitch_principals
             ORDER BY changed_at, principal",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(StoreError::query(
            "cannot read the principals' kill switches",
        ))?;
        Ok(rows
            .into_iter()
            .map(|(principal, changed_by, changed_at)| PrincipalSwitch {
                principal,
                changed_by,
                changed_at,
            })
            .collect())
    }

    /// Turns `principal`'s own switch on or off; `true` when that changed its state. Every
    /// server on the data directory obeys from its next call, as for the switch for everyone.
    ///
    /// # Errors
    /// The database could not answer; the switch may or may not have changed.
    pub async fn set_principal_killswitch(
        &self,
        principal: &str,
        on: bool,
        by: &str,
        now: i64,
    ) -> Result<bool, StoreError> {
        let changed = if on {
            sqlx::query(
                "INSERT INTO killswitch_principals (principal, changed_by, changed_at)
                 VALUES (?1, ?2, ?3) ON CONFLICT (principal) DO NOTHING",
            )
            .bind(principal)
            .bind(by)
            .bind(now)
            .execute(&self.pool)
            .await
        } else {
            sqlx::query("DELETE FROM killswitch_principals WHERE principal = ?1")
                .bind(principal)
                .execute(&self.pool)
                .await
        }
        .map_err(StoreError::query("cannot change a principal's kill switch"))?;
        self.restamp(now, &format!("{principal} {on}"))?;
        Ok(changed.rows_affected() == 1)
    }

    /// Renames a new stamp into place (a new inode), so that every server re-reads the switches
    /// on its next call.
    fn restamp(&self, now: i64, what: &str) -> Result<(), StoreError> {
        let fresh = self
            .stamp
            .with_extension(format!("stamp.{}", uuid_like(now)));
        std::fs::write(&fresh, format!("{now} {what}\n"))
            .and_then(|()| std::fs::rename(&fresh, &self.stamp))
            .map_err(|source| StoreError::Stamp {
                path: self.stamp.clone(),
                source,
            })
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
        self.restamp(now, &engaged.to_string())?;
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
