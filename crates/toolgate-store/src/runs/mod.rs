//! The agents' runs: what `toolgate agent` needs to pause a run while a person decides, end the
//! process, and resume it later, or after a crash, from where it stood.
//!
//! Owns the `agent_runs` table of `toolgate.db`, the same file as the approval queue, so a run and
//! the approval it waits for live and are backed up together. A run's `state` is opaque JSON to
//! this module (the agent loop's conversation and counters); what the store enforces is the
//! life cycle: a run is created once, a finished or aborted run never changes again, and a paused
//! run names the approval it waits for. Who may drive a run at a time is not the database's job:
//! the loop holds an exclusive lock on a file per run, which the kernel releases when the process
//! dies, so a run killed mid-step can be resumed at once.

#[cfg(test)]
mod tests;

use std::path::Path;

use serde_json::Value;

use crate::db::{Db, Location, on_db};
use crate::error::StoreError;

/// Where a run stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// Being driven, or cut off by a crash while it was (resume it).
    Running,
    /// Waiting for a person's decision on an approval (resume it after the decision).
    Paused,
    /// The model gave its final answer.
    Finished,
    /// Ended by the loop's own rules (too many steps, a failed verification); final.
    Aborted,
    /// The model could not be reached; resumable once it can.
    Failed,
}

impl RunStatus {
    /// The name stored and shown.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Paused => "paused",
            Self::Finished => "finished",
            Self::Aborted => "aborted",
            Self::Failed => "failed",
        }
    }

    /// Whether the run can never go on.
    #[must_use]
    pub fn is_final(self) -> bool {
        matches!(self, Self::Finished | Self::Aborted)
    }

    fn parse(id: &str, text: &str) -> Result<Self, StoreError> {
        Ok(match text {
            "running" => Self::Running,
            "paused" => Self::Paused,
            "finished" => Self::Finished,
            "aborted" => Self::Aborted,
            "failed" => Self::Failed,
            other => {
                return Err(StoreError::RunCorrupt {
                    id: id.to_owned(),
                    reason: format!("unknown status {other:?}"),
                });
            }
        })
    }
}

/// One run as stored.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Run {
    /// The run's id (`run_id` in its events).
    pub id: String,
    /// The agent's principal, `agent:NAME`.
    pub agent: String,
    /// Where it stands.
    pub status: RunStatus,
    /// The approval a paused run waits for.
    pub approval_id: Option<String>,
    /// The task as the user gave it.
    pub input: String,
    /// The loop's state to resume from.
    pub state: Value,
    /// Model steps taken.
    pub steps: u32,
    /// The final answer, or why the run was aborted or failed.
    pub outcome: Option<String>,
    /// When it was created and last saved (unix milliseconds).
    pub created_at: i64,
    /// When it was last saved (unix milliseconds).
    pub updated_at: i64,
}

/// What a save writes: where the run stands now.
#[derive(Clone, Copy, Debug)]
pub struct Progress<'a> {
    /// The new status.
    pub status: RunStatus,
    /// The approval waited for (only with [`RunStatus::Paused`]).
    pub approval_id: Option<&'a str>,
    /// The loop's state.
    pub state: &'a Value,
    /// Model steps taken.
    pub steps: u32,
    /// The final answer, or why it stopped.
    pub outcome: Option<&'a str>,
}

/// The runs in the shared database (SQLite or PostgreSQL); cheap to clone.
#[derive(Clone, Debug)]
pub struct RunStore {
    db: Db,
}

/// What a run store on the in-memory backend answers: a paused run must outlive its process.
fn in_memory() -> StoreError {
    StoreError::NotInMemory { what: "agent runs" }
}

type Row = (
    String,
    String,
    String,
    Option<String>,
    String,
    String,
    i64,
    Option<String>,
    i64,
    i64,
);

/// A `SELECT` of every column of [`Row`] from `agent_runs`, followed by `$rest` (sqlx takes only
/// literal SQL).
macro_rules! select {
    ($rest:literal) => {
        concat!(
            "SELECT id, agent, status, approval_id, input, state, steps, outcome, created_at, ",
            "updated_at FROM agent_runs ",
            $rest
        )
    };
}

impl RunStore {
    /// Opens (creating if needed) `dir/toolgate.db` with a connection of its own.
    ///
    /// # Errors
    /// The directory or database cannot be used, or was written by a newer toolgate.
    pub async fn open(dir: &Path) -> Result<Self, StoreError> {
        Ok(Self {
            db: Location::Dir(dir.to_owned()).open().await?,
        })
    }

