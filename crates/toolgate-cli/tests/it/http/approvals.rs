//! Approvals and budgets are about the token's subject on HTTP: the orders toolset of seed 003
//! served with OAuth, two users with `payments:write`. The requester of an approval is the token's
//! `sub` (so that user cannot approve it), another user's identical call does not ride on it, the
//! refund is made "by" that subject, and the medium budget is counted per subject.

use std::process::Output;

use serde_json::{Value, json};

use super::{
    HttpServer, Keys, Scratch, Signer, assert_audit_verifies, claims, is_error, records_of,
};
use crate::policy_with;

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `approvals show ID --json`.
fn show(scratch: &Scratch, id: &str) -> Value {
    let out = scratch.cli(&["approvals", "show", id, "--json"]);
    assert!(out.status.success(), "show {id}: {}", stderr(&out));
    serde_json::from_slice(&out.stdout).expect("show --json is JSON")
}

/// The approval id of a `pending_approval` result.
fn pending(result: &Value) -> String {
    assert!(
        is_error(result),
        "a pending answer is not a success: {result}"
    );
    assert_eq!(
        result["structuredContent"]["status"], "pending_approval",
        "{result}"
    );
    result["structuredContent"]["approval_id"]
        .as_str()
        .unwrap_or_else(|| panic!("no approval_id: {result}"))
        .to_owned()
}

