//! Process tests of programs written against toolgate's public API: the kit probe
//! (`src/bin/kit_probe.rs`) spoken to over real stdio, as an MCP client spawns a server.

mod kit;

use std::process::ExitStatus;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tempfile::TempDir;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

/// How long any one answer may take before the test fails (a hung server must not hang CI).
const PATIENCE: Duration = Duration::from_secs(15);

/// The kit probe, running on its own data directory.
struct Probe {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: Lines<BufReader<ChildStdout>>,
    stderr: Arc<Mutex<String>>,
    /// Messages read while waiting for another id.
    seen: Vec<Value>,
    data: TempDir,
}

impl Probe {
    /// Starts the probe with `env` set on top of a clean gate environment.
    async fn start(env: &[(&str, &str)]) -> Self {
        let data = tempfile::tempdir().expect("data dir");
        let mut command = Command::new(env!("CARGO_BIN_EXE_kit_probe"));
        command
            .env("PROBE_DATA", data.path())
            .env_remove("PROBE_ALLOW_GATED")
            .env_remove("PROBE_OWN_SWITCH")
            .env_remove("MCP_LOG_LEVEL")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        for (name, value) in env {
            command.env(name, value);
        }
        let mut child = command.spawn().expect("spawn kit_probe");
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let mut err = child.stderr.take().expect("stderr");
        let stderr = Arc::new(Mutex::new(String::new()));
        let sink = stderr.clone();
        tokio::spawn(async move {
            let mut buf = [0u8; 4096];
            while let Ok(n) = err.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                let text = String::from_utf8_lossy(&buf[..n]).into_owned();
                sink.lock().expect("stderr buffer").push_str(&text);
            }
        });
        Self {
            child,
            stdin,
            stdout,
            stderr,
            seen: Vec::new(),
            data,
        }
    }

    async fn send(&mut self, message: &Value) {
        let stdin = self.stdin.as_mut().expect("stdin still open");
        let mut line = message.to_string();
        line.push('\n');
        stdin.write_all(line.as_bytes()).await.expect("write");
        stdin.flush().await.expect("flush");
    }

    /// Sends a bare `tools/call` (the kit adopts it as a 2026-07-28 request).
    async fn call_async(&mut self, id: u64, tool: &str, arguments: Value) {
        self.send(&json!({
            "jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": tool, "arguments": arguments},
        }))
        .await;
    }

    /// Calls `tool` and waits for its answer.
    async fn call(&mut self, id: u64, tool: &str, arguments: Value) -> Value {
        self.call_async(id, tool, arguments).await;
        self.answer(id).await
    }

    /// The next message on stdout, which must be JSON.
    async fn next(&mut self) -> Option<Value> {
        let line = tokio::time::timeout(PATIENCE, self.stdout.next_line())
            .await
            .expect("the probe answered in time")
            .expect("read stdout")?;
        Some(serde_json::from_str(&line).unwrap_or_else(|e| panic!("stdout line {line:?}: {e}")))
    }

    /// The answer to request `id`; what arrives before it is kept in `seen`.
    async fn answer(&mut self, id: u64) -> Value {
        if let Some(at) = self.seen.iter().position(|m| m["id"] == id) {
            return self.seen.remove(at);
        }
        loop {
            let message = self.next().await.expect("stdout closed before the answer");
            if message["id"] == id {
                return message;
            }
            self.seen.push(message);
        }
    }

    /// Closes stdin and reads stdout to its end: every message still to come, and how the
    /// process exited.
    async fn finish(mut self) -> (Vec<Value>, ExitStatus, String, TempDir) {
        drop(self.stdin.take());
        let mut rest = std::mem::take(&mut self.seen);
        while let Some(message) = self.next().await {
            rest.push(message);
        }
        let status = tokio::time::timeout(PATIENCE, self.child.wait())
            .await
            .expect("the probe exited in time")
            .expect("wait");
        let stderr = self.stderr();
        (rest, status, stderr, self.data)
    }

    fn stderr(&self) -> String {
        self.stderr.lock().expect("stderr buffer").clone()
    }
}

/// The structured content of a call's result.
fn structured(answer: &Value) -> &Value {
    &answer["result"]["structuredContent"]
}

/// The audit records of `dir`, as JSON.
fn audit(dir: &TempDir) -> Vec<Value> {
    std::fs::read_to_string(dir.path().join("audit.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|line| serde_json::from_str(line).expect("audit record"))
        .collect()
}
