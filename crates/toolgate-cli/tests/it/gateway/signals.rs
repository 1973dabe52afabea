//! `toolgate proxy` on stdio ends a session the way `serve` does: on SIGTERM it stops reading,
//! answers a call held for an approval with its pending answer at once, and lets a call the
//! upstream is still running finish within `--grace` and be answered, then exits 0.

use std::time::{Duration, Instant};

use serde_json::json;

use super::{Bench, Era, Proxy, assert_ran, calls_of, cancellations, testbed, until};
use crate::{send_signal, wait_for};

#[test]
fn sigterm_lets_a_running_upstream_call_finish_and_answers_a_held_one_then_exits_0() {
    let bench = Bench::new("testbed.toml");
    let up = bench.mkdir("up");
    let flags = ["--name", "tb", "--grace", "10"].map(str::to_owned);
    let command = bench.proxy_command(&flags, &testbed(&up, "both"));
    let mut proxy = Proxy::start(command, Era::Modern, &bench.log_path());

    let slow = proxy.send_call("slow", json!({"ms": 2000, "steps": 1}));
    let held = proxy.send_call("write_record", json!({"id": "r-1", "value": "held"}));
    until(
        "the slow call reaching the upstream",
        Duration::from_secs(10),
        || calls_of(&up, "slow") == 1,
    );
    until("a pending approval", Duration::from_secs(10), || {
        let out = bench.cli(&["approvals", "list", "--json"]);
        serde_json::from_slice::<serde_json::Value>(&out.stdout)
            .is_ok_and(|rows| rows[0]["id"].is_string())
    });
    let sent = Instant::now();
    send_signal(&proxy.child, "TERM");

    let (reply, _) = proxy.answer(held);
    assert_eq!(
        reply["result"]["structuredContent"]["status"], "pending_approval",
        "{reply}"
    );
    assert!(
        sent.elapsed() < Duration::from_secs(1),
        "{:?}",
        sent.elapsed()
    );
    let (reply, _) = proxy.answer(slow);
    assert_ran(&reply, "slow");
    assert!(cancellations(&up).is_empty(), "{:?}", cancellations(&up));
    assert_eq!(calls_of(&up, "write_record"), 0, "a held call does not run");
    let status = wait_for(&mut proxy.child, Duration::from_secs(10));
    assert!(status.success(), "exit {status}\n{}", proxy.log_tail());
    assert!(
        sent.elapsed() < Duration::from_secs(10),
        "{:?}",
        sent.elapsed()
    );
    bench.assert_audit_verifies();
}

/// A 2026-07-28 client's `subscriptions/listen` stream is not a call in flight: when stdin closes
/// with only that stream open, the gateway ends it and exits at once, not after `--grace`; a call
/// still running gets its grace as before (the test above).
#[test]
fn stdin_closed_with_only_a_listen_stream_open_exits_at_once() {
    let bench = Bench::new("testbed.toml");
    let up = bench.mkdir("up");
    let flags = ["--name", "tb", "--grace", "10"].map(str::to_owned);
    let command = bench.proxy_command(&flags, &testbed(&up, "both"));
    let mut proxy = Proxy::start(command, Era::Modern, &bench.log_path());
    assert_ran(&proxy.call("echo", json!({"text": "ready"})), "echo ready");

    proxy.request(
        "subscriptions/listen",
        json!({"notifications": {"toolsListChanged": true}}),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let message = proxy
            .next_before(deadline)
            .unwrap_or_else(|| panic!("no acknowledgement\n{}", proxy.log_tail()));
        if message["method"] == "notifications/subscriptions/acknowledged" {
            break;
        }
    }
    let closed = Instant::now();
    drop(proxy.stdin.take());
    let status = wait_for(&mut proxy.child, Duration::from_secs(15));
    assert!(status.success(), "exit {status}\n{}", proxy.log_tail());
    assert!(
        closed.elapsed() < Duration::from_secs(2),
        "exited {:?} after stdin closed (grace 10 s)",
        closed.elapsed()
    );
    bench.assert_audit_verifies();
}
