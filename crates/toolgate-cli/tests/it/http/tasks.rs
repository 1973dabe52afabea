//! `toolgate proxy --http` passing the 2026-07-28 tasks extension (SEP-2663) from a real upstream
//! that runs tool calls as tasks (the `conformance_upstream` example, over stdio) to real
//! callers with their own tokens: the task is handed to the caller that asked, its result is
//! redacted as a call's result is, another principal's attempt to read or cancel it is answered
//! as an unknown task and never reaches the upstream, and the audit log says when each task began
//! and how it ended, once.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{
    HttpServer, ISSUER, MODERN, Reply, Scratch, Signer, assert_audit_verifies, claims, jwks,
    next_id, records_of, text_of,
};

const POLICY: &str = r#"
version = 2
[defaults]
tier = "low"
[tools.slow_compute]
idempotency_key = "label"
"#;

/// An AWS access key id: secret-shaped, so redacted wherever a tool result carries it.
const SECRET: &str = "AKIAIOSFODNN7EXAMPLE";

/// The `conformance_upstream` example beside this test executable (`cargo test -p toolgate-cli`
/// builds it).
fn conformance_upstream() -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable's path");
    let bin = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/debug")
        .join("examples/conformance_upstream");
    assert!(
        bin.exists(),
        "{} is missing: run `cargo test -p toolgate-cli` (it builds the examples)",
        bin.display()
    );
    bin
}

/// `toolgate proxy --http` in front of `conformance_upstream --stdio`, trusting `signer`.
fn gateway(scratch: &Scratch, signer: &Signer) -> HttpServer {
    let jwks_file = scratch.path("jwks.json");
    std::fs::write(&jwks_file, jwks(&[signer]).to_string()).expect("jwks");
    let mut command = Command::new(env!("CARGO_BIN_EXE_toolgate"));
    command
        .arg("proxy")
        .arg("--policy")
        .arg(scratch.path(&scratch.policy))
        .arg("--data")
        .arg(scratch.path("data"))
        .args(["--name", "jobs"])
        .args(["--http", "127.0.0.1:0", "--issuer", ISSUER, "--jwks-file"])
        .arg(&jwks_file)
        .arg("--")
        .arg(conformance_upstream())
        .arg("--stdio");
    HttpServer::spawn(command, &scratch.path("proxy.log"))
}

