//! Toolsets: the tools served in-process behind the gate (the kit's contract).
//!
//! A toolset lists its tools (all of them: hiding is the gate's job, not the toolset's) and runs a
//! call the gate admitted; the gateway is one (its upstreams' tools), and the demos crate
//! (`toolgate-demos`: ledger, notes, orders, helpdesk, docs) holds the built-in ones `toolgate
//! serve` runs. A handler that changes things repeats the policy check before touching anything
//! (defence in depth, seed 000) and makes its effect and its audit record durable before it
//! answers.

#![expect(
    deprecated,
    reason = "MCP 2026-07-28 deprecates logging, sampling, roots and resources/subscribe; the revisions before it, which the gateway passes through, have them"
)]

mod catalog;

use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use rmcp::model::{
    CallToolResult, CancelTaskParams, ClientCapabilities, CompleteRequestParams, CompleteResult,
    CreateTaskResult, GetPromptRequestParams, GetPromptResponse, GetTaskParams, GetTaskResult,
    InputRequiredResult, InputResponses, ProgressToken, Prompt, ReadResourceRequestParams,
    ReadResourceResponse, RequestId, Resource, ResourceTemplate, SetLevelRequestParams,
    SubscribeRequestParams, UnsubscribeRequestParams, UpdateTaskParams,
};
use rmcp::{ErrorData, Peer, RoleServer};
use serde_json::{Map, Value};

pub use catalog::{Catalog, Withheld};

use tokio_util::sync::CancellationToken;
use toolgate_core::policy::Denial;
use toolgate_core::principal::Principal;

use crate::gate::Gate;

/// The future a toolset returns for one call.
pub type CallFuture<'a> =
    Pin<Box<dyn Future<Output = Result<CallToolResult, CallError>> + Send + 'a>>;

/// Why a call produced no result of its own. The gate turns each into the answer DESIGN.md §4
/// gives it and audits it; a toolset never has to word these itself.
#[derive(Debug)]
pub enum CallError {
    /// Refused before anything was touched (a handler repeating the policy's check): answered
    /// -32602 like the gate's own refusal, audited `deny / not_executed`.
    Refused {
        /// The tool and the rule that refused it.
        denial: Denial,
        /// The caller may see the tool, so the answer may name the rule.
        visible: bool,
    },
    /// The tool failed and says so; the reason reaches the model after redaction.
    Failed(String),
    /// Nothing was attempted: the tool's backend (an upstream server) is not there.
    Unavailable(String),
    /// The call may or may not have taken effect (an upstream vanished mid-call).
    InDoubt(String),
    /// The tool cannot finish without the caller's input (an upstream's `input_required`
    /// result): the caller answers and retries.
    NeedsInput(Box<InputRequiredResult>),
    /// The backend refused the request at the protocol level (an upstream's own JSON-RPC
    /// error): passed on with its code, message and data, already redacted.
    Rejected(ErrorData),
    /// The backend runs the call on as a task (an upstream's answer under the MCP tasks
    /// extension, to a caller that declared it): the caller follows it with `tasks/get`.
    Task(Box<CreateTaskResult>),
}

impl From<ErrorData> for CallError {
    fn from(error: ErrorData) -> Self {
        Self::Rejected(error)
    }
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Refused { denial, .. } => write!(f, "refused by rule {}", denial.rule),
            Self::Failed(why) | Self::Unavailable(why) | Self::InDoubt(why) => f.write_str(why),
            Self::NeedsInput(_) => f.write_str("the caller's input is required"),
            Self::Task(task) => write!(f, "it runs on as task {}", task.task.task_id),
            Self::Rejected(error) => f.write_str(&error.message),
        }
    }
}

impl CallError {
    /// A tool this toolset does not have: refused like any tool the caller cannot see.
    #[must_use]
    pub fn unknown(tool: &str) -> Self {
        Self::Refused {
            denial: Denial {
                tool: tool.to_owned(),
                rule: "unknown_tool".to_owned(),
            },
            visible: false,
        }
    }
}

