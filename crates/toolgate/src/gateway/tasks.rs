//! Tasks through the gateway (MCP tasks extension `io.modelcontextprotocol/tasks`, SEP-2663):
//! which caller each upstream task was handed to, and `tasks/get`, `tasks/update` and
//! `tasks/cancel` forwarded to the upstream that runs it.
//!
//! A call becomes a task only after the corridor let it run (visibility, tiers, approval, key),
//! and only for a 2026-07-28 caller that declared the extension on that request
//! ([`super::relay::offered`]). Each task gets a name of the gateway's own, 128 random bits,
//! mapped here to the upstream and its id: two upstreams cannot collide on an id, an upstream
//! cannot name another's task, and an id the gateway did not hand to this principal is answered
//! exactly as one that never existed (-32602, nothing sent upstream), so the map is no oracle
//! across callers. The map lives in memory, bounded in size and by each task's `ttlMs`: a
//! restarted gateway follows none of the tasks it handed out before, and says so ("unknown task").
//!
//! What comes back is treated as the call's own answer would be: a completed task's result is
//! cleaned exactly as a tool result (`corridor::clean_tool_result`), a failed task's error
//! redacted as an upstream's error, and the questions of an `input_required` task pass under the
//! same per-upstream `[passthrough] sampling / elicitation / roots` rules as MRTR questions, each
//! audited once. A question the policy or the caller refuses ends the task: the gateway cancels
//! it upstream and reports it failed, since the upstream cannot go on without the answer. The
//! end of each task (completed, failed, cancelled), as the gateway first sees it, is audited once
//! under the task's id, after the `tools/call` record that said it began (allow / in_doubt); a
//! `tasks/cancel` is audited when it is forwarded.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use rmcp::ErrorData;
use rmcp::model::{
    CallToolResult, CancelTaskParams, CancelTaskRequest, ClientRequest, CreateTaskResult,
    DetailedTask, GetTaskParams, GetTaskRequest, GetTaskResult, JsonObject, ServerResult, Task,
    TaskPayload, UpdateTaskParams, UpdateTaskRequest,
};
use serde_json::{Value, json};
use tokio::time::Instant;
use toolgate_core::audit::{Decision, Outcome};
use toolgate_core::redact::Echoes;

use super::Gateway;
use super::held::random_name;
use super::passthrough::unexpected;
use super::relay::{self, Asker};
use super::upstream::Upstream;
use crate::corridor::answer::{Executed, tool_error};
use crate::corridor::{Gate, clean_tool_result, from_upstream};
use crate::lock;
use crate::toolset::Caller;

/// At most this many tasks are followed at once; past it the one closest to its expiry is
/// forgotten first (its caller then gets "unknown task").
const MAX_TASKS: usize = 10_000;
/// How long a task the upstream gives no `ttlMs` (unlimited) is followed.
const LONGEST: Duration = Duration::from_secs(24 * 3600);
/// The policy rule every task record names.
const RULE: &str = "passthrough.tasks";

/// The tasks handed out, by the gateway's name for them.
#[derive(Debug, Default)]
pub(super) struct Tasks {
    entries: Mutex<HashMap<String, Entry>>,
}

/// One task handed to a caller.
#[derive(Clone, Debug)]
struct Entry {
    upstream: usize,
    /// The upstream's own id of the task.
    own_id: String,
    /// The tool as the caller named it.
    tool: String,
    /// The principal it was handed to: the only one that may follow it.
    principal: String,
    /// The call's `request_id` and `args_digest`, which every record of the task repeats.
    label: String,
    digest: String,
    /// The call's own strings, which its result may repeat unredacted (as a call's result may).
    echoes: Echoes,
    expires: Instant,
    /// Its end was recorded.
    ended: bool,
    /// The keys of its questions already checked and audited.
    asked: HashSet<String>,
    /// Ended by the gateway (a question it could not pass): what it answers from now on.
    closed: Option<TaskPayload>,
}

/// What the gateway knows of a call that may become a task, taken before its arguments are
/// handed to the upstream.
#[derive(Debug)]
pub(super) struct Origin {
    pub(super) upstream: usize,
    pub(super) tool: String,
    pub(super) principal: String,
    pub(super) label: String,
    pub(super) digest: String,
    pub(super) echoes: Echoes,
}