/// A 2026-07-28 request whose caller declares the tasks extension when `tasks` is set; `name`
/// goes in `Mcp-Name` (the tool, or the task id).
fn send(server: &HttpServer, token: &str, method: &str, mut params: Value, tasks: bool) -> Reply {
    let capabilities = if tasks {
        json!({"extensions": {"io.modelcontextprotocol/tasks": {}}})
    } else {
        json!({})
    };
    params["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientInfo": {"name": "tasks-test", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": capabilities,
    });
    let name = params
        .get("name")
        .or_else(|| params.get("taskId"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let body = json!({"jsonrpc": "2.0", "id": next_id(), "method": method, "params": params});
    let auth = format!("Bearer {token}");
    let mut headers = vec![
        ("MCP-Protocol-Version", MODERN),
        ("Mcp-Method", method),
        ("Accept", "application/json, text/event-stream"),
        ("Content-Type", "application/json"),
        ("Authorization", auth.as_str()),
    ];
    if !name.is_empty() {
        headers.push(("Mcp-Name", &name));
    }
    server.request("POST", "/mcp", &headers, body.to_string().into_bytes())
}

/// The JSON-RPC error of a reply (a 400 carries one too), or `None` for a result.
fn error_of(reply: &Reply) -> Option<Value> {
    reply.json().get("error").cloned()
}

/// `tasks/get` until the task is no longer working (bounded).
fn until_ended(server: &HttpServer, token: &str, id: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let task =
            send(server, token, "tasks/get", json!({"taskId": id}), true).result("tasks/get");
        if task["status"] != "working" {
            return task;
        }
        assert!(Instant::now() < deadline, "task {id} still working: {task}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_task_goes_to_its_caller_only_redacted_and_audited_from_start_to_end() {
    let scratch = Scratch::with_policy_text("gateway", POLICY);
    let signer = Signer::p256("ec-1");
    let server = gateway(&scratch, &signer);
    let resource = server.resource();
    let alice = signer.sign(&claims(&resource, "user-alice", ""));
    let bob = signer.sign(&claims(&resource, "user-bob", ""));

    // Declared to 2026-07-28 callers, decided by the policy (whose default passes tasks).
    let discover = send(&server, &alice, "server/discover", json!({}), false).result("discover");
    assert_eq!(
        discover["capabilities"]["extensions"]["io.modelcontextprotocol/tasks"],
        json!({}),
        "{discover}"
    );

    // A caller that declares the extension gets the upstream's task, under the gateway's name.
    let label = format!("report {SECRET}");
    let arguments = json!({"seconds": 1.0, "label": label});
    let call = json!({"name": "slow_compute", "arguments": arguments});
    let task = send(&server, &alice, "tools/call", call.clone(), true).result("tools/call");
    assert_eq!(task["resultType"], "task", "{task}");
    assert_eq!(task["status"], "working", "{task}");
    let id = task["taskId"].as_str().expect("taskId").to_owned();
    assert_eq!(id.len(), 32, "the gateway's own 128-bit name: {task}");

    // Another principal, and an id nobody was given: the same answer, and nothing upstream
    // (bob's cancel would have cancelled alice's task there).
    for (token, asked) in [
        (&bob, id.as_str()),
        (&alice, "0123456789abcdef0123456789abcdef"),
    ] {
        for method in ["tasks/get", "tasks/cancel"] {
            let reply = send(&server, token, method, json!({"taskId": asked}), true);
            let error = error_of(&reply).unwrap_or_else(|| panic!("{method}: {}", reply.summary()));
            assert_eq!(error["code"], -32602, "{method} {asked}: {error}");
            assert_eq!(
                error["message"],
                format!("unknown task: {asked}"),
                "{method}: {error}"
            );
        }
    }

    // The keyed call again: the same task back, nothing sent again.
    let again = send(&server, &alice, "tools/call", call, true).result("retry");
    assert_eq!(again["taskId"], id.as_str(), "{again}");

    // Its end: completed, not cancelled by bob, the result redacted as any tool result is.
    let ended = until_ended(&server, &alice, &id);
    assert_eq!(ended["status"], "completed", "{ended}");
    let text = text_of(&ended["result"]);
    assert!(!ended.to_string().contains(SECRET), "{ended}");
    assert_eq!(text, "Computed report [REDACTED] after 1 s", "{ended}");
    // Seen again: still completed, and still recorded once.
    let seen = send(&server, &alice, "tasks/get", json!({"taskId": id}), true).result("again");
    assert_eq!(seen["status"], "completed", "{seen}");

    // A task cancelled by its own caller: forwarded, and audited.
    let long = json!({"name": "slow_compute", "arguments": {"seconds": 60, "label": "long job"}});
    let long = send(&server, &alice, "tools/call", long, true).result("long");
    let long_id = long["taskId"].as_str().expect("taskId").to_owned();
    let cancel = send(
        &server,
        &alice,
        "tasks/cancel",
        json!({"taskId": long_id}),
        true,
    );
    assert_eq!(cancel.result("tasks/cancel")["resultType"], "complete");
    assert_eq!(
        until_ended(&server, &alice, &long_id)["status"],
        "cancelled"
    );

    // A caller without the extension is never handed a task: the call runs to its end.
    let plain = json!({"name": "slow_compute", "arguments": {"seconds": 0, "label": "plain"}});
    let plain = send(&server, &alice, "tools/call", plain, false).result("plain");
    assert_eq!(plain["resultType"], "complete", "{plain}");

    let records = records_of(&scratch, "slow_compute");
    let of = |task: &str| -> Vec<(String, String, String)> {
        records
            .iter()
            .filter(|r| r["task_id"] == task)
            .map(|r| {
                let field = |k: &str| r[k].as_str().unwrap_or_default().to_owned();
                (field("method"), field("decision"), field("outcome"))
            })
            .collect()
    };
    let triple = |m: &str, d: &str, o: &str| (m.to_owned(), d.to_owned(), o.to_owned());
    assert_eq!(
        of(&id),
        vec![
            triple("tools/call", "allow", "in_doubt"),
            triple("tools/call", "allow", "replay"),
            triple("tasks/get", "allow", "committed"),
        ],
        "{records:#?}"
    );
    assert_eq!(
        of(&long_id),
        vec![
            triple("tools/call", "allow", "in_doubt"),
            triple("tasks/cancel", "allow", "cancelled"),
            triple("tasks/get", "allow", "cancelled"),
        ],
        "{records:#?}"
    );
    assert!(
        records.iter().all(|r| !r.to_string().contains(SECRET)),
        "{records:#?}"
    );
    assert_audit_verifies(&scratch);
    server.stop();
}

/// `toolgate serve --toolset orders --http` with OAuth: refunds above 25 wait for a person.
fn orders(scratch: &Scratch, signer: &Signer) -> HttpServer {
    HttpServer::start(scratch, super::Keys::File(&[signer]), &[])
}

#[test]
fn a_call_held_for_a_person_is_a_task_only_its_caller_can_follow() {
    let text = crate::policy_with(
        "orders.toml",
        &[("approval_wait", "\"60s\""), ("approval_ttl", "\"5m\"")],
    );
    let scratch = Scratch::with_policy_text("orders", &text);
    let signer = Signer::rsa("rsa-1");
    let server = orders(&scratch, &signer);
    let resource = server.resource();
    let alice = signer.sign(&claims(&resource, "user-alice", "payments:write"));
    let bob = signer.sign(&claims(&resource, "user-bob", "payments:write"));

    let refund = json!({"name": "refund", "arguments": {"order_id": "ord_1001", "amount": 49}});
    let asked = Instant::now();
    let created = send(&server, &alice, "tools/call", refund, true).result("tools/call");
    assert!(asked.elapsed() < Duration::from_secs(10), "held: {created}");
    assert_eq!(created["resultType"], "task", "{created}");
    let id = created["taskId"].as_str().expect("taskId").to_owned();

    // bob's reads and cancels of alice's task are answered as for a task that does not exist.
    for method in ["tasks/get", "tasks/cancel"] {
        let theirs = send(&server, &bob, method, json!({"taskId": id}), true);
        let error = error_of(&theirs).unwrap_or_else(|| panic!("{method}: {}", theirs.body));
        assert_eq!(error["code"], -32602, "{method}: {error}");
        assert_eq!(error["message"], format!("unknown task: {id}"), "{error}");
    }
    let working = send(&server, &alice, "tasks/get", json!({"taskId": id}), true).result("get");
    assert_eq!(working["status"], "working", "{working}");

    let approval = scratch.cli(&["approvals", "list", "--json"]);
    let rows: Value = serde_json::from_slice(&approval.stdout).expect("list --json");
    let approval = rows[0]["id"]
        .as_str()
        .expect("a pending approval")
        .to_owned();
    assert_eq!(rows[0]["requester"], "user-alice");
    let out = scratch.cli(&["approvals", "approve", &approval, "--as", "human:ops"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let done = until_ended(&server, &alice, &id);
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(
        done["result"]["structuredContent"]["status"], "refunded",
        "{done}"
    );
    let refunds = scratch.refunds();
    assert_eq!(refunds.len(), 1, "{refunds:?}");
    assert_eq!(refunds[0]["by"], "user-alice", "{refunds:?}");
    let theirs = send(&server, &bob, "tasks/get", json!({"taskId": id}), true);
    assert_eq!(
        error_of(&theirs).map(|e| e["code"].clone()),
        Some(json!(-32602))
    );
    assert_audit_verifies(&scratch);
}
