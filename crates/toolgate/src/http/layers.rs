//! The front door of the MCP endpoint: one check per function, run in this order by
//! [`front_door`], the one layer [`super::router`] puts in front of the endpoint:
//!
//! 1. [`header_cap`]: headers larger than [`MAX_HEADER_BYTES`] → 431.
//! 2. [`host_and_origin`]: exactly one `Host`, and one of ours (DNS rebinding); at most one
//!    `Origin`, and an allowed one → 400 / 403.
//! 3. [`no_token_in_query`]: OAuth 2.1 §5.1.1, a token never travels in the URL → 400.
//! 4. [`body_cap`]: the body read within a size cap and a deadline → 413 / 408 / 400.
//! 5. [`json_rpc`]: one JSON-RPC message with a single reading (`message.rs`) → 415 / 400; the
//!    tool a `tools/call` names goes on as [`Called`].
//! 6. [`bearer`] (with authentication): the token (`auth.rs`) → 401 / 429 / 400; the verified
//!    [`Principal`] goes on.
//! 7. [`scope`] (with authentication): the scope the called tool needs → 403 `insufficient_scope`,
//!    audited.
//!
//! The probes, the metadata documents and the console get the first two only ([`headers`]).
//!
//! Each check takes the request and either answers what it refuses or hands the request on
//! unchanged but for what it adds to the extensions, so each can be read, and tested, on its
//! own. They run in one layer rather than one layer each: every `from_fn` layer clones the
//! service under it and boxes a future for every request, and the body was put back into a
//! `Body` by one layer to be read out of it again by the next (docs/performance.md, "The front
//! door in one layer"). Why this order: the header checks cost nothing but the headers already
//! read; the body is bounded before anything parses it; the message is read before the token so
//! that a 401 can name the scope the call needs, and a body nobody could read costs no signature
//! check; the scope needs both the message and the principal.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use http::request::Parts;
use http::{HeaderMap, Method, StatusCode, header};
use http_body_util::{BodyExt, Limited};
use toolgate_core::principal::Principal;

use super::auth::Verifier;
use super::challenge::{self, Metadata};
use super::message::{self, Called, INVALID_REQUEST};
use super::{HttpConfig, MAX_HEADER_BYTES, Peer};
use crate::GateServer;

/// Failed token checks an address may cause per window before it is told to wait.
pub(super) const FAILURES_ALLOWED: u32 = 32;
const FAILURE_WINDOW: Duration = Duration::from_secs(10);

/// What a check gives back: the request to hand on (or what it was made into), or the answer
/// to a request it refused (boxed: refusals are rare, and every check's result would otherwise
/// carry a whole `Response`).
pub(crate) type Checked<T = Request> = Result<T, Box<Response>>;

/// What the front door checks requests against.
#[derive(Debug)]
pub(super) struct Front {
    pub(super) door: Arc<Door>,
    pub(super) caps: Caps,
    /// `None`: no authentication (the CLI allows that on loopback only).
    pub(super) auth: Option<Arc<Auth>>,
}

/// The front door as one layer: every check, in the order above, then the endpoint.
pub(super) async fn front_door(
    State(front): State<Arc<Front>>,
    request: Request,
    next: Next,
) -> Response {
    match front.admit(request).await {
        Ok(request) => next.run(request).await,
        Err(refused) => *refused,
    }
}

impl Front {
    async fn admit(&self, request: Request) -> Checked {
        let request = host_and_origin(&self.door, header_cap(request)?)?;
        let (parts, body) = body_cap(self.caps, no_token_in_query(request)?).await?;
        let request = json_rpc(parts, body)?;
        match &self.auth {
            Some(auth) => scope(auth, bearer(auth, request).await?).await,
            None => Ok(request),
        }
    }
}

/// The header checks alone (1 and 2) as a layer, for what carries no message: the probes, the
/// metadata documents, the console.
pub(crate) async fn headers(
    State(door): State<Arc<Door>>,
    request: Request,
    next: Next,
) -> Response {
    match header_cap(request).and_then(|request| host_and_origin(&door, request)) {
        Ok(request) => next.run(request).await,
        Err(refused) => *refused,
    }
}

