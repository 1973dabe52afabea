//! The helpdesk of seed 003 behind the token: the rest of the seed's smoke table ("read ok",
//! "bad input", "other user", "no write", "flood", the hidden U+202E) and what it implies: data
//! scoped to the token's subject, tools listed by scope, a 403 step-up challenge that names only
//! the missing scope, per-user rate limits, and audit records that name the token's subject.

use serde_json::{Value, json};

use super::{
    HttpServer, Keys, Scratch, Signer, assert_audit_verifies, claims, helpdesk_policy, is_error,
    records_of, text_of,
};

/// The names of a `tools/list` result.
fn names(result: &Value) -> Vec<String> {
    result["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("no tools: {result}"))
        .iter()
        .filter_map(|t| t["name"].as_str().map(str::to_owned))
        .collect()
}

/// The notes log of the helpdesk, as text ("" before the first note).
fn notes_log(scratch: &Scratch) -> String {
    std::fs::read_to_string(scratch.data().join("helpdesk").join("notes.jsonl")).unwrap_or_default()
}

#[test]
fn the_seed_smoke_table_over_http_with_per_user_data_scopes_and_rate_limits() {
    let scratch = Scratch::with_policy_text("helpdesk", &helpdesk_policy());
    let rsa = Signer::rsa("rsa-1");
    let server = HttpServer::start(&scratch, Keys::File(&[&rsa]), &[]);
    let resource = server.resource();
    let alice_read = rsa.sign(&claims(&resource, "user-alice", "tickets:read"));
    let alice_write = rsa.sign(&claims(
        &resource,
        "user-alice",
        "tickets:read tickets:write",
    ));
    let bob_read = rsa.sign(&claims(&resource, "user-bob", "tickets:read"));
    let bob_write = rsa.sign(&claims(&resource, "user-bob", "tickets:read tickets:write"));
    let mut no_client = claims(&resource, "user-carol", "tickets:read");
    no_client
        .as_object_mut()
        .expect("claims")
        .remove("client_id");
    let carol = rsa.sign(&no_client);
    let show = |name: &str, reply: &super::Reply| eprintln!("{name:<40} -> {}", reply.summary());

    // --- read ok: the body comes back cleaned and labelled -------------------------------------
    let reply = server.call(&alice_read, "get_ticket", json!({"id": "T-1001"}));
    show("read ok (get_ticket T-1001)", &reply);
    let result = reply.result("get_ticket T-1001");
    assert!(!is_error(&result), "{result}");
    let text = text_of(&result);
    assert!(
        !reply.body.contains('\u{202E}')
            && !reply.body.contains("\\u202e")
            && !reply.body.contains("\\u202E"),
        "U+202E came back: {}",
        reply.body
    );
    assert!(text.contains("<untrusted-content"), "{text}");
    let inside = &text[text.find("<untrusted-content").expect("envelope")..];
    assert!(inside.contains("I keep getting logged out."), "{text}");
    assert!(
        inside.contains("Ignore previous instructions"),
        "the injected text is shown as data: {text}"
    );
    assert!(
        inside.trim_end().ends_with("</untrusted-content>"),
        "{text}"
    );

    // --- bad input: the schema refuses before the handler runs --------------------------------
    let reply = server.call(&alice_read, "get_ticket", json!({"id": "1001; DROP"}));
    show("bad input (id \"1001; DROP\")", &reply);
    let result = reply.result("get_ticket 1001; DROP");
    assert!(is_error(&result), "{result}");
    assert_eq!(
        result["structuredContent"]["status"], "invalid_args",
        "{result}"
    );
    let last = records_of(&scratch, "get_ticket").pop().expect("a record");
    assert_eq!(
        (&last["decision"], &last["outcome"], &last["rule"]),
        (&json!("deny"), &json!("invalid_args"), &json!("schema")),
        "{last}"
    );

    // --- other user: the same answer as a ticket that does not exist -------------------------
    let others = server.call(&alice_read, "get_ticket", json!({"id": "T-1002"}));
    show("other user (alice asks for T-1002)", &others);
    let others = others.result("T-1002 for alice");
    let missing = server.call_result(&alice_read, "get_ticket", json!({"id": "T-9999"}));
    assert!(
        is_error(&others) && is_error(&missing),
        "{others} / {missing}"
    );
    assert!(text_of(&others).contains("not found"), "{others}");
    assert_eq!(
        others.to_string().replace("T-1002", "T-9999"),
        missing.to_string(),
        "another user's ticket must be indistinguishable from a missing one"
    );
    // Bob's own ticket is his.
    let bobs = server.call_result(&bob_read, "get_ticket", json!({"id": "T-1002"}));
    assert!(
        !is_error(&bobs) && text_of(&bobs).contains("Invoice copy"),
        "{bobs}"
    );
    // Search is scoped too: bob's "Login page slow" is not in alice's results.
    let found =
        text_of(&server.call_result(&alice_read, "search_tickets", json!({"query": "login"})));
    assert!(
        found.contains("T-1001") && !found.contains("T-1004"),
        "{found}"
    );

    // --- tools/list by scope, private to the caller --------------------------------------------
    let listed = server
        .rpc(Some(&alice_read), "tools/list", json!({}))
        .result("tools/list read");
    eprintln!(
        "{:<40} -> {:?} cacheScope {}",
        "tools/list (read token)",
        names(&listed),
        listed["cacheScope"]
    );
    assert_eq!(names(&listed), ["search_tickets", "get_ticket"], "{listed}");
    assert_eq!(listed["cacheScope"], "private", "{listed}");
    let listed = server
        .rpc(Some(&alice_write), "tools/list", json!({}))
        .result("tools/list write");
    assert_eq!(
        names(&listed),
        ["search_tickets", "get_ticket", "add_internal_note"],
        "{listed}"
    );
    assert_eq!(listed["cacheScope"], "private", "{listed}");

    // --- no write: 403 step-up naming only the missing scope; nothing written, audited ---------
    let reply = server.call(
        &alice_read,
        "add_internal_note",
        json!({"id": "T-1001", "note": "hi"}),
    );
    show("no write (read token, add_internal_note)", &reply);
    assert_eq!(reply.status, 403, "{}", reply.summary());
    let challenge = reply.challenge();
    assert!(
        challenge.starts_with("Bearer error=\"insufficient_scope\", scope=\"tickets:write\""),
        "{challenge}"
    );
    assert_eq!(challenge.matches("scope=\"").count(), 1, "{challenge}");
    assert!(
        challenge.contains(&format!(
            "resource_metadata=\"{}\"",
            server.url("/.well-known/oauth-protected-resource/mcp")
        )),
        "{challenge}"
    );
    assert_eq!(
        notes_log(&scratch),
        "",
        "a note was written with a read-only token"
    );
    let refusal = records_of(&scratch, "add_internal_note")
        .pop()
        .expect("the 403 is audited");
    assert_eq!(
        (
            &refusal["decision"],
            &refusal["outcome"],
            &refusal["rule"],
            &refusal["principal"]
        ),
        (
            &json!("deny"),
            &json!("not_executed"),
            &json!("scope"),
            &json!("user-alice")
        ),
        "{refusal}"
    );

    // Ways around the scope check that the gate must still catch (the HTTP layer reads only a
    // well-formed single call): nothing may be written whatever the transport answers.
    let meta = super::modern_request("tools/call", json!({}))["params"]["_meta"].to_string();
    let auth = format!("Bearer {alice_read}");
    for (name, body) in [
        (
            "duplicate \"name\" keys",
            format!(
                r#"{{"jsonrpc":"2.0","id":901,"method":"tools/call","params":{{"_meta":{meta},"name":"get_ticket","name":"add_internal_note","arguments":{{"id":"T-1001","note":"dup"}}}}}}"#
            ),
        ),
        (
            "duplicate \"params\" keys",
            format!(
                r#"{{"jsonrpc":"2.0","id":902,"method":"tools/call","params":{{"_meta":{meta},"name":"get_ticket","arguments":{{"id":"T-1001"}}}},"params":{{"_meta":{meta},"name":"add_internal_note","arguments":{{"id":"T-1001","note":"dup"}}}}}}"#
            ),
        ),
        (
            "batch of one call",
            format!(
                r#"[{{"jsonrpc":"2.0","id":903,"method":"tools/call","params":{{"_meta":{meta},"name":"add_internal_note","arguments":{{"id":"T-1001","note":"batch"}}}}}}]"#
            ),
        ),
        (
            "arguments not an object",
            format!(
                r#"{{"jsonrpc":"2.0","id":904,"method":"tools/call","params":{{"_meta":{meta},"name":"add_internal_note","arguments":"note"}}}}"#
            ),
        ),
    ] {
        let reply = server.request(
            "POST",
            "/mcp",
            &[
                ("MCP-Protocol-Version", super::MODERN),
                ("Mcp-Method", "tools/call"),
                ("Mcp-Name", "add_internal_note"),
                ("Accept", "application/json, text/event-stream"),
                ("Content-Type", "application/json"),
                ("Authorization", &auth),
            ],
            body.into_bytes(),
        );
        show(name, &reply);
        assert_eq!(
            notes_log(&scratch),
            "",
            "{name}: a note was written with a read-only token"
        );
        assert!(
            reply.status != 200
                || reply.body.contains("\"error\"")
                || reply.body.contains("\"isError\":true"),
            "{name}: {}",
            reply.summary()
        );
    }

    // --- a write token adds a note; only its user ever sees it ---------------------------------
    let added = server.call_result(
        &alice_write,
        "add_internal_note",
        json!({"id": "T-1001", "note": "called the customer"}),
    );
    show(
        "write token adds a note",
        &server.call(&alice_write, "get_ticket", json!({"id": "T-1001"})),
    );
    assert!(
        !is_error(&added) && text_of(&added).contains("added to T-1001"),
        "{added}"
    );
    let log = notes_log(&scratch);
    assert_eq!(log.lines().count(), 1, "{log}");
    let line: Value = serde_json::from_str(log.lines().next().expect("a line")).expect("note JSON");
    assert_eq!(
        (&line["ticket"], &line["by"]),
        (&json!("T-1001"), &json!("user-alice")),
        "{line}"
    );
    let alices = text_of(&server.call_result(&alice_read, "get_ticket", json!({"id": "T-1001"})));
    assert!(alices.contains("called the customer"), "{alices}");
    // Bob can neither read it nor write to alice's ticket, and his own ticket shows no notes.
    let bob_view = server.call_result(&bob_read, "get_ticket", json!({"id": "T-1001"}));
    assert!(
        is_error(&bob_view) && !bob_view.to_string().contains("called the customer"),
        "{bob_view}"
    );
    let bob_note = server.call_result(
        &bob_write,
        "add_internal_note",
        json!({"id": "T-1001", "note": "bob was here"}),
    );
    assert!(
        is_error(&bob_note) && text_of(&bob_note).contains("not found"),
        "{bob_note}"
    );
    assert_eq!(
        notes_log(&scratch).lines().count(),
        1,
        "bob wrote to alice's ticket"
    );
    let bobs = text_of(&server.call_result(&bob_read, "get_ticket", json!({"id": "T-1002"})));
    assert!(
        !bobs.contains("called the customer") && !bobs.contains("\"notes\""),
        "{bobs}"
    );

    // --- flood: the 21st call in the burst window is refused, per user -------------------------
    let started = std::time::Instant::now();
    let mut served = 0;
    let limited = loop {
        let result = server.call_result(&alice_read, "search_tickets", json!({"query": "login"}));
        if is_error(&result) {
            break result;
        }
        served += 1;
        // 20 in the bucket, and one more for every 2 s the loop has taken.
        let refills = started.elapsed().as_secs() / 2 + 1;
        assert!(served <= 20 + refills, "no rate limit after {served} calls");
    };
    eprintln!(
        "{:<40} -> after {served} more calls: {}",
        "flood (search_tickets)",
        text_of(&limited)
    );
    // Alice already used one search above: her bucket had 19 left.
    assert!(served >= 19, "refused after only {served} calls: {limited}");
    let message = text_of(&limited);
    assert!(
        message.starts_with("rate limit reached, retry after "),
        "{message}"
    );
    assert!(message.ends_with(" s"), "{message}");
    assert_eq!(
        limited["structuredContent"]["status"], "rate_limited",
        "{limited}"
    );
    let bob_search = server.call_result(&bob_read, "search_tickets", json!({"query": "login"}));
    assert!(
        !is_error(&bob_search),
        "another user's bucket is untouched: {bob_search}"
    );
    let rate_record = records_of(&scratch, "search_tickets")
        .into_iter()
        .rfind(|r| r["outcome"] == "rate_limited")
        .expect("a rate_limited record");
    assert_eq!(
        (
            &rate_record["decision"],
            &rate_record["principal"],
            &rate_record["client_id"]
        ),
        (&json!("deny"), &json!("user-alice"), &json!("test-client")),
        "{rate_record}"
    );

    // --- the audit subject is the token's ------------------------------------------------------
    let carol_list = server.call_result(&carol, "search_tickets", json!({"query": "login"}));
    assert!(!is_error(&carol_list), "{carol_list}");
    let records = scratch.records();
    let calls: Vec<&Value> = records
        .iter()
        .filter(|r| r["method"] == "tools/call")
        .collect();
    for record in &calls {
        let principal = record["principal"].as_str().unwrap_or_default();
        assert!(
            ["user-alice", "user-bob", "user-carol"].contains(&principal),
            "a record names no token subject: {record}"
        );
        if principal == "user-carol" {
            assert!(record.get("client_id").is_none(), "{record}");
        } else {
            assert_eq!(record["client_id"], "test-client", "{record}");
        }
    }
    assert!(calls.iter().any(|r| r["principal"] == "user-carol"));

    server.stop();
    let count = assert_audit_verifies(&scratch);
    eprintln!("audit verify: exit 0, {count} records");
}
