//! Serving on stdin/stdout: the line framing in front of rmcp, and how a stdio session ends.
//!
//! stdout carries protocol only; this module's writer is the one place that writes it, for rmcp's
//! messages and for its own error answers alike, one whole line at a time under one lock, so two
//! answers never interleave mid-line.
//!
//! **Framing** (JSON-RPC 2.0 §5, §5.1). rmcp's own line transport drops what it cannot parse
//! without a word (lines that are not JSON, and JSON it cannot hold: lone surrogate escapes such as
//! JavaScript's `JSON.stringify` emits, numbers beyond `f64`, nesting deeper than serde_json's limit
//! of 128, lines over its size limit), answers a JSON value that is not a request with -32600 but
//! no `id` member, and sends a known method whose params do not fit (a `tools/call` without a
//! string `name`, say) to its custom-request fallback, which answers -32601. So this module is the
//! transport rmcp is served on, and it answers those lines itself:
//! - a line it cannot parse as JSON (syntax, those limits, or longer than [`MAX_LINE`] bytes,
//!   4 MiB): -32700. Its `id` is `null` unless a lenient second reading still finds a usable one at
//!   the top level (a lone surrogate deep in the arguments leaves the request's id readable, and a
//!   client waiting on that id learns at once that its call failed);
//! - a JSON value that is not a valid request: -32600, with the request's id when it is a string or
//!   an integer, else `null`;
//! - a valid request for a method of the MCP specification whose params do not fit it: -32602;
//! - a notification or a response it cannot read: no answer (JSON-RPC never answers those), only
//!   the log line.
//!
//! A byte order mark, a `\r` before the newline and blank lines are ignored as rmcp ignored them;
//! an unterminated last line at the end of input is still read (rmcp dropped it).
//!
//! Every error answer has an `id` member (`null` when unknown), rmcp's included. Each refused or
//! dropped line is logged at warn with its length and the reason, never its content (it may hold
//! secrets), and the server goes on reading.
//!
//! Design decision: a transport of our own rather than a filter of bytes in front of rmcp's
//! reader, so that each line is parsed once. The message this module parses is the one rmcp gets:
//! a plain `tools/call` line is read straight into it (`call_line.rs`), any other good line costs
//! what it cost inside rmcp (one `serde_json` parse into rmcp's message type) plus one enum match
//! and, for a request that fell to rmcp's custom fallback only, a method name compared against a
//! short list. Only refused lines are read a second time. stdin and stdout themselves are opened
//! in `ends.rs` (on the reactor when they are pipes or sockets).
//!
//! **Ending.** stdin closing, SIGTERM or SIGINT all end a session the same way: reading stops, the
//! server's shutdown token ([`crate::GateServer::shutdown`]) is cancelled so that every call held
//! for an approval answers with its pending answer at once, calls in flight get the grace period to
//! finish (calls still running after it are cancelled), rmcp writes the answers still queued, and
//! [`serve`] returns `Ok`, so the process exits 0. Without this a client that writes a request and
//! closes stdin would lose the answer (the seed server does), and a signal would kill held calls
//! without a reply.

use std::future::Future;
use std::io;
use std::os::fd::AsFd;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use rmcp::ServiceExt;
use rmcp::model::{
    ClientJsonRpcMessage, ClientRequest, ErrorCode, ErrorData, JsonRpcMessage, ServerJsonRpcMessage,
};
use rmcp::service::{RoleServer, ServerInitializeError};
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::{Mutex, Notify};
use tokio_util::sync::CancellationToken;

use crate::GateServer;

mod call_line;
mod ends;
pub mod guard;

/// The longest line (one JSON-RPC message) read from stdin, in bytes: 4 MiB. A longer line is
/// answered -32700 without being held in memory.
pub const MAX_LINE: usize = 4 * 1024 * 1024;

