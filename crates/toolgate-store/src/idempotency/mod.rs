//! Idempotency keys: a retried mutation forwarded upstream has exactly one effect (DESIGN.md §1
//! step 6, §4).
//!
//! Owns the `idempotency` table of `toolgate.db` (the file of the approval queue, opened through
//! the same code). The gate claims a key before it forwards a call and records the outcome after;
//! this module keeps the rules about a key: same key and other arguments is a conflict, a done key
//! replays its result, and a key whose outcome nobody recorded is never run again blindly. It
//! does not decide which tools carry a key, how the key is read from the arguments, nor what the
//! client is told: the gate and the policy do.
//!
//! Design decision: as in [`crate::approval`], each rule is the condition of the one statement
//! that changes the row, judged by the rows it affected; a read afterwards (in the same
//! `BEGIN IMMEDIATE` transaction, so it sees the row the statement saw) only explains a refusal.
//! SQLite serialises writers, so of any number of claimers, in any number of processes, exactly one
//! inserts the row or takes it over.
//!
//! Who owns a row is the boot id of the process run that claimed it ([`boot_id`]). A row in flight
//! under another boot id is read as "that run died between forwarding and recording": only the
//! serving process forwards calls, and the audit log's exclusive lock keeps a second serving
//! process off the same data directory (DESIGN.md §5), so another live owner cannot exist. Sharing
//! keys between live replicas (PostgreSQL) will need a lease instead of this reading.

#[cfg(test)]
mod tests;

use std::fmt;
use std::path::Path;
use std::sync::OnceLock;

use sqlx::Row;
use sqlx::sqlite::{SqlitePool, SqliteRow};

use crate::error::StoreError;

/// The answer to a claim: what the gate may do with this call.
#[derive(Clone, Debug, PartialEq)]
pub enum Claim {
    /// The key is the caller's: forward the call, then [`IdempotencyStore::complete`],
    /// [`IdempotencyStore::release`] or [`IdempotencyStore::mark_in_doubt`].
    Claimed,
    /// The call already ran with these arguments: answer with its result, run nothing.
    Replay(serde_json::Value),
    /// The key was used with other arguments: refuse.
    Conflict,
    /// Another copy of the call is running in this process: run nothing.
    InFlight,
    /// Nobody knows whether the call took effect (a run died or the upstream failed mid-call):
    /// run nothing until an operator checks the upstream and forgets the key.
    InDoubt,
}

/// Names one idempotency key: the key is scoped to the principal and the tool that use it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Key<'a> {
    /// The principal (`sub`) that made the call: its keys are its own.
    pub principal: &'a str,
    /// The tool called: one key may be used once per tool.
    pub tool: &'a str,
    /// The key itself, as the gate read it from the call.
    pub key: &'a str,
}

/// Where a key is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// Claimed; the call is being forwarded (or its owner died while it was).
    InFlight,
    /// The call ran and its result is stored.
    Done,
    /// The upstream died or timed out mid-call: the effect may or may not have happened.
    InDoubt,
}

impl State {
    /// The name stored in the database and shown to people.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InFlight => "in_flight",
            Self::Done => "done",
            Self::InDoubt => "in_doubt",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "in_flight" => Self::InFlight,
            "done" => Self::Done,
            "in_doubt" => Self::InDoubt,
            _ => return None,
        })
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One row of the table, as an operator sees it.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Entry {
    /// As in [`Key::principal`].
    pub principal: String,
    /// As in [`Key::tool`].
    pub tool: String,
    /// As in [`Key::key`].
    pub key: String,
    /// Digest of the arguments of the call that claimed the key.
    pub args_digest: String,
    /// Where the key is in its life.
    pub state: State,
    /// Boot id of the process run that claimed the key (or last took it over).
    pub owner: String,
    /// The call's result; present exactly when `state` is done.
    pub result: Option<serde_json::Value>,
    /// When the key was first claimed (unix milliseconds).
    pub created_at: i64,
    /// When the row last changed state or owner (unix milliseconds).
    pub updated_at: i64,
}

/// The idempotency keys in `dir/toolgate.db`; cheap to clone.
#[derive(Clone, Debug)]
pub struct IdempotencyStore {
    pool: SqlitePool,
}

