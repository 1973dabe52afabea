//! HTTP load generator for `bench/http.sh`: `tools/call` over MCP Streamable HTTP at a fixed rate
//! (open loop) or with a fixed number of requests outstanding (closed loop, saturation), plus the
//! two helpers that make a bearer token for a server with auth on.
//!
//! ```text
//! http_bench keys --dir D [--alg ES256|RS256]
//! http_bench mint --dir D --iss ISS --aud AUD --sub SUB --scope "a b" [--ttl 3600] [--count N]
//! http_bench load --url URL [--token T | --token-file F] --tool NAME --args JSON --mode modern|legacy
//!                 (--rate R | --concurrency C) --duration S [--warmup S] [--connections N]
//!                 [--expect-status S] [--server-pid P] [--timeout S] [--threads N]
//! http_bench interleave --target NAME=URL --target NAME=URL [--target …] [--pid NAME=PID …]
//!                 --tool NAME --args JSON --mode modern|legacy --duration S [--warmup S]
//!                 [--burst K]
//! ```
//!
//! `keys` makes a key pair in-process and writes `D/jwks.json` (the public JWK with `kid`, `alg` and
//! `use: sig`), `D/signing.der` (the private key, PKCS#8 for ES256, PKCS#1 for RS256, mode 0600)
//! and `D/signing.json` (`kid`, `alg`). The private key is never printed. `mint` prints a JWT signed
//! with it, with claims `iss`, `aud`, `sub`, `scope`, `client_id`, `iat`, `nbf`, `exp` and `jti`
//! (`--count N` prints N distinct tokens, one a line).
//!
//! `load` prints one JSON line. Requests:
//! - **modern**: every POST is a self-contained MCP 2026-07-28 request (no handshake, no session):
//!   headers `MCP-Protocol-Version: 2026-07-28`, `Mcp-Method: tools/call`, `Mcp-Name: TOOL`, and
//!   `params._meta` with the protocol version, client info and empty client capabilities (rmcp
//!   requires the version and the capabilities, `RequestMetaObject::missing_required_keys`).
//! - **legacy**: each worker (closed loop) or slot (open loop) first does `initialize` (2025-11-25)
//!   and `notifications/initialized`, then sends its calls with `Mcp-Session-Id` and
//!   `MCP-Protocol-Version: 2025-11-25`; the sessions are deleted at the end.
//!
//! Both send `Authorization: Bearer T` when `--token` is given; with `--token-file F` (one token a
//! line, e.g. from `mint --count N`) request i carries line i mod N. `--args` is the JSON text of the
//! arguments, with every `{i}` replaced by the request's index (which is also its JSON-RPC id). An
//! answer may be `application/json` or `text/event-stream` (the `data:` of the event that holds the
//! JSON-RPC response with our id).
//!
//! **Open loop** (`--rate R`): request `i` is scheduled at `start + i / R`, whatever the answers do,
//! by a thread of its own that sleeps to each scheduled time (`nanosleep`, not tokio's 1 ms timer)
//! and hands the request to the runtime; latency runs from the *scheduled* time, so a server that
//! stalls is charged for every request it delayed (no coordinated omission). At most
//! `--connections` requests are outstanding (on HTTP/1.1 each one holds a connection); a request
//! whose time comes while all are busy is not sent and counts as an error (`errors_unsent`).
//! **Closed loop** (`--concurrency C`): C workers, each sends, waits for the answer, sends the next;
//! latency runs from the send.
//!
//! `--warmup S` runs the same load for S seconds first; only requests scheduled (open loop) or sent
//! (closed loop) in the following `--duration` seconds are counted. Requests still outstanding at
//! the end are waited for (up to `--timeout`).
//!
//! Output fields: `mode`, `rate_target` (null for closed loop), `concurrency`, `connections`,
//! `duration_s`, `sent`, `ok`, `errors` (the sum of `errors_http` (non-2xx), `errors_transport`
//! (connect, I/O, timeout), `errors_jsonrpc` (a JSON-RPC error), `errors_tool` (`isError: true`),
//! `errors_unexpected` (no parsable response, or `structuredContent.status` other than
//! `--expect-status`), `errors_unsent`), `rps` (ok answers per second, over the time from the first
//! counted request to the last counted answer), `p50_ms`, `p90_ms`, `p99_ms`, `max_ms` (ok answers
//! only), `send_lag_p50_ms` and `send_lag_p99_ms` (open loop: how late the client itself started
//! each request after its scheduled time, a part of the latencies above), `sessions` (legacy
//! handshakes done), `client_cpu_s` and, with `--server-pid P`, `server_cpu_s` (CPU time of this
//! process and of P from the start of the counted window until its last answer, from /proc, 10 ms
//! ticks), `machine_cpu_s` (busy time of all CPUs over the same window: what is left after client
//! and server is someone else's), `window_s` (its length). The first error of each kind is printed
//! on stderr; the exit status is 0 whatever the errors (2 when it cannot run).
//!
//! `interleave` calls each `--target` `--burst` times (default 10) per cycle, one call at a time,
//! the targets in a new random order every cycle, and prints one JSON line per target: `target`,
//! `ok`, `errors`, `p50_ms`, `p90_ms`, `p99_ms`, `added_p50_ms` (its p50 minus the first
//! target's), `paired_added_p50_ms` (the median, over the cycles in which every call was answered
//! ok, of its median latency in the cycle minus the first target's in the same cycle), `cycles`,
//! `cpu_us_per_call` (with `--pid NAME=PID`: PID's CPU time over the counted window per call NAME
//! answered) and `window_s`. Put in front of one upstream (direct,
//! then proxies of it), every target meets the same upstream at the same moments, so the upstream's
//! drift over a run, which in separate runs is larger than what a proxy adds, cancels out of the
//! differences.
//!
//! The client runs on one thread by default (`--threads`), so that it takes as little as possible
//! of a small machine's CPUs from the server it measures; `client_cpu_s` says what it took.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail, ensure};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64URL;
use clap::{Args as ClapArgs, Parser, Subcommand, ValueEnum};
use reqwest::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

