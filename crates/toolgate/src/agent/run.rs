//! The agent loop: ask the model for the next step, walk each call it asks for through the
//! corridor as the agent's principal, feed what became of it back as data, and stop at a final
//! answer, at `max_steps`, or when a call waits for a person, saving the run so that it resumes
//! from exactly there.
//!
//! What the loop adds to the gate, and only this (the gate decides everything else):
//! - arguments that are not a JSON object never reach the corridor (nothing to validate, nothing
//!   for a person to see); they are refused, audited and fed back;
//! - `max_steps` model turns, then `run_aborted`;
//! - at most `max_pending` approval requests per run: a call past the cap opens none (a retry of
//!   a call already asked about attaches to its request, by the gate's fingerprint);
//! - one idempotency key per tool call (`agent:RUN:TURN:INDEX`), so a call made again after a crash
//!   or a resume replays its first answer instead of running twice;
//! - the events of seed 003, one JSON line each.
//!
//! Durability, in order: the run is saved after the model's turn is appended and before any of
//! its calls is made; after each call's answer is appended; and when it pauses or ends. A crash
//! between two saves loses only what the next resume redoes safely: the model is asked again
//! (a function of the stored conversation), a call is made again under its key (replayed, or
//! answered "in doubt" when its first attempt never reported back, and never run a second time).
//!
//! Design decision: calls of one turn are answered in order, and the run pauses at the first that
//! waits for a person; the calls after it are made only after the decision, as the seed's loop
//! makes them, so a denial can still change what the model does next.

use std::fs::{File, TryLockError};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rmcp::model::{CallToolResponse, CallToolResult, ContentBlock};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;
use toolgate_core::answer::{Check, Kind};
use toolgate_core::audit::{Decision, Outcome as Recorded};
use toolgate_core::time::now_ms;
use toolgate_store::approval::StoreError;
use toolgate_store::approval::{Approval, Status};
use toolgate_store::runs::{Progress, Run, RunStatus, RunStore};

use super::events::EventLog;
use super::model::{Action, Arguments, Message, Model, ToolCall, ToolSpec};
use crate::corridor::{self, Request};
use crate::gate::Gate;
use crate::toolset::Toolset;

/// What a model is told when a person said no, or nobody decided in time (seed 003).
pub const DO_NOT_RETRY: &str = "Do not retry this action. Tell the user it needs a person.";

/// How often `--wait` looks at the approvals a paused run waits for.
const WAIT_POLL: Duration = Duration::from_millis(200);

/// The loop's own limits.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Model turns a run may take before it is aborted.
    pub max_steps: u32,
    /// Approval requests one run may open.
    pub max_pending: u32,
    /// Hold the run while a person decides, up to this long (and past the request's expiry,
    /// which is a denial), instead of pausing it.
    pub wait: Option<Duration>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            max_steps: 8,
            max_pending: 3,
            wait: None,
        }
    }
}

/// How a run (or this stretch of it) ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ending {
    /// The model's final answer.
    Finished(String),
    /// A call waits for a person: resume the run after approval `approval_id` is decided.
    Paused {
        /// The approval waited for.
        approval_id: String,
    },
    /// Ended by the loop's rules (e.g. `max_steps`); final.
    Aborted(String),
    /// The model could not be reached; the run can be resumed.
    Failed(String),
}

/// A run's id and how it ended.
#[derive(Clone, Debug)]
pub struct Report {
    /// The run's id.
    pub run_id: String,
    /// How it ended.
    pub ending: Ending,
    /// Model turns taken so far.
    pub steps: u32,
}

