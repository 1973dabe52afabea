//! `toolgate serve` and `toolgate demo` as processes: the seed's lines on real pipes, the untouched
//! rm_rf target, shutdown on EOF, start-up refusals, the single-writer lock.

use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};

use super::{Scratch, observe, toolgate, verify_json, wait_for};

#[test]
fn a_denied_rm_rf_leaves_its_target_exactly_as_it_was() {
    let scratch = Scratch::new();
    let target = scratch.path("precious");
    std::fs::create_dir(&target).unwrap();
    std::fs::write(target.join("file.txt"), "keep me").unwrap();
    let before = (observe(&target.join("file.txt")), target.is_dir());

    let mut server = scratch.serve(&[]);
    let listed = {
        let stdin_line = json!({"jsonrpc": "2.0", "id": 0, "method": "tools/list", "params": {"_meta": super::meta()}});
        use std::io::Write;
        writeln!(server.stdin.as_mut().unwrap(), "{stdin_line}").unwrap();
        server.read()
    };
    let names: Vec<&str> = listed["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert!(!names.contains(&"rm_rf"), "{names:?}");
    let reply = server.call("rm_rf", json!({"path": target.display().to_string()}));
    server.close();

    assert_eq!(reply["error"]["code"], -32602, "{reply}");
    assert_eq!((observe(&target.join("file.txt")), target.is_dir()), before);
    let record: Value = serde_json::from_str(
        std::fs::read_to_string(scratch.audit())
            .unwrap()
            .lines()
            .next()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        (
            record["name"].as_str(),
            record["decision"].as_str(),
            record["outcome"].as_str()
        ),
        (Some("rm_rf"), Some("deny"), Some("not_executed"))
    );
}

#[test]
fn requests_already_sent_are_answered_after_stdin_closes_then_the_process_exits_0() {
    let scratch = Scratch::new();
    let mut server = scratch.serve(&[]);
    let calls = 300;
    for i in 0..calls {
        server.send_call(
            "write_note",
            json!({"request_id": format!("req-eof-{i:04}"), "text": "t"}),
        );
    }
    drop(server.stdin.take());
    let mut answered = 0;
    for _ in 0..calls {
        let reply = server.read();
        assert_eq!(
            reply["result"]["structuredContent"]["status"], "committed",
            "{reply}"
        );
        answered += 1;
    }
    assert_eq!(answered, calls);
    let status = wait_for(&mut server.child, Duration::from_secs(10));
    assert!(status.success(), "{status}");
    let (code, report) = verify_json(&scratch.audit());
    assert_eq!((code, report["records"].as_u64()), (0, Some(calls)));
}

#[test]
fn a_bad_policy_stops_start_up_with_a_clear_message() {
    for (contents, expected) in [
        (
            r#"{"version":2,"allow":[]}"#,
            "policy version 2 is not supported",
        ),
        ("{not json", "is not valid policy JSON"),
        (
            r#"{"version":1,"allow":["x"],"rules":{}}"#,
            "is not valid policy JSON",
        ),
    ] {
        let scratch = Scratch::new();
        std::fs::write(scratch.path("policy.json"), contents).unwrap();
        let out = scratch
            .serve_command()
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{contents}");
        assert!(
            out.stdout.is_empty(),
            "stdout is the protocol: nothing on it"
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(expected), "{contents}: {stderr}");
        assert!(
            !scratch.data().exists(),
            "a refused start changes nothing on disk"
        );
    }
    let scratch = Scratch::new();
    let out = toolgate()
        .args(["serve", "--policy", "/nonexistent/policy.json", "--data"])
        .arg(scratch.data())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read policy"));
}

#[test]
fn a_second_server_on_the_same_data_is_locked_out() {
    let scratch = Scratch::new();
    let mut first = scratch.serve(&[]);
    first.call("read_ledger", json!({}));
    let out = scratch
        .serve_command()
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("in use by another toolgate process"));
    first.close();
}

#[test]
fn logs_are_json_lines_on_stderr() {
    let scratch = Scratch::new();
    let mut child = scratch
        .serve_command()
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = wait_for(&mut child, Duration::from_secs(10));
    let out = child.wait_with_output().unwrap();
    assert!(status.success());
    assert!(out.stdout.is_empty());
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(!stderr.is_empty());
    for line in stderr.lines() {
        let value: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(value["level"].is_string());
    }
}

#[test]
fn the_demo_runs_the_seed_scenario_and_every_check_holds() {
    let out = toolgate().args(["demo", "--json"]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["ok"], true);
    let steps: Vec<&str> = report["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["step"].as_str().unwrap())
        .collect();
    assert_eq!(
        steps,
        [
            "connect",
            "tools/list",
            "rm_rf refused",
            "write_note",
            "write_note again",
            "read_ledger verify",
            "audit verify",
            "small refund",
            "large refund",
            "unanswered refund",
            "delete_customer",
            "orders audit verify",
            "agent: $10 refund",
            "agent: $49 refund",
            "agent: unanswered",
            "agent: verified write",
            "agent audit verify",
            "agent audit verify",
            "agent audit verify",
            "agent audit verify",
            "gated delete_note",
            "switch on",
            "notes audit verify",
            "gateway tools/list",
            "gateway gated delete",
            "gateway untrusted read",
            "gateway audit verify",
            "http no token",
            "http forged token",
            "http untrusted ticket",
            "http other's ticket",
            "http step-up",
            "http audit verify"
        ]
    );
    assert_eq!(report["audit"]["intact"], true);
}

/// The ids in a tool's answer, wherever the answer carries them: its text and its structured copy.
fn ids_in(reply: &Value) -> (String, Value) {
    let result = &reply["result"];
    let text = result["content"][0]["text"].as_str().unwrap_or_default();
    (text.to_owned(), result["structuredContent"].clone())
}

#[test]
fn write_note_and_read_ledger_return_the_callers_request_ids_intact() {
    let scratch = Scratch::new();
    let mut server = scratch.serve(&[]);
    let ids = [
        "req-journal-fdatasync-EIO-10-000",
        "9f86d081884c7d659a2feaa0c55ad015",
    ];
    for id in ids {
        let reply = server.call("write_note", json!({"request_id": id, "text": "verify me"}));
        let (text, structured) = ids_in(&reply);
        assert_eq!(structured["request_id"], id, "{reply}");
        assert!(text.contains(id), "{reply}");
    }
    // Random-looking, but the caller's own: write_note echoes it back as sent.
    let own = "q8Zt3vXn0LwPj7Ka2RmYc5HsFd9GbE1u";
    let reply = server.call("write_note", json!({"request_id": own, "text": "mine"}));
    assert_eq!(ids_in(&reply).1["request_id"], own, "{reply}");
    assert!(ids_in(&reply).0.contains(own), "{reply}");

    let reply = server.call("read_ledger", json!({}));
    server.close();
    let (text, structured) = ids_in(&reply);
    let listed: Vec<&str> = structured["notes"]
        .as_array()
        .unwrap_or_else(|| panic!("{reply}"))
        .iter()
        .filter_map(|n| n["request_id"].as_str())
        .collect();
    for id in ids {
        assert!(listed.contains(&id), "{id} not in {listed:?}");
        assert!(text.contains(id), "{id} not in {text}");
    }
}