const MODERN_VERSION: &str = "2026-07-28";
const LEGACY_VERSION: &str = "2025-11-25";

#[derive(Debug, Parser)]
#[command(about = "MCP Streamable HTTP load generator and JWT helper, for bench/http.sh")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Generate a signing key pair: DIR/jwks.json (public), DIR/signing.der + DIR/signing.json.
    Keys(KeysArgs),
    /// Print a JWT signed with the key made by `keys`.
    Mint(MintArgs),
    /// Send tools/call requests and print one JSON line of figures.
    Load(LoadArgs),
    /// One call at a time to each of several servers in turn; one JSON line of figures each.
    Interleave(InterleaveArgs),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Alg {
    #[value(name = "ES256")]
    Es256,
    #[value(name = "RS256")]
    Rs256,
}

#[derive(Debug, ClapArgs)]
struct KeysArgs {
    /// Directory to write the files into (created if missing).
    #[arg(long)]
    dir: PathBuf,
    #[arg(long, value_enum, default_value_t = Alg::Es256)]
    alg: Alg,
}

#[derive(Debug, ClapArgs)]
struct MintArgs {
    /// Directory holding signing.der and signing.json (from `keys`).
    #[arg(long)]
    dir: PathBuf,
    #[arg(long)]
    iss: String,
    #[arg(long)]
    aud: String,
    #[arg(long)]
    sub: String,
    /// Space-separated scopes.
    #[arg(long, default_value = "")]
    scope: String,
    #[arg(long, default_value = "http_bench")]
    client_id: String,
    /// Lifetime in seconds.
    #[arg(long, default_value_t = 3600)]
    ttl: u64,
    /// Print this many tokens, one a line, each with its own `jti` (distinct tokens).
    #[arg(long, default_value_t = 1)]
    count: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    /// Stateless MCP 2026-07-28 requests.
    Modern,
    /// `initialize` (2025-11-25) per worker, then calls in that session.
    Legacy,
}

/// How each call is made, whichever server it goes to (`load` and `interleave`).
#[derive(Debug, ClapArgs)]
struct CallArgs {
    /// Bearer token sent on every request.
    #[arg(long, conflicts_with = "token_file")]
    token: Option<String>,
    /// Bearer tokens, one a line: request i carries line i mod N (e.g. more distinct tokens than
    /// a server's cache of verified tokens holds, so that every request is verified in full).
    #[arg(long)]
    token_file: Option<PathBuf>,
    #[arg(long)]
    tool: String,
    /// Arguments as JSON text; `{i}` is replaced by the request index.
    #[arg(long, default_value = "{}")]
    args: String,
    #[arg(long, value_enum, default_value_t = Mode::Modern)]
    mode: Mode,
    /// A request without an answer after this many seconds is a transport error.
    #[arg(long, default_value_t = 30.0)]
    timeout: f64,
    /// Count a result whose structuredContent.status is not this as an error.
    #[arg(long)]
    expect_status: Option<String>,
}

#[derive(Debug, ClapArgs)]
#[command(group(clap::ArgGroup::new("load").required(true).args(["rate", "concurrency"])))]
struct LoadArgs {
    /// The MCP endpoint, e.g. http://127.0.0.1:8000/mcp.
    #[arg(long)]
    url: String,
    #[command(flatten)]
    call: CallArgs,
    /// Open loop: requests per second, scheduled at fixed intervals.
    #[arg(long)]
    rate: Option<f64>,
    /// Closed loop: workers, each with one request outstanding.
    #[arg(long)]
    concurrency: Option<usize>,
    /// Counted seconds.
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Seconds of the same load before the counted ones.
    #[arg(long, default_value_t = 2.0)]
    warmup: f64,
    /// Open loop: most requests outstanding at once (= HTTP/1.1 connections in use).
    #[arg(long, default_value_t = 256)]
    connections: usize,
    /// Tokio worker threads for the client (1: a current-thread runtime).
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Also report this process's CPU time over the counted window (`server_cpu_s`).
    #[arg(long)]
    server_pid: Option<u32>,
}

