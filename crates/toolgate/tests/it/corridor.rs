//! The corridor end to end (DESIGN.md §1, §4), over raw JSON lines in the 2026-07-28 era: timeout
//! and cancellation without stalling the connection, gated refusals with their dry run, redaction
//! of what leaves the server, the kill switch, undecidable escalation, and the audit every step
//! writes.
//!
//! The tools are a test-only toolset whose handlers report into a shared [`Probe`], so each test
//! can tell "refused before the handler" from "the handler ran and failed", and can see whether
//! the corridor cancelled a handler it gave up on.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::BufReader as StdBufReader;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::ServiceExt;
use rmcp::model::{CallToolResult, Tool};
use serde_json::{Map, Value, json};
use tempfile::TempDir;
use tokio::io::{
    AsyncBufReadExt, AsyncWriteExt, BufReader, DuplexStream, Lines, ReadHalf, WriteHalf,
};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use toolgate::GateServer;
use toolgate::corridor::answer as outcome;
use toolgate::server::Gate;
use toolgate::toolset::{Call, CallError, CallFuture, Catalog, DryRunFuture, Toolset};
use toolgate_core::policy::Policy;
use toolgate_core::principal::Principal;
use toolgate_core::redact::Redactor;
use toolgate_core::secret::Secret;
use toolgate_core::time::now_ms;
use toolgate_store::Location;
use toolgate_store::approval::{ApprovalStore, Status};
use toolgate_store::journal::Journal;
use toolgate_store::state::StateStore;

use super::audit;

/// A value registered with the redactor: it has no credential shape, so only registration can
/// catch it.
const REGISTERED: &str = "correct-horse-battery-staple-42";
/// Credential shapes the redactor must catch without being told the values.
const STRIPE: &str = "sk_live_4eC39HqLyjWDarjtT1zdp7dc";
const BEARER: &str = "Bearer abcDEF123456ghiJKL789";
/// The token part of [`BEARER`]: what must not appear anywhere.
const BEARER_TOKEN: &str = "abcDEF123456ghiJKL789";

/// Every string no client, approval row or audit line may carry.
const SECRETS: [&str; 3] = [REGISTERED, STRIPE, BEARER_TOKEN];

/// What handlers report: `tool:event` in order, and every cancellation token they were handed.
#[derive(Debug, Default)]
struct Probe {
    events: Mutex<Vec<String>>,
    /// Kept because the corridor drops a handler's future when it stops waiting for it, so the
    /// handler may never get to observe its own token; what matters is that the token was
    /// cancelled, so work the handler started elsewhere stops too.
    tokens: Mutex<Vec<CancellationToken>>,
}

impl Probe {
    fn log(&self, tool: &str, event: &str) {
        self.events.lock().unwrap().push(format!("{tool}:{event}"));
    }

    fn events(&self) -> Vec<String> {
        self.events.lock().unwrap().clone()
    }

    fn saw(&self, event: &str) -> bool {
        self.events().iter().any(|e| e == event)
    }

    fn ran(&self, tool: &str) -> bool {
        let prefix = format!("{tool}:");
        self.events().iter().any(|e| e.starts_with(&prefix))
    }

    fn tokens(&self) -> Vec<CancellationToken> {
        self.tokens.lock().unwrap().clone()
    }

    /// Waits (bounded) until handlers reported `event` `times` times: the test must not cancel a
    /// call before it reached the handler, or it would test the wrong step.
    async fn wait_for(&self, event: &str, times: usize) {
        let deadline = Instant::now() + Duration::from_secs(3);
        while self.events().iter().filter(|e| *e == event).count() < times {
            assert!(
                Instant::now() < deadline,
                "{event} did not happen {times} times: {:?}",
                self.events()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// Logs `dropped` when the handler's future is dropped before it finished: the corridor gave up
/// on it, and the handler does not keep running behind the caller's back.
struct Unfinished<'a> {
    probe: &'a Probe,
    tool: &'static str,
    armed: bool,
}

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.probe.log(self.tool, "dropped");
        }
    }
}

/// Test-only toolset: a tool per corridor behaviour under test.
#[derive(Debug)]
struct Bench {
    catalog: Arc<Catalog>,
    probe: Arc<Probe>,
}

