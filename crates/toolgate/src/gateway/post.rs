//! The short way of a request to an `initialize`-era HTTP upstream: one POST, written and read on
//! the caller's own task.
//!
//! rmcp's client takes every request through its service loop, its transport worker and a task
//! per response stream before the answer reaches the caller, and parses every answer as "any
//! result"; on the gateway's path that was most of what forwarding a call cost (docs/
//! performance.md, "Gateway over HTTP"). For an upstream in an `initialize` session, whose
//! requests carry nothing but the session's headers, the gateway posts the request itself (on
//! connections of its own to an endpoint on this machine, `wire.rs`; else with the connection's
//! reqwest client) and reads the answer where the caller waits: the call's result
//! parsed as a call result, its progress queued for the caller in the order it came
//! ([`Routes`]), and anything else on the stream (the upstream's questions, its log messages)
//! handed to the rmcp connection, which handles it as if it had read it itself (a question
//! marked with the request it came on, as rmcp marks it). rmcp keeps the rest: the handshake, the
//! session's own stream, the answers to the upstream's questions, cancellation, tools/list.
//!
//! The session is learnt from rmcp's own requests: [`Observed`] wraps the connection's client and
//! notes the headers of every POST rmcp makes after the handshake. An upstream that no longer
//! knows the session (404, or a 400 about no request: it restarted) ran nothing: the call is
//! answered so and the connection is ended, so that the supervisor opens a new one (through
//! rmcp's own client such a call went unanswered). A stream that breaks before the
//! answer is not resumed: the outcome is unknown.
//! 2026-07-28 upstreams keep rmcp's path, whose requests carry headers rmcp derives per request
//! (`Mcp-Method`, `Mcp-Name`, a tool's `x-mcp-header` parameters).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use futures_util::{StreamExt, TryStreamExt};
use http::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use hyper::body::Bytes;
use rmcp::ErrorData;
use rmcp::model::{
    CallToolResult, ClientJsonRpcMessage, ClientRequest, GetExtensions, GetMeta, JsonRpcRequest,
    JsonRpcVersion2_0, NumberOrString, ProgressToken, RequestId, ServerJsonRpcMessage,
    ServerNotification, ServerResult,
};
use rmcp::service::InboundStreamOrigin;
use rmcp::transport::streamable_http_client::{
    StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse,
    StreamableHttpResponseLimits,
};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use sse_stream::{Error as SseError, Sse, SseStream};
use tokio::sync::mpsc;

use super::progress::Routes;
use super::wire::{Lease, Wire, WireError};
use crate::lock;

/// Largest answer read from a JSON body (rmcp's own limit).
const MAX_JSON: usize = 16 * 1024 * 1024;
/// Largest answer stream read for one request, every event together.
const MAX_STREAM: usize = 64 * 1024 * 1024;
/// Largest error body read.
const MAX_ERROR: usize = 64 * 1024;
/// How long the rest of a stream is read after its answer, so that the connection goes back to
/// the pool (a server ends it right after the answer).
const DRAIN: std::time::Duration = std::time::Duration::from_millis(50);

/// The session of one upstream connection, as rmcp's latest POST carried it.
struct Session {
    headers: HashMap<HeaderName, HeaderValue>,
    id: Option<Arc<str>>,
    /// The upstream's own credential (never a caller's).
    auth: Option<String>,
}

/// The session, once rmcp has posted after its handshake; `None` while it (re)initializes. Each
/// request takes the one current when it starts.
type Current = Arc<Mutex<Option<Arc<Session>>>>;

/// The connection's HTTP client as rmcp uses it, noting the session of every POST.
#[derive(Clone)]
pub(super) struct Observed {
    client: reqwest::Client,
    session: Current,
}

impl Observed {
    fn note(
        &self,
        message: &ClientJsonRpcMessage,
        id: Option<&Arc<str>>,
        auth: Option<&String>,
        headers: &HashMap<HeaderName, HeaderValue>,
    ) {
        let initializing = matches!(
            message,
            ClientJsonRpcMessage::Request(JsonRpcRequest {
                request: ClientRequest::InitializeRequest(_),
                ..
            })
        );
        *lock(&self.session) = (!initializing).then(|| {
            Arc::new(Session {
                headers: headers.clone(),
                id: id.cloned(),
                auth: auth.cloned(),
            })
        });
    }
}