    /// The run store over the approval queue's connections.
    #[must_use]
    pub fn beside(approvals: &crate::approval::ApprovalStore) -> Self {
        Self {
            db: approvals.db().clone(),
        }
    }

    /// Creates run `id` of `agent` for `input`, running, with its first `state`.
    ///
    /// # Errors
    /// [`StoreError::RunExists`]: a run with this id exists; otherwise the database did not answer.
    pub async fn create(
        &self,
        id: &str,
        agent: &str,
        input: &str,
        state: &Value,
        now: i64,
    ) -> Result<Run, StoreError> {
        let inserted = on_db!(
            &self.db,
            |pool| {
                sqlx::query(
            "INSERT INTO agent_runs (id, agent, status, input, state, steps, created_at, updated_at)
             VALUES ($1, $2, 'running', $3, $4, 0, $5, $5) ON CONFLICT (id) DO NOTHING",
        )
        .bind(id)
        .bind(agent)
        .bind(input)
        .bind(state.to_string())
        .bind(now)
        .execute(pool)
        .await
        .map_err(StoreError::query("cannot create the run"))?
        .rows_affected()
            },
            |_tables| return Err(in_memory()),
        );
        if inserted == 0 {
            return Err(StoreError::RunExists { id: id.to_owned() });
        }
        self.get(id).await?.ok_or_else(|| StoreError::RunCorrupt {
            id: id.to_owned(),
            reason: "it vanished after it was created".to_owned(),
        })
    }

    /// Saves where run `id` stands. A run already finished or aborted is not changed: `Ok(false)`.
    ///
    /// # Errors
    /// The database did not answer; the save may or may not have happened.
    pub async fn save(
        &self,
        id: &str,
        progress: Progress<'_>,
        now: i64,
    ) -> Result<bool, StoreError> {
        let approval = progress
            .approval_id
            .filter(|_| progress.status == RunStatus::Paused);
        let saved = on_db!(
            &self.db,
            |pool| {
                sqlx::query(
            "UPDATE agent_runs
             SET status = $2, approval_id = $3, state = $4, steps = $5, outcome = $6, updated_at = $7
             WHERE id = $1 AND status NOT IN ('finished', 'aborted')",
        )
        .bind(id)
        .bind(progress.status.as_str())
        .bind(approval)
        .bind(progress.state.to_string())
        .bind(i64::from(progress.steps))
        .bind(progress.outcome)
        .bind(now)
        .execute(pool)
        .await
        .map_err(StoreError::query("cannot save the run"))?
        .rows_affected()
            },
            |_tables| return Err(in_memory()),
        );
        Ok(saved == 1)
    }

    /// Run `id`, if there is one.
    ///
    /// # Errors
    /// The database did not answer, or the row cannot be read.
    pub async fn get(&self, id: &str) -> Result<Option<Run>, StoreError> {
        let row: Option<Row> = on_db!(
            &self.db,
            |pool| sqlx::query_as(select!("WHERE id = $1"))
                .bind(id)
                .fetch_optional(pool)
                .await
                .map_err(StoreError::query("cannot read the run"))?,
            |_tables| return Err(in_memory()),
        );
        row.map(from_row).transpose()
    }

    /// The newest `limit` runs, newest first.
    ///
    /// # Errors
    /// The database did not answer, or a row cannot be read.
    pub async fn list(&self, limit: u32) -> Result<Vec<Run>, StoreError> {
        let rows: Vec<Row> = on_db!(
            &self.db,
            |pool| sqlx::query_as(select!("ORDER BY seq DESC LIMIT $1"))
                .bind(i64::from(limit))
                .fetch_all(pool)
                .await
                .map_err(StoreError::query("cannot list the runs"))?,
            |_tables| return Err(in_memory()),
        );
        rows.into_iter().map(from_row).collect()
    }
}

fn from_row(row: Row) -> Result<Run, StoreError> {
    let (id, agent, status, approval_id, input, state, steps, outcome, created_at, updated_at) =
        row;
    let state = serde_json::from_str(&state).map_err(|e| StoreError::RunCorrupt {
        id: id.clone(),
        reason: format!("unreadable state: {e}"),
    })?;
    Ok(Run {
        status: RunStatus::parse(&id, &status)?,
        steps: u32::try_from(steps).unwrap_or(u32::MAX),
        id,
        agent,
        approval_id,
        input,
        state,
        outcome,
        created_at,
        updated_at,
    })
}