#[derive(Debug, ClapArgs)]
struct InterleaveArgs {
    /// A server to call, NAME=URL, two or more; added latency is measured against the first.
    #[arg(long = "target", value_name = "NAME=URL", required = true)]
    targets: Vec<String>,
    /// NAME=PID: report PID's CPU time over the counted window per call answered by target NAME.
    #[arg(long = "pid", value_name = "NAME=PID")]
    pids: Vec<String>,
    #[command(flatten)]
    call: CallArgs,
    /// Counted seconds.
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Seconds of the same calls before the counted ones.
    #[arg(long, default_value_t = 2.0)]
    warmup: f64,
    /// Calls to one target in a row before the next target's turn.
    #[arg(long, default_value_t = 10)]
    burst: usize,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match cli.cmd {
        Cmd::Keys(a) => keys(&a),
        Cmd::Mint(a) => mint(&a),
        Cmd::Load(a) => load(a),
        Cmd::Interleave(a) => interleave(&a),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("http_bench: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}

fn print_line(line: &str) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")?;
    out.flush()?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// keys / mint

fn keys(a: &KeysArgs) -> anyhow::Result<()> {
    std::fs::create_dir_all(&a.dir)
        .with_context(|| format!("cannot create {}", a.dir.display()))?;
    let (der, mut jwk, alg) = match a.alg {
        Alg::Es256 => {
            let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
                .context("cannot generate a P-256 key")?;
            let raw = pair.public_key_raw();
            ensure!(
                raw.len() == 65 && raw[0] == 4,
                "unexpected P-256 public key encoding"
            );
            let jwk = json!({
                "kty": "EC",
                "crv": "P-256",
                "x": B64URL.encode(&raw[1..33]),
                "y": B64URL.encode(&raw[33..65]),
            });
            (pair.serialize_der(), jwk, "ES256")
        }
        Alg::Rs256 => {
            use rsa::Generate as _;
            use rsa::pkcs1::EncodeRsaPrivateKey as _;
            use rsa::traits::PublicKeyParts as _;
            let key = rsa::PrivateKey::generate();
            let der = key.to_pkcs1_der().context("cannot encode the RSA key")?;
            let jwk = json!({
                "kty": "RSA",
                "n": B64URL.encode(key.n().to_be_bytes_trimmed_vartime()),
                "e": B64URL.encode(key.e().to_be_bytes_trimmed_vartime()),
            });
            (der.as_bytes().to_vec(), jwk, "RS256")
        }
    };
    // kid: the RFC 7638 thumbprint (SHA-256 of the required members, sorted, no whitespace).
    let kid = B64URL.encode(Sha256::digest(serde_json::to_vec(&jwk)?));
    let obj = jwk.as_object_mut().context("jwk")?;
    obj.insert("kid".into(), json!(kid));
    obj.insert("alg".into(), json!(alg));
    obj.insert("use".into(), json!("sig"));
    let jwks = json!({ "keys": [jwk] });

    write_private(&a.dir.join("signing.der"), &der)?;
    std::fs::write(
        a.dir.join("signing.json"),
        serde_json::to_vec_pretty(&json!({ "kid": kid, "alg": alg }))?,
    )?;
    std::fs::write(a.dir.join("jwks.json"), serde_json::to_vec_pretty(&jwks)?)?;
    eprintln!(
        "http_bench: wrote {}/jwks.json (kid {kid}, {alg}) and the private key",
        a.dir.display()
    );
    Ok(())
}

fn write_private(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    f.write_all(bytes)?;
    Ok(())
}

fn mint(a: &MintArgs) -> anyhow::Result<()> {
    let meta: Value = serde_json::from_slice(
        &std::fs::read(a.dir.join("signing.json")).context("cannot read signing.json")?,
    )?;
    let der = std::fs::read(a.dir.join("signing.der")).context("cannot read signing.der")?;
    let kid = meta["kid"].as_str().context("signing.json: no kid")?;
    let (alg, key) = match meta["alg"].as_str() {
        Some("ES256") => (
            jsonwebtoken::Algorithm::ES256,
            jsonwebtoken::EncodingKey::from_ec_der(&der),
        ),
        Some("RS256") => (
            jsonwebtoken::Algorithm::RS256,
            jsonwebtoken::EncodingKey::from_rsa_der(&der),
        ),
        other => bail!("signing.json: unsupported alg {other:?}"),
    };
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    let mut header = jsonwebtoken::Header::new(alg);
    header.kid = Some(kid.to_owned());
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for n in 0..a.count.max(1) {
        let claims = json!({
            "iss": a.iss,
            "aud": a.aud,
            "sub": a.sub,
            "scope": a.scope,
            "client_id": a.client_id,
            "iat": now,
            "nbf": now,
            "exp": now + a.ttl,
            "jti": format!("http-bench-{now}-{n}"),
        });
        let token =
            jsonwebtoken::encode(&header, &claims, &key).context("cannot sign the token")?;
        writeln!(out, "{token}")?;
    }
    out.flush()?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// load

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Ok,
    Http,
    Transport,
    JsonRpc,
    Tool,
    Unexpected,
}

const KINDS: [Outcome; 6] = [
    Outcome::Ok,
    Outcome::Http,
    Outcome::Transport,
    Outcome::JsonRpc,
    Outcome::Tool,
    Outcome::Unexpected,
];

/// What every request needs, shared by all tasks.
#[derive(Debug)]
struct Target {
    client: reqwest::Client,
    url: String,
    mode: Mode,
    /// Headers of every tools/call (per mode), without the session.
    headers: HeaderMap,
    /// `Bearer …` values; request i carries `tokens[i % len]`.
    tokens: Vec<HeaderValue>,
    tool_json: String,
    args_template: String,
    meta_json: String,
    expect_status: Option<String>,
    /// First error of each kind already printed.
    reported: [AtomicBool; 6],
    sessions: AtomicUsize,
}

#[derive(Debug, Default)]
struct Stats {
    latencies_ns: Vec<u64>,
    /// Open loop: from a request's scheduled time to the moment its task starts sending.
    lags_ns: Vec<u64>,
    counts: [u64; 6],
    unsent: u64,
    last_done: Option<Instant>,
}

/// The one HTTP client of a run: HTTP/1.1 with keep-alive, no proxy, `TCP_NODELAY`.
fn http_client(a: &CallArgs) -> anyhow::Result<reqwest::Client> {
    // Feature unification gives this workspace's reqwest `rustls-no-provider` (the server crate
    // wants it): it panics without a process-wide provider even for plain http://.
    let _ = tokio_rustls::rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .no_proxy()
        .tcp_nodelay(true)
        .timeout(Duration::from_secs_f64(a.timeout))
        .build()
        .context("cannot build the HTTP client")
}

impl Target {
    /// The calls `a` describes, to the endpoint `url`.
    fn new(a: &CallArgs, url: String, client: reqwest::Client) -> anyhow::Result<Self> {
        let template: Value = serde_json::from_str(&a.args.replace("{i}", "0"))
            .context("--args is not JSON (with {i} replaced by 0)")?;
        ensure!(template.is_object(), "--args must be a JSON object");
        let raw: Vec<String> = match (&a.token, &a.token_file) {
            (Some(t), _) => vec![t.clone()],
            (None, Some(f)) => std::fs::read_to_string(f)
                .with_context(|| format!("cannot read {}", f.display()))?
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(str::to_owned)
                .collect(),
            (None, None) => Vec::new(),
        };
        ensure!(
            a.token_file.is_none() || !raw.is_empty(),
            "--token-file holds no token"
        );
        let tokens = raw
            .iter()
            .map(|t| HeaderValue::from_str(&format!("Bearer {t}")))
            .collect::<Result<Vec<_>, _>>()
            .context("a token is not a valid header value")?;
        let mut target = Self {
            client,
            url,
            mode: a.mode,
            headers: HeaderMap::new(),
            tokens,
            tool_json: Value::from(a.tool.clone()).to_string(),
            args_template: a.args.clone(),
            meta_json: json!({
                "io.modelcontextprotocol/protocolVersion": MODERN_VERSION,
                "io.modelcontextprotocol/clientInfo": {"name": "http_bench", "version": "0"},
                "io.modelcontextprotocol/clientCapabilities": {}
            })
            .to_string(),
            expect_status: a.expect_status.clone(),
            reported: Default::default(),
            sessions: AtomicUsize::new(0),
        };
        let mut h = target.base_headers();
        match a.mode {
            Mode::Modern => {
                h.insert(
                    HeaderName::from_static("mcp-protocol-version"),
                    HeaderValue::from_static(MODERN_VERSION),
                );
                h.insert(
                    HeaderName::from_static("mcp-method"),
                    HeaderValue::from_static("tools/call"),
                );
                h.insert(
                    HeaderName::from_static("mcp-name"),
                    HeaderValue::from_str(&a.tool).context("--tool is not a valid header value")?,
                );
            }
            Mode::Legacy => {
                h.insert(
                    HeaderName::from_static("mcp-protocol-version"),
                    HeaderValue::from_static(LEGACY_VERSION),
                );
            }
        }
        target.headers = h;
        Ok(target)
    }

    fn body(&self, i: u64) -> String {
        let args = self.args_template.replace("{i}", &i.to_string());
        match self.mode {
            Mode::Modern => format!(
                r#"{{"jsonrpc":"2.0","id":{i},"method":"tools/call","params":{{"name":{},"arguments":{args},"_meta":{}}}}}"#,
                self.tool_json, self.meta_json
            ),
            Mode::Legacy => format!(
                r#"{{"jsonrpc":"2.0","id":{i},"method":"tools/call","params":{{"name":{},"arguments":{args}}}}}"#,
                self.tool_json
            ),
        }
    }

    fn report(&self, kind: Outcome, detail: &str) {
        let idx = KINDS.iter().position(|k| *k == kind).unwrap_or(0);
        if !self.reported[idx].swap(true, Ordering::Relaxed) {
            let detail: String = detail.chars().take(400).collect();
            eprintln!("http_bench: first {kind:?} error: {detail}");
        }
    }

    fn base_headers(&self) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        h.insert(
            ACCEPT,
            HeaderValue::from_static("application/json, text/event-stream"),
        );
        if let Some(t) = self.tokens.first() {
            h.insert(AUTHORIZATION, t.clone());
        }
        h
    }

    /// Legacy handshake: `initialize` then `notifications/initialized`; returns the session id.
    async fn initialize(&self) -> Result<Option<HeaderValue>, (Outcome, String)> {
        let body = json!({
            "jsonrpc": "2.0", "id": "init", "method": "initialize",
            "params": {
                "protocolVersion": LEGACY_VERSION,
                "capabilities": {},
                "clientInfo": {"name": "http_bench", "version": "0"}
            }
        });
        let resp = self
            .client
            .post(&self.url)
            .headers(self.base_headers())
            .body(body.to_string())
            .send()
            .await
            .map_err(|e| (Outcome::Transport, format!("initialize: {e}")))?;
        let session = resp.headers().get("mcp-session-id").cloned();
        let status = resp.status();
        let ctype = content_type(resp.headers());
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| (Outcome::Transport, format!("initialize: {e}")))?;
        if !status.is_success() {
            return Err((
                Outcome::Http,
                format!(
                    "initialize: HTTP {status}: {}",
                    String::from_utf8_lossy(&bytes)
                ),
            ));
        }
        match find_response(&bytes, &ctype, &json!("init")) {
            Some(v) if v.get("result").is_some() => {}
            _ => {
                return Err((
                    Outcome::JsonRpc,
                    format!("initialize: {}", String::from_utf8_lossy(&bytes)),
                ));
            }
        }
        let mut h = self.base_headers();
        h.insert(
            HeaderName::from_static("mcp-protocol-version"),
            HeaderValue::from_static(LEGACY_VERSION),
        );
        if let Some(s) = &session {
            h.insert(HeaderName::from_static("mcp-session-id"), s.clone());
        }
        let resp = self
            .client
            .post(&self.url)
            .headers(h)
            .body(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#)
            .send()
            .await
            .map_err(|e| (Outcome::Transport, format!("initialized: {e}")))?;
        let status = resp.status();
        let _ = resp.bytes().await;
        if !status.is_success() {
            return Err((
                Outcome::Http,
                format!("notifications/initialized: HTTP {status}"),
            ));
        }
        self.sessions.fetch_add(1, Ordering::Relaxed);
        Ok(session)
    }

    async fn delete_session(&self, session: &HeaderValue) {
        let mut h = self.base_headers();
        h.insert(
            HeaderName::from_static("mcp-protocol-version"),
            HeaderValue::from_static(LEGACY_VERSION),
        );
        h.insert(HeaderName::from_static("mcp-session-id"), session.clone());
        let _ = self.client.delete(&self.url).headers(h).send().await;
    }

    /// One tools/call; `session` is the legacy session (initialised on first use).
    async fn call(&self, i: u64, session: &mut Option<Option<HeaderValue>>) -> Outcome {
        let mut headers = self.headers.clone();
        if self.tokens.len() > 1 {
            let t = &self.tokens[(i % self.tokens.len() as u64) as usize];
            headers.insert(AUTHORIZATION, t.clone());
        }
        if self.mode == Mode::Legacy {
            if session.is_none() {
                match self.initialize().await {
                    Ok(s) => *session = Some(s),
                    Err((kind, detail)) => {
                        self.report(kind, &detail);
                        return kind;
                    }
                }
            }
            if let Some(Some(s)) = session {
                headers.insert(HeaderName::from_static("mcp-session-id"), s.clone());
            }
        }
        let resp = match self
            .client
            .post(&self.url)
            .headers(headers)
            .body(self.body(i))
            .send()
            .await
        {
            Ok(r) => r,
            Err(e) => {
                self.report(Outcome::Transport, &format!("{e:?}"));
                return Outcome::Transport;
            }
        };
        let status = resp.status();
        let ctype = content_type(resp.headers());
        let bytes = match resp.bytes().await {
            Ok(b) => b,
            Err(e) => {
                self.report(Outcome::Transport, &format!("reading the body: {e:?}"));
                return Outcome::Transport;
            }
        };
        if !status.is_success() {
            self.report(
                Outcome::Http,
                &format!("HTTP {status}: {}", String::from_utf8_lossy(&bytes)),
            );
            return Outcome::Http;
        }
        let Some(msg) = find_response(&bytes, &ctype, &json!(i)) else {
            self.report(
                Outcome::Unexpected,
                &format!(
                    "no response with id {i} in: {}",
                    String::from_utf8_lossy(&bytes)
                ),
            );
            return Outcome::Unexpected;
        };
        if msg.get("error").is_some() {
            self.report(Outcome::JsonRpc, &msg.to_string());
            return Outcome::JsonRpc;
        }
        let result = &msg["result"];
        if result["isError"] == json!(true) {
            self.report(Outcome::Tool, &msg.to_string());
            return Outcome::Tool;
        }
        if let Some(want) = &self.expect_status
            && result["structuredContent"]["status"].as_str() != Some(want)
        {
            self.report(Outcome::Unexpected, &msg.to_string());
            return Outcome::Unexpected;
        }
        Outcome::Ok
    }
}

fn content_type(h: &HeaderMap) -> String {
    h.get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_ascii_lowercase()
}

/// The JSON-RPC response with `id` in a JSON body or an SSE stream.
fn find_response(body: &[u8], ctype: &str, id: &Value) -> Option<Value> {
    let matches = |v: &Value| {
        v.get("id") == Some(id) && (v.get("result").is_some() || v.get("error").is_some())
    };
    if ctype.starts_with("text/event-stream") {
        let text = std::str::from_utf8(body).ok()?;
        let mut data = String::new();
        let mut found = None;
        let mut flush = |data: &mut String| {
            if !data.is_empty() {
                if let Ok(v) = serde_json::from_str::<Value>(data)
                    && matches(&v)
                {
                    found = Some(v);
                }
                data.clear();
            }
        };
        for line in text.lines() {
            if line.is_empty() {
                flush(&mut data);
            } else if let Some(rest) = line.strip_prefix("data:") {
                if !data.is_empty() {
                    data.push('\n');
                }
                data.push_str(rest.strip_prefix(' ').unwrap_or(rest));
            }
        }
        flush(&mut data);
        found
    } else {
        let v: Value = serde_json::from_slice(body).ok()?;
        matches(&v).then_some(v)
    }
}

/// CPU seconds (user + system, clock ticks of 10 ms) of this process, of `--server-pid` (NaN if
/// not given) and of the whole machine (every CPU's busy time), from /proc.
fn cpu_seconds(server: Option<u32>) -> [f64; 3] {
    [
        proc_cpu("/proc/self/stat"),
        server.map_or(f64::NAN, |p| proc_cpu(&format!("/proc/{p}/stat"))),
        machine_busy(),
    ]
}

/// Busy time of all CPUs so far: CPUs × uptime minus idle and iowait. Those two come from the
/// kernel's exact idle accounting; the busy fields of /proc/stat are tick samples, which under-count
/// short bursts of work such as these requests.
fn machine_busy() -> f64 {
    let (Ok(stat), Ok(uptime)) = (
        std::fs::read_to_string("/proc/stat"),
        std::fs::read_to_string("/proc/uptime"),
    ) else {
        return f64::NAN;
    };
    let Some(up) = uptime
        .split_whitespace()
        .next()
        .and_then(|x| x.parse::<f64>().ok())
    else {
        return f64::NAN;
    };
    let cpus = stat
        .lines()
        .filter(|l| l.starts_with("cpu") && !l.starts_with("cpu "))
        .count() as f64;
    let Some(line) = stat.lines().find(|l| l.starts_with("cpu ")) else {
        return f64::NAN;
    };
    // user nice system idle iowait ...
    let idle: f64 = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse::<f64>().ok())
        .skip(3)
        .take(2)
        .sum();
    cpus * up - idle / 100.0
}

fn proc_cpu(path: &str) -> f64 {
    let Ok(stat) = std::fs::read_to_string(path) else {
        return f64::NAN;
    };
    let Some(after) = stat.rfind(')').map(|p| &stat[p + 2..]) else {
        return f64::NAN;
    };
    let f: Vec<&str> = after.split(' ').collect();
    // Fields 14 and 15 of stat(5) (utime, stime); `after` starts at field 3.
    let ticks: f64 = f
        .get(11..13)
        .map(|s| s.iter().filter_map(|x| x.parse::<f64>().ok()).sum())
        .unwrap_or(f64::NAN);
    ticks / 100.0
}

fn percentile_ms(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    let ns = sorted[rank.clamp(1, sorted.len()) - 1] as f64;
    (ns / 1e6 * 1000.0).round() / 1000.0
}

fn load(a: LoadArgs) -> anyhow::Result<()> {
    ensure!(
        a.duration > 0.0 && a.warmup >= 0.0,
        "bad --duration/--warmup"
    );
    ensure!(a.threads >= 1, "--threads must be at least 1");
    if let Some(r) = a.rate {
        ensure!(r > 0.0, "--rate must be positive");
        ensure!(a.connections >= 1, "--connections must be at least 1");
    }
    if let Some(c) = a.concurrency {
        ensure!(c >= 1, "--concurrency must be at least 1");
    }
    let target = Arc::new(Target::new(&a.call, a.url.clone(), http_client(&a.call)?)?);

    let rt = if a.threads == 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(a.threads)
            .enable_all()
            .build()?
    };
    let stats = Arc::new(Mutex::new(Stats::default()));
    let warmup = Duration::from_secs_f64(a.warmup);
    let duration = Duration::from_secs_f64(a.duration);
    let plan = Plan {
        warmup,
        duration,
        server: a.server_pid,
    };

