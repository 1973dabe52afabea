//! The `toolgate` binary as users and clients run it: real child processes over real pipes.

mod agent;
mod approvals;
mod clients;
mod console;
mod crash;
mod gateway;
mod http;
mod interop;
mod notify;
mod process;
mod stdio;
mod tiers;
mod verify;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use toolgate_core::policy::SEED_POLICY;

fn toolgate() -> Command {
    Command::new(env!("CARGO_BIN_EXE_toolgate"))
}

/// A scratch directory with a policy in it (the seed policy unless a test picks another).
struct Scratch {
    dir: tempfile::TempDir,
    /// File name, inside the directory, of the policy `serve` is given.
    policy: String,
    /// Built-in toolset `serve` is given; `None` leaves the server's default (ledger).
    toolset: Option<String>,
}

impl Scratch {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("policy.json"), SEED_POLICY).expect("policy");
        Self {
            dir,
            policy: "policy.json".to_owned(),
            toolset: None,
        }
    }

    /// The repository's `policies/FILE`, served with the toolset it ships for (`orders.toml` →
    /// `orders`). Copied, so that nothing a test does can change the shipped file.
    fn with_policy(file: &str) -> Self {
        let toolset = file.trim_end_matches(".toml");
        Self::with_policy_text(toolset, &repo_policy(file))
    }

    /// A policy written by the test (other numbers than the shipped one), served with `toolset`.
    fn with_policy_text(toolset: &str, text: &str) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let policy = format!("{toolset}.toml");
        std::fs::write(dir.path().join(&policy), text).expect("policy");
        Self {
            dir,
            policy,
            toolset: Some(toolset.to_owned()),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn data(&self) -> PathBuf {
        self.path("data")
    }

    fn audit(&self) -> PathBuf {
        self.data().join("audit.jsonl")
    }

    /// Every record of the audit log, parsed.
    fn records(&self) -> Vec<Value> {
        json_lines(&self.audit())
    }

    /// Every effect the orders toolset made durable (one line per refund, note, email).
    fn effects(&self) -> Vec<Value> {
        json_lines(&self.data().join("orders").join("orders-effects.jsonl"))
    }

    /// The refunds among [`Self::effects`], in the order they were made.
    fn refunds(&self) -> Vec<Value> {
        self.effects()
            .into_iter()
            .filter(|e| e["kind"] == "refund")
            .collect()
    }

    /// The CSRF token of a console page (its decision or sign-out form), as the browser sends it.
    fn csrf_of(page: &str) -> String {
        let field = r#"name="csrf" value=""#;
        let at = page.find(field).expect("a CSRF field on the page") + field.len();
        page[at..at + 64].to_owned()
    }

    /// `toolgate serve` on this directory's policy and data, not yet started.
    fn serve_command(&self) -> Command {
        let mut command = toolgate();
        command
            .arg("serve")
            .arg("--policy")
            .arg(self.path(&self.policy))
            .arg("--data")
            .arg(self.data());
        if let Some(toolset) = &self.toolset {
            command.arg("--toolset").arg(toolset);
        }
        command.env_remove("FAILPOINTS");
        command
    }

    fn serve(&self, env: &[(&str, String)]) -> Server {
        Server::start(self.serve_command(), env)
    }

    /// `toolgate ARGS... --data DIR`, run to completion (approvals, killswitch: other processes
    /// than the server, as a person at another terminal would run them).
    fn cli(&self, args: &[&str]) -> std::process::Output {
        toolgate()
            .args(args)
            .arg("--data")
            .arg(self.data())
            .output()
            .expect("run toolgate")
    }
}

/// A JSON Lines file, parsed; a missing file is no lines (nothing was ever written).
fn json_lines(path: &Path) -> Vec<Value> {
    match std::fs::read_to_string(path) {
        Ok(text) => text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => panic!("{}: {e}", path.display()),
    }
}

/// The text of the repository's `policies/FILE`.
fn repo_policy(file: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../policies")
        .join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The repository's `policies/FILE` with some `key = value` lines replaced (e.g.
/// `("approval_wait", "\"1s\"")`). Every key must be there, so that a change to the shipped
/// file cannot silently leave a test on the wrong numbers.
fn policy_with(file: &str, changes: &[(&str, &str)]) -> String {
    let mut text = repo_policy(file);
    for (key, value) in changes {
        let prefix = format!("{key} =");
        let line = text
            .lines()
            .find(|l| l.trim_start().starts_with(&prefix))
            .unwrap_or_else(|| panic!("policies/{file} has no `{key} =` line"))
            .to_owned();
        text = text.replacen(&line, &format!("{key} = {value}"), 1);
    }
    text
}

/// `toolgate serve` as a child process, driven with raw 2026-07-28 JSON lines.
struct Server {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    next_id: u64,
    /// Responses read while waiting for another one ([`Self::answer`]), in arrival order.
    stash: Vec<Value>,
}

fn meta() -> Value {
    json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}})
}

