//! Gate-wide state that must hold across processes and restarts: the kill switch (for everyone,
//! and for one principal such as an agent) and the per-principal budget of medium-tier calls.
//!
//! Owns the `killswitch`, `killswitch_principals` and `budget_charges` tables of the database the
//! approval queue is in (opened through the same code). It does not decide what the switch stops or
//! what the budget allows: the gate and the policy do, and a read error here must stop gated
//! calls (fail closed), never count as "switch off" or "within budget".
//!
//! Design decision: the budget is a sliding window of one row per counted call, and the check
//! and the count are one `INSERT … SELECT … WHERE (count) < limit`, run while the principal's
//! chargers take turns (SQLite's one write lock; in PostgreSQL, whose snapshots would let two
//! inserts count the same rows, an advisory lock per principal), so the count it tests is the count
//! it extends: concurrent chargers in several processes or replicas can never together pass the
//! limit, which a read in Rust followed by an insert could.

#[cfg(test)]
mod tests;

use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use std::time::{Duration, Instant};

use crate::db::{Db, Location, WritePool, on_db};
use crate::error::StoreError;

pub(crate) mod memory;

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

/// Kill switch and budgets in the shared database; cheap to clone.
#[derive(Clone, Debug)]
pub struct StateStore {
    db: Db,
    /// How a change of the switches made elsewhere is noticed.
    watch: Watch,
    /// The switches as last read, with when (or under which stamp) they were read.
    cached: Arc<Mutex<Option<Cached>>>,
}

/// How the gate learns that a switch changed without querying on every call.
#[derive(Clone, Debug)]
enum Watch {
    /// SQLite: `dir/killswitch.stamp`, rewritten after every change of the switch, so a `stat`
    /// (~1 µs) says whether to query (~25 µs). Every process on the data directory sees it.
    Stamp(PathBuf),
    /// PostgreSQL: replicas on other machines share no file, so the switches are read again once
    /// this much time has passed since the last read; a change reaches every replica within it.
    Every(Duration),
    /// Memory: read every time (it costs a lock).
    Always,
}

/// How long a PostgreSQL replica trusts the switches it read: a switch set through one replica
/// stops calls on every replica within this time (the issue asks for one second).
pub const REPLICA_REFRESH: Duration = Duration::from_millis(250);

/// The switches as read at one moment.
type Cached = (Seen, Arc<Switches>);