impl Bench {
    fn new(probe: Arc<Probe>) -> Self {
        let tool = |name: &'static str, properties: Value, required: &[&str]| {
            let schema = json!({
                "type": "object",
                "properties": properties,
                "required": required,
                "additionalProperties": false,
            });
            let Value::Object(schema) = schema else {
                unreachable!("built as an object")
            };
            Tool::new(name, format!("test tool {name}"), Arc::new(schema))
        };
        let tools = vec![
            tool(
                "sleepy",
                json!({
                    "ms": {"type": "integer", "minimum": 0},
                    "watch": {"type": "boolean"},
                }),
                &["ms"],
            ),
            tool("echo", json!({"text": {"type": "string"}}), &["text"]),
            tool("wipe", json!({"target": {"type": "string"}}), &["target"]),
            tool("nodry", json!({"x": {"type": "string"}}), &["x"]),
            tool("leaky", json!({"raise": {"type": "boolean"}}), &[]),
            tool(
                "pay",
                json!({
                    "amount": {"type": "number"},
                    "memo": {"type": "string"},
                    "api_key": {"type": "string"},
                }),
                &[],
            ),
        ];
        Self {
            catalog: Arc::new(Catalog::new(tools)),
            probe,
        }
    }

    async fn run(&self, call: Call<'_>) -> Result<CallToolResult, CallError> {
        let probe = self.probe.as_ref();
        let args = &call.arguments;
        let text = |key: &str| args.get(key).and_then(Value::as_str).unwrap_or_default();
        match call.name {
            "sleepy" => {
                let ms = args.get("ms").and_then(Value::as_u64).unwrap_or_default();
                probe.tokens.lock().unwrap().push(call.ct.clone());
                probe.log("sleepy", "started");
                let mut guard = Unfinished {
                    probe,
                    tool: "sleepy",
                    armed: true,
                };
                // `watch: false` is a handler blocked on something that knows nothing of tokens.
                let watch = args.get("watch").and_then(Value::as_bool).unwrap_or(true);
                let cancelled = async {
                    if watch {
                        call.ct.cancelled().await;
                    } else {
                        std::future::pending::<()>().await;
                    }
                };
                let result = tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(ms)) => {
                        probe.log("sleepy", "finished");
                        outcome::success(json!({"slept_ms": ms}))
                    }
                    () = cancelled => {
                        probe.log("sleepy", "cancelled");
                        outcome::refusal("sleepy was cancelled", json!({}))
                    }
                };
                guard.armed = false;
                Ok(result)
            }
            "echo" => {
                probe.log("echo", "ran");
                Ok(outcome::success(json!({"text": text("text")})))
            }
            "wipe" => {
                probe.log("wipe", "ran");
                Ok(outcome::success(json!({"wiped": text("target")})))
            }
            "nodry" => {
                probe.log("nodry", "ran");
                Ok(outcome::success(json!({"x": text("x")})))
            }
            "leaky" => {
                probe.log("leaky", "ran");
                // An upstream error that echoes the credentials it was sent: the realistic leak.
                let message = format!(
                    "upstream refused: Authorization: {BEARER}; stripe key {STRIPE}; vault said {REGISTERED}"
                );
                if args.get("raise").and_then(Value::as_bool) == Some(true) {
                    Err(CallError::Failed(message))
                } else {
                    Ok(outcome::refusal(message, json!({"status": "failed"})))
                }
            }
            "pay" => {
                probe.log("pay", "ran");
                Ok(outcome::success(json!({"paid": args.get("amount")})))
            }
            other => Ok(outcome::refusal(format!("no tool {other}"), json!({}))),
        }
    }
}

impl Toolset for Bench {
    fn catalog(&self) -> Arc<Catalog> {
        Arc::clone(&self.catalog)
    }

    fn call<'a>(&'a self, call: Call<'a>) -> CallFuture<'a> {
        Box::pin(self.run(call))
    }

    fn dry_run<'a>(&'a self, name: &'a str, arguments: &'a Map<String, Value>) -> DryRunFuture<'a> {
        Box::pin(std::future::ready(self.preview(name, arguments)))
    }
}

impl Bench {
    fn preview(&self, name: &str, arguments: &Map<String, Value>) -> Option<Value> {
        (name == "wipe").then(|| {
            let target = arguments.get("target").cloned().unwrap_or_default();
            json!({
                "would": format!("delete everything under {}", target.as_str().unwrap_or_default()),
                "reversible": false,
                "target": target,
            })
        })
    }
}

/// The policy under test. `name = "notes-mcp"` makes the gate variable `NOTES_ALLOW_GATED`;
/// `sleepy_timeout` and `approval_wait` vary so one test can wait for a timeout and another can
/// hold a call open.
fn policy(sleepy_timeout: &str, approval_wait: &str) -> String {
    format!(
        r#"
version = 2
name = "notes-mcp"

[defaults]
tier = "blocked"
approval_ttl = "5m"
approval_wait = "{approval_wait}"
medium_budget = 5
medium_window = "1h"
timeout = "30s"

[tools.sleepy]
tier = "low"
timeout = "{sleepy_timeout}"

[tools.echo]
tier = "low"

[tools.wipe]
tier = "low"
gated = true

[tools.nodry]
tier = "low"
gated = true

[tools.leaky]
tier = "low"

[tools.pay]
tier = "low"
escalate = [{{ when = "args.amount > 25", tier = "high" }}]
"#
    )
}