impl Server {
    fn start(command: Command, env: &[(&str, String)]) -> Self {
        Self::spawn(command, env, Stdio::null())
    }

    fn spawn(mut command: Command, env: &[(&str, String)], stderr: Stdio) -> Self {
        command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr);
        for (key, value) in env {
            command.env(key, value);
        }
        let mut child = command.spawn().expect("spawn toolgate serve");
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        Self {
            child,
            stdin,
            stdout,
            next_id: 1,
            stash: Vec::new(),
        }
    }

    /// Sends any request with `params` (the 2026-07-28 `_meta` is added); returns its id.
    fn send(&mut self, method: &str, mut params: Value) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        let mut full = meta();
        if let Some(Value::Object(extra)) = params.get("_meta") {
            for (key, value) in extra {
                full[key] = value.clone();
            }
        }
        params["_meta"] = full;
        let message = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "{message}").expect("write request");
        stdin.flush().expect("flush");
        id
    }

    /// Reads until the response to `id`; returns it with the notifications read on the way.
    /// Responses to other requests are kept for their own `answer`.
    fn answer(&mut self, id: u64) -> (Value, Vec<Value>) {
        if let Some(at) = self.stash.iter().position(|r| r["id"] == id) {
            return (self.stash.remove(at), Vec::new());
        }
        let mut notifications = Vec::new();
        loop {
            let message = self.read();
            if message["id"] == id {
                return (message, notifications);
            }
            if message.get("id").is_some() {
                self.stash.push(message);
            } else {
                notifications.push(message);
            }
        }
    }

    /// Sends a call whose `_meta` also carries `extra` (e.g. a `progressToken`); returns its id.
    fn send_call_with_meta(&mut self, tool: &str, arguments: Value, extra: Value) -> u64 {
        self.send(
            "tools/call",
            json!({"name": tool, "arguments": arguments, "_meta": extra}),
        )
    }

    /// `tools/list`: the tools' entries.
    fn list_tools(&mut self) -> Vec<Value> {
        let id = self.send("tools/list", json!({}));
        let (reply, _) = self.answer(id);
        reply["result"]["tools"]
            .as_array()
            .cloned()
            .unwrap_or_else(|| panic!("tools/list: {reply}"))
    }

    fn send_call(&mut self, tool: &str, arguments: Value) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        let message = json!({
            "jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": tool, "arguments": arguments, "_meta": meta()},
        });
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "{message}").expect("write request");
        stdin.flush().expect("flush");
        id
    }

    fn read(&mut self) -> Value {
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("read a line");
        assert!(!line.is_empty(), "server closed stdout");
        serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("stdout is not JSON-RPC ({e}): {line:?}"))
    }

    /// Sends a call and returns the whole JSON-RPC response.
    fn call(&mut self, tool: &str, arguments: Value) -> Value {
        let id = self.send_call(tool, arguments);
        let reply = self.read();
        assert_eq!(reply["id"], id, "{reply}");
        reply
    }

    /// Closes stdin and waits for a clean exit.
    fn close(mut self) {
        drop(self.stdin.take());
        let status = wait_for(&mut self.child, Duration::from_secs(10));
        assert!(status.success(), "serve exited with {status}");
    }

    /// SIGKILL, as a crash.
    fn kill(mut self) {
        self.child.kill().expect("SIGKILL");
        let _ = self.child.wait();
    }
}

fn wait_for(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "process did not exit within {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Sends `signal` (`TERM`, `INT`) to `child` by its pid, as `kill` does.
fn send_signal(child: &Child, signal: &str) {
    let pid = child.id().to_string();
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(&pid)
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{signal} {pid} failed");
}

/// Polls `probe` every 50 ms until it gives a value; fails the test after `limit`.
fn eventually<T>(what: &str, limit: Duration, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = probe() {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "{what} did not happen within {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `toolgate audit verify FILE --json`, parsed, with the exit code.
fn verify_json(file: &Path) -> (i32, Value) {
    let out = toolgate()
        .args(["audit", "verify", "--json"])
        .arg(file)
        .output()
        .expect("run verify");
    let value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out.status.code().unwrap_or(-1), value)
}

/// What "the file was not touched" means: existence, content hash, size, mtime in ns.
#[derive(Debug, PartialEq, Eq)]
struct Observation {
    exists: bool,
    sha256: String,
    size: u64,
    mtime_ns: i128,
}

fn observe(path: &Path) -> Observation {
    use sha2::Digest;
    match std::fs::metadata(path) {
        Ok(meta) => Observation {
            exists: true,
            sha256: hex::encode(sha2::Sha256::digest(
                std::fs::read(path).expect("read the observed file"),
            )),
            size: meta.len(),
            mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
        },
        Err(_) => Observation {
            exists: false,
            sha256: String::new(),
            size: 0,
            mtime_ns: 0,
        },
    }
}
