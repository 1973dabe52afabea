//! The approval queue: one durable row per gated call that waits for a person (DESIGN.md §6).
//!
//! Owns the `approvals` table of `toolgate.db` and every rule about it: first decision wins, the
//! requester never decides its own request, expiry is atomic and means denial, an approval is
//! bound to the call's fingerprint and claimed by exactly one execution, and a retry of a pending
//! call attaches to its row. It does not decide which calls need approval (policy does) nor how a
//! caller waits (the gate does).
//!
//! Design decision: each rule is the `WHERE` clause (or unique index) of the one statement that
//! changes the row, judged by the rows it affected, never a read in Rust followed by a write. The
//! deciders are separate processes with their own connections, so a check in Rust would be stale
//! by the time its write lands; SQLite serialises writers, and PostgreSQL re-evaluates a
//! statement's condition against the row it waited for, so a condition inside the statement is
//! evaluated against the latest committed row. A decision, which reads the votes so far, first
//! locks the row (SQLite's write lock, PostgreSQL's `FOR UPDATE`), so deciders in any number of
//! processes and replicas take their turns. Reads after a refused write only explain the
//! refusal, they never decide anything.
//!
//! Times are unix milliseconds passed in by the caller, so that expiry is testable and a whole
//! call uses one clock reading.

mod error;

#[cfg(test)]
mod tests;

use std::fmt;
use std::path::Path;

use crate::db::{Columns, Db, Location, WritePool, locking, on_db};

pub(crate) mod memory;

pub use crate::db::DB_FILE;
pub use crate::error::StoreError;
pub use error::DecideError;

/// How many fresh ids `request` tries before giving up; 48 random bits make even a second try
/// unlikely, but a collision must not look like a store failure.
const ID_ATTEMPTS: usize = 4;

/// A gated call that needs a person, as the gate asks for it.
#[derive(Clone, Debug, PartialEq)]
pub struct NewApproval {
    /// Binds the approval to one call (tool, arguments, principal); see the gate.
    pub fingerprint: String,
    /// Principal that made the call; it may never decide this approval.
    pub requester: String,
    /// Name of the tool called.
    pub tool: String,
    /// Arguments as the policy allows a person to see them.
    pub args_redacted: serde_json::Value,
    /// The policy tier that put the call in the queue (e.g. `high`), shown to the person deciding.
    pub tier: String,
    /// Why the policy asks for approval.
    pub reason: String,
    /// What the call would do, if the tool could say.
    pub dry_run: serde_json::Value,
    /// The policy that asked, so a decision can be traced to the rules in force.
    pub policy_sha256: String,
    /// Deadline for a decision (unix milliseconds); at or after it the row is expired (denied).
    pub expires_at: i64,
    /// `user:NAME` / `group:NAME` entries of who may decide; `None`: anyone but the requester.
    pub approvers: Option<Vec<String>>,
    /// Distinct approvals needed before the call may run; any one denial denies it.
    pub approvals_required: u32,
}

/// Who is deciding: an identity (`human:dana` from the terminal, `user:dana` from a login) and the
/// groups a login vouched for (none from a terminal).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decider {
    /// The identity recorded as the decider.
    pub id: String,
    /// Groups from the identity provider, matched against `group:NAME` entries.
    pub groups: Vec<String>,
}

impl Decider {
    /// A decider with no groups (the terminal's `--as`).
    #[must_use]
    pub fn new(id: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            groups: Vec::new(),
        }
    }

    /// The user name behind the identity: what follows `human:` or `user:`, else the whole id.
    #[must_use]
    pub fn user(&self) -> &str {
        ["human:", "user:"]
            .iter()
            .find_map(|prefix| self.id.strip_prefix(prefix))
            .unwrap_or(&self.id)
    }

    /// Whether `approvers` lets this decider decide (`None`: anyone).
    #[must_use]
    pub fn may_decide(&self, approvers: Option<&[String]>) -> bool {
        let Some(approvers) = approvers else {
            return true;
        };
        approvers.iter().any(|entry| {
            if let Some(user) = entry.strip_prefix("user:") {
                user == self.user()
            } else if let Some(group) = entry.strip_prefix("group:") {
                self.groups.iter().any(|g| g == group)
            } else {
                false
            }
        })
    }
}

