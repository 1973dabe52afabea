//! Streamable HTTP: one MCP endpoint (default `/mcp`) in front of a [`GateServer`], acting as an
//! OAuth 2.1 resource server (MCP 2026-07-28 transport and authorization; DESIGN.md §7).
//!
//! rmcp's `StreamableHttpService` speaks the protocol (stateless 2026-07-28 requests with their
//! `MCP-Protocol-Version` / `Mcp-Method` / `Mcp-Name` checks and -32020, legacy sessions for
//! `initialize` clients). Everything in front of it is ours, in this order, for every request:
//! `Host` (DNS rebinding) → `Origin` (present and not allowed: 403) → body read with a size cap
//! (413) and a deadline → bearer token (`auth.rs`; 401 with a `WWW-Authenticate` challenge naming
//! the RFC 9728 metadata) → the called tool's scope (403 `insufficient_scope`, step-up) → rmcp. The
//! verified principal rides in the request's extensions; the gate reads it from there, so
//! approvals, budgets, rate limits and audit records are about the token's subject. Tokens never go
//! further: the gateway's upstream connections carry their own credentials.
//!
//! Why the body is read here and not streamed to rmcp: the scope a call needs depends on the tool it
//! names, and the 403 must be an HTTP answer (the client's OAuth stack acts on it), so the message
//! has to be looked at before it is dispatched. The cap makes that cheap to bound.

pub mod auth;
mod challenge;
mod error;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use http::{HeaderMap, Method, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::Value;
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
        })
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

/// What every request handler shares.
struct Endpoint {
    config: HttpConfig,
    server: GateServer,
    mcp: StreamableHttpService<GateServer, LocalSessionManager>,
    verifier: Option<Arc<Verifier>>,
    /// The protected resource metadata document and the URL it is served at.
    metadata: Option<challenge::Metadata>,
    /// Every scope of the policy, space-separated: the 401 hint when no one tool is called.
    all_scopes: String,
    /// `config.allowed_origins` as (scheme, host, port), compared with each request's Origin.
    origins: Vec<String>,
    /// Legacy sessions and the subject that opened each: a session id is no bearer credential.
    sessions: Mutex<HashMap<String, String>>,
    /// rmcp's sessions, to forget owners of sessions that ended.
    session_manager: Arc<LocalSessionManager>,
    failures: Failures,
}

/// The client address of a request (set by [`serve`] for each connection).
#[derive(Clone, Copy, Debug)]
pub struct Peer(pub SocketAddr);

/// Failed token checks per client address, in fixed windows.
#[derive(Debug, Default)]
struct Failures {
    windows: Mutex<HashMap<IpAddr, (u32, Instant)>>,
}

/// Failed token checks an address may cause per window before it is told to wait.
const FAILURES_ALLOWED: u32 = 32;
const FAILURE_WINDOW: Duration = Duration::from_secs(10);

impl Failures {
    /// How long `ip` must wait before its tokens are checked again, if it used up its failures.
    fn wait(&self, ip: IpAddr) -> Option<Duration> {
        let windows = crate::lock(&self.windows);
        let (failures, since) = windows.get(&ip)?;
        let left = FAILURE_WINDOW.checked_sub(since.elapsed())?;
        (*failures >= FAILURES_ALLOWED).then_some(left)
    }

    fn count(&self, ip: IpAddr) {
        let mut windows = crate::lock(&self.windows);
        if windows.len() >= 10_000 {
            windows.retain(|_, (_, since)| since.elapsed() < FAILURE_WINDOW);
        }
        let window = windows.entry(ip).or_insert((0, Instant::now()));
        if window.1.elapsed() >= FAILURE_WINDOW {
            *window = (0, Instant::now());
        }
        window.0 += 1;
    }
}