    let (measure_start, cpu_used, wall_end) = if let Some(rate) = a.rate {
        open_loop(&rt, &target, &stats, rate, a.connections, &plan)?
    } else {
        let c = a.concurrency.context("--rate or --concurrency")?;
        rt.block_on(closed_loop(&target, &stats, c, &plan))?
    };

    let mut st = std::mem::take(&mut *stats.lock().map_err(|_| anyhow::anyhow!("poisoned"))?);
    st.latencies_ns.sort_unstable();
    st.lags_ns.sort_unstable();
    let lag = |p: f64| {
        if a.rate.is_some() {
            json!(percentile_ms(&st.lags_ns, p))
        } else {
            Value::Null
        }
    };
    let [ok, http, transport, jsonrpc, tool, unexpected] = st.counts;
    let errors = http + transport + jsonrpc + tool + unexpected + st.unsent;
    let sent = ok + http + transport + jsonrpc + tool + unexpected;
    let end = st.last_done.unwrap_or(wall_end).max(wall_end);
    let secs = end.duration_since(measure_start).as_secs_f64();
    let rps = if secs > 0.0 { ok as f64 / secs } else { 0.0 };
    let out = json!({
        "mode": match a.call.mode { Mode::Modern => "modern", Mode::Legacy => "legacy" },
        "rate_target": a.rate,
        "concurrency": a.concurrency,
        "connections": if a.rate.is_some() { a.connections } else { a.concurrency.unwrap_or(0) },
        "duration_s": a.duration,
        "sent": sent,
        "ok": ok,
        "errors": errors,
        "errors_http": http,
        "errors_transport": transport,
        "errors_jsonrpc": jsonrpc,
        "errors_tool": tool,
        "errors_unexpected": unexpected,
        "errors_unsent": st.unsent,
        "rps": (rps * 10.0).round() / 10.0,
        "p50_ms": percentile_ms(&st.latencies_ns, 0.50),
        "p90_ms": percentile_ms(&st.latencies_ns, 0.90),
        "p99_ms": percentile_ms(&st.latencies_ns, 0.99),
        "max_ms": percentile_ms(&st.latencies_ns, 1.0),
        "send_lag_p50_ms": lag(0.50),
        "send_lag_p99_ms": lag(0.99),
        "sessions": target.sessions.load(Ordering::Relaxed),
        "client_cpu_s": round2(cpu_used[0]),
        "server_cpu_s": if cpu_used[1].is_nan() { Value::Null } else { json!(round2(cpu_used[1])) },
        "machine_cpu_s": if cpu_used[2].is_nan() { Value::Null } else { json!(round2(cpu_used[2])) },
        "window_s": round2(secs),
    });
    print_line(&out.to_string())
}