// ---------------------------------------------------------------------------------------------
// 1. Header size

/// 431 for headers beyond [`MAX_HEADER_BYTES`].
///
/// hyper bounds its read buffer, but headers that arrive in one read can pass it; the sum of
/// names and values is what a client could make us hold and scan.
pub(crate) fn header_cap(request: Request) -> Checked {
    let size: usize = request
        .headers()
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len())
        .sum();
    if size > MAX_HEADER_BYTES {
        return Err(Box::new(challenge::rpc_error(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            INVALID_REQUEST,
            format!("request headers larger than {MAX_HEADER_BYTES} bytes"),
        )));
    }
    Ok(request)
}

// ---------------------------------------------------------------------------------------------
// 2. Host and Origin

/// The `Host` and `Origin` values a request may carry.
#[derive(Debug)]
pub(crate) struct Door {
    /// A name (any port) or `name:port`, as configured.
    hosts: Vec<String>,
    /// Allowed origins as [`normal_origin`]s, compared with each request's.
    origins: Vec<String>,
}

impl Door {
    pub(crate) fn new(config: &HttpConfig) -> Self {
        Self {
            hosts: config.allowed_hosts.clone(),
            origins: config
                .allowed_origins
                .iter()
                .filter_map(|o| normal_origin(o))
                .collect(),
        }
    }
}

/// DNS-rebinding defence: the `Host` must be one of ours, and a present `Origin` must be allowed.
///
/// A second `Host` or `Origin` is 400 before either is looked at (RFC 9112 §3.2 for `Host`): a
/// check that reads the first and a reader further in that reads the last would otherwise judge
/// two different requests.
pub(crate) fn host_and_origin(door: &Door, request: Request) -> Checked {
    let headers = request.headers();
    for (name, what) in [(header::HOST, "Host"), (header::ORIGIN, "Origin")] {
        if headers.get_all(&name).iter().nth(1).is_some() {
            tracing::warn!(header = what, "request with the header twice refused");
            return Err(Box::new(challenge::rpc_error(
                StatusCode::BAD_REQUEST,
                INVALID_REQUEST,
                format!("more than one {what} header"),
            )));
        }
    }
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or_default()
        .to_ascii_lowercase();
    if !host_allowed(&host, &door.hosts) {
        tracing::warn!(host = %host, "request with a Host that is not ours refused (DNS rebinding?)");
        return Err(Box::new(challenge::rpc_error(
            StatusCode::FORBIDDEN,
            INVALID_REQUEST,
            "host not allowed".to_owned(),
        )));
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or_default();
        if !origin_allowed(origin, &door.origins) {
            tracing::warn!(origin = %origin, "request from an Origin that is not allowed refused");
            return Err(Box::new(challenge::rpc_error(
                StatusCode::FORBIDDEN,
                INVALID_REQUEST,
                "origin not allowed".to_owned(),
            )));
        }
    }
    Ok(request)
}

