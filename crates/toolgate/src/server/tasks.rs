//! Calls held for a person, as tasks (issue 14; MCP tasks extension `io.modelcontextprotocol/tasks`,
//! SEP-2663): a 2026-07-28 client that declared the extension gets a task for a call that waits
//! for an approval, instead of a call held open for the policy's wait and then a pending answer.
//!
//! The task is a row in `toolgate.db` beside its approval (`toolgate_store::tasks`), so it
//! survives a restart, and it holds no decision of its own: each `tasks/get` of a working task
//! walks the same call through the corridor again, unheld. While the approval is pending that
//! answers pending (the task stays `working`); once a person approved, the first walk consumes
//! the approval and runs the call, exactly once whoever polls (the approval queue's rule, a
//! repeat replays the stored answer); a denial or an expiry is the call's answer like any other.
//! The first end written stands: `completed` with the call's result (an `isError` one included),
//! or `failed` with a JSON-RPC error the corridor answered. `tasks/cancel` ends a working task as
//! `cancelled`: nothing runs for it afterwards, and its approval stays for people to see.
//!
//! Ids start with [`PREFIX`] and are 128 random bits, so they never collide with the ids the
//! gateway mints for upstream tasks; an id that is another principal's reads as unknown, exactly
//! as one that never existed.

use std::time::Duration;

use rmcp::ErrorData;
use rmcp::RoleServer;
use rmcp::model::{
    CallToolResponse, CreateTaskResult, DetailedTask, GetTaskResult, JsonObject, ResultType, Task,
    TaskPayload, TaskStatus,
};
use rmcp::service::RequestContext;
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;
use toolgate_core::answer::Kind;
use toolgate_core::time::{now_ms, rfc3339};
use toolgate_store::tasks::{self as store, NewTask, TaskStore};

use super::{GateServer, caller, is_modern};
use crate::corridor::{CallState, Corridor, Gate};

/// What every id of a task held for a person starts with.
pub(super) const PREFIX: &str = "tgt_";
/// How long a task is kept after it was handed out: time for a person to decide (the policy's
/// `approval_ttl`) and for the client to come back after that.
const KEPT: Duration = Duration::from_secs(24 * 3600);
/// How often a client is asked to poll.
const POLL_MS: u64 = 1000;

/// The task store, when a server behind `gate` hands out tasks for held calls: it has an
/// approval queue, and under its policy some call may wait for a person.
pub(super) fn offered(gate: &Gate) -> Option<TaskStore> {
    gate.approvals()
        .filter(|_| gate.policy().may_need_approval())
        .map(TaskStore::beside)
}

/// [`offered`] as last decided, and the policy it was decided under (a reload may change it).
#[derive(Debug)]
pub(super) struct Offered {
    policy_sha256: String,
    store: Option<TaskStore>,
}

impl Offered {
    pub(super) fn new(gate: &Gate) -> Self {
        Self {
            policy_sha256: gate.policy().sha256().to_owned(),
            store: offered(gate),
        }
    }
}

impl GateServer {
    /// The task store, when this server hands out tasks for held calls ([`offered`]) under the
    /// policy in force: decided once per policy, not on every call.
    pub(super) fn approval_tasks(&self) -> Option<TaskStore> {
        let gate = self.gate.current();
        let mut offered = crate::lock(&self.tasks);
        if offered.policy_sha256 != gate.policy().sha256() {
            *offered = Offered::new(&gate);
        }
        offered.store.clone()
    }

    /// [`Self::approval_tasks`] for a request whose caller can take a task: a 2026-07-28 request
    /// that declared the extension.
    pub(super) fn approval_tasks_for(
        &self,
        context: &RequestContext<RoleServer>,
    ) -> Option<TaskStore> {
        let declared = context
            .client_capabilities()
            .is_some_and(|capabilities| capabilities.supports_tasks());
        (is_modern(context) && declared)
            .then(|| self.approval_tasks())
            .flatten()
    }

    /// The task a held call becomes: recorded first, so that `tasks/get` finds it as soon as the
    /// client has the id.
    pub(super) async fn hand_out_task(
        &self,
        store: &TaskStore,
        gate: &Gate,
        tool: &str,
        arguments: Map<String, Value>,
        approval_id: &str,
    ) -> Result<CallToolResponse, ErrorData> {
        let id = format!("{PREFIX}{}", crate::random_hex(16).map_err(unavailable)?);
        let now = now_ms();
        let kept = i64::try_from(KEPT.as_millis()).unwrap_or(i64::MAX);
        let new = NewTask {
            id,
            principal: gate.principal().sub.clone(),
            tool: tool.to_owned(),
            arguments,
            approval_id: approval_id.to_owned(),
            expires_at: now.saturating_add(kept),
        };
        let row = store.create(&new, now).await.map_err(unavailable)?;
        tracing::info!(task = %row.id, approval = %approval_id, tool, "held call handed out as a task");
        let mut result = CreateTaskResult::new(task_of(&row));
        result.meta = Some(self.meta.clone());
        Ok(CallToolResponse::Task(result))
    }