/// The timing of a load run.
#[derive(Debug, Clone, Copy)]
struct Plan {
    warmup: Duration,
    duration: Duration,
    /// `--server-pid`.
    server: Option<u32>,
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

fn record(stats: &Mutex<Stats>, outcome: Outcome, latency: Duration) {
    let done = Instant::now();
    if let Ok(mut st) = stats.lock() {
        let idx = KINDS.iter().position(|k| *k == outcome).unwrap_or(0);
        st.counts[idx] += 1;
        if outcome == Outcome::Ok {
            st.latencies_ns
                .push(u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX));
        }
        st.last_done = Some(st.last_done.map_or(done, |d| d.max(done)));
    }
}

/// Open loop. Returns (start of the counted window, client CPU seconds in it, end of schedule).
fn open_loop(
    rt: &tokio::runtime::Runtime,
    target: &Arc<Target>,
    stats: &Arc<Mutex<Stats>>,
    rate: f64,
    connections: usize,
    plan: &Plan,
) -> anyhow::Result<(Instant, [f64; 3], Instant)> {
    let Plan {
        warmup,
        duration,
        server,
    } = *plan;
    // Free slots, used as a stack so that a low rate keeps reusing the same few connections.
    // A slot carries its legacy session (None: not initialised yet).
    type Slot = Option<Option<HeaderValue>>;
    let free: Arc<Mutex<Vec<Slot>>> = Arc::new(Mutex::new(vec![None; connections]));
    let outstanding = Arc::new(AtomicUsize::new(0));
    let handle = rt.handle().clone();
    let cpu_at_measure = Arc::new(Mutex::new([f64::NAN; 3]));

    let start = Instant::now() + Duration::from_millis(20);
    let measure_start = start + warmup;
    let end = measure_start + duration;
    let interval = 1.0 / rate;

    let dispatcher = {
        let (target, stats, free, outstanding, cpu_at_measure) = (
            target.clone(),
            stats.clone(),
            free.clone(),
            outstanding.clone(),
            cpu_at_measure.clone(),
        );
        std::thread::Builder::new()
            .name("dispatch".into())
            .spawn(move || {
                let mut i: u64 = 0;
                let mut measuring = false;
                loop {
                    let at = start + Duration::from_secs_f64(i as f64 * interval);
                    if at >= end {
                        break;
                    }
                    let now = Instant::now();
                    if at > now {
                        std::thread::sleep(at - now);
                    }
                    let counted = at >= measure_start;
                    if counted && !measuring {
                        measuring = true;
                        if let Ok(mut c) = cpu_at_measure.lock() {
                            *c = cpu_seconds(server);
                        }
                    }
                    let slot = free.lock().ok().and_then(|mut f| f.pop());
                    match slot {
                        None => {
                            if counted && let Ok(mut st) = stats.lock() {
                                st.unsent += 1;
                            }
                        }
                        Some(mut slot) => {
                            outstanding.fetch_add(1, Ordering::AcqRel);
                            let (target, stats, free, outstanding) = (
                                target.clone(),
                                stats.clone(),
                                free.clone(),
                                outstanding.clone(),
                            );
                            handle.spawn(async move {
                                let lag = at.elapsed();
                                let outcome = target.call(i, &mut slot).await;
                                if counted {
                                    record(&stats, outcome, at.elapsed());
                                    if let Ok(mut st) = stats.lock() {
                                        st.lags_ns.push(
                                            u64::try_from(lag.as_nanos()).unwrap_or(u64::MAX),
                                        );
                                    }
                                }
                                if let Ok(mut f) = free.lock() {
                                    f.push(slot);
                                }
                                outstanding.fetch_sub(1, Ordering::AcqRel);
                            });
                        }
                    }
                    i += 1;
                }
            })?
    };

    let cpu_end = rt.block_on(async {
        // Drive the runtime while the dispatcher runs, then until every request is answered.
        while !dispatcher.is_finished() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        while outstanding.load(Ordering::Acquire) > 0 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let cpu_end = cpu_seconds(server);
        let sessions: Vec<HeaderValue> = free
            .lock()
            .map(|f| f.iter().filter_map(|s| s.clone().flatten()).collect())
            .unwrap_or_default();
        for s in &sessions {
            target.delete_session(s).await;
        }
        cpu_end
    });
    dispatcher
        .join()
        .map_err(|_| anyhow::anyhow!("dispatcher panicked"))?;
    let cpu_start = cpu_at_measure.lock().map(|c| *c).unwrap_or([f64::NAN; 3]);
    Ok((measure_start, sub(cpu_end, cpu_start), end))
}

