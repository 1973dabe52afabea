//! What an HTTP client is told when it may not in: the RFC 9728 protected resource metadata and
//! the RFC 6750 `WWW-Authenticate` challenges (401 without a usable token, 403 for a missing
//! scope), worded so that a refused caller learns which scope to ask for and nothing about which
//! check its token failed.

use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode, header};
use serde_json::json;

use super::auth::AuthConfig;

/// The metadata document and where it lives.
#[derive(Debug)]
pub(super) struct Metadata {
    /// `/.well-known/oauth-protected-resource`.
    pub(super) root_path: String,
    /// The same with the endpoint's path inserted, e.g. `/.well-known/oauth-protected-resource/mcp`.
    pub(super) inserted_path: String,
    /// Absolute URL of the path-inserted document, named in every challenge.
    pub(super) url: String,
    pub(super) document: String,
}

const WELL_KNOWN: &str = "/.well-known/oauth-protected-resource";

impl Metadata {
    pub(super) fn new(config: &AuthConfig, scopes: &[String]) -> Self {
        let url = url::Url::parse(&config.resource).expect("the resource URI is checked at start");
        let path = url.path().trim_end_matches('/');
        let inserted_path = format!("{WELL_KNOWN}{path}");
        let origin = url.origin().ascii_serialization();
        let servers = if config.authorization_servers.is_empty() {
            vec![config.issuer.clone()]
        } else {
            config.authorization_servers.clone()
        };
        let document = json!({
            "resource": config.resource,
            "authorization_servers": servers,
            "scopes_supported": scopes,
            "bearer_methods_supported": ["header"],
            "resource_name": "toolgate",
        })
        .to_string();
        Self {
            root_path: WELL_KNOWN.to_owned(),
            url: format!("{origin}{inserted_path}"),
            inserted_path,
            document,
        }
    }
}

/// 401: no token (`invalid` false: no error code, RFC 6750 §3.1) or one that is not acceptable
/// (`invalid_token`, whatever the reason).
pub(super) fn unauthorized(metadata: &Metadata, scope: &str, invalid: bool) -> Response {
    let mut challenge = String::from("Bearer ");
    if invalid {
        challenge.push_str("error=\"invalid_token\", ");
    }
    challenge.push_str(&format!("resource_metadata=\"{}\"", metadata.url));
    if !scope.is_empty() {
        challenge.push_str(&format!(", scope=\"{scope}\""));
    }
    let body = if invalid {
        json!({"error": "invalid_token"})
    } else {
        json!({"error": "unauthorized"})
    };
    with_challenge(StatusCode::UNAUTHORIZED, &challenge, body)
}

/// 403 step-up: the token is good, the operation needs `scope` too (only what this operation
/// needs; the client adds it to what it has).
pub(super) fn insufficient_scope(metadata: &Metadata, scope: &str) -> Response {
    let challenge = format!(
        "Bearer error=\"insufficient_scope\", scope=\"{scope}\", resource_metadata=\"{}\", error_description=\"this operation needs scope {scope}\"",
        metadata.url
    );
    with_challenge(
        StatusCode::FORBIDDEN,
        &challenge,
        json!({"error": "insufficient_scope", "scope": scope}),
    )
}

/// 429: this address failed too many token checks; tokens it sends are not checked for `wait`.
pub(super) fn too_many_failures(wait: std::time::Duration) -> Response {
    let seconds = crate::seconds_up(wait);
    (
        StatusCode::TOO_MANY_REQUESTS,
        [
            (header::CONTENT_TYPE, "application/json".to_owned()),
            (header::RETRY_AFTER, seconds.to_string()),
        ],
        json!({"error": "too_many_failed_token_checks"}).to_string(),
    )
        .into_response()
}

/// 400 `invalid_request` (RFC 6750 §3.1): the token is sent in a way that is refused whatever it
/// holds (in the query string, or in two `Authorization` headers).
pub(super) fn invalid_request(description: &str) -> Response {
    with_challenge(
        StatusCode::BAD_REQUEST,
        &format!("Bearer error=\"invalid_request\", error_description=\"{description}\""),
        json!({"error": "invalid_request"}),
    )
}

/// A JSON-RPC error without an id (JSON-RPC 2.0 §5: the request's id is not known, or not
/// trusted, when the front door refuses it) with the HTTP `status` that says the same.
pub(super) fn rpc_error(status: StatusCode, code: i64, message: String) -> Response {
    let body = json!({"jsonrpc": "2.0", "id": null, "error": {"code": code, "message": message}});
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn with_challenge(status: StatusCode, challenge: &str, body: serde_json::Value) -> Response {
    let mut response = (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response();
    if let Ok(value) = HeaderValue::from_str(challenge) {
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, value);
    }
    response
}
