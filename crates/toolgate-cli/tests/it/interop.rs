//! Interoperability with a client nobody here wrote: the official MCP Python SDK.
//!
//! Our own tests drive toolgate with rmcp, the library it is built on, so a misreading of the
//! spec shared by both sides would pass them. `tests/interop/python_sdk_client.py` runs the seed
//! scenario through `mcp.client.Client` in each of the SDK's protocol modes instead.

use std::path::PathBuf;
use std::process::{Command, Output};

const SDK_MISSING: &str = "the official Python SDK is missing: pip install 'mcp>=2.1.1'";

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/interop/python_sdk_client.py")
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
        "Python SDK client, mode {mode}: {}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout).trim_end(),
        String::from_utf8_lossy(&out.stderr).trim_end(),
    )
}

fn run_mode(mode: &str, expected_version: &str) {
    require_sdk();
    let out = Command::new("python3")
        .arg(script())
        .arg("--toolgate")
        .arg(env!("CARGO_BIN_EXE_toolgate"))
        .args(["--mode", mode])
        .output()
        .unwrap_or_else(|err| panic!("cannot run python3 {}: {err}", script().display()));
    assert!(out.status.success(), "{}", describe(mode, &out));

    // The script checks all of this itself; reading its summary here means a script edited into
    // passing vacuously still cannot turn this test green.
    let stdout = String::from_utf8_lossy(&out.stdout);
    let summary: serde_json::Value = stdout
        .lines()
        .rev()
        .find(|line| !line.trim().is_empty())
        .and_then(|line| serde_json::from_str(line).ok())
        .unwrap_or_else(|| panic!("no JSON summary line\n{}", describe(mode, &out)));
    let field = |name: &str| summary.get(name).cloned().unwrap_or_default();
    assert_eq!(field("ok"), true, "{}", describe(mode, &out));
    assert_eq!(field("mode"), mode, "{}", describe(mode, &out));
    assert_eq!(
        field("protocol_version"),
        expected_version,
        "{}",
        describe(mode, &out)
    );
    assert_eq!(
        field("write_note"),
        serde_json::json!(["committed", "replay"]),
        "{}",
        describe(mode, &out)
    );
    assert_eq!(
        field("rm_rf_error")["code"],
        -32602,
        "{}",
        describe(mode, &out)
    );
}

#[test]
fn python_sdk_auto_negotiates_2026_07_28() {
    run_mode("auto", "2026-07-28");
}

#[test]
fn python_sdk_legacy_initialize() {
    run_mode("legacy", "2025-11-25");
}

#[test]
fn python_sdk_pinned_2026_07_28() {
    run_mode("2026-07-28", "2026-07-28");
}
