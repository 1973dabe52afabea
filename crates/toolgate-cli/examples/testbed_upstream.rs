//! An upstream MCP server for the proxy's tests and benchmarks: stdio only (stdout carries protocol,
//! logs go to stderr), built on rmcp like the real server, with tools whose effects land in files so a
//! test can prove what reached the upstream and how often.
//!
//! ```text
//! testbed_upstream --dir D [--protocol modern|legacy|both] [--name NAME]
//! ```
//!
//! Files under `--dir` (created if missing):
//! - `calls.log`: one line `TOOLNAME` per `tools/call` that reached this process (appended, not
//!   fsynced), unknown tools included;
//! - `records.jsonl`: `{"id":..,"value":..}` lines of `write_record` / `crash_after_write`, each
//!   fdatasynced before the answer; `delete_record` rewrites it through an atomic rename;
//! - `cancelled.log`: `cancelled <ms>` (from `slow`) and `hang cancelled` lines. A handler's token is
//!   cancelled both by `notifications/cancelled` and when the session ends with the call still running
//!   (stdin closed), so a line here means "stopped before answering", not which of the two it was;
//! - `echo_description`: read once at start; if present, its content (trailing newline dropped) is
//!   `echo`'s description, so a test can start the server with a changed definition.
//!
//! Protocol eras: `both` serves 2026-07-28 and the four `initialize` revisions, as the real server.
//! `modern` serves 2026-07-28 only; rmcp answers `initialize` with -32022 and the process then exits
//! (rmcp ends the service when the handshake fails). `legacy` serves only the `initialize` revisions
//! and, by default, answers `server/discover` with -32601 "Method not found" at the transport, the way
//! a server from before 2026-07-28 does: narrowing rmcp's version list alone is not enough, because
//! rmcp still knows the method and answers it with -32022 (`data.supported` = the legacy versions),
//! which a client in `ClientLifecycleMode::Auto` reads as a *modern* server and does not fall back
//! from. `--legacy-discover rmcp` keeps that rmcp answer, to test an rmcp server narrowed to legacy.
//!
//! Tool-list changes: `set_description` sends `notifications/tools/list_changed` to the caller when it
//! is a legacy session and on every open `subscriptions/listen` stream that asked for tool changes
//! (2026-07-28 allows that notification nowhere else).

use std::borrow::Cow;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Parser, ValueEnum};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ClientJsonRpcMessage, ContentBlock,
    ErrorCode, GetPromptRequestParams, GetPromptResponse, GetPromptResult, Implementation,
    JsonObject, JsonRpcMessage, ListPromptsResult, ListResourcesResult, ListToolsResult,
    PaginatedRequestParams, ProgressNotificationParam, Prompt, PromptArgument, PromptMessage,
    ProtocolVersion, ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult, Resource,
    ResourceContents, Role, ServerCapabilities, ServerConfig, ServerJsonRpcMessage,
    SubscriptionFilter, Tool, ToolAnnotations,
};
use rmcp::service::{RequestContext, SubscriptionContext, SubscriptionSink};
use rmcp::transport::Transport;
use rmcp::transport::async_rw::AsyncRwTransport;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde_json::{Value, json};

const ALL_VERSIONS: &[ProtocolVersion] = &[
    ProtocolVersion::V_2026_07_28,
    ProtocolVersion::V_2025_11_25,
    ProtocolVersion::V_2025_06_18,
    ProtocolVersion::V_2025_03_26,
    ProtocolVersion::V_2024_11_05,
];
const MODERN_VERSIONS: &[ProtocolVersion] = &[ProtocolVersion::V_2026_07_28];
const LEGACY_VERSIONS: &[ProtocolVersion] = &[
    ProtocolVersion::V_2025_11_25,
    ProtocolVersion::V_2025_06_18,
    ProtocolVersion::V_2025_03_26,
    ProtocolVersion::V_2024_11_05,
];

const DISCOVER: &str = "server/discover";
const DEFAULT_ECHO_DESCRIPTION: &str = "Returns TEXT as \"echo: TEXT\" and as structuredContent.";
const README_URI: &str = "testbed://readme";
const README_TEXT: &str = "testbed_upstream: an MCP server for toolgate's proxy tests. Its tools \
write their effects under --dir (calls.log, records.jsonl, cancelled.log).\n";

