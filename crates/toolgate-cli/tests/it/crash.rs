//! Kill `toolgate serve` at every step of a commit, restart it on the same data, retry the call.
//!
//! For each crash point: exactly one note for the request_id, the retry answers `complete` and not an
//! error, the audit chain verifies, and every record acknowledged before the crash is still there.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{Scratch, verify_json};

fn wait_for_marker(marker: &Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !marker.exists() {
        assert!(
            Instant::now() < deadline,
            "the server never reached the crash point"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn notes(scratch: &Scratch) -> Vec<Value> {
    let mut server = scratch.serve(&[]);
    let reply = server.call("read_ledger", json!({}));
    server.close();
    reply["result"]["structuredContent"]["notes"]
        .as_array()
        .cloned()
        .expect("notes")
}

/// Every record of the audit log, in order.
fn audit_records(scratch: &Scratch) -> Vec<Value> {
    std::fs::read_to_string(scratch.audit())
        .expect("audit")
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("record"))
        .collect()
}

fn committed_records(scratch: &Scratch, request_id: &str) -> usize {
    audit_records(scratch)
        .iter()
        .filter(|r| r["request_id"] == request_id && r["outcome"] == "committed")
        .count()
}

/// Starts `toolgate serve` with crash point `point` armed, sends it a call of `tool`, and kills it
/// once the call reached the point.
fn kill_at(scratch: &Scratch, point: &str, tool: &str, args: Value) {
    let marker = scratch.path("reached");
    let mut armed = scratch.serve(&[(
        "FAILPOINTS",
        format!("{point}=return({})", marker.display()),
    )]);
    armed.send_call(tool, args);
    wait_for_marker(&marker);
    armed.kill();
}

/// Runs the crash scenario at `point`; returns the retry's status.
fn crash_at(point: &str) -> String {
    let scratch = Scratch::new();
    // History that was acknowledged before the crash.
    let mut server = scratch.serve(&[]);
    assert_eq!(
        server.call(
            "write_note",
            json!({"request_id": "req-before-1", "text": "kept"})
        )["result"]["structuredContent"]["status"],
        "committed"
    );
    assert_eq!(
        server.call("rm_rf", json!({"path": "/tmp"}))["error"]["code"],
        -32602
    );
    server.close();
    let acknowledged = std::fs::read(scratch.audit()).expect("audit");

    let call = json!({"request_id": "req-crash-0001", "text": "exactly once"});
    kill_at(&scratch, point, "write_note", call.clone());

    let mut server = scratch.serve(&[]);
    let retry = server.call("write_note", call.clone());
    server.close();
    let result = &retry["result"];
    assert_eq!(result["resultType"], "complete", "{point}: {retry}");
    assert_ne!(result["isError"], true, "{point}: {retry}");

    let notes = notes(&scratch);
    let mine = notes
        .iter()
        .filter(|n| n["request_id"] == "req-crash-0001")
        .count();
    assert_eq!(
        mine, 1,
        "{point}: exactly one note for the request_id: {notes:?}"
    );
    assert!(
        notes.contains(&json!({"request_id": "req-before-1", "text": "kept"})),
        "{point}: {notes:?}"
    );
    assert_eq!(
        committed_records(&scratch, "req-crash-0001"),
        1,
        "{point}: one committed record"
    );

    let (code, report) = verify_json(&scratch.audit());
    assert_eq!(
        (code, report["intact"].as_bool()),
        (0, Some(true)),
        "{point}: {report}"
    );
    let after = std::fs::read(scratch.audit()).expect("audit");
    assert!(
        after.starts_with(&acknowledged),
        "{point}: an acknowledged record was lost or changed"
    );
    result["structuredContent"]["status"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

#[test]
fn killed_before_the_effect_is_durable_the_retry_commits() {
    assert_eq!(crash_at("journal.before_append"), "committed");
}

#[test]
fn killed_in_the_middle_of_a_wal_append_the_torn_frame_is_dropped_and_the_retry_commits() {
    assert_eq!(crash_at("journal.torn_wal"), "committed");
}

#[test]
fn killed_after_the_note_is_synced_but_before_it_is_published_the_retry_replays() {
    assert_eq!(crash_at("journal.after_wal_sync"), "replay");
}

#[test]
fn killed_in_the_middle_of_an_audit_append_the_tail_is_moved_aside_and_the_retry_replays() {
    assert_eq!(crash_at("journal.torn_audit"), "replay");
}

#[test]
fn killed_after_everything_is_durable_but_before_the_answer_the_retry_replays() {
    assert_eq!(crash_at("journal.before_answer"), "replay");
}

/// The decisions of the records for `tool` in the audit log.
fn decisions_for(scratch: &Scratch, tool: &str) -> Vec<String> {
    audit_records(scratch)
        .iter()
        .filter(|r| r["name"] == tool)
        .map(|r| r["decision"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// A record without an effect (a refusal) is made durable in the sync ring, then appended to the
/// log without a sync of its own. Killed between the two, as a power cut would leave the log, the
/// restarted server puts the record back from the ring, and the chain verifies.
#[test]
fn killed_after_a_refusal_is_synced_in_the_ring_the_restart_puts_it_in_the_log() {
    let scratch = Scratch::new();
    kill_at(
        &scratch,
        "journal.after_ring_sync",
        "rm_rf",
        json!({"path": "/tmp"}),
    );
    assert!(
        decisions_for(&scratch, "rm_rf").is_empty(),
        "not yet in the log"
    );

    let server = scratch.serve(&[]);
    server.close();
    assert_eq!(decisions_for(&scratch, "rm_rf"), ["deny"]);
    let (code, report) = verify_json(&scratch.audit());
    assert_eq!(
        (code, report["intact"].as_bool()),
        (0, Some(true)),
        "{report}"
    );
}

#[test]
fn a_torn_audit_tail_leaves_a_recovery_record_and_the_torn_bytes_beside_the_log() {
    let scratch = Scratch::new();
    kill_at(
        &scratch,
        "journal.torn_audit",
        "write_note",
        json!({"request_id": "req-torn-001", "text": "t"}),
    );
    let server = scratch.serve(&[]);
    server.close();
    let records = audit_records(&scratch);
    let outcomes: Vec<&str> = records
        .iter()
        .map(|r| r["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(outcomes, ["committed", "torn_tail_moved_aside"]);
    let aside: Vec<_> = std::fs::read_dir(scratch.data())
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("audit.jsonl.torn-")
        })
        .collect();
    assert_eq!(aside.len(), 1);
    assert!(!std::fs::read(aside[0].path()).unwrap().is_empty());
}

/// A failed sync of the audit log: the call whose record it was is not answered as done, every
/// later call is refused before it runs with words that say a restart is needed, and a restart
/// brings the server back with nothing half-done.
#[test]
fn after_a_failed_audit_sync_every_call_is_refused_until_a_restart() {
    let scratch = Scratch::new();
    let mut server = scratch.serve(&[(
        "FAILPOINTS",
        "journal.audit_sync_fails=1*off->return".to_owned(),
    )]);
    let first = server.call("read_ledger", json!({}));
    assert_ne!(first["result"]["isError"], true, "{first}");

    // This read's record could not be made durable: its answer is withheld.
    let second = server.call("read_ledger", json!({}));
    let refused = &second["result"];
    assert_eq!(refused["isError"], true, "{second}");
    assert_eq!(refused["structuredContent"]["executed"], false, "{second}");
    assert!(refused.to_string().contains("restarted"), "{second}");

    // Nothing runs any more, and the answer says why and what to do.
    let third = server.call(
        "write_note",
        json!({"request_id": "req-after-eio-01", "text": "must not land"}),
    );
    let refused = &third["result"];
    assert_eq!(refused["isError"], true, "{third}");
    assert_eq!(refused["structuredContent"]["executed"], false, "{third}");
    assert_eq!(
        refused["structuredContent"]["rule"], "audit.unavailable",
        "{third}"
    );
    assert!(
        refused["content"][0]["text"]
            .as_str()
            .is_some_and(|t| t.contains("until it is restarted")),
        "{third}"
    );
    server.close();

    assert!(notes(&scratch).is_empty(), "the refused write left no note");
    let mut server = scratch.serve(&[]);
    let after = server.call(
        "write_note",
        json!({"request_id": "req-after-restart", "text": "lands"}),
    );
    server.close();
    assert_eq!(
        after["result"]["structuredContent"]["status"], "committed",
        "{after}"
    );
}
