//! Policy reload under load (issue 15): an SRE edits the policy of a running `serve --http`. A
//! good file is in force within seconds, audited with the old and the new hash; a broken one keeps
//! the old policy, says why and is audited as refused; a call that started under the old policy
//! finishes under it; SIGHUP is a reload, not the end of the process; and not one call of a client
//! calling all along fails.

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{Http, HttpServer, Keys, Scratch, Signer, claims, is_error};
use crate::policy_with;

/// Replaces `path` the way editors and config managers do: a new file renamed into place.
fn replace(path: &Path, text: &str) {
    let fresh = path.with_extension("new");
    std::fs::write(&fresh, text).expect("write the new policy");
    std::fs::rename(&fresh, path).expect("rename it into place");
}

/// Polls `probe` until it holds, for up to 10 s.
fn within(what: &str, mut probe: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !probe() {
        assert!(Instant::now() < deadline, "{what} within 10 s");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn control_records(scratch: &Scratch, outcome: &str) -> Vec<Value> {
    scratch
        .records()
        .into_iter()
        .filter(|r| r["name"] == "policy" && r["outcome"] == outcome)
        .collect()
}

#[test]
fn a_reloaded_policy_governs_new_calls_a_broken_one_changes_nothing_and_no_call_fails() {
    let first = policy_with(
        "orders.toml",
        &[("approval_wait", "\"20s\""), ("approval_ttl", "\"60s\"")],
    );
    let scratch = Scratch::with_policy_text("orders", &first);
    let policy_file = scratch.path(&scratch.policy);
    let rsa = Signer::rsa("rsa-1");
    let server = HttpServer::start(&scratch, Keys::File(&[&rsa]), &[]);
    let token = rsa.sign(&claims(&server.resource(), "user-alice", "payments:write"));
    let note = json!({"order_id": "ord_1001", "note": "called back"});
    let call = |http: &Http, tool: &str, arguments: Value| -> Value {
        server
            .rpc_via(
                http,
                Some(&token),
                "tools/call",
                json!({"name": tool, "arguments": arguments}),
                &[],
            )
            .result(tool)
    };
    let http = Http::new();
    assert!(!is_error(&call(&http, "add_note", note.clone())));

    // A client calling all along, through every reload.
    let stop = AtomicBool::new(false);
    let served = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        let load = scope.spawn(|| {
            let http = Http::new();
            while !stop.load(Ordering::Relaxed) {
                let result = call(&http, "lookup_order", json!({"order_id": "ord_1002"}));
                assert!(
                    !is_error(&result),
                    "a call failed during a reload: {result}"
                );
                served.fetch_add(1, Ordering::Relaxed);
            }
        });
        // A refund held for a person, started under the first policy.
        let held = scope.spawn(|| {
            call(
                &Http::new(),
                "refund",
                json!({"order_id": "ord_1001", "amount": 30}),
            )
        });
        within("the refund waits for a person", || {
            scratch
                .records()
                .iter()
                .any(|r| r["name"] == "refund" && r["outcome"] == "requested")
        });

        // A good edit: add_note is blocked from now on.
        let second = first.replacen(
            "[tools.add_note]\ntier = \"low\"",
            "[tools.add_note]\ntier = \"blocked\"",
            1,
        );
        assert_ne!(second, first);
        replace(&policy_file, &second);
        within("the new policy is in force", || {
            !control_records(&scratch, "policy_loaded").is_empty()
        });
        let loaded = control_records(&scratch, "policy_loaded").remove(0);
        assert_ne!(
            loaded["old_policy_sha256"], loaded["policy_sha256"],
            "{loaded}"
        );
        assert_eq!(loaded["changed_by"], "file", "{loaded}");
        // add_note is refused (by the policy; a JSON-RPC error or an isError result).
        let add_note_refused = || {
            let reply = server.rpc_via(
                &http,
                Some(&token),
                "tools/call",
                json!({"name": "add_note", "arguments": note.clone()}),
                &[],
            );
            reply.body.contains("\"error\"") || reply.body.contains("\"isError\":true")
        };
        assert!(add_note_refused(), "add_note still runs");

        // A broken edit: the second policy stays, and the log and the audit say why.
        replace(&policy_file, "version = 2\n[defaults\ntier = \"low\"\n");
        within("the broken policy is refused", || {
            !control_records(&scratch, "policy_refused").is_empty()
        });
        let refusal = control_records(&scratch, "policy_refused").remove(0);
        assert_eq!(
            refusal["old_policy_sha256"], loaded["policy_sha256"],
            "{refusal}"
        );
        assert!(
            server.log_text().contains("policy not reloaded"),
            "{}",
            server.log_text()
        );
        assert!(
            add_note_refused(),
            "the broken file changed what is decided"
        );
        let ready = server.request("GET", "/readyz", &[], Vec::new());
        let in_force = loaded["policy_sha256"].as_str().expect("hash");
        assert!(ready.body.contains(in_force), "{}", ready.body);

        // SIGHUP reloads (here: nothing new to load) and does not end the server.
        let status = Command::new("kill")
            .args(["-HUP", &server.child.id().to_string()])
            .status()
            .expect("kill -HUP");
        assert!(status.success());
        std::thread::sleep(Duration::from_millis(300));

        // The held refund is approved: it runs, decided by the policy it started under.
        let pending = scratch
            .records()
            .into_iter()
            .find(|r| r["name"] == "refund" && r["outcome"] == "requested")
            .expect("the request");
        let id = pending["approval_id"]
            .as_str()
            .expect("approval id")
            .to_owned();
        let out = scratch.cli(&["approvals", "approve", &id, "--as", "human:ops"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let refunded = held.join().expect("held call");
        assert_eq!(
            refunded["structuredContent"]["status"], "refunded",
            "{refunded}"
        );
        let ran = scratch
            .records()
            .into_iter()
            .find(|r| r["name"] == "refund" && r["outcome"] == "committed")
            .expect("the refund's record");
        assert_eq!(
            ran["policy_sha256"], loaded["old_policy_sha256"],
            "a call in flight finishes under the policy it started with"
        );

        stop.store(true, Ordering::Relaxed);
        load.join().expect("the load never saw a failure");
        assert!(served.load(Ordering::Relaxed) > 10, "the load ran");
    });
    let lookups: Vec<Value> = scratch
        .records()
        .into_iter()
        .filter(|r| r["name"] == "lookup_order")
        .collect();
    assert!(lookups.iter().all(|r| r["decision"] == "allow"));
    super::assert_audit_verifies(&scratch);
    server.stop();
}
