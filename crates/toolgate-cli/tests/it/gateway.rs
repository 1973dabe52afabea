//! `toolgate proxy` as users run it: the gateway in front of real MCP servers over real pipes.
//!
//! Each test starts `toolgate proxy` as a child process with a policy from `tests/gateway/`, puts a
//! real upstream behind it (the third-party servers `scripts/install-peers` puts in `.peers/`, or
//! this repository's `testbed_upstream` example, whose tools leave their effects in files), and
//! drives it with raw JSON lines in either protocol era. The guarantees are checked on what a user
//! can see: the files an upstream changed or did not change, what reached the upstream
//! (`calls.log`), the answers, and the audit log with its verifier.
//!
//! Nothing here skips: a missing peer or testbed binary fails the test and says how to get it.

mod binary;
mod corridor;
mod eras;
mod filesystem;
mod http;
mod interop;
mod metrics;
mod once;
mod passthrough;
mod pins;
mod signals;
mod startup;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Output, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{Observation, json_lines, observe, toolgate, verify_json, wait_for};

/// How long a test waits for any one answer before it calls the gateway hung.
const ANSWER_WITHIN: Duration = Duration::from_secs(15);

/// The repository's root (`.peers/`, `tests/gateway/` live there).
fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A third-party server installed by `scripts/install-peers`, e.g.
/// `node/node_modules/.bin/mcp-server-filesystem`. Fails (never skips) when it is missing.
fn peer(relative: &str) -> PathBuf {
    let path = repo_root().join(".peers").join(relative);
    assert!(
        path.exists(),
        "peer MCP server {} is missing: run scripts/install-peers (see tests/peers/README.md)",
        path.display()
    );
    path
}

/// The `testbed_upstream` example, next to this test executable (`target/debug/examples/`).
/// `cargo test -p toolgate-cli` builds it; `cargo test --test it` alone does not.
fn testbed_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable's path");
    // target/debug/deps/it-HASH → target/debug/examples/testbed_upstream
    let debug = exe
        .parent()
        .and_then(Path::parent)
        .expect("the test executable is in target/PROFILE/deps");
    let bin = debug.join("examples").join("testbed_upstream");
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/testbed_upstream.rs");
    let built = std::fs::metadata(&bin).and_then(|m| m.modified());
    let Ok(built) = built else {
        panic!(
            "{} is missing: build it with `cargo build -p toolgate-cli --example testbed_upstream` \
             (or run `cargo test -p toolgate-cli` without --test, which builds examples)",
            bin.display()
        );
    };
    let edited = std::fs::metadata(&source)
        .and_then(|m| m.modified())
        .expect("examples/testbed_upstream.rs");
    assert!(
        built >= edited,
        "{} is older than {}: rebuild it with `cargo build -p toolgate-cli --example testbed_upstream`",
        bin.display(),
        source.display()
    );
    bin
}

/// Command words starting the testbed on `dir` serving `protocol` (modern, legacy or both).
pub(crate) fn testbed(dir: &Path, protocol: &str) -> Vec<String> {
    vec![
        testbed_bin().display().to_string(),
        "--dir".to_owned(),
        dir.display().to_string(),
        "--protocol".to_owned(),
        protocol.to_owned(),
    ]
}

/// The tool names in the testbed's `calls.log` (one line per call that reached it).
fn calls(dir: &Path) -> Vec<String> {
    match std::fs::read_to_string(dir.join("calls.log")) {
        Ok(text) => text.lines().map(str::to_owned).collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => panic!("{}: {e}", dir.join("calls.log").display()),
    }
}

/// How many calls of `tool` reached the testbed.
pub(crate) fn calls_of(dir: &Path, tool: &str) -> usize {
    calls(dir).iter().filter(|t| *t == tool).count()
}

/// The testbed's `records.jsonl`: one line per effect of `write_record` or `crash_after_write`.
fn effects(dir: &Path) -> Vec<Value> {
    json_lines(&dir.join("records.jsonl"))
}