/// Short waits for approvals: a held call answers "pending" after one poll.
fn quick_policy() -> String {
    policy("200ms", "1ms")
}

/// The request `_meta` every 2026-07-28 request carries.
fn meta() -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
    })
}

/// A raw JSON-lines client that can have several requests in flight: answers are matched by id,
/// and whatever arrives meanwhile is kept in arrival order.
struct Conn {
    tx: WriteHalf<DuplexStream>,
    rx: Lines<BufReader<ReadHalf<DuplexStream>>>,
    kept: Vec<Value>,
}

impl Conn {
    async fn send(&mut self, message: &Value) {
        let mut line = serde_json::to_vec(message).expect("JSON");
        line.push(b'\n');
        self.tx.write_all(&line).await.expect("write");
    }

    async fn call(&mut self, id: u64, tool: &str, arguments: Value) {
        let request = json!({
            "jsonrpc": "2.0",
            "id": id,
            "method": "tools/call",
            "params": {"name": tool, "arguments": arguments, "_meta": meta()},
        });
        self.send(&request).await;
    }

    async fn cancel(&mut self, id: u64) {
        let notification = json!({
            "jsonrpc": "2.0",
            "method": "notifications/cancelled",
            "params": {"requestId": id, "reason": "the user changed their mind"},
        });
        self.send(&notification).await;
    }

    async fn next_before(&mut self, deadline: Instant) -> Option<Value> {
        // `next_line` is cancel-safe, so a timeout loses no half-read line.
        let line = tokio::time::timeout_at(deadline, self.rx.next_line())
            .await
            .ok()?;
        let line = line.expect("read").expect("the server closed the stream");
        Some(serde_json::from_str(&line).expect("JSON"))
    }

    /// The answer to request `id`, within `within`.
    async fn answer(&mut self, id: u64, within: Duration) -> Value {
        if let Some(at) = self.kept.iter().position(|m| m["id"] == id) {
            return self.kept.remove(at);
        }
        let deadline = Instant::now() + within;
        loop {
            let Some(message) = self.next_before(deadline).await else {
                panic!(
                    "no answer to {id} within {within:?}; meanwhile: {:?}",
                    self.kept
                )
            };
            if message["id"] == id {
                return message;
            }
            self.kept.push(message);
        }
    }

    /// Sends one call and waits for its answer.
    async fn exchange(&mut self, id: u64, tool: &str, arguments: Value) -> Value {
        self.call(id, tool, arguments).await;
        self.answer(id, Duration::from_secs(5)).await
    }

    /// Everything kept or received until `window` has passed, in arrival order.
    async fn drain(&mut self, window: Duration) -> Vec<Value> {
        let deadline = Instant::now() + window;
        let mut seen = std::mem::take(&mut self.kept);
        while let Some(message) = self.next_before(deadline).await {
            seen.push(message);
        }
        seen
    }
}

/// A server behind a full gate (journal, approvals, state, redactor, principal) on a fresh data
/// directory, and a raw connection to it.
struct Harness {
    conn: Conn,
    dir: TempDir,
    probe: Arc<Probe>,
    policy_sha256: String,
    /// The gate's kill switch and budgets, wherever they are kept.
    state: StateStore,
}

async fn start(policy_text: &str, open_gates: &[&str]) -> Harness {
    start_on(policy_text, open_gates, None).await
}

/// [`start`] with the approval queue, the switch and the budgets on `store` (`None`: SQLite in the
/// harness's directory); the journal stays in the directory.
async fn start_on(policy_text: &str, open_gates: &[&str], store: Option<Location>) -> Harness {
    let dir = tempfile::tempdir().expect("temp dir");
    let (journal, _) = Journal::open(dir.path()).expect("journal");
    let policy = Policy::from_bytes(policy_text.as_bytes()).expect("policy loads");
    let probe = Arc::new(Probe::default());
    let bench = Bench::new(Arc::clone(&probe));
    // The CLI's start-up check, so a policy that does not fit the tools fails here, not as a
    // puzzling test result.
    let catalog = bench.catalog();
    assert!(catalog.all_withheld().is_empty(), "schemas compile");
    policy
        .check_tools(&catalog.argument_types())
        .expect("policy fits the tools");
    let policy_sha256 = policy.sha256().to_owned();
    let open: BTreeSet<String> = open_gates.iter().map(|g| (*g).to_owned()).collect();
    let store = store.unwrap_or_else(|| Location::Dir(dir.path().to_owned()));
    let approvals = ApprovalStore::at(&store).await.expect("approvals");
    let state = StateStore::beside(&approvals, dir.path()).expect("state");
    let gate = Gate::new(policy, journal)
        .with_approvals(approvals)
        .with_state(state.clone())
        .with_redactor(Redactor::new(vec![Secret::new(REGISTERED)]))
        .with_open_gates(open)
        .with_principal(Principal::new("local:test"));
    let server = GateServer::new(gate, Arc::new(bench));
    let (client_io, server_io) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        let running = server.serve(server_io).await.expect("server starts");
        let _ = running.waiting().await;
    });
    let (rx, tx) = tokio::io::split(client_io);
    Harness {
        conn: Conn {
            tx,
            rx: BufReader::new(rx).lines(),
            kept: Vec::new(),
        },
        dir,
        probe,
        state,
        policy_sha256,
    }
}

