//! The corridor's other refusals and failures in front of an upstream (DESIGN.md §4): arguments
//! the upstream's schema rejects never leave the gateway, a denied approval forwards nothing and
//! says not to retry, an upstream's own failure stays a failure, a timeout cancels the call
//! upstream, and the kill switch stops a running gateway.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{
    Bench, Era, assert_ran, calls, calls_of, cancellations, effects, error_code, gateway_policy,
    is_error, testbed, text, until,
};

fn outcome_of(bench: &Bench, tool: &str) -> Vec<String> {
    bench
        .records_of(tool)
        .iter()
        .filter(|r| r["method"] == "tools/call")
        .map(|r| {
            format!(
                "{}/{}",
                r["decision"].as_str().unwrap(),
                r["outcome"].as_str().unwrap()
            )
        })
        .collect()
}

#[test]
fn arguments_the_upstream_schema_rejects_are_refused_before_forwarding() {
    let bench = Bench::new("testbed-keys.toml");
    let up = bench.mkdir("up");
    let mut proxy = bench.proxy("tb", &testbed(&up, "both"), Era::Modern);
    let cases: [(&str, Value); 3] = [
        ("value missing", json!({"id": "s-1"})),
        ("value not a string", json!({"id": "s-1", "value": 7})),
        (
            "an argument the schema does not have",
            json!({"id": "s-1", "value": "v", "path": "/etc/passwd"}),
        ),
    ];
    for (case, arguments) in cases {
        let reply = proxy.call("write_record", arguments);
        assert!(is_error(&reply), "{case}: {reply}");
        assert_eq!(
            reply["result"]["structuredContent"]["status"], "invalid_args",
            "{case}: {reply}"
        );
    }
    proxy.close();
    assert!(calls(&up).is_empty(), "forwarded: {:?}", calls(&up));
    assert!(effects(&up).is_empty());
    assert_eq!(outcome_of(&bench, "write_record"), ["deny/invalid_args"; 3]);
    bench.assert_audit_verifies();
}

#[test]
fn a_denied_approval_forwards_nothing_and_tells_the_model_not_to_retry() {
    let bench = Bench::new("testbed.toml");
    let up = bench.mkdir("up");
    let mut proxy = bench.proxy("tb", &testbed(&up, "both"), Era::Modern);
    let held = proxy.send_call("write_record", json!({"id": "d-1", "value": "no"}));
    let mut id = String::new();
    until("a pending approval", Duration::from_secs(10), || {
        let out = bench.cli(&["approvals", "list", "--json"]);
        let rows: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        match rows[0]["id"].as_str() {
            Some(found) => {
                id = found.to_owned();
                true
            }
            None => false,
        }
    });
    let out = bench.cli(&[
        "approvals",
        "deny",
        &id,
        "--as",
        "human:approver",
        "--reason",
        "not today",
    ]);
    assert!(
        out.status.success(),
        "deny: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (reply, _) = proxy.answer(held);
    assert!(is_error(&reply), "{reply}");
    assert!(
        text(&reply).contains("Do not retry this action. Tell the user it needs a person."),
        "{reply}"
    );
    // Asking again changes nothing.
    let again = proxy.call("write_record", json!({"id": "d-1", "value": "no"}));
    assert!(is_error(&again), "{again}");
    proxy.close();
    assert_eq!(calls_of(&up, "write_record"), 0);
    assert!(effects(&up).is_empty());
    bench.assert_audit_verifies();
}

#[test]
fn an_upstream_failure_is_an_error_result_and_audited_as_failed() {
    let bench = Bench::new("testbed.toml");
    let up = bench.mkdir("up");
    let mut proxy = bench.proxy("tb", &testbed(&up, "both"), Era::Modern);
    let reply = proxy.call("fail", json!({"message": "disk full on /srv"}));
    proxy.close();
    assert!(is_error(&reply), "a failure is never success: {reply}");
    assert!(text(&reply).contains("disk full on /srv"), "{reply}");
    assert_eq!(outcome_of(&bench, "fail"), ["allow/failed"]);
    bench.assert_audit_verifies();
}

#[test]
fn a_call_past_its_timeout_is_answered_and_cancelled_upstream() {
    let anchor = "[tools.hang]\ntier = \"low\"\n";
    let policy = gateway_policy("testbed.toml");
    assert!(
        policy.contains(anchor),
        "tests/gateway/testbed.toml changed"
    );
    let policy = policy.replace(anchor, &format!("{anchor}timeout = \"1s\"\n"));
    let bench = Bench::with_policy_text("testbed.toml", &policy);
    let up = bench.mkdir("up");
    let mut proxy = bench.proxy("tb", &testbed(&up, "both"), Era::Modern);
    let started = Instant::now();
    let reply = proxy.call("hang", json!({}));
    let took = started.elapsed();
    assert!(is_error(&reply), "{reply}");
    assert_eq!(
        reply["result"]["structuredContent"]["status"], "timeout",
        "{reply}"
    );
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(4),
        "answered after {took:?}"
    );
    until(
        "the upstream seeing the cancellation",
        Duration::from_secs(5),
        || cancellations(&up).iter().any(|l| l == "hang cancelled"),
    );
    assert_ran(
        &proxy.call("echo", json!({"text": "after"})),
        "echo after a timeout",
    );
    proxy.close();
    assert_eq!(outcome_of(&bench, "hang"), ["allow/timeout"]);
    bench.assert_audit_verifies();
}

#[test]
fn the_kill_switch_stops_a_running_gateway_before_anything_is_forwarded() {
    let bench = Bench::new("testbed.toml");
    let up = bench.mkdir("up");
    let mut proxy = bench.proxy("tb", &testbed(&up, "both"), Era::Modern);
    assert_ran(
        &proxy.call("echo", json!({"text": "before"})),
        "echo before",
    );

    let on = bench.cli(&["killswitch", "on", "--as", "human:oncall"]);
    assert!(
        on.status.success(),
        "{}",
        String::from_utf8_lossy(&on.stderr)
    );
    let refused = proxy.call("echo", json!({"text": "while on"}));
    assert_eq!(error_code(&refused), Some(-32602), "{refused}");

    let off = bench.cli(&["killswitch", "off", "--as", "human:oncall"]);
    assert!(
        off.status.success(),
        "{}",
        String::from_utf8_lossy(&off.stderr)
    );
    assert_ran(&proxy.call("echo", json!({"text": "after"})), "echo after");
    proxy.close();

    assert_eq!(
        calls_of(&up, "echo"),
        2,
        "the refused call reached the upstream"
    );
    let refusals: Vec<Value> = bench
        .records_of("echo")
        .into_iter()
        .filter(|r| r["rule"] == "killswitch")
        .collect();
    assert_eq!(refusals.len(), 1, "{refusals:?}");
    assert_eq!(refusals[0]["upstream"], "tb");
    bench.assert_audit_verifies();
}