/// The testbed's `cancelled.log` lines.
fn cancellations(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("cancelled.log"))
        .map(|t| t.lines().map(str::to_owned).collect())
        .unwrap_or_default()
}

/// A scratch directory with a gateway policy (copied from `tests/gateway/`), the gateway's data
/// directory, and room for upstream directories.
struct Bench {
    dir: tempfile::TempDir,
    policy: PathBuf,
}

impl Bench {
    /// `tests/gateway/FILE`, copied so that `toolgate pin` writes its lock beside the copy.
    fn new(file: &str) -> Self {
        Self::with_policy_text(file, &gateway_policy(file))
    }

    fn with_policy_text(file: &str, text: &str) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let policy = dir.path().join(file);
        std::fs::write(&policy, text).expect("policy");
        Self { dir, policy }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A directory under the scratch directory, created.
    fn mkdir(&self, name: &str) -> PathBuf {
        let path = self.path(name);
        std::fs::create_dir_all(&path).expect("mkdir");
        path
    }

    fn data(&self) -> PathBuf {
        self.path("data")
    }

    fn audit(&self) -> PathBuf {
        self.data().join("audit.jsonl")
    }

    /// Every audit record, parsed.
    fn records(&self) -> Vec<Value> {
        json_lines(&self.audit())
    }

    /// Records of calls to `tool`.
    fn records_of(&self, tool: &str) -> Vec<Value> {
        self.records()
            .into_iter()
            .filter(|r| r["name"] == tool)
            .collect()
    }

    /// `toolgate proxy` on this bench's policy and data with `flags`, then `-- upstream…` when
    /// `upstream` is not empty.
    fn proxy_command(&self, flags: &[String], upstream: &[String]) -> Command {
        let mut command = toolgate();
        command
            .arg("proxy")
            .arg("--policy")
            .arg(&self.policy)
            .arg("--data")
            .arg(self.data())
            .args(flags);
        if !upstream.is_empty() {
            command.arg("--").args(upstream);
        }
        for gate in ["FAILPOINTS", "FS_ALLOW_GATED", "TESTBED_ALLOW_GATED"] {
            command.env_remove(gate);
        }
        command
    }

    /// The proxy with one upstream named `name`, started, with a client of `era` connected.
    fn proxy(&self, name: &str, upstream: &[String], era: Era) -> Proxy {
        let flags = ["--name".to_owned(), name.to_owned()];
        Proxy::start(self.proxy_command(&flags, upstream), era, &self.log_path())
    }

    /// A fresh file for the next gateway's stderr.
    fn log_path(&self) -> PathBuf {
        (0..)
            .map(|n| self.path(&format!("proxy-{n}.log")))
            .find(|p| !p.exists())
            .expect("a free log name")
    }

    /// `toolgate pin` for one upstream named `name`; returns its stdout.
    fn pin(&self, name: &str, upstream: &[String]) -> String {
        let out = toolgate()
            .arg("pin")
            .arg("--policy")
            .arg(&self.policy)
            .args(["--name", name, "--"])
            .args(upstream)
            .output()
            .expect("run toolgate pin");
        assert!(
            out.status.success(),
            "toolgate pin: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `toolgate ARGS… --data DIR`, as a person at another terminal runs it.
    fn cli(&self, args: &[&str]) -> Output {
        toolgate()
            .args(args)
            .arg("--data")
            .arg(self.data())
            .output()
            .expect("run toolgate")
    }

    /// DESIGN.md §5: the scenario's audit log verifies (exit 0, intact, every record counted).
    fn assert_audit_verifies(&self) {
        let records = self.records();
        assert!(!records.is_empty(), "the scenario wrote no audit record");
        let (code, report) = verify_json(&self.audit());
        assert_eq!(
            (code, report["intact"].as_bool()),
            (0, Some(true)),
            "toolgate audit verify: {report}"
        );
        assert_eq!(report["records"].as_u64(), Some(records.len() as u64));
    }
}

/// The text of `tests/gateway/FILE`.
fn gateway_policy(file: &str) -> String {
    let path = repo_root().join("tests/gateway").join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Which protocol era the test's client speaks to the gateway.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Era {
    /// 2026-07-28: no handshake, `_meta` with the version and capabilities on every request.
    Modern,
    /// `initialize` with this revision, then `notifications/initialized`; no `_meta`.
    Legacy(&'static str),
}

/// The request `_meta` of a 2026-07-28 client.
fn modern_meta() -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
    })
}