/// `host` (`name` or `name:port`, lower-case) against entries that are a name (any port) or a
/// `name:port`.
pub(super) fn host_allowed(host: &str, allowed: &[String]) -> bool {
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
pub(crate) fn origin_allowed(origin: &str, allowed: &[String]) -> bool {
    normal_origin(origin).is_some_and(|origin| allowed.contains(&origin))
}

pub(crate) fn normal_origin(origin: &str) -> Option<String> {
    let url = url::Url::parse(origin).ok()?;
    let host = url.host_str()?;
    let port = url.port_or_known_default()?;
    Some(format!("{}://{}:{}", url.scheme(), host, port))
}

// ---------------------------------------------------------------------------------------------
// 3. No token in the query string

/// 400 for an `access_token` in the query string (OAuth 2.1 §5.1.1: it ends up in logs and
/// histories), even beside a good header: the URL has leaked it already.
pub(super) fn no_token_in_query(request: Request) -> Checked {
    if request.uri().query().is_some_and(|query| {
        url::form_urlencoded::parse(query.as_bytes()).any(|(name, _)| name == "access_token")
    }) {
        return Err(Box::new(challenge::invalid_request(
            "send the token in the Authorization header",
        )));
    }
    Ok(request)
}

// ---------------------------------------------------------------------------------------------
// 4. The body, within its caps

/// How much of a body is read, and for how long.
#[derive(Debug, Clone, Copy)]
pub(super) struct Caps {
    pub(super) max_body: usize,
    pub(super) read_timeout: Duration,
}

/// Reads a POST's body up to `max_body` bytes within `read_timeout` (413 / 400 / 408), and hands
/// on the request's head with the bytes read; any other method's body is dropped unread (only a
/// POST carries a message).
///
/// The body is read here, not streamed to rmcp, because the scope a call needs depends on the
/// tool it names and the 403 must be an HTTP answer, so the message has to be looked at before
/// it is dispatched. The cap makes that cheap to bound.
pub(super) async fn body_cap(caps: Caps, request: Request) -> Checked<(Parts, Bytes)> {
    let (parts, body) = request.into_parts();
    if parts.method != Method::POST {
        return Ok((parts, Bytes::new()));
    }
    Ok((parts, read_capped(body, caps).await?))
}

async fn read_capped(body: Body, caps: Caps) -> Checked<Bytes> {
    let limited = Limited::new(body, caps.max_body);
    match tokio::time::timeout(caps.read_timeout, limited.collect()).await {
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(error)) if error.is::<http_body_util::LengthLimitError>() => {
            Err(Box::new(challenge::rpc_error(
                StatusCode::PAYLOAD_TOO_LARGE,
                INVALID_REQUEST,
                format!("request body larger than {} bytes", caps.max_body),
            )))
        }
        Ok(Err(_)) => Err(Box::new(challenge::rpc_error(
            StatusCode::BAD_REQUEST,
            INVALID_REQUEST,
            "request body could not be read".to_owned(),
        ))),
        Err(_) => Err(Box::new(challenge::rpc_error(
            StatusCode::REQUEST_TIMEOUT,
            INVALID_REQUEST,
            "request body not received in time".to_owned(),
        ))),
    }
}

// ---------------------------------------------------------------------------------------------
// 5. One JSON-RPC message

/// A POST must carry one JSON-RPC message with a single reading: 415 for another `Content-Type`,
/// 400 with a JSON-RPC error (-32700 / -32600 / -32602, id null) for a body that is not one.
/// What a `tools/call` names goes on as [`Called`].
///
/// Takes the head and the body [`body_cap`] read, and puts the request back together for what
/// follows. The `Content-Type` is checked here, with rmcp's rule, rather than left to rmcp: a
/// body this check did not read must never be dispatched.
pub(super) fn json_rpc(mut parts: Parts, body: Bytes) -> Checked {
    if parts.method != Method::POST {
        return Ok(Request::from_parts(parts, Body::from(body)));
    }
    if !json_content(&parts.headers) {
        return Err(Box::new(challenge::rpc_error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            INVALID_REQUEST,
            "Content-Type must be application/json".to_owned(),
        )));
    }
    match message::read(&body) {
        Ok(called) => {
            parts.extensions.insert(called);
            Ok(Request::from_parts(parts, Body::from(body)))
        }
        Err(error) => {
            tracing::info!(error = %error, "a body that is no JSON-RPC message refused");
            Err(Box::new(challenge::rpc_error(
                StatusCode::BAD_REQUEST,
                error.code(),
                error.to_string(),
            )))
        }
    }
}

/// `application/json`, parameters aside (rmcp's own test).
fn json_content(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| {
            let essence = value.split_once(';').map_or(value, |(essence, _)| essence);
            essence.trim().eq_ignore_ascii_case("application/json")
        })
}

// ---------------------------------------------------------------------------------------------
// 6 and 7. Token and scope

/// What the token and scope checks share.
pub(super) struct Auth {
    verifier: Arc<Verifier>,
    pub(super) metadata: Arc<Metadata>,
    /// Which scope a tool needs, and where a scope refusal is audited.
    server: GateServer,
    /// Every scope of the policy, space-separated: the 401 hint when no one tool is called.
    all_scopes: String,
    failures: Failures,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth")
            .field("metadata", &self.metadata)
            .field("all_scopes", &self.all_scopes)
            .finish_non_exhaustive()
    }
}