impl StreamableHttpClient for Observed {
    type Error = reqwest::Error;

    fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> impl Future<Output = Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>>>
    + Send
    + '_ {
        self.note(
            &message,
            session_id.as_ref(),
            auth_header.as_ref(),
            &custom_headers,
        );
        self.client
            .post_message(uri, message, session_id, auth_header, custom_headers)
    }

    fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> impl Future<Output = Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>>>
    + Send
    + '_ {
        self.note(
            &message,
            session_id.as_ref(),
            auth_header.as_ref(),
            &custom_headers,
        );
        self.client.post_message_with_response_limits(
            uri,
            message,
            session_id,
            auth_header,
            custom_headers,
            limits,
        )
    }

    fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> impl Future<Output = Result<(), StreamableHttpError<Self::Error>>> + Send + '_ {
        *lock(&self.session) = None;
        self.client
            .delete_session(uri, session_id, auth_header, custom_headers)
    }

    fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> impl Future<
        Output = Result<
            futures_util::stream::BoxStream<'static, Result<Sse, SseError>>,
            StreamableHttpError<Self::Error>,
        >,
    > + Send
    + '_ {
        self.client
            .get_stream(uri, session_id, last_event_id, auth_header, custom_headers)
    }

    fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> impl Future<
        Output = Result<
            futures_util::stream::BoxStream<'static, Result<Sse, SseError>>,
            StreamableHttpError<Self::Error>,
        >,
    > + Send
    + '_ {
        self.client.get_stream_with_max_sse_event_size(
            uri,
            session_id,
            last_event_id,
            auth_header,
            custom_headers,
            max_sse_event_size,
        )
    }
}

/// What the short way hands to the rmcp connection: the receiving end, read by the transport
/// ([`super::progress::Queued`]).
pub(super) type Injected = mpsc::UnboundedReceiver<ServerJsonRpcMessage>;

/// How a request that went the short way ended.
pub(super) enum Posted {
    /// The upstream answered it: its result, or its own error.
    Answered(Box<Result<ServerResult, ErrorData>>),
    /// Not for the short way: rmcp is (re)initializing the session, or the upstream redirected
    /// the request (307/308: nothing ran) and only rmcp's client follows redirects. Send it the
    /// rmcp way.
    NotReady,
    /// The upstream refused the session (HTTP 404, or 400 naming no request): nothing ran.
    SessionEnded(String),
    /// Nothing reached the upstream.
    NotSent(String),
    /// It was sent and no answer came: the outcome is unknown.
    Lost(String),
}

/// One connection's short way: its client, its endpoint, its session, and the way into rmcp.
pub(super) struct Poster {
    client: reqwest::Client,
    url: reqwest::Url,
    /// The short way's own connections, to an endpoint on this machine (`wire.rs`); else the
    /// client's.
    wire: Option<Arc<Wire>>,
    session: Current,
    /// Messages for the rmcp connection that arrived on a POST the gateway read itself.
    inject: mpsc::UnboundedSender<ServerJsonRpcMessage>,
    next: AtomicU64,
}

impl std::fmt::Debug for Poster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Poster")
            .field("url", &self.url.as_str())
            .finish_non_exhaustive()
    }
}

impl Poster {
    /// The short way for a connection to `url` through `client`: the client rmcp is to use (which
    /// notes the session), the poster, and the receiver of what it hands to rmcp (for the
    /// connection's transport, [`super::progress::Queued`]).
    pub(super) fn new(client: reqwest::Client, url: reqwest::Url) -> (Observed, Self, Injected) {
        let session = Current::default();
        let (inject, injected) = mpsc::unbounded_channel();
        let observed = Observed {
            client: client.clone(),
            session: Arc::clone(&session),
        };
        let poster = Self {
            client,
            wire: Wire::for_url(&url),
            url,
            session,
            inject,
            next: AtomicU64::new(0),
        };
        (observed, poster, injected)
    }