/// Methods of the MCP specification that rmcp reads into typed params. A request for one of them
/// that reaches rmcp's custom-request fallback had params that do not fit: -32602, not -32601.
const TYPED_METHODS: &[&str] = &[
    "initialize",
    "ping",
    "server/discover",
    "completion/complete",
    "logging/setLevel",
    "prompts/get",
    "prompts/list",
    "resources/list",
    "resources/templates/list",
    "resources/read",
    "resources/subscribe",
    "resources/unsubscribe",
    "subscriptions/listen",
    "tools/call",
    "tools/list",
];

/// How long the end of input waits before counting calls in flight, so that a request read just
/// before it has reached its handler (and is counted) by then.
const SETTLE: Duration = Duration::from_millis(20);

/// How long closing stdout may wait for bytes still buffered (a client that stopped reading must
/// not keep the process alive).
const CLOSE_FLUSH: Duration = Duration::from_secs(1);

/// How many calls are being served; cloned into the server and the transport.
#[derive(Clone, Debug, Default)]
pub struct InFlight(Arc<Counter>);

#[derive(Debug, Default)]
struct Counter {
    count: AtomicUsize,
    idle: Notify,
}

/// Marks one call in flight until dropped.
#[derive(Debug)]
pub struct Entered(InFlight);

impl InFlight {
    /// Counts a call until the returned guard is dropped.
    #[must_use]
    pub fn enter(&self) -> Entered {
        self.0.count.fetch_add(1, Ordering::SeqCst);
        Entered(self.clone())
    }

    /// Resolves once no call is in flight.
    pub async fn idle(&self) {
        loop {
            let notified = self.0.idle.notified();
            if self.0.count.load(Ordering::SeqCst) == 0 {
                return;
            }
            notified.await;
        }
    }
}

impl Drop for Entered {
    fn drop(&mut self) {
        if self.0.0.count.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.0.idle.notify_waiters();
        }
    }
}

/// Serves `server` on this process's stdin and stdout until stdin closes or SIGTERM or SIGINT
/// arrives; calls in flight then get `grace` to finish, held calls answer pending at once.
///
/// # Errors
/// The transport failed to start or the service loop ended abnormally.
pub async fn serve(server: GateServer, grace: Duration) -> io::Result<()> {
    serve_on(server, grace, io::stdout().as_fd(), Bare::Refuse).await
}

/// What a request gets that carries no revision in `_meta` on a connection that never sent
/// `initialize` (`echo '{"jsonrpc":"2.0","id":1,"method":"tools/call",…}' | server`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bare {
    /// -32602, as MCP 2026-07-28 says of a request without its required `_meta` keys.
    Refuse,
    /// Served as a 2026-07-28 request that declares no client capabilities, as seed 004's kit
    /// serves it: a developer can try a tool from a shell. Only a request with neither required
    /// key is adopted; one with a single key is malformed and still refused.
    AsCurrent,
}

/// [`serve`], with stdout's protocol stream written to `stdout` (the stray-write guard's copy of
/// the descriptor, [`guard::StrayStdout`]) and bare requests answered as `bare` says.
pub(crate) async fn serve_on(
    server: GateServer,
    grace: Duration,
    stdout: std::os::fd::BorrowedFd<'_>,
    bare: Bare,
) -> io::Result<()> {
    let stop = CancellationToken::new();
    // Watch the signals before the first read, so that no window is left where one kills the
    // process without an answer to what it already read.
    let watcher = match stop_signals() {
        Ok((term, int)) => Some(tokio::spawn(stop_on_signal(term, int, stop.clone()))),
        Err(error) => {
            tracing::warn!(error = %error, "cannot watch SIGTERM and SIGINT");
            None
        }
    };
    let service = CancellationToken::new();
    let ending = Ending {
        stop,
        shutdown: server.shutdown(),
        inflight: server.inflight(),
        grace,
        service: service.clone(),
    };
    // Restores stdin's and stdout's flags once the session is over.
    let (reader, writer, _restore) = ends::open(stdout);
    let mut transport = Framing::new(reader, writer, ending);
    transport.bare = (bare == Bare::AsCurrent).then_some(Adopting { initialized: false });
    let result = match server.serve_with_ct(transport, service).await {
        Ok(running) => match running.waiting().await {
            Ok(reason) => {
                tracing::info!(?reason, "stdio session ended");
                Ok(())
            }
            Err(error) => Err(io::Error::other(error)),
        },
        // The session ended before any request: nothing to serve, a clean end.
        Err(ServerInitializeError::ConnectionClosed(_) | ServerInitializeError::Cancelled) => {
            Ok(())
        }
        Err(error) => Err(io::Error::other(error)),
    };
    if let Some(watcher) = watcher {
        watcher.abort();
    }
    result
}

