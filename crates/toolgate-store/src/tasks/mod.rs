//! Calls held for a person that became tasks (MCP tasks extension, SEP-2663; issue 14): instead
//! of holding a `tools/call` open while a person decides, the server hands a client that declared
//! the extension a task, and the client polls `tasks/get`. The task is a row here, beside the
//! approval it waits for, so it survives a restart of the server.
//!
//! Owns the `approval_tasks` table and its rules: a task belongs to the principal that made the
//! call (another principal's id reads as unknown), it ends once (the first end written stands:
//! `completed` with the call's result, `failed` with a JSON-RPC error, or `cancelled`), and an
//! ended task keeps no arguments. It does not decide anything about the call: running it is the
//! corridor's, under the approval, exactly once (the approval queue's rule), whoever polls first.

#[cfg(test)]
mod tests;

use std::fmt;

use crate::db::{Db, on_db};
use crate::error::StoreError;
use serde_json::Value;

/// Where a task is in its life (the extension's statuses but `input_required`, which a task that
/// waits for a person never needs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskStatus {
    /// The call waits for its approval (or is running).
    Working,
    /// The call ended with a result (an `isError` one included: a denial is a result).
    Completed,
    /// The call ended with a JSON-RPC error.
    Failed,
    /// The caller cancelled the task before it ended.
    Cancelled,
}

impl TaskStatus {
    /// The name stored and sent.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Working => "working",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }

    fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "working" => Self::Working,
            "completed" => Self::Completed,
            "failed" => Self::Failed,
            "cancelled" => Self::Cancelled,
            _ => return None,
        })
    }
}

impl fmt::Display for TaskStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A task as the server opens it.
#[derive(Clone, Debug, PartialEq)]
pub struct NewTask {
    /// The id handed to the client (the server makes it unguessable).
    pub id: String,
    /// The principal that made the call: the only one that may follow the task.
    pub principal: String,
    /// The tool called.
    pub tool: String,
    /// The call's arguments, as sent: what runs once the approval is granted.
    pub arguments: serde_json::Map<String, Value>,
    /// The approval the call waits for.
    pub approval_id: String,
    /// When the task is forgotten (unix milliseconds).
    pub expires_at: i64,
}

/// A task as it stands.
#[derive(Clone, Debug, PartialEq)]
pub struct Task {
    /// Its id.
    pub id: String,
    /// As in [`NewTask::principal`].
    pub principal: String,
    /// As in [`NewTask::tool`].
    pub tool: String,
    /// As in [`NewTask::arguments`]; empty once the task ended.
    pub arguments: serde_json::Map<String, Value>,
    /// As in [`NewTask::approval_id`].
    pub approval_id: String,
    /// Where it is.
    pub status: TaskStatus,
    /// The result (completed) or the error (failed).
    pub outcome: Option<Value>,
    /// When it was opened (unix milliseconds).
    pub created_at: i64,
    /// When its status last changed.
    pub updated_at: i64,
    /// As in [`NewTask::expires_at`].
    pub expires_at: i64,
}

/// The tasks in the shared database (SQLite or PostgreSQL); cheap to clone.
#[derive(Clone, Debug)]
pub struct TaskStore {
    db: Db,
}

/// What a task store on the in-memory backend answers: tasks outlive a restart, memory does not.
fn in_memory() -> StoreError {
    StoreError::NotInMemory { what: "tasks" }
}

impl TaskStore {
    /// The task store over the approval queue's database and connections.
    #[must_use]
    pub fn beside(approvals: &crate::approval::ApprovalStore) -> Self {
        Self {
            db: approvals.db().clone(),
        }
    }

