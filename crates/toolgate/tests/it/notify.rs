//! Approval notifications end to end (issue 14): a call through the gate opens an approval, and a
//! receiver listening on a real socket on 127.0.0.1 (a small HTTP/1.1 server written here) gets the
//! signed webhook or the Slack-compatible message; a dead receiver does not slow the call, a failing
//! one is retried, and a retry of the same pending call announces nothing new.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rmcp::ServiceExt;
use serde_json::{Value, json};
use tempfile::TempDir;
use tokio::io::{
    AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, DuplexStream, Lines, ReadHalf,
    WriteHalf,
};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use toolgate::GateServer;
use toolgate::notify::{Config, Console, Notifier, Retry, Slack, Webhook};
use toolgate::server::Gate;
use toolgate_core::policy::Policy;
use toolgate_core::principal::Principal;
use toolgate_core::redact::Redactor;
use toolgate_core::secret::Secret;
use toolgate_core::time::now_ms;
use toolgate_demos::Orders;
use toolgate_store::approval::ApprovalStore;
use toolgate_store::journal::Journal;

/// Registered with the redactor and sent in an argument: no receiver may see it.
const REGISTERED: &str = "correct-horse-battery-staple-42";
/// The webhook's signing secret, as its file would hold it (trimmed by the caller).
const SECRET: &str = "whsec_3f9a0c1b7d2e4f6081a2b3c4d5e6f708";

/// `send_email` to an address outside example.com escalates to `high`: a person must approve it.
/// `approval_wait = "1ms"`: the call answers pending after one look at its row (the corridor looks
/// every 200 ms), the same for every call, so a notifier's cost shows as a difference.
const POLICY: &str = r#"
version = 2
name = "orders"

[defaults]
tier = "blocked"
approval_ttl = "5m"
approval_wait = "1ms"
timeout = "30s"

[tools.send_email]
tier = "low"
escalate = [{ when = "!args.to.endsWith('@example.com')", tier = "high" }]
"#;

/// How a receiver answers one request.
#[derive(Clone, Copy, Debug)]
enum Behaviour {
    Status(u16),
    /// Reads the request and never answers (the connection stays open).
    Silent,
}

/// One request a receiver got.
#[derive(Clone, Debug)]
struct Received {
    method: String,
    path: String,
    /// Lowercased names.
    headers: BTreeMap<String, String>,
    body: Vec<u8>,
    at: Instant,
}

impl Received {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("a JSON body")
    }

    fn header(&self, name: &str) -> &str {
        self.headers.get(name).map_or_else(
            || panic!("no {name} header: {:?}", self.headers),
            String::as_str,
        )
    }
}

/// A webhook receiver on 127.0.0.1: answers in the order of its script, then with the default.
#[derive(Clone)]
struct Receiver {
    url: String,
    got: Arc<Mutex<Vec<Received>>>,
}

