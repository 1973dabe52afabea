//! Interoperability with a client nobody here wrote: the official MCP Python SDK.
//!
//! Our own tests drive toolgate with rmcp, the library it is built on, so a misreading of the
//! spec shared by both sides would pass them. `tests/interop/python_sdk_client.py` runs the seed
//! scenario through `mcp.client.Client` in each of the SDK's protocol modes instead.
//!
//! [`sdk_script`] and [`run_sdk_script`] also run `python_sdk_gateway.py` for `gateway/interop.rs`.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::{Value, json};

const SDK_MISSING: &str =
    "the official Python SDK is missing: pip install mcp==2.3.0 (scripts/test does)";

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

/// `python3 tests/interop/SCRIPT --toolgate BIN --mode MODE`, not yet run; the caller adds its
/// script's other flags. Requires the SDK first.
pub(super) fn sdk_script(script: &str, mode: &str) -> Command {
    require_sdk();
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/interop")
        .join(script);
    let mut command = Command::new("python3");
    command
        .arg(path)
        .arg("--toolgate")
        .arg(env!("CARGO_BIN_EXE_toolgate"))
        .args(["--mode", mode]);
    command
}

/// `python3 tests/interop/SCRIPT --mode MODE` for a script that is only the client of a server
/// the caller started itself (`python_sdk_http.py`), not yet run. Requires the SDK first.
pub(super) fn sdk_client_script(script: &str, mode: &str) -> Command {
    require_sdk();
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/interop")
        .join(script);
    let mut command = Command::new("python3");
    command.arg(path).args(["--mode", mode]);
    command
}

/// The script's exit status and output headed by `label`, for failure messages.
fn describe(label: &str, mode: &str, out: &Output) -> String {
    format!(
        "{label}, mode {mode}: {}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout).trim_end(),
        String::from_utf8_lossy(&out.stderr).trim_end(),
    )
}

/// Runs a script from [`sdk_script`] in `mode`; returns its JSON summary (the last line it
/// printed) and [`describe`]'s text for the caller's own assertions. Asserts what every script's
/// summary must say: exit 0, `ok`, the mode, and the revision the SDK negotiated.
///
/// The scripts check all of this themselves; reading their summary here means a script edited
/// into passing vacuously still cannot turn a test green.
pub(super) fn run_sdk_script(
    mut command: Command,
    label: &str,
    mode: &str,
    expected_version: &str,
) -> (Value, String) {
    let out = command
        .output()
        .unwrap_or_else(|err| panic!("cannot run {command:?}: {err}"));
    let what = describe(label, mode, &out);
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
    (summary, what)
}

fn run_mode(mode: &str, expected_version: &str) {
    let command = sdk_script("python_sdk_client.py", mode);
    let (summary, what) = run_sdk_script(command, "Python SDK client", mode, expected_version);
    assert_eq!(
        summary["write_note"],
        json!(["committed", "replay"]),
        "{what}"
    );
    assert_eq!(summary["rm_rf_error"]["code"], -32602, "{what}");
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