    /// Whether rmcp has completed its handshake, so that the session is known.
    pub(super) fn ready(&self) -> bool {
        lock(&self.session).is_some()
    }

    /// A request id of this way's own: rmcp numbers its requests, these are strings.
    pub(super) fn next_id(&self) -> RequestId {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        NumberOrString::String(format!("tg-{n}").into())
    }

    /// Posts `request` as `id`, its progress under the same token (set on `request`: rmcp sets
    /// its own on a request sent its way), and reads its answer.
    pub(super) async fn post(
        &self,
        id: &RequestId,
        request: &mut ClientRequest,
        routes: &Routes,
    ) -> Posted {
        let Some(session) = lock(&self.session).clone() else {
            return Posted::NotReady;
        };
        let Some(body) = body(id, request) else {
            return Posted::NotSent("the request could not be written".to_owned());
        };
        let headers = match headers(&session) {
            Ok(headers) => headers,
            Err(why) => return Posted::NotSent(why),
        };
        let reply = match &self.wire {
            Some(wire) => match wire.post(headers, body).await {
                Ok((response, lease)) => Reply::wire(response, lease),
                Err(WireError::NotSent(why)) => return Posted::NotSent(why),
                Err(WireError::Lost(why)) => return Posted::Lost(why),
            },
            None => {
                let post = self.client.post(self.url.clone()).headers(headers);
                match post.body(body).send().await {
                    Ok(response) => Reply::reqwest(response),
                    Err(error) if error.is_connect() => return Posted::NotSent(error.to_string()),
                    Err(error) => return Posted::Lost(error.to_string()),
                }
            }
        };
        let status = reply.status;
        if status == StatusCode::NOT_FOUND {
            return Posted::SessionEnded(format!("HTTP {status}"));
        }
        // reqwest follows these to the same origin; the short way's own connections do not.
        if matches!(
            status,
            StatusCode::TEMPORARY_REDIRECT | StatusCode::PERMANENT_REDIRECT
        ) && self.wire.is_some()
        {
            return Posted::NotReady;
        }
        let call = matches!(request, ClientRequest::CallToolRequest(_));
        if !status.is_success() {
            let Ok(body) = reply.read(MAX_ERROR).await else {
                return Posted::Lost(format!("HTTP {status}"));
            };
            // An error about this request is the upstream's answer. A 400 about no request is
            // about the session (an upstream that restarted knows it no more): nothing ran.
            return match serde_json::from_slice::<Envelope<'_>>(&body) {
                Ok(Envelope {
                    error: Some(error),
                    id: None,
                    ..
                }) if status == StatusCode::BAD_REQUEST => {
                    Posted::SessionEnded(format!("HTTP {status}: {}", error.message))
                }
                Ok(Envelope {
                    error: Some(error), ..
                }) => Posted::Answered(Box::new(Err(error))),
                _ => Posted::Lost(format!("HTTP {status}")),
            };
        }
        if reply.streamed {
            return self.read_stream(reply, id, call, routes).await;
        }
        match reply.read(MAX_JSON).await {
            Ok(body) if body.is_empty() => {
                Posted::Lost(format!("HTTP {status} with no answer to a request"))
            }
            Ok(body) => match self.take(&body, id, call, routes).await {
                Some(answer) => Posted::Answered(Box::new(answer)),
                None => Posted::Lost("the answer was for another request".to_owned()),
            },
            Err(why) => Posted::Lost(why),
        }
    }

    /// Reads an answer stream up to the answer to `id`, handing what comes before it on.
    async fn read_stream(
        &self,
        reply: Reply,
        id: &RequestId,
        call: bool,
        routes: &Routes,
    ) -> Posted {
        let Reply { body, lease, .. } = reply;
        let mut seen = 0usize;
        let bytes = body.map(move |chunk| {
            let chunk = chunk?;
            seen += chunk.len();
            if seen > MAX_STREAM {
                return Err(std::io::Error::other(format!(
                    "the answer stream passed {MAX_STREAM} bytes"
                )));
            }
            Ok(chunk)
        });
        let mut events = Box::pin(SseStream::from_bytes_stream(bytes));
        while let Some(event) = events.next().await {
            let data = match event {
                Ok(Sse {
                    data: Some(data), ..
                }) if !data.is_empty() => data,
                Ok(_) => continue,
                Err(error) => return Posted::Lost(format!("the answer stream broke ({error})")),
            };
            if let Some(answer) = self.take(data.as_bytes(), id, call, routes).await {
                drain(events, lease);
                return Posted::Answered(Box::new(answer));
            }
        }
        Posted::Lost("the upstream ended the answer stream without an answer".to_owned())
    }

    /// One message from the upstream: the answer to `id`, or something handed on (`None`).
    async fn take(
        &self,
        text: &[u8],
        id: &RequestId,
        call: bool,
        routes: &Routes,
    ) -> Option<Result<ServerResult, ErrorData>> {
        if let Ok(envelope) = serde_json::from_slice::<Envelope<'_>>(text)
            && envelope.method.is_none()
            && envelope.id.as_ref() == Some(id)
        {
            return match (envelope.result, envelope.error) {
                (_, Some(error)) => Some(Err(error)),
                (Some(result), None) => Some(result_of(result, call)),
                (None, None) => Some(Err(ErrorData::internal_error(
                    "the upstream's answer had neither a result nor an error",
                    None,
                ))),
            };
        }
        match serde_json::from_slice::<ServerJsonRpcMessage>(text) {
            Ok(ServerJsonRpcMessage::Notification(notification)) => {
                if let ServerNotification::ProgressNotification(progress) =
                    &notification.notification
                {
                    let token = progress.params.progress_token.clone();
                    routes.arrived(progress.params.clone());
                    routes.flush(&token).await;
                } else {
                    let _ = self
                        .inject
                        .send(ServerJsonRpcMessage::Notification(notification));
                }
            }
            Ok(ServerJsonRpcMessage::Request(mut request)) => {
                // Marked as rmcp marks a request that came on a request's stream (SEP-2260).
                request
                    .request
                    .extensions_mut()
                    .insert(InboundStreamOrigin::OutboundRequest(id.clone()));
                let _ = self.inject.send(ServerJsonRpcMessage::Request(request));
            }
            Ok(other) => {
                let _ = self.inject.send(other);
            }
            Err(error) => {
                tracing::warn!(%error, "upstream sent a message that is not JSON-RPC; ignored");
            }
        }
        None
    }
}