/// Process exit code of `crash_after_write`.
const CRASH_EXIT_CODE: i32 = 101;

#[derive(Debug, Parser)]
#[command(about = "MCP stdio server with observable side effects, for toolgate proxy tests")]
struct Args {
    /// Protocol revisions served.
    #[arg(long, value_enum, default_value_t = Protocol::Both)]
    protocol: Protocol,
    /// Directory the tools write their effects to (created if missing).
    #[arg(long, value_name = "DIR")]
    dir: PathBuf,
    /// `serverInfo.name`.
    #[arg(long, default_value = "testbed")]
    name: String,
    /// With `--protocol legacy`: how `server/discover` is answered.
    #[arg(long, value_enum, default_value_t = LegacyDiscover::MethodNotFound)]
    legacy_discover: LegacyDiscover,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Protocol {
    /// 2026-07-28 only: `initialize` is refused.
    Modern,
    /// The `initialize` revisions only (2025-11-25 … 2024-11-05).
    Legacy,
    /// All five.
    Both,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum LegacyDiscover {
    /// -32601 "Method not found", as a server that predates 2026-07-28.
    MethodNotFound,
    /// Whatever rmcp answers with the narrowed version list (-32022 for a 2026-07-28 probe).
    Rmcp,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_env("TESTBED_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(io::stderr)
        .with_ansi(false)
        .try_init();
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("testbed_upstream: {err:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    let server = Testbed::open(&args)?;
    let (reader, writer) = rmcp::transport::stdio_pipes();
    let transport = AsyncRwTransport::<RoleServer, _, _>::new(reader, writer);
    let running = if args.protocol == Protocol::Legacy
        && args.legacy_discover == LegacyDiscover::MethodNotFound
    {
        server.serve(NoDiscover { inner: transport }).await
    } else {
        server.serve(transport).await
    };
    let running = match running {
        Ok(running) => running,
        // stdin closed before any request: nothing to serve.
        Err(rmcp::service::ServerInitializeError::ConnectionClosed(_)) => return Ok(()),
        Err(err) => return Err(err).context("the session did not start"),
    };
    let reason = running.waiting().await.context("the service loop failed")?;
    tracing::info!(?reason, "session ended");
    Ok(())
}

/// A transport that answers `server/discover` itself with -32601, so the handler behind it looks
/// like a server from before 2026-07-28 to a client probing the era.
#[derive(Debug)]
struct NoDiscover<T> {
    inner: T,
}

impl<T: Transport<RoleServer>> Transport<RoleServer> for NoDiscover<T> {
    type Error = T::Error;

    fn send(
        &mut self,
        item: ServerJsonRpcMessage,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.inner.send(item)
    }

    async fn receive(&mut self) -> Option<ClientJsonRpcMessage> {
        loop {
            let message = self.inner.receive().await?;
            // By method name: a discover without `params` parses as a custom request.
            if let JsonRpcMessage::Request(request) = &message
                && request.request.method() == DISCOVER
            {
                let error = ErrorData::new(ErrorCode::METHOD_NOT_FOUND, "Method not found", None);
                // Spawned, not awaited: `receive` may be dropped by rmcp's select loop, and a
                // half-written frame would corrupt stdout. rmcp's writer serialises whole frames.
                let send = self
                    .inner
                    .send(ServerJsonRpcMessage::error(error, Some(request.id.clone())));
                tokio::spawn(async move {
                    if let Err(err) = send.await {
                        tracing::error!(%err, "cannot answer server/discover");
                    }
                });
                continue;
            }
            return Some(message);
        }
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.inner.close()
    }
}

#[derive(Clone, Debug)]
struct Testbed(Arc<State>);

#[derive(Debug)]
struct State {
    name: String,
    protocol: Protocol,
    dir: PathBuf,
    echo_description: RwLock<String>,
    /// Held (in blocking threads only) across every change to `records.jsonl`.
    records: Arc<Mutex<Records>>,
    /// Open `subscriptions/listen` streams that accepted `toolsListChanged`.
    listeners: Mutex<Vec<SubscriptionSink>>,
}

#[derive(Debug)]
struct Records {
    path: PathBuf,
    file: File,
    count: usize,
}

impl Testbed {
    fn open(args: &Args) -> anyhow::Result<Self> {
        let dir = &args.dir;
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let echo_description = match std::fs::read_to_string(dir.join("echo_description")) {
            Ok(text) => text.trim_end_matches(['\n', '\r']).to_owned(),
            Err(err) if err.kind() == io::ErrorKind::NotFound => {
                DEFAULT_ECHO_DESCRIPTION.to_owned()
            }
            Err(err) => return Err(err).context("cannot read echo_description"),
        };
        let path = dir.join("records.jsonl");
        let count = match std::fs::read_to_string(&path) {
            Ok(text) => text.lines().count(),
            Err(err) if err.kind() == io::ErrorKind::NotFound => 0,
            Err(err) => return Err(err).with_context(|| format!("cannot read {}", path.display())),
        };
        let file = append_handle(&path)?;
        sync_dir(dir)?;
        Ok(Self(Arc::new(State {
            name: args.name.clone(),
            protocol: args.protocol,
            dir: dir.clone(),
            echo_description: RwLock::new(echo_description),
            records: Arc::new(Mutex::new(Records { path, file, count })),
            listeners: Mutex::new(Vec::new()),
        })))
    }

    fn tools(&self) -> Vec<Tool> {
        let echo_description = self
            .0
            .echo_description
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let text = json!({"text": {"type": "string"}});
        let id_value = json!({"id": {"type": "string"}, "value": {"type": "string"}});
        vec![
            Tool::new("echo", echo_description, schema(&text, &["text"]))
                .with_raw_output_schema(schema(&text, &["text"]))
                .with_annotations(annotations(true, false, true)),
            Tool::new(
                "write_record",
                "Appends {id, value} to records.jsonl (fdatasynced) and returns the record count.",
                schema(&id_value, &["id", "value"]),
            )
            .with_annotations(annotations(false, false, false)),
            Tool::new(
                "delete_record",
                "Removes every record with this id from records.jsonl.",
                schema(&json!({"id": {"type": "string"}}), &["id"]),
            )
            .with_annotations(annotations(false, true, true)),
            Tool::new(
                "slow",
                "Sleeps MS milliseconds in STEPS steps, reporting progress after each step.",
                schema(
                    &json!({
                        "ms": {"type": "integer", "minimum": 0},
                        "steps": {"type": "integer", "minimum": 1},
                    }),
                    &["ms", "steps"],
                ),
            )
            .with_annotations(annotations(true, false, true)),
            Tool::new(
                "crash_after_write",
                "Appends {id, value} to records.jsonl, then kills the server before answering.",
                schema(&id_value, &["id", "value"]),
            )
            .with_annotations(annotations(false, false, false)),
            Tool::new(
                "hang",
                "Never answers; only cancellation ends it.",
                schema(&json!({}), &[]),
            )
            .with_annotations(annotations(true, false, true)),
            Tool::new(
                "set_description",
                "Replaces the description of `echo` and announces the tool-list change.",
                schema(&text, &["text"]),
            )
            .with_annotations(annotations(false, true, true)),
            Tool::new(
                "fail",
                "Answers with an isError result carrying MESSAGE.",
                schema(&json!({"message": {"type": "string"}}), &["message"]),
            )
            .with_annotations(annotations(true, false, true)),
        ]
    }

    fn supported(&self) -> &'static [ProtocolVersion] {
        match self.0.protocol {
            Protocol::Modern => MODERN_VERSIONS,
            Protocol::Legacy => LEGACY_VERSIONS,
            Protocol::Both => ALL_VERSIONS,
        }
    }

    fn implementation(&self) -> Implementation {
        Implementation::new(self.0.name.clone(), env!("CARGO_PKG_VERSION"))
    }

    /// Appends `line` to `DIR/<file>` with one write; flushed (unbuffered), not synced.
    fn append_log(&self, file: &str, line: &str) -> Result<(), ErrorData> {
        let path = self.0.dir.join(file);
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(format!("{line}\n").as_bytes()))
            .map_err(|err| internal(format!("cannot append to {}: {err}", path.display())))
    }

    /// Runs `change` on the records file in a blocking thread, under the records lock.
    async fn with_records<T: Send + 'static>(
        &self,
        change: impl FnOnce(&mut Records) -> io::Result<T> + Send + 'static,
    ) -> Result<T, ErrorData> {
        let records = Arc::clone(&self.0.records);
        tokio::task::spawn_blocking(move || {
            let mut records = records.lock().unwrap_or_else(PoisonError::into_inner);
            change(&mut records)
        })
        .await
        .map_err(|err| internal(format!("records task failed: {err}")))?
        .map_err(|err| internal(format!("records.jsonl: {err}")))
    }

    async fn write_record(&self, args: &JsonObject) -> Result<CallToolResult, ErrorData> {
        let (id, value) = match id_value(args) {
            Ok(pair) => pair,
            Err(message) => return Ok(invalid(&message)),
        };
        let line = record_line(&id, &value);
        let count = self.with_records(move |r| r.append(&line)).await?;
        Ok(text_result(format!(
            "wrote record {id} ({count} records now)"
        )))
    }

    async fn crash_after_write(&self, args: &JsonObject) -> Result<CallToolResult, ErrorData> {
        let (id, value) = match id_value(args) {
            Ok(pair) => pair,
            Err(message) => return Ok(invalid(&message)),
        };
        let line = record_line(&id, &value);
        let count = self.with_records(move |r| r.append(&line)).await?;
        tracing::warn!(%id, count, "crash_after_write: record durable, exiting before the answer");
        std::process::exit(CRASH_EXIT_CODE);
    }

    async fn delete_record(&self, args: &JsonObject) -> Result<CallToolResult, ErrorData> {
        let id = match string(args, "id") {
            Ok(id) => id,
            Err(message) => return Ok(invalid(&message)),
        };
        let target = id.clone();
        let (removed, count) = self.with_records(move |r| r.delete(&target)).await?;
        Ok(text_result(format!(
            "removed {removed} record(s) with id {id} ({count} records now)"
        )))
    }

    async fn slow(
        &self,
        args: &JsonObject,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let both = integer(args, "ms", 0).and_then(|ms| Ok((ms, integer(args, "steps", 1)?)));
        let (ms, steps) = match both {
            Ok(pair) => pair,
            Err(message) => return Ok(invalid(&message)),
        };
        let token = context.meta.get_progress_token();
        let start = Instant::now();
        for step in 1..=steps {
            // Deadlines from the start, so the steps add up to `ms` without drift.
            let deadline = start + Duration::from_millis(ms.saturating_mul(step) / steps);
            tokio::select! {
                () = tokio::time::sleep_until(deadline.into()) => {}
                () = context.ct.cancelled() => {
                    self.append_log("cancelled.log", &format!("cancelled {ms}"))?;
                    return Err(cancelled());
                }
            }
            if let Some(token) = &token {
                let progress = ProgressNotificationParam::new(token.clone(), step as f64)
                    .with_total(steps as f64)
                    .with_message(format!("step {step} of {steps}"));
                if let Err(err) = context.peer.notify_progress(progress).await {
                    tracing::warn!(%err, "cannot send progress");
                }
            }
        }
        Ok(text_result(format!("slept {ms} ms")))
    }

    async fn hang(
        &self,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        context.ct.cancelled().await;
        self.append_log("cancelled.log", "hang cancelled")?;
        Err(cancelled())
    }

    async fn set_description(
        &self,
        args: &JsonObject,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let text = match string(args, "text") {
            Ok(text) => text,
            Err(message) => return Ok(invalid(&message)),
        };
        *self
            .0
            .echo_description
            .write()
            .unwrap_or_else(PoisonError::into_inner) = text.clone();
        let mut told = 0;
        if !is_modern(context) {
            match context.peer.notify_tool_list_changed().await {
                Ok(()) => told += 1,
                Err(err) => tracing::warn!(%err, "cannot send tools/list_changed"),
            }
        }
        let listeners = self
            .0
            .listeners
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        for sink in listeners {
            match sink.notify_tool_list_changed().await {
                Ok(()) => told += 1,
                Err(err) => tracing::warn!(%err, "cannot notify a listen stream"),
            }
        }
        Ok(text_result(format!(
            "echo description set to {text:?} ({told} list_changed notification(s) sent)"
        )))
    }
}

impl Records {
    /// Appends one line, syncs it and returns the new record count.
    fn append(&mut self, line: &str) -> io::Result<usize> {
        self.file.write_all(line.as_bytes())?;
        self.file.sync_data()?;
        self.count += 1;
        Ok(self.count)
    }