/// The HTTP application: the MCP endpoint and, with auth, the RFC 9728 metadata documents.
/// `verifier` `None` serves without authentication (the CLI allows that on loopback only).
pub fn router(
    server: GateServer,
    config: HttpConfig,
    verifier: Option<Arc<Verifier>>,
    shutdown: CancellationToken,
) -> axum::Router {
    let factory = server.clone();
    let mcp_config = StreamableHttpServerConfig::default()
        .with_allowed_hosts(config.allowed_hosts.clone())
        .with_allowed_origins(config.allowed_origins.clone())
        .enforce_origin_validation()
        .with_max_request_body_bytes(config.max_body)
        .with_json_response(true)
        .with_cancellation_token(shutdown);
    let session_manager = Arc::new(LocalSessionManager::default());
    let mcp = StreamableHttpService::new(
        move || Ok(factory.clone()),
        session_manager.clone(),
        mcp_config,
    );
    let scopes = server.scopes();
    let metadata = verifier
        .as_ref()
        .map(|v| challenge::Metadata::new(v.config(), &scopes));
    let origins = config
        .allowed_origins
        .iter()
        .filter_map(|o| normal_origin(o))
        .collect();
    let mut app = axum::Router::new().route(&config.path, any(handle));
    if let Some(metadata) = &metadata {
        app = app
            .route(&metadata.root_path, get(serve_metadata))
            .route(&metadata.inserted_path, get(serve_metadata));
    }
    let endpoint = Arc::new(Endpoint {
        config,
        server,
        mcp,
        verifier,
        metadata,
        all_scopes: scopes.join(" "),
        origins,
        sessions: Mutex::new(HashMap::new()),
        session_manager,
        failures: Failures::default(),
    });
    app.with_state(endpoint)
}

async fn serve_metadata(State(endpoint): State<Arc<Endpoint>>, request: Request) -> Response {
    if let Some(refused) = endpoint.front_door_refusal(request.headers()) {
        return refused;
    }
    match &endpoint.metadata {
        Some(metadata) => (
            [
                (header::CONTENT_TYPE, "application/json"),
                (header::CACHE_CONTROL, "max-age=3600"),
            ],
            metadata.document.clone(),
        )
            .into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

/// Every request to the MCP endpoint.
async fn handle(State(endpoint): State<Arc<Endpoint>>, request: Request) -> Response {
    let config = &endpoint.config;
    if let Some(refused) = endpoint.front_door_refusal(request.headers()) {
        return refused;
    }
    if request.uri().query().is_some_and(|query| {
        url::form_urlencoded::parse(query.as_bytes()).any(|(name, _)| name == "access_token")
    }) {
        // OAuth 2.1 §5.1.1: never in the query string (it ends up in logs and histories).
        return challenge::query_token();
    }
    let (mut parts, body) = request.into_parts();
    let body = if parts.method == Method::POST {
        match read_body(body, config).await {
            Ok(bytes) => bytes,
            Err(refused) => return refused,
        }
    } else {
        Bytes::new()
    };
    if let Some(verifier) = &endpoint.verifier {
        let metadata = endpoint
            .metadata
            .as_ref()
            .expect("metadata is built with the verifier");
        let call = Called::parse(&body);
        let needed = call
            .tool
            .as_deref()
            .and_then(|tool| endpoint.server.required_scope(tool));
        let hint = needed.as_deref().unwrap_or(&endpoint.all_scopes);
        let Some(token) = bearer(&parts.headers) else {
            tracing::info!(method = %parts.method, "request without a bearer token refused");
            return challenge::unauthorized(metadata, hint, false);
        };
        let principal = match verifier.recently_verified(token) {
            Some(principal) => principal,
            None => {
                // A full check costs ~200 µs: an address that keeps failing it is told to wait
                // instead of being allowed to spend the server's CPU on invented tokens.
                let peer = parts.extensions.get::<Peer>().map(|p| p.0.ip());
                if let Some(wait) = peer.and_then(|ip| endpoint.failures.wait(ip)) {
                    return challenge::too_many_failures(wait);
                }
                match verifier.verify(token).await {
                    Ok(principal) => principal,
                    Err(why) => {
                        if let Some(ip) = peer {
                            endpoint.failures.count(ip);
                        }
                        tracing::info!(reason = why.as_str(), "bearer token refused");
                        return challenge::unauthorized(metadata, hint, true);
                    }
                }
            }
        };
        if let Some(session) = parts.headers.get(SESSION_HEADER)
            && !endpoint.session_is_for(session, &principal.sub)
        {
            // Someone else's legacy session: rmcp is asked about one that does not exist, so
            // the answer is, byte for byte, the one an invented id gets.
            tracing::warn!(principal = %principal.sub, "a legacy session of another subject was used");
            parts
                .headers
                .insert(SESSION_HEADER, http::HeaderValue::from_static("none"));
        }
        if let (Some(scope), Some(tool)) = (&needed, &call.tool)
            && !principal.may(Some(scope))
        {
            endpoint
                .server
                .record_scope_refusal(&principal, tool, call.arguments.as_ref())
                .await;
            return challenge::insufficient_scope(metadata, scope);
        }
        parts.extensions.insert(principal);
    }
    let sub = parts.extensions.get::<Principal>().map(|p| p.sub.clone());
    let ended = (parts.method == Method::DELETE)
        .then(|| parts.headers.get(SESSION_HEADER).cloned())
        .flatten();
    let request = http::Request::from_parts(parts, Full::new(body));
    let response = endpoint.mcp.handle(request).await;
    if let (Some(sub), Some(session)) = (sub, response.headers().get(SESSION_HEADER))
        && let Ok(session) = session.to_str()
    {
        endpoint.remember_session(session, sub).await;
    }
    if let Some(ended) = ended
        && response.status().is_success()
        && let Ok(ended) = ended.to_str()
    {
        endpoint.forget_session(ended);
    }
    response.map(Body::new)
}

const SESSION_HEADER: &str = "mcp-session-id";

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("config", &self.config)
            .field("auth", &self.verifier.is_some())
            .finish_non_exhaustive()
    }
}