/// Requests by status, as [`ApprovalStore::counts`] reads them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatusCounts {
    /// Waiting for a person, not yet expired.
    pub pending: u64,
    /// Approved.
    pub approved: u64,
    /// Denied.
    pub denied: u64,
    /// Expired, or pending past their expiry.
    pub expired: u64,
}

/// Where an approval is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Waiting for a person; the only status a decision can change.
    Pending,
    /// A person other than the requester approved it: one execution may claim it.
    Approved,
    /// A person other than the requester denied it.
    Denied,
    /// Not decided before `expires_at`: a denial no one typed.
    Expired,
}

impl Status {
    /// The name stored in the database and shown to people.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Approved => "approved",
            Self::Denied => "denied",
            Self::Expired => "expired",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "pending" => Self::Pending,
            "approved" => Self::Approved,
            "denied" => Self::Denied,
            "expired" => Self::Expired,
            _ => return None,
        })
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One row of the queue. Times are unix milliseconds.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Approval {
    /// `apr_` and 12 random hex digits: short enough to type in a terminal.
    pub id: String,
    /// As in [`NewApproval::fingerprint`]: the one call this row is for.
    pub fingerprint: String,
    /// As in [`NewApproval::requester`].
    pub requester: String,
    /// As in [`NewApproval::tool`].
    pub tool: String,
    /// As in [`NewApproval::args_redacted`].
    pub args_redacted: serde_json::Value,
    /// As in [`NewApproval::tier`].
    pub tier: String,
    /// As in [`NewApproval::reason`].
    pub reason: String,
    /// As in [`NewApproval::dry_run`].
    pub dry_run: serde_json::Value,
    /// As in [`NewApproval::policy_sha256`].
    pub policy_sha256: String,
    /// Where the row is in its life.
    pub status: Status,
    /// When the row was requested, by the requesting process's clock.
    pub created_at: i64,
    /// As in [`NewApproval::expires_at`].
    pub expires_at: i64,
    /// Who approved or denied it; `None` while pending and when it expired.
    pub decided_by: Option<String>,
    /// When it was approved or denied, by the deciding process's clock.
    pub decided_at: Option<i64>,
    /// The reason the decider gave, if any.
    pub decision_reason: Option<String>,
    /// When the one execution this approval allows claimed it.
    pub used_at: Option<i64>,
    /// That execution's result, replayed to repeats of the call.
    pub result: Option<serde_json::Value>,
    /// As in [`NewApproval::approvers`].
    pub approvers: Option<Vec<String>>,
    /// As in [`NewApproval::approvals_required`].
    pub approvals_required: u32,
}

/// How one tool's approval requests ended over a window (seed 003's "watch approval fatigue").
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ToolStats {
    /// The tool.
    pub tool: String,
    /// Requests approved.
    pub approved: u64,
    /// Requests a person denied.
    pub denied: u64,
    /// Requests nobody decided in time.
    pub expired: u64,
    /// Requests still waiting.
    pub pending: u64,
}

impl ToolStats {
    /// Requests that ended (approved, denied or expired).
    #[must_use]
    pub fn decided(&self) -> u64 {
        self.approved + self.denied + self.expired
    }

    /// The share of ended requests that were approved (0 when none ended).
    #[must_use]
    pub fn approval_rate(&self) -> f64 {
        match self.decided() {
            0 => 0.0,
            // Counts of requests stay far below 2^52: the conversion is exact.
            #[allow(clippy::cast_precision_loss)]
            n => self.approved as f64 / n as f64,
        }
    }
}

/// One decider's vote on an approval.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Vote {
    /// Who voted.
    pub decider: String,
    /// `true` for approve, `false` for deny.
    pub approve: bool,
    /// The reason they gave.
    pub reason: Option<String>,
    /// When (unix milliseconds).
    pub at: i64,
}

/// A person's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Let the call run, once.
    Approve,
    /// Refuse the call.
    Deny,
}

