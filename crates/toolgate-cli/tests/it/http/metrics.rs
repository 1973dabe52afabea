//! `--metrics ADDR`: the gate's counters on a listener of their own, scraped over a real socket
//! and read by the official Prometheus Python client's parser (pinned in scripts/test).

use std::io::Write as _;
use std::process::{Command, Stdio};

use serde_json::{Value, json};

use super::{HttpServer, Keys, Scratch, Signer, claims, helpdesk_policy};

/// The samples of a scrape, as the Prometheus client's parser reads them.
pub(crate) fn parse(exposition: &str) -> Vec<Value> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/metrics/parse.py");
    let mut child = Command::new("python3")
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run python3");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(exposition.as_bytes())
        .expect("write the scrape");
    let out = child.wait_with_output().expect("parser");
    assert!(
        out.status.success(),
        "the Prometheus parser refused the scrape: {}\n{exposition}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice::<Vec<Value>>(&out.stdout).expect("samples")
}

/// The value of the one sample named `name` whose labels include `labels`.
pub(crate) fn sample(samples: &[Value], name: &str, labels: &Value) -> Option<f64> {
    let wanted = labels.as_object().expect("labels");
    samples
        .iter()
        .find(|s| s["name"] == name && wanted.iter().all(|(k, v)| &s["labels"][k.as_str()] == v))
        .and_then(|s| s["value"].as_f64())
}

#[test]
fn metrics_count_each_call_by_tool_decision_and_outcome_and_parse_as_prometheus() {
    let scratch = Scratch::with_policy_text("helpdesk", &helpdesk_policy());
    let rsa = Signer::rsa("rsa-1");
    let server = HttpServer::start(&scratch, Keys::File(&[&rsa]), &["--metrics", "127.0.0.1:0"]);
    let address = std::fs::read_to_string(&server.log)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .find(|line| line["fields"]["message"] == "toolgate serving metrics")
        .and_then(|line| line["fields"]["address"].as_str().map(str::to_owned))
        .unwrap_or_else(|| panic!("no metrics address logged\n{}", server.log_text()));

    let resource = server.resource();
    let read = rsa.sign(&claims(&resource, "user-alice", "tickets:read"));
    for _ in 0..2 {
        let reply = server.call(&read, "get_ticket", json!({"id": "T-1001"}));
        assert_eq!(reply.status, 200, "{}", reply.body);
    }
    // A name the caller made up: refused, and counted without growing a series of its own.
    let invented = server.call(&read, "no_such_tool_7f3a", json!({}));
    assert_eq!(invented.status, 200, "{}", invented.body);

    let url = format!("http://{address}/metrics");
    let scrape = server
        .http
        .send("GET", &url, &[], Vec::new())
        .expect("scrape");
    assert_eq!(scrape.status, 200, "{}", scrape.body);
    assert!(
        scrape
            .header("content-type")
            .is_some_and(|t| t.starts_with("text/plain; version=0.0.4")),
        "{:?}",
        scrape.header("content-type")
    );
    let samples = parse(&scrape.body);

    let allowed: f64 = samples
        .iter()
        .filter(|s| {
            s["name"] == "toolgate_calls_total"
                && s["labels"]["tool"] == "get_ticket"
                && s["labels"]["decision"] == "allow"
        })
        .filter_map(|s| s["value"].as_f64())
        .sum();
    assert!((allowed - 2.0).abs() < f64::EPSILON, "{}", scrape.body);
    let unknown = sample(
        &samples,
        "toolgate_calls_total",
        &json!({"tool": "(unknown)", "decision": "deny"}),
    );
    assert_eq!(unknown, Some(1.0), "{}", scrape.body);
    assert!(
        !scrape.body.contains("no_such_tool_7f3a"),
        "{}",
        scrape.body
    );
    let timed = sample(
        &samples,
        "toolgate_call_duration_seconds_count",
        &json!({"tool": "get_ticket"}),
    );
    assert_eq!(timed, Some(2.0), "{}", scrape.body);
    // Every step a call walked is timed; a call that ends at a step is timed up to it.
    let steps = |step: &str| {
        sample(
            &samples,
            "toolgate_step_duration_seconds_count",
            &json!({ "step": step }),
        )
    };
    assert_eq!(steps("kill_switch"), Some(3.0), "{}", scrape.body);
    assert_eq!(steps("visibility"), Some(3.0), "{}", scrape.body);
    assert_eq!(steps("run"), Some(2.0), "{}", scrape.body);
    assert_eq!(steps("audit"), Some(3.0), "{}", scrape.body);
    let appended = sample(&samples, "toolgate_audit_append_seconds_count", &json!({}));
    assert!(appended.is_some_and(|n| n >= 3.0), "{}", scrape.body);
    assert_eq!(sample(&samples, "toolgate_ready", &json!({})), Some(1.0));
    assert_eq!(
        sample(
            &samples,
            "toolgate_approvals",
            &json!({"status": "pending"})
        ),
        Some(0.0)
    );
    assert_eq!(
        sample(&samples, "toolgate_killswitch_on", &json!({})),
        Some(0.0)
    );
    let in_doubt = json!({"state": "in_doubt"});
    assert_eq!(
        sample(&samples, "toolgate_idempotency_keys", &in_doubt),
        Some(0.0),
        "{}",
        scrape.body
    );

    // A page reached through DNS rebinding names another host: refused.
    let rebound = server
        .http
        .send("GET", &url, &[("host", "evil.example")], Vec::new())
        .expect("scrape");
    assert_eq!(rebound.status, 403, "{}", rebound.body);
    server.stop();
}
