//! `toolgate serve --http`: Streamable HTTP with an OAuth 2.1 resource server (issue 5), proven
//! the way a remote client meets it. Each test starts a real `toolgate serve --http 127.0.0.1:0`
//! child, reads the bound address from its log, mints its own access tokens with keys generated
//! here (the JWKS in a file, or served by a small listener in the test) and speaks HTTP/1.1 to it
//! on 127.0.0.1. The hostile cases are tables: every row has a name and the answer it must get
//! (status, the header or body fragment that matters), in the spirit of the seed's `src/smoke.ts`
//! (seed 003, second article) and its results table, which this reproduces and extends.
//!
//! - `auth`: the token checks (audience, expiry, issuer, `alg: none`, HS256 with the public key,
//!   `kid`, `jku` / `x5u` / `jwk` headers, the query string) and the RFC 9728 metadata.
//! - `jwks_url`: keys fetched from a URL, refreshed at most once per interval for unknown `kid`s.
//! - `transport`: Host, Origin, body cap, the 2026-07-28 header checks, legacy sessions.
//! - `helpdesk`: the tools behind the token: per-user data, scopes, rate limits, the audit subject.
//! - `docs`: the SSRF guard of `fetch_doc`, with a local listener that must see no connection.
//! - `interop`: the official Python SDK over HTTP with a bearer token, in both protocol eras.
//!
//! Every scenario ends with `toolgate audit verify` on the server's audit log.

mod approvals;
mod auth;
mod docs;
mod gateway;
mod helpdesk;
mod interop;
mod jwks_url;
pub(crate) mod metrics;
mod reload;
mod replicas;
mod tasks;
mod transport;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::{Algorithm, EncodingKey};
use serde_json::{Value, json};

use super::{Scratch, repo_policy, verify_json, wait_for};

/// The issuer of every token the tests mint (never contacted: the keys are local).
const ISSUER: &str = "https://auth.example.test/";

/// The revision of the stateless requests.
const MODERN: &str = "2026-07-28";

/// How long any one HTTP exchange may take before the test calls the server hung.
const ANSWER_WITHIN: Duration = Duration::from_secs(20);

// ---------------------------------------------------------------------------------------------
// Keys and tokens
// ---------------------------------------------------------------------------------------------

/// A signing key of the test's authorization server: what signs, and the public JWK a server is
/// told to trust.
#[derive(Clone)]
struct Signer {
    alg: Algorithm,
    kid: String,
    key: EncodingKey,
    jwk: Value,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Signer({:?}, kid {})", self.alg, self.kid)
    }
}

fn b64(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

/// The RSA key pair of this test binary: generated once (2048-bit generation is the slow part
/// of a debug build) and shared by every test, each under its own `kid`.
fn rsa_key() -> &'static rsa::PrivateKey {
    static KEY: OnceLock<rsa::PrivateKey> = OnceLock::new();
    KEY.get_or_init(|| {
        use rsa::Generate as _;
        rsa::PrivateKey::generate()
    })
}

impl Signer {
    /// RS256 with the binary's RSA key.
    fn rsa(kid: &str) -> Self {
        use rsa::pkcs1::EncodeRsaPrivateKey as _;
        use rsa::traits::PublicKeyParts as _;
        let key = rsa_key();
        let der = key.to_pkcs1_der().expect("PKCS#1 DER of the RSA key");
        Self {
            alg: Algorithm::RS256,
            kid: kid.to_owned(),
            key: EncodingKey::from_rsa_der(der.as_bytes()),
            jwk: json!({
                "kty": "RSA", "use": "sig", "alg": "RS256", "kid": kid,
                "n": b64(&key.n_bytes()), "e": b64(&key.e_bytes()),
            }),
        }
    }

    /// ES256 with a fresh P-256 key.
    fn p256(kid: &str) -> Self {
        let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("P-256 key");
        // The raw public key is the SEC1 uncompressed point: 0x04 || x || y.
        let point = pair.public_key_raw();
        assert_eq!((point.len(), point[0]), (65, 4), "uncompressed P-256 point");
        Self {
            alg: Algorithm::ES256,
            kid: kid.to_owned(),
            key: EncodingKey::from_ec_der(&pair.serialize_der()),
            jwk: json!({
                "kty": "EC", "use": "sig", "alg": "ES256", "kid": kid, "crv": "P-256",
                "x": b64(&point[1..33]), "y": b64(&point[33..]),
            }),
        }
    }

