//! `toolgate proxy --http`: the gateway as an OAuth resource server in front of an HTTP upstream
//! that writes down every header it receives (`tests/gateway/header_recorder.py`). The caller's
//! token authenticates the caller to the gateway and goes no further: the upstream sees the
//! gateway's own credential (`bearer_env`) and nothing of the caller's.

use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{HttpServer, ISSUER, Scratch, Signer, assert_audit_verifies, claims, jwks, records_of};
use crate::json_lines;

const POLICY: &str = r#"
version = 2
[defaults]
tier = "blocked"
[tools.echo]
tier = "low"
scope = "echo:use"
"#;

/// The recorder on a free port of 127.0.0.1, killed (by pid) when dropped.
struct Recorder {
    child: Child,
    port: u16,
}

impl Recorder {
    fn start(log: &Path) -> Self {
        let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let script =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/gateway/header_recorder.py");
        let child = Command::new("python3")
            .arg(script)
            .args(["--port", &port.to_string(), "--log"])
            .arg(log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("start the header recorder");
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect((Ipv4Addr::LOCALHOST, port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "the header recorder did not listen"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Self { child, port }
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The gateway's own credential for the recorder, in the variable the configuration names.
const UPSTREAM_TOKEN: &str = "the-gateways-own-credential";

/// An upstream configuration naming the recorder at `port`, its token in `REC_TOKEN`.
fn recorder_config(scratch: &Scratch, port: u16) -> std::path::PathBuf {
    let config = scratch.path("upstreams.toml");
    std::fs::write(
        &config,
        format!(
            "[upstreams.rec]\nurl = \"http://127.0.0.1:{port}/mcp\"\nbearer_env = \"REC_TOKEN\"\n"
        ),
    )
    .expect("config");
    config
}

/// `toolgate proxy --http` in front of `recorder` (its token in the environment), trusting
/// `signer`'s tokens, started.
fn proxy_in_front_of(scratch: &Scratch, recorder: &Recorder, signer: &Signer) -> HttpServer {
    let config = recorder_config(scratch, recorder.port);
    let jwks_file = scratch.path("jwks.json");
    std::fs::write(&jwks_file, jwks(&[signer]).to_string()).expect("jwks");
    let mut command = Command::new(env!("CARGO_BIN_EXE_toolgate"));
    command
        .arg("proxy")
        .arg("--policy")
        .arg(scratch.path(&scratch.policy))
        .arg("--data")
        .arg(scratch.path("data"))
        .arg("--config")
        .arg(&config)
        .args(["--http", "127.0.0.1:0", "--issuer", ISSUER, "--jwks-file"])
        .arg(&jwks_file)
        .env("REC_TOKEN", UPSTREAM_TOKEN);
    HttpServer::spawn(command, &scratch.path("proxy.log"))
}

#[test]
fn the_callers_token_never_reaches_the_upstream_and_the_caller_is_its_subject() {
    let scratch = Scratch::with_policy_text("gateway", POLICY);
    let headers_log = scratch.path("upstream-headers.jsonl");
    let recorder = Recorder::start(&headers_log);
    let signer = Signer::p256("ec-1");
    let server = proxy_in_front_of(&scratch, &recorder, &signer);
    let resource = server.resource();

    let alice = signer.sign(&claims(&resource, "user-alice", "echo:use"));
    let reader = signer.sign(&claims(&resource, "user-bob", "other:scope"));
    let result = server.call_result(&alice, "echo", json!({"text": "hello upstream"}));
    assert_eq!(result["content"][0]["text"], "hello upstream", "{result}");
    // Scope and listing hold for upstream tools as for kit tools.
    let refused = server.call(&reader, "echo", json!({"text": "x"}));
    assert_eq!(refused.status, 403, "{}", refused.summary());
    let listed = server
        .rpc(Some(&reader), "tools/list", json!({}))
        .result("tools/list");
    assert_eq!(listed["tools"], json!([]), "{listed}");

    let seen = json_lines(&headers_log);
    assert!(
        seen.iter().any(|r| r["rpc"] == "tools/call"),
        "the call reached the upstream: {seen:#?}"
    );
    for request in &seen {
        let headers = request["headers"].as_object().expect("headers");
        assert_eq!(
            headers.get("authorization"),
            Some(&json!(format!("Bearer {UPSTREAM_TOKEN}"))),
            "{request}"
        );
        for (name, value) in headers {
            let value = value.as_str().unwrap_or_default();
            assert!(
                !value.contains(&alice) && !value.contains(&reader),
                "the caller's token reached the upstream in {name}: {request}"
            );
        }
    }
    let calls: Vec<Value> = records_of(&scratch, "echo");
    let ran = calls
        .iter()
        .find(|r| r["outcome"] == "observed" || r["outcome"] == "committed");
    let ran = ran.unwrap_or_else(|| panic!("no record of the call: {calls:#?}"));
    assert_eq!(
        (&ran["principal"], &ran["upstream"]),
        (&json!("user-alice"), &json!("rec"))
    );
    server.stop();
    assert_audit_verifies(&scratch);
}

/// The upstream's token is a secret of the gateway's: when the upstream echoes it back, the caller
/// gets it redacted, and neither the audit log nor the gateway's log holds it.
#[test]
fn the_upstreams_token_echoed_back_is_redacted_from_the_answer_the_audit_and_the_log() {
    let scratch = Scratch::with_policy_text("gateway", POLICY);
    let recorder = Recorder::start(&scratch.path("upstream-headers.jsonl"));
    let signer = Signer::p256("ec-1");
    let server = proxy_in_front_of(&scratch, &recorder, &signer);
    let alice = signer.sign(&claims(&server.resource(), "user-alice", "echo:use"));
    let result = server.call_result(&alice, "echo", json!({"text": UPSTREAM_TOKEN}));
    let answer = result.to_string();
    assert!(
        !answer.contains(UPSTREAM_TOKEN),
        "the token reached the caller: {answer}"
    );
    assert!(answer.contains("[REDACTED]"), "{answer}");
    assert!(
        records_of(&scratch, "echo")
            .iter()
            .any(|r| r["upstream"] == "rec"),
        "the call was audited"
    );
    server.stop();
    let audit = std::fs::read_to_string(scratch.audit()).expect("audit log");
    assert!(
        !audit.contains(UPSTREAM_TOKEN),
        "the token is in the audit log"
    );
    let log = std::fs::read_to_string(scratch.path("proxy.log")).expect("proxy log");
    assert!(
        !log.contains(UPSTREAM_TOKEN),
        "the token is in the log: {log}"
    );
    assert_audit_verifies(&scratch);
}

/// A `bearer_env` that is not set is a configuration that cannot run: the gateway stops at start
/// (exit 2), naming the upstream and the variable, before it opens its data directory.
#[test]
fn an_upstream_token_variable_that_is_not_set_stops_start_up() {
    let scratch = Scratch::with_policy_text("gateway", POLICY);
    // Nothing listens on port 1, and nothing may try: start-up stops before connecting.
    let config = recorder_config(&scratch, 1);
    let out = assert_cmd::Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .arg("proxy")
        .arg("--policy")
        .arg(scratch.path(&scratch.policy))
        .arg("--data")
        .arg(scratch.data())
        .arg("--config")
        .arg(&config)
        .env_remove("REC_TOKEN")
        .timeout(Duration::from_secs(60))
        .output()
        .expect("run toolgate proxy");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("upstream rec: REC_TOKEN (the upstream's bearer token) is not set"),
        "{stderr}"
    );
    assert!(!scratch.data().exists(), "the data directory was opened");
}