type Signal = tokio::signal::unix::Signal;

fn stop_signals() -> io::Result<(Signal, Signal)> {
    use tokio::signal::unix::{SignalKind, signal};
    Ok((
        signal(SignalKind::terminate())?,
        signal(SignalKind::interrupt())?,
    ))
}

async fn stop_on_signal(mut term: Signal, mut int: Signal, stop: CancellationToken) {
    let name = tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    };
    tracing::info!(signal = name, "stopping: no more requests are read");
    stop.cancel();
}

/// What ends a session and what ending it does (module header, "Ending").
struct Ending {
    /// Cancelled by SIGTERM or SIGINT: stop reading.
    stop: CancellationToken,
    /// The server's: held calls answer pending once it is cancelled.
    shutdown: CancellationToken,
    inflight: InFlight,
    grace: Duration,
    /// rmcp's service token: cancels the calls still running once the grace is over.
    service: CancellationToken,
}

impl Ending {
    /// Finishes what was read: held calls answer now, calls in flight get the grace.
    fn finish(&self, why: &'static str) -> Closing {
        tracing::info!(
            why,
            grace_ms = self.grace.as_millis(),
            "no more requests; finishing calls in flight"
        );
        self.shutdown.cancel();
        let (inflight, grace, service) = (self.inflight.clone(), self.grace, self.service.clone());
        Box::pin(async move {
            tokio::time::sleep(SETTLE).await;
            if tokio::time::timeout(grace, inflight.idle()).await.is_err() {
                tracing::warn!("grace period over with calls still in flight; cancelling them");
                // rmcp would wait up to 5 s more for them before cancelling them itself.
                service.cancel();
            }
            // Otherwise rmcp's drain writes the answers still queued; it also waits for a
            // handler that reached its task only after the count above.
        })
    }
}

type Closing = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The rmcp transport on stdin and stdout (module header).
struct Framing<R, W> {
    lines: Lines<R>,
    out: Arc<Mutex<Option<Out<W>>>>,
    /// An error answer to a refused line, not yet handed to the writer.
    answer: Option<Refusal>,
    /// Bytes handed to the writer that a cancelled flush may have left in its buffer.
    unflushed: bool,
    ending: Ending,
    closing: Option<Closing>,
    closed: bool,
    /// Set when bare requests are adopted ([`Bare::AsCurrent`]).
    bare: Option<Adopting>,
}

/// Whether the connection has initialized: after `initialize`, a request without `_meta` belongs
/// to that session and is left to rmcp.
#[derive(Debug)]
struct Adopting {
    initialized: bool,
}

impl Adopting {
    /// Gives a bare request the `_meta` of a 2026-07-28 request that declares no capabilities.
    fn adopt(&mut self, message: &mut ClientJsonRpcMessage) {
        use rmcp::model::{GetMeta, RequestMetaObject};
        let JsonRpcMessage::Request(request) = message else {
            return;
        };
        if matches!(request.request, ClientRequest::InitializeRequest(_)) {
            self.initialized = true;
            return;
        }
        if self.initialized {
            return;
        }
        let meta = request.request.get_meta_mut();
        if RequestMetaObject::DRAFT_REQUIRED_KEYS
            .iter()
            .any(|key| meta.0.0.contains_key(*key))
        {
            return;
        }
        meta.set_protocol_version(rmcp::model::ProtocolVersion::V_2026_07_28);
        meta.set_client_capabilities(rmcp::model::ClientCapabilities::default());
    }
}

