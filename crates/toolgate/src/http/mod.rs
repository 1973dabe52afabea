//! Streamable HTTP: one MCP endpoint (default `/mcp`) in front of a [`GateServer`], acting as an
//! OAuth 2.1 resource server (MCP 2026-07-28 transport and authorization; DESIGN.md §7).
//!
//! rmcp's `StreamableHttpService` speaks the protocol (stateless 2026-07-28 requests with their
//! `MCP-Protocol-Version` / `Mcp-Method` / `Mcp-Name` checks and -32020, legacy sessions for
//! `initialize` clients). Everything in front of it is ours: one layer of checks (`layers.rs`),
//! in this order for every request: header size (431) → one `Host`, ours, and at most one
//! allowed `Origin` (DNS rebinding; 400 / 403) → no token in the query (400) → the body, read
//! with a size cap and a deadline (413 / 408) → one JSON-RPC message with a single reading
//! (415 / 400 with -32700 / -32600) → bearer token (`auth.rs`; 401 with a `WWW-Authenticate`
//! challenge naming the RFC 9728 metadata) → the called tool's scope (403 `insufficient_scope`,
//! step-up) → `dispatch` to rmcp. The verified principal rides in the request's extensions; the
//! gate reads it from there, so approvals, budgets, rate limits and audit records are about the
//! token's subject. Tokens never go further: the gateway's upstream connections carry their own
//! credentials.
//!
//! Beside the endpoint, behind the `Host` / `Origin` check only: `/healthz` (the process answers)
//! and `/readyz` (the gate can decide a call now, [`crate::gate::Gate::readiness`]; 503 while
//! draining), for load balancers, which carry no token.
//!
//! Design decision: the front door reads each message before rmcp does (the scope a call needs
//! depends on the tool it names, and the 403 must be an HTTP answer that the client's OAuth stack
//! acts on), so two parsers read every request. A body is let through only when it has one
//! reading (`strict.rs`: no repeated member names, UTF-8, bounded nesting), so that the tool
//! whose scope was checked is the tool rmcp calls.

pub mod auth;
mod challenge;
mod error;
pub(crate) mod layers;
mod message;
mod short;
#[cfg(test)]
mod tests;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::from_fn_with_state;
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use http::{Method, StatusCode, header};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use toolgate_core::principal::Principal;

pub use auth::{AuthConfig, KeySource, Verifier};
pub use error::ResourceError;

use crate::GateServer;

/// Request bodies larger than this are refused with 413 unless configured otherwise.
pub const DEFAULT_MAX_BODY: usize = 100 * 1024;
/// Request headers (names and values together) larger than this are refused with 431.
pub const MAX_HEADER_BYTES: usize = 32 * 1024;

/// How the endpoint is served.
#[derive(Clone, Debug)]
pub struct HttpConfig {
    /// The MCP endpoint's path, e.g. `/mcp`.
    pub path: String,
    /// This server's canonical URI (RFC 8707 resource; tokens' audience).
    pub resource: String,
    /// `Host` values accepted (a name, or `name:port`); anything else is 403.
    pub allowed_hosts: Vec<String>,
    /// `Origin` values accepted (`scheme://host[:port]`); a request with any other Origin is 403.
    pub allowed_origins: Vec<String>,
    /// Largest request body, in bytes.
    pub max_body: usize,
    /// Time a client has to send its headers, then its body.
    pub read_timeout: Duration,
    /// Connections served at once; more wait in the listen backlog.
    pub max_connections: usize,
    /// How often an open answer stream carries a keep-alive comment, so that a call held for a
    /// while does not look like a dead connection to the client or a proxy between.
    pub keep_alive: Duration,
}

impl HttpConfig {
    /// Defaults for an endpoint at `resource` (its path is the endpoint's path): loopback hosts
    /// and the resource's own host, no browser origins, 100 KiB bodies, 10 s to send a request.
    ///
    /// # Errors
    /// `resource` is not an absolute http(s) URI.
    pub fn new(resource: &str) -> Result<Self, ResourceError> {
        let (resource, url) = canonical_resource(resource)?;
        let mut allowed_hosts: Vec<String> = ["localhost", "127.0.0.1", "[::1]", "::1"]
            .iter()
            .map(|h| (*h).to_owned())
            .collect();
        if let Some(host) = url.host_str() {
            allowed_hosts.push(host.to_ascii_lowercase());
        }
        let path = match url.path() {
            "" => "/".to_owned(),
            path => path.to_owned(),
        };
        Ok(Self {
            path,
            resource,
            allowed_hosts,
            allowed_origins: Vec::new(),
            max_body: DEFAULT_MAX_BODY,
            read_timeout: Duration::from_secs(10),
            max_connections: 1024,
            keep_alive: Duration::from_secs(15),
        })
    }
}

