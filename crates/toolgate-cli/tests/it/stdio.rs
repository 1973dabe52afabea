//! The stdio transport as a client meets it, on a real `toolgate serve` child: what a line the
//! server cannot take is answered (JSON-RPC 2.0 §5.1, one table, a fresh server per case, each
//! followed by a valid request that must still be answered), and how a session ends (SIGTERM,
//! SIGINT, stdin closed) while a call is held for an approval.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{Scratch, eventually, meta, policy_with, send_signal, wait_for};

/// In every refused line, so that a log line quoting one is found (lines may hold secrets).
const CANARY: &str = "canary-5e1f0c";

/// `toolgate serve` on raw pipes: lines out read on a thread, so that every wait is bounded.
struct Wire {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    log: PathBuf,
}

impl Wire {
    fn start(scratch: &Scratch, flags: &[&str]) -> Self {
        let log = scratch.path("serve.log");
        let mut command = scratch.serve_command();
        command
            .args(flags)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).expect("log file"));
        let mut child = command.spawn().expect("spawn toolgate serve");
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in stdout.lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Self {
            child,
            stdin,
            lines,
            log,
        }
    }

    fn write_line(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin.write_all(line.as_bytes()).expect("write a line");
        stdin.write_all(b"\n").expect("write a newline");
        stdin.flush().expect("flush");
    }

    /// The next message from the server, parsed; `None` when nothing came within `limit` or the
    /// server closed stdout. A line that is not JSON fails the test: stdout is the protocol.
    fn next_within(&self, limit: Duration) -> Option<Value> {
        match self.lines.recv_timeout(limit) {
            Ok(line) => Some(
                serde_json::from_str(&line)
                    .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {line:?}")),
            ),
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => None,
        }
    }

    /// Every message up to the answer to `id` (excluded), and that answer.
    fn until_answer(&self, id: &Value, limit: Duration) -> Result<(Vec<Value>, Value), String> {
        let deadline = Instant::now() + limit;
        let mut before = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let Some(message) = self.next_within(left) else {
                return Err(format!(
                    "no answer to {id} within {limit:?}; read before it: {before:?}"
                ));
            };
            if &message["id"] == id && message.get("method").is_none() {
                return Ok((before, message));
            }
            before.push(message);
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Closes stdin; the exit status once the process is gone.
    fn close(&mut self) -> std::process::ExitStatus {
        drop(self.stdin.take());
        wait_for(&mut self.child, Duration::from_secs(15))
    }
}

impl Drop for Wire {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the server must send for a refused line before it answers the next request.
enum Expect {
    /// One error response with this code and this `id` (`null` included).
    Error(i64, Value),
    /// Nothing: JSON-RPC answers no notification.
    Nothing,
}

struct Case {
    what: &'static str,
    line: String,
    expect: Expect,
}

fn case(what: &'static str, line: impl Into<String>, expect: Expect) -> Case {
    Case {
        what,
        line: line.into(),
        expect,
    }
}

/// A 2026-07-28 `tools/call` line with `id` and `params`, the `_meta` added.
fn call_line(id: &Value, mut params: Value) -> String {
    if let Some(params) = params.as_object_mut() {
        params.insert("_meta".to_owned(), meta());
    }
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params}).to_string()
}

/// A `write_note` call whose `arguments` are `arguments` written as raw JSON text (for what
/// `serde_json::Value` cannot hold: lone surrogates, 1e400, deep nesting).
fn raw_call(id: u64, arguments: &str) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"write_note","arguments":{arguments},"_meta":{}}}}}"#,
        meta()
    )
}