/// The `result` of a reply; every 2026-07-28 result names the server in `_meta` (item 9).
fn result(reply: &Value) -> &Value {
    let result = &reply["result"];
    assert!(result.is_object(), "a result, not an error: {reply}");
    assert_eq!(
        result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"], "toolgate",
        "2026-07-28 results carry serverInfo: {reply}"
    );
    result
}

fn text_of(result: &Value) -> &str {
    result["content"][0]["text"].as_str().unwrap_or_default()
}

/// Audit records of `tool`, as (decision, outcome, rule).
fn decisions(dir: &TempDir, tool: &str) -> Vec<(String, String, String)> {
    audit(dir)
        .iter()
        .filter(|r| r["name"] == tool)
        .map(|r| {
            let field = |k: &str| r[k].as_str().unwrap_or_default().to_owned();
            (field("decision"), field("outcome"), field("rule"))
        })
        .collect()
}

/// Waits (bounded) for an audit record of `tool` with this outcome: records of calls that get no
/// answer (cancelled) land after the test stops hearing about them.
async fn await_audit(dir: &TempDir, tool: &str, outcome: &str) -> Vec<(String, String, String)> {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let found = decisions(dir, tool);
        if found.iter().any(|(_, o, _)| o == outcome) {
            return found;
        }
        assert!(
            Instant::now() < deadline,
            "no {outcome} record for {tool}: {found:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Every record names the rule that decided it and the policy in force (its SHA-256, 64 hex) and
/// the caller, and the file is one intact chain. Run at the end of every test, so each path through
/// the corridor (cancelled, killed, held, refused) is held to it.
fn assert_audit_sound(h: &Harness) {
    assert!(
        h.policy_sha256.len() == 64 && h.policy_sha256.bytes().all(|b| b.is_ascii_hexdigit()),
        "{}",
        h.policy_sha256
    );
    let records = audit(&h.dir);
    assert!(!records.is_empty(), "the corridor wrote nothing");
    for record in &records {
        let rule = record["rule"].as_str().unwrap_or_default();
        assert!(!rule.is_empty(), "no rule: {record}");
        assert_eq!(
            record["policy_sha256"],
            h.policy_sha256.as_str(),
            "{record}"
        );
        assert_eq!(record["principal"], "local:test", "{record}");
    }
    let file = File::open(h.dir.path().join("audit.jsonl")).expect("audit");
    let report = toolgate_core::audit::verify(StdBufReader::new(file), None).expect("readable");
    assert!(report.intact(), "{report:?}");
    assert_eq!(report.records, records.len() as u64);
}

fn assert_no_secret(what: &str, text: &str) {
    for secret in SECRETS {
        assert!(!text.contains(secret), "{what} leaks {secret:?}: {text}");
    }
}

// 1. Per-tool timeout.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_past_its_timeout_is_an_error_and_other_calls_keep_flowing() {
    let mut h = start(&policy("200ms", "1ms"), &[]).await;
    let sent = Instant::now();
    h.conn.call(1, "sleepy", json!({"ms": 5000})).await;
    h.conn.call(2, "echo", json!({"text": "still here"})).await;

    // The first thing back is the echo: the sleeping call does not hold up the connection.
    let first = h
        .conn
        .next_before(sent + Duration::from_secs(2))
        .await
        .expect("an answer");
    assert_eq!(first["id"], 2, "echo answered first: {first}");
    let echo_after = sent.elapsed();
    assert_eq!(
        result(&first)["structuredContent"]["text"],
        "still here",
        "{first}"
    );
    assert!(
        echo_after < Duration::from_millis(200),
        "echo took {echo_after:?}, longer than sleepy's timeout"
    );

    let reply = h.conn.answer(1, Duration::from_secs(2)).await;
    let elapsed = sent.elapsed();
    let timed_out = result(&reply);
    assert_eq!(timed_out["isError"], true, "{reply}");
    assert!(text_of(timed_out).contains("timed out"), "{reply}");
    assert_eq!(timed_out["structuredContent"]["status"], "timeout");
    // The handler started and was cut off: it may have done its work. "Not executed" would
    // invite a retry of an effect that happened.
    assert_eq!(
        timed_out["structuredContent"]["executed"], "unknown",
        "{reply}"
    );
    assert!(
        text_of(timed_out).contains("outcome unknown: verify before retrying"),
        "{reply}"
    );
    assert!(
        elapsed >= Duration::from_millis(200) && elapsed < Duration::from_secs(1),
        "timed out after {elapsed:?}"
    );

    let tokens = h.probe.tokens();
    assert_eq!(tokens.len(), 1);
    assert!(tokens[0].is_cancelled(), "the handler's token is cancelled");
    assert!(!h.probe.saw("sleepy:finished"), "{:?}", h.probe.events());
    assert!(
        h.probe.saw("sleepy:dropped") || h.probe.saw("sleepy:cancelled"),
        "the handler was stopped: {:?}",
        h.probe.events()
    );

    let records = decisions(&h.dir, "sleepy");
    assert_eq!(
        records,
        [("allow".into(), "timeout".into(), "tools.sleepy.tier".into())]
    );
    assert_audit_sound(&h);
}

// 2. Cancellation by the client.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_call_gets_no_answer_and_its_handler_is_cancelled() {
    let mut h = start(&policy("30s", "1ms"), &[]).await;
    // A handler that ignores its token, so only the corridor can end the call; one that watches
    // it races the corridor's own cancel branch (see the ignored test below).
    h.conn
        .call(1, "sleepy", json!({"ms": 5000, "watch": false}))
        .await;
    h.probe.wait_for("sleepy:started", 1).await;
    h.conn.cancel(1).await;

    // The connection still serves calls while the cancelled one would have been answered.
    let echo = h
        .conn
        .exchange(2, "echo", json!({"text": "after cancel"}))
        .await;
    assert_eq!(result(&echo)["structuredContent"]["text"], "after cancel");
    let later = h.conn.drain(Duration::from_secs(1)).await;
    assert!(
        later.iter().all(|m| m["id"] != 1),
        "the cancelled request got an answer: {later:?}"
    );

    let tokens = h.probe.tokens();
    assert_eq!(tokens.len(), 1);
    assert!(tokens[0].is_cancelled(), "the handler's token is cancelled");
    assert!(!h.probe.saw("sleepy:finished"), "{:?}", h.probe.events());

    let records = await_audit(&h.dir, "sleepy", "cancelled").await;
    assert_eq!(
        records,
        [(
            "allow".into(),
            "cancelled".into(),
            "tools.sleepy.tier".into()
        )]
    );
    assert_audit_sound(&h);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_call_whose_handler_watches_its_token_is_audited_cancelled() {
    // Each cancellation is a coin toss; ten make a false pass a one-in-a-thousand event.
    const CALLS: u64 = 10;
    let mut h = start(&policy("30s", "1ms"), &[]).await;
    for id in 1..=CALLS {
        h.conn.call(id, "sleepy", json!({"ms": 5000})).await;
        h.probe
            .wait_for("sleepy:started", usize::try_from(id).unwrap())
            .await;
        h.conn.cancel(id).await;
    }
    let deadline = Instant::now() + Duration::from_secs(3);
    let records = loop {
        let records = decisions(&h.dir, "sleepy");
        if records.len() as u64 == CALLS || Instant::now() >= deadline {
            break records;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let outcomes: Vec<&str> = records.iter().map(|(_, o, _)| o.as_str()).collect();
    assert_eq!(outcomes, ["cancelled"; CALLS as usize], "{records:?}");
    let answered = h.conn.drain(Duration::from_millis(200)).await;
    assert!(
        answered.is_empty(),
        "cancelled calls got answers: {answered:?}"
    );
}

// 3. Cancellation while the call waits for a person.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_cancelled_while_held_for_approval_leaves_the_approval_pending() {
    let mut h = start(&policy("200ms", "10s"), &[]).await;
    let store = ApprovalStore::open(h.dir.path()).await.expect("approvals");
    h.conn.call(1, "pay", json!({"amount": 100})).await;

    // Cancel only once the call is held: its approval row exists.
    let deadline = Instant::now() + Duration::from_secs(3);
    let row = loop {
        let rows = store.list(false, now_ms()).await.expect("list");
        if let Some(row) = rows.into_iter().next() {
            break row;
        }
        assert!(Instant::now() < deadline, "no approval was opened");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!((row.tool.as_str(), row.tier.as_str()), ("pay", "high"));
    h.conn.cancel(1).await;

    let echo = h.conn.exchange(2, "echo", json!({"text": "next"})).await;
    assert_eq!(result(&echo)["structuredContent"]["text"], "next");
    let later = h.conn.drain(Duration::from_secs(1)).await;
    assert!(
        later.iter().all(|m| m["id"] != 1),
        "the cancelled request got an answer: {later:?}"
    );

    // The person may still decide; a later identical call attaches to this row.
    let rows = store.list(true, now_ms()).await.expect("list");
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].id, row.id);
    assert_eq!(rows[0].status, Status::Pending);
    assert!(!h.probe.ran("pay"), "{:?}", h.probe.events());
    assert_eq!(
        decisions(&h.dir, "pay"),
        [(
            "approval".into(),
            "requested".into(),
            "tools.pay.escalate[0]".into()
        )]
    );
    assert_audit_sound(&h);
}

// 4. Gated tools.

#[tokio::test]
async fn a_gated_tool_with_its_switch_off_answers_with_the_tools_own_dry_run() {
    let mut h = start(&quick_policy(), &[]).await;
    let args = json!({"target": "/srv/notes"});
    let reply = h.conn.exchange(1, "wipe", args.clone()).await;
    let refused = result(&reply);
    assert_eq!(refused["isError"], true, "{reply}");
    let detail = &refused["structuredContent"];
    assert_eq!(detail["status"], "refused", "{reply}");
    assert_eq!(detail["executed"], false);
    assert_eq!(detail["gate_env"], "NOTES_ALLOW_GATED");
    assert_eq!(detail["rule"], "tools.wipe.gated");
    assert_eq!(detail["policy_sha256"], h.policy_sha256.as_str());
    let Value::Object(arguments) = args else {
        unreachable!("built as an object")
    };
    // The tool's own preview, marked as such (seed 004's `preview_available`).
    let mut own = Bench::new(Arc::default())
        .preview("wipe", &arguments)
        .expect("wipe has a dry run");
    own["preview_available"] = json!(true);
    assert_eq!(detail["dry_run"], own, "{reply}");
    assert_eq!(
        detail["arguments_received"],
        json!({"target": "/srv/notes"})
    );
    assert_eq!(detail["reason"], "gated");
    assert!(text_of(refused).contains("NOTES_ALLOW_GATED"), "{reply}");
    assert!(!h.probe.ran("wipe"), "{:?}", h.probe.events());
    assert_eq!(
        decisions(&h.dir, "wipe"),
        [("refuse".into(), "dry_run".into(), "tools.wipe.gated".into())]
    );
    assert_audit_sound(&h);
}

#[tokio::test]
async fn a_gated_medium_tool_answered_with_its_dry_run_spends_no_budget() {
    // policies/filesystem.toml's edit_file: medium and gated. A refusal runs nothing, so it
    // must not use up the caller's unattended medium calls. The same on the in-memory store:
    // the corridor does not know which store it has.
    for store in [None, Some(Location::Memory)] {
        gated_medium_dry_runs_spend_no_budget(store).await;
    }
}

async fn gated_medium_dry_runs_spend_no_budget(store: Option<Location>) {
    let text = policy("200ms", "1ms")
        .replace("medium_budget = 5", "medium_budget = 1")
        .replace(
            "[tools.wipe]\ntier = \"low\"",
            "[tools.wipe]\ntier = \"medium\"",
        );
    let mut h = start_on(&text, &[], store).await;
    for id in 1..=3 {
        let reply = h
            .conn
            .exchange(id, "wipe", json!({"target": "/srv/data"}))
            .await;
        assert_eq!(
            result(&reply)["structuredContent"]["status"],
            "refused",
            "{reply}"
        );
    }
    assert!(!h.probe.saw("wipe:ran"));
    // The one medium call of the budget is still there.
    let state = &h.state;
    let window = 3_600_000;
    assert!(
        state
            .charge_budget("local:test", 1, window, now_ms())
            .await
            .expect("budget"),
        "a dry run charged the budget"
    );
    assert!(
        !state
            .charge_budget("local:test", 1, window, now_ms())
            .await
            .expect("budget"),
        "the budget is one call"
    );
}

#[tokio::test]
async fn a_gated_tool_without_a_dry_run_gets_a_synthesised_one() {
    let mut h = start(&quick_policy(), &[]).await;
    let reply = h.conn.exchange(1, "nodry", json!({"x": "abc"})).await;
    let refused = result(&reply);
    assert_eq!(refused["isError"], true, "{reply}");
    let detail = &refused["structuredContent"];
    assert_eq!(
        (&detail["status"], &detail["executed"], &detail["gate_env"]),
        (
            &json!("refused"),
            &json!(false),
            &json!("NOTES_ALLOW_GATED")
        ),
        "{reply}"
    );
    let dry_run = &detail["dry_run"];
    assert_eq!(dry_run["synthesised"], true, "{reply}");
    assert_eq!(dry_run["arguments"], json!({"x": "abc"}));
    assert_eq!(dry_run["rule"], "tools.nodry.gated");
    assert_eq!(dry_run["tier"], "low");
    assert!(!h.probe.ran("nodry"), "{:?}", h.probe.events());
    assert_audit_sound(&h);
}

#[tokio::test]
async fn a_gated_tool_runs_once_its_switch_is_on() {
    let mut h = start(&quick_policy(), &["NOTES_ALLOW_GATED"]).await;
    let wipe = h
        .conn
        .exchange(1, "wipe", json!({"target": "/srv/notes"}))
        .await;
    assert_ne!(result(&wipe)["isError"], true, "{wipe}");
    assert_eq!(result(&wipe)["structuredContent"]["wiped"], "/srv/notes");
    let nodry = h.conn.exchange(2, "nodry", json!({"x": "abc"})).await;
    assert_eq!(result(&nodry)["structuredContent"]["x"], "abc", "{nodry}");
    assert_eq!(h.probe.events(), ["wipe:ran", "nodry:ran"]);
    assert_eq!(
        decisions(&h.dir, "wipe"),
        [("allow".into(), "committed".into(), "tools.wipe.tier".into())]
    );
    assert_audit_sound(&h);
}

// 5. Redaction.

#[tokio::test]
async fn secrets_in_a_handlers_output_and_error_text_are_redacted() {
    let mut h = start(&quick_policy(), &[]).await;
    let echo = h
        .conn
        .exchange(
            1,
            "echo",
            json!({"text": format!("vault: {REGISTERED}; {BEARER}; {STRIPE}")}),
        )
        .await;
    assert_no_secret("echo result", &echo.to_string());
    let echoed = result(&echo)["structuredContent"]["text"]
        .as_str()
        .expect("text");
    assert!(echoed.starts_with("vault: [REDACTED]"), "{echo}");

    let leaky = h.conn.exchange(2, "leaky", json!({})).await;
    let failed = result(&leaky);
    assert_eq!(failed["isError"], true, "{leaky}");
    assert_no_secret("leaky error result", &leaky.to_string());
    assert!(text_of(failed).contains("[REDACTED]"), "{leaky}");
    assert!(text_of(failed).starts_with("upstream refused"), "{leaky}");
    assert_eq!(
        decisions(&h.dir, "leaky"),
        [("allow".into(), "failed".into(), "tools.leaky.tier".into())]
    );

    // Text the corridor builds from arguments: a schema error quoting the bad value, and the
    // synthesised dry run of a gated tool.
    let invalid = h
        .conn
        .exchange(3, "pay", json!({"amount": REGISTERED}))
        .await;
    assert_eq!(
        result(&invalid)["structuredContent"]["status"],
        "invalid_args",
        "{invalid}"
    );
    assert_no_secret("schema error", &invalid.to_string());
    let gated = h.conn.exchange(4, "nodry", json!({"x": STRIPE})).await;
    assert_eq!(
        result(&gated)["structuredContent"]["dry_run"]["arguments"]["x"],
        "[REDACTED]",
        "{gated}"
    );
    assert_no_secret("synthesised dry run", &gated.to_string());
    assert_audit_sound(&h);
}

#[tokio::test]
async fn secrets_in_a_handlers_error_are_redacted() {
    let mut h = start(&quick_policy(), &[]).await;
    let reply = h.conn.exchange(1, "leaky", json!({"raise": true})).await;
    // Today: {"error":{"code":-32603,"message":"upstream refused: Authorization: Bearer
    // abcDEF123456ghiJKL789; stripe key sk_live_4eC39HqLyjWDarjtT1zdp7dc; vault said
    // correct-horse-battery-staple-42"},"id":1,"jsonrpc":"2.0"}
    assert_no_secret("leaky failure", &reply.to_string());
    let failed = result(&reply);
    assert_eq!(failed["isError"], true, "{reply}");
    assert!(text_of(failed).contains("[REDACTED]"), "{reply}");
}

#[tokio::test]
async fn an_approval_row_holds_no_secret_from_the_arguments() {
    let mut h = start(&quick_policy(), &[]).await;
    let reply = h
        .conn
        .exchange(
            1,
            "pay",
            json!({
                "amount": 100,
                "api_key": REGISTERED,
                "memo": format!("api_key={STRIPE} sent with {BEARER}"),
            }),
        )
        .await;
    let pending = result(&reply);
    assert_eq!(
        pending["structuredContent"]["status"], "pending_approval",
        "{reply}"
    );
    assert_no_secret("pending answer", &reply.to_string());
    let store = ApprovalStore::open(h.dir.path()).await.expect("approvals");
    let rows = store.list(true, now_ms()).await.expect("list");
    assert_eq!(rows.len(), 1, "{rows:?}");
    let row = serde_json::to_string(&rows[0]).expect("row");
    assert_no_secret("approval row", &row);
    assert_eq!(rows[0].args_redacted["amount"], 100, "{row}");
    assert_eq!(rows[0].args_redacted["api_key"], "[REDACTED]", "{row}");
    // Arguments reach the audit log only as a digest.
    let log = std::fs::read_to_string(h.dir.path().join("audit.jsonl")).expect("audit");
    assert_no_secret("audit log", &log);
    assert!(!h.probe.ran("pay"));
    assert_audit_sound(&h);
}

// 6. Kill switch.

#[tokio::test]
async fn the_kill_switch_refuses_the_next_call_before_any_handler() {
    let mut h = start(&quick_policy(), &[]).await;
    let before = h.conn.exchange(1, "echo", json!({"text": "on"})).await;
    assert_eq!(result(&before)["structuredContent"]["text"], "on");

    // Another process (the CLI) flips the switch in the same database.
    let state = StateStore::open(h.dir.path()).await.expect("state");
    state
        .set_killswitch(true, "human:ops", now_ms())
        .await
        .expect("switch on");

    let reply = h.conn.exchange(2, "echo", json!({"text": "off"})).await;
    assert_eq!(reply["error"]["code"], -32602, "{reply}");
    assert_eq!(reply["error"]["message"], "tool denied: echo", "{reply}");
    // The caller is told no more than for a hidden tool; the rule is in the audit.
    assert_eq!(reply["error"]["data"]["rule"], "visibility", "{reply}");
    assert_eq!(h.probe.events(), ["echo:ran"], "the handler ran once only");
    assert_eq!(
        decisions(&h.dir, "echo").last(),
        Some(&(
            "deny".to_owned(),
            "not_executed".to_owned(),
            "killswitch".to_owned()
        ))
    );
    assert_audit_sound(&h);
}

// 7. Escalation that cannot be decided.

#[tokio::test]
async fn an_undecidable_escalation_counts_as_matched() {
    let mut h = start(&quick_policy(), &[]).await;
    // Decidable and false: runs at its own tier.
    let small = h.conn.exchange(1, "pay", json!({"amount": 5})).await;
    assert_eq!(result(&small)["structuredContent"]["paid"], 5, "{small}");

    // `args.amount` is missing: the condition cannot be evaluated, so the call goes to a person.
    let reply = h
        .conn
        .exchange(2, "pay", json!({"memo": "no amount"}))
        .await;
    let pending = result(&reply);
    assert_eq!(pending["isError"], true, "{reply}");
    assert_eq!(
        pending["structuredContent"]["status"], "pending_approval",
        "{reply}"
    );
    assert_eq!(pending["structuredContent"]["tier"], "high");
    assert_eq!(h.probe.events(), ["pay:ran"], "only the small payment ran");
    let store = ApprovalStore::open(h.dir.path()).await.expect("approvals");
    let rows = store.list(false, now_ms()).await.expect("list");
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].args_redacted, json!({"memo": "no amount"}));
    assert!(
        rows[0].reason.contains("tools.pay.escalate[0]"),
        "{:?}",
        rows[0].reason
    );
    assert_eq!(
        decisions(&h.dir, "pay"),
        [
            ("allow".into(), "committed".into(), "tools.pay.tier".into()),
            (
                "approval".into(),
                "requested".into(),
                "tools.pay.escalate[0]".into()
            ),
        ]
    );
    assert_audit_sound(&h);
}