    /// Rewrites the file without the records whose id is `id`: returns (removed, remaining).
    fn delete(&mut self, id: &str) -> io::Result<(usize, usize)> {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(text) => text,
            Err(err) if err.kind() == io::ErrorKind::NotFound => String::new(),
            Err(err) => return Err(err),
        };
        let mut kept = String::with_capacity(text.len());
        let (mut removed, mut remaining) = (0, 0);
        for line in text.lines() {
            let record_id = serde_json::from_str::<Value>(line)
                .ok()
                .and_then(|v| v.get("id").and_then(Value::as_str).map(str::to_owned));
            if record_id.as_deref() == Some(id) {
                removed += 1;
            } else {
                kept.push_str(line);
                kept.push('\n');
                remaining += 1;
            }
        }
        let tmp = self.path.with_extension("jsonl.tmp");
        let mut file = File::create(&tmp)?;
        file.write_all(kept.as_bytes())?;
        file.sync_all()?;
        drop(file);
        std::fs::rename(&tmp, &self.path)?;
        if let Some(dir) = self.path.parent() {
            sync_dir(dir).map_err(io::Error::other)?;
        }
        self.file = append_handle(&self.path).map_err(io::Error::other)?;
        self.count = remaining;
        Ok((removed, remaining))
    }
}

