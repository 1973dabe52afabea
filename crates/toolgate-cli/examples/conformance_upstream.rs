//! The MCP server that the official conformance suite (`@modelcontextprotocol/conformance`, see
//! `scripts/conformance`) is run against, directly and through `toolgate proxy`: it serves what the
//! suite's server scenarios ask for, so that what fails through the gateway is the gateway's doing.
//!
//! ```text
//! conformance_upstream --http 127.0.0.1:0     # prints its URL, http://127.0.0.1:PORT/mcp, on stdout
//! conformance_upstream --stdio                # stdout is the protocol, logs go to stderr
//! ```
//!
//! Both eras on one endpoint, as rmcp serves them: 2026-07-28 requests statelessly (per-request
//! `_meta`, `server/discover`, `subscriptions/listen`, MRTR `InputRequiredResult` for sampling,
//! elicitation and roots), and the `initialize` revisions in legacy sessions (server-to-client
//! `sampling/createMessage`, `elicitation/create`, logging notifications, progress,
//! `resources/subscribe`, SSE resumption with `Last-Event-ID`).
//!
//! The names, texts and wire shapes are those the scenarios' "Server Implementation Requirements"
//! state (the suite's own reference server, `examples/servers/typescript/everything-server.ts` in
//! its repository, serves the same names). They are written here as JSON literals turned into
//! rmcp's types, because the wire shape is the thing under test: a literal reads like the spec
//! text it answers.
//!
//! Also the tasks extension (SEP-2663, on rmcp's `TaskManager`), which the suite runs without
//! scoring it. What the suite fails on this server, and why, is listed in
//! `tests/conformance/expected.txt` (nothing, today).

// Sampling, roots, logging and `resources/subscribe` are deprecated by SEP-2577 (rmcp marks them
// so), but the suite still checks them: serving them is this server's job.
#![expect(deprecated, reason = "the suite tests the deprecated features too")]

use std::collections::HashMap;
use std::io::{self, Write};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::Duration;

use anyhow::Context;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use clap::Parser;
use ring::hmac;
use rmcp::model::CacheScope;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ClientCapabilities,
    ClientJsonRpcMessage, ClientRequest, CompleteRequestParams, CompleteResult, CompletionInfo,
    ErrorData, GetPromptRequestParams, GetPromptResponse, GetPromptResult, Implementation,
    InputRequiredResult, InputResponses, JsonRpcMessage, ListPromptsResult,
    ListResourceTemplatesResult, ListResourcesResult, ListToolsResult,
    LoggingMessageNotificationParam, PaginatedRequestParams, ProgressNotificationParam, Prompt,
    ProtocolVersion, ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult,
    RequestId, Resource, ResourceTemplate, ServerCapabilities, ServerConfig, ServerRequest,
    SetLevelRequestParams, SubscribeRequestParams, SubscriptionFilter, Tool,
    UnsubscribeRequestParams,
};
use rmcp::model::{
    CancelTaskParams, CreateTaskResult, GetTaskParams, GetTaskResult, UpdateTaskParams,
};
use rmcp::service::{RequestContext, SubscriptionContext, SubscriptionSink};
use rmcp::task_manager::{TaskContext, TaskExit, TaskFuture, TaskManager, TaskOptions};
use rmcp::transport::WorkerTransport;
use rmcp::transport::streamable_http_server::session::local::{
    LocalSessionManager, LocalSessionManagerError, LocalSessionWorker,
};
use rmcp::transport::streamable_http_server::session::{RestoreOutcome, ServerSseMessage};
use rmcp::transport::streamable_http_server::{SessionId, SessionManager};
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{RoleServer, ServerHandler, ServiceExt};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio_stream::wrappers::ReceiverStream;

/// The tasks extension (SEP-2663).
const TASKS: &str = "io.modelcontextprotocol/tasks";
/// How often a task's client is told to poll `tasks/get`.
const TASK_POLL_MS: u64 = 100;

/// `serverInfo.name`.
const NAME: &str = "toolgate-conformance-upstream";
/// How long list and read results may be cached (SEP-2549), as the suite's reference says.
const TTL_MS: u64 = 300_000;
/// The `retry` a client is told when a stream is closed under it (SEP-1699).
const SSE_RETRY: Duration = Duration::from_millis(500);

const PNG_1X1: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==";
const WAV_EMPTY: &str = "UklGRiYAAABXQVZFZm10IBAAAAABAAEAQB8AAAB9AAACABAAZGF0YQIAAAA=";

#[derive(Debug, Parser)]
#[command(about = "MCP server for the official conformance suite's server scenarios")]
#[command(group = clap::ArgGroup::new("transport").required(true))]
struct Args {
    /// Serve Streamable HTTP at http://ADDR/mcp (port 0: any free port); the URL goes to stdout.
    #[arg(long, value_name = "ADDR", group = "transport")]
    http: Option<SocketAddr>,
    /// Serve one session on stdin/stdout.
    #[arg(long, group = "transport")]
    stdio: bool,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_env("CONFORMANCE_UPSTREAM_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(io::stderr)
        .with_ansi(false)
        .try_init();
    let result = match args.http {
        Some(addr) => serve_http(addr).await,
        None => serve_stdio().await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("conformance_upstream: {err:#}");
            ExitCode::FAILURE
        }
    }
}

async fn serve_stdio() -> anyhow::Result<()> {
    let server = Conformance::new(None);
    let running = match server.serve(rmcp::transport::stdio()).await {
        Ok(running) => running,
        // stdin closed before any request: nothing to serve.
        Err(rmcp::service::ServerInitializeError::ConnectionClosed(_)) => return Ok(()),
        Err(err) => return Err(err).context("the session did not start"),
    };
    running.waiting().await.context("the service loop failed")?;
    Ok(())
}

async fn serve_http(addr: SocketAddr) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot bind {addr}"))?;
    let bound = listener.local_addr().context("no local address")?;
    let sessions = Arc::new(Sessions::default());
    let server = Conformance::new(Some(Arc::clone(&sessions)));
    // rmcp's defaults: Host must be a loopback name (DNS rebinding), legacy sessions kept in
    // memory; the priming event's `retry` is ours.
    let config = StreamableHttpServerConfig::default().with_sse_retry(Some(SSE_RETRY));
    let service = StreamableHttpService::new(move || Ok(server.clone()), sessions, config);
    let app = axum::Router::new().route_service("/mcp", service);
    // The one line a script waits for; stdout carries nothing else in this mode.
    writeln!(io::stdout().lock(), "http://{bound}/mcp").context("cannot write to stdout")?;
    // No graceful shutdown: a signal ends the process at once, listen streams and all.
    axum::serve(listener, app)
        .await
        .context("the HTTP server failed")
}