impl Tasks {
    /// Follows `task` for the caller of `origin`, under a name of the gateway's own, which the
    /// returned task carries.
    pub(super) fn hand_out(&self, origin: Origin, mut task: CreateTaskResult) -> CreateTaskResult {
        let now = Instant::now();
        let ttl = task
            .task
            .ttl_ms
            .map_or(LONGEST, Duration::from_millis)
            .min(LONGEST);
        let name = random_name();
        let entry = Entry {
            upstream: origin.upstream,
            own_id: std::mem::replace(&mut task.task.task_id, name.clone()),
            tool: origin.tool,
            principal: origin.principal,
            label: origin.label,
            digest: origin.digest,
            echoes: origin.echoes,
            expires: now + ttl,
            ended: false,
            asked: HashSet::new(),
            closed: None,
        };
        let mut entries = lock(&self.entries);
        entries.retain(|_, e| e.expires > now);
        if entries.len() >= MAX_TASKS
            && let Some(oldest) = entries
                .iter()
                .min_by_key(|(_, e)| e.expires)
                .map(|(k, _)| k.clone())
        {
            tracing::warn!(
                limit = MAX_TASKS,
                "too many tasks followed; the one closest to expiry is forgotten"
            );
            entries.remove(&oldest);
        }
        entries.insert(name, entry);
        task
    }

    /// The task `id` if it was handed to `principal` and has not expired; otherwise the answer
    /// to a task that does not exist.
    fn find(&self, id: &str, principal: &str) -> Result<Entry, ErrorData> {
        let mut entries = lock(&self.entries);
        match entries.get(id) {
            Some(entry) if entry.expires <= Instant::now() => {
                entries.remove(id);
            }
            Some(entry) if entry.principal == principal => return Ok(entry.clone()),
            _ => {}
        }
        Err(unknown(id))
    }

    /// Whether `id` is followed for `principal`.
    pub(super) fn knows(&self, principal: &str, id: &str) -> bool {
        self.find(id, principal).is_ok()
    }

    /// Marks the task's end recorded; false when it already was (by a concurrent `tasks/get`).
    fn end(&self, id: &str) -> bool {
        lock(&self.entries)
            .get_mut(id)
            .is_some_and(|e| !std::mem::replace(&mut e.ended, true))
    }

    /// Undoes [`Tasks::end`] when the record could not be written, so a later look tries again.
    fn unend(&self, id: &str) {
        if let Some(entry) = lock(&self.entries).get_mut(id) {
            entry.ended = false;
        }
    }

    /// The question keys of `keys` not checked before, now noted as checked.
    fn new_questions(&self, id: &str, keys: impl Iterator<Item = String>) -> HashSet<String> {
        let mut entries = lock(&self.entries);
        let Some(entry) = entries.get_mut(id) else {
            return HashSet::new();
        };
        keys.filter(|k| entry.asked.insert(k.clone())).collect()
    }

    fn close(&self, id: &str, payload: TaskPayload) {
        if let Some(entry) = lock(&self.entries).get_mut(id) {
            entry.closed = Some(payload);
        }
    }
}

/// The answer to a task id the caller was not handed (rmcp's `TaskManager` words it the same).
fn unknown(id: &str) -> ErrorData {
    ErrorData::invalid_params(format!("unknown task: {id}"), None)
}