impl Verdict {
    /// The name stored with a vote.
    fn as_str(self) -> &'static str {
        match self {
            Self::Approve => "approve",
            Self::Deny => "deny",
        }
    }

    /// The status a lone decider's verdict settles a row in.
    #[cfg(test)]
    fn status(self) -> Status {
        match self {
            Self::Approve => Status::Approved,
            Self::Deny => Status::Denied,
        }
    }
}

/// The approval queue in the shared database; cheap to clone.
#[derive(Clone, Debug)]
pub struct ApprovalStore {
    db: Db,
}

impl ApprovalStore {
    /// Whether the database answers now (for a readiness probe).
    ///
    /// # Errors
    /// The database could not answer.
    pub async fn answers(&self) -> Result<(), StoreError> {
        self.db.answers().await
    }

    /// The database, for stores that share it.
    pub(crate) fn db(&self) -> &Db {
        &self.db
    }

    /// Opens (creating if needed) `dir/toolgate.db`, creating or upgrading its schema, with one
    /// connection for this process (the idempotency and state stores can share it through their
    /// `beside` constructors).
    ///
    /// # Errors
    /// [`StoreError::CreateDir`] or [`StoreError::Open`]: the directory or database cannot be
    /// used; [`StoreError::SchemaTooNew`]: the file was written by a newer toolgate.
    pub async fn open(dir: &Path) -> Result<Self, StoreError> {
        Self::at(&Location::Dir(dir.to_owned())).await
    }

    /// Opens the queue wherever `location` says: a data directory's `toolgate.db`, a PostgreSQL
    /// database that replicas share (its schema created or upgraded at start), or memory.
    ///
    /// # Errors
    /// The database cannot be opened, reached or migrated, or its schema is newer than this
    /// build's.
    pub async fn at(location: &Location) -> Result<Self, StoreError> {
        Ok(Self {
            db: location.open().await?,
        })
    }