/// rmcp's in-memory legacy sessions, plus which HTTP stream carries a `test_reconnection` call, so
/// that the tool can close that stream under the client (SEP-1699) and the client resumes it.
#[derive(Debug, Default)]
struct Sessions {
    local: LocalSessionManager,
    /// (session, JSON-RPC id of a `test_reconnection` call) → rmcp's id of its response stream.
    reconnecting: Mutex<HashMap<(SessionId, RequestId), u64>>,
}

impl Sessions {
    /// Ends the response stream of `request` in `session` (the call goes on), after telling the
    /// client to come back with `Last-Event-ID`. False when no such stream is known.
    async fn close_stream(&self, session: &str, request: &RequestId) -> bool {
        let key = (SessionId::from(session), request.clone());
        let Some(stream) = lock(&self.reconnecting).remove(&key) else {
            return false;
        };
        let handle = self.local.sessions.read().await.get(&key.0).cloned();
        match handle {
            Some(handle) => handle
                .close_sse_stream(stream, Some(SSE_RETRY))
                .await
                .is_ok(),
            None => false,
        }
    }
}

/// Whether `message` calls `test_reconnection`.
fn is_reconnection_call(message: &ClientJsonRpcMessage) -> Option<RequestId> {
    match message {
        JsonRpcMessage::Request(request) => match &request.request {
            ClientRequest::CallToolRequest(call) if call.params.name == "test_reconnection" => {
                Some(request.id.clone())
            }
            _ => None,
        },
        _ => None,
    }
}

impl SessionManager for Sessions {
    type Error = LocalSessionManagerError;
    type Transport = WorkerTransport<LocalSessionWorker>;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        self.local.create_session().await
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<rmcp::model::ServerJsonRpcMessage, Self::Error> {
        self.local.initialize_session(id, message).await
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        self.local.has_session(id).await
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        lock(&self.reconnecting).retain(|(session, _), _| session != id);
        self.local.close_session(id).await
    }

    /// LocalSessionManager's own steps, done here to learn the stream's id.
    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<
        impl tokio_stream::Stream<Item = ServerSseMessage> + Send + Sync + 'static,
        Self::Error,
    > {
        let handle = self.local.sessions.read().await.get(id).cloned();
        let handle = handle.ok_or_else(|| LocalSessionManagerError::SessionNotFound(id.clone()))?;
        let receiver = handle.establish_request_wise_channel().await?;
        if let (Some(request), Some(stream)) =
            (is_reconnection_call(&message), receiver.http_request_id)
        {
            lock(&self.reconnecting).insert((id.clone(), request), stream);
        }
        handle
            .push_message(message, receiver.http_request_id)
            .await?;
        Ok(ReceiverStream::new(receiver.inner))
    }

    async fn accept_message(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<(), Self::Error> {
        self.local.accept_message(id, message).await
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<
        impl tokio_stream::Stream<Item = ServerSseMessage> + Send + Sync + 'static,
        Self::Error,
    > {
        self.local.create_standalone_stream(id).await
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<
        impl tokio_stream::Stream<Item = ServerSseMessage> + Send + Sync + 'static,
        Self::Error,
    > {
        self.local.resume(id, last_event_id).await
    }

    async fn restore_session(
        &self,
        id: SessionId,
    ) -> Result<RestoreOutcome<Self::Transport>, Self::Error> {
        self.local.restore_session(id).await
    }
}

#[derive(Clone, Debug)]
struct Conformance(Arc<State>);

struct State {
    /// Seals `requestState` (SEP-2322: state the client echoes is input an attacker controls).
    seal: Sealer,
    /// Open `subscriptions/listen` streams.
    listeners: Mutex<Vec<SubscriptionSink>>,
    /// The tasks extension's tasks (in memory, as the suite needs them for one run).
    tasks: TaskManager,
    /// The HTTP sessions, when serving HTTP.
    sessions: Option<Arc<Sessions>>,
}

// By hand: rmcp's TaskManager has no Debug.
impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State")
            .field("listeners", &lock(&self.listeners).len())
            .field("tasks", &self.tasks.running_task_count())
            .finish_non_exhaustive()
    }
}

impl Conformance {
    fn new(sessions: Option<Arc<Sessions>>) -> Self {
        Self(Arc::new(State {
            seal: Sealer::new(),
            listeners: Mutex::new(Vec::new()),
            tasks: TaskManager::new(),
            sessions,
        }))
    }
}

/// HMAC-SHA256 over the state with a key made at start: a state from another process, or one
/// changed by a byte, does not open.
struct Sealer(hmac::Key);

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sealer(<key>)")
    }
}

impl Sealer {
    fn new() -> Self {
        let rng = ring::rand::SystemRandom::new();
        // Only fails when the OS has no randomness to give, and then nothing here can run.
        let key = hmac::Key::generate(hmac::HMAC_SHA256, &rng).expect("the OS gives randomness");
        Self(key)
    }

    /// `base64url(JSON).base64url(tag)`, bound to `tool`.
    fn seal(&self, tool: &str, mut state: Value) -> String {
        state["tool"] = json!(tool);
        let payload = URL_SAFE_NO_PAD.encode(state.to_string());
        let tag = hmac::sign(&self.0, payload.as_bytes());
        format!("{payload}.{}", URL_SAFE_NO_PAD.encode(tag.as_ref()))
    }

    /// The state sealed for `tool`, or an error the client can read.
    fn open(&self, tool: &str, sealed: &str) -> Result<Value, ErrorData> {
        let opened = sealed.split_once('.').and_then(|(payload, tag)| {
            let tag = URL_SAFE_NO_PAD.decode(tag).ok()?;
            hmac::verify(&self.0, payload.as_bytes(), &tag).ok()?;
            let state: Value =
                serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).ok()?).ok()?;
            (state["tool"] == tool).then_some(state)
        });
        opened.ok_or_else(|| ErrorData::invalid_params("requestState integrity check failed", None))
    }
}