// 8. The audit every step writes.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_corridor_record_names_its_rule_and_policy_and_the_chain_verifies() {
    let mut h = start(&quick_policy(), &[]).await;
    let calls = [
        ("echo", json!({"text": "hi"})),                // allow / committed
        ("echo", json!({"text": "hi", "extra": 1})),    // deny / invalid_args
        ("no_such_tool", json!({})),                    // deny / not_executed
        ("leaky", json!({})),                           // allow / failed
        ("wipe", json!({"target": "/tmp/x"})),          // refuse / dry_run
        ("pay", json!({"amount": 100, "memo": "big"})), // approval / requested
        ("sleepy", json!({"ms": 5000})),                // allow / timeout
    ];
    for (id, (tool, args)) in (1..).zip(calls) {
        h.conn.exchange(id, tool, args).await;
    }
    let outcomes: Vec<(String, String)> = audit(&h.dir)
        .iter()
        .map(|r| {
            let field = |k: &str| r[k].as_str().unwrap_or_default().to_owned();
            (field("decision"), field("outcome"))
        })
        .collect();
    let expected = [
        ("allow", "committed"),
        ("deny", "invalid_args"),
        ("deny", "not_executed"),
        ("allow", "failed"),
        ("refuse", "dry_run"),
        ("approval", "requested"),
        ("allow", "timeout"),
    ];
    assert_eq!(
        outcomes,
        expected.map(|(d, o)| (d.to_owned(), o.to_owned()))
    );
    assert_audit_sound(&h);
}