impl<R: AsyncRead + Unpin, W: AsyncWrite + Unpin> Framing<R, W> {
    fn new(read: R, write: W, ending: Ending) -> Self {
        Self {
            lines: Lines {
                read: BufReader::new(read),
                line: Vec::new(),
                discarding: false,
            },
            out: Arc::new(Mutex::new(Some(Out {
                write,
                buf: Vec::new(),
                sent: 0,
            }))),
            answer: None,
            unflushed: false,
            ending,
            closing: None,
            closed: false,
            bare: None,
        }
    }

    /// Writes the pending error answer, if any. `false` when stdout is gone.
    ///
    /// Cancel-safe (rmcp polls `receive` in a `select!`): the answer leaves `self.answer` only
    /// once it is in the writer's buffer, and a flush cut short is finished on the next call.
    async fn write_answer(&mut self) -> bool {
        if self.answer.is_none() && !self.unflushed {
            return true;
        }
        let mut guard = self.out.lock().await;
        let Some(out) = guard.as_mut() else {
            return false;
        };
        if let Some(answer) = self.answer.take() {
            let response = ErrorResponse {
                jsonrpc: "2.0",
                id: &answer.id,
                error: &answer.error(),
            };
            if let Err(error) = out.push(&response) {
                tracing::warn!(error = %error, "cannot encode an error answer");
            }
            self.unflushed = true;
        }
        if let Err(error) = out.flush().await {
            tracing::warn!(error = %error, "cannot write to stdout");
            return false;
        }
        self.unflushed = false;
        true
    }
}

impl<R, W> rmcp::transport::Transport<RoleServer> for Framing<R, W>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    type Error = io::Error;

    fn send(
        &mut self,
        item: ServerJsonRpcMessage,
    ) -> impl Future<Output = io::Result<()>> + Send + 'static {
        let out = self.out.clone();
        async move {
            let mut guard = out.lock().await;
            let out = guard
                .as_mut()
                .ok_or_else(|| io::Error::new(io::ErrorKind::NotConnected, "stdout is closed"))?;
            match &item {
                // rmcp leaves `id` out when it has none (the 2026-07-28 wording); JSON-RPC 2.0
                // requires the member, `null` when unknown.
                JsonRpcMessage::Error(error) if error.id.is_none() => {
                    out.push(&ErrorResponse {
                        jsonrpc: "2.0",
                        id: &Value::Null,
                        error: &error.error,
                    })?;
                }
                _ => out.push(&item)?,
            }
            out.flush().await
        }
    }

    async fn receive(&mut self) -> Option<ClientJsonRpcMessage> {
        loop {
            if !self.write_answer().await {
                return None;
            }
            if let Some(closing) = self.closing.as_mut() {
                closing.as_mut().await;
                self.closing = None;
                self.closed = true;
            }
            if self.closed {
                return None;
            }
            let read = tokio::select! {
                biased;
                () = self.ending.stop.cancelled() => None,
                read = self.lines.next() => Some(read),
            };
            match read {
                Some(Read::Line) => {}
                Some(Read::Oversized) => {
                    tracing::warn!(
                        limit = MAX_LINE,
                        reason = "longer than the line limit",
                        "stdin line refused"
                    );
                    self.answer = Some(Refusal::parse(
                        Value::Null,
                        format!("the line is longer than {MAX_LINE} bytes, this server's limit"),
                    ));
                    continue;
                }
                Some(Read::Eof) => {
                    self.closing = Some(self.ending.finish("stdin closed"));
                    continue;
                }
                Some(Read::Failed(error)) => {
                    tracing::warn!(error = %error, "cannot read stdin");
                    self.closing = Some(self.ending.finish("stdin failed"));
                    continue;
                }
                None => {
                    self.closing = Some(self.ending.finish("signal"));
                    continue;
                }
            }
            let bytes = self.lines.line.len();
            let judged = judge(&self.lines.line);
            // Cleared only after a whole line was handled, keeping its capacity.
            self.lines.line.clear();
            match judged {
                Judged::Pass(mut message) => {
                    if let Some(bare) = self.bare.as_mut() {
                        bare.adopt(&mut message);
                    }
                    return Some(message);
                }
                Judged::Blank => {}
                Judged::Answer(refusal) => {
                    tracing::warn!(
                        bytes,
                        code = refusal.code,
                        reason = %refusal.reason,
                        "stdin line refused"
                    );
                    self.answer = Some(refusal);
                }
                Judged::Drop(reason) => {
                    tracing::warn!(bytes, reason, "stdin line dropped without an answer");
                }
            }
        }
    }

    async fn close(&mut self) -> io::Result<()> {
        let out = self.out.lock().await.take();
        if let Some(mut out) = out {
            // Normally empty: only a send cut short leaves bytes behind.
            let _ = tokio::time::timeout(CLOSE_FLUSH, out.flush()).await;
        }
        Ok(())
    }
}