/// A JSON literal as one of rmcp's types. The literals are this file's own, so one that does not
/// fit is a bug here, found by the first request that uses it.
fn wire<T: DeserializeOwned>(value: Value) -> T {
    match serde_json::from_value(value) {
        Ok(typed) => typed,
        Err(err) => panic!("a JSON literal of conformance_upstream does not parse: {err}"),
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Whether this request is served under 2026-07-28 or later.
fn is_modern(context: &RequestContext<RoleServer>) -> bool {
    context
        .protocol_version()
        .is_some_and(|v| v.as_str() >= ProtocolVersion::V_2026_07_28.as_str())
}

fn text(text: impl Into<String>) -> CallToolResult {
    CallToolResult::success(vec![rmcp::model::ContentBlock::text(text.into())])
}

fn error_text(text: impl Into<String>) -> CallToolResult {
    CallToolResult::error(vec![rmcp::model::ContentBlock::text(text.into())])
}

/// An object schema with these properties.
fn object(properties: Value, required: &[&str]) -> Value {
    json!({"type": "object", "properties": properties, "required": required})
}

fn tool(name: &str, description: &str, input: Value) -> Value {
    json!({"name": name, "description": description, "inputSchema": input})
}

/// The tools, one list for both eras (a tool set does not vary per connection). The
/// `test_input_required_result_*` tools answer legacy sessions with an `isError` result: MRTR
/// exists from 2026-07-28 on.
static TOOLS: LazyLock<Vec<Tool>> = LazyLock::new(|| {
    let none = || object(json!({}), &[]);
    let mrtr = |name: &str, description: &str| tool(name, description, object(json!({}), &[]));
    wire(json!([
        tool("test_simple_text", "Returns one text block", none()),
        tool("test_image_content", "Returns one image block (a 1x1 PNG)", none()),
        tool("test_audio_content", "Returns one audio block (an empty WAV)", none()),
        tool("test_embedded_resource", "Returns one embedded text resource", none()),
        tool("test_multiple_content_types", "Returns text, image and resource blocks", none()),
        tool("test_tool_with_logging", "Sends three info log messages while it runs", none()),
        tool("test_tool_with_progress", "Reports progress 0, 50 and 100 of 100", none()),
        tool("test_error_handling", "Always answers with an isError result", none()),
        tool(
            "test_reconnection",
            "Closes its SSE response stream mid-call; the result arrives after the client \
             resumes with Last-Event-ID (SEP-1699)",
            none()
        ),
        tool(
            "test_sampling",
            "Asks the client's LLM for a completion of PROMPT",
            object(json!({"prompt": {"type": "string", "description": "The prompt for the LLM"}}), &["prompt"])
        ),
        tool(
            "test_elicitation",
            "Asks the user for input, showing MESSAGE",
            object(json!({"message": {"type": "string", "description": "What to ask the user"}}), &["message"])
        ),
        tool("test_elicitation_sep1034_defaults", "Elicits a form whose fields have defaults (SEP-1034)", none()),
        tool("test_elicitation_sep1330_enums", "Elicits a form with every enum variant (SEP-1330)", none()),
        {
            "name": "json_schema_2020_12_tool",
            "description": "Has an input schema using JSON Schema 2020-12 keywords (SEP-1613, SEP-2106)",
            "inputSchema": json_schema_2020_12(),
        },
        tool(
            "test_missing_capability",
            "Needs the client's sampling capability; without it: -32021",
            none()
        ),
        mrtr("test_input_required_result_elicitation", "MRTR: one elicitation, then a greeting"),
        mrtr("test_input_required_result_sampling", "MRTR: one sampling request, then its text"),
        mrtr("test_input_required_result_list_roots", "MRTR: one roots/list request, then the count"),
        mrtr("test_input_required_result_request_state", "MRTR: an elicitation with a sealed requestState"),
        mrtr("test_input_required_result_multiple_inputs", "MRTR: elicitation, sampling and roots at once"),
        mrtr("test_input_required_result_multi_round", "MRTR: two elicitation rounds"),
        mrtr("test_input_required_result_tampered_state", "MRTR: rejects a requestState changed by the client"),
        mrtr("test_input_required_result_capabilities", "MRTR: asks only for what the client declared"),
        tool("test_streaming_elicitation", "Reports progress, then completes", none()),
        tool("test_logging_tool", "Logs one message, only when the request asked for a log level", none()),
        tool(
            "test_custom_header",
            "Echoes REGION, which HTTP clients also send as the Mcp-Param-Region header (SEP-2243)",
            object(json!({"region": {"type": "string", "x-mcp-header": "Region"}}), &["region"])
        ),
        tool(
            "greet",
            "Says hello to NAME, at once (never a task)",
            object(json!({"name": {"type": "string"}}), &["name"])
        ),
        tool(
            "slow_compute",
            "Sleeps SECONDS, then answers; a task when the client has the tasks extension",
            object(
                json!({"seconds": {"type": "number", "minimum": 0}, "label": {"type": "string"}}),
                &["seconds"]
            )
        ),
        tool("failing_job", "A task (required) whose tool result is an error", none()),
        tool("protocol_error_job", "A task that fails with a JSON-RPC error", none()),
        tool(
            "confirm_delete",
            "Asks the user to confirm deleting FILENAME (inside the task when it is one)",
            object(json!({"filename": {"type": "string"}}), &["filename"])
        ),
        tool("multi_input", "A task that asks two questions at once", none()),
        tool(
            "test_tool_with_task",
            "MRTR for the user's name, then a task (required) that greets them",
            none()
        ),
        tool("test_trigger_tool_change", "Announces a tool list change to listen streams", none()),
        tool("test_trigger_prompt_change", "Announces a prompt list change to listen streams", none()),
    ]))
});

/// An input schema with the 2020-12 vocabulary that SDKs must pass through unchanged.
fn json_schema_2020_12() -> Value {
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "$defs": {
            "address": {
                "$anchor": "addressDef",
                "type": "object",
                "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
            },
        },
        "properties": {
            "name": {"type": "string"},
            "address": {"$ref": "#/$defs/address"},
            "contactMethod": {"type": "string", "enum": ["phone", "email"]},
            "phone": {"type": "string"},
            "email": {"type": "string"},
        },
        "allOf": [{"anyOf": [{"required": ["phone"]}, {"required": ["email"]}]}],
        "if": {"properties": {"contactMethod": {"const": "phone"}}, "required": ["contactMethod"]},
        "then": {"required": ["phone"]},
        "else": {"required": ["email"]},
        "additionalProperties": false,
    })
}