impl HttpConfig {
    /// Also accepts this server's own origin when it listens on a loopback address: a page served
    /// from `http://127.0.0.1:PORT` (or `http://localhost:PORT`, `http://[::1]:PORT`) talking to
    /// the server bound at that same address and port. DNS rebinding cannot produce that Origin:
    /// a browser sends the origin of the page, and a rebound name is not a loopback literal.
    /// Another port, another host, or `https` to this plain-http server stays refused unless
    /// listed.
    #[must_use]
    pub fn with_loopback_origins(mut self, bound: SocketAddr) -> Self {
        if !bound.ip().is_loopback() {
            return self;
        }
        let port = bound.port();
        // `SocketAddr` displays `[::1]:PORT`, as an Origin spells an IPv6 host.
        self.allowed_origins.push(format!("http://{bound}"));
        let canonical = match bound.ip() {
            std::net::IpAddr::V4(ip) => ip == std::net::Ipv4Addr::LOCALHOST,
            std::net::IpAddr::V6(ip) => ip == std::net::Ipv6Addr::LOCALHOST,
        };
        if canonical {
            self.allowed_origins
                .push(format!("http://localhost:{port}"));
        }
        self
    }
}

/// The canonical form of a resource URI (MCP authorization: lower-case scheme and host, no
/// fragment, no trailing slash unless the path is `/`), and its parsed URL.
///
/// # Errors
/// Not an absolute http(s) URI, or it has a fragment, query or credentials.
pub fn canonical_resource(resource: &str) -> Result<(String, url::Url), ResourceError> {
    let url = url::Url::parse(resource).map_err(|source| ResourceError::Invalid {
        resource: resource.to_owned(),
        source,
    })?;
    let resource = resource.to_owned();
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(ResourceError::NotHttp { resource });
    }
    if url.fragment().is_some() || url.query().is_some() {
        return Err(ResourceError::QueryOrFragment { resource });
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(ResourceError::Credentials { resource });
    }
    // `url` already lower-cases scheme and host and drops default ports.
    let mut text = url.to_string();
    if text.ends_with('/') && url.path() != "/" {
        text.pop();
    }
    Ok((text, url))
}

/// The client address of a request (set by [`serve`] for each connection).
#[derive(Clone, Copy, Debug)]
pub struct Peer(pub SocketAddr);

/// The HTTP application: the MCP endpoint behind the front door (`layers.rs`) and, with auth, the
/// RFC 9728 metadata documents. `verifier` `None` serves without authentication (the CLI allows
/// that on loopback only).
pub fn router(
    server: GateServer,
    config: HttpConfig,
    verifier: Option<Arc<Verifier>>,
    shutdown: CancellationToken,
) -> axum::Router {
    let door = Arc::new(layers::Door::new(&config));
    let auth = verifier.map(|verifier| Arc::new(layers::Auth::new(verifier, server.clone())));
    let front = Arc::new(layers::Front {
        door: Arc::clone(&door),
        caps: layers::Caps {
            max_body: config.max_body,
            read_timeout: config.read_timeout,
        },
        auth: auth.clone(),
    });
    let path = config.path.clone();
    let probes = Probes {
        server: server.clone(),
        shutdown: shutdown.clone(),
    };
    let mcp = Arc::new(Mcp::new(server, config, shutdown));

    let headers = from_fn_with_state(door, layers::headers);
    let front_door = from_fn_with_state(front, layers::front_door);
    let mut app = axum::Router::new().route(&path, any(dispatch).with_state(mcp).layer(front_door));
    // Probes answer without a token (a load balancer has none), behind the Host and Origin check.
    // An MCP endpoint configured at one of their paths keeps it.
    if path != HEALTHZ {
        app = app.route(HEALTHZ, get(healthz).layer(headers.clone()));
    }
    if path != READYZ {
        app = app.route(
            READYZ,
            get(readyz).with_state(probes).layer(headers.clone()),
        );
    }
    if let Some(auth) = auth {
        let metadata = &auth.metadata;
        let document = get(serve_metadata)
            .with_state(Arc::clone(metadata))
            .layer(headers);
        app = app
            .route(&metadata.root_path, document.clone())
            .route(&metadata.inserted_path, document);
    }
    app
}