impl Endpoint {
    /// Whether a legacy session id may be used by `sub`: it was opened by `sub`, or it is not
    /// ours to judge (unknown ids get rmcp's 404).
    fn session_is_for(&self, session: &http::HeaderValue, sub: &str) -> bool {
        let sessions = crate::lock(&self.sessions);
        session
            .to_str()
            .ok()
            .and_then(|id| sessions.get(id))
            .is_none_or(|owner| owner == sub)
    }

    /// Records who opened `session`; past a thousand sessions, first forgets those rmcp no
    /// longer has (closed or expired), so the map is as big as the live sessions.
    async fn remember_session(&self, session: &str, sub: String) {
        let known: Vec<String> = {
            let mut sessions = crate::lock(&self.sessions);
            sessions.entry(session.to_owned()).or_insert(sub);
            if sessions.len() < 1024 || !sessions.len().is_power_of_two() {
                return;
            }
            sessions.keys().cloned().collect()
        };
        let live = self.session_manager.sessions.read().await;
        let ended: Vec<String> = known
            .into_iter()
            .filter(|id| !live.contains_key(id.as_str()))
            .collect();
        drop(live);
        let mut sessions = crate::lock(&self.sessions);
        for id in ended {
            sessions.remove(&id);
        }
    }

    fn forget_session(&self, session: &str) {
        let mut sessions = crate::lock(&self.sessions);
        sessions.remove(session);
    }
}

/// The method and tool a POST names, looked at before dispatch (rmcp parses it again and answers
/// malformed messages itself).
#[derive(Debug, Default)]
struct Called {
    tool: Option<String>,
    arguments: Option<serde_json::Map<String, Value>>,
}