    /// Which database holds the queue: `sqlite`, `postgres` or `memory`.
    #[must_use]
    pub fn backend(&self) -> &'static str {
        self.db.kind()
    }

    /// Opens a pending row for this call, or attaches to the pending, unexpired row that already
    /// exists for its fingerprint. Returns the row and whether it was created.
    ///
    /// This does not look at decided rows: the gate asks [`Self::latest_for`] first, and only
    /// requests when there is no approval to use.
    ///
    /// # Errors
    /// The database could not answer.
    pub async fn request(
        &self,
        new: NewApproval,
        now: i64,
    ) -> Result<(Approval, bool), StoreError> {
        let approvers = new
            .approvers
            .as_ref()
            .map(|list| serde_json::Value::from(list.clone()).to_string());
        let required = i64::from(new.approvals_required.max(1));
        on_db!(
            &self.db,
            |pool| {
                let mut tx = pool
                    .begin_write()
                    .await
                    .map_err(StoreError::query("cannot start an approval request"))?;
                // A due row still marked pending would otherwise be attached to, or block the
                // insert.
                sqlx::query(EXPIRE)
                    .bind(now)
                    .execute(&mut *tx)
                    .await
                    .map_err(StoreError::query("cannot expire due approvals"))?;
                let mut created = false;
                for attempt in 1..=ID_ATTEMPTS {
                    // ON CONFLICT names the partial index, so only "a pending row exists" means
                    // attach; an id collision still fails and is retried with new random bits.
                    let inserted = sqlx::query(
                        "INSERT INTO approvals (id, fingerprint, requester, tool, args_redacted,
                             tier, reason, dry_run, policy_sha256, status, created_at, expires_at,
                             approvers, approvals_required)
                         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 'pending', $10, $11, $12, $13)
                         ON CONFLICT (fingerprint) WHERE status = 'pending' DO NOTHING",
                    )
                    .bind(new_id()?)
                    .bind(&new.fingerprint)
                    .bind(&new.requester)
                    .bind(&new.tool)
                    .bind(new.args_redacted.to_string())
                    .bind(&new.tier)
                    .bind(&new.reason)
                    .bind(new.dry_run.to_string())
                    .bind(&new.policy_sha256)
                    .bind(now)
                    .bind(new.expires_at)
                    .bind(&approvers)
                    .bind(required)
                    .execute(&mut *tx)
                    .await;
                    match inserted {
                        Ok(done) => {
                            created = done.rows_affected() == 1;
                            break;
                        }
                        Err(e) if attempt < ID_ATTEMPTS && is_unique_violation(&e) => {}
                        Err(e) => {
                            return Err(StoreError::query("cannot insert the approval request")(e));
                        }
                    }
                }
                let row = sqlx::query(
                    "SELECT * FROM approvals WHERE fingerprint = $1 AND status = 'pending'",
                )
                .bind(&new.fingerprint)
                .fetch_one(&mut *tx)
                .await
                .map_err(StoreError::query("cannot read the approval request"))?;
                let approval = decode(&row)?;
                tx.commit()
                    .await
                    .map_err(StoreError::query("cannot commit the approval request"))?;
                Ok((approval, created))
            },
            |tables| {
                let id = new_id()?;
                Ok(tables.approvals.request(id, new, now))
            },
        )
    }

    /// The row with this id, after expiring due rows.
    ///
    /// # Errors
    /// The database could not answer.
    pub async fn get(&self, id: &str, now: i64) -> Result<Option<Approval>, StoreError> {
        self.expire_due(now).await?;
        on_db!(
            &self.db,
            |pool| {
                let row = sqlx::query("SELECT * FROM approvals WHERE id = $1")
                    .bind(id)
                    .fetch_optional(pool)
                    .await
                    .map_err(StoreError::query("cannot read the approval"))?;
                row.as_ref().map(decode).transpose()
            },
            |tables| Ok(tables.approvals.get(id).cloned()),
        )
    }

    /// Pending rows (and decided ones too if `include_decided`), newest first, after expiring
    /// due rows.
    ///
    /// # Errors
    /// The database could not answer; never an empty list in its place.
    pub async fn list(&self, include_decided: bool, now: i64) -> Result<Vec<Approval>, StoreError> {
        self.expire_due(now).await?;
        on_db!(
            &self.db,
            |pool| {
                let rows = sqlx::query(
                    "SELECT * FROM approvals WHERE $1 OR status = 'pending' ORDER BY seq DESC",
                )
                .bind(include_decided)
                .fetch_all(pool)
                .await
                .map_err(StoreError::query("cannot list approvals"))?;
                rows.iter().map(decode).collect()
            },
            |tables| Ok(tables.approvals.newest_first(
                |row| include_decided || row.status == Status::Pending,
                usize::MAX
            )),
        )
    }

    /// The newest `limit` rows that are no longer pending (approved, denied, expired), newest
    /// first, after expiring due rows; with `tool` and `requester`, only that tool's rows for that
    /// requester (the history a person deciding a new request of theirs looks at).
    ///
    /// # Errors
    /// The database could not answer; never an empty list in its place.
    pub async fn decided(
        &self,
        of: Option<(&str, &str)>,
        limit: u32,
        now: i64,
    ) -> Result<Vec<Approval>, StoreError> {
        self.expire_due(now).await?;
        let (tool, requester) = of.unzip();
        on_db!(
            &self.db,
            |pool| {
                let rows = sqlx::query(
                    "SELECT * FROM approvals WHERE status <> 'pending'
                         AND ($1 IS NULL OR (tool = $1 AND requester = $2))
                     ORDER BY seq DESC LIMIT $3",
                )
                .bind(tool)
                .bind(requester)
                .bind(i64::from(limit))
                .fetch_all(pool)
                .await
                .map_err(StoreError::query("cannot list decided approvals"))?;
                rows.iter().map(decode).collect()
            },
            |tables| Ok(tables.approvals.newest_first(
                |row| {
                    row.status != Status::Pending
                        && of.is_none_or(|(tool, requester)| {
                            row.tool == tool && row.requester == requester
                        })
                },
                usize::try_from(limit).unwrap_or(usize::MAX),
            )),
        )
    }

    /// Records `decider`'s decision on approval `id` (with no groups: the terminal's `--as`); see
    /// [`ApprovalStore::decide_as`].
    ///
    /// # Errors
    /// Why the decision changed nothing, or that the database could not answer.
    pub async fn decide(
        &self,
        id: &str,
        decider: &str,
        verdict: Verdict,
        reason: Option<&str>,
        now: i64,
    ) -> Result<Approval, DecideError> {
        self.decide_as(id, &Decider::new(decider), verdict, reason, now)
            .await
    }

    /// Records `decider`'s vote on approval `id` and returns the row as it now stands. The rules
    /// hold under a lock taken before anything is read (SQLite's write lock, PostgreSQL's lock on
    /// the row, the memory tables' lock): the first decision wins (a decided row is never
    /// changed), the requester never decides, a decision at or after expiry changes nothing, only
    /// a decider the row's `approvers` name may vote, one decider votes once, any denial denies,
    /// and the row is approved when `approvals_required` distinct deciders approved (until then
    /// it stays pending with the votes so far).
    ///
    /// # Errors
    /// Why the vote changed nothing ([`DecideError`]), or that the database could not answer.
    pub async fn decide_as(
        &self,
        id: &str,
        decider: &Decider,
        verdict: Verdict,
        reason: Option<&str>,
        now: i64,
    ) -> Result<Approval, DecideError> {
        on_db!(
            &self.db,
            |pool| {
                let mut tx = pool
                    .begin_write()
                    .await
                    .map_err(StoreError::query("cannot start a decision"))?;
                let row = sqlx::query(locking(pool, "SELECT * FROM approvals WHERE id = $1"))
                    .bind(id)
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(StoreError::query("cannot read the approval"))?;
                let Some(row) = row else {
                    return Err(DecideError::NotFound { id: id.to_owned() });
                };
                let current = decode(&row)?;
                may_vote(&current, decider, now)?;
                let voted = sqlx::query(
                    "INSERT INTO approval_votes (approval_id, decider, verdict, reason, at)
                     VALUES ($1, $2, $3, $4, $5) ON CONFLICT (approval_id, decider) DO NOTHING",
                )
                .bind(id)
                .bind(&decider.id)
                .bind(verdict.as_str())
                .bind(reason)
                .bind(now)
                .execute(&mut *tx)
                .await
                .map_err(StoreError::query("cannot record the vote"))?;
                if voted.rows_affected() == 0 {
                    return Err(DecideError::AlreadyVoted {
                        id: current.id,
                        decider: decider.id.clone(),
                    });
                }
                let approvers: Vec<String> = sqlx::query_scalar(
                    "SELECT decider FROM approval_votes
                     WHERE approval_id = $1 AND verdict = 'approve' ORDER BY at, decider",
                )
                .bind(id)
                .fetch_all(&mut *tx)
                .await
                .map_err(StoreError::query("cannot count the votes"))?;
                if let Some((status, by)) = settle(&current, decider, verdict, &approvers) {
                    // Still under the lock taken above: the row read is the row updated.
                    sqlx::query(
                        "UPDATE approvals
                         SET status = $1, decided_by = $2, decided_at = $3, decision_reason = $4
                         WHERE id = $5 AND status = 'pending'",
                    )
                    .bind(status.as_str())
                    .bind(by)
                    .bind(now)
                    .bind(reason)
                    .bind(id)
                    .execute(&mut *tx)
                    .await
                    .map_err(StoreError::query("cannot record the decision"))?;
                }
                let row = sqlx::query("SELECT * FROM approvals WHERE id = $1")
                    .bind(id)
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(StoreError::query("cannot read the approval"))?;
                let approval = decode(&row)?;
                tx.commit()
                    .await
                    .map_err(StoreError::query("cannot commit the decision"))?;
                Ok(approval)
            },
            |tables| tables.approvals.decide(id, decider, verdict, reason, now),
        )
    }

    /// Per tool, how the approval requests made since `since` (unix milliseconds) ended, after
    /// expiring due rows; tools in name order.
    ///
    /// # Errors
    /// The database could not answer.
    pub async fn stats(&self, since: i64, now: i64) -> Result<Vec<ToolStats>, StoreError> {
        self.expire_due(now).await?;
        let rows: Vec<(String, i64, i64, i64, i64)> = on_db!(
            &self.db,
            |pool| sqlx::query_as(
                "SELECT tool,
                        count(*) FILTER (WHERE status = 'approved'),
                        count(*) FILTER (WHERE status = 'denied'),
                        count(*) FILTER (WHERE status = 'expired'),
                        count(*) FILTER (WHERE status = 'pending')
                 FROM approvals WHERE created_at >= $1 GROUP BY tool ORDER BY tool",
            )
            .bind(since)
            .fetch_all(pool)
            .await
            .map_err(StoreError::query("cannot count the approvals"))?,
            |tables| tables.approvals.stats(since),
        );
        let count = |n: i64| u64::try_from(n).unwrap_or(0);
        Ok(rows
            .into_iter()
            .map(|(tool, approved, denied, expired, pending)| ToolStats {
                tool,
                approved: count(approved),
                denied: count(denied),
                expired: count(expired),
                pending: count(pending),
            })
            .collect())
    }

    /// Who voted on approval `id` so far, in the order they voted: decider, verdict
    /// (`approve` or `deny`), reason, when.
    ///
    /// # Errors
    /// The database could not answer.
    pub async fn votes(&self, id: &str) -> Result<Vec<Vote>, StoreError> {
        on_db!(
            &self.db,
            |pool| {
                let rows: Vec<(String, String, Option<String>, i64)> = sqlx::query_as(
                    "SELECT decider, verdict, reason, at FROM approval_votes
                     WHERE approval_id = $1 ORDER BY at, decider",
                )
                .bind(id)
                .fetch_all(pool)
                .await
                .map_err(StoreError::query("cannot read the votes"))?;
                Ok(rows
                    .into_iter()
                    .map(|(decider, verdict, reason, at)| Vote {
                        decider,
                        approve: verdict == Verdict::Approve.as_str(),
                        reason,
                        at,
                    })
                    .collect())
            },
            |tables| Ok(tables.approvals.votes(id)),
        )
    }

    /// Marks every pending row whose `expires_at <= now` as expired; returns how many.
    ///
    /// # Errors
    /// The database could not answer.
    pub async fn expire_due(&self, now: i64) -> Result<u64, StoreError> {
        on_db!(
            &self.db,
            |pool| Ok(sqlx::query(EXPIRE)
                .bind(now)
                .execute(pool)
                .await
                .map_err(StoreError::query("cannot expire due approvals"))?
                .rows_affected()),
            |tables| Ok(tables.approvals.expire(now)),
        )
    }

    /// How many requests are in each status at `now`, for metrics: a pending row past its expiry
    /// counts as expired, as every decision would treat it. Reads only (a scrape changes nothing).
    ///
    /// # Errors
    /// The database could not answer.
    pub async fn counts(&self, now: i64) -> Result<StatusCounts, StoreError> {
        let rows: Vec<(String, bool, i64)> = on_db!(
            &self.db,
            |pool| sqlx::query_as(
                "SELECT status, status = 'pending' AND expires_at <= $1, count(*) FROM approvals
                 GROUP BY 1, 2",
            )
            .bind(now)
            .fetch_all(pool)
            .await
            .map_err(StoreError::query("cannot count the approval requests"))?,
            |tables| tables.approvals.counts(now),
        );
        let mut counts = StatusCounts::default();
        for (status, due, n) in rows {
            let n = u64::try_from(n).unwrap_or(0);
            match (status.as_str(), due) {
                ("pending", false) => counts.pending += n,
                ("pending", true) | ("expired", _) => counts.expired += n,
                ("approved", _) => counts.approved += n,
                _ => counts.denied += n,
            }
        }
        Ok(counts)
    }

    /// The most recently requested row for this fingerprint, any status, after expiring due rows.
    ///
    /// # Errors
    /// The database could not answer.
    pub async fn latest_for(
        &self,
        fingerprint: &str,
        now: i64,
    ) -> Result<Option<Approval>, StoreError> {
        self.expire_due(now).await?;
        on_db!(
            &self.db,
            |pool| {
                let row = sqlx::query(
                    "SELECT * FROM approvals WHERE fingerprint = $1 ORDER BY seq DESC LIMIT 1",
                )
                .bind(fingerprint)
                .fetch_optional(pool)
                .await
                .map_err(StoreError::query("cannot read the approval"))?;
                row.as_ref().map(decode).transpose()
            },
            |tables| Ok(tables
                .approvals
                .newest_first(|row| row.fingerprint == fingerprint, 1)
                .pop()),
        )
    }

    /// Claims an approved, unused row for one execution. `true` for exactly one caller ever;
    /// the caller that gets `false` must not run the call.
    ///
    /// `expires_at` is the deadline for the decision, not for its use: a caller told to "call
    /// again after it is decided" may come back later than that.
    ///
    /// # Errors
    /// The database could not answer.
    pub async fn consume(&self, id: &str, now: i64) -> Result<bool, StoreError> {
        on_db!(
            &self.db,
            |pool| {
                let done = sqlx::query(
                    "UPDATE approvals SET used_at = $2
                     WHERE id = $1 AND status = 'approved' AND used_at IS NULL",
                )
                .bind(id)
                .bind(now)
                .execute(pool)
                .await
                .map_err(StoreError::query("cannot claim the approval"))?;
                Ok(done.rows_affected() == 1)
            },
            |tables| Ok(tables.approvals.consume(id, now)),
        )
    }

    /// Stores the result of the one execution, so that repeats of the call replay it. Storing
    /// the same result again is a no-op, so a retry after a lost answer is safe.
    ///
    /// # Errors
    /// [`StoreError::NoExecution`] if the row was never claimed or holds a different result;
    /// otherwise the database could not answer.
    pub async fn store_result(
        &self,
        id: &str,
        result: &serde_json::Value,
    ) -> Result<(), StoreError> {
        let stored = on_db!(
            &self.db,
            |pool| {
                let done = sqlx::query(
                    "UPDATE approvals SET result = $2
                     WHERE id = $1 AND used_at IS NOT NULL AND (result IS NULL OR result = $2)",
                )
                .bind(id)
                .bind(result.to_string())
                .execute(pool)
                .await
                .map_err(StoreError::query("cannot store the approved call's result"))?;
                done.rows_affected() == 1
            },
            |tables| tables.approvals.store_result(id, result),
        );
        if stored {
            Ok(())
        } else {
            Err(StoreError::NoExecution { id: id.to_owned() })
        }
    }

    /// Rows decided or expired whose resolution is not yet in the audit log, oldest first
    /// (after expiring due rows).
    ///
    /// # Errors
    /// The database could not answer.
    pub async fn unaudited_resolutions(&self, now: i64) -> Result<Vec<Approval>, StoreError> {
        self.expire_due(now).await?;
        on_db!(
            &self.db,
            |pool| {
                let rows = sqlx::query(
                    "SELECT * FROM approvals WHERE status <> 'pending' AND NOT resolution_audited
                     ORDER BY seq",
                )
                .fetch_all(pool)
                .await
                .map_err(StoreError::query("cannot read approval resolutions"))?;
                rows.iter().map(decode).collect()
            },
            |tables| Ok(tables.approvals.unaudited()),
        )
    }

    /// Marks a row's resolution as recorded in the audit log.
    ///
    /// # Errors
    /// The database could not answer.
    pub async fn mark_resolution_audited(&self, id: &str) -> Result<(), StoreError> {
        on_db!(
            &self.db,
            |pool| {
                sqlx::query(
                    "UPDATE approvals SET resolution_audited = TRUE
                     WHERE id = $1 AND status <> 'pending'",
                )
                .bind(id)
                .execute(pool)
                .await
                .map_err(StoreError::query("cannot mark the resolution audited"))?;
                Ok(())
            },
            |tables| {
                tables.approvals.mark_audited(id);
                Ok(())
            },
        )
    }
}