    /// EdDSA with a fresh Ed25519 key.
    fn ed25519(kid: &str) -> Self {
        let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).expect("Ed25519 key");
        Self {
            alg: Algorithm::EdDSA,
            kid: kid.to_owned(),
            key: EncodingKey::from_ed_der(&pair.serialize_der()),
            jwk: json!({
                "kty": "OKP", "use": "sig", "alg": "EdDSA", "kid": kid, "crv": "Ed25519",
                "x": b64(pair.public_key_raw()),
            }),
        }
    }

    /// The protected header this key signs with by default.
    fn header(&self) -> Value {
        json!({"alg": format!("{:?}", self.alg), "typ": "at+jwt", "kid": self.kid})
    }

    /// A compact JWS of `claims` under `header` (any header: the hostile cases forge their own).
    fn sign_with_header(&self, header: &Value, claims: &Value) -> String {
        self.sign_raw(header.to_string().as_bytes(), claims.to_string().as_bytes())
    }

    /// A compact JWS of the bytes given as header and claims, whatever they are (JSON or not).
    fn sign_raw(&self, header: &[u8], claims: &[u8]) -> String {
        let signing_input = format!("{}.{}", b64(header), b64(claims));
        let signature = jsonwebtoken::crypto::sign(signing_input.as_bytes(), &self.key, self.alg)
            .expect("sign the token");
        format!("{signing_input}.{signature}")
    }

    fn sign(&self, claims: &Value) -> String {
        self.sign_with_header(&self.header(), claims)
    }
}

/// A JWKS document of `signers`' public keys.
fn jwks(signers: &[&Signer]) -> Value {
    json!({"keys": signers.iter().map(|s| s.jwk.clone()).collect::<Vec<_>>()})
}

fn unix_now() -> i64 {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs();
    i64::try_from(secs).expect("seconds fit i64")
}

/// The claims of a good access token for `resource`: issuer, audience, subject, five minutes.
fn claims(resource: &str, sub: &str, scope: &str) -> Value {
    let now = unix_now();
    json!({
        "iss": ISSUER, "aud": resource, "sub": sub, "scope": scope,
        "client_id": "test-client", "iat": now, "nbf": now - 5, "exp": now + 300,
        "jti": format!("jti-{}", next_id()),
    })
}

/// A number no other call in this process got (unique `jti`s, JSON-RPC ids).
fn next_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

// ---------------------------------------------------------------------------------------------
// The server
// ---------------------------------------------------------------------------------------------

/// Where a server gets its keys.
enum Keys<'a> {
    /// A JWKS file written into the scratch directory.
    File(&'a [&'a Signer]),
    /// A JWKS URL.
    Url(String),
}

/// `toolgate serve --http 127.0.0.1:0` as a child process, with its log in a file.
struct HttpServer {
    child: Child,
    addr: SocketAddr,
    log: PathBuf,
    http: Http,
}

impl HttpServer {
    /// `scratch`'s server on a free port with OAuth on (`keys`), plus `extra` flags; returns once
    /// it says where it listens.
    fn start(scratch: &Scratch, keys: Keys<'_>, extra: &[&str]) -> Self {
        let mut command = scratch.serve_command();
        command.args(["--http", "127.0.0.1:0", "--issuer", ISSUER]);
        match keys {
            Keys::File(signers) => {
                let file = scratch.path("jwks.json");
                std::fs::write(&file, jwks(signers).to_string()).expect("write the JWKS");
                command.arg("--jwks-file").arg(file);
            }
            Keys::Url(url) => {
                command.args(["--jwks-url", &url]);
            }
        }
        command.args(extra);
        Self::spawn(command, &scratch.path("server.log"))
    }