fn cases() -> Vec<Case> {
    use Expect::{Error, Nothing};
    let deep = |depth: usize| format!("{}\"{CANARY}\"{}", "[".repeat(depth), "]".repeat(depth));
    let mut huge = raw_call(
        107,
        &json!({"request_id": "req-oversized", "text": format!("{CANARY}{}", "x".repeat(4 * 1024 * 1024))})
            .to_string(),
    );
    huge.push(' ');
    vec![
        case(
            "not JSON at all",
            format!("{CANARY} is not JSON"),
            Error(-32700, Value::Null),
        ),
        case(
            "a truncated object",
            format!(
                r#"{{"jsonrpc":"2.0","id":102,"method":"tools/list","params":{{"{CANARY}":1}}"#
            ),
            Error(-32700, Value::Null),
        ),
        case(
            "a lone surrogate escape, as JavaScript's JSON.stringify writes it",
            raw_call(
                103,
                &format!(r#"{{"request_id":"req-surrogate","text":"{CANARY} \ud83d"}}"#),
            ),
            Error(-32700, json!(103)),
        ),
        case(
            "a number beyond double range",
            raw_call(
                104,
                &format!(r#"{{"request_id":"req-range","text":"{CANARY}","n":1e400}}"#),
            ),
            Error(-32700, json!(104)),
        ),
        case(
            "nesting deeper than the parser's limit, in the arguments",
            raw_call(
                105,
                &format!(r#"{{"request_id":"req-deep","text":{}}}"#, deep(200)),
            ),
            Error(-32700, json!(105)),
        ),
        case(
            "nesting deeper than the parser's limit, the whole line",
            deep(200),
            Error(-32700, Value::Null),
        ),
        case(
            "a line over the 4 MiB limit",
            huge,
            Error(-32700, Value::Null),
        ),
        case(
            "an array (a batch, which this server does not take)",
            format!(
                r#"[{{"jsonrpc":"2.0","id":108,"method":"tools/list","params":{{"{CANARY}":1}}}}]"#
            ),
            Error(-32600, Value::Null),
        ),
        case(
            "no jsonrpc member",
            format!(r#"{{"id":109,"method":"tools/list","params":{{"{CANARY}":1}}}}"#),
            Error(-32600, json!(109)),
        ),
        case(
            "a string id and a method that is not a string",
            format!(r#"{{"jsonrpc":"2.0","id":"req-110","method":110,"params":{{"{CANARY}":1}}}}"#),
            Error(-32600, json!("req-110")),
        ),
        case(
            "an id that is an object",
            format!(r#"{{"jsonrpc":"2.0","id":{{"{CANARY}":1}},"method":"tools/list"}}"#),
            Error(-32600, Value::Null),
        ),
        case(
            "an id that is null",
            format!(
                r#"{{"jsonrpc":"2.0","id":null,"method":"tools/list","params":{{"{CANARY}":1}}}}"#
            ),
            Error(-32600, Value::Null),
        ),
        case(
            "an integer id beyond 64-bit signed",
            format!(
                r#"{{"jsonrpc":"2.0","id":18446744073709551615,"method":"tools/list","params":{{"{CANARY}":1}}}}"#
            ),
            Error(-32600, json!(18_446_744_073_709_551_615_u64)),
        ),
        case(
            "JSON-RPC 2.0's own example: method 1, params \"bar\"",
            format!(r#"{{"jsonrpc":"2.0","method":1,"params":"{CANARY}"}}"#),
            Error(-32600, Value::Null),
        ),
        case(
            "tools/call with params that are not an object",
            json!({"jsonrpc": "2.0", "id": 115, "method": "tools/call", "params": CANARY})
                .to_string(),
            Error(-32602, json!(115)),
        ),
        case(
            "tools/call without a name",
            call_line(&json!(116), json!({"arguments": {"text": CANARY}})),
            Error(-32602, json!(116)),
        ),
        case(
            "tools/call with a name that is not a string",
            call_line(
                &json!("req-117"),
                json!({"name": 117, "arguments": {"text": CANARY}}),
            ),
            Error(-32602, json!("req-117")),
        ),
        case(
            "tools/call with arguments that are not an object",
            call_line(
                &json!(118),
                json!({"name": "write_note", "arguments": [CANARY]}),
            ),
            Error(-32602, json!(118)),
        ),
        case(
            "a notification with a lone surrogate escape",
            format!(
                r#"{{"jsonrpc":"2.0","method":"notifications/cancelled","params":{{"requestId":1,"reason":"{CANARY} \ud83d"}}}}"#
            ),
            Nothing,
        ),
    ]
}

/// One case on a fresh server: the refused line, then a valid request that must be answered;
/// then the log must hold a warning about the line and not the line itself.
fn run(case: &Case) -> Result<(), String> {
    let scratch = Scratch::new();
    let mut wire = Wire::start(&scratch, &[]);
    wire.write_line(&case.line);
    let after = json!("after");
    wire.write_line(
        &json!({"jsonrpc": "2.0", "id": after, "method": "tools/list", "params": {"_meta": meta()}})
            .to_string(),
    );
    let (before, answer) = wire.until_answer(&after, Duration::from_secs(20))?;
    if answer.get("result").is_none() {
        return Err(format!("the next request was not served: {answer}"));
    }
    match &case.expect {
        Expect::Nothing if !before.is_empty() => {
            return Err(format!("expected no answer, got {before:?}"));
        }
        Expect::Nothing => {}
        Expect::Error(code, id) => {
            let [reply] = before.as_slice() else {
                return Err(format!("expected one error answer, got {before:?}"));
            };
            if reply.get("id") != Some(id) || reply["error"]["code"] != *code {
                return Err(format!("expected error {code} with id {id}, got {reply}"));
            }
            if reply.get("result").is_some() || reply["jsonrpc"] != "2.0" {
                return Err(format!("not a JSON-RPC error response: {reply}"));
            }
        }
    }
    let status = wire.close();
    if !status.success() {
        return Err(format!("serve exited with {status}"));
    }
    let log = wire.log_text();
    if log.contains(CANARY) {
        return Err("the log quotes the refused line".to_owned());
    }
    let warned = log.lines().any(|line| {
        let record: Value = serde_json::from_str(line).unwrap_or_default();
        record["level"] == "WARN"
            && record["target"] == "toolgate::stdio"
            && (record["fields"]["bytes"].is_u64() || record["fields"]["limit"].is_u64())
            && record["fields"]["reason"].is_string()
    });
    if !warned {
        return Err(format!(
            "no warning with the line's length and a reason:\n{log}"
        ));
    }
    Ok(())
}

#[test]
fn every_line_the_server_cannot_take_is_answered_as_json_rpc_says_and_serving_goes_on() {
    let failed: Vec<String> = cases()
        .iter()
        .filter_map(|case| run(case).err().map(|why| format!("{}: {why}", case.what)))
        .collect();
    assert!(
        failed.is_empty(),
        "{} case(s) failed:\n{}",
        failed.len(),
        failed.join("\n")
    );
}

#[test]
fn refusals_and_answers_written_at_once_never_share_a_line() {
    let scratch = Scratch::new();
    let mut wire = Wire::start(&scratch, &[]);
    let calls = 150;
    // One write: the server reads refused lines while it answers the calls before them.
    let mut burst = String::new();
    for i in 0..calls {
        let id = json!(i);
        let arguments = json!({"request_id": format!("req-burst-{i:04}"), "text": "t"});
        burst.push_str(&call_line(
            &id,
            json!({"name": "write_note", "arguments": arguments}),
        ));
        burst.push('\n');
        burst.push_str(&format!("{CANARY} {i}\n"));
    }
    wire.write_line(burst.trim_end());
    let (mut results, mut errors) = (0, 0);
    for _ in 0..2 * calls {
        let message = wire
            .next_within(Duration::from_secs(20))
            .expect("an answer for every line");
        if message["result"]["structuredContent"]["status"] == "committed" {
            results += 1;
        } else if message["error"]["code"] == -32700 && message["id"].is_null() {
            errors += 1;
        } else {
            panic!("unexpected message: {message}");
        }
    }
    assert_eq!((results, errors), (calls, calls));
    assert!(wire.close().success());
}

/// The shipped orders policy, with a hold long enough that only the end of the session can
/// answer a held call (an approval wait of 60 s, approvals that live 10 min).
fn orders_held() -> Scratch {
    let text = policy_with(
        "orders.toml",
        &[("approval_wait", "\"60s\""), ("approval_ttl", "\"10m\"")],
    );
    Scratch::with_policy_text("orders", &text)
}

/// A refund of 49 (high tier: held for a person), sent; returns its id and, once the server
/// opened it, the approval's id.
fn hold_a_refund(scratch: &Scratch, wire: &mut Wire) -> (Value, String) {
    let id = json!(1);
    let arguments = json!({"order_id": "ord_1001", "amount": 49});
    wire.write_line(&call_line(
        &id,
        json!({"name": "refund", "arguments": arguments}),
    ));
    let approval = eventually("a pending approval", Duration::from_secs(10), || {
        let out = scratch.cli(&["approvals", "list", "--json"]);
        let rows: Value = serde_json::from_slice(&out.stdout).ok()?;
        rows[0]["id"].as_str().map(str::to_owned)
    });
    (id, approval)
}

/// The held call's answer is its pending answer for `approval`.
fn assert_pending(reply: &Value, approval: &str) {
    let content = &reply["result"]["structuredContent"];
    assert_eq!(
        (&content["status"], content["approval_id"].as_str()),
        (&json!("pending_approval"), Some(approval)),
        "{reply}"
    );
    let text = reply["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default();
    assert!(
        text.contains("call again with the same arguments after it is decided"),
        "{reply}"
    );
}

/// `signal` while a call is held: the call gets its pending answer at once, and the process
/// exits 0 long before its grace (10 s) is over.
fn held_call_answered_on(signal: &str) {
    let scratch = orders_held();
    let mut wire = Wire::start(&scratch, &["--grace", "10"]);
    let (id, approval) = hold_a_refund(&scratch, &mut wire);
    let sent = Instant::now();
    send_signal(&wire.child, signal);
    let (_, reply) = wire
        .until_answer(&id, Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("{signal}: {e}\n{}", wire.log_text()));
    assert_pending(&reply, &approval);
    let status = wait_for(&mut wire.child, Duration::from_secs(10));
    assert!(
        status.success(),
        "{signal}: exit {status}\n{}",
        wire.log_text()
    );
    assert!(
        sent.elapsed() < Duration::from_secs(3),
        "{signal}: took {:?}",
        sent.elapsed()
    );
    assert!(
        !wire.log_text().contains("cancelled by the client"),
        "{}",
        wire.log_text()
    );
}

#[test]
fn sigterm_answers_a_held_call_with_its_pending_answer_and_exits_0() {
    held_call_answered_on("TERM");
}

#[test]
fn sigint_answers_a_held_call_with_its_pending_answer_and_exits_0() {
    held_call_answered_on("INT");
}

#[test]
fn stdin_closed_with_a_held_call_answers_it_at_once_and_exits_0_without_waiting() {
    let scratch = orders_held();
    let mut wire = Wire::start(&scratch, &["--grace", "0"]);
    let (id, approval) = hold_a_refund(&scratch, &mut wire);
    let closed = Instant::now();
    drop(wire.stdin.take());
    let (_, reply) = wire
        .until_answer(&id, Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("{e}\n{}", wire.log_text()));
    assert_pending(&reply, &approval);
    let status = wait_for(&mut wire.child, Duration::from_secs(10));
    assert!(status.success(), "exit {status}\n{}", wire.log_text());
    // Before, the process waited rmcp's 5 s drain out and the call got no answer.
    assert!(
        closed.elapsed() < Duration::from_secs(2),
        "took {:?}",
        closed.elapsed()
    );
}

/// A session with stdin and stdout as `kind` makes: one initialize-less `tools/list` answered, then
/// stdin closed. Returns the flags of the file descriptions the child had, read after it exited.
fn session_on(
    stdin: std::os::fd::OwnedFd,
    stdout: std::os::fd::OwnedFd,
    mut write: impl Write,
    read: impl std::io::Read,
) -> (rustix::fs::OFlags, rustix::fs::OFlags) {
    let scratch = Scratch::new();
    let (stdin_copy, stdout_copy) = (
        stdin.try_clone().expect("dup stdin"),
        stdout.try_clone().expect("dup stdout"),
    );
    let mut child = scratch
        .serve_command()
        .stdin(Stdio::from(stdin))
        .stdout(Stdio::from(stdout))
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn toolgate serve");
    let request =
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": meta()}});
    writeln!(write, "{request}").expect("write the request");
    let mut answer = String::new();
    BufReader::new(read)
        .read_line(&mut answer)
        .expect("read the answer");
    let answer: Value = serde_json::from_str(&answer).expect("the answer is JSON");
    assert_eq!(answer["id"], 1, "{answer}");
    assert!(answer["result"]["tools"].is_array(), "{answer}");
    drop(write);
    assert!(child.wait().expect("wait").success());
    (
        rustix::fs::fcntl_getfl(&stdin_copy).expect("stdin flags"),
        rustix::fs::fcntl_getfl(&stdout_copy).expect("stdout flags"),
    )
}

/// Clients spawn servers with a socket or a pipe on stdin and stdout (Python's asyncio: a
/// socketpair and a pipe; Node: socketpairs); the server drives those on its reactor in
/// non-blocking mode. A session must work on each, and the server must leave the file
/// descriptions as it found them, since the process that gave them may share them.
#[test]
fn a_session_on_sockets_or_pipes_works_and_leaves_them_blocking() {
    use rustix::fs::OFlags;
    use std::os::unix::net::UnixStream;

    let (client_in, server_in) = UnixStream::pair().expect("socketpair");
    let (client_out, server_out) = UnixStream::pair().expect("socketpair");
    let flags = session_on(server_in.into(), server_out.into(), client_in, client_out);
    assert!(
        !flags.0.contains(OFlags::NONBLOCK),
        "stdin socket left non-blocking"
    );
    assert!(
        !flags.1.contains(OFlags::NONBLOCK),
        "stdout socket left non-blocking"
    );

    let (server_in, client_in) = std::io::pipe().expect("pipe");
    let (client_out, server_out) = std::io::pipe().expect("pipe");
    let flags = session_on(server_in.into(), server_out.into(), client_in, client_out);
    assert!(
        !flags.0.contains(OFlags::NONBLOCK),
        "stdin pipe left non-blocking"
    );
    assert!(
        !flags.1.contains(OFlags::NONBLOCK),
        "stdout pipe left non-blocking"
    );
}

/// `toolgate serve` has tools and nothing else: it declares only `tools`, on `server/discover`
/// and on `initialize`, and answers `prompts/*` and `resources/*` as unknown methods (-32601)
/// rather than with empty lists.
#[test]
fn serve_declares_only_tools_and_answers_prompts_as_an_unknown_method() {
    let scratch = Scratch::new();
    let mut server = scratch.serve(&[]);
    let id = server.send("server/discover", json!({}));
    let discovered = server.answer(id).0;
    let capabilities = &discovered["result"]["capabilities"];
    assert!(capabilities["tools"].is_object(), "{discovered}");
    assert!(capabilities.get("prompts").is_none(), "{discovered}");
    assert!(capabilities.get("resources").is_none(), "{discovered}");
    for method in [
        "prompts/list",
        "prompts/get",
        "resources/list",
        "resources/templates/list",
        "resources/read",
    ] {
        let id = server.send(method, json!({"name": "x", "uri": "file:///x"}));
        let reply = server.answer(id).0;
        assert_eq!(reply["error"]["code"], -32601, "{method}: {reply}");
    }
    server.close();

    let mut wire = Wire::start(&scratch, &[]);
    wire.write_line(
        &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "stdio-tests", "version": "0"}}})
        .to_string(),
    );
    let (_, init) = wire
        .until_answer(&json!(1), Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("initialize: {e}\n{}", wire.log_text()));
    let capabilities = &init["result"]["capabilities"];
    assert!(capabilities["tools"].is_object(), "{init}");
    assert!(capabilities.get("prompts").is_none(), "{init}");
    assert!(capabilities.get("resources").is_none(), "{init}");
    wire.close();
}
