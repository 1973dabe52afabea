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
//! process off the same data directory (DESIGN.md §5), so another live owner cannot exist. Replicas
//! sharing keys in PostgreSQL are alive beside each other, so there each process renews a lease
//! (`toolgate_owners`): a row in flight under an owner whose lease is current is a call running on
//! another replica ([`Claim::InFlight`]), and only one whose lease ran out is a dead run's.

#[cfg(test)]
mod tests;

use std::fmt;
use std::path::Path;
use std::sync::OnceLock;

use crate::db::{Columns, Db, Location, WritePool, on_db};
use crate::error::StoreError;

pub(crate) mod memory;

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
    /// Another copy of the call is running, in this process or on another live replica: run
    /// nothing.
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

    pub(crate) fn parse(s: &str) -> Option<Self> {
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

/// The idempotency keys in the shared database; cheap to clone.
#[derive(Clone, Debug)]
pub struct IdempotencyStore {
    db: Db,
}

/// Whether `owner` of the row aliased `i` holds a live lease at `$now` (PostgreSQL replicas; see
/// [`crate::db::postgres`]). SQLite's and memory's owners hold none: another owner is a dead run.
macro_rules! owner_alive {
    ($now:literal) => {
        concat!(
            "EXISTS (SELECT 1 FROM toolgate_owners o WHERE o.owner = i.owner AND o.alive_until > ",
            $now,
            ")"
        )
    };
}

impl IdempotencyStore {
    /// Whether the database answers now (for a readiness probe).
    ///
    /// # Errors
    /// The database could not answer.
    pub async fn answers(&self) -> Result<(), StoreError> {
        self.db.answers().await
    }

    /// Opens (creating if needed) `dir/toolgate.db`, creating or upgrading its schema, with a
    /// connection of its own; [`IdempotencyStore::beside`] shares the approval queue's instead.
    ///
    /// # Errors
    /// [`StoreError::CreateDir`] or [`StoreError::Open`]: the directory or database cannot be
    /// used; [`StoreError::SchemaTooNew`]: the file was written by a newer toolgate.
    pub async fn open(dir: &Path) -> Result<Self, StoreError> {
        Ok(Self {
            db: Location::Dir(dir.to_owned()).open().await?,
        })
    }

    /// The idempotency store over the approval queue's database and connections.
    #[must_use]
    pub fn beside(approvals: &crate::approval::ApprovalStore) -> Self {
        Self {
            db: approvals.db().clone(),
        }
    }

    /// Claims `key` for `owner` (this process run's [`boot_id`]) before the call is forwarded.
    ///
    /// No row: one is inserted in flight, owned by `owner`, and the answer is [`Claim::Claimed`].
    /// A row with another `args_digest` is a [`Claim::Conflict`] whatever its state. Otherwise:
    /// done replays its result; in flight under `owner`, or under another replica that is alive,
    /// is [`Claim::InFlight`]; in flight under a dead run (it died between forwarding and
    /// recording) or in doubt is [`Claim::InDoubt`], unless `retry_in_doubt` (the tool is
    /// idempotent upstream), in which case the row is taken over and the answer is
    /// [`Claim::Claimed`]. Of any number of concurrent claimers, across processes and replicas,
    /// exactly one is answered `Claimed`.
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
        // The rule: insert if absent; take over only a row with the same arguments that is in
        // doubt or in flight under a dead owner, and only when the caller may retry in doubt.
        const CLAIM: &str = concat!(
            "INSERT INTO idempotency AS i (principal, tool, key, args_digest, state, owner, result,
                 created_at, updated_at)
             VALUES ($1, $2, $3, $4, 'in_flight', $5, NULL, $6, $6)
             ON CONFLICT (principal, tool, key) DO UPDATE
             SET state = 'in_flight', owner = excluded.owner, updated_at = excluded.updated_at
             WHERE $7
               AND i.args_digest = excluded.args_digest
               AND (i.state = 'in_doubt'
                    OR (i.state = 'in_flight' AND i.owner <> excluded.owner
                        AND NOT ",
            owner_alive!("$6"),
            "))
             RETURNING 1"
        );
        const EXPLAIN: &str = concat!(
            "SELECT i.*, ",
            owner_alive!("$4"),
            " AS owner_alive FROM idempotency i
             WHERE i.principal = $1 AND i.tool = $2 AND i.key = $3"
        );
        // A refused claim is explained by the row as it is read after; in PostgreSQL its owner
        // may delete it in between (a released key), and the claim is then tried again.
        for _ in 0..3 {
            let seen = on_db!(
                &self.db,
                |pool| {
                    // SQLite: IMMEDIATE, so that the read that explains a refusal sees the row
                    // the claim saw.
                    let mut tx = pool.begin_write().await.map_err(StoreError::query(
                        "cannot start claiming the idempotency key",
                    ))?;
                    let claimed = sqlx::query(CLAIM)
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
                        None
                    } else {
                        let row = sqlx::query(EXPLAIN)
                            .bind(key.principal)
                            .bind(key.tool)
                            .bind(key.key)
                            .bind(now)
                            .fetch_optional(&mut *tx)
                            .await
                            .map_err(StoreError::query("cannot read the idempotency key"))?;
                        // Nothing was written; ending now frees the lock for other claimers.
                        drop(tx);
                        match row {
                            Some(row) => Some(Some((decode(&row)?, row.flag("owner_alive")?))),
                            None => Some(None),
                        }
                    }
                },
                // One process owns memory's keys: another owner is never alive.
                |tables| tables
                    .keys
                    .claim(key, args_digest, owner, retry_in_doubt, now)
                    .map(|entry| Some((entry, false))),
            );
            let (entry, owner_alive) = match seen {
                None => return Ok(Claim::Claimed),
                Some(None) => continue,
                Some(Some(seen)) => seen,
            };
            return Ok(if entry.args_digest != args_digest {
                Claim::Conflict
            } else {
                match (entry.state, entry.result) {
                    (State::Done, Some(result)) => Claim::Replay(result),
                    (State::InFlight, _) if entry.owner == owner || owner_alive => Claim::InFlight,
                    // A done row without a result is refused by the table's CHECK; were one
                    // there anyway, nothing is known about it, which is what in doubt means.
                    (State::InFlight | State::InDoubt | State::Done, _) => Claim::InDoubt,
                }
            });
        }
        // Claimed and released under us three times in a row: nothing is known for sure.
        Ok(Claim::InFlight)
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
        on_db!(
            &self.db,
            |pool| {
                let done = sqlx::query(
                    "UPDATE idempotency SET state = 'done', result = $5, updated_at = $6
                     WHERE principal = $1 AND tool = $2 AND key = $3
                       AND state = 'in_flight' AND owner = $4",
                )
                .bind(key.principal)
                .bind(key.tool)
                .bind(key.key)
                .bind(owner)
                .bind(result.to_string())
                .bind(now)
                .execute(pool)
                .await
                .map_err(StoreError::query(
                    "cannot record the idempotent call's result",
                ))?;
                Ok(done.rows_affected() == 1)
            },
            |tables| Ok(tables.keys.complete(key, owner, result, now)),
        )
    }

    /// Deletes `owner`'s in-flight row: the upstream said the call failed, so a retry may run.
    /// Returns whether the row was `owner`'s.
    ///
    /// # Errors
    /// The database could not answer; the key then stays claimed (a retry sees it in doubt or in
    /// flight, never runs twice).
    pub async fn release(&self, key: Key<'_>, owner: &str) -> Result<bool, StoreError> {
        on_db!(
            &self.db,
            |pool| {
                let done = sqlx::query(
                    "DELETE FROM idempotency
                     WHERE principal = $1 AND tool = $2 AND key = $3
                       AND state = 'in_flight' AND owner = $4",
                )
                .bind(key.principal)
                .bind(key.tool)
                .bind(key.key)
                .bind(owner)
                .execute(pool)
                .await
                .map_err(StoreError::query("cannot release the idempotency key"))?;
                Ok(done.rows_affected() == 1)
            },
            |tables| Ok(tables.keys.release(key, owner)),
        )
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
        on_db!(
            &self.db,
            |pool| {
                let done = sqlx::query(
                    "UPDATE idempotency SET state = 'in_doubt', updated_at = $5
                     WHERE principal = $1 AND tool = $2 AND key = $3
                       AND state = 'in_flight' AND owner = $4",
                )
                .bind(key.principal)
                .bind(key.tool)
                .bind(key.key)
                .bind(owner)
                .bind(now)
                .execute(pool)
                .await
                .map_err(StoreError::query(
                    "cannot mark the idempotency key in doubt",
                ))?;
                Ok(done.rows_affected() == 1)
            },
            |tables| Ok(tables.keys.mark_in_doubt(key, owner, now)),
        )
    }

    /// Keys without a recorded outcome, for metrics: `(in flight under owner, in doubt)`, where in
    /// doubt counts the rows marked so and the rows in flight under a dead owner (cut off by a
    /// crash); a key in flight on another live replica is that replica's to count. Reads only the
    /// unresolved rows (an index), never the finished ones, however many there are.
    ///
    /// # Errors
    /// The database could not answer.
    pub async fn unresolved_counts(&self, owner: &str, now: i64) -> Result<(u64, u64), StoreError> {
        const COUNT: &str = concat!(
            "SELECT count(*) FILTER (WHERE i.state = 'in_flight' AND i.owner = $1),
                    count(*) FILTER (WHERE i.state = 'in_doubt'
                        OR (i.state = 'in_flight' AND i.owner <> $1 AND NOT ",
            owner_alive!("$2"),
            "))
             FROM idempotency i WHERE i.state <> 'done'"
        );
        let (running, doubt): (i64, i64) = on_db!(
            &self.db,
            |pool| sqlx::query_as(COUNT)
                .bind(owner)
                .bind(now)
                .fetch_one(pool)
                .await
                .map_err(StoreError::query(
                    "cannot count unresolved idempotency keys"
                ))?,
            |tables| tables.keys.unresolved_counts(owner),
        );
        let count = |n: i64| u64::try_from(n).unwrap_or(0);
        Ok((count(running), count(doubt)))
    }

    /// Keys whose outcome nobody recorded, for an operator to check upstream: rows in doubt, and
    /// rows in flight under an owner other than `owner`, oldest claim first.
    ///
    /// A command run by a person passes its own boot id, so every in-flight row is listed,
    /// including calls a serving process is running right now (see `updated_at`).
    ///
    /// # Errors
    /// The database could not answer; never an empty list in its place.
    pub async fn unresolved(&self, owner: &str) -> Result<Vec<Entry>, StoreError> {
        on_db!(
            &self.db,
            |pool| {
                let rows = sqlx::query(
                    "SELECT * FROM idempotency
                     WHERE state = 'in_doubt' OR (state = 'in_flight' AND owner <> $1)
                     ORDER BY created_at, principal, tool, key",
                )
                .bind(owner)
                .fetch_all(pool)
                .await
                .map_err(StoreError::query("cannot list unresolved idempotency keys"))?;
                rows.iter().map(decode).collect()
            },
            |tables| Ok(tables.keys.unresolved(owner)),
        )
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
        on_db!(
            &self.db,
            |pool| {
                let done = sqlx::query(
                    "DELETE FROM idempotency
                     WHERE principal = $1 AND tool = $2 AND key = $3
                       AND state IN ('in_flight', 'in_doubt')",
                )
                .bind(principal)
                .bind(tool)
                .bind(key)
                .execute(pool)
                .await
                .map_err(StoreError::query("cannot forget the idempotency key"))?;
                Ok(done.rows_affected() == 1)
            },
            |tables| Ok(tables.keys.forget(Key {
                principal,
                tool,
                key
            })),
        )
    }

    /// The row as stored, if any (for tests and operators).
    ///
    /// # Errors
    /// The database could not answer.
    pub async fn entry(&self, key: Key<'_>) -> Result<Option<Entry>, StoreError> {
        on_db!(
            &self.db,
            |pool| {
                let row = sqlx::query(
                    "SELECT * FROM idempotency WHERE principal = $1 AND tool = $2 AND key = $3",
                )
                .bind(key.principal)
                .bind(key.tool)
                .bind(key.key)
                .fetch_optional(pool)
                .await
                .map_err(StoreError::query("cannot read the idempotency key"))?;
                row.as_ref().map(decode).transpose()
            },
            |tables| Ok(tables.keys.get(key)),
        )
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

fn decode(row: &impl Columns) -> Result<Entry, StoreError> {
    let corrupt = |reason: String| StoreError::Query {
        context: "an idempotency row is corrupt",
        source: sqlx::Error::Decode(reason.into()),
    };
    let state = row.text("state")?;
    let state = State::parse(&state).ok_or_else(|| corrupt(format!("unknown state {state:?}")))?;
    let result = row
        .text_or_null("result")?
        .map(|text| serde_json::from_str(&text))
        .transpose()
        .map_err(|e| corrupt(format!("result is not JSON: {e}")))?;
    Ok(Entry {
        principal: row.text("principal")?,
        tool: row.text("tool")?,
        key: row.text("key")?,
        args_digest: row.text("args_digest")?,
        state,
        owner: row.text("owner")?,
        result,
        created_at: row.int("created_at")?,
        updated_at: row.int("updated_at")?,
    })
}
