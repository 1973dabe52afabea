//! What passes through the gateway besides the call: progress comes back under the caller's own
//! token, a caller's cancellation reaches the upstream, and with several upstreams each tool is
//! named, governed and audited as its upstream's.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{
    Bench, Era, assert_call_progress, assert_everything_progress, assert_ran, calls, calls_of,
    cancellations, peer, testbed, text, until, upstreams_of,
};

fn progress_from_testbed(era: Era, token: Value) {
    let bench = Bench::new("testbed.toml");
    let up = bench.mkdir("up");
    let mut proxy = bench.proxy("tb", &testbed(&up, "both"), era);
    let what = format!("{era:?}");
    let arguments = json!({"ms": 900, "steps": 3});
    assert_call_progress(&mut proxy, "slow", arguments, &token, 3, &what);
    proxy.close();
    bench.assert_audit_verifies();
}

#[test]
fn progress_reaches_a_2026_client_under_its_own_token() {
    progress_from_testbed(Era::Modern, json!("caller-token-7"));
}

#[test]
fn progress_reaches_a_legacy_client_under_its_own_token() {
    progress_from_testbed(Era::Legacy("2025-11-25"), json!(4242));
}

#[test]
fn every_progress_notification_sent_before_the_answer_arrives_in_order_before_it() {
    let bench = Bench::new("testbed.toml");
    let up = bench.mkdir("up");
    let mut proxy = bench.proxy("tb", &testbed(&up, "both"), Era::Modern);
    // Concurrent calls, so that notification handlers run side by side as they do under load.
    let calls: Vec<(u64, Value)> = (0..20)
        .map(|i| {
            let token = json!(format!("concurrent-{i}"));
            let id = proxy.send_call_with_meta(
                "slow",
                json!({"ms": 100, "steps": 5}),
                json!({"progressToken": token}),
            );
            (id, token)
        })
        .collect();
    // Everything the gateway sends, in arrival order, until every call is answered.
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut arrived = Vec::new();
    while arrived
        .iter()
        .filter(|m: &&Value| m.get("result").is_some())
        .count()
        < calls.len()
    {
        let message = proxy
            .next_before(deadline)
            .unwrap_or_else(|| panic!("not every call was answered\n{}", proxy.log_tail()));
        arrived.push(message);
    }
    proxy.close();
    for (id, token) in &calls {
        let answered_at = arrived
            .iter()
            .position(|m| m["id"] == *id)
            .expect("answered");
        let mine: Vec<(usize, f64)> = arrived
            .iter()
            .enumerate()
            .filter(|(_, m)| m["params"]["progressToken"] == *token)
            .map(|(at, m)| (at, m["params"]["progress"].as_f64().expect("progress")))
            .collect();
        let values: Vec<f64> = mine.iter().map(|(_, p)| *p).collect();
        assert_eq!(values, [1.0, 2.0, 3.0, 4.0, 5.0], "call {id}: its progress");
        assert!(
            mine.iter().all(|(at, _)| *at < answered_at),
            "call {id}: progress after its answer: {mine:?}, answered at {answered_at}"
        );
    }
}

#[test]
fn progress_from_the_everything_server_reaches_the_client() {
    let bench = Bench::new("everything.toml");
    let server = peer("node/node_modules/.bin/mcp-server-everything");
    let mut proxy = bench.proxy(
        "everything",
        &[server.display().to_string()],
        Era::Legacy("2025-11-25"),
    );
    assert_everything_progress(&mut proxy, &json!("everything-1"), "everything");
    proxy.close();
    bench.assert_audit_verifies();
}