/// Reads the rest of an answer stream, for at most [`DRAIN`], so that its connection can carry the
/// next request (`lease`, on the short way's own connections; reqwest's pool takes it back by
/// itself).
///
/// An upstream usually ends the stream in the same write as the answer, and its end is then
/// already here: taken at once, with no timer. Otherwise the rest is read on a task of its own,
/// after the answer has gone on: a timer due before the runtime's next one wakes the runtime's
/// driver (a write to its eventfd and one more `epoll_wait`), which the caller need not wait for.
fn drain<S>(mut events: S, lease: Option<Lease>)
where
    S: futures_util::Stream + Unpin + Send + 'static,
{
    use futures_util::FutureExt;
    loop {
        match events.next().now_or_never() {
            Some(None) => {
                if let Some(lease) = lease {
                    lease.release();
                }
                return;
            }
            Some(Some(_)) => {}
            None => break,
        }
    }
    tokio::spawn(async move {
        let ended = tokio::time::timeout(DRAIN, async { while events.next().await.is_some() {} });
        if ended.await.is_ok()
            && let Some(lease) = lease
        {
            lease.release();
        }
    });
}

/// The parts of a JSON-RPC message that say whether it is the answer awaited.
#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(default)]
    id: Option<RequestId>,
    #[serde(default)]
    method: Option<serde::de::IgnoredAny>,
    #[serde(default, borrow)]
    result: Option<&'a RawValue>,
    #[serde(default)]
    error: Option<ErrorData>,
}

/// A result, read as a call's result when it answers a call (the untagged reading of "any
/// result" tries every kind first), else as any result.
fn result_of(result: &RawValue, call: bool) -> Result<ServerResult, ErrorData> {
    if call && let Ok(done) = serde_json::from_str::<CallToolResult>(result.get()) {
        return Ok(ServerResult::CallToolResult(done));
    }
    serde_json::from_str::<ServerResult>(result.get()).map_err(|error| {
        ErrorData::internal_error(
            format!("the upstream's result did not parse: {error}"),
            None,
        )
    })
}