static PROMPTS: LazyLock<Vec<Prompt>> = LazyLock::new(|| {
    let arg = |name: &str, description: &str| json!({"name": name, "description": description, "required": true});
    wire(json!([
        {"name": "test_simple_prompt", "title": "Simple Test Prompt", "description": "A prompt without arguments"},
        {
            "name": "test_prompt_with_arguments",
            "title": "Prompt With Arguments",
            "description": "A prompt with two required arguments",
            "arguments": [arg("arg1", "First test argument"), arg("arg2", "Second test argument")],
        },
        {
            "name": "test_prompt_with_embedded_resource",
            "title": "Prompt With Embedded Resource",
            "description": "A prompt that embeds the resource RESOURCEURI",
            "arguments": [arg("resourceUri", "URI of the resource to embed")],
        },
        {"name": "test_prompt_with_image", "title": "Prompt With Image", "description": "A prompt with an image"},
        {
            "name": "test_input_required_result_prompt",
            "description": "MRTR: a prompt that first asks the user for context (2026-07-28)",
        },
    ]))
});

static RESOURCES: LazyLock<Vec<Resource>> = LazyLock::new(|| {
    wire(json!([
        {
            "uri": "test://static-text", "name": "static-text", "title": "Static Text Resource",
            "description": "A static text resource", "mimeType": "text/plain",
        },
        {
            "uri": "test://static-binary", "name": "static-binary", "title": "Static Binary Resource",
            "description": "A static binary resource (a PNG)", "mimeType": "image/png",
        },
        {
            "uri": "test://watched-resource", "name": "watched-resource", "title": "Watched Resource",
            "description": "A resource to subscribe to", "mimeType": "text/plain",
        },
        {
            "uri": "test://stateless-static-text", "name": "Stateless Static Text",
            "description": "A static text resource", "mimeType": "text/plain",
        },
    ]))
});

static TEMPLATES: LazyLock<Vec<ResourceTemplate>> = LazyLock::new(|| {
    wire(json!([{
        "uriTemplate": "test://template/{id}/data", "name": "template", "title": "Resource Template",
        "description": "A resource template with parameter substitution", "mimeType": "application/json",
    }]))
});

/// An `elicitation/create` input request for a form with these string properties, all required.
fn elicit(message: &str, properties: Value, required: &[&str]) -> Value {
    json!({
        "method": "elicitation/create",
        "params": {"message": message, "requestedSchema": object(properties, required)},
    })
}

fn sample(prompt: &str, max_tokens: u32) -> Value {
    json!({
        "method": "sampling/createMessage",
        "params": {
            "messages": [{"role": "user", "content": {"type": "text", "text": prompt}}],
            "maxTokens": max_tokens,
        },
    })
}

fn list_roots() -> Value {
    json!({"method": "roots/list", "params": {}})
}

/// `{"inputRequests": …, "requestState": …}` with `resultType: "input_required"`.
fn input_required(requests: Value, state: Option<String>) -> InputRequiredResult {
    let mut result = json!({"resultType": "input_required", "inputRequests": requests});
    if let Some(state) = state {
        result["requestState"] = json!(state);
    }
    wire(result)
}

/// The client capability an input request needs, as `requiredCapabilities` names it.
fn needed_capability(request: &Value) -> (&'static str, fn(&ClientCapabilities) -> bool) {
    match request["method"].as_str() {
        Some("sampling/createMessage") => ("sampling", |c| c.sampling.is_some()),
        Some("roots/list") => ("roots", |c| c.roots.is_some()),
        _ => ("elicitation", |c| c.elicitation.is_some()),
    }
}

/// An accepted form's `content[field]` as text; `None` for anything else.
fn accepted_field(response: Option<&Value>, field: &str) -> Option<String> {
    let response = response?;
    if response["action"] != "accept" {
        return None;
    }
    response["content"][field].as_str().map(str::to_owned)
}

/// The text of a `CreateMessageResult` (content as one block or a list of blocks).
fn sampled_text(response: &Value) -> Option<String> {
    let content = &response["content"];
    let block = if content.is_array() {
        &content[0]
    } else {
        content
    };
    block["text"].as_str().map(str::to_owned)
}

fn roots_count(response: Option<&Value>) -> Option<usize> {
    response?["roots"].as_array().map(Vec::len)
}

/// What a tool that needs the client's answer to one request got.
enum Asked {
    Answer(Value),
    /// 2026-07-28 without the answer yet: this is the result.
    Pending(InputRequiredResult),
    /// Legacy: the client could not answer.
    Failed(String),
}

impl Conformance {
    /// Asks the client `request` (`{method, params}`), the way the request's era allows: a
    /// server-to-client request on a legacy session, an MRTR round under 2026-07-28 (the answer is
    /// `inputResponses[key]` of the retry).
    async fn ask(
        &self,
        context: &RequestContext<RoleServer>,
        responses: Option<&InputResponses>,
        key: &str,
        request: Value,
    ) -> Result<Asked, ErrorData> {
        let (capability, declared) = needed_capability(&request);
        let caps = context.client_capabilities().unwrap_or_default();
        if !is_modern(context) {
            if !declared(&caps) {
                return Ok(Asked::Failed(format!(
                    "the client did not declare {capability}"
                )));
            }
            let request: ServerRequest = wire(request);
            return Ok(match context.peer.send_request(request).await {
                Ok(answer) => Asked::Answer(serde_json::to_value(answer).unwrap_or_default()),
                Err(err) => Asked::Failed(format!("the client did not answer: {err}")),
            });
        }
        if !declared(&caps) {
            return Err(ErrorData::missing_required_client_capability(wire(
                json!({capability: {}}),
            )));
        }
        match responses.and_then(|responses| responses.get(key)) {
            Some(answer) if answer.is_object() => Ok(Asked::Answer(answer.clone())),
            _ => Ok(Asked::Pending(input_required(json!({key: request}), None))),
        }
    }

    async fn log(&self, context: &RequestContext<RoleServer>, message: &str) {
        // 2026-07-28: a request that names no log level gets no log messages.
        if is_modern(context) && context.meta.log_level().is_none() {
            return;
        }
        let param: LoggingMessageNotificationParam = wire(json!({
            "level": "info", "logger": NAME, "data": message,
        }));
        if let Err(err) = context.peer.notify_logging_message(param).await {
            tracing::warn!(%err, "cannot send a log message");
        }
    }

    async fn progress(&self, context: &RequestContext<RoleServer>, done: f64, total: f64) {
        let Some(token) = context.meta.get_progress_token() else {
            return;
        };
        let param = ProgressNotificationParam::new(token, done)
            .with_total(total)
            .with_message(format!("Completed step {done} of {total}"));
        if let Err(err) = context.peer.notify_progress(param).await {
            tracing::warn!(%err, "cannot send progress");
        }
    }