impl IdempotencyStore {
    /// Whether the database answers now (for a readiness probe).
    ///
    /// # Errors
    /// The database could not answer.
    pub async fn answers(&self) -> Result<(), StoreError> {
        crate::db::answers(&self.pool).await
    }

    /// Opens (creating if needed) `dir/toolgate.db`, creating or upgrading its schema, with a
    /// connection of its own; [`IdempotencyStore::beside`] shares the approval queue's instead.
    ///
    /// # Errors
    /// [`StoreError::CreateDir`] or [`StoreError::Open`]: the directory or database cannot be
    /// used; [`StoreError::SchemaTooNew`]: the file was written by a newer toolgate.
    pub async fn open(dir: &Path) -> Result<Self, StoreError> {
        Ok(Self {
            pool: crate::db::open_pool(dir).await?,
        })
    }

    /// The idempotency store over the approval queue's connections (one pool per process is
    /// enough).
    #[must_use]
    pub fn beside(approvals: &crate::approval::ApprovalStore) -> Self {
        Self {
            pool: approvals.pool().clone(),
        }
    }

    /// Claims `key` for `owner` (this process run's [`boot_id`]) before the call is forwarded.
    ///
    /// No row: one is inserted in flight, owned by `owner`, and the answer is [`Claim::Claimed`].
    /// A row with another `args_digest` is a [`Claim::Conflict`] whatever its state. Otherwise:
    /// done replays its result; in flight under `owner` is [`Claim::InFlight`]; in flight under
    /// another owner (that run died between forwarding and recording) or in doubt is
    /// [`Claim::InDoubt`], unless `retry_in_doubt` (the tool is idempotent upstream), in which
    /// case the row is taken over and the answer is [`Claim::Claimed`]. Of any number of
    /// concurrent claimers, across processes, exactly one is answered `Claimed`.
    ///
    /// # Errors
    /// The database could not answer; the caller must then not forward the call.
    pub async fn claim(
        &self,
        key: Key<'_>,
        args_digest: &str,
        owner: &str,
        retry_in_doubt: bool,
        now: i64,
    ) -> Result<Claim, StoreError> {
        // IMMEDIATE so that, when the claim is refused, the read that explains why sees the row
        // the claim saw.
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(StoreError::query(
                "cannot start claiming the idempotency key",
            ))?;
        // The rule: insert if absent; take over only a row with the same arguments that is in
        // doubt or in flight under another owner, and only when the caller may retry in doubt.
        let claimed = sqlx::query(
            "INSERT INTO idempotency (principal, tool, key, args_digest, state, owner, result,
                 created_at, updated_at)
             VALUES (?1, ?2, ?3, ?4, 'in_flight', ?5, NULL, ?6, ?6)
             ON CONFLICT (principal, tool, key) DO UPDATE
             SET state = 'in_flight', owner = excluded.owner, updated_at = excluded.updated_at
             WHERE ?7
               AND idempotency.args_digest = excluded.args_digest
               AND (idempotency.state = 'in_doubt'
                    OR (idempotency.state = 'in_flight' AND idempotency.owner <> excluded.owner))
             RETURNING 1",
        )
        .bind(key.principal)
        .bind(key.tool)
        .bind(key.key)
        .bind(args_digest)
        .bind(owner)
        .bind(now)
        .bind(retry_in_doubt)
        .fetch_optional(&mut *tx)
        .await
        .map_err(StoreError::query("cannot claim the idempotency key"))?;
        if claimed.is_some() {
            tx.commit()
                .await
                .map_err(StoreError::query("cannot commit the idempotency claim"))?;
            return Ok(Claim::Claimed);
        }

