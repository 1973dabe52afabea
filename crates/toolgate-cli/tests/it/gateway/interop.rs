//! The gateway driven by a client nobody here wrote: the official MCP Python SDK.
//!
//! The other gateway tests speak raw JSON lines written by the same people who wrote the gateway,
//! so a misreading of the spec shared by both would pass them. `tests/interop/python_sdk_gateway.py`
//! runs `mcp.client.Client` against `toolgate proxy` in front of the testbed upstream, in each of
//! the SDK's protocol modes. The script checks everything itself; this side checks its summary
//! and, independently, the files the scenario left behind, so a script edited into passing
//! vacuously still cannot turn these tests green.

use serde_json::{Value, json};

use super::http::Everything;
use super::{Bench, calls_of, effects, peer, testbed_bin};
use crate::interop::{run_sdk_script, sdk_script};

fn run_mode(mode: &str, expected_version: &str) {
    // The bench's layout is the script's: policy copy, WORK/data, WORK/up.
    let bench = Bench::new("testbed-keys.toml");
    let mut command = sdk_script("python_sdk_gateway.py", mode);
    command
        .arg("--testbed")
        .arg(testbed_bin())
        .arg("--policy")
        .arg(&bench.policy)
        .arg("--work")
        .arg(bench.dir.path())
        .env_remove("FAILPOINTS")
        .env_remove("TESTBED_ALLOW_GATED");
    let label = "Python SDK client of toolgate proxy";
    let (summary, what) = run_sdk_script(command, label, mode, expected_version);
    assert_eq!(
        summary["tools"],
        json!(["crash_after_write", "echo", "slow", "write_record"]),
        "{what}"
    );
    assert_eq!(summary["blocked_error"]["code"], -32602, "{what}");
    assert_eq!(summary["write_record"][1], "replay", "{what}");
    assert_eq!(summary["progress"], json!([1.0, 2.0, 3.0]), "{what}");

    // What the scenario left behind, read here rather than taken from the script's word.
    let up = bench.path("up");
    let records = effects(&up);
    assert_eq!(records.len(), 1, "records.jsonl: {records:?}\n{what}");
    assert_eq!(calls_of(&up, "write_record"), 1, "{what}");
    assert_eq!(calls_of(&up, "delete_record"), 0, "{what}");
    assert_eq!(calls_of(&up, "slow"), 1, "{what}");
    let outcomes: Vec<Value> = bench
        .records_of("write_record")
        .iter()
        .map(|r| r["outcome"].clone())
        .collect();
    assert_eq!(outcomes, [json!("committed"), json!("replay")], "{what}");
    bench.assert_audit_verifies();
}

#[test]
fn python_sdk_through_the_gateway_auto_negotiates_2026_07_28() {
    run_mode("auto", "2026-07-28");
}

#[test]
fn python_sdk_through_the_gateway_legacy_initialize() {
    run_mode("legacy", "2025-11-25");
}

#[test]
fn python_sdk_through_the_gateway_pinned_2026_07_28() {
    run_mode("2026-07-28", "2026-07-28");
}

/// Where the pass-through scenario's everything server runs.
enum Upstream {
    /// A child process of the gateway, on stdio.
    Stdio,
    /// Its own process, serving Streamable HTTP; the gateway dials it.
    Http,
}

/// `tests/interop/python_sdk_passthrough.py` in `mode`: the Python SDK, with sampling,
/// elicitation, roots and logging callbacks, through the gateway in front of server-everything,
/// which asks its caller questions mid-call. The audit log of each run is read here too.
fn passthrough_mode(mode: &str, expected_version: &str, upstream: Upstream) {
    let work = tempfile::tempdir().expect("tempdir");
    let mut command = sdk_script("python_sdk_passthrough.py", mode);
    command.arg("--work").arg(work.path());
    let server = match upstream {
        Upstream::Stdio => {
            command
                .arg("--everything")
                .arg(peer("node/node_modules/.bin/mcp-server-everything"));
            None
        }
        Upstream::Http => {
            let server = Everything::start(&work.path().join("everything.log"));
            command.arg("--everything-url").arg(server.url());
            Some(server)
        }
    };
    let label = "Python SDK client of toolgate proxy, pass-through";
    let (summary, what) = run_sdk_script(command, label, mode, expected_version);
    if let Some(server) = server {
        server.stop();
    }
    assert_eq!(summary["sampling_refused"], "not offered", "{what}");
    assert_eq!(
        summary["templates"],
        json!(["demo://resource/dynamic/text/{resourceId}"]),
        "{what}"
    );
    assert_eq!(summary["completions"][0], json!(["Engineering"]), "{what}");
    if expected_version != "2026-07-28" {
        assert!(summary["logs"].as_u64().unwrap_or(0) > 0, "{what}");
        assert_eq!(
            summary["updated"],
            json!(["demo://resource/static/document/architecture.md"]),
            "{what}"
        );
    }
    // Each question the upstream put is in the log, as the policy decided it.
    let audited = |run: &str, method: &str| -> Vec<(String, String)> {
        let text =
            std::fs::read_to_string(work.path().join(run).join("audit.jsonl")).unwrap_or_default();
        text.lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|r| r["method"] == method)
            .map(|r| {
                let field = |k: &str| r[k].as_str().unwrap_or_default().to_owned();
                (field("decision"), field("rule"))
            })
            .collect()
    };
    let allowed = |rule: &str| ("allow".to_owned(), rule.to_owned());
    assert_eq!(
        audited("data-default", "elicitation/create"),
        [allowed("passthrough.elicitation")],
        "{what}"
    );
    // Over HTTP the everything server asks for roots in relation to no call: refused unaudited,
    // as nobody's (the script checks the callback was never called).
    if matches!(upstream, Upstream::Stdio) {
        assert!(
            audited("data-default", "roots/list").contains(&allowed("passthrough.roots")),
            "{what}"
        );
        assert_eq!(summary["roots"], "passed", "{what}");
    } else {
        assert_eq!(summary["roots"], "refused: related to no call", "{what}");
    }
    assert!(
        audited("data-default", "sampling/createMessage").is_empty(),
        "{what}"
    );
    assert_eq!(
        audited("data-sampling", "sampling/createMessage"),
        [allowed("passthrough.sampling")],
        "{what}"
    );
    // A subscription is a request for a resource: decided by the resource rules and recorded.
    let subscribed = audited("data-default", "resources/subscribe");
    if expected_version == "2026-07-28" {
        assert!(subscribed.is_empty(), "{what}");
    } else {
        assert_eq!(subscribed, [allowed("passthrough.resources")], "{what}");
    }
}

#[test]
fn python_sdk_passthrough_on_an_initialize_session() {
    passthrough_mode("legacy", "2025-11-25", Upstream::Stdio);
}

#[test]
fn python_sdk_passthrough_in_2026_07_28_asks_with_input_required() {
    passthrough_mode("2026-07-28", "2026-07-28", Upstream::Stdio);
}

/// The same over HTTP: the gateway posts the calls to the upstream itself, and the questions,
/// progress and log messages come back on the POST's stream or the session's.
#[test]
fn python_sdk_passthrough_of_an_http_upstream_on_an_initialize_session() {
    passthrough_mode("legacy", "2025-11-25", Upstream::Http);
}

#[test]
fn python_sdk_passthrough_of_an_http_upstream_in_2026_07_28() {
    passthrough_mode("2026-07-28", "2026-07-28", Upstream::Http);
}