impl Called {
    fn parse(body: &[u8]) -> Self {
        #[derive(serde::Deserialize)]
        struct Message {
            method: Option<String>,
            params: Option<Params>,
        }
        #[derive(serde::Deserialize)]
        struct Params {
            name: Option<String>,
            arguments: Option<serde_json::Map<String, Value>>,
        }
        let Ok(message) = serde_json::from_slice::<Message>(body) else {
            return Self::default();
        };
        match (message.method.as_deref(), message.params) {
            (Some("tools/call"), Some(params)) => Self {
                tool: params.name,
                arguments: params.arguments,
            },
            _ => Self::default(),
        }
    }
}

/// The token of an `Authorization: Bearer …` header (scheme case-insensitive, RFC 6750 §2.1).
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Reads a request body up to the configured cap and deadline.
async fn read_body(body: Body, config: &HttpConfig) -> Result<Bytes, Response> {
    let limited = Limited::new(body, config.max_body);
    match tokio::time::timeout(config.read_timeout, limited.collect()).await {
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(error)) if error.is::<http_body_util::LengthLimitError>() => {
            Err(challenge::rpc_error(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("request body larger than {} bytes", config.max_body),
            ))
        }
        Ok(Err(_)) => Err(challenge::rpc_error(
            StatusCode::BAD_REQUEST,
            "request body could not be read".to_owned(),
        )),
        Err(_) => Err(challenge::rpc_error(
            StatusCode::REQUEST_TIMEOUT,
            "request body not received in time".to_owned(),
        )),
    }
}

impl Endpoint {
    /// Headers within bounds; DNS-rebinding defence: the `Host` must be one of ours, and a present
    /// `Origin` must be allowed.
    fn front_door_refusal(&self, headers: &HeaderMap) -> Option<Response> {
        // hyper bounds its read buffer, but headers that arrive in one read can pass it; the sum of
        // names and values is what a client could make us hold and scan.
        let size: usize = headers
            .iter()
            .map(|(name, value)| name.as_str().len() + value.len())
            .sum();
        if size > MAX_HEADER_BYTES {
            return Some(challenge::rpc_error(
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                format!("request headers larger than {MAX_HEADER_BYTES} bytes"),
            ));
        }
        let host = headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or_default()
            .to_ascii_lowercase();
        if !host_allowed(&host, &self.config.allowed_hosts) {
            tracing::warn!(host = %host, "request with a Host that is not ours refused (DNS rebinding?)");
            return Some(challenge::rpc_error(
                StatusCode::FORBIDDEN,
                "host not allowed".to_owned(),
            ));
        }
        if let Some(origin) = headers.get(header::ORIGIN) {
            let origin = origin.to_str().unwrap_or_default();
            if !origin_allowed(origin, &self.origins) {
                tracing::warn!(origin = %origin, "request from an Origin that is not allowed refused");
                return Some(challenge::rpc_error(
                    StatusCode::FORBIDDEN,
                    "origin not allowed".to_owned(),
                ));
            }
        }
        None
    }
}

/// `host` (`name` or `name:port`, lower-case) against entries that are a name (any port) or a
/// `name:port`.
fn host_allowed(host: &str, allowed: &[String]) -> bool {
    if host.is_empty() {
        return false;
    }
    let name = match host.rsplit_once(':') {
        // `[::1]:8080` or `name:8080`; a bare `::1` has no brackets and several colons.
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) && !name.ends_with(':') => {
            name
        }
        _ => host,
    };
    allowed
        .iter()
        .any(|a| a.eq_ignore_ascii_case(host) || a.eq_ignore_ascii_case(name))
}

/// An Origin against the allow-list (already [`normal_origin`]s), compared as (scheme, host,
/// port) with default ports filled in.
fn origin_allowed(origin: &str, allowed: &[String]) -> bool {
    normal_origin(origin).is_some_and(|origin| allowed.contains(&origin))
}

fn normal_origin(origin: &str) -> Option<String> {
    let url = url::Url::parse(origin).ok()?;
    let host = url.host_str()?;
    let port = url.port_or_known_default()?;
    Some(format!("{}://{}:{}", url.scheme(), host, port))
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