    /// `tasks/get` of a task held for a person: as it stands, after walking its call once more if
    /// it is still working.
    pub(super) async fn get_approval_task(
        &self,
        id: &str,
        context: &RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        let (store, gate) = self.task_owner(context, id)?;
        let principal = gate.principal().sub.clone();
        let row = store
            .get(id, &principal, now_ms())
            .await
            .map_err(unavailable)?
            .ok_or_else(|| unknown(id))?;
        let row = if row.status == store::TaskStatus::Working {
            self.advance(&store, &gate, row, context).await?
        } else {
            row
        };
        let mut result = GetTaskResult::new(detailed(&row));
        result.meta = Some(self.meta.clone());
        Ok(result)
    }

    /// `tasks/cancel`: a working task ends `cancelled`; an ended one stays as it ended.
    pub(super) async fn cancel_approval_task(
        &self,
        id: &str,
        context: &RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let (store, gate) = self.task_owner(context, id)?;
        let principal = gate.principal().sub.clone();
        store
            .get(id, &principal, now_ms())
            .await
            .map_err(unavailable)?
            .ok_or_else(|| unknown(id))?;
        let row = store
            .finish(id, &principal, store::TaskStatus::Cancelled, None, now_ms())
            .await
            .map_err(unavailable)?;
        tracing::info!(task = %id, status = %row.status, "task cancelled by its caller");
        Ok(())
    }

    /// The store and the caller's gate for a `tasks/*` request about task `id`.
    fn task_owner(
        &self,
        context: &RequestContext<RoleServer>,
        id: &str,
    ) -> Result<(TaskStore, Gate), ErrorData> {
        let store = self
            .approval_tasks()
            .filter(|_| is_modern(context))
            .ok_or_else(|| unknown(id))?;
        Ok((store, self.gate_for(context).into_owned()))
    }

    /// Walks a working task's call through the corridor again, unheld, and ends the task when the
    /// call has an answer other than "still waiting".
    async fn advance(
        &self,
        store: &TaskStore,
        gate: &Gate,
        row: store::Task,
        context: &RequestContext<RoleServer>,
    ) -> Result<store::Task, ErrorData> {
        let corridor = Corridor::new(gate, self.toolset.as_ref(), &row.tool);
        let call = CallState::new(
            &row.tool,
            row.arguments.clone(),
            CancellationToken::new(),
            self.shutdown.clone(),
        )
        .with_caller(caller(context, (None, None)), None)
        .with_detail("task_id", Value::from(row.id.as_str()))
        .unheld();
        let outcome = corridor.call_for_outcome(call).await;
        // Still waiting: for the person, for a rate limit's window, for another copy's run.
        if matches!(
            outcome.kind,
            Kind::Pending | Kind::RateLimited | Kind::InFlight
        ) {
            return Ok(row);
        }
        let (status, value) = match outcome.response {
            Ok(CallToolResponse::Complete(mut result)) => {
                result.result_type = Some(ResultType::COMPLETE);
                let value = serde_json::to_value(&result).unwrap_or(Value::Null);
                (store::TaskStatus::Completed, value)
            }
            Ok(_) => (
                store::TaskStatus::Failed,
                json!({"code": -32603, "message": "the call answered with neither a result nor an error"}),
            ),
            Err(error) => (
                store::TaskStatus::Failed,
                serde_json::to_value(&error).unwrap_or(Value::Null),
            ),
        };
        let principal = gate.principal().sub.clone();
        store
            .finish(&row.id, &principal, status, Some(&value), now_ms())
            .await
            .map_err(unavailable)
    }
}

/// The extension's task object of a row.
fn task_of(row: &store::Task) -> Task {
    let status = match row.status {
        store::TaskStatus::Working => TaskStatus::Working,
        store::TaskStatus::Completed => TaskStatus::Completed,
        store::TaskStatus::Failed => TaskStatus::Failed,
        store::TaskStatus::Cancelled => TaskStatus::Cancelled,
    };
    let mut task = Task::new(
        row.id.clone(),
        status,
        rfc3339(row.created_at),
        rfc3339(row.updated_at),
    )
    .with_ttl_ms(u64::try_from(row.expires_at - row.created_at).unwrap_or(0))
    .with_poll_interval_ms(POLL_MS);
    if row.status == store::TaskStatus::Working {
        task = task.with_status_message(format!(
            "waiting for a person to decide approval {} (toolgate approvals show {})",
            row.approval_id, row.approval_id
        ));
    }
    task
}

/// The row with its payload, as `tasks/get` answers it.
fn detailed(row: &store::Task) -> DetailedTask {
    let object = || match &row.outcome {
        Some(Value::Object(map)) => map.clone(),
        _ => JsonObject::new(),
    };
    let payload = match row.status {
        store::TaskStatus::Working => TaskPayload::Working,
        store::TaskStatus::Completed => TaskPayload::Completed { result: object() },
        store::TaskStatus::Failed => TaskPayload::Failed { error: object() },
        store::TaskStatus::Cancelled => TaskPayload::Cancelled,
    };
    DetailedTask::new(task_of(row), payload)
}

/// The answer to an id that is not the caller's task, whatever the reason.
fn unknown(id: &str) -> ErrorData {
    ErrorData::invalid_params(format!("unknown task: {id}"), None)
}

/// The task store did not answer: nothing is claimed about the task.
fn unavailable(error: impl std::fmt::Display) -> ErrorData {
    tracing::error!(error = %error, "task store unavailable");
    ErrorData::internal_error("the task store did not answer", None)
}