    /// Every open listen stream that asked for it, and the caller's legacy session, hear that
    /// the tool (`prompts` false) or prompt list changed.
    async fn announce_list_change(&self, context: &RequestContext<RoleServer>, prompts: bool) {
        let listeners = lock(&self.0.listeners).clone();
        for sink in listeners {
            let sent = if prompts {
                sink.notify_prompt_list_changed().await
            } else {
                sink.notify_tool_list_changed().await
            };
            // A stream that did not ask for this kind refuses it: that is the filter working.
            if let Err(err) = sent {
                tracing::debug!(%err, "listen stream not told");
            }
        }
        if !is_modern(context) {
            let sent = if prompts {
                context.peer.notify_prompt_list_changed().await
            } else {
                context.peer.notify_tool_list_changed().await
            };
            if let Err(err) = sent {
                tracing::warn!(%err, "cannot send list_changed");
            }
        }
    }

    async fn reconnection(&self, context: &RequestContext<RoleServer>) -> CallToolResult {
        let session = context
            .extensions
            .get::<axum::http::request::Parts>()
            .and_then(|parts| parts.headers.get("mcp-session-id"))
            .and_then(|value| value.to_str().ok());
        let closed = match (&self.0.sessions, session) {
            (Some(sessions), Some(session)) => sessions.close_stream(session, &context.id).await,
            _ => false,
        };
        // Long enough for the client to see its stream end before the result exists.
        tokio::time::sleep(Duration::from_millis(100)).await;
        text(if closed {
            "Reconnection test completed: the stream was closed mid-call and resumed."
        } else {
            "Reconnection test completed without closing a stream (not a legacy HTTP session)."
        })
    }

    /// Tools that run the client's answer through `ask`, in either era.
    async fn asking_tool(
        &self,
        name: &str,
        args: &serde_json::Map<String, Value>,
        responses: Option<&InputResponses>,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let arg = |key: &str| args.get(key).and_then(Value::as_str).unwrap_or_default();
        let (key, request) = match name {
            "test_sampling" => ("llm", sample(arg("prompt"), 100)),
            "test_elicitation" => (
                "user_input",
                elicit(
                    arg("message"),
                    json!({"response": {"type": "string", "description": "The user's response"}}),
                    &["response"],
                ),
            ),
            "test_elicitation_sep1034_defaults" => ("form", sep1034_form()),
            _ => ("form", sep1330_form()),
        };
        let answer = match self.ask(context, responses, key, request).await? {
            Asked::Answer(answer) => answer,
            Asked::Pending(pending) => return Ok(pending.into()),
            Asked::Failed(why) => return Ok(error_text(why).into()),
        };
        let summary = |prefix: &str| {
            let content = answer.get("content").cloned().unwrap_or(json!({}));
            format!(
                "{prefix}: action={}, content={content}",
                answer["action"].as_str().unwrap_or("")
            )
        };
        Ok(match name {
            "test_sampling" => text(format!(
                "LLM response: {}",
                sampled_text(&answer).unwrap_or_else(|| "No response".to_owned())
            )),
            "test_elicitation" => text(summary("User response")),
            _ => text(summary("Elicitation completed")),
        }
        .into())
    }

    /// The `test_input_required_result_*` tools (2026-07-28 only).
    fn mrtr_tool(
        &self,
        name: &str,
        request: &CallToolRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let empty = InputResponses::new();
        let responses = request.input_responses.as_ref().unwrap_or(&empty);
        let state = match &request.request_state {
            Some(sealed) => Some(self.0.seal.open(name, sealed)?),
            None => None,
        };
        let seal = |state: Value| Some(self.0.seal.seal(name, state));
        let name_form = || {
            elicit(
                "What is your name?",
                json!({"name": {"type": "string"}}),
                &["name"],
            )
        };
        let confirm_form = || {
            elicit(
                "Please confirm",
                json!({"ok": {"type": "boolean"}}),
                &["ok"],
            )
        };
        let result = match name {
            "test_input_required_result_elicitation" => {
                match accepted_field(responses.get("user_name"), "name") {
                    Some(user) => text(format!("Hello, {user}!")).into(),
                    None => input_required(json!({"user_name": name_form()}), None).into(),
                }
            }
            "test_input_required_result_sampling" => {
                match responses.get("capital_question").and_then(sampled_text) {
                    Some(answer) => text(format!("Sampling result: {answer}")).into(),
                    None => input_required(
                        json!({"capital_question": sample("What is the capital of France?", 100)}),
                        None,
                    )
                    .into(),
                }
            }
            "test_input_required_result_list_roots" => {
                match roots_count(responses.get("client_roots")) {
                    Some(count) => text(format!("Found {count} root(s)")).into(),
                    None => input_required(json!({"client_roots": list_roots()}), None).into(),
                }
            }
            "test_input_required_result_request_state" => {
                let confirmed = responses
                    .get("confirm")
                    .is_some_and(|r| r["action"] == "accept" && r["content"]["ok"] == true);
                if state.is_some() && confirmed {
                    text("state-ok: requestState validated").into()
                } else {
                    let state = seal(json!({"kind": "request-state"}));
                    input_required(json!({"confirm": confirm_form()}), state).into()
                }
            }
            "test_input_required_result_multiple_inputs" => {
                let user = accepted_field(responses.get("user_name"), "name");
                let greeting = responses.get("greeting").and_then(sampled_text);
                let roots = roots_count(responses.get("client_roots"));
                match (&state, user, greeting, roots) {
                    (Some(_), Some(user), Some(greeting), Some(roots)) => text(format!(
                        "Name: {user}; Greeting: {greeting}; Roots: {roots}"
                    ))
                    .into(),
                    _ => input_required(
                        json!({
                            "user_name": name_form(),
                            "greeting": sample("Generate a greeting", 50),
                            "client_roots": list_roots(),
                        }),
                        seal(json!({"kind": "multiple-inputs"})),
                    )
                    .into(),
                }
            }
            "test_input_required_result_multi_round" => {
                let round = state.as_ref().and_then(|s| s["round"].as_u64());
                let step1 = accepted_field(responses.get("step1"), "name");
                let step2 = accepted_field(responses.get("step2"), "color");
                let ask_color = |user: String| {
                    let form = elicit(
                        "Step 2: What is your favorite color?",
                        json!({"color": {"type": "string"}}),
                        &["color"],
                    );
                    input_required(
                        json!({"step2": form}),
                        seal(json!({"round": 2, "name": user})),
                    )
                };
                match (round, step1, step2) {
                    (Some(1), Some(user), _) => ask_color(user).into(),
                    (Some(2), _, Some(color)) => {
                        let user = state
                            .as_ref()
                            .and_then(|s| s["name"].as_str())
                            .unwrap_or("?");
                        text(format!("Multi-round complete for {user} who likes {color}")).into()
                    }
                    _ => {
                        let form = elicit(
                            "Step 1: What is your name?",
                            json!({"name": {"type": "string"}}),
                            &["name"],
                        );
                        input_required(json!({"step1": form}), seal(json!({"round": 1}))).into()
                    }
                }
            }
            "test_input_required_result_tampered_state" => {
                if state.is_some() && responses.contains_key("confirm") {
                    text("integrity-ok: state verified").into()
                } else {
                    let state = seal(json!({"kind": "tamper-test"}));
                    input_required(json!({"confirm": confirm_form()}), state).into()
                }
            }
            _ => {
                // test_input_required_result_capabilities: only what this request declared.
                let caps = context.client_capabilities().unwrap_or_default();
                let mut requests = serde_json::Map::new();
                if caps.elicitation.is_some() {
                    let form = elicit(
                        "Elicitation input",
                        json!({"value": {"type": "string"}}),
                        &["value"],
                    );
                    requests.insert("elicit_input".to_owned(), form);
                }
                if caps.sampling.is_some() {
                    requests.insert("sample_input".to_owned(), sample("Sample request", 50));
                }
                if !responses.is_empty() {
                    let keys: Vec<&str> = responses.keys().map(String::as_str).collect();
                    text(format!("capabilities-ok: received {}", keys.join(","))).into()
                } else if requests.is_empty() {
                    text("No supported capabilities declared").into()
                } else {
                    let state = seal(json!({"kind": "capabilities-test"}));
                    input_required(Value::Object(requests), state).into()
                }
            }
        };
        Ok(result)
    }
}

