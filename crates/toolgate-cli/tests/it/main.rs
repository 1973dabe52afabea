//! The `toolgate` binary as users and clients run it: real child processes over real pipes.

mod clients;
mod crash;
mod interop;
mod process;
mod verify;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use toolgate_core::policy::SEED_POLICY;

fn toolgate() -> Command {
    Command::new(env!("CARGO_BIN_EXE_toolgate"))
}

/// A scratch directory with the seed policy in it.
struct Scratch {
    dir: tempfile::TempDir,
}

impl Scratch {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("policy.json"), SEED_POLICY).expect("policy");
        Self { dir }
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

    /// `toolgate serve` on this directory's policy and data, not yet started.
    fn serve_command(&self) -> Command {
        let mut command = toolgate();
        command
            .arg("serve")
            .arg("--policy")
            .arg(self.path("policy.json"))
            .arg("--data")
            .arg(self.data());
        command.env_remove("FAILPOINTS");
        command
    }

    fn serve(&self, env: &[(&str, String)]) -> Server {
        Server::start(self.serve_command(), env)
    }
}

/// `toolgate serve` as a child process, driven with raw 2026-07-28 JSON lines.
struct Server {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    next_id: u64,
}

fn meta() -> Value {
    json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}})
}

impl Server {
    fn start(mut command: Command, env: &[(&str, String)]) -> Self {
        command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
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
        }
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
