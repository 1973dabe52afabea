//! The gateway driven by a client nobody here wrote: the official MCP Python SDK.
//!
//! The other gateway tests speak raw JSON lines written by the same people who wrote the gateway,
//! so a misreading of the spec shared by both would pass them. `tests/interop/python_sdk_gateway.py`
//! runs `mcp.client.Client` against `toolgate proxy` in front of the testbed upstream, in each of
//! the SDK's protocol modes. The script checks everything itself; this side checks its summary
//! and, independently, the files the scenario left behind, so a script edited into passing
//! vacuously still cannot turn these tests green.

use serde_json::{Value, json};

use super::{Bench, calls_of, effects, testbed_bin};
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