impl ServerHandler for Testbed {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tool_list_changed()
                .enable_prompts()
                .enable_resources()
                .build(),
        )
        .with_server_info(self.implementation())
        .with_instructions("testbed_upstream: tools with observable effects for proxy tests.")
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Borrowed(self.supported())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        // No cache hints of our own: rmcp adds `ttlMs: 0`, `cacheScope: "private"` for 2026-07-28.
        Ok(ListToolsResult::with_all_items(self.tools()))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.tools().into_iter().find(|tool| tool.name == name)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let name = request.name.as_ref();
        self.append_log("calls.log", name)?;
        let args = request.arguments.clone().unwrap_or_default();
        let known = self.tools().into_iter().find(|tool| tool.name == name);
        let Some(tool) = known else {
            return Err(ErrorData::invalid_params(
                format!("Unknown tool: {name}"),
                None,
            ));
        };
        if let Err(message) = check_keys(&args, &tool) {
            return Ok(CallToolResponse::Complete(invalid(&message)));
        }
        let result = match name {
            "echo" => match string(&args, "text") {
                Ok(text) => {
                    let mut result = text_result(format!("echo: {text}"));
                    result.structured_content = Some(json!({"text": text}));
                    Ok(result)
                }
                Err(message) => Ok(invalid(&message)),
            },
            "write_record" => self.write_record(&args).await,
            "delete_record" => self.delete_record(&args).await,
            "slow" => self.slow(&args, &context).await,
            "crash_after_write" => self.crash_after_write(&args).await,
            "hang" => self.hang(&context).await,
            "set_description" => self.set_description(&args, &context).await,
            "fail" => match string(&args, "message") {
                Ok(message) => Ok(CallToolResult::error(vec![ContentBlock::text(message)])),
                Err(message) => Ok(invalid(&message)),
            },
            other => Err(internal(format!(
                "tool {other} is listed but not implemented"
            ))),
        }?;
        Ok(CallToolResponse::Complete(result))
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, ErrorData> {
        let name = PromptArgument::new("name")
            .with_description("Who to greet")
            .with_required(true);
        let prompt = Prompt::new("greeting", Some("Greets NAME."), Some(vec![name]));
        Ok(ListPromptsResult::with_all_items(vec![prompt]))
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, ErrorData> {
        if request.name != "greeting" {
            let message = format!("Unknown prompt: {}", request.name);
            return Err(ErrorData::invalid_params(message, None));
        }
        let who = request
            .arguments
            .as_ref()
            .and_then(|args| args.get("name"))
            .and_then(Value::as_str)
            .ok_or_else(|| ErrorData::invalid_params("argument `name` is required", None))?;
        let message = PromptMessage::new_text(Role::User, format!("Say hello to {who}."));
        let result = GetPromptResult::new(vec![message]).with_description("A greeting");
        Ok(GetPromptResponse::Complete(result))
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let readme = Resource::new(README_URI, "readme")
            .with_description("What this server is")
            .with_mime_type("text/plain");
        Ok(ListResourcesResult::with_all_items(vec![readme]))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        if request.uri != README_URI {
            // -32002 for legacy peers; rmcp rewrites it to -32602 for 2026-07-28.
            let message = format!("Resource not found: {}", request.uri);
            return Err(ErrorData::resource_not_found(message, None));
        }
        let contents = ResourceContents::text(README_TEXT, README_URI).with_mime_type("text/plain");
        Ok(ReadResourceResponse::Complete(ReadResourceResult::new(
            vec![contents],
        )))
    }

    fn accepted_subscription_filter(
        &self,
        _requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        Some(SubscriptionFilter::builder().tools_list_changed().build())
    }

    async fn listen(&self, context: SubscriptionContext) -> Result<(), ErrorData> {
        let sink = context.sink().clone();
        let id = sink.id().clone();
        self.0
            .listeners
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(sink);
        context.cancelled().await;
        self.0
            .listeners
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|sink| sink.id() != &id);
        Ok(())
    }
}