/// Why the agent could not drive a run at all.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The agent needs the approval queue's database (runs live beside approvals).
    #[error("the agent needs a gate with an approval queue (open it on a data directory)")]
    NoStore,
    /// The run store did not answer.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// No run has this id.
    #[error("no run {0}")]
    NoRun(String),
    /// The run belongs to another agent.
    #[error("run {id} belongs to {agent}")]
    OtherAgent {
        /// The run's id.
        id: String,
        /// Its agent.
        agent: String,
    },
    /// The run is over.
    #[error("run {id} is {status} and cannot go on")]
    Over {
        /// The run's id.
        id: String,
        /// `finished` or `aborted`.
        status: &'static str,
    },
    /// Another process is driving the run.
    #[error("run {0} is being driven by another process")]
    Busy(String),
    /// The run's lock file could not be used.
    #[error("cannot lock run {id}: {source}")]
    Lock {
        /// The run's id.
        id: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// What the loop keeps of a run between steps (the run's stored `state`).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct State {
    messages: Vec<Message>,
    /// Approval requests this run opened, oldest first (the cap counts them).
    #[serde(default)]
    requested: Vec<String>,
    /// Approvals whose decision was already reported (`approval_resolved` once each).
    #[serde(default)]
    resolved: Vec<String>,
}

impl State {
    /// Model turns so far.
    fn steps(&self) -> u32 {
        let turns = self
            .messages
            .iter()
            .filter(|m| matches!(m, Message::Assistant { .. }))
            .count();
        u32::try_from(turns).unwrap_or(u32::MAX)
    }

    /// The first call of the last turn that has no answer yet, with its position in that turn.
    fn unanswered(&self) -> Option<(usize, ToolCall)> {
        let last_turn = self
            .messages
            .iter()
            .rposition(|m| matches!(m, Message::Assistant { .. }))?;
        let Message::Assistant { tool_calls, .. } = &self.messages[last_turn] else {
            return None;
        };
        let answered = self.messages[last_turn + 1..]
            .iter()
            .filter(|m| matches!(m, Message::Tool { .. }))
            .count();
        tool_calls
            .get(answered)
            .cloned()
            .map(|call| (answered, call))
    }
}

/// One call's answer: data for the model, a wait for a person, or the gate's verdict that the
/// effect did not hold (the data, and the run ends: seed 000's STOP, decided by the harness).
enum Answered {
    Data(Value),
    Waiting(String),
    Stop(Value, &'static str),
}

/// An agent: a model, the tools it may call, and the gate every call walks through.
#[derive(Debug)]
pub struct Agent {
    gate: Gate,
    toolset: Arc<dyn Toolset>,
    model: Arc<dyn Model>,
    runs: RunStore,
    locks: PathBuf,
    settings: Settings,
    events: EventLog,
}

impl Agent {
    /// The principal of the agent named `name`.
    #[must_use]
    pub fn principal(name: &str) -> String {
        format!("agent:{name}")
    }

    /// An agent driving `model` over `toolset` behind `gate`, whose principal is the agent's
    /// (see [`Agent::principal`]); runs are kept beside the gate's approvals, their lock files in
    /// `data_dir/agent-runs`.
    ///
    /// # Errors
    /// [`AgentError::NoStore`]: the gate has no approval queue.
    pub fn new(
        gate: Gate,
        toolset: Arc<dyn Toolset>,
        model: Arc<dyn Model>,
        data_dir: &Path,
        events: EventLog,
    ) -> Result<Self, AgentError> {
        let runs = RunStore::beside(gate.approvals().ok_or(AgentError::NoStore)?);
        Ok(Self {
            gate,
            toolset,
            model,
            runs,
            locks: data_dir.join("agent-runs"),
            settings: Settings::default(),
            events,
        })
    }

    /// The loop's limits.
    #[must_use]
    pub fn with_settings(mut self, settings: Settings) -> Self {
        self.settings = settings;
        self
    }

    /// The runs this agent's store holds.
    #[must_use]
    pub fn runs(&self) -> &RunStore {
        &self.runs
    }

    /// The tools the model is offered: those the agent's principal may see.
    #[must_use]
    pub fn tools(&self) -> Vec<ToolSpec> {
        let catalog = self.toolset.catalog();
        catalog
            .tools()
            .iter()
            .filter(|tool| self.gate.visible(&tool.name) && catalog.withheld(&tool.name).is_none())
            .map(|tool| ToolSpec {
                name: tool.name.to_string(),
                description: tool.description.as_deref().unwrap_or_default().to_owned(),
                input_schema: Value::Object((*tool.input_schema).clone()),
            })
            .collect()
    }

