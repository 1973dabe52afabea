//! The HTTP front door through the router (`tower::ServiceExt::oneshot`): which requests get in,
//! and what the refused ones are told. Real tokens, signed with a key made here; the kit's ledger
//! behind the gate. The process-level table (a real socket, the helpdesk and docs toolsets) is in
//! the CLI's integration tests.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Body;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use http::{Request, StatusCode, header};
use http_body_util::BodyExt;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use toolgate_core::policy::Policy;
use toolgate_store::journal::Journal;
use tower::ServiceExt;

use super::auth::{AuthConfig, KeySource, Verifier};
use super::{
    HttpConfig, ResourceError, canonical_resource, host_allowed, normal_origin, origin_allowed,
    router,
};
use crate::GateServer;
use crate::server::Gate;
use crate::toolset::Ledger;

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
"#;

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

struct App {
    app: axum::Router,
    keys: Keys,
    data: tempfile::TempDir,
}

async fn app() -> App {
    let keys = keys();
    let data = tempfile::tempdir().expect("temp dir");
    let jwks = data.path().join("jwks.json");
    std::fs::write(&jwks, keys.jwks.to_string()).expect("jwks");
    let policy = Policy::from_bytes(POLICY.as_bytes()).expect("policy");
    let (journal, _) = Journal::open(data.path()).expect("journal");
    let server = GateServer::new(Gate::new(policy, journal), Arc::new(Ledger::new()));
    let verifier = Verifier::new(AuthConfig {
        issuer: ISSUER.to_owned(),
        resource: RESOURCE.to_owned(),
        algorithms: vec![Algorithm::ES256],
        keys: KeySource::File(jwks),
        authorization_servers: Vec::new(),
    })
    .await
    .expect("verifier");
    let config = HttpConfig::new(RESOURCE).expect("config");
    let app = router(
        server,
        config,
        Some(Arc::new(verifier)),
        CancellationToken::new(),
    );
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
    let response = app.clone().oneshot(request).await.expect("response");
    let status = response.status();
    let challenge = response
        .headers()
        .get(header::WWW_AUTHENTICATE)
        .map(|v| v.to_str().expect("ascii").to_owned())
        .unwrap_or_default();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    (
        status,
        challenge,
        String::from_utf8_lossy(&body).into_owned(),
    )
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
    for i in 0..super::FAILURES_ALLOWED {
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