/// Liveness: the process answers HTTP. Nothing is read; a wedged store is `/readyz`'s to report.
pub const HEALTHZ: &str = "/healthz";
/// Readiness: the gate can decide a call now ([`crate::gate::Gate::readiness`]) and the server is
/// not shutting down.
pub const READYZ: &str = "/readyz";

/// How long each store has to answer a readiness probe.
const PROBE_WITHIN: Duration = Duration::from_secs(2);

#[derive(Clone)]
struct Probes {
    server: GateServer,
    shutdown: CancellationToken,
}

async fn healthz() -> Response {
    probe_answer(StatusCode::OK, &serde_json::json!({"status": "ok"}))
}

/// 200 when every check passes, 503 naming each check otherwise (and while the server drains
/// its open requests after SIGTERM, so that a load balancer stops sending new ones).
async fn readyz(State(probes): State<Probes>) -> Response {
    let readiness = probes.server.gate().readiness(PROBE_WITHIN).await;
    let draining = probes.shutdown.is_cancelled();
    let mut checks: serde_json::Map<String, serde_json::Value> = readiness
        .checks
        .iter()
        .map(|probe| {
            let check = serde_json::json!({"ok": probe.ok, "detail": probe.detail});
            (probe.name.to_owned(), check)
        })
        .collect();
    if draining {
        let check = serde_json::json!({"ok": false, "detail": "shutting down"});
        checks.insert("serving".to_owned(), check);
    }
    let ready = readiness.ready() && !draining;
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    probe_answer(
        status,
        &serde_json::json!({"ready": ready, "checks": checks}),
    )
}

fn probe_answer(status: StatusCode, body: &serde_json::Value) -> Response {
    (
        status,
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        body.to_string(),
    )
        .into_response()
}

async fn serve_metadata(State(metadata): State<Arc<challenge::Metadata>>) -> Response {
    (
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::CACHE_CONTROL, "max-age=3600"),
        ],
        metadata.document.clone(),
    )
        .into_response()
}

/// rmcp's service, and the server it serves, whose sessions the front door also knows.
struct Mcp {
    service: StreamableHttpService<GateServer, LocalSessionManager>,
    /// The server of every session (rmcp's factory clones it): its `Sessions` say who opened
    /// each legacy session and with which client, and the short way calls it (`short.rs`).
    server: GateServer,
    /// rmcp's sessions, to forget owners of sessions that ended and to keep used ones alive.
    session_manager: Arc<LocalSessionManager>,
    /// The server's stop: a call answered by the front door is cancelled with it, as rmcp's are.
    shutdown: CancellationToken,
    /// [`HttpConfig::keep_alive`].
    keep_alive: Duration,
}

impl std::fmt::Debug for Mcp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mcp").finish_non_exhaustive()
    }
}

impl Mcp {
    fn new(server: GateServer, config: HttpConfig, shutdown: CancellationToken) -> Self {
        // rmcp's own Host, Origin and size checks stay on behind ours: defence in depth.
        let mcp_config = StreamableHttpServerConfig::default()
            .with_allowed_hosts(config.allowed_hosts)
            .with_allowed_origins(config.allowed_origins)
            .enforce_origin_validation()
            .with_max_request_body_bytes(config.max_body)
            .with_json_response(true)
            .with_sse_keep_alive(Some(config.keep_alive))
            .with_cancellation_token(shutdown.clone());
        let session_manager = Arc::new(LocalSessionManager::default());
        let factory = server.clone();
        let service = StreamableHttpService::new(
            move || Ok(factory.clone()),
            session_manager.clone(),
            mcp_config,
        );
        Self {
            service,
            server,
            session_manager,
            shutdown,
            keep_alive: config.keep_alive,
        }
    }
}