/// When switches were read: under which stamp, or at which instant.
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    Stamp(Stamp),
    At(Instant),
}

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
        self.db.answers().await
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
        Self::with_db(dir, Location::Dir(dir.to_owned()).open().await?)
    }

    /// The state store over the approval queue's database and connections; `dir` is the data
    /// directory the queue was opened in, where the stamp lives when that database is SQLite.
    ///
    /// # Errors
    /// [`StoreError::Stamp`]: the kill switch stamp cannot be created.
    pub fn beside(
        approvals: &crate::approval::ApprovalStore,
        dir: &Path,
    ) -> Result<Self, StoreError> {
        Self::with_db(dir, approvals.db().clone())
    }

    fn with_db(dir: &Path, db: Db) -> Result<Self, StoreError> {
        let watch = match &db {
            Db::Sqlite(_) => {
                let stamp = dir.join(KILLSWITCH_STAMP);
                if !stamp.exists() {
                    // Without a stamp every call would query the database.
                    std::fs::write(&stamp, "0\n").map_err(|source| StoreError::Stamp {
                        path: stamp.clone(),
                        source,
                    })?;
                }
                Watch::Stamp(stamp)
            }
            Db::Postgres(_) => Watch::Every(REPLICA_REFRESH),
            Db::Memory(_) => Watch::Always,
        };
        Ok(Self {
            db,
            watch,
            cached: Arc::new(Mutex::new(None)),
        })
    }

    /// Whether the switch is on, for the gate's check on every call. The database is read only
    /// after a change may have happened: on SQLite when the stamp file changed since the last
    /// read (`set_killswitch` rewrites it after it commits and before it returns, so a call that
    /// starts after `toolgate killswitch on` has returned always sees the switch on); on
    /// PostgreSQL once [`REPLICA_REFRESH`] has passed since the last read.
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

    /// What says whether the cached switches still hold: the stamp now, or the instant.
    fn seen_now(&self) -> Option<Seen> {
        match &self.watch {
            Watch::Stamp(path) => std::fs::metadata(path).ok().map(|m| {
                Seen::Stamp((
                    m.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                    m.len(),
                    m.ino(),
                ))
            }),
            Watch::Every(_) => Some(Seen::At(Instant::now())),
            Watch::Always => None,
        }
    }

    /// Whether switches read when `then` still hold when `now`.
    fn still_holds(&self, then: &Seen, now: &Seen) -> bool {
        match (&self.watch, then, now) {
            (Watch::Every(fresh), Seen::At(then), Seen::At(now)) => {
                now.saturating_duration_since(*then) < *fresh
            }
            _ => then == now,
        }
    }

    /// Every switch, from the cache while it still holds.
    async fn switches(&self) -> Result<Arc<Switches>, StoreError> {
        let seen = self.seen_now();
        if let Some(seen) = &seen
            && let Some((then, switches)) =
                &*self.cached.lock().unwrap_or_else(PoisonError::into_inner)
            && self.still_holds(then, seen)
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
        if let Some(seen) = seen {
            *self.cached.lock().unwrap_or_else(PoisonError::into_inner) =
                Some((seen, Arc::clone(&switches)));
        }
        Ok(switches)
    }

    /// The principals whose own switch is on, oldest first.
    ///
    /// # Errors
    /// The database could not answer.
    pub async fn principal_switches(&self) -> Result<Vec<PrincipalSwitch>, StoreError> {
        let rows: Vec<(String, String, i64)> = on_db!(
            &self.db,
            |pool| sqlx::query_as(
                "SELECT principal, changed_by, changed_at FROM killswitch_principals
                 ORDER BY changed_at, principal",
            )
            .fetch_all(pool)
            .await
            .map_err(StoreError::query(
                "cannot read the principals' kill switches"
            ))?,
            |tables| tables.state.principal_switches(),
        );
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
    /// server on the database obeys from its next call, as for the switch for everyone.
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
        let changed = on_db!(
            &self.db,
            |pool| if on {
                sqlx::query(
                    "INSERT INTO killswitch_principals (principal, changed_by, changed_at)
                     VALUES ($1, $2, $3) ON CONFLICT (principal) DO NOTHING",
                )
                .bind(principal)
                .bind(by)
                .bind(now)
                .execute(pool)
                .await
            } else {
                sqlx::query("DELETE FROM killswitch_principals WHERE principal = $1")
                    .bind(principal)
                    .execute(pool)
                    .await
            }
            .map_err(StoreError::query("cannot change a principal's kill switch"))?
            .rows_affected()
                == 1,
            |tables| tables.state.set_principal(principal, on, by, now),
        );
        self.restamp(now, &format!("{principal} {on}"))?;
        Ok(changed)
    }

    /// Renames a new stamp into place (a new inode), so that every server on the data directory
    /// re-reads the switches on its next call. Nothing to do where there is no stamp.
    fn restamp(&self, now: i64, what: &str) -> Result<(), StoreError> {
        let Watch::Stamp(stamp) = &self.watch else {
            return Ok(());
        };
        let fresh = stamp.with_extension(format!("stamp.{}", uuid_like(now)));
        std::fs::write(&fresh, format!("{now} {what}\n"))
            .and_then(|()| std::fs::rename(&fresh, stamp))
            .map_err(|source| StoreError::Stamp {
                path: stamp.clone(),
                source,
            })
    }

    /// The switch as last set by anyone, in any process.
    ///
    /// # Errors
    /// The database could not answer; the caller must then treat the switch as on.
    pub async fn killswitch(&self) -> Result<KillSwitch, StoreError> {
        let (on, changed_by, changed_at): (bool, Option<String>, Option<i64>) = on_db!(
            &self.db,
            |pool| sqlx::query_as(
                "SELECT engaged, changed_by, changed_at FROM killswitch WHERE id = 1",
            )
            .fetch_one(pool)
            .await
            .map_err(StoreError::query("cannot read the kill switch"))?,
            |tables| tables.state.killswitch(),
        );
        Ok(KillSwitch {
            on,
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
        let (engaged, changed_by, changed_at): (bool, Option<String>, Option<i64>) = on_db!(
            &self.db,
            |pool| {
                let mut tx = pool
                    .begin_write()
                    .await
                    .map_err(StoreError::query("cannot start changing the kill switch"))?;
                sqlx::query(
                    "INSERT INTO killswitch (id, engaged, changed_by, changed_at)
                         VALUES (1, $1, $2, $3)
                         ON CONFLICT (id) DO UPDATE
                         SET engaged = excluded.engaged, changed_by = excluded.changed_by,
                             changed_at = excluded.changed_at
                         WHERE killswitch.engaged <> excluded.engaged",
                )
                .bind(on)
                .bind(by)
                .bind(now)
                .execute(&mut *tx)
                .await
                .map_err(StoreError::query("cannot change the kill switch"))?;
                let row = sqlx::query_as(
                    "SELECT engaged, changed_by, changed_at FROM killswitch WHERE id = 1",
                )
                .fetch_one(&mut *tx)
                .await
                .map_err(StoreError::query("cannot read the kill switch"))?;
                tx.commit()
                    .await
                    .map_err(StoreError::query("cannot commit the kill switch"))?;
                row
            },
            |tables| tables.state.set_killswitch(on, by, now),
        );
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
        let keep_from = now - window_ms.max(PRUNE_HORIZON_MS);
        on_db!(
            &self.db,
            |pool| {
                // One transaction for the prune and the charge: one commit, so one sync, per
                // call. Chargers of one principal take turns (PostgreSQL: an advisory lock;
                // SQLite: the write lock), so the count the insert tests is the count it extends.
                let mut tx = pool
                    .begin_write()
                    .await
                    .map_err(StoreError::query("cannot start charging the budget"))?;
                pool.serialise(&mut tx, &format!("toolgate.budget:{principal}"))
                    .await
                    .map_err(StoreError::query("cannot start charging the budget"))?;
                sqlx::query("DELETE FROM budget_charges WHERE principal = $1 AND at <= $2")
                    .bind(principal)
                    .bind(keep_from)
                    .execute(&mut *tx)
                    .await
                    .map_err(StoreError::query("cannot prune old budget charges"))?;
                let charged = sqlx::query(
                    "INSERT INTO budget_charges (principal, at)
                     SELECT $1, $2
                     WHERE (SELECT count(*) FROM budget_charges
                            WHERE principal = $1 AND at > $2 - $3) < $4",
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
            },
            |tables| Ok(tables
                .state
                .charge(principal, limit, window_ms, keep_from, now)),
        )
    }

    /// Takes one call from `principal`'s bucket for `tool` under the quota "`burst` calls, one
    /// back every `every_ms`", in the database, so that every replica draws on the same bucket:
    /// `Ok(Ok(()))` lets the call through; `Ok(Err(ms))` refuses it, the next call being let
    /// through `ms` later. The bucket is kept as the in-process limiter keeps it (the generic
    /// cell rate algorithm: the instant it is full again), and the check and the step are one
    /// conditional upsert, so concurrent takers on any number of replicas never overdraw it.
    ///
    /// # Errors
    /// The database could not answer; the caller must then refuse the call.
    pub async fn take_rate(
        &self,
        principal: &str,
        tool: &str,
        every_ms: i64,
        burst: u32,
        now: i64,
    ) -> Result<Result<(), i64>, StoreError> {
        let quota = format!("{burst}/{every_ms}ms");
        let slack = every_ms.saturating_mul(i64::from(burst.max(1)) - 1);
        let full_at: Option<i64> = on_db!(
            &self.db,
            |pool| {
                let taken: Option<i64> = sqlx::query_scalar(
                    "INSERT INTO rate_buckets AS b (principal, tool, quota, full_at)
                     VALUES ($1, $2, $3, $4 + $5)
                     ON CONFLICT (principal, tool, quota) DO UPDATE
                     SET full_at = (CASE WHEN b.full_at > $4 THEN b.full_at ELSE $4 END) + $5
                     WHERE (CASE WHEN b.full_at > $4 THEN b.full_at ELSE $4 END) - $4 <= $6
                     RETURNING full_at",
                )
                .bind(principal)
                .bind(tool)
                .bind(&quota)
                .bind(now)
                .bind(every_ms)
                .bind(slack)
                .fetch_optional(pool)
                .await
                .map_err(StoreError::query("cannot take from the rate limit"))?;
                match taken {
                    Some(_) => None,
                    None => sqlx::query_scalar(
                        "SELECT full_at FROM rate_buckets
                         WHERE principal = $1 AND tool = $2 AND quota = $3",
                    )
                    .bind(principal)
                    .bind(tool)
                    .bind(&quota)
                    .fetch_optional(pool)
                    .await
                    .map_err(StoreError::query("cannot read the rate limit"))?,
                }
            },
            |tables| tables
                .state
                .take_rate(principal, tool, &quota, every_ms, slack, now),
        );
        Ok(match full_at {
            None => Ok(()),
            // Refused: the bucket is more than the slack ahead of now.
            Some(full_at) => Err((full_at.max(now) - now - slack).max(1)),
        })
    }

    /// Whether this store is shared by processes that may run on other machines (PostgreSQL):
    /// then what must hold across replicas, such as rate limits, is counted here, not in one
    /// process.
    #[must_use]
    pub fn shared(&self) -> bool {
        matches!(self.db, Db::Postgres(_))
    }
}

/// Varies the stamp's content (and often its length) even when two changes share a millisecond.
fn uuid_like(now: i64) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{}-{n}-{now:x}", std::process::id())
}