#[test]
fn approvals_and_budgets_belong_to_the_token_subject() {
    // A held call waits 1 s instead of the demo's 10 s.
    let text = policy_with(
        "orders.toml",
        &[("approval_wait", "\"1s\""), ("approval_ttl", "\"60s\"")],
    );
    let scratch = Scratch::with_policy_text("orders", &text);
    let rsa = Signer::rsa("rsa-1");
    let server = HttpServer::start(&scratch, Keys::File(&[&rsa]), &[]);
    let resource = server.resource();
    let alice = rsa.sign(&claims(&resource, "user-alice", "payments:write"));
    let bob = rsa.sign(&claims(&resource, "user-bob", "payments:write"));
    let large = json!({"order_id": "ord_1001", "amount": 30});

    // A large refund waits for a person; the request is alice's.
    let held = server.call_result(&alice, "refund", large.clone());
    let approval = pending(&held);
    let row = show(&scratch, &approval);
    eprintln!(
        "{:<40} -> pending {approval}, requester {}",
        "alice: refund 30 (high)", row["requester"]
    );
    assert_eq!(row["requester"], "user-alice", "{row}");
    // Alice cannot approve her own request, whatever terminal she uses.
    let out = scratch.cli(&["approvals", "approve", &approval, "--as", "user-alice"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let out = scratch.cli(&["approvals", "approve", &approval, "--as", "human:ops"]);
    assert!(out.status.success(), "approve: {}", stderr(&out));

    // Bob's identical call is his own request, not a ride on alice's approval.
    let bobs = server.call_result(&bob, "refund", large.clone());
    let bobs_approval = pending(&bobs);
    eprintln!("{:<40} -> pending {bobs_approval}", "bob: the same refund");
    assert_ne!(bobs_approval, approval);
    assert_eq!(show(&scratch, &bobs_approval)["requester"], "user-bob");
    assert!(
        scratch.refunds().is_empty(),
        "bob's call ran on alice's approval"
    );

    // Alice's call now runs, once, by alice.
    let done = server.call_result(&alice, "refund", large);
    assert!(!is_error(&done), "{done}");
    let made = scratch.refunds();
    assert_eq!(made.len(), 1, "{made:?}");
    assert_eq!(made[0]["by"], "user-alice", "{:?}", made[0]);

    // The medium budget (5 per principal per hour) is counted per subject.
    // Different amounts: the same arguments again would be an idempotent replay, not a call.
    let small = |amount: f64| json!({"order_id": "ord_1002", "amount": amount});
    for amount in [1.0, 1.25, 1.5, 1.75, 2.0] {
        let result = server.call_result(&alice, "refund", small(amount));
        assert!(
            !is_error(&result),
            "medium refund {amount} within the budget: {result}"
        );
    }
    let over = server.call_result(&alice, "refund", small(0.75));
    eprintln!(
        "{:<40} -> {}",
        "alice: 6th medium refund", over["structuredContent"]
    );
    pending(&over);
    let bob_small = server.call_result(&bob, "refund", small(0.5));
    eprintln!(
        "{:<40} -> isError {}",
        "bob: 1st medium refund", bob_small["isError"]
    );
    assert!(
        !is_error(&bob_small),
        "bob's budget is his own: {bob_small}"
    );
    assert_eq!(scratch.refunds().len(), 1 + 5 + 1);

    // Every call record names its subject (the approvals CLI writes its own `approvals/resolve`).
    let calls = records_of(&scratch, "refund");
    let calls: Vec<&Value> = calls
        .iter()
        .filter(|r| r["method"] == "tools/call")
        .collect();
    assert!(calls.len() >= 10, "{calls:#?}");
    for record in calls {
        assert!(
            record["principal"] == "user-alice" || record["principal"] == "user-bob",
            "{record}"
        );
        assert_eq!(record["client_id"], "test-client", "{record}");
    }
    server.stop();
    assert_audit_verifies(&scratch);
}

/// The first line of the server's log that holds `needle`.
fn log_line(server: &HttpServer, needle: &str) -> Option<String> {
    std::fs::read_to_string(&server.log)
        .ok()?
        .lines()
        .find(|line| line.contains(needle))
        .map(str::to_owned)
}

#[test]
fn the_console_beside_the_mcp_endpoint_decides_the_token_subjects_request() {
    let text = policy_with(
        "orders.toml",
        &[("approval_wait", "\"1s\""), ("approval_ttl", "\"60s\"")],
    );
    let scratch = Scratch::with_policy_text("orders", &text);
    let rsa = Signer::rsa("rsa-1");
    let server = HttpServer::start(&scratch, Keys::File(&[&rsa]), &["--console"]);
    let alice = rsa.sign(&claims(&server.resource(), "user-alice", "payments:write"));
    let approval = pending(&server.call_result(
        &alice,
        "refund",
        json!({"order_id": "ord_1001", "amount": 30}),
    ));

    // The link the server printed signs a browser in; without it, the console says nothing.
    let link = log_line(&server, "/console/login?token=").expect("a login link on stderr");
    let link = link.trim().to_owned();
    let http = super::Http::without_redirects();
    let anonymous = http
        .send("GET", &server.url("/console"), &[], Vec::new())
        .unwrap();
    assert_eq!(anonymous.status, 303);
    assert!(!anonymous.body.contains(&approval));
    let signed_in = http.send("GET", &link, &[], Vec::new()).unwrap();
    assert_eq!(signed_in.status, 303, "{}", signed_in.body);
    assert_eq!(signed_in.header("location"), Some("/console"));
    let cookie = signed_in
        .header("set-cookie")
        .and_then(|c| c.split(';').next())
        .expect("a session cookie")
        .to_owned();
    assert!(
        signed_in
            .header("set-cookie")
            .unwrap()
            .contains("Path=/console")
    );
    let page = http
        .send(
            "GET",
            &server.url("/console"),
            &[("cookie", &cookie)],
            Vec::new(),
        )
        .unwrap();
    assert_eq!(page.status, 200);
    assert!(
        page.body.contains(&approval) && page.body.contains("user-alice"),
        "{}",
        page.body
    );

    // Approved in the console, alice's call runs when she asks again, once.
    let detail = server.url(&format!("/console/approvals/{approval}"));
    let form = http
        .send("GET", &detail, &[("cookie", &cookie)], Vec::new())
        .unwrap();
    let csrf = Scratch::csrf_of(&form.body);
    let origin = server.url("");
    let decided = http
        .send(
            "POST",
            &detail,
            &[
                ("cookie", &cookie),
                ("origin", &origin),
                ("content-type", "application/x-www-form-urlencoded"),
            ],
            format!("verdict=approve&reason=checked&csrf={csrf}").into_bytes(),
        )
        .unwrap();
    assert_eq!(decided.status, 200, "{}", decided.body);
    assert_eq!(show(&scratch, &approval)["status"], "approved");
    let ran = server.call_result(
        &alice,
        "refund",
        json!({"order_id": "ord_1001", "amount": 30}),
    );
    assert!(!is_error(&ran), "{ran}");
    assert_eq!(scratch.refunds().len(), 1);
    // The MCP endpoint's front door is untouched: no token, no call.
    assert_eq!(
        server
            .call_opt(None, "lookup_order", json!({"order_id": "ord_1001"}))
            .status,
        401
    );
    assert_audit_verifies(&scratch);
}
