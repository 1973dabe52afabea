//! The HTTP front door through `tower::ServiceExt::oneshot`: each check on its own in front of a
//! handler that only says it was reached ([`behind`]), then the whole router, its order of
//! checks and what the refused requests are told. Real tokens, signed with a key made here; a
//! notes toolset of the seed's shape behind the gate (`Notes`, below: the built-in ledger lives
//! in the demos crate, which a unit test of this crate cannot serve). The process-level table (a
//! real socket, the helpdesk and docs toolsets) is in the CLI's integration tests.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::middleware::{Next, from_fn};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use http::{Request, StatusCode, header};
use http_body_util::BodyExt;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use toolgate_core::policy::Policy;
use toolgate_core::principal::Principal;
use toolgate_store::journal::Journal;
use tower::ServiceExt;

use super::auth::{AuthConfig, KeySource, Verifier};
use super::layers::{self, Auth, Caps, Door, host_allowed, normal_origin, origin_allowed};
use super::message::Called;
use super::{HttpConfig, ResourceError, canonical_resource, router};
use crate::GateServer;
use crate::corridor::answer;
use crate::server::Gate;
use crate::server::SESSION_HEADER;
use crate::toolset::{Call, CallFuture, Catalog, Toolset};
use toolgate_core::json::{self as strict, JsonError, MAX_DEPTH};

const ISSUER: &str = "https://auth.example.test/";
const RESOURCE: &str = "http://127.0.0.1:7777/mcp";
const POLICY: &str = r#"
version = 2
[defaults]
tier = "low"
[tools.write_note]
scope = "notes:write"
[tools.read_ledger]
scope = "notes:read"
[tools.rm_rf]
tier = "blocked"
scope = "admin"
[tools.wait]
scope = "notes:write"
"#;

/// The seed's three tools: `write_note` answers that it committed, `read_ledger` that there is
/// nothing yet, `rm_rf` is registered for the gate to hide; and `wait`, which takes `ms`
/// milliseconds unless the call is cancelled first. The front door is what is tested.
#[derive(Debug)]
struct Notes {
    catalog: Arc<Catalog>,
}

impl Notes {
    fn new() -> Self {
        let tool = |name: &'static str, schema: Value| {
            let Value::Object(schema) = schema else {
                unreachable!("an object schema")
            };
            rmcp::model::Tool::new(name, name, Arc::new(schema))
        };
        let catalog = Catalog::new(vec![
            tool(
                "write_note",
                json!({"type": "object", "properties": {"request_id": {"type": "string"}, "text": {"type": "string"}}, "required": ["request_id", "text"]}),
            ),
            tool("read_ledger", json!({"type": "object", "properties": {}})),
            tool(
                "rm_rf",
                json!({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}),
            ),
            tool(
                "wait",
                json!({"type": "object", "properties": {"ms": {"type": "integer"}}, "required": ["ms"]}),
            ),
        ]);
        Self {
            catalog: Arc::new(catalog),
        }
    }
}

impl Toolset for Notes {
    fn catalog(&self) -> Arc<Catalog> {
        Arc::clone(&self.catalog)
    }

    fn call<'a>(&'a self, call: Call<'a>) -> CallFuture<'a> {
        if call.name == "wait" {
            let ms = call.arguments["ms"].as_u64().unwrap_or_default();
            return Box::pin(async move {
                let waited = tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(ms)) => true,
                    () = call.ct.cancelled() => false,
                };
                Ok(answer::success(json!({"waited": waited})))
            });
        }
        let answer = match call.name {
            "write_note" => {
                json!({"status": "committed", "request_id": call.arguments["request_id"]})
            }
            _ => json!({"notes": []}),
        };
        Box::pin(std::future::ready(Ok(answer::success(answer))))
    }
}

/// An ES256 key pair: the signing key and the JWKS that holds its public half.
struct Keys {
    signing: EncodingKey,
    jwks: Value,
}

fn keys() -> Keys {
    let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
    let public = pair.public_key_raw(); // 0x04 || x || y
    let (x, y) = public[1..].split_at(32);
    let jwks = json!({"keys": [{
        "kty": "EC", "crv": "P-256", "kid": "k1", "alg": "ES256", "use": "sig",
        "x": URL_SAFE_NO_PAD.encode(x), "y": URL_SAFE_NO_PAD.encode(y),
    }]});
    Keys {
        signing: EncodingKey::from_ec_der(&pair.serialize_der()),
        jwks,
    }
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs()
}

fn token(keys: &Keys, claims: &Value) -> String {
    let mut header = Header::new(Algorithm::ES256);
    header.kid = Some("k1".to_owned());
    jsonwebtoken::encode(&header, claims, &keys.signing).expect("sign")
}

fn claims(scope: &str) -> Value {
    json!({"iss": ISSUER, "aud": RESOURCE, "sub": "user-alice", "scope": scope,
           "client_id": "test-client", "iat": now(), "exp": now() + 300})
}

/// What the router is made of: the ledger behind a gate writing to `data`, and a verifier
/// trusting `keys`.
struct Parts {
    server: GateServer,
    verifier: Arc<Verifier>,
    keys: Keys,
    data: tempfile::TempDir,
}

async fn parts() -> Parts {
    let keys = keys();
    let data = tempfile::tempdir().expect("temp dir");
    let jwks = data.path().join("jwks.json");
    std::fs::write(&jwks, keys.jwks.to_string()).expect("jwks");
    let policy = Policy::from_bytes(POLICY.as_bytes()).expect("policy");
    let (journal, _) = Journal::open(data.path()).expect("journal");
    let server = GateServer::new(Gate::new(policy, journal), Arc::new(Notes::new()));
    let verifier = Verifier::new(AuthConfig {
        issuer: ISSUER.to_owned(),
        resource: RESOURCE.to_owned(),
        algorithms: vec![Algorithm::ES256],
        keys: KeySource::File(jwks),
        authorization_servers: Vec::new(),
    })
    .await
    .expect("verifier");
    Parts {
        server,
        verifier: Arc::new(verifier),
        keys,
        data,
    }
}

struct App {
    app: axum::Router,
    keys: Keys,
    data: tempfile::TempDir,
}

async fn app() -> App {
    let Parts {
        server,
        verifier,
        keys,
        data,
    } = parts().await;
    let config = HttpConfig::new(RESOURCE).expect("config");
    let app = router(server, config, Some(verifier), CancellationToken::new());
    App { app, keys, data }
}

fn call(tool: &str, arguments: &Value) -> Request<Body> {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": tool, "arguments": arguments, "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "0"},
            "io.modelcontextprotocol/clientCapabilities": {}}}});
    Request::post("/mcp")
        .header(header::HOST, "127.0.0.1:7777")
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::ACCEPT, "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", tool)
        .body(Body::from(body.to_string()))
        .expect("request")
}

fn with_token(mut request: Request<Body>, token: &str) -> Request<Body> {
    let value = format!("Bearer {token}").parse().expect("header");
    request.headers_mut().insert(header::AUTHORIZATION, value);
    request
}

async fn send(app: &axum::Router, request: Request<Body>) -> (StatusCode, String, String) {
    answered_with(app, request, header::WWW_AUTHENTICATE).await
}

/// The answer's status, the value of its header `named` (empty without one) and its body.
async fn answered_with(
    app: &axum::Router,
    request: Request<Body>,
    named: header::HeaderName,
) -> (StatusCode, String, String) {
    let response = app.clone().oneshot(request).await.expect("response");
    let status = response.status();
    let value = response
        .headers()
        .get(named)
        .map(|v| v.to_str().expect("ascii").to_owned())
        .unwrap_or_default();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    (status, value, String::from_utf8_lossy(&body).into_owned())
}