    /// Starts a run for `input` and drives it until it finishes, pauses or is aborted.
    ///
    /// # Errors
    /// The run could not be created or saved.
    pub async fn start(&self, input: &str) -> Result<Report, AgentError> {
        let run_id = new_run_id();
        let _lock = self.lock(&run_id)?;
        let state = State {
            messages: vec![Message::User {
                content: input.to_owned(),
            }],
            ..State::default()
        };
        self.runs
            .create(&run_id, &self.agent(), input, &to_value(&state), now_ms())
            .await?;
        self.emit(
            "run_started",
            &run_id,
            json!({"agent": self.agent(), "input": input}),
        );
        self.drive(&run_id, state).await
    }

    /// Goes on with run `run_id` from where it was saved: after a pause (the decision is read
    /// now), a failure of the model, or a crash.
    ///
    /// # Errors
    /// No such run, another agent's, one that is over, or one another process drives.
    pub async fn resume(&self, run_id: &str) -> Result<Report, AgentError> {
        let _lock = self.lock(run_id)?;
        let run = self.load(run_id).await?;
        let state: State = serde_json::from_value(run.state).map_err(|e| {
            AgentError::Store(StoreError::RunCorrupt {
                id: run_id.to_owned(),
                reason: e.to_string(),
            })
        })?;
        self.emit(
            "run_resumed",
            run_id,
            json!({"agent": self.agent(), "was": run.status.as_str(), "steps": run.steps}),
        );
        self.drive(run_id, state).await
    }

    async fn load(&self, run_id: &str) -> Result<Run, AgentError> {
        let run = self
            .runs
            .get(run_id)
            .await?
            .ok_or_else(|| AgentError::NoRun(run_id.to_owned()))?;
        if run.agent != self.agent() {
            return Err(AgentError::OtherAgent {
                id: run.id,
                agent: run.agent,
            });
        }
        if run.status.is_final() {
            return Err(AgentError::Over {
                id: run.id,
                status: run.status.as_str(),
            });
        }
        Ok(run)
    }

    /// The loop, from `state` on.
    async fn drive(&self, run_id: &str, mut state: State) -> Result<Report, AgentError> {
        let tools = self.tools();
        loop {
            while let Some((index, call)) = state.unanswered() {
                match self.answer(run_id, &mut state, index, &call).await? {
                    Answered::Data(content) => {
                        // Crash test: the call's effect and record are durable, its answer is
                        // not yet in the run.
                        toolgate_store::journal::crash_point("agent.call_answered");
                        state.messages.push(Message::Tool {
                            tool_call_id: call.id.clone(),
                            content,
                        });
                        self.save(run_id, &state, RunStatus::Running, None, None)
                            .await?;
                    }
                    Answered::Stop(content, why) => {
                        state.messages.push(Message::Tool {
                            tool_call_id: call.id.clone(),
                            content,
                        });
                        self.save(run_id, &state, RunStatus::Aborted, None, Some(why))
                            .await?;
                        self.emit(
                            "run_aborted",
                            run_id,
                            json!({"reason": why, "steps": state.steps()}),
                        );
                        return Ok(self.report(run_id, &state, Ending::Aborted(why.to_owned())));
                    }
                    Answered::Waiting(approval_id) => {
                        if self.wait_for(&approval_id).await? {
                            continue;
                        }
                        self.save(run_id, &state, RunStatus::Paused, Some(&approval_id), None)
                            .await?;
                        self.emit(
                            "run_paused",
                            run_id,
                            json!({"request_id": approval_id, "steps": state.steps()}),
                        );
                        return Ok(self.report(run_id, &state, Ending::Paused { approval_id }));
                    }
                }
            }
            let steps = state.steps();
            if steps >= self.settings.max_steps {
                let why = "max_steps";
                self.save(run_id, &state, RunStatus::Aborted, None, Some(why))
                    .await?;
                self.emit(
                    "run_aborted",
                    run_id,
                    json!({"reason": why, "steps": steps}),
                );
                return Ok(self.report(run_id, &state, Ending::Aborted(why.to_owned())));
            }
            let action = match self.model.next(&state.messages, &tools).await {
                Ok(action) => action,
                Err(error) => {
                    let why = error.to_string();
                    self.save(run_id, &state, RunStatus::Failed, None, Some(&why))
                        .await?;
                    self.emit(
                        "run_aborted",
                        run_id,
                        json!({"reason": "model", "error": why, "steps": steps, "resumable": true}),
                    );
                    return Ok(self.report(run_id, &state, Ending::Failed(why)));
                }
            };
            match action {
                Action::Final(output) => {
                    self.save(run_id, &state, RunStatus::Finished, None, Some(&output))
                        .await?;
                    self.emit(
                        "run_finished",
                        run_id,
                        json!({"steps": steps, "output": output}),
                    );
                    return Ok(self.report(run_id, &state, Ending::Finished(output)));
                }
                Action::Call { content, calls } => {
                    let tool_calls = with_ids(calls, steps + 1);
                    state.messages.push(Message::Assistant {
                        content,
                        tool_calls,
                    });
                    self.save(run_id, &state, RunStatus::Running, None, None)
                        .await?;
                    // Crash test: the turn is saved, none of its calls is made.
                    toolgate_store::journal::crash_point("agent.turn_saved");
                }
            }
        }
    }

