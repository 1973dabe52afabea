//! The short way of a `tools/call` in an `initialize`-era session: answered by the front door
//! itself, on the request's own task, instead of through rmcp's session plumbing.
//!
//! Through rmcp, a session's call is parsed a second time, passed to the session's worker task,
//! on to its service loop, to a handler task of its own, and its answer back the same way onto an
//! SSE stream with a priming event; on the gateway's path that was the larger part of what the
//! proxy spends per call (docs/performance.md, "Gateway over HTTP"). Here the call that the front
//! door has already read ([`Short`](super::message::Short)) goes to rmcp's handling of a request (`Service::
//! handle_request`: the server's `call_tool`, then rmcp's shaping of the result for the session's
//! version) with the session's own client (rmcp's peer, which the server noted when the session
//! was initialized), and the answer is one JSON body (the transport lets a server answer a POST
//! with JSON or a stream).
//!
//! Only what the two ways answer alike takes it. The client of a call may be sent messages about
//! it while it runs, and only rmcp's way puts them on the call's own stream. So a call takes the
//! short way when nothing can be sent about it:
//! - no progress token (the front door's reading, [`Short`](super::message::Short));
//! - a client that declared no sampling, elicitation or roots, so that no upstream question is
//!   put to it (the gateway asks only what a client declared, `gateway/relay.rs`), and no
//!   approval link either (`corridor/approval.rs`);
//! - the session's version, or none, in `MCP-Protocol-Version`, no `Mcp-Method` / `Mcp-Name`
//!   (whose checks are rmcp's), and an `Accept` that names JSON and SSE plainly.
//!
//! Everything else, and every call of a session the server has not seen initialized, goes to
//! rmcp as before. Log messages go to the session's standalone stream either way.
//!
//! The call runs on a task of its own, as under rmcp: a client that goes away does not stop a
//! mutation half-way. A call still running after [`KEEP_ALIVE`] is answered as a stream instead,
//! with rmcp's keep-alive comments until the answer, so that a long hold for a person's approval
//! does not look like a dead connection to the client or a proxy between. rmcp's session is
//! told the session is in use ([`TOUCH_EVERY`]), since these calls do not reach its idle timer.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::Body;
use axum::body::Bytes;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, HeaderValue, StatusCode, header};
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, ClientCapabilities, ClientRequest, MetaObject,
    RequestMetaObject, ServerJsonRpcMessage,
};
use rmcp::service::RequestContext;
use rmcp::{RoleServer, Service};
use tokio::task::JoinHandle;

use super::Mcp;
use super::message::Called;
use crate::server::SESSION_HEADER;

/// How often, at most, rmcp's session is told that calls still use it (well inside its 5 min).
const TOUCH_EVERY: Duration = Duration::from_secs(60);

/// Answers `request` on the short way, or hands it back for rmcp.
pub(super) async fn answer(mcp: &Mcp, mut request: Request) -> Result<Response, Request> {
    let Some(session) = session_of(&request) else {
        return Err(request);
    };
    let Some(client) = mcp.server.sessions().client(&session) else {
        return Err(request);
    };
    let caps = client
        .peer_info()
        .map(|info| (info.capabilities.clone(), info.protocol_version.clone()));
    let Some((capabilities, version)) = caps else {
        return Err(request);
    };
    if may_be_asked(&capabilities) || !plain_headers(request.headers(), version.as_str()) {
        return Err(request);
    }
    // Decided: from here the call is ours.
    let Some(Called {
        tool: Some(tool),
        arguments,
        short: Some(short),
        ..
    }) = request.extensions_mut().remove::<Called>()
    else {
        return Err(request);
    };
    let mut params = CallToolRequestParams::new(tool);
    params.arguments = arguments;
    let mut context = RequestContext::new(short.id.clone(), client);
    context.ct = mcp.shutdown.child_token();
    context.meta = RequestMetaObject(MetaObject(short.meta));
    let (parts, _body) = request.into_parts();
    context.extensions.insert(parts);
    let running = mcp
        .server
        .sessions()
        .running(&session, short.id.clone(), context.ct.clone());
    if mcp.server.sessions().due_for_touch(&session, TOUCH_EVERY) {
        touch(mcp, session);
    }
    let server = mcp.server.clone();
    let id = short.id;
    let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
    let call = tokio::spawn(async move {
        // rmcp's own handling of a request, as its service loop calls it: the legacy shape of
        // the result, the task guard and the error codes stay rmcp's. Boxed: its state machine
        // holds every request kind's handler (kilobytes), which the spawn would otherwise copy
        // into the task on every call; this way the task holds a pointer.
        let handling = Service::<RoleServer>::handle_request(&server, request, context);
        let answer = Box::pin(handling).await;
        drop(running);
        let message = match answer {
            Ok(result) => ServerJsonRpcMessage::response(result, id),
            Err(error) => ServerJsonRpcMessage::error(error, Some(id)),
        };
        serde_json::to_vec(&message).map(Bytes::from)
    });
    Ok(respond(call, mcp.keep_alive).await)
}