impl Conformance {
    /// The tasks extension's tools (SEP-2663). A "task-supporting" tool becomes a task when the
    /// request declares the extension and runs at once otherwise; a "required" one answers
    /// -32021 without it (legacy sessions, which have no such error, get an `isError` result).
    async fn task_tool(
        &self,
        name: &str,
        args: &serde_json::Map<String, Value>,
        request: &CallToolRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let arg = |key: &str| {
            args.get(key)
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned()
        };
        let as_task = is_modern(context)
            && context
                .client_capabilities()
                .is_some_and(|caps| caps.supports_tasks());
        let required = || -> Result<CallToolResponse, ErrorData> {
            if is_modern(context) {
                Err(ErrorData::missing_required_client_capability(wire(
                    json!({"extensions": {TASKS: {}}}),
                )))
            } else {
                Ok(error_text(format!(
                    "{name} runs only as a task (2026-07-28 tasks extension)"
                ))
                .into())
            }
        };
        let confirm = |filename: &str| {
            elicit(
                &format!("Delete {filename}?"),
                json!({"confirm": {"type": "boolean"}}),
                &["confirm"],
            )
        };
        let confirmed =
            |answer: &Value| answer["action"] == "accept" && answer["content"]["confirm"] == true;
        match name {
            "greet" => Ok(text(format!("Hello, {}!", arg("name"))).into()),
            "slow_compute" => {
                let seconds = args.get("seconds").and_then(Value::as_f64).unwrap_or(0.0);
                let wait = Duration::from_secs_f64(seconds.clamp(0.0, 600.0));
                let done = text(format!("Computed {} after {seconds} s", arg("label")));
                if !as_task {
                    tokio::time::sleep(wait).await;
                    return Ok(done.into());
                }
                Ok(self.spawn_task(move |task| {
                    Box::pin(async move {
                        tokio::select! {
                            () = task.cancelled() => Err(TaskExit::Cancelled),
                            () = tokio::time::sleep(wait) => Ok(done),
                        }
                    })
                }))
            }
            "failing_job" if as_task => Ok(self.spawn_task(|_| {
                // A tool error: the task completes, its result says isError.
                Box::pin(async { Ok(error_text("The job failed (a tool error).")) })
            })),
            "failing_job" => required(),
            "protocol_error_job" => {
                let error = ErrorData::internal_error("The job hit a protocol error.", None);
                if !as_task {
                    return Err(error);
                }
                Ok(self.spawn_task(|_| Box::pin(async { Err(TaskExit::Error(error)) })))
            }
            "confirm_delete" => {
                let filename = arg("filename");
                if !as_task {
                    let responses = request.input_responses.as_ref();
                    return Ok(
                        match self
                            .ask(context, responses, "confirm", confirm(&filename))
                            .await?
                        {
                            Asked::Answer(answer) if confirmed(&answer) => {
                                text(format!("Deleted {filename}")).into()
                            }
                            Asked::Answer(_) => text(format!("Kept {filename}")).into(),
                            Asked::Pending(pending) => pending.into(),
                            Asked::Failed(why) => error_text(why).into(),
                        },
                    );
                }
                let question: rmcp::model::InputRequest = wire(confirm(&filename));
                Ok(self.spawn_task(move |task| {
                    Box::pin(async move {
                        let answer = task.request_input("confirm", question).await?;
                        Ok(if confirmed(&answer) {
                            text(format!("Deleted {filename}"))
                        } else {
                            text(format!("Kept {filename}"))
                        })
                    })
                }))
            }
            "multi_input" if as_task => {
                let first: rmcp::model::InputRequest = wire(elicit(
                    "What is your name?",
                    json!({"name": {"type": "string"}}),
                    &["name"],
                ));
                let second: rmcp::model::InputRequest = wire(elicit(
                    "What is your favorite color?",
                    json!({"color": {"type": "string"}}),
                    &["color"],
                ));
                Ok(self.spawn_task(move |task| {
                    Box::pin(async move {
                        let (name, color) = tokio::join!(
                            task.request_input("name", first),
                            task.request_input("color", second)
                        );
                        let (name, color) = (name?, color?);
                        let user = accepted_field(Some(&name), "name").unwrap_or_default();
                        let color = accepted_field(Some(&color), "color").unwrap_or_default();
                        Ok(text(format!("{user} likes {color}")))
                    })
                }))
            }
            "multi_input" => required(),
            _ => {
                // test_tool_with_task: an MRTR round for the name, then a task.
                let responses = request.input_responses.as_ref();
                let Some(user) = accepted_field(responses.and_then(|r| r.get("user_name")), "name")
                else {
                    if !is_modern(context) {
                        return required();
                    }
                    let form = elicit(
                        "What is your name?",
                        json!({"name": {"type": "string"}}),
                        &["name"],
                    );
                    return Ok(input_required(json!({"user_name": form}), None).into());
                };
                if !as_task {
                    return required();
                }
                Ok(self.spawn_task(move |_| {
                    Box::pin(async move { Ok(text(format!("Hello, {user}! (from a task)"))) })
                }))
            }
        }
    }