    /// Walks one call through the corridor and turns its answer into data for the model.
    async fn answer(
        &self,
        run_id: &str,
        state: &mut State,
        index: usize,
        call: &ToolCall,
    ) -> Result<Answered, AgentError> {
        let tool = call.name.as_str();
        let arguments = match &call.arguments {
            Arguments::Object { value } => value.clone(),
            Arguments::Unparsed { error, .. } => {
                self.refuse_unparsed(run_id, tool, error).await;
                return Ok(Answered::Data(
                    json!({"ran": false, "status": "invalid_args", "error": error}),
                ));
            }
        };
        let closed = (state.requested.len() >= self.settings.max_pending as usize).then(|| {
            format!(
                "this run already asked for {} approvals, the most one run may ask for. {DO_NOT_RETRY}",
                state.requested.len()
            )
        });
        if state.requested.len() > state.resolved.len() {
            // A decision this run waits for goes into the chain before the call it allows.
            crate::server::record_resolutions(&self.gate).await;
        }
        let started = Instant::now();
        let outcome = corridor::call(
            &self.gate,
            self.toolset.as_ref(),
            Request {
                name: tool.to_owned(),
                arguments: arguments.clone(),
                key: Some(format!("agent:{run_id}:{}:{}", state.steps(), index + 1)),
                approvals_closed: closed,
                ct: CancellationToken::new(),
            },
        )
        .await;
        let ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let tier = outcome.tier.map(|t| t.as_str());
        let result = match &outcome.response {
            Ok(CallToolResponse::Complete(result)) => Some(result),
            _ => None,
        };
        let approval_id = outcome.approval_id.clone();
        if let Some(id) = &approval_id
            && outcome.kind != Kind::Pending
        {
            self.resolved(run_id, state, id).await;
        }
        let mut data = json!({
            "ran": outcome.kind.executed().to_json(),
            "status": outcome.kind.status(),
        });
        if let Some(tier) = tier {
            data["tier"] = json!(tier);
        }
        match outcome.kind {
            Kind::Unverified => {
                // The call ran; what it left is not what it should have. The harness, not the
                // model, decides: the run ends.
                self.ran(run_id, tool, &outcome, ms);
                data["error"] = json!(error_text(&outcome.response));
                data["verified"] = json!(false);
                let why = match outcome.verify.map(|v| v.decision) {
                    Some(Check::Rollback) => "verify_rollback",
                    _ => "verify_stop",
                };
                return Ok(Answered::Stop(data, why));
            }
            Kind::Ran | Kind::Replay => {
                if outcome.verify.is_some() {
                    data["verified"] = json!(true);
                }
                let output = result.map_or(Value::Null, output_of);
                self.ran(run_id, tool, &outcome, ms);
                data["output"] = output;
            }
            Kind::Pending => {
                let Some(id) = approval_id else {
                    // A pending answer always names its approval; without one there is nothing
                    // to wait for, and the call did not run.
                    data["error"] = json!("pending without an approval id");
                    return Ok(Answered::Data(data));
                };
                if !state.requested.contains(&id) {
                    state.requested.push(id.clone());
                    self.emit(
                        "approval_requested",
                        run_id,
                        json!({"request_id": id, "tool": tool, "tier": tier, "args": arguments}),
                    );
                }
                return Ok(Answered::Waiting(id));
            }
            Kind::DeniedByPerson | Kind::Expired => {
                data["approval"] = json!(outcome.kind.status());
                data["note"] = json!(DO_NOT_RETRY);
            }
            Kind::Denied | Kind::DryRun => {
                let event = if outcome.rule == "unknown_tool" {
                    "tool_unknown"
                } else {
                    "tool_blocked"
                };
                self.emit(
                    event,
                    run_id,
                    json!({"tool": tool, "rule": outcome.rule, "args": arguments}),
                );
                data["error"] = json!(error_text(&outcome.response));
            }
            Kind::Invalid => {
                let error = error_text(&outcome.response);
                self.emit(
                    "tool_invalid_args",
                    run_id,
                    json!({"tool": tool, "error": error}),
                );
                data["error"] = json!(error);
            }
            _ => {
                let error = error_text(&outcome.response);
                self.emit(
                    "tool_failed",
                    run_id,
                    json!({"tool": tool, "tier": tier, "status": outcome.kind.status(), "error": error, "ms": ms}),
                );
                data["error"] = json!(error);
            }
        }
        Ok(Answered::Data(data))
    }

