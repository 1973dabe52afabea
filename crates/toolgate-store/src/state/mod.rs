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

use std::path::Path;

use sqlx::sqlite::SqlitePool;

use crate::approval::StoreError;

/// Charges older than this are pruned only if they are also outside the caller's window, so a
/// policy reload that lengthens a short window still sees the last day of charges.
const PRUNE_HORIZON_MS: i64 = 24 * 60 * 60 * 1000;

/// The kill switch: while on, the gate runs no gated call.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct KillSwitch {
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
}

impl StateStore {
    /// Opens (creating if needed) the database in `dir`.
    ///
    /// # Errors
    /// The directory or database cannot be used, or its schema is newer than this build.
    pub async fn open(dir: &Path) -> Result<Self, StoreError> {
        Ok(Self {
            pool: crate::db::open_pool(dir).await?,
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
