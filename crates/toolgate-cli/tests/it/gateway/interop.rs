//! The gateway driven by a client nobody here wrote: the official MCP Python SDK.
//!
//! The other gateway tests speak raw JSON lines written by the same people who wrote the gateway,
//! so a misreading of the spec shared by both would pass them. `tests/interop/python_sdk_gateway.py`
//! runs `mcp.client.Client` against `toolgate proxy` in front of the testbed upstream, in each of
//! the SDK's protocol modes. The script checks everything itself; this side checks its summary
//! and, independently, the files the scenario left behind, so a script edited into passing
//! vacuously still cannot turn these tests green.

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::{Value, json};

use super::{Bench, calls_of, effects, repo_root, testbed_bin};

const SDK_MISSING: &str = "the official Python SDK is missing: pip install 'mcp>=2.1.1'";

fn script() -> PathBuf {
    repo_root().join("tests/interop/python_sdk_gateway.py")
}

/// Fails rather than skips: a machine without the SDK would otherwise report interop as proven.
fn require_sdk() {
    match Command::new("python3").args(["-c", "import mcp"]).output() {
        Ok(probe) if probe.status.success() => {}
        Ok(probe) => panic!(
            "{SDK_MISSING}\n`python3 -c \"import mcp\"` said: {}",
            String::from_utf8_lossy(&probe.stderr).trim()
        ),
        Err(err) => panic!("{SDK_MISSING}\ncannot run python3: {err}"),
    }
}

fn describe(mode: &str, out: &Output) -> String {
    format!(
        "Python SDK client of toolgate proxy, mode {mode}: {}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout).trim_end(),
        String::from_utf8_lossy(&out.stderr).trim_end(),
    )
}

fn run_mode(mode: &str, expected_version: &str) {
    require_sdk();
    // The bench's layout is the script's: policy copy, WORK/data, WORK/up.
    let bench = Bench::new("testbed-keys.toml");
    let out = Command::new("python3")
        .arg(script())
        .arg("--toolgate")
        .arg(env!("CARGO_BIN_EXE_toolgate"))
        .arg("--testbed")
        .arg(testbed_bin())
        .args(["--mode", mode])
        .arg("--policy")
        .arg(&bench.policy)
        .arg("--work")
        .arg(bench.dir.path())
        .env_remove("FAILPOINTS")
        .env_remove("TESTBED_ALLOW_GATED")
        .output()
        .unwrap_or_else(|err| panic!("cannot run python3 {}: {err}", script().display()));
    let what = describe(mode, &out);
    assert!(out.status.success(), "{what}");

    let stdout = String::from_utf8_lossy(&out.stdout);
    let summary: Value = stdout
        .lines()
        .rev()
        .find(|line| !line.trim().is_empty())
        .and_then(|line| serde_json::from_str(line).ok())
        .unwrap_or_else(|| panic!("no JSON summary line\n{what}"));
    let field = |name: &str| summary.get(name).cloned().unwrap_or_default();
    assert_eq!(field("ok"), true, "{what}");
    assert_eq!(field("mode"), mode, "{what}");
    assert_eq!(field("protocol_version"), expected_version, "{what}");
    assert_eq!(
        field("tools"),
        json!(["crash_after_write", "echo", "slow", "write_record"]),
        "{what}"
    );
    assert_eq!(field("blocked_error")["code"], -32602, "{what}");
    assert_eq!(field("write_record")[1], "replay", "{what}");
    assert_eq!(field("progress"), json!([1.0, 2.0, 3.0]), "{what}");

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