    /// Runs `operation` as a task; the task exists (`tasks/get` finds it) before this returns.
    fn spawn_task(&self, operation: impl FnOnce(TaskContext) -> TaskFuture) -> CallToolResponse {
        let options = TaskOptions::new().with_poll_interval_ms(TASK_POLL_MS);
        CreateTaskResult::new(self.0.tasks.spawn(options, operation)).into()
    }
}

fn sep1034_form() -> Value {
    json!({
        "method": "elicitation/create",
        "params": {
            "message": "Please review and update the form fields with defaults",
            "requestedSchema": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "description": "User name", "default": "John Doe"},
                    "age": {"type": "integer", "description": "User age", "default": 30},
                    "score": {"type": "number", "description": "User score", "default": 95.5},
                    "status": {
                        "type": "string", "description": "User status",
                        "enum": ["active", "inactive", "pending"], "default": "active",
                    },
                    "verified": {"type": "boolean", "description": "Verification status", "default": true},
                },
                "required": [],
            },
        },
    })
}

fn sep1330_form() -> Value {
    let titled = |prefix: &str, word: &str| {
        json!([
            {"const": format!("{prefix}1"), "title": format!("First {word}")},
            {"const": format!("{prefix}2"), "title": format!("Second {word}")},
            {"const": format!("{prefix}3"), "title": format!("Third {word}")},
        ])
    };
    json!({
        "method": "elicitation/create",
        "params": {
            "message": "Please select options from the enum fields",
            "requestedSchema": {
                "type": "object",
                "properties": {
                    "untitledSingle": {
                        "type": "string", "description": "Select one option",
                        "enum": ["option1", "option2", "option3"],
                    },
                    "titledSingle": {
                        "type": "string", "description": "Select one option with titles",
                        "oneOf": titled("value", "Option"),
                    },
                    "legacyEnum": {
                        "type": "string", "description": "Select one option (legacy)",
                        "enum": ["opt1", "opt2", "opt3"],
                        "enumNames": ["Option One", "Option Two", "Option Three"],
                    },
                    "untitledMulti": {
                        "type": "array", "description": "Select multiple options",
                        "minItems": 1, "maxItems": 3,
                        "items": {"type": "string", "enum": ["option1", "option2", "option3"]},
                    },
                    "titledMulti": {
                        "type": "array", "description": "Select multiple options with titles",
                        "minItems": 1, "maxItems": 3,
                        "items": {"anyOf": titled("value", "Choice")},
                    },
                },
                "required": [],
            },
        },
    })
}

/// The contents of a resource this server has, by URI (templates included).
fn resource_contents(uri: &str) -> Option<Value> {
    let text = |mime: &str, text: &str| json!({"uri": uri, "mimeType": mime, "text": text});
    Some(match uri {
        "test://static-text" => text(
            "text/plain",
            "This is the content of the static text resource.",
        ),
        "test://static-binary" => json!({"uri": uri, "mimeType": "image/png", "blob": PNG_1X1}),
        "test://watched-resource" => text("text/plain", "Watched resource content"),
        "test://stateless-static-text" => {
            text("text/plain", "Static text content from the stateless path.")
        }
        _ => {
            let id = uri
                .strip_prefix("test://template/")?
                .strip_suffix("/data")?;
            if id.is_empty() || id.contains('/') {
                return None;
            }
            let data =
                json!({"id": id, "templateTest": true, "data": format!("Data for ID: {id}")});
            text("application/json", &data.to_string())
        }
    })
}

/// The contents of `uri`, or resource-not-found with the URI in `data`: -32002 for legacy
/// peers, which rmcp makes -32602 for 2026-07-28 (SEP-2164).
fn read(uri: &str) -> Result<Value, ErrorData> {
    resource_contents(uri).ok_or_else(|| {
        ErrorData::resource_not_found(
            format!("Resource not found: {uri}"),
            Some(json!({"uri": uri})),
        )
    })
}