    /// `tool_ran` (tier, duration, whether it was a replay), then `verify_continue`, `verify_stop`
    /// or `verify_rollback` when the gate read the call's effect back.
    fn ran(&self, run_id: &str, tool: &str, outcome: &corridor::Outcome, ms: u64) {
        let tier = outcome.tier.map(|t| t.as_str());
        let replay = outcome.kind == Kind::Replay;
        self.emit(
            "tool_ran",
            run_id,
            json!({"tool": tool, "tier": tier, "ms": ms, "replay": replay}),
        );
        let Some(verify) = outcome.verify else {
            return;
        };
        let mut fields = json!({"tool": tool});
        if let Some(done) = verify.rolled_back {
            fields["rolled_back"] = json!(done);
        }
        self.emit(
            &format!("verify_{}", verify.decision.as_str()),
            run_id,
            fields,
        );
    }

    /// Arguments that are not a JSON object: refused before the corridor (there is nothing to
    /// validate or show a person), with the refusal audited as an invalid call.
    async fn refuse_unparsed(&self, run_id: &str, tool: &str, error: &str) {
        self.emit(
            "tool_invalid_args",
            run_id,
            json!({"tool": tool, "error": error}),
        );
        let event = self.gate.event(
            tool,
            &Map::new(),
            Decision::Deny,
            Recorded::InvalidArgs,
            "agent.arguments",
        );
        if let Err(error) = self.gate.record(event).await {
            tracing::error!(error = %error, tool, "refusal of unparsed arguments not recorded");
        }
    }

    /// Reports a decided approval once per run (`approval_resolved`, with who and why).
    async fn resolved(&self, run_id: &str, state: &mut State, approval_id: &str) {
        if state.resolved.iter().any(|id| id == approval_id) {
            return;
        }
        let row = match self.approval(approval_id).await {
            Some(row) if row.status != Status::Pending => row,
            _ => return,
        };
        state.resolved.push(approval_id.to_owned());
        self.emit(
            "approval_resolved",
            run_id,
            json!({
                "request_id": approval_id,
                "status": row.status.as_str(),
                "approver": row.decided_by,
                "reason": row.decision_reason.unwrap_or_default(),
            }),
        );
    }

    async fn approval(&self, id: &str) -> Option<Approval> {
        let store = self.gate.approvals()?;
        match store.get(id, now_ms()).await {
            Ok(row) => row,
            Err(error) => {
                tracing::error!(error = %error, approval = id, "approval unreadable");
                None
            }
        }
    }