/// `toolgate proxy` as a child process and a raw JSON-lines client on its pipes. Reading happens
/// on a thread, so every wait is bounded: a gateway that hangs fails the test with what it logged.
struct Proxy {
    child: Child,
    stdin: Option<ChildStdin>,
    incoming: Receiver<Value>,
    /// Messages read while waiting for another answer, in arrival order.
    kept: Vec<Value>,
    next_id: u64,
    era: Era,
    log: PathBuf,
    /// The `initialize` result (legacy clients only).
    init: Value,
}

impl Proxy {
    fn start(mut command: Command, era: Era, log: &Path) -> Self {
        let stderr = std::fs::File::create(log).expect("proxy log");
        command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr);
        let mut child = command.spawn().expect("spawn toolgate proxy");
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let (tx, incoming) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in stdout.lines() {
                let Ok(line) = line else { return };
                let message = serde_json::from_str(&line)
                    .unwrap_or_else(|e| json!({"not_json_rpc": line, "error": e.to_string()}));
                if tx.send(message).is_err() {
                    return;
                }
            }
        });
        let mut proxy = Self {
            child,
            stdin,
            incoming,
            kept: Vec::new(),
            next_id: 1,
            era,
            log: log.to_owned(),
            init: Value::Null,
        };
        if let Era::Legacy(version) = era {
            let id = proxy.request_raw(
                "initialize",
                json!({
                    "protocolVersion": version,
                    "capabilities": {},
                    "clientInfo": {"name": "gateway-test", "version": "0"},
                }),
            );
            // Start-up includes connecting every upstream (a Node or Python process).
            let (init, _) = proxy.answer_within(id, Duration::from_secs(40));
            assert_eq!(
                init["result"]["protocolVersion"],
                version,
                "initialize: {init}\n{}",
                proxy.log_tail()
            );
            proxy.notify("notifications/initialized", json!({}));
            proxy.init = init;
        }
        proxy
    }

    fn write(&mut self, message: &Value) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "{message}").expect("write to the proxy");
        stdin.flush().expect("flush");
    }

    /// Sends a request as is (no `_meta` added); returns its id.
    fn request_raw(&mut self, method: &str, params: Value) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        let message = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        self.write(&message);
        id
    }

    /// Sends a request in this client's era: a 2026-07-28 client merges its `_meta` into any
    /// `_meta` in `params` (a `progressToken`, say).
    fn request(&mut self, method: &str, mut params: Value) -> u64 {
        if self.era == Era::Modern {
            let mut meta = modern_meta();
            if let Some(Value::Object(extra)) = params.get("_meta") {
                for (key, value) in extra {
                    meta[key] = value.clone();
                }
            }
            params["_meta"] = meta;
        }
        self.request_raw(method, params)
    }

    fn notify(&mut self, method: &str, params: Value) {
        let message = json!({"jsonrpc": "2.0", "method": method, "params": params});
        self.write(&message);
    }

    /// The next message, if one arrives before `deadline`.
    fn next_before(&mut self, deadline: Instant) -> Option<Value> {
        let left = deadline.saturating_duration_since(Instant::now());
        match self.incoming.recv_timeout(left) {
            Ok(message) => {
                assert!(
                    message.get("not_json_rpc").is_none(),
                    "stdout carried something other than JSON-RPC: {message}"
                );
                Some(message)
            }
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => {
                let status = self.child.try_wait().ok().flatten();
                panic!(
                    "the proxy closed stdout (exit: {status:?})\n{}",
                    self.log_tail()
                )
            }
        }
    }

    /// The answer to `id` and the messages without an id (notifications) read on the way; other
    /// answers are kept for their own turn.
    fn answer_within(&mut self, id: u64, within: Duration) -> (Value, Vec<Value>) {
        if let Some(at) = self
            .kept
            .iter()
            .position(|m| m["id"] == id && m.get("method").is_none())
        {
            return (self.kept.remove(at), Vec::new());
        }
        let deadline = Instant::now() + within;
        let mut notifications = Vec::new();
        loop {
            let Some(message) = self.next_before(deadline) else {
                panic!(
                    "no answer to request {id} within {within:?}; read meanwhile: {notifications:?} {:?}\n{}",
                    self.kept,
                    self.log_tail()
                );
            };
            if message["id"] == id && message.get("method").is_none() {
                return (message, notifications);
            }
            if message.get("id").is_some() && message.get("method").is_none() {
                self.kept.push(message);
            } else {
                notifications.push(message);
            }
        }
    }

    fn answer(&mut self, id: u64) -> (Value, Vec<Value>) {
        self.answer_within(id, ANSWER_WITHIN)
    }

    /// Everything that arrives during `period` (to show that something did not).
    fn quiet(&mut self, period: Duration) -> Vec<Value> {
        let deadline = Instant::now() + period;
        let mut seen = Vec::new();
        while let Some(message) = self.next_before(deadline) {
            seen.push(message);
        }
        seen
    }

    fn send_call(&mut self, tool: &str, arguments: Value) -> u64 {
        self.request("tools/call", json!({"name": tool, "arguments": arguments}))
    }

    /// A call whose `_meta` also carries `extra` (e.g. a `progressToken`).
    fn send_call_with_meta(&mut self, tool: &str, arguments: Value, extra: Value) -> u64 {
        self.request(
            "tools/call",
            json!({"name": tool, "arguments": arguments, "_meta": extra}),
        )
    }

    /// Sends a call and returns its whole JSON-RPC response.
    fn call(&mut self, tool: &str, arguments: Value) -> Value {
        let id = self.send_call(tool, arguments);
        self.answer(id).0
    }

    /// Calls each of `tools` with `arguments`; each must be refused with JSON-RPC error -32602.
    fn assert_refused(&mut self, tools: &[&str], arguments: &Value) {
        for tool in tools {
            let reply = self.call(tool, arguments.clone());
            assert_eq!(error_code(&reply), Some(-32602), "{tool}: {reply}");
        }
    }

    fn list_tools(&mut self) -> Vec<Value> {
        let id = self.request("tools/list", json!({}));
        let (reply, _) = self.answer(id);
        reply["result"]["tools"]
            .as_array()
            .cloned()
            .unwrap_or_else(|| panic!("tools/list: {reply}\n{}", self.log_tail()))
    }

    fn tool_names(&mut self) -> Vec<String> {
        self.list_tools()
            .iter()
            .map(|t| t["name"].as_str().expect("tool name").to_owned())
            .collect()
    }

    /// The last lines of the gateway's stderr, for failure messages.
    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let from = lines.len().saturating_sub(30);
        format!(
            "--- proxy stderr ({}) ---\n{}",
            self.log.display(),
            lines[from..].join("\n")
        )
    }

    /// Closes stdin and waits for a clean exit.
    fn close(mut self) {
        drop(self.stdin.take());
        let status = wait_for(&mut self.child, Duration::from_secs(15));
        assert!(
            status.success(),
            "proxy exited with {status}\n{}",
            self.log_tail()
        );
    }

    /// SIGKILL, as a crash: no shutdown code runs.
    fn kill(mut self) {
        self.child.kill().expect("SIGKILL");
        let _ = self.child.wait();
    }

    /// Whether the gateway process is still running.
    fn running(&mut self) -> bool {
        self.child.try_wait().expect("try_wait").is_none()
    }
}