fn cancel(era: Era, tool: &str, arguments: Value, logged: &str) {
    let bench = Bench::new("testbed.toml");
    let up = bench.mkdir("up");
    let mut proxy = bench.proxy("tb", &testbed(&up, "both"), era);
    let call = proxy.send_call(tool, arguments);
    until(
        &format!("{tool} reaching the upstream"),
        Duration::from_secs(10),
        || calls_of(&up, tool) == 1,
    );
    let cancelled = Instant::now();
    proxy.notify(
        "notifications/cancelled",
        json!({"requestId": call, "reason": "the user changed their mind"}),
    );
    until(
        "the upstream seeing the cancellation",
        Duration::from_secs(5),
        || cancellations(&up).iter().any(|l| l == logged),
    );
    assert!(cancelled.elapsed() < Duration::from_secs(5));
    // The spec: a cancelled request gets no response.
    let after = proxy.quiet(Duration::from_millis(500));
    assert!(
        after.iter().all(|m| m["id"] != call),
        "{era:?}: the cancelled call was answered: {after:?}"
    );
    // The gateway and its upstream carry on.
    let echo = proxy.call("echo", json!({"text": "after the cancel"}));
    assert_ran(&echo, "echo after a cancellation");
    proxy.close();

    let records = bench.records_of(tool);
    assert_eq!(records.len(), 1, "{records:#?}");
    assert_eq!(
        (&records[0]["outcome"], &records[0]["upstream"]),
        (&json!("cancelled"), &json!("tb")),
        "{records:#?}"
    );
    bench.assert_audit_verifies();
}

#[test]
fn a_2026_clients_cancellation_reaches_the_upstream() {
    cancel(
        Era::Modern,
        "slow",
        json!({"ms": 10000, "steps": 1}),
        "cancelled 10000",
    );
}

#[test]
fn a_legacy_clients_cancellation_reaches_the_upstream() {
    cancel(
        Era::Legacy("2025-11-25"),
        "hang",
        json!({}),
        "hang cancelled",
    );
}

#[test]
fn two_upstreams_are_prefixed_governed_by_their_prefixed_names_and_audited_by_name() {
    let bench = Bench::new("two-upstreams.toml");
    let (dir_a, dir_b) = (bench.mkdir("a"), bench.mkdir("b"));
    let flag = |name: &str, dir: &std::path::Path| {
        // Shell-quoted as a person would type it.
        let words: Vec<String> = testbed(dir, "both")
            .iter()
            .map(|w| shlex_quote(w))
            .collect();
        format!("{name}={}", words.join(" "))
    };
    let flags = [
        "--upstream".to_owned(),
        flag("a", &dir_a),
        "--upstream".to_owned(),
        flag("b", &dir_b),
    ];
    let command = bench.proxy_command(&flags, &[]);
    let mut proxy = super::Proxy::start(command, Era::Modern, &bench.log_path());

    assert_eq!(proxy.tool_names(), ["a__echo"]);
    let reply = proxy.call("a__echo", json!({"text": "to a"}));
    assert_ran(&reply, "a__echo");
    assert_eq!(text(&reply), "echo: to a");
    proxy.assert_refused(
        &["b__echo", "echo", "a__write_record"],
        &json!({"text": "x"}),
    );
    proxy.close();

    assert_eq!(calls(&dir_a), ["echo"], "a received only its own echo");
    assert!(calls(&dir_b).is_empty(), "b received {:?}", calls(&dir_b));
    let records = bench.records();
    let upstream_of = |name: &str| upstreams_of(&records, name);
    assert_eq!(upstream_of("a__echo"), [json!("a")], "{records:#?}");
    assert_eq!(upstream_of("b__echo"), [json!("b")], "{records:#?}");
    assert_eq!(upstream_of("a__write_record"), [json!("a")], "{records:#?}");
    let a_echo = records
        .iter()
        .find(|r| r["name"] == "a__echo")
        .expect("a__echo record");
    assert_eq!(
        (&a_echo["decision"], &a_echo["outcome"], &a_echo["rule"]),
        (
            &json!("allow"),
            &json!("committed"),
            &json!("tools.a__echo.tier")
        )
    );
    bench.assert_audit_verifies();
}

/// `word` quoted for a POSIX shell when it needs to be.
fn shlex_quote(word: &str) -> String {
    if word
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "/._-".contains(c))
    {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}