impl Receiver {
    async fn start(script: Vec<Behaviour>, then: Behaviour) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!(
            "http://{}/hooks/toolgate",
            listener.local_addr().expect("addr")
        );
        let got = Arc::new(Mutex::new(Vec::new()));
        let script = Arc::new(Mutex::new(script.into_iter()));
        let seen = Arc::clone(&got);
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let seen = Arc::clone(&seen);
                let script = Arc::clone(&script);
                tokio::spawn(async move {
                    serve_one(stream, &seen, &script, then).await;
                });
            }
        });
        Self { url, got }
    }

    fn received(&self) -> Vec<Received> {
        self.got.lock().expect("lock").clone()
    }

    /// The first `n` requests, once they arrived (within `limit`).
    async fn wait_for(&self, n: usize, limit: Duration) -> Vec<Received> {
        let deadline = Instant::now() + limit;
        loop {
            let got = self.received();
            if got.len() >= n {
                return got;
            }
            assert!(
                Instant::now() < deadline,
                "{n} requests expected within {limit:?}, got {}",
                got.len()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// Reads one HTTP/1.1 request (headers, then a `Content-Length` body) and answers it.
async fn serve_one(
    mut stream: TcpStream,
    seen: &Mutex<Vec<Received>>,
    script: &Mutex<std::vec::IntoIter<Behaviour>>,
    then: Behaviour,
) {
    let mut buffer = Vec::new();
    let mut chunk = [0_u8; 4096];
    let head_end = loop {
        if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break at;
        }
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buffer[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut start = lines.next().unwrap_or_default().split(' ');
    let method = start.next().unwrap_or_default().to_owned();
    let path = start.next().unwrap_or_default().to_owned();
    let headers: BTreeMap<String, String> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let length: usize = headers
        .get("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut body = buffer[head_end + 4..].to_vec();
    while body.len() < length {
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => body.extend_from_slice(&chunk[..n]),
        }
    }
    seen.lock().expect("lock").push(Received {
        method,
        path,
        headers,
        body,
        at: Instant::now(),
    });
    let behaviour = script.lock().expect("lock").next().unwrap_or(then);
    match behaviour {
        Behaviour::Status(code) => {
            let answer = format!(
                "HTTP/1.1 {code} Scripted\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
            );
            let _ = stream.write_all(answer.as_bytes()).await;
            let _ = stream.shutdown().await;
        }
        Behaviour::Silent => {
            // Keep the connection open and say nothing, as a hung receiver does.
            tokio::time::sleep(Duration::from_secs(3600)).await;
            drop(stream);
        }
    }
}

/// Retries quick enough for a test: 100 ms, 200 ms, … apart.
fn quick_retry() -> Retry {
    Retry {
        attempts: 5,
        first_backoff: Duration::from_millis(100),
        max_backoff: Duration::from_secs(1),
        timeout: Duration::from_secs(2),
        deadline: Duration::from_secs(20),
    }
}

fn webhook_to(receiver: &Receiver) -> Webhook {
    // As the CLI reads it from a file: with a trailing newline, trimmed.
    Webhook::new(&receiver.url, &Secret::new(format!("{SECRET}\n"))).expect("webhook")
}

/// A gated orders server on a fresh data directory, with `notifier` on its gate if any, and a
/// raw 2026-07-28 connection to it.
struct Harness {
    tx: WriteHalf<DuplexStream>,
    rx: Lines<BufReader<ReadHalf<DuplexStream>>>,
    dir: TempDir,
    next_id: u64,
}

impl Harness {
    async fn start(notifier: Option<&Notifier>) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let (journal, _) = Journal::open(dir.path()).expect("journal");
        let policy = Policy::from_bytes(POLICY.as_bytes()).expect("policy loads");
        let mut gate = Gate::new(policy, journal)
            .with_approvals(ApprovalStore::open(dir.path()).await.expect("approvals"))
            .with_redactor(Redactor::new(vec![Secret::new(REGISTERED)]))
            .with_principal(Principal::new("local:test"));
        if let Some(notifier) = notifier {
            gate = gate.with_notifier(notifier.clone());
        }
        let orders = Orders::open(&dir.path().join("orders")).expect("orders");
        let server = GateServer::new(gate, Arc::new(orders));
        let (client_io, server_io) = tokio::io::duplex(64 * 1024);
        tokio::spawn(async move {
            let running = server.serve(server_io).await.expect("server starts");
            let _ = running.waiting().await;
        });
        let (rx, tx) = tokio::io::split(client_io);
        Self {
            tx,
            rx: BufReader::new(rx).lines(),
            dir,
            next_id: 1,
        }
    }

    /// Calls `send_email` and returns the result; every call here needs an approval.
    async fn email(&mut self, subject: &str, body: &str) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        let request = json!({
            "jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {
                "name": "send_email",
                "arguments": {"to": "ada@customer.test", "subject": subject, "body": body},
                "_meta": {
                    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                    "io.modelcontextprotocol/clientCapabilities": {},
                },
            },
        });
        let mut line = serde_json::to_vec(&request).expect("JSON");
        line.push(b'\n');
        self.tx.write_all(&line).await.expect("write");
        loop {
            let line = tokio::time::timeout(Duration::from_secs(10), self.rx.next_line())
                .await
                .expect("an answer within 10 s")
                .expect("read")
                .expect("the server closed the stream");
            let message: Value = serde_json::from_str(&line).expect("JSON");
            if message["id"] == id {
                return message["result"].clone();
            }
        }
    }

    /// The approval id of a pending answer.
    async fn pending(&mut self, subject: &str, body: &str) -> String {
        let result = self.email(subject, body).await;
        let pending = &result["structuredContent"];
        assert_eq!(pending["status"], "pending_approval", "{result}");
        pending["approval_id"]
            .as_str()
            .unwrap_or_else(|| panic!("no approval id: {result}"))
            .to_owned()
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs()
}

/// Checks a request's signature as a receiver would: HMAC-SHA256 over `timestamp "." body`.
fn signature_valid(request: &Received) -> bool {
    let timestamp = request.header("x-toolgate-timestamp");
    let Some(hex) = request
        .header("x-toolgate-signature")
        .strip_prefix("sha256=")
    else {
        return false;
    };
    let Some(tag) = decode_hex(hex) else {
        return false;
    };
    let mut message = timestamp.as_bytes().to_vec();
    message.push(b'.');
    message.extend_from_slice(&request.body);
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, SECRET.as_bytes());
    ring::hmac::verify(&key, &message, &tag).is_ok()
}

fn decode_hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

#[tokio::test]
async fn a_new_approval_is_delivered_signed_with_its_context_and_no_secret() {
    let receiver = Receiver::start(vec![], Behaviour::Status(204)).await;
    let console_base = "https://gate.example.com/console/";
    let notifier = Notifier::start(
        Config::new()
            .with_webhook(webhook_to(&receiver))
            .with_console(Console::new(console_base).expect("console"))
            .with_retry(quick_retry()),
    )
    .expect("notifier");
    let mut h = Harness::start(Some(&notifier)).await;
    let id = h
        .pending("Your refund", &format!("Your code is {REGISTERED}."))
        .await;
    assert_eq!(notifier.drain(Duration::from_secs(10)).await, 0);

    let got = receiver.received();
    assert_eq!(got.len(), 1, "one approval, one delivery: {got:?}");
    let request = &got[0];
    assert_eq!(
        (request.method.as_str(), request.path.as_str()),
        ("POST", "/hooks/toolgate")
    );
    assert_eq!(request.header("content-type"), "application/json");
    assert_eq!(
        request.header("user-agent"),
        concat!("toolgate/", env!("CARGO_PKG_VERSION"))
    );
    let timestamp: u64 = request
        .header("x-toolgate-timestamp")
        .parse()
        .expect("unix seconds");
    assert!(unix_now().abs_diff(timestamp) <= 60, "{timestamp}");
    assert!(signature_valid(request), "the signature verifies");
    let mut tampered = request.clone();
    tampered.body.push(b' ');
    assert!(
        !signature_valid(&tampered),
        "a changed body does not verify"
    );

    let raw = String::from_utf8(request.body.clone()).expect("UTF-8");
    assert!(
        !raw.contains(REGISTERED),
        "the registered secret leaked: {raw}"
    );
    assert!(!raw.contains(SECRET), "the signing secret leaked: {raw}");
    let body = request.json();
    let store = ApprovalStore::open(h.dir.path()).await.expect("approvals");
    let row = store.get(&id, now_ms()).await.expect("get").expect("row");
    assert_eq!(body["type"], "approval.requested");
    assert_eq!(body["approval_id"], id.as_str());
    assert_eq!(body["tool"], "send_email");
    assert_eq!(
        body["arguments"], row.args_redacted,
        "the row's redacted arguments"
    );
    assert_eq!(body["arguments"]["to"], "ada@customer.test");
    assert!(
        body["arguments"]["body"]
            .as_str()
            .expect("body")
            .contains("[REDACTED]"),
        "{body}"
    );
    assert_eq!(body["requester"], "local:test");
    assert_eq!(body["tier"], "high");
    assert_eq!(body["reason"], row.reason.as_str());
    assert_eq!(body["dry_run"], row.dry_run);
    assert_eq!(body["policy_sha256"], row.policy_sha256.as_str());
    assert_eq!(
        body["expires_at"],
        toolgate_core::time::rfc3339(row.expires_at)
    );
    assert_eq!(
        body["console_url"],
        format!("https://gate.example.com/console/approvals/{id}")
    );
}

#[tokio::test]
async fn a_dead_receiver_does_not_slow_the_call() {
    // Accepts and never answers: the worst receiver, since every attempt waits out its timeout.
    let dead = Receiver::start(vec![], Behaviour::Silent).await;
    let notifier =
        Notifier::start(Config::new().with_webhook(webhook_to(&dead))).expect("notifier");
    let mut notified = Harness::start(Some(&notifier)).await;
    let mut plain = Harness::start(None).await;
    // One call each first: the first call of a connection opens the database and warms caches.
    notified.pending("warm up", "first").await;
    plain.pending("warm up", "first").await;

    const CALLS: usize = 15;
    let mut with = Vec::with_capacity(CALLS);
    let mut without = Vec::with_capacity(CALLS);
    // Interleaved, so that whatever else the machine does weighs on both alike.
    for i in 0..CALLS {
        let subject = format!("Call {i}");
        let started = Instant::now();
        notified.pending(&subject, "new approval each time").await;
        with.push(started.elapsed());
        let started = Instant::now();
        plain.pending(&subject, "new approval each time").await;
        without.push(started.elapsed());
    }
    with.sort();
    without.sort();
    let (median_with, median_without) = (with[CALLS / 2], without[CALLS / 2]);
    eprintln!(
        "call latency opening an approval, median of {CALLS}: {median_with:?} with a notifier \
         pointing at a receiver that never answers, {median_without:?} without a notifier; \
         slowest {:?} vs {:?}",
        with[CALLS - 1],
        without[CALLS - 1]
    );
    assert!(
        median_with.saturating_sub(median_without) < Duration::from_millis(50),
        "a dead receiver slowed the call: {median_with:?} vs {median_without:?}"
    );
    // The deliveries really were attempted (and are still waiting on the receiver).
    dead.wait_for(CALLS + 1, Duration::from_secs(10)).await;
    assert!(notifier.in_flight() > 0);
}

#[tokio::test]
async fn a_failing_receiver_is_retried_with_backoff_until_it_answers() {
    let receiver = Receiver::start(
        vec![Behaviour::Status(503), Behaviour::Status(503)],
        Behaviour::Status(200),
    )
    .await;
    let notifier = Notifier::start(
        Config::new()
            .with_webhook(webhook_to(&receiver))
            .with_retry(quick_retry()),
    )
    .expect("notifier");
    let mut h = Harness::start(Some(&notifier)).await;
    let id = h.pending("Retried", "twice refused").await;
    assert_eq!(notifier.drain(Duration::from_secs(10)).await, 0);
    // Nothing more comes after the 200.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let got = receiver.received();
    assert_eq!(got.len(), 3, "503, 503, then 200: three attempts");
    for attempt in &got {
        assert_eq!(attempt.json()["approval_id"], id.as_str());
        assert_eq!(
            attempt.body, got[0].body,
            "every attempt carries the same body"
        );
        assert!(signature_valid(attempt), "every attempt is signed");
    }
    // 100 ms, then 200 ms apart (exponential backoff).
    let gaps: Vec<Duration> = got.windows(2).map(|w| w[1].at - w[0].at).collect();
    assert!(gaps[0] >= Duration::from_millis(100), "{gaps:?}");
    assert!(gaps[1] >= Duration::from_millis(200), "{gaps:?}");
}

#[tokio::test]
async fn a_receiver_that_refuses_the_request_is_not_asked_again() {
    let receiver = Receiver::start(vec![], Behaviour::Status(400)).await;
    let notifier = Notifier::start(
        Config::new()
            .with_webhook(webhook_to(&receiver))
            .with_retry(quick_retry()),
    )
    .expect("notifier");
    let mut h = Harness::start(Some(&notifier)).await;
    h.pending("Refused", "bad request").await;
    assert_eq!(notifier.drain(Duration::from_secs(10)).await, 0);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(receiver.received().len(), 1, "a 400 is final");
}

#[tokio::test]
async fn the_slack_message_links_to_the_request_in_the_console() {
    let slack = Receiver::start(vec![], Behaviour::Status(200)).await;
    let hook = Receiver::start(vec![], Behaviour::Status(200)).await;
    let console = format!("{}/console", slack.url.trim_end_matches("/hooks/toolgate"));
    let notifier = Notifier::start(
        Config::new()
            .with_slack(Slack::new(&Secret::new(slack.url.clone())).expect("slack"))
            .with_webhook(webhook_to(&hook))
            .with_console(Console::new(&console).expect("console"))
            .with_retry(quick_retry()),
    )
    .expect("notifier");
    let mut h = Harness::start(Some(&notifier)).await;
    let id = h
        .pending("Slack me", &format!("<!channel> {REGISTERED}"))
        .await;
    assert_eq!(notifier.drain(Duration::from_secs(10)).await, 0);

    let got = slack.received();
    assert_eq!(got.len(), 1, "{got:?}");
    let request = &got[0];
    assert!(
        !request.headers.contains_key("x-toolgate-signature"),
        "a Slack webhook is authenticated by its URL"
    );
    assert_eq!(request.header("content-type"), "application/json");
    let raw = String::from_utf8(request.body.clone()).expect("UTF-8");
    assert!(!raw.contains(REGISTERED), "{raw}");
    assert!(
        !raw.contains("<!channel>"),
        "the caller cannot mention the channel: {raw}"
    );
    let message = request.json();
    let link = format!("<{console}/approvals/{id}|Review request {id}>");
    let text = message["text"].as_str().expect("text");
    assert!(text.contains(&link), "{text}");
    assert!(
        text.contains("send_email") && text.contains("local:test"),
        "{text}"
    );
    assert!(text.contains("tier high"), "{text}");
    let blocks = message["blocks"].as_array().expect("blocks");
    let shown = serde_json::to_string(blocks).expect("JSON");
    for part in [
        "*Tool*",
        "*Requester*",
        "*Tier*",
        "*Expires*",
        "*Reason*",
        "ada@customer.test",
        link.as_str(),
    ] {
        assert!(shown.contains(part), "{part} missing from {shown}");
    }
    // Both channels of one approval are delivered, each once.
    assert_eq!(hook.received().len(), 1);
}

#[tokio::test]
async fn a_retry_of_the_pending_call_is_not_announced_again() {
    let receiver = Receiver::start(vec![], Behaviour::Status(200)).await;
    let notifier = Notifier::start(
        Config::new()
            .with_webhook(webhook_to(&receiver))
            .with_retry(quick_retry()),
    )
    .expect("notifier");
    let mut h = Harness::start(Some(&notifier)).await;
    let first = h.pending("Same call", "same arguments").await;
    let again = h.pending("Same call", "same arguments").await;
    assert_eq!(first, again, "the retry attached to the same approval");
    let other = h.pending("Another call", "other arguments").await;
    assert_ne!(first, other);
    assert_eq!(notifier.drain(Duration::from_secs(10)).await, 0);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let ids: Vec<Value> = receiver
        .received()
        .iter()
        .map(|r| r.json()["approval_id"].clone())
        .collect();
    assert_eq!(
        ids,
        [json!(first), json!(other)],
        "one announcement per approval"
    );
}

#[tokio::test]
async fn a_kit_server_given_a_notifier_announces_its_approval_requests() {
    let receiver = Receiver::start(vec![], Behaviour::Status(200)).await;
    let notifier = Notifier::start(
        Config::new()
            .with_webhook(webhook_to(&receiver))
            .with_retry(quick_retry()),
    )
    .expect("notifier");
    let data = tempfile::tempdir().expect("data dir");
    let policy = Policy::from_bytes(
        b"version = 2\nname = \"payments\"\n[defaults]\ntier = \"blocked\"\napproval_wait = \"1ms\"\n[tools.pay]\ntier = \"high\"\n",
    )
    .expect("policy");
    let built = toolgate::kit::Server::new("payments")
        .env(toolgate::kit::Env::default())
        .data_dir(data.path())
        .policy(policy)
        .notifier(notifier.clone())
        .tool(
            toolgate::kit::Tool::new("pay")
                .description("Pay an invoice.")
                .input_schema(json!({
                    "type": "object",
                    "properties": {"invoice": {"type": "string"}},
                    "required": ["invoice"],
                }))
                .handler(|args: Value, _ctx| async move { toolgate::kit::ok_result(args) }),
        )
        .build()
        .await
        .expect("kit server");
    let (client, server) = tokio::io::duplex(64 * 1024);
    let serving = tokio::spawn(built.server().clone().serve(tokio::io::split(server)));
    let (read, mut write) = tokio::io::split(client);
    let call = json!({
        "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {
            "name": "pay",
            "arguments": {"invoice": "inv-1001"},
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": {},
            },
        },
    });
    write
        .write_all(format!("{call}\n").as_bytes())
        .await
        .expect("send");
    let line = BufReader::new(read)
        .lines()
        .next_line()
        .await
        .expect("read")
        .expect("an answer");
    let answer: Value = serde_json::from_str(&line).expect("json");
    let approval = answer["result"]["structuredContent"]["approval_id"]
        .as_str()
        .expect("a pending answer names its approval")
        .to_owned();
    assert_eq!(notifier.drain(Duration::from_secs(10)).await, 0);
    let got = receiver.received();
    assert_eq!(got.len(), 1);
    let body = got[0].json();
    assert_eq!(body["approval_id"], approval.as_str());
    assert_eq!(body["tool"], "pay");
    assert!(signature_valid(&got[0]));
    serving.abort();
}