impl Drop for Proxy {
    /// A failed test does not leave a gateway behind (its upstreams exit when their stdin closes).
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn is_error(reply: &Value) -> bool {
    reply["result"]["isError"] == true
}

/// The first text block of a result.
fn text(reply: &Value) -> &str {
    reply["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
}

/// A JSON-RPC error's code (`None` for a result).
fn error_code(reply: &Value) -> Option<i64> {
    reply["error"]["code"].as_i64()
}

/// A successful tool result (not an error, not `isError`).
fn assert_ran(reply: &Value, what: &str) {
    assert!(
        reply.get("result").is_some() && !is_error(reply),
        "{what}: expected the tool's result, got {reply}"
    );
}

/// The progress notifications among `messages`, as (token, progress) pairs.
fn progress(messages: &[Value]) -> Vec<(Value, f64)> {
    messages
        .iter()
        .filter(|m| m["method"] == "notifications/progress")
        .map(|m| {
            (
                m["params"]["progressToken"].clone(),
                m["params"]["progress"].as_f64().expect("progress"),
            )
        })
        .collect()
}

/// Progress read before an answer: every notification carries the caller's own token, values
/// increase, and every step but perhaps the last has arrived (the strict "all of them, in order"
/// is `passthrough::every_progress_notification_sent_before_the_answer_arrives_in_order_before_it`).
fn assert_progress(before: &[Value], token: &Value, steps: u32, what: &str) {
    let seen = progress(before);
    assert!(
        seen.iter().all(|(t, _)| t == token),
        "{what}: progress under another token: {seen:?}"
    );
    let values: Vec<f64> = seen.iter().map(|(_, p)| *p).collect();
    let early: Vec<f64> = (1..steps).map(f64::from).collect();
    let all: Vec<f64> = (1..=steps).map(f64::from).collect();
    assert!(
        values == early || values == all,
        "{what}: expected steps {all:?} (the last one may be missing) before the answer, got {values:?}"
    );
}

/// `tool` called with `arguments` and a progress token: it runs, and its `steps` progress
/// notifications come back under `token` ([`assert_progress`]).
fn assert_call_progress(
    proxy: &mut Proxy,
    tool: &str,
    arguments: Value,
    token: &Value,
    steps: u32,
    what: &str,
) {
    let call = proxy.send_call_with_meta(tool, arguments, json!({"progressToken": token}));
    let (reply, before) = proxy.answer(call);
    assert_ran(&reply, tool);
    assert_progress(&before, token, steps, what);
}

/// The everything server's `trigger-long-running-operation` (2 s in 4 steps) under `token`:
/// [`assert_call_progress`]. The stdio and the Streamable HTTP tests make the same call.
fn assert_everything_progress(proxy: &mut Proxy, token: &Value, what: &str) {
    let arguments = json!({"duration": 2, "steps": 4});
    let tool = "trigger-long-running-operation";
    assert_call_progress(proxy, tool, arguments, token, 4, what);
}

/// The `upstream` field of every audit record among `records` named `name`.
fn upstreams_of(records: &[Value], name: &str) -> Vec<Value> {
    records
        .iter()
        .filter(|r| r["name"] == name)
        .map(|r| r["upstream"].clone())
        .collect()
}

/// Polls `probe` every 50 ms until it holds; fails after `limit`.
fn until(what: &str, limit: Duration, mut probe: impl FnMut() -> bool) {
    super::eventually(what, limit, || probe().then_some(()));
}

/// Every file and directory under `root` (and `root` itself) with what "untouched" means for it:
/// a file's content hash, size and mtime; a directory's mtime (a file created and removed again
/// still changes it).
fn tree(root: &Path) -> BTreeMap<PathBuf, Observation> {
    use std::os::unix::fs::MetadataExt;
    let mut found = BTreeMap::new();
    let mut stack = vec![root.to_owned()];
    while let Some(dir) = stack.pop() {
        let meta = std::fs::metadata(&dir).expect("directory metadata");
        let relative = dir.strip_prefix(root).expect("under root").to_owned();
        found.insert(
            relative,
            Observation {
                exists: true,
                sha256: "directory".to_owned(),
                size: 0,
                mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
            },
        );
        for entry in std::fs::read_dir(&dir).expect("read_dir") {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let relative = path.strip_prefix(root).expect("under root").to_owned();
                found.insert(relative, observe(&path));
            }
        }
    }
    found
}