fn audit(data: &tempfile::TempDir) -> Vec<Value> {
    std::fs::read_to_string(data.path().join("audit.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("record"))
        .collect()
}

#[tokio::test]
async fn no_token_gets_a_challenge_naming_the_metadata_and_the_scope_to_ask_for() {
    let App { app, .. } = app().await;
    let (status, challenge, _) = send(&app, call("write_note", &json!({}))).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        challenge,
        "Bearer resource_metadata=\"http://127.0.0.1:7777/.well-known/oauth-protected-resource/mcp\", scope=\"notes:write\""
    );
}

#[tokio::test]
async fn every_bad_token_reads_the_same() {
    let App { app, keys, .. } = app().await;
    let mut wrong_aud = claims("notes:write");
    wrong_aud["aud"] = json!("https://other.example.test/mcp");
    let mut expired = claims("notes:write");
    expired["exp"] = json!(now() - 120);
    let mut no_sub = claims("notes:write");
    no_sub.as_object_mut().expect("object").remove("sub");
    let mut wrong_iss = claims("notes:write");
    wrong_iss["iss"] = json!("https://evil.example.test/");
    let unsigned = format!(
        "{}.{}.",
        URL_SAFE_NO_PAD.encode(r#"{"alg":"none","typ":"JWT"}"#),
        URL_SAFE_NO_PAD.encode(claims("notes:write").to_string())
    );
    let tokens = [
        token(&keys, &wrong_aud),
        token(&keys, &expired),
        token(&keys, &no_sub),
        token(&keys, &wrong_iss),
        unsigned,
        "not-a-jwt".to_owned(),
    ];
    let mut answers = Vec::new();
    for bad in &tokens {
        let (status, challenge, body) =
            send(&app, with_token(call("write_note", &json!({})), bad)).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{bad}");
        assert!(
            challenge.starts_with("Bearer error=\"invalid_token\""),
            "{challenge}"
        );
        answers.push((challenge, body));
    }
    answers.dedup();
    assert_eq!(answers.len(), 1, "the answers differ: {answers:?}");
}

#[tokio::test]
async fn a_token_without_the_tools_scope_gets_403_naming_only_that_scope_and_is_audited() {
    let App { app, keys, data } = app().await;
    let read_only = token(&keys, &claims("notes:read"));
    let arguments = json!({"request_id": "req-00001", "text": "hi"});
    let (status, challenge, _) =
        send(&app, with_token(call("write_note", &arguments), &read_only)).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(
        challenge.starts_with("Bearer error=\"insufficient_scope\", scope=\"notes:write\","),
        "{challenge}"
    );
    let records = audit(&data);
    let last = records.last().expect("a record");
    assert_eq!(
        (
            &last["name"],
            &last["outcome"],
            &last["rule"],
            &last["principal"],
            &last["client_id"]
        ),
        (
            &json!("write_note"),
            &json!("not_executed"),
            &json!("scope"),
            &json!("user-alice"),
            &json!("test-client")
        )
    );
    // With the scope the same call runs, and the record names the token's subject.
    let writer = token(&keys, &claims("notes:read notes:write"));
    let (status, _, body) = send(&app, with_token(call("write_note", &arguments), &writer)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body.contains("committed"), "{body}");
    let records = audit(&data);
    let last = records.last().expect("a record");
    assert_eq!(
        (&last["outcome"], &last["principal"]),
        (&json!("committed"), &json!("user-alice"))
    );
}

#[tokio::test]
async fn a_hidden_tool_gets_no_scope_challenge_that_would_reveal_it() {
    let App { app, keys, .. } = app().await;
    let read_only = token(&keys, &claims("notes:read"));
    let (status, _, body) = send(
        &app,
        with_token(call("rm_rf", &json!({"path": "/"})), &read_only),
    )
    .await;
    // rm_rf needs scope "admin" but is blocked: the caller learns what an unknown tool teaches.
    assert_eq!(status, StatusCode::OK);
    assert!(
        body.contains("-32602") && body.contains("visibility"),
        "{body}"
    );
}

#[tokio::test]
async fn tools_list_shows_only_what_the_token_may_call_privately() {
    let App { app, keys, .. } = app().await;
    let read_only = token(&keys, &claims("notes:read"));
    let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {"_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "0"},
        "io.modelcontextprotocol/clientCapabilities": {}}}});
    let request = Request::post("/mcp")
        .header(header::HOST, "127.0.0.1:7777")
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::ACCEPT, "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/list")
        .body(Body::from(list.to_string()))
        .expect("request");
    let (status, _, body) = send(&app, with_token(request, &read_only)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let answer: Value = serde_json::from_str(&body).expect("json");
    let names: Vec<&str> = answer["result"]["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .map(|t| t["name"].as_str().expect("name"))
        .collect();
    assert_eq!(names, ["read_ledger"]);
    assert_eq!(answer["result"]["cacheScope"], "private");
}

#[tokio::test]
async fn metadata_is_served_at_the_path_inserted_and_root_well_known_uris() {
    let App { app, .. } = app().await;
    for path in [
        "/.well-known/oauth-protected-resource/mcp",
        "/.well-known/oauth-protected-resource",
    ] {
        let request = Request::get(path)
            .header(header::HOST, "127.0.0.1:7777")
            .body(Body::empty())
            .expect("request");
        let (status, _, body) = send(&app, request).await;
        assert_eq!(status, StatusCode::OK, "{path}");
        let document: Value = serde_json::from_str(&body).expect("json");
        assert_eq!(
            document,
            json!({"resource": RESOURCE, "authorization_servers": [ISSUER],
                   "scopes_supported": ["admin", "notes:read", "notes:write"],
                   "bearer_methods_supported": ["header"], "resource_name": "toolgate"})
        );
    }
}

#[tokio::test]
async fn foreign_hosts_and_origins_and_oversized_bodies_are_refused_before_the_token_is_read() {
    let App { app, data, .. } = app().await;
    let mut rebinding = call("write_note", &json!({}));
    rebinding
        .headers_mut()
        .insert(header::HOST, "evil.test".parse().expect("host"));
    assert_eq!(send(&app, rebinding).await.0, StatusCode::FORBIDDEN);
    let mut browser = call("write_note", &json!({}));
    browser
        .headers_mut()
        .insert(header::ORIGIN, "https://evil.test".parse().expect("origin"));
    assert_eq!(send(&app, browser).await.0, StatusCode::FORBIDDEN);
    let huge = json!({"request_id": "req-00002", "text": "x".repeat(200 * 1024)});
    assert_eq!(
        send(&app, call("write_note", &huge)).await.0,
        StatusCode::PAYLOAD_TOO_LARGE
    );
    let mut query = call("write_note", &json!({}));
    *query.uri_mut() = "/mcp?access_token=abc".parse().expect("uri");
    assert_eq!(send(&app, query).await.0, StatusCode::BAD_REQUEST);
    assert!(
        audit(&data).is_empty(),
        "nothing was decided, nothing recorded"
    );
}

#[test]
fn hosts_and_origins_match_as_the_spec_compares_them() {
    let allowed: Vec<String> = ["localhost", "127.0.0.1", "[::1]", "mcp.example.com:8443"]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    for host in [
        "localhost",
        "localhost:7777",
        "127.0.0.1:1",
        "[::1]:80",
        "mcp.example.com:8443",
    ] {
        assert!(host_allowed(host, &allowed), "{host}");
    }
    for host in [
        "",
        "evil.test",
        "localhost.evil.test",
        "mcp.example.com",
        "mcp.example.com:443",
    ] {
        assert!(!host_allowed(host, &allowed), "{host}");
    }
    // As the router keeps them: normalised once.
    let origins: Vec<String> = ["https://app.example.com", "http://localhost:5173"]
        .iter()
        .filter_map(|o| normal_origin(o))
        .collect();
    assert!(origin_allowed("https://app.example.com:443", &origins));
    assert!(origin_allowed("http://localhost:5173", &origins));
    assert!(!origin_allowed("http://app.example.com", &origins));
    assert!(!origin_allowed("http://localhost:5174", &origins));
    assert!(!origin_allowed("null", &origins));
}

#[test]
fn resource_uris_are_canonical() {
    let canon = |s: &str| canonical_resource(s).map(|(c, _)| c);
    assert_eq!(
        canon("HTTPS://MCP.Example.COM:443/mcp/"),
        Ok("https://mcp.example.com/mcp".to_owned())
    );
    assert_eq!(
        canon("http://127.0.0.1:8080/mcp"),
        Ok("http://127.0.0.1:8080/mcp".to_owned())
    );
    let refused = |s: &str| canon(s).expect_err(s).to_string();
    assert_eq!(
        refused("https://mcp.example.com/mcp#frag"),
        "resource \"https://mcp.example.com/mcp#frag\" must not have a query or fragment"
    );
    assert_eq!(
        refused("https://u:p@mcp.example.com/mcp"),
        "resource \"https://u:p@mcp.example.com/mcp\" must not carry credentials"
    );
    assert_eq!(
        refused("ftp://mcp.example.com/mcp"),
        "resource \"ftp://mcp.example.com/mcp\" is not an absolute http(s) URI"
    );
    assert!(matches!(
        canonical_resource("mcp.example.com/mcp"),
        Err(ResourceError::Invalid { .. })
    ));
}

#[tokio::test]
async fn hmac_algorithms_cannot_be_configured() {
    assert!(super::auth::algorithm("HS256").is_err());
    assert!(super::auth::algorithm("none").is_err());
    assert!(super::auth::algorithm("EdDSA").is_ok());
}

#[tokio::test]
async fn an_address_that_keeps_sending_bad_tokens_is_told_to_wait_and_known_tokens_still_work() {
    let App { app, keys, .. } = app().await;
    let peer = super::Peer("192.0.2.7:40000".parse().expect("addr"));
    let from_peer = |request: Request<Body>| {
        let mut request = request;
        request.extensions_mut().insert(peer);
        request
    };
    let good = token(&keys, &claims("notes:read"));
    // Verified once: later calls with it are not held up by the address's failures.
    let list = call("read_ledger", &json!({}));
    assert_eq!(
        send(&app, from_peer(with_token(list, &good))).await.0,
        StatusCode::OK
    );
    let mut forged = claims("notes:read");
    forged["sub"] = json!("user-mallory");
    let forged = token(&keys, &forged);
    let mut parts = forged.split('.');
    let (head, payload) = (
        parts.next().expect("header"),
        parts.next().expect("payload"),
    );
    for i in 0..super::layers::FAILURES_ALLOWED {
        let bad = format!(
            "{head}.{payload}.{}",
            URL_SAFE_NO_PAD.encode(format!("sig{i}"))
        );
        let request = from_peer(with_token(call("read_ledger", &json!({})), &bad));
        assert_eq!(send(&app, request).await.0, StatusCode::UNAUTHORIZED, "{i}");
    }
    let fresh = token(&keys, &claims("notes:read notes:write"));
    let request = from_peer(with_token(call("read_ledger", &json!({})), &fresh));
    let response = app.clone().oneshot(request).await.expect("response");
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry: u64 = response.headers()[header::RETRY_AFTER]
        .to_str()
        .expect("ascii")
        .parse()
        .expect("seconds");
    assert!((1..=10).contains(&retry), "{retry}");
    let request = from_peer(with_token(call("read_ledger", &json!({})), &good));
    assert_eq!(
        send(&app, request).await.0,
        StatusCode::OK,
        "a verified token still works"
    );
    // Another address is not affected.
    let request = with_token(call("read_ledger", &json!({})), &fresh);
    assert_eq!(send(&app, request).await.0, StatusCode::OK);
}

// ---------------------------------------------------------------------------------------------
// Each layer on its own

/// What stands behind a layer under test: a handler that says it was reached, with what the
/// layers in front put in the extensions and the body it was handed.
async fn reached(request: axum::extract::Request) -> Response {
    let tool = request
        .extensions()
        .get::<Called>()
        .and_then(|c| c.tool.clone());
    let sub = request
        .extensions()
        .get::<Principal>()
        .map(|p| p.sub.clone());
    let body = request
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    axum::Json(json!({
        "reached": true, "tool": tool, "sub": sub, "body": String::from_utf8_lossy(&body),
    }))
    .into_response()
}

/// A router that answers with [`reached`] behind the one check `check`, as the front door runs it.
fn behind<C, F>(check: C) -> axum::Router
where
    C: Fn(Request<Body>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = layers::Checked> + Send + 'static,
{
    axum::Router::new()
        .route("/mcp", any(reached))
        .layer(from_fn(move |request: Request<Body>, next: Next| {
            let checked = check(request);
            async move {
                match checked.await {
                    Ok(request) => next.run(request).await,
                    Err(refused) => *refused,
                }
            }
        }))
}

/// Status and body (as JSON when it is JSON) of `request` sent through `app`.
async fn answer(app: &axum::Router, request: Request<Body>) -> (StatusCode, Value) {
    let (status, _, body) = send(app, request).await;
    let body = serde_json::from_str(&body).unwrap_or(Value::String(body));
    (status, body)
}

fn post(body: impl Into<Body>) -> Request<Body> {
    Request::post("/mcp")
        .header(header::CONTENT_TYPE, "application/json")
        .body(body.into())
        .expect("request")
}

/// The JSON-RPC error body the front door answers with: no id, `code`.
fn assert_rpc_error(body: &Value, code: i64, what: &str) {
    assert_eq!(body["jsonrpc"], "2.0", "{what}: {body}");
    assert_eq!(body["id"], Value::Null, "{what}: {body}");
    assert_eq!(body["error"]["code"], code, "{what}: {body}");
    assert!(body["error"]["message"].is_string(), "{what}: {body}");
}

#[tokio::test]
async fn header_cap_refuses_more_than_32_kib_of_headers() {
    let app = behind(|request| std::future::ready(layers::header_cap(request)));
    let with_filler = |size: usize| {
        Request::get("/mcp")
            .header("x-filler", "a".repeat(size))
            .body(Body::empty())
            .expect("request")
    };
    let (status, body) = answer(&app, with_filler(super::MAX_HEADER_BYTES)).await;
    assert_eq!(status, StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
    assert_rpc_error(&body, -32600, "431");
    let (status, body) = answer(&app, with_filler(super::MAX_HEADER_BYTES - 100)).await;
    assert_eq!((status, &body["reached"]), (StatusCode::OK, &json!(true)));
}

#[tokio::test]
async fn host_and_origin_refuse_foreign_and_repeated_values_in_any_order() {
    let mut config = HttpConfig::new(RESOURCE).expect("config");
    config.allowed_origins = vec!["https://app.example.test".to_owned()];
    let door = Arc::new(Door::new(&config));
    let app = behind(move |request| std::future::ready(layers::host_and_origin(&door, request)));
    let ours = "127.0.0.1:7777";
    let app_origin = "https://app.example.test";
    type Headers<'a> = &'a [(&'a str, &'a str)];
    let rows: &[(&str, Headers<'_>, StatusCode)] = &[
        ("our Host", &[("host", ours)], StatusCode::OK),
        ("localhost", &[("host", "localhost:7777")], StatusCode::OK),
        (
            "our Host, allowed Origin",
            &[("host", ours), ("origin", app_origin)],
            StatusCode::OK,
        ),
        ("no Host", &[], StatusCode::FORBIDDEN),
        (
            "foreign Host",
            &[("host", "evil.test")],
            StatusCode::FORBIDDEN,
        ),
        (
            "foreign Origin",
            &[("host", ours), ("origin", "https://evil.test")],
            StatusCode::FORBIDDEN,
        ),
        (
            "Host twice, ours first",
            &[("host", ours), ("host", "evil.test")],
            StatusCode::BAD_REQUEST,
        ),
        (
            "Host twice, ours last",
            &[("host", "evil.test"), ("host", ours)],
            StatusCode::BAD_REQUEST,
        ),
        (
            "Host twice, both ours",
            &[("host", ours), ("host", ours)],
            StatusCode::BAD_REQUEST,
        ),
        (
            "Origin twice, allowed first",
            &[
                ("host", ours),
                ("origin", app_origin),
                ("origin", "https://evil.test"),
            ],
            StatusCode::BAD_REQUEST,
        ),
        (
            "Origin twice, allowed last",
            &[
                ("host", ours),
                ("origin", "https://evil.test"),
                ("origin", app_origin),
            ],
            StatusCode::BAD_REQUEST,
        ),
    ];
    for (name, headers, expected) in rows {
        let mut request = Request::post("/mcp").body(Body::empty()).expect("request");
        for (header, value) in *headers {
            request.headers_mut().append(
                header::HeaderName::from_bytes(header.as_bytes()).expect("name"),
                value.parse().expect("value"),
            );
        }
        let (status, body) = answer(&app, request).await;
        assert_eq!(status, *expected, "{name}: {body}");
        if status != StatusCode::OK {
            assert_rpc_error(&body, -32600, name);
        }
    }
}

#[tokio::test]
async fn a_token_in_the_query_string_is_refused_whatever_else_comes_with_it() {
    let app = behind(|request| std::future::ready(layers::no_token_in_query(request)));
    for uri in ["/mcp?access_token=abc", "/mcp?x=1&access_token="] {
        let request = Request::post(uri).body(Body::empty()).expect("request");
        let (status, challenge, body) = send(&app, request).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{uri}");
        assert_eq!(
            challenge,
            "Bearer error=\"invalid_request\", error_description=\"send the token in the \
             Authorization header\"",
            "{uri}"
        );
        assert_eq!(body, r#"{"error":"invalid_request"}"#);
    }
    let request = Request::post("/mcp?token=abc")
        .body(Body::empty())
        .expect("request");
    assert_eq!(answer(&app, request).await.0, StatusCode::OK);
}

/// A body whose bytes never come: a client that stalls after its headers.
struct Stalled;

impl hyper::body::Body for Stalled {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, Infallible>>> {
        Poll::Pending
    }
}

#[tokio::test]
async fn body_cap_reads_a_post_within_its_size_and_time_and_hands_on_exactly_those_bytes() {
    let caps = Caps {
        max_body: 16,
        read_timeout: Duration::from_millis(200),
    };
    let app = behind(move |request| async move {
        let (parts, body) = layers::body_cap(caps, request).await?;
        Ok(Request::from_parts(parts, Body::from(body)))
    });
    let (status, body) = answer(&app, post("0123456789abcdef")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["body"], "0123456789abcdef");
    let (status, body) = answer(&app, post("0123456789abcdefX")).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_rpc_error(&body, -32600, "413");
    let started = std::time::Instant::now();
    let (status, body) = answer(&app, post(Body::new(Stalled))).await;
    assert_eq!(status, StatusCode::REQUEST_TIMEOUT);
    assert_rpc_error(&body, -32600, "408");
    assert!(started.elapsed() < Duration::from_secs(5));
    // Only a POST carries a message: another method's body is not read, and not handed on.
    let get = Request::get("/mcp")
        .body(Body::new(Stalled))
        .expect("request");
    let (status, body) = answer(&app, get).await;
    assert_eq!((status, &body["body"]), (StatusCode::OK, &json!("")));
}

/// `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{…}}` with `params` as given (raw).
fn call_with_params(params: &str) -> String {
    format!(r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{params}}}"#)
}

/// `depth` arrays nested in each other, as the arguments' one member.
fn nested(depth: usize) -> String {
    // The message object, params and arguments are three levels already.
    let arrays = depth - 3;
    call_with_params(&format!(
        r#"{{"name":"read_ledger","arguments":{{"deep":{}{}}}}}"#,
        "[".repeat(arrays),
        "]".repeat(arrays)
    ))
}

#[tokio::test]
async fn json_rpc_lets_one_message_with_one_reading_through_and_refuses_the_rest_with_400() {
    let app = behind(|request: Request<Body>| async move {
        let (parts, body) = request.into_parts();
        let body = body.collect().await.expect("a test's body").to_bytes();
        layers::json_rpc(parts, body)
    });
    let meta = r#""_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}"#;
    let twice_in_meta = r#"{"name":"read_ledger","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/protocolVersion":"2025-11-25"}}"#.to_owned();
    let refused: Vec<(&str, Vec<u8>, i64)> =
        vec![
        // -32700: no single reading as JSON.
        ("empty body", Vec::new(), -32700),
        ("not JSON", b"{\"jsonrpc\":".to_vec(), -32700),
        (
            "not UTF-8",
            b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\",\"x\":\"\xff\"}".to_vec(),
            -32700,
        ),
        (
            "a lone surrogate",
            br#"{"jsonrpc":"2.0","id":1,"method":"ping","x":"\ud800"}"#.to_vec(),
            -32700,
        ),
        (
            "trailing bytes",
            br#"{"jsonrpc":"2.0","id":1,"method":"ping"}x"#.to_vec(),
            -32700,
        ),
        (
            "two messages",
            br#"{"jsonrpc":"2.0","id":1,"method":"ping"} {"jsonrpc":"2.0","id":2,"method":"ping"}"#
                .to_vec(),
            -32700,
        ),
        (
            "nested 65 deep",
            nested(MAX_DEPTH + 1).into_bytes(),
            -32700,
        ),
        // -32600: JSON, but not one JSON-RPC message with one reading.
        (
            "a batch",
            br#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#.to_vec(),
            -32600,
        ),
        ("an empty batch", b"[]".to_vec(), -32600),
        ("a string", br#""ping""#.to_vec(), -32600),
        ("no jsonrpc", br#"{"id":1,"method":"ping"}"#.to_vec(), -32600),
        (
            "jsonrpc 1.0",
            br#"{"jsonrpc":"1.0","id":1,"method":"ping"}"#.to_vec(),
            -32600,
        ),
        (
            "method not a string",
            br#"{"jsonrpc":"2.0","id":1,"method":7}"#.to_vec(),
            -32600,
        ),
        (
            "id null on a request",
            br#"{"jsonrpc":"2.0","id":null,"method":"ping"}"#.to_vec(),
            -32600,
        ),
        (
            "id an object",
            br#"{"jsonrpc":"2.0","id":{},"method":"ping"}"#.to_vec(),
            -32600,
        ),
        (
            "id a fraction",
            br#"{"jsonrpc":"2.0","id":1.5,"method":"ping"}"#.to_vec(),
            -32600,
        ),
        (
            "params a list",
            br#"{"jsonrpc":"2.0","id":1,"method":"ping","params":[]}"#.to_vec(),
            -32600,
        ),
        (
            "method and result",
            br#"{"jsonrpc":"2.0","id":1,"method":"ping","result":{}}"#.to_vec(),
            -32600,
        ),
        ("no method, result or error", br#"{"jsonrpc":"2.0","id":1}"#.to_vec(), -32600),
        (
            "a result without an id",
            br#"{"jsonrpc":"2.0","result":{}}"#.to_vec(),
            -32600,
        ),
        (
            "method twice",
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/list","method":"tools/call"}"#.to_vec(),
            -32600,
        ),
        (
            "jsonrpc twice",
            br#"{"jsonrpc":"2.0","jsonrpc":"2.0","id":1,"method":"ping"}"#.to_vec(),
            -32600,
        ),
        (
            "id twice",
            br#"{"jsonrpc":"2.0","id":1,"id":2,"method":"ping"}"#.to_vec(),
            -32600,
        ),
        (
            "params twice",
            call_with_params(r#"{"name":"read_ledger"},"params":{"name":"write_note"}"#)
                .into_bytes(),
            -32600,
        ),
        (
            "name twice in params",
            call_with_params(r#"{"name":"read_ledger","name":"write_note"}"#).into_bytes(),
            -32600,
        ),
        (
            "name twice, once spelt with an escape",
            call_with_params(r#"{"name":"read_ledger","n\u0061me":"write_note"}"#).into_bytes(),
            -32600,
        ),
        (
            "the protocol version twice in _meta",
            call_with_params(&twice_in_meta).into_bytes(),
            -32600,
        ),
        (
            "a member twice deep in the arguments",
            call_with_params(r#"{"name":"read_ledger","arguments":{"a":[{"b":1,"b":2}]}}"#)
                .into_bytes(),
            -32600,
        ),
        // -32602: a tools/call whose tool cannot be told.
        (
            "tools/call without params",
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call"}"#.to_vec(),
            -32602,
        ),
        (
            "tools/call with a number for a name",
            call_with_params(r#"{"name":7}"#).into_bytes(),
            -32602,
        ),
        (
            "tools/call with a list of arguments",
            call_with_params(r#"{"name":"read_ledger","arguments":[]}"#).into_bytes(),
            -32602,
        ),
    ];
    for (name, body, code) in refused {
        let (status, answer) = answer(&app, post(body)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{name}: {answer}");
        assert_rpc_error(&answer, code, name);
    }

    let passed: Vec<(&str, String, Value)> = vec![
        (
            "a tools/call",
            call_with_params(&format!(
                r#"{{"name":"write_note","arguments":{{"text":"hi"}},{meta}}}"#
            )),
            json!("write_note"),
        ),
        ("nested 64 deep", nested(MAX_DEPTH), json!("read_ledger")),
        (
            "arguments null",
            call_with_params(r#"{"name":"read_ledger","arguments":null}"#),
            json!("read_ledger"),
        ),
        (
            "a request without params",
            r#"{"jsonrpc":"2.0","id":"a","method":"tools/list"}"#.to_owned(),
            Value::Null,
        ),
        (
            "a notification",
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#.to_owned(),
            Value::Null,
        ),
        (
            "a response",
            r#"{"jsonrpc":"2.0","id":3,"result":{}}"#.to_owned(),
            Value::Null,
        ),
        (
            "an error response to an unreadable request",
            r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"no"}}"#.to_owned(),
            Value::Null,
        ),
        (
            "the same member name in two objects",
            call_with_params(r#"{"name":"read_ledger","arguments":{"name":"x"}}"#),
            json!("read_ledger"),
        ),
    ];
    for (name, body, tool) in passed {
        let (status, answer) = answer(&app, post(body.clone())).await;
        assert_eq!(status, StatusCode::OK, "{name}: {answer}");
        assert_eq!(answer["tool"], tool, "{name}");
        assert_eq!(answer["body"], body.as_str(), "{name}: the body handed on");
    }

    // 415 stays for a body that does not say it is JSON; the charset parameter is fine.
    for (content_type, expected) in [
        (Some("text/plain"), StatusCode::UNSUPPORTED_MEDIA_TYPE),
        (None, StatusCode::UNSUPPORTED_MEDIA_TYPE),
        (Some("application/json; charset=utf-8"), StatusCode::OK),
    ] {
        let mut request = post(r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#);
        match content_type {
            Some(value) => request
                .headers_mut()
                .insert(header::CONTENT_TYPE, value.parse().expect("value")),
            None => request.headers_mut().remove(header::CONTENT_TYPE),
        };
        assert_eq!(answer(&app, request).await.0, expected, "{content_type:?}");
    }
    // A GET carries no message: nothing to read.
    let get = Request::get("/mcp").body(Body::empty()).expect("request");
    assert_eq!(answer(&app, get).await.0, StatusCode::OK);
}

/// `header` and `claims`, as raw JSON text, signed with `keys` (ES256).
fn token_raw(keys: &Keys, header: &[u8], claims: &[u8]) -> String {
    let input = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(header),
        URL_SAFE_NO_PAD.encode(claims)
    );
    let signature = jsonwebtoken::crypto::sign(input.as_bytes(), &keys.signing, Algorithm::ES256)
        .expect("sign");
    format!("{input}.{signature}")
}

const ES256_HEADER: &[u8] = br#"{"alg":"ES256","typ":"at+jwt","kid":"k1"}"#;

/// `claims` as JSON text with `more` (raw members) appended inside the object.
fn claims_plus(claims: &Value, more: &[u8]) -> Vec<u8> {
    let text = claims.to_string();
    let mut raw = text.as_bytes()[..text.len() - 1].to_vec();
    raw.extend_from_slice(b",");
    raw.extend_from_slice(more);
    raw.extend_from_slice(b"}");
    raw
}

#[tokio::test]
async fn bearer_admits_a_good_token_and_refuses_every_other_with_the_same_401() {
    let Parts {
        server,
        verifier,
        keys,
        ..
    } = parts().await;
    let auth = Arc::new(Auth::new(verifier, server));
    let app = behind(move |request| {
        let auth = Arc::clone(&auth);
        async move { layers::bearer(&auth, request).await }
    });
    let request = |token: Option<&str>| {
        let mut request = post("{}");
        if let Some(token) = token {
            request = with_token(request, token);
        }
        request
    };

    let good = claims("notes:read");
    let (status, body) = answer(&app, request(Some(&token(&keys, &good)))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["sub"], "user-alice");
    let mut soon = good.clone();
    soon["iat"] = json!(now() + 10);
    let (status, body) = answer(&app, request(Some(&token(&keys, &soon)))).await;
    assert_eq!(status, StatusCode::OK, "iat inside the leeway: {body}");

    // No token: the hint names every scope, or the one scope the called tool needs.
    let (status, challenge, _) = send(&app, request(None)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(
        challenge.ends_with("scope=\"admin notes:read notes:write\""),
        "{challenge}"
    );
    let mut calling = request(None);
    calling.extensions_mut().insert(Called {
        short: None,
        cancelled: None,
        tool: Some("write_note".to_owned()),
        arguments: None,
    });
    let (_, challenge, _) = send(&app, calling).await;
    assert!(challenge.ends_with("scope=\"notes:write\""), "{challenge}");

    // Two Authorization headers: refused however good either is.
    let mut twice = request(Some(&token(&keys, &good)));
    twice.headers_mut().append(
        header::AUTHORIZATION,
        format!("Bearer {}", token(&keys, &good))
            .parse()
            .expect("value"),
    );
    let (status, challenge, _) = send(&app, twice).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(challenge.contains("invalid_request"), "{challenge}");

    let mut future = good.clone();
    future["iat"] = json!(now() + 120);
    let mut padded = good.clone();
    padded["pad"] = json!("x".repeat(super::auth::MAX_TOKEN_BYTES));
    let claims_text = good.to_string().into_bytes();
    let refused: Vec<(&str, String)> = vec![
        ("longer than 8 KiB", token(&keys, &padded)),
        ("issued 120 s in the future", token(&keys, &future)),
        (
            "a member twice in the JOSE header",
            token_raw(
                &keys,
                br#"{"alg":"ES256","typ":"at+jwt","kid":"k1","x-note":"a","x-note":"b"}"#,
                &claims_text,
            ),
        ),
        (
            "a member twice in the claims (one no check reads)",
            token_raw(
                &keys,
                ES256_HEADER,
                &claims_plus(&good, br#""jti":"a","jti":"b""#),
            ),
        ),
        (
            "sub twice in the claims",
            token_raw(
                &keys,
                ES256_HEADER,
                &claims_plus(&good, br#""sub":"user-bob""#),
            ),
        ),
        (
            "claims not UTF-8 (in a member no check reads)",
            token_raw(
                &keys,
                ES256_HEADER,
                &claims_plus(&good, b"\"note\":\"\xff\""),
            ),
        ),
        (
            "bytes after the claims",
            token_raw(
                &keys,
                ES256_HEADER,
                &[claims_text.as_slice(), b"x"].concat(),
            ),
        ),
        (
            "bytes after the JOSE header",
            token_raw(&keys, &[ES256_HEADER, b"x"].concat(), &claims_text),
        ),
        (
            "claims that are a list",
            token_raw(&keys, ES256_HEADER, b"[1]"),
        ),
    ];
    let mut answers = Vec::new();
    for (name, bad) in &refused {
        let (status, challenge, body) = send(&app, request(Some(bad))).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{name}: {body}");
        answers.push((challenge, body));
    }
    answers.dedup();
    assert_eq!(answers.len(), 1, "the answers differ: {answers:?}");
    assert!(answers[0].0.starts_with("Bearer error=\"invalid_token\""));
}

#[tokio::test]
async fn scope_refuses_a_tool_the_principal_may_not_call_and_audits_it() {
    let Parts {
        server,
        verifier,
        data,
        ..
    } = parts().await;
    let auth = Arc::new(Auth::new(verifier, server));
    let app = behind(move |request| {
        let auth = Arc::clone(&auth);
        async move { layers::scope(&auth, request).await }
    });
    let request = |tool: Option<&str>, scopes: Option<&[&str]>| {
        let mut request = post("{}");
        if let Some(tool) = tool {
            let arguments = json!({"text": "hi"}).as_object().cloned();
            request.extensions_mut().insert(Called {
                short: None,
                cancelled: None,
                tool: Some(tool.to_owned()),
                arguments,
            });
        }
        if let Some(scopes) = scopes {
            let scopes = scopes.iter().map(|s| (*s).to_owned()).collect();
            request.extensions_mut().insert(Principal::from_token(
                "user-alice".to_owned(),
                scopes,
                None,
            ));
        }
        request
    };
    type Scopes<'a> = Option<&'a [&'a str]>;
    let rows: &[(&str, Option<&str>, Scopes<'_>, StatusCode)] = &[
        (
            "the tool's scope",
            Some("write_note"),
            Some(&["notes:write"]),
            StatusCode::OK,
        ),
        ("no tool called", None, Some(&[]), StatusCode::OK),
        (
            "a tool hidden from everyone",
            Some("rm_rf"),
            Some(&[]),
            StatusCode::OK,
        ),
        (
            "a tool that does not exist",
            Some("nope"),
            Some(&[]),
            StatusCode::OK,
        ),
        (
            "another scope",
            Some("write_note"),
            Some(&["notes:read"]),
            StatusCode::FORBIDDEN,
        ),
        (
            "no principal at all",
            Some("write_note"),
            None,
            StatusCode::UNAUTHORIZED,
        ),
    ];
    for (name, tool, scopes, expected) in rows {
        let (status, challenge, body) = send(&app, request(*tool, *scopes)).await;
        assert_eq!(status, *expected, "{name}: {body}");
        if status == StatusCode::FORBIDDEN {
            assert!(
                challenge
                    .starts_with("Bearer error=\"insufficient_scope\", scope=\"notes:write\","),
                "{challenge}"
            );
        }
    }
    let records = audit(&data);
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(
        (
            &records[0]["name"],
            &records[0]["rule"],
            &records[0]["outcome"]
        ),
        (
            &json!("write_note"),
            &json!("scope"),
            &json!("not_executed")
        )
    );
}

// ---------------------------------------------------------------------------------------------
// The whole stack

#[tokio::test]
async fn the_checks_run_in_the_documented_order() {
    let App { app, keys, data } = app().await;
    let read_only = token(&keys, &claims("notes:read"));
    let huge = json!({"request_id": "req-00003", "text": "x".repeat(200 * 1024)});
    let set = |mut request: Request<Body>, name: &'static str, value: &str| {
        request.headers_mut().append(
            header::HeaderName::from_static(name),
            value.parse().expect("value"),
        );
        request
    };
    let garbage = |request: Request<Body>| {
        let (parts, _) = request.into_parts();
        Request::from_parts(parts, Body::from("{not json"))
    };
    let rows: Vec<(&str, Request<Body>, StatusCode)> = vec![
        (
            "oversized headers before a foreign Host",
            set(
                set(call("write_note", &json!({})), "host", "evil.test"),
                "x-filler",
                &"a".repeat(40 * 1024),
            ),
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
        ),
        (
            "a second Host before a foreign Origin",
            set(
                set(call("write_note", &json!({})), "host", "evil.test"),
                "origin",
                "https://evil.test",
            ),
            StatusCode::BAD_REQUEST,
        ),
        (
            "a foreign Origin before the token in the query",
            {
                let mut request = set(call("write_note", &json!({})), "origin", "https://x.test");
                *request.uri_mut() = "/mcp?access_token=abc".parse().expect("uri");
                request
            },
            StatusCode::FORBIDDEN,
        ),
        (
            "the token in the query before the body's size",
            {
                let mut request = call("write_note", &huge);
                *request.uri_mut() = "/mcp?access_token=abc".parse().expect("uri");
                request
            },
            StatusCode::BAD_REQUEST,
        ),
        (
            "the body's size before its content and the token",
            {
                let (parts, _) = call("write_note", &json!({})).into_parts();
                let mut body = b"{not json ".to_vec();
                body.resize(200 * 1024, b' ');
                Request::from_parts(parts, Body::from(body))
            },
            StatusCode::PAYLOAD_TOO_LARGE,
        ),
        (
            "the message before the token",
            garbage(call("write_note", &json!({}))),
            StatusCode::BAD_REQUEST,
        ),
        (
            "the token before the scope",
            with_token(call("write_note", &json!({})), "not-a-jwt"),
            StatusCode::UNAUTHORIZED,
        ),
        (
            "the scope before the gate",
            with_token(
                call(
                    "write_note",
                    &json!({"request_id": "req-00004", "text": "hi"}),
                ),
                &read_only,
            ),
            StatusCode::FORBIDDEN,
        ),
    ];
    for (name, request, expected) in rows {
        let (status, _, body) = send(&app, request).await;
        assert_eq!(status, expected, "{name}: {body}");
    }
    // Only the last reached a check that records: the scope refusal.
    assert_eq!(audit(&data).len(), 1);
}

#[tokio::test]
async fn a_body_with_two_readings_runs_nothing_and_the_server_goes_on() {
    let App { app, keys, data } = app().await;
    let writer = token(&keys, &claims("notes:read notes:write"));
    let meta = r#""_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientInfo":{"name":"t","version":"0"},"io.modelcontextprotocol/clientCapabilities":{}}"#;
    let bodies = [
        format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"read_ledger","name":"write_note","arguments":{{"request_id":"req-00005","text":"hi"}},{meta}}}}}"#
        ),
        format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"tools/list","method":"tools/call","params":{{"name":"write_note","arguments":{{"request_id":"req-00006","text":"hi"}},{meta}}}}}"#
        ),
        format!(
            r#"[{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"write_note","arguments":{{"request_id":"req-00007","text":"hi"}},{meta}}}}}]"#
        ),
    ];
    for body in bodies {
        let (parts, _) = with_token(call("write_note", &json!({})), &writer).into_parts();
        let request = Request::from_parts(parts, Body::from(body.clone()));
        let (status, _, answer) = send(&app, request).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {answer}");
        assert_eq!(
            serde_json::from_str::<Value>(&answer).expect("json")["error"]["code"],
            -32600
        );
    }
    assert!(
        audit(&data).is_empty(),
        "nothing was decided, nothing recorded"
    );
    let arguments = json!({"request_id": "req-00008", "text": "hi"});
    let (status, _, body) = send(&app, with_token(call("write_note", &arguments), &writer)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body.contains("committed"), "{body}");
}

#[tokio::test]
async fn a_message_rmcp_cannot_read_gets_400_not_415() {
    let App { app, keys, .. } = app().await;
    let reader = token(&keys, &claims("notes:read"));
    // A JSON-RPC error response must carry a code and a message; rmcp answered this with 415.
    let body = r#"{"jsonrpc":"2.0","id":1,"error":{}}"#;
    let (parts, _) = with_token(call("read_ledger", &json!({})), &reader).into_parts();
    let request = Request::from_parts(parts, Body::from(body));
    let (status, _, answer) = send(&app, request).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    let answer: Value = serde_json::from_str(&answer).expect("json");
    assert_rpc_error(&answer, -32600, "an error without a code");
}

// ---------------------------------------------------------------------------------------------
// Strict JSON

#[test]
fn strict_json_has_one_reading_or_none() {
    // Numbers and strings read as serde_json reads them.
    assert_eq!(
        strict::parse(
            br#" {"a":[18446744073709551615,-9223372036854775808,1.5,1e2,"\u00e9"],"b":null} "#
        ),
        Ok(json!({"a": [u64::MAX, i64::MIN, 1.5, 100.0, "é"], "b": null}))
    );
    let nest = |depth: usize| format!("{}{}", "[".repeat(depth), "]".repeat(depth));
    assert!(strict::parse(nest(MAX_DEPTH).as_bytes()).is_ok());
    assert_eq!(
        strict::parse(nest(MAX_DEPTH + 1).as_bytes()),
        Err(JsonError::TooDeep { max: MAX_DEPTH })
    );
    assert_eq!(
        strict::parse(nest(10_000).as_bytes()),
        Err(JsonError::TooDeep { max: MAX_DEPTH }),
        "refused long before any reader's stack runs out"
    );
    for (text, name) in [
        (r#"{"a":1,"a":1}"#, "a"),
        (r#"{"a":1,"\u0061":2}"#, "a"),
        (r#"{"x":{"y":[{"z":1,"z":2}]}}"#, "z"),
        (r#"{"":1,"":2}"#, ""),
    ] {
        assert_eq!(
            strict::parse(text.as_bytes()),
            Err(JsonError::Duplicate {
                name: name.to_owned()
            }),
            "{text}"
        );
    }
    assert_eq!(strict::parse(b"\"\xc3\""), Err(JsonError::NotUtf8));
    for text in [
        "",
        "{} x",
        "{} {}",
        r#""\udc00""#,
        "\u{feff}{}",
        "{'a':1}",
        "NaN",
    ] {
        assert!(
            matches!(
                strict::parse(text.as_bytes()),
                Err(JsonError::Syntax { .. })
            ),
            "{text:?}"
        );
    }
}

fn probe(path: &str, host: &str) -> Request<Body> {
    Request::get(path)
        .header(header::HOST, host)
        .body(Body::empty())
        .expect("request")
}

#[tokio::test]
async fn probes_answer_without_a_token_and_readiness_names_each_check() {
    let Parts {
        server, verifier, ..
    } = parts().await;
    let config = HttpConfig::new(RESOURCE).expect("config");
    let shutdown = CancellationToken::new();
    let app = router(server, config, Some(verifier), shutdown.clone());

    let (status, _, body) = send(&app, probe("/healthz", "127.0.0.1:7777")).await;
    assert_eq!(
        (status, body.as_str()),
        (StatusCode::OK, r#"{"status":"ok"}"#)
    );
    let (status, _, body) = send(&app, probe("/readyz", "127.0.0.1:7777")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let ready: Value = serde_json::from_str(&body).expect("json");
    assert_eq!(ready["ready"], true);
    assert_eq!(ready["checks"]["audit"]["ok"], true);
    let policy = Policy::from_bytes(POLICY.as_bytes()).expect("policy");
    assert_eq!(
        ready["checks"]["policy"]["detail"],
        format!("sha256 {}", policy.sha256())
    );

    // The Host check holds for probes too: a rebound name learns nothing.
    let (status, _, _) = send(&app, probe("/readyz", "evil.example:7777")).await;
    assert_ne!(status, StatusCode::OK);

    // Draining after SIGTERM: not ready, so a load balancer sends no new caller; still alive.
    shutdown.cancel();
    let (status, _, body) = send(&app, probe("/readyz", "127.0.0.1:7777")).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    let ready: Value = serde_json::from_str(&body).expect("json");
    assert_eq!(ready["ready"], false);
    assert_eq!(ready["checks"]["serving"]["detail"], "shutting down");
    let (status, _, _) = send(&app, probe("/healthz", "127.0.0.1:7777")).await;
    assert_eq!(status, StatusCode::OK);
}

// ---------------------------------------------------------------------------------------------
// The short way of a legacy session's `tools/call` (short.rs)

/// A legacy (2025-11-25) request on `session` (none for `initialize`) with `token`.
fn legacy(token: &str, session: Option<&str>, body: &Value) -> Request<Body> {
    let mut request = Request::post("/mcp")
        .header(header::HOST, "127.0.0.1:7777")
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::ACCEPT, "application/json, text/event-stream")
        .header(header::AUTHORIZATION, format!("Bearer {token}"));
    if let Some(session) = session {
        request = request
            .header(SESSION_HEADER, session)
            .header("mcp-protocol-version", "2025-11-25");
    }
    request.body(Body::from(body.to_string())).expect("request")
}

/// Opens and initializes a legacy session whose client declares `capabilities`: its id.
async fn open_session(app: &axum::Router, token: &str, capabilities: &Value) -> String {
    let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": capabilities,
        "clientInfo": {"name": "t", "version": "0"}}});
    let opened = app
        .clone()
        .oneshot(legacy(token, None, &initialize))
        .await
        .expect("response");
    assert_eq!(opened.status(), StatusCode::OK);
    let session = opened
        .headers()
        .get(SESSION_HEADER)
        .expect("a session id")
        .to_str()
        .expect("ascii")
        .to_owned();
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let (status, _, body) = send(app, legacy(token, Some(&session), &initialized)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    // The server learns the session's client when its service has handled `initialized`,
    // after the 202: until then a call goes rmcp's way. A plain call tells when it is known.
    if capabilities
        .as_object()
        .is_some_and(serde_json::Map::is_empty)
    {
        for _ in 0..100 {
            let (_, kind, _) =
                exchange(app, legacy(token, Some(&session), &ledger_call(0, None))).await;
            if kind == "application/json" {
                return session;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the session's calls never took the short way");
    }
    session
}

/// The answer's status, `Content-Type` and body.
async fn exchange(app: &axum::Router, request: Request<Body>) -> (StatusCode, String, String) {
    answered_with(app, request, header::CONTENT_TYPE).await
}

/// The JSON-RPC message of an answer: the body itself, or the last `data:` of a stream.
fn message_of(kind: &str, body: &str) -> Value {
    let text = if kind.starts_with("text/event-stream") {
        body.lines()
            .filter_map(|line| line.strip_prefix("data:"))
            .map(str::trim)
            .rfind(|data| !data.is_empty())
            .unwrap_or_else(|| panic!("no message in the stream: {body}"))
    } else {
        body
    };
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {body}"))
}

fn ledger_call(id: i64, meta: Option<Value>) -> Value {
    let mut params = json!({"name": "read_ledger", "arguments": {}});
    if let Some(meta) = meta {
        params["_meta"] = meta;
    }
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params})
}

/// A session's plain call is answered by the front door as one JSON body, the same message rmcp
/// would put on a stream, audited for the token's subject; a call that asks for progress, or of
/// a client that may be asked questions, or under another version, takes rmcp's way (a stream)
/// and gets the same result.
#[tokio::test]
async fn a_sessions_plain_call_is_answered_as_json_and_the_rest_as_before() {
    let App { app, keys, data } = app().await;
    let alice = token(&keys, &claims("notes:read"));
    let plain = open_session(&app, &alice, &json!({})).await;

    let (status, kind, body) =
        exchange(&app, legacy(&alice, Some(&plain), &ledger_call(2, None))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(kind, "application/json", "{body}");
    let short = message_of(&kind, &body);
    assert_eq!(short["id"], 2, "{short}");
    assert_eq!(short["jsonrpc"], "2.0", "{short}");
    assert_eq!(short["result"]["isError"], false, "{short}");
    let last = audit(&data).pop().expect("a record");
    assert_eq!(last["name"], "read_ledger", "{last}");
    assert_eq!(last["principal"], "user-alice", "{last}");

    // The same call asking for progress: rmcp's stream, the same result.
    let progress = ledger_call(3, Some(json!({"progressToken": "p-1"})));
    let (status, kind, body) = exchange(&app, legacy(&alice, Some(&plain), &progress)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(kind.starts_with("text/event-stream"), "{kind}: {body}");
    let streamed = message_of(&kind, &body);
    assert_eq!(streamed["id"], 3, "{streamed}");
    assert_eq!(streamed["result"], short["result"], "{streamed}");

    // Under another version than the session's: rmcp judges it.
    let mut other = legacy(&alice, Some(&plain), &ledger_call(4, None));
    other.headers_mut().insert(
        "mcp-protocol-version",
        http::HeaderValue::from_static("2025-06-18"),
    );
    let (_, kind, body) = exchange(&app, other).await;
    assert!(!kind.starts_with("application/json"), "{kind}: {body}");

    // A client that may be asked for input: rmcp's stream, where its questions would go.
    let asked = open_session(&app, &alice, &json!({"elicitation": {}})).await;
    let (status, kind, body) =
        exchange(&app, legacy(&alice, Some(&asked), &ledger_call(5, None))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(kind.starts_with("text/event-stream"), "{kind}: {body}");
    assert_eq!(
        message_of(&kind, &body)["result"],
        short["result"],
        "{body}"
    );

    // Another subject's token on alice's session: an unknown session, as before.
    let bob = token(
        &keys,
        &json!({"iss": ISSUER, "aud": RESOURCE, "sub": "user-bob", "scope": "notes:read",
                "client_id": "test-client", "iat": now(), "exp": now() + 300}),
    );
    let (status, _, body) = exchange(&app, legacy(&bob, Some(&plain), &ledger_call(6, None))).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let bobs = audit(&data)
        .iter()
        .filter(|r| r["principal"] == "user-bob")
        .count();
    assert_eq!(bobs, 0, "bob's call reached the gate");
}

/// `notifications/cancelled` reaches a call the front door is answering: the tool sees its
/// cancellation and the call answers at once instead of after its 30 s.
#[tokio::test]
async fn a_call_on_the_short_way_is_cancelled_by_its_client() {
    let App { app, keys, .. } = app().await;
    let alice = token(&keys, &claims("notes:read notes:write"));
    let session = open_session(&app, &alice, &json!({})).await;
    let wait = json!({"jsonrpc": "2.0", "id": "w-1", "method": "tools/call",
        "params": {"name": "wait", "arguments": {"ms": 30_000}}});
    let started = std::time::Instant::now();
    let calling = app.clone();
    let request = legacy(&alice, Some(&session), &wait);
    let call = tokio::spawn(async move { exchange(&calling, request).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": {"requestId": "w-1", "reason": "the user changed their mind"}});
    let (status, _, body) = send(&app, legacy(&alice, Some(&session), &cancel)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let (status, kind, body) = tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .expect("the call answered after its cancellation")
        .expect("task");
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(status, StatusCode::OK, "{body}");
    let answer = message_of(&kind, &body);
    assert_eq!(answer["id"], "w-1", "{answer}");
    assert_ne!(
        answer["result"]["structuredContent"]["waited"], true,
        "the tool was not cancelled: {answer}"
    );
}

/// A call still running after the keep-alive interval is answered as a stream: keep-alive
/// comments while it runs, then the answer as one `message` event.
#[tokio::test]
async fn a_long_call_on_the_short_way_is_a_stream_with_keep_alives() {
    let Parts {
        server,
        verifier,
        keys,
        data: _data,
    } = parts().await;
    let mut config = HttpConfig::new(RESOURCE).expect("config");
    config.keep_alive = Duration::from_millis(150);
    let app = router(server, config, Some(verifier), CancellationToken::new());
    let alice = token(&keys, &claims("notes:read notes:write"));
    let session = open_session(&app, &alice, &json!({})).await;
    let wait = json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call",
        "params": {"name": "wait", "arguments": {"ms": 700}}});
    let (status, kind, body) = exchange(&app, legacy(&alice, Some(&session), &wait)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(kind, "text/event-stream", "{body}");
    assert!(body.starts_with(":\n\n"), "no keep-alive first: {body:?}");
    assert!(body.contains("event: message\ndata: "), "{body:?}");
    let answer = message_of(&kind, &body);
    assert_eq!(answer["id"], 9, "{answer}");
    assert_eq!(
        answer["result"]["structuredContent"]["waited"], true,
        "{answer}"
    );
}