        // Refused, so the row exists (the insert would have run otherwise).
        let row = sqlx::query(
            "SELECT * FROM idempotency WHERE principal = ?1 AND tool = ?2 AND key = ?3",
        )
        .bind(key.principal)
        .bind(key.tool)
        .bind(key.key)
        .fetch_one(&mut *tx)
        .await
        .map_err(StoreError::query("cannot read the idempotency key"))?;
        // Nothing was written; rolling back now frees the write lock for the other claimers.
        drop(tx);
        let entry = decode(&row)?;
        Ok(if entry.args_digest != args_digest {
            Claim::Conflict
        } else {
            match (entry.state, entry.result) {
                (State::Done, Some(result)) => Claim::Replay(result),
                (State::InFlight, _) if entry.owner == owner => Claim::InFlight,
                // A done row without a result is refused by the table's CHECK; were one there
                // anyway, nothing is known about it, which is what in doubt means.
                (State::InFlight | State::InDoubt | State::Done, _) => Claim::InDoubt,
            }
        })
    }

    /// Records the result of the call `owner` claimed: in flight under `owner` becomes done.
    /// Returns whether the row was `owner`'s; `false` means someone else took the key over (or
    /// an operator forgot it) and nothing was written.
    ///
    /// # Errors
    /// The database could not answer; the call's outcome is then in doubt.
    pub async fn complete(
        &self,
        key: Key<'_>,
        owner: &str,
        result: &serde_json::Value,
        now: i64,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "UPDATE idempotency SET state = 'done', result = ?5, updated_at = ?6
             WHERE principal = ?1 AND tool = ?2 AND key = ?3
               AND state = 'in_flight' AND owner = ?4",
        )
        .bind(key.principal)
        .bind(key.tool)
        .bind(key.key)
        .bind(owner)
        .bind(result.to_string())
        .bind(now)
        .execute(&self.pool)
        .await
        .map_err(StoreError::query(
            "cannot record the idempotent call's result",
        ))?;
        Ok(done.rows_affected() == 1)
    }

    /// Deletes `owner`'s in-flight row: the upstream said the call failed, so a retry may run.
    /// Returns whether the row was `owner`'s.
    ///
    /// # Errors
    /// The database could not answer; the key then stays claimed (a retry sees it in doubt or in
    /// flight, never runs twice).
    pub async fn release(&self, key: Key<'_>, owner: &str) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "DELETE FROM idempotency
             WHERE principal = ?1 AND tool = ?2 AND key = ?3
               AND state = 'in_flight' AND owner = ?4",
        )
        .bind(key.principal)
        .bind(key.tool)
        .bind(key.key)
        .bind(owner)
        .execute(&self.pool)
        .await
        .map_err(StoreError::query("cannot release the idempotency key"))?;
        Ok(done.rows_affected() == 1)
    }

    /// Marks `owner`'s in-flight row in doubt: the upstream died or timed out mid-call. Returns
    /// whether the row was `owner`'s.
    ///
    /// # Errors
    /// The database could not answer; the row then stays in flight under `owner`, which a later
    /// run reads as in doubt anyway.
    pub async fn mark_in_doubt(
        &self,
        key: Key<'_>,
        owner: &str,
        now: i64,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "UPDATE idempotency SET state = 'in_doubt', updated_at = ?5
             WHERE principal = ?1 AND tool = ?2 AND key = ?3
               AND state = 'in_flight' AND owner = ?4",
        )
        .bind(key.principal)
        .bind(key.tool)
        .bind(key.key)
        .bind(owner)
        .bind(now)
        .execute(&self.pool)
        .await
        .map_err(StoreError::query(
            "cannot mark the idempotency key in doubt",
        ))?;
        Ok(done.rows_affected() == 1)
    }

    /// Keys without a recorded outcome, for metrics: `(in flight under owner, in doubt)`, where in
    /// doubt counts the rows marked so and the rows in flight under another owner (cut off by a
    /// crash), as [`IdempotencyStore::unresolved`] lists them. Reads only the unresolved rows (an
    /// index), never the finished ones, however many there are.
    ///
    /// # Errors
    /// The database could not answer.
    pub async fn unresolved_counts(&self, owner: &str) -> Result<(u64, u64), StoreError> {
        let (running, doubt): (i64, i64) = sqlx::query_as(
            "SELECT coalesce(sum(state = 'in_flight' AND owner = ?1), 0),
                    coalesce(sum(state = 'in_doubt' OR (state = 'in_flight' AND owner <> ?1)), 0)
             FROM idempotency WHERE state <> 'done'",
        )
        .bind(owner)
        .fetch_one(&self.pool)
        .await
        .map_err(StoreError::query(
            "cannot count unresolved idempotency keys",
        ))?;
        let count = |n: i64| u64::try_from(n).unwrap_or(0);
        Ok((count(running), count(doubt)))
    }

    /// Keys whose outcome nobody recorded, for an operator to check upstream: rows in doubt, and
    /// rows in flight under an owner other than `owner`, oldest claim first.
    ///
    /// A command run by a person passes its own boot id, so every in-flight row is listed,
    /// including calls the serving process is running right now (see `updated_at`).
    ///
    /// # Errors
    /// The database could not answer; never an empty list in its place.
    pub async fn unresolved(&self, owner: &str) -> Result<Vec<Entry>, StoreError> {
        let rows = sqlx::query(
            "SELECT * FROM idempotency
             WHERE state = 'in_doubt' OR (state = 'in_flight' AND owner <> ?1)
             ORDER BY created_at, principal, tool, key",
        )
        .bind(owner)
        .fetch_all(&self.pool)
        .await
        .map_err(StoreError::query("cannot list unresolved idempotency keys"))?;
        rows.iter().map(decode).collect()
    }

    /// An operator's decision after checking the upstream: forgets an unresolved key (in doubt or
    /// in flight), so that a retry of the call may run. Returns whether a row was forgotten.
    ///
    /// A done key is never forgotten: its result is known, and forgetting it would let a retry
    /// repeat an effect that is known to have happened.
    ///
    /// # Errors
    /// The database could not answer; nothing was forgotten.
    pub async fn forget(&self, principal: &str, tool: &str, key: &str) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "DELETE FROM idempotency
             WHERE principal = ?1 AND tool = ?2 AND key = ?3
               AND state IN ('in_flight', 'in_doubt')",
        )
        .bind(principal)
        .bind(tool)
        .bind(key)
        .execute(&self.pool)
        .await
        .map_err(StoreError::query("cannot forget the idempotency key"))?;
        Ok(done.rows_affected() == 1)
    }
}