/// The request as JSON-RPC, its progress token (set on `request`) being its id.
fn body(id: &RequestId, request: &mut ClientRequest) -> Option<Vec<u8>> {
    request
        .get_meta_mut()
        .set_progress_token(progress_token(id));
    serde_json::to_vec(&Outgoing {
        jsonrpc: JsonRpcVersion2_0,
        id,
        request,
    })
    .ok()
}

/// rmcp's `JsonRpcRequest`, borrowing the request instead of owning it: written the same way,
/// without a copy of the arguments.
#[derive(Serialize)]
struct Outgoing<'a> {
    jsonrpc: JsonRpcVersion2_0,
    id: &'a RequestId,
    #[serde(flatten)]
    request: &'a ClientRequest,
}

/// The progress token of a request that went the short way.
pub(super) fn progress_token(id: &RequestId) -> ProgressToken {
    ProgressToken(id.clone())
}

/// The upstream's answer to a POST, from either client.
struct Reply {
    status: StatusCode,
    /// An SSE stream rather than one JSON body.
    streamed: bool,
    body: futures_util::stream::BoxStream<'static, std::io::Result<Bytes>>,
    /// The short way's own connection, until the body has been read.
    lease: Option<Lease>,
}

impl Reply {
    fn wire(response: http::Response<hyper::body::Incoming>, lease: Lease) -> Self {
        let (parts, body) = response.into_parts();
        let body = http_body_util::BodyDataStream::new(body).map_err(std::io::Error::other);
        Self {
            status: parts.status,
            streamed: streamed(&parts.headers),
            body: body.boxed(),
            lease: Some(lease),
        }
    }

    fn reqwest(response: reqwest::Response) -> Self {
        Self {
            status: response.status(),
            streamed: streamed(response.headers()),
            lease: None,
            body: response
                .bytes_stream()
                .map_err(std::io::Error::other)
                .boxed(),
        }
    }

    /// The whole body, at most `limit` bytes.
    async fn read(mut self, limit: usize) -> Result<Vec<u8>, String> {
        let mut body = Vec::new();
        while let Some(chunk) = self.body.next().await {
            let chunk = chunk.map_err(|e| e.to_string())?;
            if body.len() + chunk.len() > limit {
                return Err(format!("the answer passed {limit} bytes"));
            }
            body.extend_from_slice(&chunk);
        }
        if let Some(lease) = self.lease {
            lease.release();
        }
        Ok(body)
    }
}

fn streamed(headers: &http::HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"))
}

/// The headers of a POST in `session`: rmcp's own for the session, its id and the upstream's
/// credential.
fn headers(session: &Session) -> Result<HeaderMap, String> {
    let mut headers = HeaderMap::with_capacity(session.headers.len() + 4);
    headers.insert(
        ACCEPT,
        HeaderValue::from_static("application/json, text/event-stream"),
    );
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    for (name, value) in &session.headers {
        headers.append(name, value.clone());
    }
    if let Some(id) = &session.id {
        let id = HeaderValue::from_str(id).map_err(|_| "the session id is not a header value")?;
        headers.insert(HeaderName::from_static("mcp-session-id"), id);
    }
    if let Some(token) = &session.auth {
        let mut value = HeaderValue::from_str(&format!("Bearer {token}"))
            .map_err(|_| "the upstream's token is not a header value")?;
        value.set_sensitive(true);
        headers.insert(AUTHORIZATION, value);
    }
    Ok(headers)
}

#[cfg(test)]
mod tests {
    //! The short way against a scripted HTTP server on a real socket of 127.0.0.1: what it sends,
    //! and how it reads each kind of answer an upstream can give.