/// Whether this request is served under 2026-07-28 or later (the real server's rule).
fn is_modern(context: &RequestContext<RoleServer>) -> bool {
    context
        .protocol_version()
        .is_some_and(|v| v.as_str() >= ProtocolVersion::V_2026_07_28.as_str())
}

/// An object schema with these properties, all of `required`, and nothing else.
fn schema(properties: &Value, required: &[&str]) -> Arc<JsonObject> {
    let schema = json!({
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": false,
    });
    match schema {
        Value::Object(map) => Arc::new(map),
        _ => unreachable!("json! of an object literal is an object"),
    }
}

fn annotations(read_only: bool, destructive: bool, idempotent: bool) -> ToolAnnotations {
    ToolAnnotations::new()
        .read_only(read_only)
        .destructive(destructive)
        .idempotent(idempotent)
        .open_world(false)
}

/// Rejects arguments the tool's schema does not name (`additionalProperties: false`).
fn check_keys(args: &JsonObject, tool: &Tool) -> Result<(), String> {
    let known = tool
        .input_schema
        .get("properties")
        .and_then(Value::as_object);
    match args
        .keys()
        .find(|key| !known.is_some_and(|p| p.contains_key(*key)))
    {
        Some(key) => Err(format!("unexpected argument `{key}`")),
        None => Ok(()),
    }
}