    fn spawn(mut command: Command, log: &Path) -> Self {
        let out = std::fs::File::create(log).expect("server log");
        command
            .env("TOOLGATE_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(out);
        let mut child = command.spawn().expect("spawn toolgate serve --http");
        let deadline = Instant::now() + Duration::from_secs(30);
        let addr = loop {
            if let Some(addr) = listening_address(log) {
                break addr;
            }
            if let Some(status) = child.try_wait().expect("try_wait") {
                panic!(
                    "toolgate serve --http exited before listening ({status})\n{}",
                    std::fs::read_to_string(log).unwrap_or_default()
                );
            }
            assert!(
                Instant::now() < deadline,
                "toolgate serve --http did not listen within 30 s\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        Self {
            child,
            addr,
            log: log.to_owned(),
            http: Http::new(),
        }
    }

    fn port(&self) -> u16 {
        self.addr.port()
    }

    /// `http://127.0.0.1:PORT` + `path`.
    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// The default resource (token audience): the endpoint's URL.
    fn resource(&self) -> String {
        self.url("/mcp")
    }

    fn log_text(&self) -> String {
        format!(
            "--- server log ({}) ---\n{}",
            self.log.display(),
            std::fs::read_to_string(&self.log).unwrap_or_default()
        )
    }

    /// Any request; `headers` are sent as given (a `Host` among them replaces the real one).
    fn request(&self, method: &str, path: &str, headers: &[(&str, &str)], body: Vec<u8>) -> Reply {
        self.http
            .send(method, &self.url(path), headers, body)
            .unwrap_or_else(|e| panic!("{method} {path}: {e}\n{}", self.log_text()))
    }

    /// A stateless 2026-07-28 request (`_meta` with the revision, client info and capabilities;
    /// `MCP-Protocol-Version`, `Mcp-Method`, `Mcp-Name` for a call) with `token` as bearer.
    fn rpc(&self, token: Option<&str>, method: &str, params: Value) -> Reply {
        self.rpc_with(token, method, params, &[])
    }

    /// [`Self::rpc`] with extra headers, which replace the computed ones of the same name.
    fn rpc_with(
        &self,
        token: Option<&str>,
        method: &str,
        params: Value,
        extra: &[(&str, &str)],
    ) -> Reply {
        self.rpc_via(&self.http, token, method, params, extra)
    }

    /// [`Self::rpc_with`] through `http`: a client of the calling thread's own, so that several
    /// threads call at once (one client's runtime runs one request at a time).
    fn rpc_via(
        &self,
        http: &Http,
        token: Option<&str>,
        method: &str,
        params: Value,
        extra: &[(&str, &str)],
    ) -> Reply {
        let body = modern_request(method, params);
        let name = body["params"]["name"].as_str().map(str::to_owned);
        let auth = token.map(|t| format!("Bearer {t}"));
        let mut headers: Vec<(&str, &str)> = vec![
            ("MCP-Protocol-Version", MODERN),
            ("Mcp-Method", method),
            ("Accept", "application/json, text/event-stream"),
            ("Content-Type", "application/json"),
        ];
        if method == "tools/call"
            && let Some(name) = &name
        {
            headers.push(("Mcp-Name", name));
        }
        if let Some(auth) = &auth {
            headers.push(("Authorization", auth));
        }
        headers.retain(|(k, _)| !extra.iter().any(|(e, _)| e.eq_ignore_ascii_case(k)));
        headers.extend_from_slice(extra);
        http.send(
            "POST",
            &self.url("/mcp"),
            &headers,
            body.to_string().into_bytes(),
        )
        .unwrap_or_else(|e| panic!("POST /mcp {method}: {e}\n{}", self.log_text()))
    }

    /// A 2026-07-28 `tools/call`; returns the whole reply.
    fn call(&self, token: &str, tool: &str, arguments: Value) -> Reply {
        self.call_opt(Some(token), tool, arguments)
    }

    /// [`Self::call`] with or without a token.
    fn call_opt(&self, token: Option<&str>, tool: &str, arguments: Value) -> Reply {
        self.rpc(
            token,
            "tools/call",
            json!({"name": tool, "arguments": arguments}),
        )
    }

    /// A 2026-07-28 `tools/call` that must be answered 200 with a result; returns the result.
    fn call_result(&self, token: &str, tool: &str, arguments: Value) -> Value {
        let reply = self.call(token, tool, arguments.clone());
        reply.result(&format!("{tool} {arguments}"))
    }

    /// SIGKILL, as a crash (or a machine lost): nothing is flushed, nothing is said.
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM (by pid), then a clean exit within the grace period.
    fn stop(mut self) {
        let pid = self.child.id().to_string();
        let status = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -TERM {pid} failed");
        let exit = wait_for(&mut self.child, Duration::from_secs(15));
        assert!(
            exit.success(),
            "serve exited with {exit}\n{}",
            self.log_text()
        );
    }
}

impl Drop for HttpServer {
    /// A failed test does not leave the server listening (a no-op after `stop`).
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The address of the "toolgate serving Streamable HTTP" line of the server's JSON log.
fn listening_address(log: &Path) -> Option<SocketAddr> {
    let text = std::fs::read_to_string(log).ok()?;
    text.lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .find(|line| line["fields"]["message"] == "toolgate serving Streamable HTTP")
        .and_then(|line| line["fields"]["address"].as_str()?.parse().ok())
}

/// The body of a stateless 2026-07-28 request: `params` with the per-request `_meta`.
fn modern_request(method: &str, mut params: Value) -> Value {
    params["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientInfo": {"name": "toolgate-http-tests", "version": "1.0.0"},
        "io.modelcontextprotocol/clientCapabilities": {},
    });
    json!({"jsonrpc": "2.0", "id": next_id(), "method": method, "params": params})
}

// ---------------------------------------------------------------------------------------------
// HTTP
// ---------------------------------------------------------------------------------------------

/// A plain HTTP/1.1 client (reqwest), driven from synchronous tests.
pub(super) struct Http {
    runtime: tokio::runtime::Runtime,
    client: reqwest::Client,
}

/// What came back.
#[derive(Debug, Clone)]
pub(super) struct Reply {
    pub(super) status: u16,
    headers: Vec<(String, String)>,
    pub(super) body: String,
}

impl Http {
    pub(super) fn new() -> Self {
        Self::build(reqwest::redirect::Policy::default())
    }

    /// A client that hands back redirects instead of following them (a login's `Set-Cookie`
    /// rides on one).
    pub(super) fn without_redirects() -> Self {
        Self::build(reqwest::redirect::Policy::none())
    }

    fn build(redirects: reqwest::redirect::Policy) -> Self {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime");
        // reqwest is built here without a default TLS provider (features unify with the
        // server's); these requests are plain HTTP, but the builder still wants one installed.
        let _ = tokio_rustls::rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .no_proxy()
            .redirect(redirects)
            .timeout(ANSWER_WITHIN)
            .build()
            .expect("HTTP client");
        Self { runtime, client }
    }

    pub(super) fn send(
        &self,
        method: &str,
        url: &str,
        headers: &[(&str, &str)],
        body: Vec<u8>,
    ) -> Result<Reply, reqwest::Error> {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("HTTP method");
        let mut request = self.client.request(method, url);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        if !body.is_empty() {
            request = request.body(body);
        }
        self.runtime.block_on(async {
            let response = request.send().await?;
            let status = response.status().as_u16();
            let headers = response
                .headers()
                .iter()
                .map(|(k, v)| {
                    (
                        k.as_str().to_owned(),
                        String::from_utf8_lossy(v.as_bytes()).into_owned(),
                    )
                })
                .collect();
            let body = response.text().await?;
            Ok(Reply {
                status,
                headers,
                body,
            })
        })
    }
}

impl Reply {
    /// Every value of header `name` (`Set-Cookie` comes once per cookie), case-insensitively.
    pub(super) fn headers_named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> {
        self.headers
            .iter()
            .filter(move |(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The (first) value of header `name`, case-insensitively.
    pub(super) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// `WWW-Authenticate`, or "" when there is none.
    fn challenge(&self) -> &str {
        self.header("www-authenticate").unwrap_or_default()
    }

    /// The body as JSON; for an event stream (legacy sessions answer POSTs with one), the last
    /// JSON-RPC message in it.
    fn json(&self) -> Value {
        let sse = self
            .header("content-type")
            .is_some_and(|t| t.starts_with("text/event-stream"));
        if sse {
            return self
                .body
                .split("\n\n")
                .filter_map(|event| {
                    let data: Vec<&str> = event
                        .lines()
                        .filter_map(|l| l.strip_prefix("data:"))
                        .map(str::trim_start)
                        .collect();
                    serde_json::from_str::<Value>(&data.join("\n")).ok()
                })
                .last()
                .unwrap_or_else(|| {
                    panic!("no JSON message in the event stream: {}", self.summary())
                });
        }
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {}", self.summary()))
    }

    /// The JSON-RPC `result` of a 200 answer.
    fn result(&self, what: &str) -> Value {
        assert_eq!(self.status, 200, "{what}: {}", self.summary());
        let value = self.json();
        assert!(value.get("error").is_none(), "{what}: {}", self.summary());
        value
            .get("result")
            .cloned()
            .unwrap_or_else(|| panic!("{what}: no result: {}", self.summary()))
    }

    /// The JSON-RPC error code of the answer, if it is an error.
    fn rpc_error_code(&self) -> Option<i64> {
        serde_json::from_str::<Value>(&self.body)
            .ok()?
            .pointer("/error/code")?
            .as_i64()
    }

    /// The body with line breaks shown as spaces (event streams are several lines).
    fn flat_body(&self) -> String {
        self.body.split_whitespace().collect::<Vec<_>>().join(" ")
    }

    /// Status, challenge and the first 300 characters of the body, as the seed's table shows them.
    fn summary(&self) -> String {
        let body: String = self.flat_body().chars().take(300).collect();
        format!("{} {} {}", self.status, self.challenge(), body)
    }
}

/// The text of a tool result's content blocks, joined.
fn text_of(result: &Value) -> String {
    result["content"]
        .as_array()
        .map(|blocks| {
            blocks
                .iter()
                .filter_map(|b| b["text"].as_str())
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}

fn is_error(result: &Value) -> bool {
    result["isError"] == true
}

// ---------------------------------------------------------------------------------------------
// Listeners that must not be called, and one that serves a JWKS
// ---------------------------------------------------------------------------------------------

/// A TCP listener on 127.0.0.1 that counts the connections made to it; nothing is ever answered.
/// The SSRF and `jku` cases point at it: a count above zero means the server was tricked into
/// connecting somewhere it must not.
struct Canary {
    port: u16,
    seen: Arc<AtomicUsize>,
    stop: Arc<std::sync::atomic::AtomicBool>,
}

impl Canary {
    fn start() -> Self {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind canary");
        listener.set_nonblocking(true).expect("non-blocking canary");
        let port = listener.local_addr().expect("canary address").port();
        let seen = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (s, st) = (Arc::clone(&seen), Arc::clone(&stop));
        std::thread::spawn(move || {
            while !st.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok(_) => {
                        s.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Self { port, seen, stop }
    }

    fn connections(&self) -> usize {
        // One more poll interval, so that a connection made just now is counted.
        std::thread::sleep(Duration::from_millis(30));
        self.seen.load(Ordering::SeqCst)
    }
}

impl Drop for Canary {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// A tiny HTTP/1.1 server on 127.0.0.1 that answers every GET with the current JWKS document
/// and counts the fetches (the server's JWKS refresh is what is being watched).
struct JwksServer {
    port: u16,
    document: Arc<Mutex<String>>,
    fetches: Arc<AtomicUsize>,
    stop: Arc<std::sync::atomic::AtomicBool>,
}

impl JwksServer {
    fn start(document: &Value) -> Self {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind JWKS listener");
        listener.set_nonblocking(true).expect("non-blocking");
        let port = listener.local_addr().expect("JWKS address").port();
        let document = Arc::new(Mutex::new(document.to_string()));
        let fetches = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (doc, count, st) = (
            Arc::clone(&document),
            Arc::clone(&fetches),
            Arc::clone(&stop),
        );
        std::thread::spawn(move || {
            while !st.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        count.fetch_add(1, Ordering::SeqCst);
                        let body = doc.lock().expect("JWKS document").clone();
                        let _ = answer_once(stream, &body);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Self {
            port,
            document,
            fetches,
            stop,
        }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/jwks.json", self.port)
    }

    fn set(&self, document: &Value) {
        *self.document.lock().expect("JWKS document") = document.to_string();
    }

    fn fetches(&self) -> usize {
        self.fetches.load(Ordering::SeqCst)
    }
}

impl Drop for JwksServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Reads one request's head and answers it with `body` as JSON, then closes the connection.
fn answer_once(mut stream: TcpStream, body: &str) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && head.len() < 16 * 1024 {
        if stream.read(&mut byte)? == 0 {
            break;
        }
        head.push(byte[0]);
    }
    write!(
        stream,
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )?;
    stream.flush()
}

// ---------------------------------------------------------------------------------------------
// Scenario helpers
// ---------------------------------------------------------------------------------------------

/// `policies/helpdesk.toml` with `rate_limit = { burst = 20, every = "2s" }` on `search_tickets`
/// (the seed's bucket), unless the shipped file already sets one there.
fn helpdesk_policy() -> String {
    let text = repo_policy("helpdesk.toml");
    let header = "[tools.search_tickets]";
    let start = text
        .find(header)
        .expect("policies/helpdesk.toml has [tools.search_tickets]");
    let rest = &text[start + header.len()..];
    let section = &rest[..rest.find("\n[").unwrap_or(rest.len())];
    if section.contains("rate_limit") {
        return text;
    }
    text.replacen(
        header,
        &format!("{header}\nrate_limit = {{ burst = 20, every = \"2s\" }}"),
        1,
    )
}

/// `toolgate audit verify DIR/audit.jsonl`: exit 0, and the number of records it checked.
fn assert_audit_verifies(scratch: &Scratch) -> usize {
    let (code, report) = verify_json(&scratch.audit());
    assert_eq!(code, 0, "audit verify: {report}");
    scratch.records().len()
}

/// The audit records of tool `name`, in order.
fn records_of(scratch: &Scratch, name: &str) -> Vec<Value> {
    scratch
        .records()
        .into_iter()
        .filter(|r| r["name"] == name)
        .collect()
}