/// Closed loop: `c` workers. Returns (start of the counted window, client CPU seconds, end).
async fn closed_loop(
    target: &Arc<Target>,
    stats: &Arc<Mutex<Stats>>,
    c: usize,
    plan: &Plan,
) -> anyhow::Result<(Instant, [f64; 3], Instant)> {
    let Plan {
        warmup,
        duration,
        server,
    } = *plan;
    // Legacy: every worker's handshake before the clock starts.
    let mut sessions: Vec<Option<Option<HeaderValue>>> = vec![None; c];
    if target.mode == Mode::Legacy {
        for s in &mut sessions {
            match target.initialize().await {
                Ok(v) => *s = Some(v),
                Err((_, detail)) => bail!("legacy handshake failed: {detail}"),
            }
        }
    }
    let next = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let measure_start = start + warmup;
    let end = measure_start + duration;
    let cpu_start = Arc::new(Mutex::new([f64::NAN; 3]));
    let mut tasks = tokio::task::JoinSet::new();
    for mut session in sessions {
        let (target, stats, next, cpu_start) = (
            target.clone(),
            stats.clone(),
            next.clone(),
            cpu_start.clone(),
        );
        tasks.spawn(async move {
            loop {
                let sent = Instant::now();
                if sent >= end {
                    break;
                }
                let counted = sent >= measure_start;
                if counted
                    && let Ok(mut c) = cpu_start.lock()
                    && c[0].is_nan()
                {
                    *c = cpu_seconds(server);
                }
                let i = next.fetch_add(1, Ordering::Relaxed);
                let outcome = target.call(i, &mut session).await;
                if counted {
                    record(&stats, outcome, sent.elapsed());
                }
            }
            session
        });
    }
    let mut open = Vec::new();
    while let Some(r) = tasks.join_next().await {
        if let Some(Some(s)) = r? {
            open.push(s);
        }
    }
    let cpu_end = cpu_seconds(server);
    for s in &open {
        target.delete_session(s).await;
    }
    let cpu_start = cpu_start.lock().map(|c| *c).unwrap_or([f64::NAN; 3]);
    Ok((measure_start, sub(cpu_end, cpu_start), end))
}