fn string(args: &JsonObject, key: &str) -> Result<String, String> {
    match args.get(key) {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(_) => Err(format!("argument `{key}` must be a string")),
        None => Err(format!("argument `{key}` is required")),
    }
}

fn integer(args: &JsonObject, key: &str, min: u64) -> Result<u64, String> {
    match args.get(key) {
        Some(value) => match value.as_u64() {
            Some(n) if n >= min => Ok(n),
            _ => Err(format!("argument `{key}` must be an integer >= {min}")),
        },
        None => Err(format!("argument `{key}` is required")),
    }
}

fn id_value(args: &JsonObject) -> Result<(String, String), String> {
    Ok((string(args, "id")?, string(args, "value")?))
}

fn record_line(id: &str, value: &str) -> String {
    format!("{}\n", json!({"id": id, "value": value}))
}

fn text_result(text: String) -> CallToolResult {
    CallToolResult::success(vec![ContentBlock::text(text)])
}

/// Bad arguments are the model's to fix, so they are an `isError` result, not a JSON-RPC error.
fn invalid(message: &str) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(format!(
        "invalid arguments: {message}"
    ))])
}

fn internal(message: String) -> ErrorData {
    ErrorData::internal_error(message, None)
}

/// What a cancelled handler returns; rmcp drops the response of a cancelled request.
fn cancelled() -> ErrorData {
    ErrorData::internal_error("request cancelled", None)
}

fn append_handle(path: &Path) -> anyhow::Result<File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("cannot open {}", path.display()))
}

/// Makes a created or renamed entry of `dir` durable.
fn sync_dir(dir: &Path) -> anyhow::Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("cannot sync {}", dir.display()))
}