impl Gateway {
    /// `tasks/get`: the upstream's state of the task, cleaned, under the gateway's name for it.
    pub(super) async fn get_task(
        &self,
        params: GetTaskParams,
        caller: Caller,
        gate: Gate,
    ) -> Result<GetTaskResult, ErrorData> {
        let id = params.task_id.clone();
        let entry = self.inner.tasks.find(&id, &gate.principal().sub)?;
        let upstream = &self.inner.upstreams[entry.upstream];
        if let Some(payload) = entry.closed.clone() {
            return Ok(closed(&id, payload));
        }
        let asker = asker(caller, &gate, &entry);
        let mut own = params;
        own.task_id.clone_from(&entry.own_id);
        let request = ClientRequest::GetTaskRequest(GetTaskRequest::new(own));
        let ServerResult::GetTaskResult(mut result) =
            upstream.request(request, Some(&asker)).await?
        else {
            return Err(unexpected(upstream, "tasks/get"));
        };
        let task = &mut result.task;
        task.task.task_id.clone_from(&id);
        if let Some(message) = task.task.status_message.as_mut() {
            *message = gate.redactor().redact(message).into_owned();
        }
        let outcome = match &mut task.payload {
            TaskPayload::Working => None,
            TaskPayload::InputRequired { input_requests } => {
                let keys = input_requests.keys().cloned();
                let fresh = self.inner.tasks.new_questions(&id, keys);
                for (key, question) in input_requests.iter() {
                    if !fresh.contains(key) {
                        continue;
                    }
                    if let Err(refused) = self.check_question(upstream, &asker, question).await {
                        return self
                            .fail(upstream, &gate, &asker, &entry, &id, refused)
                            .await;
                    }
                }
                None
            }
            TaskPayload::Completed { result } => Some(self.clean(upstream, &gate, &entry, result)),
            TaskPayload::Failed { error } => {
                *error = redact_error(&gate, error);
                Some(Outcome::Failed)
            }
            TaskPayload::Cancelled => Some(Outcome::Cancelled),
            _ => None,
        };
        if let Some(outcome) = outcome
            && self.inner.tasks.end(&id)
            && let Err(unavailable) =
                record(&gate, upstream, &entry, &id, "tasks/get", outcome).await
        {
            self.inner.tasks.unend(&id);
            return Err(ErrorData::internal_error(unavailable.to_string(), None));
        }
        Ok(result)
    }

    /// `tasks/update`: the caller's answers, to the upstream that asked.
    pub(super) async fn update_task(
        &self,
        params: UpdateTaskParams,
        caller: Caller,
        gate: Gate,
    ) -> Result<(), ErrorData> {
        let entry = self
            .inner
            .tasks
            .find(&params.task_id, &gate.principal().sub)?;
        if entry.closed.is_some() {
            return Err(ErrorData::invalid_params(
                format!("task {} has ended", params.task_id),
                None,
            ));
        }
        let upstream = &self.inner.upstreams[entry.upstream];
        let asker = asker(caller, &gate, &entry);
        let mut own = params;
        own.task_id.clone_from(&entry.own_id);
        let request = ClientRequest::UpdateTaskRequest(UpdateTaskRequest::new(own));
        ack(
            upstream,
            upstream.request(request, Some(&asker)).await?,
            "tasks/update",
        )
    }

    /// `tasks/cancel`: forwarded and audited (allow / cancelled once the upstream took it,
    /// allow / failed when it refused).
    pub(super) async fn cancel_task(
        &self,
        params: CancelTaskParams,
        caller: Caller,
        gate: Gate,
    ) -> Result<(), ErrorData> {
        let id = params.task_id.clone();
        let entry = self.inner.tasks.find(&id, &gate.principal().sub)?;
        if entry.closed.is_some() {
            return Ok(());
        }
        let upstream = &self.inner.upstreams[entry.upstream];
        let asker = asker(caller, &gate, &entry);
        let mut own = params;
        own.task_id.clone_from(&entry.own_id);
        let request = ClientRequest::CancelTaskRequest(CancelTaskRequest::new(own));
        let answer = upstream.request(request, Some(&asker)).await;
        let outcome = if answer.is_ok() {
            Outcome::Cancelled
        } else {
            Outcome::Failed
        };
        if let Err(unavailable) =
            record(&gate, upstream, &entry, &id, "tasks/cancel", outcome).await
        {
            tracing::error!(task = %id, error = %unavailable, "tasks/cancel sent but not recorded");
        }
        ack(upstream, answer?, "tasks/cancel")
    }

    /// A question of the task, under the policy for its kind from this upstream and the
    /// caller's declared capabilities; audited either way.
    async fn check_question(
        &self,
        upstream: &Upstream,
        asker: &Asker,
        question: &rmcp::model::InputRequest,
    ) -> Result<(), ErrorData> {
        let Some(kind) = relay::kind_of(question) else {
            return Err(ErrorData::internal_error(
                format!(
                    "upstream {} asked the caller something the gateway does not know",
                    upstream.name()
                ),
                None,
            ));
        };
        match relay::passes(asker, upstream.name(), kind) {
            Ok(()) => {
                relay::audit(asker, upstream.name(), kind, Ok(())).await;
                Ok(())
            }
            Err((refused, rule)) => {
                relay::audit(asker, upstream.name(), kind, Err(rule)).await;
                Err(refused)
            }
        }
    }