/// Whether `decider` may vote on `current` at `now`: the rules that refuse a vote before it is
/// counted, in the order a person reads them (decided, expired, their own request, not named).
fn may_vote(current: &Approval, decider: &Decider, now: i64) -> Result<(), DecideError> {
    match current.status {
        Status::Approved | Status::Denied => {
            return Err(DecideError::AlreadyDecided {
                id: current.id.clone(),
                status: current.status,
                by: current.decided_by.clone(),
            });
        }
        Status::Expired => {
            return Err(DecideError::Expired {
                id: current.id.clone(),
            });
        }
        Status::Pending if current.expires_at <= now => {
            return Err(DecideError::Expired {
                id: current.id.clone(),
            });
        }
        Status::Pending => {}
    }
    if current.requester == decider.id {
        return Err(DecideError::SelfApproval {
            id: current.id.clone(),
        });
    }
    if !decider.may_decide(current.approvers.as_deref()) {
        return Err(DecideError::NotAnApprover {
            id: current.id.clone(),
            decider: decider.id.clone(),
            approvers: current.approvers.clone().unwrap_or_default(),
        });
    }
    Ok(())
}

/// What a counted vote settles: any denial denies (by its decider), and `approvals_required`
/// distinct approvals approve (by all of them, in the order they voted); `None` keeps the row
/// pending.
fn settle(
    current: &Approval,
    decider: &Decider,
    verdict: Verdict,
    approvers: &[String],
) -> Option<(Status, String)> {
    match verdict {
        Verdict::Deny => Some((Status::Denied, decider.id.clone())),
        Verdict::Approve
            if approvers.len()
                >= usize::try_from(current.approvals_required).unwrap_or(usize::MAX) =>
        {
            Some((Status::Approved, approvers.join(", ")))
        }
        Verdict::Approve => None,
    }
}