/// The id of this process run, the `owner` of the keys it claims: 128 random bits, the same for
/// every call in one process and different in the next one.
///
/// One per process, not per store, so that two gates in one process never read each other's
/// running calls as the leftovers of a dead run.
///
/// The randomness is std's: `RandomState` keys come from the operating system once per thread
/// (the approval ids come from SQLite's `randomblob`, which needs a connection this function does
/// not have, and this crate depends on no random number crate).
#[must_use]
pub fn boot_id() -> String {
    static BOOT_ID: OnceLock<String> = OnceLock::new();
    BOOT_ID
        .get_or_init(|| {
            use std::hash::{BuildHasher, Hasher};
            let since_epoch = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_nanos();
            // Each `RandomState` has its own keys, so the two halves are independent.
            let [high, low] = [0_u8, 1].map(|half| {
                let mut hasher = std::hash::RandomState::new().build_hasher();
                hasher.write_u8(half);
                hasher.write_u32(std::process::id());
                hasher.write_u128(since_epoch);
                hasher.finish()
            });
            format!("boot_{high:016x}{low:016x}")
        })
        .clone()
}

fn decode(row: &SqliteRow) -> Result<Entry, StoreError> {
    let corrupt = |reason: String| StoreError::Query {
        context: "an idempotency row is corrupt",
        source: sqlx::Error::Decode(reason.into()),
    };
    let state: String = get(row, "state")?;
    let state = State::parse(&state).ok_or_else(|| corrupt(format!("unknown state {state:?}")))?;
    let result: Option<String> = get(row, "result")?;
    let result = result
        .map(|text| serde_json::from_str(&text))
        .transpose()
        .map_err(|e| corrupt(format!("result is not JSON: {e}")))?;
    Ok(Entry {
        principal: get(row, "principal")?,
        tool: get(row, "tool")?,
        key: get(row, "key")?,
        args_digest: get(row, "args_digest")?,
        state,
        owner: get(row, "owner")?,
        result,
        created_at: get(row, "created_at")?,
        updated_at: get(row, "updated_at")?,
    })
}

fn get<'r, T>(row: &'r SqliteRow, column: &'static str) -> Result<T, StoreError>
where
    T: sqlx::Decode<'r, sqlx::Sqlite> + sqlx::Type<sqlx::Sqlite>,
{
    row.try_get(column)
        .map_err(StoreError::query("cannot read an idempotency row"))
}