fn sub(a: [f64; 3], b: [f64; 3]) -> [f64; 3] {
    [a[0] - b[0], a[1] - b[1], a[2] - b[2]]
}

// ---------------------------------------------------------------------------------------------
// interleave

/// What one target of `interleave` answered in the counted window.
#[derive(Debug, Default)]
struct Tally {
    latencies_ns: Vec<u64>,
    /// Per complete cycle (every call answered ok): the median of this target's latencies in it
    /// minus the first target's.
    paired_ns: Vec<i64>,
    counts: [u64; 6],
}

/// One call at a time, `--burst` calls to each target in turn, in a new random order every cycle:
/// every target meets the same upstream, the same machine and the same moment, so what drifts over
/// a run (an upstream warming up, a noisy neighbour) falls on all of them alike and cancels out of
/// the differences. The burst keeps a target's process as warm as in a loop of its own (one call
/// at a time to each of six processes in turn left each of them colder: 20% more CPU per call).
/// Prints one JSON line per target.
fn interleave(a: &InterleaveArgs) -> anyhow::Result<()> {
    ensure!(
        a.duration > 0.0 && a.warmup >= 0.0,
        "bad --duration/--warmup"
    );
    ensure!(a.targets.len() >= 2, "give two --target or more");
    ensure!(a.burst >= 1, "--burst must be at least 1");
    let client = http_client(&a.call)?;
    let mut names = Vec::new();
    let mut targets = Vec::new();
    for t in &a.targets {
        let (name, url) = t
            .split_once('=')
            .with_context(|| format!("--target {t}: NAME=URL"))?;
        ensure!(!names.contains(&name), "--target {name} given twice");
        names.push(name);
        targets.push(Target::new(&a.call, url.to_owned(), client.clone())?);
    }
    let mut pids: Vec<Option<u32>> = vec![None; names.len()];
    for p in &a.pids {
        let (name, pid) = p
            .split_once('=')
            .with_context(|| format!("--pid {p}: NAME=PID"))?;
        let i = names
            .iter()
            .position(|n| *n == name)
            .with_context(|| format!("--pid {p}: no --target {name}"))?;
        pids[i] = Some(pid.parse().with_context(|| format!("--pid {p}: PID"))?);
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let plan = Plan {
        warmup: Duration::from_secs_f64(a.warmup),
        duration: Duration::from_secs_f64(a.duration),
        server: None,
    };
    let (mut tallies, cpu, window) =
        rt.block_on(interleave_loop(&targets, &pids, a.burst, &plan))?;
    for t in &mut tallies {
        t.latencies_ns.sort_unstable();
        t.paired_ns.sort_unstable();
    }
    let cycles = tallies[1].paired_ns.len();
    let first_p50 = percentile_ms(&tallies[0].latencies_ns, 0.50);
    for ((name, t), cpu) in names.iter().zip(tallies).zip(cpu) {
        let ok = t.counts[0];
        let p50 = percentile_ms(&t.latencies_ns, 0.50);
        let paired = t
            .paired_ns
            .get(t.paired_ns.len() / 2)
            .map_or(Value::Null, |ns| json!((*ns as f64 / 1e3).round() / 1e3));
        let out = json!({
            "target": name,
            "ok": ok,
            "errors": t.counts[1..].iter().sum::<u64>(),
            "p50_ms": p50,
            "p90_ms": percentile_ms(&t.latencies_ns, 0.90),
            "p99_ms": percentile_ms(&t.latencies_ns, 0.99),
            "added_p50_ms": ((p50 - first_p50) * 1000.0).round() / 1000.0,
            "paired_added_p50_ms": paired,
            "cycles": cycles,
            "cpu_us_per_call": if cpu.is_nan() || ok == 0 {
                Value::Null
            } else {
                json!((cpu * 1e6 / ok as f64).round())
            },
            "window_s": round2(window),
        });
        print_line(&out.to_string())?;
    }
    Ok(())
}

/// The calls of [`interleave`]: returns each target's tally, the CPU seconds of its `--pid` over
/// the counted window (NaN without one) and the window's length in seconds.
async fn interleave_loop(
    targets: &[Target],
    pids: &[Option<u32>],
    burst: usize,
    plan: &Plan,
) -> anyhow::Result<(Vec<Tally>, Vec<f64>, f64)> {
    let n = targets.len();
    let mut sessions: Vec<Option<Option<HeaderValue>>> = vec![None; n];
    if targets[0].mode == Mode::Legacy {
        for (t, s) in targets.iter().zip(&mut sessions) {
            match t.initialize().await {
                Ok(v) => *s = Some(v),
                Err((_, detail)) => bail!("legacy handshake with {} failed: {detail}", t.url),
            }
        }
    }
    let cpu_now = || -> Vec<f64> {
        pids.iter()
            .map(|p| p.map_or(f64::NAN, |p| proc_cpu(&format!("/proc/{p}/stat"))))
            .collect()
    };
    let mut tallies: Vec<Tally> = (0..n).map(|_| Tally::default()).collect();
    let mut order: Vec<usize> = (0..n).collect();
    // xorshift64, seeded from the clock: the order only has to differ from cycle to cycle.
    let mut seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64 | 1);
    let mut cpu_start = None;
    let start = Instant::now();
    let measure_start = start + plan.warmup;
    let end = measure_start + plan.duration;
    let mut i = 0;
    // Each target's latencies in the current cycle, for its median.
    let mut cycle: Vec<Vec<u64>> = vec![Vec::with_capacity(burst); n];
    loop {
        let now = Instant::now();
        if now >= end {
            break;
        }
        let counted = now >= measure_start;
        if counted && cpu_start.is_none() {
            cpu_start = Some((cpu_now(), now));
        }
        for k in (1..n).rev() {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            order.swap(k, (seed % (k as u64 + 1)) as usize);
        }
        let mut complete = true;
        for &t in &order {
            cycle[t].clear();
            for _ in 0..burst {
                let sent = Instant::now();
                let outcome = targets[t].call(i, &mut sessions[t]).await;
                let ns = u64::try_from(sent.elapsed().as_nanos()).unwrap_or(u64::MAX);
                i += 1;
                if !counted {
                    continue;
                }
                let kind = KINDS.iter().position(|k| *k == outcome).unwrap_or(0);
                tallies[t].counts[kind] += 1;
                if outcome == Outcome::Ok {
                    tallies[t].latencies_ns.push(ns);
                    cycle[t].push(ns);
                } else {
                    complete = false;
                }
            }
        }
        if counted && complete {
            let mut medians = cycle.iter_mut().map(|l| {
                l.sort_unstable();
                i128::from(l[l.len() / 2])
            });
            let first = medians.next().unwrap_or_default();
            for (tally, median) in tallies.iter_mut().skip(1).zip(medians) {
                tally
                    .paired_ns
                    .push(i64::try_from(median - first).unwrap_or(i64::MAX));
            }
        }
    }
    let (cpu_start, at) = cpu_start.unwrap_or_else(|| (cpu_now(), Instant::now()));
    let cpu: Vec<f64> = cpu_now()
        .iter()
        .zip(cpu_start)
        .map(|(e, s)| e - s)
        .collect();
    let window = at.elapsed().as_secs_f64();
    for (t, s) in targets.iter().zip(&sessions) {
        if let Some(Some(s)) = s {
            t.delete_session(s).await;
        }
    }
    Ok((tallies, cpu, window))
}