/// The session of a call that the front door's reading found fit for the short way.
fn session_of(request: &Request) -> Option<String> {
    request.extensions().get::<Called>()?.short.as_ref()?;
    let session = request.headers().get(SESSION_HEADER)?.to_str().ok()?;
    Some(session.to_owned())
}

/// Whether the client declared something the call could ask of it on its own stream.
fn may_be_asked(capabilities: &ClientCapabilities) -> bool {
    capabilities.sampling.is_some()
        || capabilities.elicitation.is_some()
        || capabilities.roots.is_some()
}

/// The session's version or none, no SEP-2243 headers, and an `Accept` that lists
/// `application/json` and `text/event-stream` without parameters.
fn plain_headers(headers: &HeaderMap, version: &str) -> bool {
    let version_ok = headers
        .get("mcp-protocol-version")
        .is_none_or(|value| value.as_bytes() == version.as_bytes());
    let no_standard = !headers.contains_key("mcp-method") && !headers.contains_key("mcp-name");
    let mut accepts = (false, false);
    for value in headers.get_all(header::ACCEPT) {
        let Ok(value) = value.to_str() else {
            return false;
        };
        for entry in value.split(',').map(str::trim) {
            accepts.0 |= entry.eq_ignore_ascii_case("application/json");
            accepts.1 |= entry.eq_ignore_ascii_case("text/event-stream");
        }
    }
    version_ok && no_standard && accepts == (true, true)
}

/// Tells rmcp's session that it is in use: a request-wise channel opened and closed at once is
/// an event of the session's worker, which restarts its idle timer, and nothing else.
fn touch(mcp: &Mcp, session: String) {
    let manager = mcp.session_manager.clone();
    tokio::spawn(async move {
        let handle = manager.sessions.read().await.get(session.as_str()).cloned();
        let Some(handle) = handle else { return };
        if let Ok(channel) = handle.establish_request_wise_channel().await
            && let Some(id) = channel.http_request_id
        {
            let _ = handle.close_request_wise_channel(id).await;
        }
    });
}

type Answer = JoinHandle<Result<Bytes, serde_json::Error>>;

/// The call's answer as JSON, or as a stream when it takes longer than `keep_alive`.
async fn respond(mut call: Answer, keep_alive: Duration) -> Response {
    match tokio::time::timeout(keep_alive, &mut call).await {
        Ok(done) => json(done),
        Err(_) => stream(call, keep_alive),
    }
}

fn json(done: Result<Result<Bytes, serde_json::Error>, tokio::task::JoinError>) -> Response {
    match done {
        Ok(Ok(body)) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            body,
        )
            .into_response(),
        Ok(Err(error)) => {
            lost(&error);
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
        Err(error) => {
            lost(&error);
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}

/// A call whose task failed (it panicked) or whose answer could not be written: the log says
/// why; the client gets a 500 or a stream that ends without the answer.
fn lost(error: &dyn std::fmt::Display) {
    tracing::error!(error = %error, "a call's answer was lost");
}

/// An SSE stream with a keep-alive comment every `keep_alive`, then the answer as one `message`
/// event.
fn stream(call: Answer, keep_alive: Duration) -> Response {
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(2);
    tokio::spawn(async move {
        let mut call = call;
        loop {
            match tokio::time::timeout(keep_alive, &mut call).await {
                Err(_) => {
                    if tx.send(Bytes::from_static(b":\n\n")).await.is_err() {
                        return;
                    }
                }
                Ok(Ok(Ok(body))) => {
                    let mut event = Vec::with_capacity(body.len() + 24);
                    event.extend_from_slice(b"event: message\ndata: ");
                    event.extend_from_slice(&body);
                    event.extend_from_slice(b"\n\n");
                    let _ = tx.send(Bytes::from(event)).await;
                    return;
                }
                // The stream ends without an answer: the client learns it is lost.
                Ok(Ok(Err(error))) => {
                    lost(&error);
                    return;
                }
                Ok(Err(error)) => {
                    lost(&error);
                    return;
                }
            }
        }
    });
    let body = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|chunk| (Ok::<_, Infallible>(chunk), rx))
    });
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(body),
    )
        .into_response()
}