/// stdin, cut into lines of at most [`MAX_LINE`] bytes.
struct Lines<R> {
    read: BufReader<R>,
    /// The line being read; kept across a cancelled read, cleared once the line is handled.
    line: Vec<u8>,
    /// Skipping the rest of a line already refused as too long.
    discarding: bool,
}

enum Read {
    /// A whole line is in `line` (or the unterminated last one, at the end of input).
    Line,
    Oversized,
    Eof,
    Failed(io::Error),
}

impl<R: AsyncRead + Unpin> Lines<R> {
    /// Reads on until a newline. Cancel-safe: `fill_buf` consumes nothing when dropped, and the
    /// copy into `line` and the matching `consume` have no await between them.
    async fn next(&mut self) -> Read {
        loop {
            let available = match self.read.fill_buf().await {
                Ok(available) => available,
                Err(error) => return Read::Failed(error),
            };
            if available.is_empty() {
                // A last line without its newline is still a message.
                return if self.line.is_empty() || self.discarding {
                    Read::Eof
                } else {
                    Read::Line
                };
            }
            let newline = available.iter().position(|b| *b == b'\n');
            let take = newline.map_or(available.len(), |at| at + 1);
            let read = if self.discarding {
                self.discarding = newline.is_none();
                None
            } else if self.line.len() + take > MAX_LINE {
                self.line.clear();
                self.discarding = newline.is_none();
                Some(Read::Oversized)
            } else {
                self.line.extend_from_slice(&available[..take]);
                newline.map(|_| Read::Line)
            };
            self.read.consume(take);
            if let Some(read) = read {
                return read;
            }
        }
    }
}

/// The writer half: whole lines into a buffer, then written out. A flush cut short leaves the
/// rest in the buffer for the next one, so a line is never split by another.
struct Out<W> {
    write: W,
    buf: Vec<u8>,
    /// How much of `buf` is already written.
    sent: usize,
}

impl<W: AsyncWrite + Unpin> Out<W> {
    /// Buffers `message` as one line (nothing of it when it cannot be encoded).
    fn push<T: Serialize>(&mut self, message: &T) -> io::Result<()> {
        let start = self.buf.len();
        if let Err(error) = serde_json::to_writer(&mut self.buf, message) {
            self.buf.truncate(start);
            return Err(error.into());
        }
        self.buf.push(b'\n');
        Ok(())
    }

    async fn flush(&mut self) -> io::Result<()> {
        while self.sent < self.buf.len() {
            let written = self.write.write(&self.buf[self.sent..]).await?;
            if written == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            self.sent += written;
        }
        self.buf.clear();
        self.sent = 0;
        // One very large answer should not pin its memory for the rest of the session.
        if self.buf.capacity() > MAX_LINE {
            self.buf.shrink_to(64 * 1024);
        }
        self.write.flush().await
    }
}

