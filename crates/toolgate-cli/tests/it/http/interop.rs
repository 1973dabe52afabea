//! The official MCP Python SDK as the HTTP client: `tests/interop/python_sdk_http.py` connects to
//! a `toolgate serve --toolset helpdesk --http` started here, with a bearer token in the
//! `Authorization` header, in the 2026-07-28 mode and in the legacy `initialize` mode. Like the
//! stdio interop tests it fails, never skips, when the SDK is missing.

use serde_json::json;

use super::{HttpServer, Keys, Scratch, Signer, assert_audit_verifies, claims, helpdesk_policy};
use crate::interop::{run_sdk_script, sdk_client_script};

fn run_mode(mode: &str, expected_version: &str) {
    let scratch = Scratch::with_policy_text("helpdesk", &helpdesk_policy());
    let rsa = Signer::rsa("rsa-1");
    let server = HttpServer::start(&scratch, Keys::File(&[&rsa]), &[]);
    let resource = server.resource();
    let alice = rsa.sign(&claims(&resource, "user-alice", "tickets:read"));
    let bob = rsa.sign(&claims(&resource, "user-bob", "tickets:read"));

    let mut command = sdk_client_script("python_sdk_http.py", mode);
    command
        .args(["--url", &server.url("/mcp")])
        .env("TOOLGATE_TOKEN_ALICE", &alice)
        .env("TOOLGATE_TOKEN_BOB", &bob);
    let (summary, what) = run_sdk_script(
        command,
        "Python SDK over Streamable HTTP",
        mode,
        expected_version,
    );
    let what = format!("{what}\n{}", server.log_text());
    eprintln!("Python SDK, mode {mode}: {summary}");
    assert_eq!(
        summary["tools"],
        json!(["search_tickets", "get_ticket"]),
        "{what}"
    );
    assert_eq!(summary["alice_search"], json!(["T-1001"]), "{what}");
    assert_eq!(summary["bob_search"], json!(["T-1004"]), "{what}");
    assert_eq!(summary["ticket_clean"], true, "{what}");
    assert_eq!(summary["other_user"], "not found", "{what}");
    // A client without a token got HTTP 401 and nothing else, whichever way the SDK words it.
    let statuses = summary["anonymous"]["http_statuses"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        !statuses.is_empty() && statuses.iter().all(|s| s == 401),
        "{what}"
    );

    // The SDK ended its legacy sessions cleanly: it warns about any DELETE answer but 200 / 204.
    let stderr = what.split("--- stderr ---").nth(1).unwrap_or_default();
    assert!(!stderr.contains("Session termination failed"), "{what}");

    // What the SDK did is on the record under the tokens' subjects, and the chain holds.
    let records = scratch.records();
    let subjects: std::collections::BTreeSet<&str> = records
        .iter()
        .filter(|r| r["method"] == "tools/call")
        .filter_map(|r| r["principal"].as_str())
        .collect();
    assert_eq!(
        subjects.into_iter().collect::<Vec<_>>(),
        ["user-alice", "user-bob"],
        "{what}"
    );
    server.stop();
    assert_audit_verifies(&scratch);
}

#[test]
fn python_sdk_over_http_2026_07_28_with_a_bearer_token() {
    run_mode("2026-07-28", "2026-07-28");
}

#[test]
fn python_sdk_over_http_auto_with_a_bearer_token() {
    run_mode("auto", "2026-07-28");
}

#[test]
fn python_sdk_over_http_legacy_initialize_with_a_bearer_token() {
    run_mode("legacy", "2025-11-25");
}