    /// With `wait` set, holds until approval `id` is decided or expires (`true`: answer the
    /// call again now), or the wait runs out (`false`: pause).
    async fn wait_for(&self, id: &str) -> Result<bool, AgentError> {
        let Some(wait) = self.settings.wait else {
            return Ok(false);
        };
        let store = self.gate.approvals().ok_or(AgentError::NoStore)?;
        let until = Instant::now() + wait;
        while Instant::now() < until {
            match store.get(id, now_ms()).await? {
                Some(row) if row.status == Status::Pending => {}
                _ => return Ok(true),
            }
            tokio::time::sleep(WAIT_POLL).await;
        }
        Ok(false)
    }

    async fn save(
        &self,
        run_id: &str,
        state: &State,
        status: RunStatus,
        approval_id: Option<&str>,
        outcome: Option<&str>,
    ) -> Result<(), AgentError> {
        let value = to_value(state);
        let progress = Progress {
            status,
            approval_id,
            state: &value,
            steps: state.steps(),
            outcome,
        };
        self.runs.save(run_id, progress, now_ms()).await?;
        Ok(())
    }

    fn report(&self, run_id: &str, state: &State, ending: Ending) -> Report {
        Report {
            run_id: run_id.to_owned(),
            ending,
            steps: state.steps(),
        }
    }

    fn agent(&self) -> String {
        self.gate.principal().sub.clone()
    }

    fn emit(&self, event: &str, run_id: &str, fields: Value) {
        self.events
            .emit(self.gate.redactor(), event, run_id, fields);
    }

    /// An exclusive lock on the run's lock file, held while this process drives the run; the
    /// kernel drops it when the process dies, so a run killed mid-step can be resumed at once.
    fn lock(&self, run_id: &str) -> Result<File, AgentError> {
        let failed = |source| AgentError::Lock {
            id: run_id.to_owned(),
            source,
        };
        if run_id.is_empty() || !run_id.chars().all(|c| c.is_ascii_alphanumeric()) {
            return Err(AgentError::NoRun(run_id.to_owned()));
        }
        std::fs::create_dir_all(&self.locks).map_err(failed)?;
        let file = File::create(self.locks.join(format!("{run_id}.lock"))).map_err(failed)?;
        match file.try_lock() {
            Ok(()) => Ok(file),
            Err(TryLockError::WouldBlock) => Err(AgentError::Busy(run_id.to_owned())),
            Err(TryLockError::Error(source)) => Err(failed(source)),
        }
    }
}

/// Calls with an id each (`call_TURN_INDEX` where the model gave none).
fn with_ids(calls: Vec<ToolCall>, turn: u32) -> Vec<ToolCall> {
    calls
        .into_iter()
        .enumerate()
        .map(|(i, mut call)| {
            if call.id.is_empty() {
                call.id = format!("call_{turn}_{}", i + 1);
            }
            call
        })
        .collect()
}

/// What a tool returned, for the model: its structured content, else its text.
fn output_of(result: &CallToolResult) -> Value {
    if let Some(structured) = &result.structured_content {
        return structured.clone();
    }
    Value::String(text_of(result))
}

fn text_of(result: &CallToolResult) -> String {
    result
        .content
        .iter()
        .filter_map(|block| match block {
            ContentBlock::Text(text) => Some(text.text.as_str()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The words of an answer that is not a plain result: the result's text, or the JSON-RPC
/// error's message.
fn error_text(response: &Result<CallToolResponse, rmcp::ErrorData>) -> String {
    match response {
        Ok(CallToolResponse::Complete(result)) => text_of(result),
        Ok(_) => "the tool needs input or a task the agent cannot give".to_owned(),
        Err(error) => error.message.to_string(),
    }
}

fn to_value(state: &State) -> Value {
    // A `State` is plain data (strings, JSON values): serialising it cannot fail.
    serde_json::to_value(state).unwrap_or(Value::Null)
}

/// 12 random hex digits.
fn new_run_id() -> String {
    let mut bytes = [0_u8; 6];
    if getrandom::fill(&mut bytes).is_err() {
        // Unpredictability is not what a run id is for; uniqueness is, and the clock gives it.
        return format!("{:012x}", now_ms());
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