/// A request the front door let in: a session's plain `tools/call` is answered here
/// (`short.rs`), the rest by rmcp; legacy sessions stay with the subject that opened them.
async fn dispatch(State(mcp): State<Arc<Mcp>>, mut request: Request) -> Response {
    let sub = request
        .extensions()
        .get::<Principal>()
        .map(|p| p.sub.clone());
    let sessions = mcp.server.sessions();
    let session = request
        .headers()
        .get(SESSION_HEADER)
        .and_then(|session| session.to_str().ok())
        .map(str::to_owned);
    if let (Some(sub), Some(session)) = (&sub, &session)
        && !sessions.is_for(session, sub)
    {
        // Someone else's legacy session: rmcp is asked about one that does not exist, so the
        // answer is, byte for byte, the one an invented id gets.
        tracing::warn!(principal = %sub, "a legacy session of another subject was used");
        request
            .headers_mut()
            .insert(SESSION_HEADER, http::HeaderValue::from_static("none"));
    } else if let Some(session) = &session {
        if let Some(cancelled) = request
            .extensions()
            .get::<message::Called>()
            .and_then(|called| called.cancelled.as_ref())
        {
            // Passed on to rmcp too, which cancels the call if it is one of its own.
            sessions.cancel(session, cancelled);
        }
        request = match short::answer(&mcp, request).await {
            Ok(response) => return response,
            Err(request) => request,
        };
    }
    let ended = (request.method() == Method::DELETE)
        .then(|| request.headers().get(SESSION_HEADER).cloned())
        .flatten();
    // Boxed: rmcp's handling is kilobytes, and this future, which every request builds and
    // moves, would be as large for the calls that take the short way (corridor, "Sizes").
    let response = Box::pin(mcp.service.handle(request)).await;
    if response.status() == StatusCode::UNSUPPORTED_MEDIA_TYPE {
        // rmcp says 415 for a body it cannot deserialize, but the Content-Type was checked in
        // front: what rmcp could not read is the message (an error response without a code, say).
        return challenge::rpc_error(
            StatusCode::BAD_REQUEST,
            message::INVALID_REQUEST,
            "not a JSON-RPC message this server reads".to_owned(),
        );
    }
    if let Some(opened) = response.headers().get(SESSION_HEADER)
        && let Ok(opened) = opened.to_str()
    {
        mcp.remember_session(opened, sub).await;
    }
    if let Some(ended) = ended
        && response.status().is_success()
        && let Ok(ended) = ended.to_str()
    {
        sessions.forget(ended);
        // rmcp says 202 Accepted, but the session is gone by now and the answer carries nothing:
        // 204 No Content (RFC 9110 §9.3.5), one of the two a client checks for (the Python SDK
        // logs "Session termination failed" for anything but 200 and 204).
        return StatusCode::NO_CONTENT.into_response();
    }
    response.map(Body::new)
}

use crate::server::SESSION_HEADER;

impl Mcp {
    /// Records who opened `session`, when a token said; past a thousand sessions, first
    /// forgets those rmcp no longer has (closed or expired), so the map is as big as the live
    /// sessions.
    async fn remember_session(&self, session: &str, sub: Option<String>) {
        let sessions = self.server.sessions();
        if let Some(sub) = sub {
            sessions.remember(session, sub);
        }
        let known = sessions.len();
        if known < 1024 || !known.is_power_of_two() {
            return;
        }
        let live: std::collections::HashSet<String> = self
            .session_manager
            .sessions
            .read()
            .await
            .keys()
            .map(|id| id.to_string())
            .collect();
        sessions.retain(|id| live.contains(id));
    }
}

/// Cancels `shutdown` when SIGINT or SIGTERM arrives: the HTTP server then stops taking requests
/// and held calls answer pending at once.
pub async fn stop_on_signal(shutdown: CancellationToken) {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(term) => term,
        Err(error) => {
            tracing::warn!(error = %error, "cannot watch SIGTERM");
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tracing::info!("shutting down");
    shutdown.cancel();
}

/// Serves `app` on `listener` until `shutdown`, then lets open requests finish for `grace`.
/// Clients get `read_timeout` to send their headers; at most `max_connections` are served at once.
///
/// # Errors
/// The listener failed.
pub async fn serve(
    listener: TcpListener,
    app: axum::Router,
    config: &HttpConfig,
    shutdown: CancellationToken,
    grace: Duration,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioIo, TokioTimer};
    use hyper_util::service::TowerToHyperService;

    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let slots = Arc::new(tokio::sync::Semaphore::new(config.max_connections));
    loop {
        let permit = tokio::select! {
            () = shutdown.cancelled() => break,
            permit = slots.clone().acquire_owned() => permit.map_err(std::io::Error::other)?,
        };
        let (stream, peer): (_, SocketAddr) = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors and the like: wait instead of spinning.
                    tracing::warn!(error = %error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(tower::ServiceExt::map_request(
            app.clone(),
            move |mut request: http::Request<hyper::body::Incoming>| {
                request.extensions_mut().insert(Peer(peer));
                request
            },
        ));
        let connection = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(config.read_timeout)
            // Bounds what one connection buffers; headers are also counted per request.
            .max_buf_size(64 * 1024)
            .max_headers(100)
            .serve_connection(TokioIo::new(stream), service);
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(peer = %peer, error = %error, "connection ended with an error");
            }
            drop(permit);
        });
    }
    if tokio::time::timeout(grace, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            grace_s = grace.as_secs_f64(),
            "requests still open after the grace period"
        );
    }
    Ok(())
}