/// One admitted call, as a handler receives it.
#[derive(Debug)]
pub struct Call<'a> {
    /// The caller's gate (policy, stores, principal), for a handler's own checks and records.
    pub gate: &'a Gate,
    /// The tool's name, as the catalog lists it and the client called it.
    pub name: &'a str,
    /// Already checked against the tool's schema and the policy's argument rules.
    pub arguments: Map<String, Value>,
    /// SHA-256 of the canonical arguments (the audit records' `args_digest`), computed once by
    /// the corridor for every record of the call.
    pub args_digest: &'a str,
    /// Who calls: the gate's principal.
    pub principal: &'a Principal,
    /// The policy rule that let the call run, for the tool's own audit records.
    pub rule: &'a str,
    /// Cancelled when the client cancels the request or the tool's timeout passes; a handler that
    /// waits on anything should watch it.
    pub ct: CancellationToken,
    /// The client behind the request, when there is a connection to it.
    pub caller: Option<Caller>,
    /// The caller's progress token, when it asked for progress.
    pub progress_token: Option<ProgressToken>,
}

impl Call<'_> {
    /// Repeats the gate's visibility and argument check for this call (defence in depth, seed
    /// 000): a handler that changes things calls it before touching anything. Nothing is recorded
    /// here; the corridor records the refusal once, as it records every answer.
    ///
    /// # Errors
    /// [`CallError::Refused`] with the denial, to return from the handler.
    pub fn admit(&self) -> Result<(), CallError> {
        self.gate
            .admission(self.name, &self.arguments, true)
            .map_err(|(denial, visible)| CallError::Refused { denial, visible })
    }
}

/// The client behind one request: where notifications and requests back to it go, which protocol
/// era it speaks and what it can answer (an upstream's questions are passed to it only as it
/// allows).
#[derive(Clone, Debug)]
pub struct Caller {
    /// The server's end of the client's session: notifications and requests to the client go here.
    pub peer: Peer<RoleServer>,
    /// The request being served, which requests back to the client are sent in relation to.
    pub request_id: RequestId,
    /// It speaks 2026-07-28 (no requests from the server: questions travel as `input_required`).
    pub modern: bool,
    /// What it declared (at `initialize`, or in this request's `_meta`).
    pub capabilities: ClientCapabilities,
    /// A retry after `input_required`: the answers, keyed as the questions were.
    pub input_responses: Option<InputResponses>,
    /// A retry after `input_required`: the state the server gave, echoed.
    pub request_state: Option<String>,
}

/// The future a toolset returns for a dry run.
pub type DryRunFuture<'a> = Pin<Box<dyn Future<Output = Option<Value>> + Send + 'a>>;

/// A set of tools served behind the gate.
pub trait Toolset: Debug + Send + Sync + 'static {
    /// The tools on offer now, visible or not (hiding is the gate's job). Cheap: an `Arc` clone.
    fn catalog(&self) -> Arc<Catalog>;

    /// Runs a call the gate admitted. The result is what the client sees; a failure is an
    /// `isError` result with the real reason, never success text.
    fn call<'a>(&'a self, call: Call<'a>) -> CallFuture<'a>;

    /// What the call would do, without doing anything: an object with at least `would` (a
    /// sentence) and `reversible` (bool), plus whatever sizes or targets help a person decide.
    /// `None` lets the gate synthesise a preview from the arguments and the rule.
    fn dry_run<'a>(
        &'a self,
        _name: &'a str,
        _arguments: &'a Map<String, Value>,
    ) -> DryRunFuture<'a> {
        Box::pin(std::future::ready(None))
    }

    /// Whether the tool writes its own audit record together with its effect (the ledger does);
    /// otherwise the gate records the outcome after the call.
    fn records_itself(&self, _name: &str) -> bool {
        false
    }

    /// Where the tool's effects happen, for audit records (the gateway names the upstream).
    fn origin(&self, _name: &str) -> Option<String> {
        None
    }

    /// Bumped whenever the catalog changes, for toolsets whose tools can change while serving
    /// (the gateway); the server then tells its sessions `notifications/tools/list_changed`.
    fn changes(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        None
    }

    /// Whether `task_id` is a task this toolset handed to `principal` and still follows (an
    /// idempotent retry of the call that became it then gets it back).
    fn tracks_task(&self, _principal: &str, _task_id: &str) -> bool {
        false
    }

    /// Prompts and resources from elsewhere that the server may pass through (the gateway's
    /// upstreams); the policy decides which.
    fn passthrough(&self) -> Option<&dyn Passthrough> {
        None
    }

    /// The servers this toolset forwards calls to (the gateway's upstreams), each with whether it
    /// is connected now, for metrics; empty for tools that run here.
    fn upstreams(&self) -> Vec<(String, bool)> {
        Vec::new()
    }
}