impl ServerHandler for Conformance {
    fn get_info(&self) -> ServerConfig {
        let capabilities: ServerCapabilities = wire(json!({
            "tools": {"listChanged": true},
            "prompts": {"listChanged": true},
            "resources": {"subscribe": true, "listChanged": true},
            "logging": {},
            "completions": {},
            "extensions": {TASKS: {}},
        }));
        ServerConfig::new(capabilities)
            .with_server_info(Implementation::new(NAME, env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "The server the MCP conformance suite's server scenarios run against.",
            )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(TOOLS.clone())
            .with_ttl_ms(TTL_MS)
            .with_cache_scope(CacheScope::Public))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        TOOLS.iter().find(|tool| tool.name == name).cloned()
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let name = request.name.to_string();
        if self.get_tool(&name).is_none() {
            return Err(ErrorData::invalid_params(
                format!("Unknown tool: {name}"),
                None,
            ));
        }
        let args = request.arguments.clone().unwrap_or_default();
        let content =
            |blocks: Value| -> CallToolResponse { CallToolResult::success(wire(blocks)).into() };
        let embedded = |uri: &str, mime: &str, text: &str| json!({"type": "resource", "resource": {"uri": uri, "mimeType": mime, "text": text}});
        let image = json!({"type": "image", "data": PNG_1X1, "mimeType": "image/png"});
        Ok(match name.as_str() {
            "test_simple_text" => text("This is a simple text response for testing.").into(),
            "test_image_content" => content(json!([image])),
            "test_audio_content" => {
                content(json!([{"type": "audio", "data": WAV_EMPTY, "mimeType": "audio/wav"}]))
            }
            "test_embedded_resource" => content(json!([embedded(
                "test://embedded-resource",
                "text/plain",
                "This is an embedded resource content."
            )])),
            "test_multiple_content_types" => content(json!([
                {"type": "text", "text": "Multiple content types test:"},
                image,
                embedded(
                    "test://mixed-content-resource",
                    "application/json",
                    &json!({"test": "data", "value": 123}).to_string()
                ),
            ])),
            "test_tool_with_logging" => {
                for (i, message) in [
                    "Tool execution started",
                    "Tool processing data",
                    "Tool execution completed",
                ]
                .into_iter()
                .enumerate()
                {
                    if i > 0 {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    self.log(&context, message).await;
                }
                text("Tool with logging executed successfully").into()
            }
            "test_tool_with_progress" => {
                for (i, done) in [0.0, 50.0, 100.0].into_iter().enumerate() {
                    if i > 0 {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    self.progress(&context, done, 100.0).await;
                }
                let token = context.meta.get_progress_token();
                text(token.map_or_else(|| "no progress token".to_owned(), |t| t.0.to_string()))
                    .into()
            }
            "test_error_handling" => {
                error_text("This tool intentionally returns an error for testing").into()
            }
            "test_reconnection" => self.reconnection(&context).await.into(),
            "test_sampling"
            | "test_elicitation"
            | "test_elicitation_sep1034_defaults"
            | "test_elicitation_sep1330_enums" => {
                let responses = request.input_responses.as_ref();
                return self.asking_tool(&name, &args, responses, &context).await;
            }
            "json_schema_2020_12_tool" => text(format!(
                "JSON Schema 2020-12 tool called with: {}",
                Value::Object(args)
            ))
            .into(),
            "test_missing_capability" => {
                let caps = context.client_capabilities().unwrap_or_default();
                if caps.sampling.is_none() {
                    return Err(ErrorData::missing_required_client_capability(wire(
                        json!({"sampling": {}}),
                    )));
                }
                text("Success").into()
            }
            "test_streaming_elicitation" => {
                self.progress(&context, 50.0, 100.0).await;
                text("Streaming complete").into()
            }
            "test_logging_tool" => {
                self.log(&context, "Diagnostic trace logging activated")
                    .await;
                text("Logging evaluated").into()
            }
            "test_custom_header" => {
                let region = args
                    .get("region")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                text(format!("region: {region}")).into()
            }
            "test_trigger_tool_change" | "test_trigger_prompt_change" => {
                let prompts = name == "test_trigger_prompt_change";
                self.announce_list_change(&context, prompts).await;
                text("Mutation triggered").into()
            }
            "greet"
            | "slow_compute"
            | "failing_job"
            | "protocol_error_job"
            | "confirm_delete"
            | "multi_input"
            | "test_tool_with_task" => {
                return self.task_tool(&name, &args, &request, &context).await;
            }
            mrtr if !is_modern(&context) => error_text(format!(
                "{mrtr} uses MRTR (InputRequiredResult), which needs protocol 2026-07-28"
            ))
            .into(),
            mrtr => return self.mrtr_tool(mrtr, &request, &context),
        })
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, ErrorData> {
        Ok(ListPromptsResult::with_all_items(PROMPTS.clone())
            .with_ttl_ms(TTL_MS)
            .with_cache_scope(CacheScope::Public))
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, ErrorData> {
        let args = request.arguments.clone().unwrap_or_default();
        let arg = |key: &str| match args.get(key).and_then(Value::as_str) {
            Some(value) => Ok(value.to_owned()),
            None => Err(ErrorData::invalid_params(
                format!("argument `{key}` is required"),
                None,
            )),
        };
        let user_text =
            |text: &str| json!({"role": "user", "content": {"type": "text", "text": text}});
        let messages = match request.name.as_str() {
            "test_simple_prompt" => json!([user_text("This is a simple prompt for testing.")]),
            "test_prompt_with_arguments" => {
                let (arg1, arg2) = (arg("arg1")?, arg("arg2")?);
                json!([user_text(&format!(
                    "Prompt with arguments: arg1='{arg1}', arg2='{arg2}'"
                ))])
            }
            "test_prompt_with_embedded_resource" => {
                let uri = arg("resourceUri")?;
                json!([
                    {"role": "user", "content": {"type": "resource", "resource": {
                        "uri": uri, "mimeType": "text/plain", "text": "Embedded resource content for testing.",
                    }}},
                    user_text("Please process the embedded resource above."),
                ])
            }
            "test_prompt_with_image" => json!([
                {"role": "user", "content": {"type": "image", "data": PNG_1X1, "mimeType": "image/png"}},
                user_text("Please analyze the image above."),
            ]),
            "test_input_required_result_prompt" => {
                if !is_modern(&context) {
                    return Err(ErrorData::invalid_params(
                        "this prompt uses MRTR, which needs protocol 2026-07-28",
                        None,
                    ));
                }
                let responses = request.input_responses.as_ref();
                match accepted_field(responses.and_then(|r| r.get("user_context")), "context") {
                    Some(context) => json!([user_text(&format!("Prompt with context: {context}"))]),
                    None => {
                        let form = elicit(
                            "What context should the prompt use?",
                            json!({"context": {"type": "string"}}),
                            &["context"],
                        );
                        return Ok(input_required(json!({"user_context": form}), None).into());
                    }
                }
            }
            other => {
                return Err(ErrorData::invalid_params(
                    format!("Unknown prompt: {other}"),
                    None,
                ));
            }
        };
        Ok(GetPromptResult::new(wire(messages)).into())
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        Ok(ListResourcesResult::with_all_items(RESOURCES.clone())
            .with_ttl_ms(TTL_MS)
            .with_cache_scope(CacheScope::Public))
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        Ok(
            ListResourceTemplatesResult::with_all_items(TEMPLATES.clone())
                .with_ttl_ms(TTL_MS)
                .with_cache_scope(CacheScope::Public),
        )
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let contents = read(&request.uri)?;
        Ok(ReadResourceResult::new(vec![wire(contents)])
            .with_ttl_ms(TTL_MS)
            .with_cache_scope(CacheScope::Private)
            .into())
    }

    /// Legacy `resources/subscribe`: accepted for any resource this server has. Its resources
    /// never change, so no `notifications/resources/updated` follows.
    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        read(&request.uri).map(drop)
    }

    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        read(&request.uri).map(drop)
    }

    async fn set_level(
        &self,
        _request: SetLevelRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        Ok(())
    }

    async fn complete(
        &self,
        _request: CompleteRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, ErrorData> {
        let none: CompletionInfo = wire(json!({"values": [], "total": 0, "hasMore": false}));
        Ok(CompleteResult::new(none))
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        Ok(GetTaskResult::new(self.0.tasks.get_task(&request.task_id)?))
    }

    async fn update_task(
        &self,
        request: UpdateTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.0
            .tasks
            .update_task(&request.task_id, request.input_responses)
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.0.tasks.cancel_task(&request.task_id)
    }

    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        // All of it; rmcp narrows it to what the capabilities advertise.
        Some(requested.clone())
    }

    async fn listen(&self, context: SubscriptionContext) -> Result<(), ErrorData> {
        let sink = context.sink().clone();
        let id = sink.id().clone();
        lock(&self.0.listeners).push(sink);
        context.cancelled().await;
        lock(&self.0.listeners).retain(|sink| sink.id() != &id);
        Ok(())
    }
}