    /// Records a new working task (durable when this returns: the client may poll at once), and
    /// forgets the tasks past their time.
    ///
    /// # Errors
    /// The database could not answer (then there is no task, and the call must not say there is).
    pub async fn create(&self, new: &NewTask, now: i64) -> Result<Task, StoreError> {
        on_db!(
            &self.db,
            |pool| {
                sqlx::query("DELETE FROM approval_tasks WHERE expires_at <= $1")
                    .bind(now)
                    .execute(pool)
                    .await
                    .map_err(StoreError::query("cannot forget expired tasks"))?;
                sqlx::query(
            "INSERT INTO approval_tasks (id, principal, tool, arguments, approval_id, status,
                 created_at, updated_at, expires_at)
             VALUES ($1, $2, $3, $4, $5, 'working', $6, $6, $7)",
        )
        .bind(&new.id)
        .bind(&new.principal)
        .bind(&new.tool)
        .bind(Value::Object(new.arguments.clone()).to_string())
        .bind(&new.approval_id)
        .bind(now)
        .bind(new.expires_at)
        .execute(pool)
        .await
        .map_err(StoreError::query("cannot record the task"))?;
            },
            |_tables| return Err(in_memory()),
        );
        Ok(Task {
            id: new.id.clone(),
            principal: new.principal.clone(),
            tool: new.tool.clone(),
            arguments: new.arguments.clone(),
            approval_id: new.approval_id.clone(),
            status: TaskStatus::Working,
            outcome: None,
            created_at: now,
            updated_at: now,
            expires_at: new.expires_at,
        })
    }

    /// Task `id` if it is `principal`'s and not past its time; `None` otherwise (unknown, another
    /// principal's, or forgotten: the same answer for each).
    ///
    /// # Errors
    /// The database could not answer.
    pub async fn get(
        &self,
        id: &str,
        principal: &str,
        now: i64,
    ) -> Result<Option<Task>, StoreError> {
        let row: Option<Row> = on_db!(
            &self.db,
            |pool| sqlx::query_as(
                "SELECT id, principal, tool, arguments, approval_id, status, outcome, created_at,
                    updated_at, expires_at
             FROM approval_tasks WHERE id = $1 AND principal = $2 AND expires_at > $3",
            )
            .bind(id)
            .bind(principal)
            .bind(now)
            .fetch_optional(pool)
            .await
            .map_err(StoreError::query("cannot read the task"))?,
            |_tables| return Err(in_memory()),
        );
        row.map(decode).transpose()
    }

    /// Ends working task `id` with `status` (completed, failed or cancelled) and its `outcome`,
    /// clearing its arguments; a task that already ended keeps the end it had. Returns the task
    /// as it now stands.
    ///
    /// # Errors
    /// The database could not answer, or the task is gone.
    pub async fn finish(
        &self,
        id: &str,
        principal: &str,
        status: TaskStatus,
        outcome: Option<&Value>,
        now: i64,
    ) -> Result<Task, StoreError> {
        on_db!(
            &self.db,
            |pool| {
                sqlx::query(
            "UPDATE approval_tasks SET status = $3, outcome = $4, arguments = '{}', updated_at = $5
             WHERE id = $1 AND principal = $2 AND status = 'working'",
        )
        .bind(id)
        .bind(principal)
        .bind(status.as_str())
        .bind(outcome.map(Value::to_string))
        .bind(now)
        .execute(pool)
        .await
        .map_err(StoreError::query("cannot end the task"))
        .map(drop)?
            },
            |_tables| return Err(in_memory()),
        );
        self.get(id, principal, now)
            .await?
            .ok_or_else(|| StoreError::NoTask { id: id.to_owned() })
    }
}

type Row = (
    String,
    String,
    String,
    String,
    String,
    String,
    Option<String>,
    i64,
    i64,
    i64,
);

fn decode(row: Row) -> Result<Task, StoreError> {
    let (id, principal, tool, arguments, approval_id, status, outcome, created, updated, expires) =
        row;
    let corrupt = |column: &'static str, reason: String| StoreError::Corrupt {
        id: id.clone(),
        column,
        reason,
    };
    let arguments = match serde_json::from_str(&arguments) {
        Ok(Value::Object(map)) => map,
        Ok(other) => return Err(corrupt("arguments", format!("not an object: {other}"))),
        Err(e) => return Err(corrupt("arguments", e.to_string())),
    };
    let status = TaskStatus::parse(&status)
        .ok_or_else(|| corrupt("status", format!("unknown {status:?}")))?;
    let outcome = outcome
        .map(|text| serde_json::from_str(&text).map_err(|e| corrupt("outcome", e.to_string())))
        .transpose()?;
    Ok(Task {
        id,
        principal,
        tool,
        arguments,
        approval_id,
        status,
        outcome,
        created_at: created,
        updated_at: updated,
        expires_at: expires,
    })
}