impl Auth {
    pub(super) fn new(verifier: Arc<Verifier>, server: GateServer) -> Self {
        let scopes = server.scopes();
        Self {
            metadata: Arc::new(Metadata::new(verifier.config(), &scopes)),
            verifier,
            server,
            all_scopes: scopes.join(" "),
            failures: Failures::default(),
        }
    }

    /// The scope the called tool needs, if a tool is called and it needs one.
    fn needed(&self, request: &Request) -> Option<String> {
        let tool = request.extensions().get::<Called>()?.tool.as_deref()?;
        self.server.required_scope(tool)
    }
}

/// The bearer token (RFC 6750 §2.1): 401 with a challenge naming the metadata and the scope to
/// ask for when there is none or it is not acceptable (`auth.rs`; every bad token reads the
/// same), 429 for an address that failed too many checks, 400 for two `Authorization` headers.
/// The verified [`Principal`] goes on in the extensions; the gate reads it from there, so
/// approvals, budgets, rate limits and audit records are about the token's subject.
pub(super) async fn bearer(auth: &Auth, mut request: Request) -> Checked {
    let needed = auth.needed(&request);
    let hint = needed.as_deref().unwrap_or(&auth.all_scopes);
    let headers = request.headers();
    if headers
        .get_all(header::AUTHORIZATION)
        .iter()
        .nth(1)
        .is_some()
    {
        return Err(Box::new(challenge::invalid_request(
            "send one Authorization header",
        )));
    }
    let Some(token) = bearer_token(headers) else {
        tracing::info!(method = %request.method(), "request without a bearer token refused");
        return Err(Box::new(challenge::unauthorized(
            &auth.metadata,
            hint,
            false,
        )));
    };
    let principal = match auth.verifier.recently_verified(token) {
        Some(principal) => principal,
        None => {
            // A full check costs ~200 µs: an address that keeps failing it is told to wait
            // instead of being allowed to spend the server's CPU on invented tokens.
            let peer = request.extensions().get::<Peer>().map(|p| p.0.ip());
            if let Some(wait) = peer.and_then(|ip| auth.failures.wait(ip)) {
                return Err(Box::new(challenge::too_many_failures(wait)));
            }
            match auth.verifier.verify(token).await {
                Ok(principal) => principal,
                Err(why) => {
                    if let Some(ip) = peer {
                        auth.failures.count(ip);
                    }
                    tracing::info!(reason = why.as_str(), "bearer token refused");
                    return Err(Box::new(challenge::unauthorized(
                        &auth.metadata,
                        hint,
                        true,
                    )));
                }
            }
        }
    };
    request.extensions_mut().insert(principal);
    Ok(request)
}

/// The token of an `Authorization: Bearer …` header (scheme case-insensitive, RFC 6750 §2.1).
fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// 403 `insufficient_scope` (step-up, naming only the scope this call needs) when the called
/// tool needs a scope the principal lacks; the refusal is audited like any other denial. A tool
/// hidden from everyone needs no scope here: it gets what an unknown tool gets, from the gate.
pub(super) async fn scope(auth: &Auth, request: Request) -> Checked {
    let Some(needed) = auth.needed(&request) else {
        return Ok(request);
    };
    let Some(principal) = request.extensions().get::<Principal>() else {
        // Only reachable if the token check did not run before this one: refuse, never skip.
        return Err(Box::new(challenge::unauthorized(
            &auth.metadata,
            &needed,
            false,
        )));
    };
    if !principal.may(Some(&needed)) {
        let called = request.extensions().get::<Called>();
        let tool = called.and_then(|c| c.tool.as_deref()).unwrap_or_default();
        auth.server
            .record_scope_refusal(principal, tool, called.and_then(|c| c.arguments.as_ref()))
            .await;
        return Err(Box::new(challenge::insufficient_scope(
            &auth.metadata,
            &needed,
        )));
    }
    Ok(request)
}

/// Failed token checks per client address, in fixed windows.
#[derive(Debug, Default)]
struct Failures {
    windows: Mutex<HashMap<IpAddr, (u32, Instant)>>,
}

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