    use std::collections::HashMap;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use http::{HeaderName, HeaderValue};
    use rmcp::model::{
        CallToolRequest, CallToolRequestParams, ClientJsonRpcMessage, ClientRequest, GetExtensions,
        RequestId, ServerJsonRpcMessage, ServerResult,
    };
    use rmcp::service::InboundStreamOrigin;
    use serde_json::{Value, json};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    use super::{Posted, Poster};
    use crate::gateway::progress::Routes;

    /// A server that answers one request with `response` (raw HTTP) and hands back what it got.
    async fn upstream(response: String) -> (String, tokio::task::JoinHandle<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}/mcp", listener.local_addr().expect("address"));
        let served = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.expect("accept");
            let got = read_request(&mut socket)
                .await
                .expect("the client hung up before its request");
            socket.write_all(response.as_bytes()).await.expect("write");
            socket.shutdown().await.expect("shutdown");
            got
        });
        (url, served)
    }

    /// One whole request (head and `content-length` body), or `None` if the client closed the
    /// connection first.
    async fn read_request(socket: &mut TcpStream) -> Option<String> {
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let n = socket.read(&mut buf).await.ok()?;
            if n == 0 {
                return None;
            }
            got.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&got).to_string();
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let length = head
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("content-length: ")
                            .map(str::to_owned)
                    })
                    .and_then(|v| v.trim().parse::<usize>().ok())
                    .unwrap_or(0);
                if body.len() >= length {
                    return Some(text);
                }
            }
        }
    }

    /// A server that answers every call on every connection with `Echo: hi` under the call's own
    /// id, as an SSE stream, keeping the connection open unless `close` (then it says so in the
    /// answer and closes it); and the number of connections it accepted.
    async fn serving(close: bool) -> (String, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}/mcp", listener.local_addr().expect("address"));
        let connections = Arc::new(AtomicUsize::new(0));
        let accepted = Arc::clone(&connections);
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                accepted.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    while let Some(request) = read_request(&mut socket).await {
                        let (_, body) = request.split_once("\r\n\r\n").expect("whole");
                        let id = serde_json::from_str::<Value>(body).expect("json")["id"].clone();
                        let answer = json!({"jsonrpc": "2.0", "id": id, "result": {"content": [{"type": "text", "text": "Echo: hi"}]}});
                        let body = events(&[answer]);
                        let closing = if close { "connection: close\r\n" } else { "" };
                        let response = format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\n{closing}\r\n{body}",
                            body.len()
                        );
                        socket.write_all(response.as_bytes()).await.expect("write");
                        if close {
                            let _ = socket.shutdown().await;
                            return;
                        }
                    }
                });
            }
        });
        (url, connections)
    }

    /// The gateway's own client for upstreams (connection pool, redirect policy, TLS provider).
    fn client() -> reqwest::Client {
        crate::install_tls_provider();
        crate::gateway::upstream::http_client(&"http://127.0.0.1/".parse().expect("url"))
            .expect("client")
    }

    fn respond(status: &str, content_type: &str, body: &str) -> String {
        format!(
            "HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
    }

    fn events(messages: &[Value]) -> String {
        messages
            .iter()
            .map(|m| format!("event: message\ndata: {m}\n\n"))
            .collect()
    }

    /// The two clients of the short way: its own connections (`wire.rs`, for an endpoint on this
    /// machine) and reqwest's (for any other).
    const OWN_CONNECTIONS: [bool; 2] = [true, false];

    /// A poster whose session rmcp has set up: id `S1`, revision 2025-11-25, bearer `T`; on its
    /// own connections or on reqwest's.
    fn set_up(
        url: &str,
        own: bool,
    ) -> (
        Poster,
        tokio::sync::mpsc::UnboundedReceiver<ServerJsonRpcMessage>,
    ) {
        let (observed, mut poster, injected) =
            Poster::new(client(), reqwest::Url::parse(url).expect("url"));
        assert!(poster.wire.is_some(), "an endpoint on this machine");
        if !own {
            poster.wire = None;
        }
        let initialized: ClientJsonRpcMessage = serde_json::from_value(
            json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        )
        .expect("notification");
        let headers = HashMap::from([(
            HeaderName::from_static("mcp-protocol-version"),
            HeaderValue::from_static("2025-11-25"),
        )]);
        observed.note(
            &initialized,
            Some(&Arc::from("S1")),
            Some(&"T".to_owned()),
            &headers,
        );
        (poster, injected)
    }

    fn call() -> ClientRequest {
        let params = CallToolRequestParams::new("echo").with_arguments(
            json!({"message": "hi"})
                .as_object()
                .cloned()
                .expect("object"),
        );
        ClientRequest::CallToolRequest(CallToolRequest::new(params))
    }

    fn result_text(posted: Posted) -> String {
        match posted {
            Posted::Answered(answer) => match *answer {
                Ok(ServerResult::CallToolResult(result)) => serde_json::to_value(&result)
                    .expect("json")["content"][0]["text"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                other => panic!("not a call result: {other:?}"),
            },
            _ => panic!("not answered"),
        }
    }

    #[tokio::test]
    async fn a_call_carries_the_session_and_its_json_answer_is_read_as_a_call_result() {
        for own in OWN_CONNECTIONS {
            a_call_carries_the_session(own).await;
        }
    }

    async fn a_call_carries_the_session(own: bool) {
        let answer = json!({"jsonrpc": "2.0", "id": "tg-0", "result": {"content": [{"type": "text", "text": "Echo: hi"}]}});
        let (url, served) =
            upstream(respond("200 OK", "application/json", &answer.to_string())).await;
        let (poster, _injected) = set_up(&url, own);
        assert!(poster.ready());
        let id = poster.next_id();
        let posted = poster.post(&id, &mut call(), &Routes::default()).await;
        assert_eq!(result_text(posted), "Echo: hi");

        let request = served.await.expect("served");
        let (head, body) = request.split_once("\r\n\r\n").expect("a whole request");
        let head = head.to_ascii_lowercase();
        assert!(head.starts_with("post /mcp http/1.1"), "{head}");
        for line in [
            "mcp-session-id: s1",
            "mcp-protocol-version: 2025-11-25",
            "authorization: bearer t",
            "accept: application/json, text/event-stream",
            "content-type: application/json",
        ] {
            assert!(head.contains(line), "{line} missing from\n{head}");
        }
        let body: Value = serde_json::from_str(body).expect("json body");
        assert_eq!(body["id"], "tg-0");
        assert_eq!(body["method"], "tools/call");
        assert_eq!(body["params"]["name"], "echo");
        assert_eq!(body["params"]["arguments"], json!({"message": "hi"}));
        assert_eq!(body["params"]["_meta"]["progressToken"], "tg-0");
    }

    #[tokio::test]
    async fn a_question_on_the_stream_goes_to_rmcp_marked_with_the_call_it_came_on() {
        for own in OWN_CONNECTIONS {
            a_question_goes_to_rmcp(own).await;
        }
    }

    async fn a_question_goes_to_rmcp(own: bool) {
        let question = json!({"jsonrpc": "2.0", "id": 7, "method": "roots/list"});
        let answer = json!({"jsonrpc": "2.0", "id": "tg-0", "result": {"content": [{"type": "text", "text": "done"}]}});
        let (url, _served) = upstream(respond(
            "200 OK",
            "text/event-stream",
            &events(&[question, answer]),
        ))
        .await;
        let (poster, mut injected) = set_up(&url, own);
        let id = poster.next_id();
        let posted = poster.post(&id, &mut call(), &Routes::default()).await;
        assert_eq!(result_text(posted), "done");
        match injected.try_recv().expect("the question was handed on") {
            ServerJsonRpcMessage::Request(request) => {
                assert_eq!(request.id, RequestId::Number(7));
                assert_eq!(
                    request.request.extensions().get::<InboundStreamOrigin>(),
                    Some(&InboundStreamOrigin::OutboundRequest(id))
                );
            }
            other => panic!("handed on something else: {other:?}"),
        }
    }

    #[tokio::test]
    async fn each_other_answer_says_whether_anything_ran() {
        for own in OWN_CONNECTIONS {
            each_other_answer(own).await;
        }
    }

    async fn each_other_answer(own: bool) {
        // The upstream no longer knows the session: nothing ran.
        for (status, body) in [
            ("404 Not Found", String::new()),
            (
                "400 Bad Request",
                json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32000, "message": "Bad Request: No valid session ID provided"}}).to_string(),
            ),
        ] {
            let (url, _served) = upstream(respond(status, "application/json", &body)).await;
            let (poster, _) = set_up(&url, own);
            let posted = poster.post(&poster.next_id(), &mut call(), &Routes::default()).await;
            assert!(matches!(posted, Posted::SessionEnded(_)), "{status}");
        }
        // Its own error about this request: passed on as its answer.
        let rejected = json!({"jsonrpc": "2.0", "id": "tg-0", "error": {"code": -32602, "message": "no such tool"}});
        let (url, _served) = upstream(respond(
            "400 Bad Request",
            "application/json",
            &rejected.to_string(),
        ))
        .await;
        let (poster, _) = set_up(&url, own);
        match poster
            .post(&poster.next_id(), &mut call(), &Routes::default())
            .await
        {
            Posted::Answered(answer) => {
                let error = (*answer).expect_err("an error");
                assert_eq!(error.code.0, -32602);
                assert_eq!(error.message, "no such tool");
            }
            _ => panic!("the upstream's error was not its answer"),
        }
        // Sent, and no answer: unknown.
        let (url, _served) =
            upstream(respond("500 Internal Server Error", "text/plain", "boom")).await;
        let (poster, _) = set_up(&url, own);
        let posted = poster
            .post(&poster.next_id(), &mut call(), &Routes::default())
            .await;
        assert!(matches!(posted, Posted::Lost(_)));
        let progress = json!({"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": "tg-0", "progress": 1}});
        let (url, _served) =
            upstream(respond("200 OK", "text/event-stream", &events(&[progress]))).await;
        let (poster, _) = set_up(&url, own);
        let posted = poster
            .post(&poster.next_id(), &mut call(), &Routes::default())
            .await;
        assert!(
            matches!(posted, Posted::Lost(_)),
            "a stream that ended without the answer"
        );
        // Nobody listening: nothing was sent.
        let closed = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}/mcp", closed.local_addr().expect("address"));
        drop(closed);
        let (poster, _) = set_up(&url, own);
        let posted = poster
            .post(&poster.next_id(), &mut call(), &Routes::default())
            .await;
        assert!(matches!(posted, Posted::NotSent(_)));
    }

    #[tokio::test]
    async fn the_own_connections_carry_call_after_call_and_one_the_upstream_closes_is_not_reused() {
        // Kept open by the upstream: every call on the first connection.
        let (url, connections) = serving(false).await;
        let (poster, _) = set_up(&url, true);
        for _ in 0..3 {
            let posted = poster
                .post(&poster.next_id(), &mut call(), &Routes::default())
                .await;
            assert_eq!(result_text(posted), "Echo: hi");
        }
        assert_eq!(connections.load(Ordering::SeqCst), 1);
        // Closed by the upstream after each answer: each call answered on a new connection.
        let (url, connections) = serving(true).await;
        let (poster, _) = set_up(&url, true);
        for _ in 0..3 {
            let posted = poster
                .post(&poster.next_id(), &mut call(), &Routes::default())
                .await;
            assert_eq!(result_text(posted), "Echo: hi");
        }
        assert_eq!(connections.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_redirect_sends_the_request_the_rmcp_way_whose_client_follows_it() {
        let (url, _served) = upstream(
            "HTTP/1.1 307 Temporary Redirect\r\nlocation: /elsewhere\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                .to_owned(),
        )
        .await;
        let (poster, _) = set_up(&url, true);
        let posted = poster
            .post(&poster.next_id(), &mut call(), &Routes::default())
            .await;
        assert!(matches!(posted, Posted::NotReady));
    }

    #[tokio::test]
    async fn before_rmcp_has_a_session_requests_go_the_rmcp_way() {
        let (_observed, poster, _) = Poster::new(
            client(),
            reqwest::Url::parse("http://127.0.0.1:9/mcp").expect("url"),
        );
        assert!(!poster.ready());
        let posted = poster
            .post(&poster.next_id(), &mut call(), &Routes::default())
            .await;
        assert!(matches!(posted, Posted::NotReady));
    }
}