/// A JSON-RPC error response, members in rmcp's order; `id` is always there (`null` when unknown).
#[derive(Serialize)]
struct ErrorResponse<'a> {
    jsonrpc: &'static str,
    id: &'a Value,
    error: &'a ErrorData,
}

/// The error answer to a refused line.
struct Refusal {
    /// The request's id: a string or an integer, else `null`.
    id: Value,
    code: i32,
    /// Said to the client and logged: never the line's content.
    reason: String,
}

impl Refusal {
    fn parse(id: Value, reason: String) -> Self {
        Self {
            id,
            code: -32700,
            reason,
        }
    }

    fn error(&self) -> ErrorData {
        let title = match self.code {
            -32700 => "Parse error",
            -32602 => "Invalid params",
            _ => "Invalid Request",
        };
        ErrorData::new(
            ErrorCode(self.code),
            format!("{title}: {}", self.reason),
            None,
        )
    }
}

// Boxing the message would cost an allocation per good line; the value lives for one match.
#[allow(clippy::large_enum_variant)]
enum Judged {
    Pass(ClientJsonRpcMessage),
    Answer(Refusal),
    /// A notification or response that cannot be read: JSON-RPC answers neither.
    Drop(&'static str),
    Blank,
}

const UTF8_BOM: &[u8] = b"\xEF\xBB\xBF";

/// What to do with one line (module header, "Framing").
fn judge(line: &[u8]) -> Judged {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    // RFC 8259 §8.1 lets a parser ignore a byte order mark; rmcp did.
    let line = line.strip_prefix(UTF8_BOM).unwrap_or(line);
    if line.iter().all(u8::is_ascii_whitespace) {
        return Judged::Blank;
    }
    if let Some(call) = call_line::read(line) {
        return Judged::Pass(call);
    }
    match serde_json::from_slice::<ClientJsonRpcMessage>(line) {
        Ok(JsonRpcMessage::Request(request)) => {
            if let ClientRequest::CustomRequest(custom) = &request.request
                && TYPED_METHODS.contains(&custom.method.as_str())
            {
                let id = serde_json::to_value(&request.id).unwrap_or(Value::Null);
                let reason = params_problem(&custom.method, Shape::of(custom.params.as_ref()));
                return Judged::Answer(Refusal {
                    id,
                    code: -32602,
                    reason,
                });
            }
            Judged::Pass(JsonRpcMessage::Request(request))
        }
        Ok(message) => Judged::Pass(message),
        Err(error) => unreadable(line, &error),
    }
}

/// A line rmcp's message type does not take: read it again leniently for what an answer needs.
fn unreadable(line: &[u8], error: &serde_json::Error) -> Judged {
    use serde_json::error::Category;
    let syntax = matches!(error.classify(), Category::Syntax | Category::Eof);
    let Ok(envelope) = serde_json::from_slice::<Envelope>(line) else {
        return Judged::Answer(if syntax {
            // serde_json's syntax messages name a position, never the text.
            Refusal::parse(Value::Null, error.to_string())
        } else {
            Refusal {
                id: Value::Null,
                code: -32600,
                reason: "not a JSON-RPC 2.0 request object".to_owned(),
            }
        });
    };
    let method = envelope.method.as_ref();
    let replied = envelope.result.is_some() || envelope.error.is_some();
    if method.is_none() && replied {
        return Judged::Drop("a response that cannot be read");
    }
    if envelope.id.is_none() && matches!(method, Some(Member::Text(_))) && !replied {
        return Judged::Drop("a notification that cannot be read");
    }
    let id = match envelope.id {
        Some(Member::Text(id)) => Value::String(id),
        Some(Member::Integer(id)) => id,
        _ => Value::Null,
    };
    if syntax {
        return Judged::Answer(Refusal::parse(id, error.to_string()));
    }
    // A well-formed envelope (an id rmcp can hold: a string or a 64-bit signed integer) for a
    // known method: what failed is its params.
    if let (Some(Member::Text(version)), Some(Member::Text(method)), false) =
        (&envelope.jsonrpc, method, replied)
        && version == "2.0"
        && (id.is_string() || id.is_i64())
        && TYPED_METHODS.contains(&method.as_str())
    {
        let shape = match envelope.params {
            None => Shape::Missing,
            Some(Member::Object) => Shape::Object(None),
            Some(_) => Shape::NotObject,
        };
        return Judged::Answer(Refusal {
            id,
            code: -32602,
            reason: params_problem(method, shape),
        });
    }
    Judged::Answer(Refusal {
        id,
        code: -32600,
        reason: "not a JSON-RPC 2.0 request object".to_owned(),
    })
}

/// What the params of a refused request look like, as far as the answer needs.
enum Shape<'a> {
    Missing,
    NotObject,
    /// An object; its members when they were read.
    Object(Option<&'a serde_json::Map<String, Value>>),
}

impl<'a> Shape<'a> {
    fn of(params: Option<&'a Value>) -> Self {
        match params {
            None => Shape::Missing,
            Some(Value::Object(members)) => Shape::Object(Some(members)),
            Some(_) => Shape::NotObject,
        }
    }
}

/// The reason a request's params do not fit `method`, worded for the model that wrote them.
fn params_problem(method: &str, shape: Shape<'_>) -> String {
    let problem = match (method, shape) {
        (_, Shape::NotObject) => "params must be an object",
        ("tools/call", Shape::Missing) => "params with a string `name` are required",
        ("tools/call", Shape::Object(Some(params))) => match params.get("name") {
            None => "`name` is missing",
            Some(name) if !name.is_string() => "`name` must be a string",
            _ => match params.get("arguments") {
                Some(arguments) if !arguments.is_object() && !arguments.is_null() => {
                    "`arguments` must be an object"
                }
                _ => "they do not match tools/call",
            },
        },
        _ => "they do not match the method",
    };
    format!("{method}: {problem}")
}

/// The top-level members of a line that an answer needs, read leniently: everything else is
/// skipped without being parsed (serde_json skips values without building them, so a lone
/// surrogate, a huge number or deep nesting in the params does not stop this reading).
#[derive(Deserialize)]
struct Envelope {
    #[serde(default, deserialize_with = "present")]
    jsonrpc: Option<Member>,
    #[serde(default, deserialize_with = "present")]
    id: Option<Member>,
    #[serde(default, deserialize_with = "present")]
    method: Option<Member>,
    #[serde(default, deserialize_with = "present")]
    params: Option<Member>,
    #[serde(default, deserialize_with = "present")]
    result: Option<Member>,
    #[serde(default, deserialize_with = "present")]
    error: Option<Member>,
}

/// `Some` whenever the member is there, `null` included (`Option`'s own reading maps `null` to
/// `None`, and JSON-RPC tells `"id": null` from no `id`).
fn present<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Member>, D::Error> {
    Member::deserialize(deserializer).map(Some)
}

/// One member's value, as far as an answer needs it.
enum Member {
    Text(String),
    /// A JSON integer, as it was sent.
    Integer(Value),
    Object,
    Other,
}

impl<'de> Deserialize<'de> for Member {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(MemberVisitor)
    }
}

struct MemberVisitor;

impl<'de> Visitor<'de> for MemberVisitor {
    type Value = Member;

    fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("any JSON value")
    }

    fn visit_str<E: de::Error>(self, value: &str) -> Result<Member, E> {
        Ok(Member::Text(value.to_owned()))
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<Member, E> {
        Ok(Member::Integer(value.into()))
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<Member, E> {
        Ok(Member::Integer(value.into()))
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Member, E> {
        Ok(Member::Other)
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Member, E> {
        Ok(Member::Other)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Member, E> {
        Ok(Member::Other)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Member, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Member::Object)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Member, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Member::Other)
    }
}