/// A new approval id: `apr_` and 12 hex digits of the operating system's randomness.
fn new_id() -> Result<String, StoreError> {
    let mut bytes = [0_u8; 6];
    getrandom::fill(&mut bytes).map_err(|e| StoreError::Query {
        context: "cannot draw a random approval id",
        source: sqlx::Error::Io(std::io::Error::other(e.to_string())),
    })?;
    Ok(format!(
        "apr_{}",
        toolgate_core::canonical::lower_hex(&bytes)
    ))
}

/// Marks every pending row that is due as expired; `$1` is now.
const EXPIRE: &str =
    "UPDATE approvals SET status = 'expired' WHERE status = 'pending' AND expires_at <= $1";

fn is_unique_violation(error: &sqlx::Error) -> bool {
    error
        .as_database_error()
        .is_some_and(sqlx::error::DatabaseError::is_unique_violation)
}

fn decode(row: &impl Columns) -> Result<Approval, StoreError> {
    let id = row.text("id")?;
    fn parse<T: serde::de::DeserializeOwned>(
        id: &str,
        column: &'static str,
        text: &str,
    ) -> Result<T, StoreError> {
        serde_json::from_str(text).map_err(|e| StoreError::Corrupt {
            id: id.to_owned(),
            column,
            reason: e.to_string(),
        })
    }
    let status = row.text("status")?;
    let status = Status::parse(&status).ok_or_else(|| StoreError::Corrupt {
        id: id.clone(),
        column: "status",
        reason: format!("unknown status {status:?}"),
    })?;
    let required = row.int("approvals_required")?;
    Ok(Approval {
        approvers: row
            .text_or_null("approvers")?
            .map(|text| parse(&id, "approvers", &text))
            .transpose()?,
        approvals_required: u32::try_from(required).unwrap_or(1).max(1),
        fingerprint: row.text("fingerprint")?,
        requester: row.text("requester")?,
        tool: row.text("tool")?,
        args_redacted: parse(&id, "args_redacted", &row.text("args_redacted")?)?,
        tier: row.text("tier")?,
        reason: row.text("reason")?,
        dry_run: parse(&id, "dry_run", &row.text("dry_run")?)?,
        policy_sha256: row.text("policy_sha256")?,
        status,
        created_at: row.int("created_at")?,
        expires_at: row.int("expires_at")?,
        decided_by: row.text_or_null("decided_by")?,
        decided_at: row.int_or_null("decided_at")?,
        decision_reason: row.text_or_null("decision_reason")?,
        used_at: row.int_or_null("used_at")?,
        result: row
            .text_or_null("result")?
            .map(|text| parse(&id, "result", &text))
            .transpose()?,
        id,
    })
}