    /// Ends a task whose question cannot be passed: cancelled upstream (it cannot go on), and
    /// failed with the refusal from now on.
    async fn fail(
        &self,
        upstream: &Upstream,
        gate: &Gate,
        asker: &Asker,
        entry: &Entry,
        id: &str,
        refused: ErrorData,
    ) -> Result<GetTaskResult, ErrorData> {
        let cancel = ClientRequest::CancelTaskRequest(CancelTaskRequest::new(
            CancelTaskParams::new(entry.own_id.clone()),
        ));
        if let Err(error) = upstream.request(cancel, Some(asker)).await {
            tracing::warn!(task = %id, error = %error.message, "tasks/cancel of a refused task failed");
        }
        let error = match serde_json::to_value(&refused) {
            Ok(Value::Object(error)) => error,
            _ => JsonObject::new(),
        };
        let payload = TaskPayload::Failed { error };
        self.inner.tasks.close(id, payload.clone());
        if self.inner.tasks.end(id) {
            // The task is ended either way; `record` logs a record it lost.
            let _ = record(gate, upstream, entry, id, "tasks/get", Outcome::Failed).await;
        }
        Ok(closed(id, payload))
    }

    /// A completed task's result, cleaned as the call's result would have been (withheld when
    /// it cannot be); its outcome: committed, or failed when the tool said it failed.
    fn clean(
        &self,
        upstream: &Upstream,
        gate: &Gate,
        entry: &Entry,
        result: &mut JsonObject,
    ) -> Outcome {
        let parsed = serde_json::from_value::<CallToolResult>(Value::Object(result.clone()));
        let cleaned = parsed.ok().and_then(|r| {
            clean_tool_result(gate, Some(upstream.name()), &entry.tool, &entry.echoes, r)
        });
        let cleaned = cleaned.unwrap_or_else(|| {
            let reason = format!(
                "{}: the task's result could not be cleaned for the client; withheld",
                entry.tool
            );
            tool_error(reason, Executed::Yes, json!({}))
        });
        let failed = cleaned.is_error == Some(true);
        if let Ok(Value::Object(clean)) = serde_json::to_value(cleaned) {
            *result = clean;
        }
        if failed {
            Outcome::Failed
        } else {
            Outcome::Committed
        }
    }
}

/// The caller of a task request, as its questions and the upstream's `_meta` need it.
fn asker(caller: Caller, gate: &Gate, entry: &Entry) -> Asker {
    Asker {
        caller,
        gate: gate.clone(),
        name: entry.tool.clone(),
        questions: None,
    }
}

/// A task the gateway ended, as `tasks/get` reports it from then on.
fn closed(id: &str, payload: TaskPayload) -> GetTaskResult {
    let now = toolgate_core::time::rfc3339(toolgate_core::time::now_ms());
    let task = Task::new(id, payload.status(), now.clone(), now);
    GetTaskResult::new(DetailedTask::new(task, payload))
}

/// One record of the task: its end (`tasks/get`) or a cancel (`tasks/cancel`), under the call's
/// `request_id` and digest and the task's id.
async fn record(
    gate: &Gate,
    upstream: &Upstream,
    entry: &Entry,
    id: &str,
    method: &str,
    outcome: Outcome,
) -> Result<(), crate::corridor::AuditUnavailable> {
    let event = gate.event_digested(
        &entry.tool,
        entry.label.clone(),
        entry.digest.clone(),
        Decision::Allow,
        outcome,
        RULE,
    );
    let mut event = from_upstream(event, Some(upstream.name())).with("task_id", id);
    method.clone_into(&mut event.method);
    gate.record(event).await.map(drop)
}

/// A failed task's JSON-RPC error, its message and data redacted as an upstream's error is.
fn redact_error(gate: &Gate, error: &JsonObject) -> JsonObject {
    let redactor = gate.redactor();
    let mut error = error.clone();
    if let Some(Value::String(message)) = error.get_mut("message") {
        *message = redactor.redact(message).into_owned();
    }
    if let Some(data) = error.get_mut("data") {
        *data = redactor.redact_value(data);
    }
    error
}

/// An empty acknowledgement from the upstream, or the error that it answered otherwise.
fn ack(upstream: &Upstream, result: ServerResult, method: &str) -> Result<(), ErrorData> {
    match result {
        ServerResult::TaskAckResult(_) | ServerResult::EmptyResult(_) => Ok(()),
        _ => Err(unexpected(upstream, method)),
    }
}