/// A boxed future of a pass-through request; the error is what the client gets (an upstream's own
/// error keeps its code, message and data, redacted).
pub type PassFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, ErrorData>> + Send + 'a>>;

/// Upstream prompts and resources, listed and fetched on the caller's behalf. Names and URIs are
/// as the client sees them (prefixed when there are several upstreams).
pub trait Passthrough: Send + Sync {
    /// `prompts/list`: every prompt on offer.
    fn prompts(&self) -> PassFuture<'_, Vec<Prompt>>;
    /// `gate`: the caller's, which decides and audits what the upstream asks of it.
    fn get_prompt(
        &self,
        params: GetPromptRequestParams,
        caller: Caller,
        gate: Gate,
    ) -> PassFuture<'_, GetPromptResponse>;
    /// `resources/list`: every resource on offer.
    fn resources(&self) -> PassFuture<'_, Vec<Resource>>;
    /// `resources/templates/list`: every resource template on offer.
    fn resource_templates(&self) -> PassFuture<'_, Vec<ResourceTemplate>>;
    /// `resources/read`: the resource's contents, text redacted. `gate`: the caller's, as for
    /// [`get_prompt`](Self::get_prompt).
    fn read_resource(
        &self,
        params: ReadResourceRequestParams,
        caller: Caller,
        gate: Gate,
    ) -> PassFuture<'_, ReadResourceResponse>;
    /// `completion/complete` for a prompt's or a resource template's argument.
    fn complete(&self, params: CompleteRequestParams) -> PassFuture<'_, CompleteResult>;
    /// `logging/setLevel`: the caller's session receives the upstreams' log messages at this
    /// level and above.
    fn set_level(&self, params: SetLevelRequestParams, caller: Caller) -> PassFuture<'_, ()>;
    /// `resources/subscribe`: the caller's session is told when the resource changes.
    fn subscribe(&self, params: SubscribeRequestParams, caller: Caller) -> PassFuture<'_, ()>;
    /// `resources/unsubscribe`: the caller's session is no longer told when the resource changes.
    fn unsubscribe(&self, params: UnsubscribeRequestParams, caller: Caller) -> PassFuture<'_, ()>;
    /// `tasks/get` of a task the caller was handed (MCP tasks extension): its state as the
    /// upstream reports it, cleaned as a call's result is. A task that is not the caller's is
    /// unknown.
    fn get_task(
        &self,
        params: GetTaskParams,
        caller: Caller,
        gate: Gate,
    ) -> PassFuture<'_, GetTaskResult>;
    /// `tasks/update`: the caller's answers to the task's questions.
    fn update_task(
        &self,
        params: UpdateTaskParams,
        caller: Caller,
        gate: Gate,
    ) -> PassFuture<'_, ()>;
    /// `tasks/cancel`: asks the upstream to stop the task.
    fn cancel_task(
        &self,
        params: CancelTaskParams,
        caller: Caller,
        gate: Gate,
    ) -> PassFuture<'_, ()>;
    /// What the upstreams offer of the optional features (`completions`, `logging`, resource
    /// subscriptions), so that the server declares no more than works.
    fn features(&self) -> Features;
}

/// Optional features some upstream offers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Features {
    /// Some upstream answers `completion/complete`.
    pub completions: bool,
    /// Some upstream sends log messages, so `logging/setLevel` has an effect.
    pub logging: bool,
    /// Some upstream takes `resources/subscribe`.
    pub subscribe: bool,
}
