//! Exactly-once through the gateway, proved on what reached the testbed upstream (`calls.log`)
//! and what it made durable (`records.jsonl`): an approved call runs once and repeats replay; an
//! idempotency key replays or refuses; a call whose outcome was lost in a crash (of the gateway or
//! of the upstream) is answered "outcome unknown" and is not sent again unless the policy says the
//! tool is idempotent.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{
    Bench, Era, Proxy, assert_ran, calls_of, effects, gateway_policy, is_error, testbed, text,
    until,
};

/// What an in-doubt answer tells the model (DESIGN.md §4).
const IN_DOUBT: &str = "outcome unknown: verify before retrying";

fn record(id: &str, value: &str) -> Value {
    json!({"id": id, "value": value})
}

/// The pending rows of `approvals list --json`.
fn pending_rows(bench: &Bench) -> Vec<Value> {
    let out = bench.cli(&["approvals", "list", "--json"]);
    assert!(
        out.status.success(),
        "approvals list: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice::<Value>(&out.stdout)
        .expect("approvals list --json is JSON")
        .as_array()
        .cloned()
        .expect("an array")
}

#[test]
fn an_approved_upstream_call_runs_exactly_once_and_a_repeat_replays_it() {
    let bench = Bench::new("testbed.toml");
    let up = bench.mkdir("up");
    let mut proxy = bench.proxy("tb", &testbed(&up, "both"), Era::Modern);

    let held = proxy.send_call("write_record", record("r-1", "approved"));
    let mut rows = Vec::new();
    until("a pending approval", Duration::from_secs(10), || {
        rows = pending_rows(&bench);
        !rows.is_empty()
    });
    assert_eq!(rows.len(), 1, "{rows:?}");
    let row = &rows[0];
    assert_eq!(
        (&row["tool"], &row["tier"], &row["arguments"]["id"]),
        (&json!("write_record"), &json!("high"), &json!("r-1")),
        "{row}"
    );
    assert_eq!(
        calls_of(&up, "write_record"),
        0,
        "nothing is forwarded while it waits"
    );
    assert!(effects(&up).is_empty());

    // A person at another terminal.
    let id = row["id"].as_str().expect("approval id");
    let out = bench.cli(&["approvals", "approve", id, "--as", "human:approver"]);
    assert!(
        out.status.success(),
        "approve: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (first, _) = proxy.answer(held);
    assert_ran(&first, "the approved write_record");
    assert!(text(&first).contains("wrote record r-1"), "{first}");

    // The same call again: the stored result, nothing forwarded.
    let again = proxy.call("write_record", record("r-1", "approved"));
    assert_ran(&again, "the repeat");
    assert_eq!(
        again["result"]["content"], first["result"]["content"],
        "{again}"
    );
    proxy.close();

    assert_eq!(effects(&up), [json!({"id": "r-1", "value": "approved"})]);
    assert_eq!(calls_of(&up, "write_record"), 1, "forwarded exactly once");
    let records = bench.records_of("write_record");
    let outcomes: Vec<(&str, &str)> = records
        .iter()
        .filter(|r| r["method"] == "tools/call")
        .map(|r| {
            (
                r["decision"].as_str().unwrap(),
                r["outcome"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        outcomes,
        [
            ("approval", "requested"),
            ("allow", "committed"),
            ("allow", "replay")
        ],
        "{records:#?}"
    );
    assert!(
        records
            .iter()
            .filter(|r| r["method"] == "tools/call")
            .all(|r| r["upstream"] == "tb"),
        "{records:#?}"
    );
    bench.assert_audit_verifies();
}

#[test]
fn an_idempotency_key_replays_the_first_result_and_refuses_other_arguments() {
    let bench = Bench::new("testbed-keys.toml");
    let up = bench.mkdir("up");
    let mut proxy = bench.proxy("tb", &testbed(&up, "both"), Era::Modern);

    let first = proxy.call("write_record", record("k-1", "first"));
    assert_ran(&first, "write_record k-1");
    let replay = proxy.call("write_record", record("k-1", "first"));
    assert_ran(&replay, "the same call again");
    assert_eq!(replay["result"]["content"], first["result"]["content"]);
    let conflict = proxy.call("write_record", record("k-1", "second"));
    assert!(is_error(&conflict), "{conflict}");
    assert_eq!(
        conflict["result"]["structuredContent"]["status"], "conflict",
        "{conflict}"
    );
    assert!(text(&conflict).contains("k-1"), "{conflict}");
    proxy.close();

    assert_eq!(effects(&up), [json!({"id": "k-1", "value": "first"})]);
    assert_eq!(calls_of(&up, "write_record"), 1);
    let outcomes: Vec<String> = bench
        .records_of("write_record")
        .iter()
        .map(|r| {
            format!(
                "{}/{}",
                r["decision"].as_str().unwrap(),
                r["outcome"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(
        outcomes,
        ["allow/committed", "allow/replay", "deny/conflict"]
    );
    bench.assert_audit_verifies();
}

/// Writes one keyed record twice through a client of `era`; returns the second answer.
fn replayed(era: Era) -> Value {
    let bench = Bench::new("testbed-keys.toml");
    let up = bench.mkdir("up");
    let mut proxy = bench.proxy("tb", &testbed(&up, "both"), era);
    let first = proxy.call("write_record", record("k-2", "once"));
    let replay = proxy.call("write_record", record("k-2", "once"));
    proxy.close();
    assert_ran(&first, "write_record");
    assert_ran(&replay, "its replay");
    assert_eq!(effects(&up).len(), 1);
    replay
}

#[test]
fn a_replay_is_marked_as_one_for_a_legacy_client() {
    let replay = replayed(Era::Legacy("2025-11-25"));
    assert_eq!(
        replay["result"]["_meta"]["io.toolgate/status"], "replay",
        "{replay}"
    );
}

#[test]
fn a_replay_is_marked_as_one_for_a_2026_client() {
    let replay = replayed(Era::Modern);
    assert_eq!(
        replay["result"]["_meta"]["io.toolgate/status"], "replay",
        "{replay}"
    );
}

/// The testbed-keys policy, with `slow` declared idempotent upstream when `idempotent`.
fn keys_policy(idempotent: bool) -> String {
    let text = gateway_policy("testbed-keys.toml");
    if !idempotent {
        return text;
    }
    let anchor = "[tools.slow]\ntier = \"low\"\nidempotency_key = \"*\"\n";
    assert!(
        text.contains(anchor),
        "tests/gateway/testbed-keys.toml changed"
    );
    text.replace(anchor, &format!("{anchor}idempotent = true\n"))
}

/// Sends `slow` (3 s), SIGKILLs the gateway while the upstream runs it, restarts the gateway on
/// the same data and upstream directory, and retries the same call. Returns the retry's answer
/// and how many `slow` calls reached the upstream in all.
fn retry_after_gateway_crash(idempotent: bool) -> (Bench, Value, usize) {
    let bench = Bench::with_policy_text("testbed-keys.toml", &keys_policy(idempotent));
    let up = bench.mkdir("up");
    let args = json!({"ms": 3000, "steps": 1});

    let mut proxy = bench.proxy("tb", &testbed(&up, "both"), Era::Modern);
    proxy.send_call("slow", args.clone());
    until(
        "slow reaching the upstream",
        Duration::from_secs(10),
        || calls_of(&up, "slow") == 1,
    );
    proxy.kill();

    let mut proxy = bench.proxy("tb", &testbed(&up, "both"), Era::Modern);
    let started = Instant::now();
    let retry = proxy.call("slow", args);
    let took = started.elapsed();
    // The gateway is still serving.
    assert_ran(&proxy.call("echo", json!({"text": "still here"})), "echo");
    proxy.close();
    if !idempotent {
        assert!(
            took < Duration::from_secs(2),
            "the in-doubt answer waited {took:?}"
        );
    }
    let forwarded = calls_of(&up, "slow");
    (bench, retry, forwarded)
}

#[test]
fn a_call_in_flight_when_the_gateway_is_killed_is_in_doubt_after_restart_and_not_sent_again() {
    let (bench, retry, forwarded) = retry_after_gateway_crash(false);
    assert!(is_error(&retry), "{retry}");
    assert!(text(&retry).contains(IN_DOUBT), "{retry}");
    assert_eq!(
        retry["result"]["structuredContent"]["status"], "in_doubt",
        "{retry}"
    );
    assert_eq!(forwarded, 1, "the retry reached the upstream");
    let records = bench.records_of("slow");
    assert_eq!(records.len(), 1, "{records:#?}");
    assert_eq!(
        (
            &records[0]["decision"],
            &records[0]["outcome"],
            &records[0]["forwarded"],
            &records[0]["upstream"]
        ),
        (
            &json!("allow"),
            &json!("in_doubt"),
            &json!(false),
            &json!("tb")
        ),
        "{records:#?}"
    );
    bench.assert_audit_verifies();
}

#[test]
fn a_call_in_flight_when_the_gateway_is_killed_is_sent_again_when_the_tool_is_idempotent() {
    let (bench, retry, forwarded) = retry_after_gateway_crash(true);
    assert_ran(&retry, "the retry of an idempotent tool");
    assert!(text(&retry).contains("slept 3000 ms"), "{retry}");
    assert_eq!(forwarded, 2, "the retry was forwarded");
    let records = bench.records_of("slow");
    let outcomes: Vec<&str> = records
        .iter()
        .map(|r| r["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(outcomes, ["committed"], "{records:#?}");
    bench.assert_audit_verifies();
}

/// Calls `echo` until it succeeds; returns how long that took.
fn echo_until_it_answers(proxy: &mut Proxy, limit: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let reply = proxy.call("echo", json!({"text": "back?"}));
        if reply.get("result").is_some() && !is_error(&reply) {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < limit,
            "the upstream did not come back within {limit:?}: {reply}\n{}",
            proxy.log_tail()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn upstream_crash(up: &Path, bench: &Bench, keyed: bool) {
    let mut proxy = bench.proxy("tb", &testbed(up, "both"), Era::Modern);
    assert_ran(
        &proxy.call("echo", json!({"text": "before"})),
        "echo before",
    );

    let started = Instant::now();
    let reply = proxy.call("crash_after_write", record("c-1", "then crash"));
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the answer took {:?}",
        started.elapsed()
    );
    assert!(is_error(&reply), "a lost outcome is not a success: {reply}");
    assert!(text(&reply).contains(IN_DOUBT), "{reply}");
    // The write did happen: "unknown" was the truthful answer, "failed" would have been a lie.
    assert_eq!(effects(up), [json!({"id": "c-1", "value": "then crash"})]);

    assert!(proxy.running(), "the gateway went down with its upstream");
    let back = echo_until_it_answers(&mut proxy, Duration::from_secs(8));
    assert!(back < Duration::from_secs(8));
    if keyed {
        // The key is in doubt: the retry is not forwarded to the restarted upstream.
        let retry = proxy.call("crash_after_write", record("c-1", "then crash"));
        assert!(
            is_error(&retry) && text(&retry).contains(IN_DOUBT),
            "{retry}"
        );
        assert_eq!(calls_of(up, "crash_after_write"), 1);
        assert_eq!(effects(up).len(), 1);
    }
    proxy.close();
}

#[test]
fn an_upstream_that_dies_mid_call_gives_an_in_doubt_answer_and_is_restarted() {
    let bench = Bench::new("testbed.toml");
    let up = bench.mkdir("up");
    upstream_crash(&up, &bench, false);
    let records = bench.records_of("crash_after_write");
    assert_eq!(records.len(), 1, "{records:#?}");
    assert_eq!(
        (&records[0]["outcome"], &records[0]["upstream"]),
        (&json!("in_doubt"), &json!("tb"))
    );
    bench.assert_audit_verifies();
}

#[test]
fn an_upstream_that_dies_mid_call_leaves_its_idempotency_key_in_doubt() {
    let bench = Bench::new("testbed-keys.toml");
    let up = bench.mkdir("up");
    upstream_crash(&up, &bench, true);
    let outcomes: Vec<String> = bench
        .records_of("crash_after_write")
        .iter()
        .map(|r| r["outcome"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(outcomes, ["in_doubt", "in_doubt"]);
    bench.assert_audit_verifies();
}
