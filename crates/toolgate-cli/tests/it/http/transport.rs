//! The transport in front of the tokens: `Host` (DNS rebinding), `Origin`, the body cap, the
//! 2026-07-28 header checks, and legacy (`initialize`) sessions, which are bound to the subject
//! that opened them: a session id is no bearer credential.

use serde_json::{Value, json};

use super::{
    HttpServer, Keys, Reply, Scratch, Signer, assert_audit_verifies, claims, helpdesk_policy,
    is_error, records_of, text_of,
};

const ALLOWED_ORIGIN: &str = "https://app.example.test";
const EXTRA_HOST: &str = "mcp.example.test";

#[test]
fn host_origin_body_cap_and_header_checks() {
    let scratch = Scratch::with_policy_text("helpdesk", &helpdesk_policy());
    let rsa = Signer::rsa("rsa-1");
    let server = HttpServer::start(
        &scratch,
        Keys::File(&[&rsa]),
        &["--allow-origin", ALLOWED_ORIGIN, "--allow-host", EXTRA_HOST],
    );
    let resource = server.resource();
    let read = rsa.sign(&claims(&resource, "user-alice", "tickets:read"));
    let write = rsa.sign(&claims(
        &resource,
        "user-alice",
        "tickets:read tickets:write",
    ));
    let get = json!({"name": "get_ticket", "arguments": {"id": "T-1001"}});
    let with_headers = |name: &str, headers: &[(&str, &str)]| {
        let reply = server.rpc_with(Some(&read), "tools/call", get.clone(), headers);
        eprintln!("{name:<40} -> {}", reply.summary());
        reply
    };

    // --- Origin ----------------------------------------------------------------------------------
    for (name, origin) in [
        (
            "Origin https://evil.test (seed: bad origin)",
            "https://evil.test",
        ),
        ("Origin null", "null"),
        (
            "allowed origin on another port",
            "https://app.example.test:8443",
        ),
        ("allowed origin over http", "http://app.example.test"),
    ] {
        let reply = with_headers(name, &[("Origin", origin)]);
        assert_eq!(reply.status, 403, "{name}: {}", reply.summary());
    }
    let allowed = with_headers("allowed Origin", &[("Origin", ALLOWED_ORIGIN)]);
    assert!(!is_error(&allowed.result("allowed origin")));
    let allowed = with_headers(
        "allowed Origin, default port spelt out",
        &[("Origin", "https://app.example.test:443")],
    );
    assert!(!is_error(&allowed.result("allowed origin with :443")));

    // --- Host (DNS rebinding) ------------------------------------------------------------------
    let port = server.port().to_string();
    let evil_with_port = format!("evil.test:{port}");
    let localhost = format!("localhost:{port}");
    let extra_with_port = format!("{EXTRA_HOST}:{port}");
    for (name, host) in [
        ("Host evil.test", "evil.test"),
        ("Host evil.test:PORT", evil_with_port.as_str()),
        ("Host 127.0.0.1.evil.test", "127.0.0.1.evil.test"),
        ("Host localhost.evil.test", "localhost.evil.test"),
    ] {
        let reply = with_headers(name, &[("Host", host)]);
        assert_eq!(reply.status, 403, "{name}: {}", reply.summary());
    }
    for (name, host) in [
        ("Host localhost:PORT", localhost.as_str()),
        ("Host --allow-host name", EXTRA_HOST),
        ("Host --allow-host name:PORT", extra_with_port.as_str()),
    ] {
        let reply = with_headers(name, &[("Host", host)]);
        assert!(!is_error(&reply.result(name)), "{name}");
    }
    // The metadata document is behind the same Host check.
    let meta = server.request(
        "GET",
        "/.well-known/oauth-protected-resource/mcp",
        &[("Host", "evil.test")],
        Vec::new(),
    );
    assert_eq!(
        meta.status,
        403,
        "metadata with a foreign Host: {}",
        meta.summary()
    );

    // --- body cap: 100 KiB by default; nothing runs ---------------------------------------------
    let huge = "x".repeat(101 * 1024);
    let reply = server.call(
        &write,
        "add_internal_note",
        json!({"id": "T-1001", "note": huge}),
    );
    eprintln!(
        "{:<40} -> {}",
        "body of 101 KiB (write token)",
        reply.summary()
    );
    assert_eq!(reply.status, 413, "{}", reply.summary());
    // Without a token the size is refused first too: nobody gets to make the server buffer it.
    let reply = server.call_opt(
        None,
        "add_internal_note",
        json!({"id": "T-1001", "note": huge}),
    );
    assert_eq!(reply.status, 413, "{}", reply.summary());
    assert!(
        records_of(&scratch, "add_internal_note").is_empty(),
        "an oversized call reached the gate"
    );
    let notes = scratch.data().join("helpdesk").join("notes.jsonl");
    assert_eq!(
        std::fs::read_to_string(&notes).unwrap_or_default(),
        "",
        "a note was written"
    );

    // --- the 2026-07-28 headers must match the body ---------------------------------------------
    let mismatch = with_headers(
        "Mcp-Name search_tickets, body get_ticket",
        &[("Mcp-Name", "search_tickets")],
    );
    assert_eq!(mismatch.status, 400, "{}", mismatch.summary());
    assert_eq!(
        mismatch.rpc_error_code(),
        Some(-32020),
        "{}",
        mismatch.summary()
    );
    let mismatch = with_headers(
        "Mcp-Method tools/list, body tools/call",
        &[("Mcp-Method", "tools/list")],
    );
    assert_eq!(mismatch.status, 400, "{}", mismatch.summary());
    assert_eq!(
        mismatch.rpc_error_code(),
        Some(-32020),
        "{}",
        mismatch.summary()
    );
    // A read tool in the header does not lend its scope to the write tool in the body.
    let smuggled = server.rpc_with(
        Some(&read),
        "tools/call",
        json!({"name": "add_internal_note", "arguments": {"id": "T-1001", "note": "smuggled"}}),
        &[("Mcp-Name", "get_ticket")],
    );
    eprintln!(
        "{:<40} -> {}",
        "Mcp-Name get_ticket, body add_internal_note",
        smuggled.summary()
    );
    assert!(
        matches!(smuggled.status, 400 | 403),
        "{}",
        smuggled.summary()
    );
    assert_eq!(
        std::fs::read_to_string(&notes).unwrap_or_default(),
        "",
        "a note was written"
    );

    server.stop();
    assert_audit_verifies(&scratch);
}

/// A legacy request on `session` (none for `initialize`) with `token`.
fn legacy(server: &HttpServer, token: Option<&str>, session: Option<&str>, body: &Value) -> Reply {
    let auth = token.map(|t| format!("Bearer {t}"));
    let mut headers = vec![
        ("Accept", "application/json, text/event-stream"),
        ("Content-Type", "application/json"),
    ];
    if let Some(session) = session {
        headers.push(("Mcp-Session-Id", session));
        headers.push(("MCP-Protocol-Version", "2025-11-25"));
    }
    if let Some(auth) = &auth {
        headers.push(("Authorization", auth));
    }
    server.request("POST", "/mcp", &headers, body.to_string().into_bytes())
}

/// A page served from the loopback address and port the server listens on may call it (the
/// server's own origin); every other Origin still needs `--allow-origin`. For 127.0.0.1,
/// `localhost` and `[::1]`, with and without an allowed origin beside it.
#[test]
fn a_loopback_server_accepts_its_own_origin_and_no_other() {
    let scratch = Scratch::with_policy_text("helpdesk", &helpdesk_policy());
    for bind in ["127.0.0.1:0", "localhost:0", "[::1]:0"] {
        let mut command = scratch.serve_command();
        command.args([
            "--http",
            bind,
            "--insecure-no-auth",
            "--allow-origin",
            ALLOWED_ORIGIN,
        ]);
        let server = HttpServer::spawn(command, &scratch.path("server.log"));
        let port = server.port();
        let other_port = port.wrapping_add(1).max(1);
        let (ours, other_loopback) = if bind.starts_with('[') {
            (format!("[::1]:{port}"), format!("http://127.0.0.1:{port}"))
        } else {
            (format!("127.0.0.1:{port}"), format!("http://[::1]:{port}"))
        };
        let ask = |origin: &str| {
            let reply = server.rpc_with(
                None,
                "tools/list",
                json!({}),
                &[("Host", ours.as_str()), ("Origin", origin)],
            );
            eprintln!("{bind:<12} Origin {origin:<32} -> {}", reply.summary());
            reply
        };
        for origin in [
            format!("http://{ours}"),
            format!("http://localhost:{port}"),
            ALLOWED_ORIGIN.to_owned(),
        ] {
            let listed = ask(&origin).result(&origin);
            assert!(listed["tools"].is_array(), "{bind}, {origin}: {listed}");
        }
        for origin in [
            format!("http://{ours}").replace(&format!(":{port}"), &format!(":{other_port}")),
            format!("http://localhost:{other_port}"),
            format!("https://{ours}"),
            format!("https://localhost:{port}"),
            format!("http://evil.test:{port}"),
            format!("http://127.0.0.1.evil.test:{port}"),
            other_loopback,
            "null".to_owned(),
        ] {
            let reply = ask(&origin);
            assert_eq!(reply.status, 403, "{bind}, {origin}: {}", reply.summary());
        }
        server.stop();
    }
}

#[test]
fn legacy_sessions_work_with_a_token_and_belong_to_its_subject() {
    let scratch = Scratch::with_policy_text("helpdesk", &helpdesk_policy());
    let rsa = Signer::rsa("rsa-1");
    let server = HttpServer::start(&scratch, Keys::File(&[&rsa]), &[]);
    let resource = server.resource();
    let alice = rsa.sign(&claims(&resource, "user-alice", "tickets:read"));
    let bob = rsa.sign(&claims(&resource, "user-bob", "tickets:read"));

    let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "toolgate-http-tests", "version": "1.0.0"},
    }});
    // Without a token there is no session either.
    let anonymous = legacy(&server, None, None, &initialize);
    assert_eq!(anonymous.status, 401, "{}", anonymous.summary());

    let opened = legacy(&server, Some(&alice), None, &initialize);
    eprintln!(
        "initialize 2025-11-25 (alice)            -> {}",
        opened.summary()
    );
    let result = opened.result("initialize");
    assert_eq!(result["protocolVersion"], "2025-11-25", "{result}");
    assert_eq!(result["serverInfo"]["name"], "toolgate", "{result}");
    let session = opened
        .header("mcp-session-id")
        .unwrap_or_else(|| panic!("no Mcp-Session-Id: {}", opened.summary()))
        .to_owned();
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let ack = legacy(&server, Some(&alice), Some(&session), &initialized);
    assert!(matches!(ack.status, 200 | 202), "{}", ack.summary());

    let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "get_ticket", "arguments": {"id": "T-1001"}}});
    let answer = legacy(&server, Some(&alice), Some(&session), &call);
    eprintln!(
        "tools/call on the session (alice)        -> {}",
        answer.summary()
    );
    let result = answer.result("legacy get_ticket");
    assert!(!is_error(&result), "{result}");
    let text = text_of(&result);
    assert!(text.contains("<untrusted-content"), "{text}");
    assert!(!text.contains('\u{202E}'), "{text:?}");

    let list = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list", "params": {}});
    let tools = legacy(&server, Some(&alice), Some(&session), &list).result("legacy tools/list");
    let names: Vec<&str> = tools["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert_eq!(names, ["search_tickets", "get_ticket"], "{tools}");

    // Bob's valid token on alice's session: answered as an unknown session would be.
    let hijack = legacy(&server, Some(&bob), Some(&session), &call);
    eprintln!(
        "alice's session with bob's token         -> {}",
        hijack.summary()
    );
    assert_eq!(hijack.status, 404, "{}", hijack.summary());
    let unknown = legacy(&server, Some(&bob), Some("no-such-session"), &call);
    eprintln!(
        "unknown session with bob's token         -> {}",
        unknown.summary()
    );
    assert_eq!(unknown.status, 404, "{}", unknown.summary());
    // The session still needs a token of its own.
    let no_token = legacy(&server, None, Some(&session), &call);
    assert_eq!(no_token.status, 401, "{}", no_token.summary());

    // Every call on the session was alice's, and only alice's reached the gate.
    let records = records_of(&scratch, "get_ticket");
    assert_eq!(records.len(), 1, "{records:#?}");
    assert_eq!(records[0]["principal"], "user-alice", "{}", records[0]);

    // Bob cannot end alice's session either (his DELETE is answered as one of an unknown id);
    // alice can.
    let auth_bob = format!("Bearer {bob}");
    let delete = |id: &str| {
        server.request(
            "DELETE",
            "/mcp",
            &[
                ("Mcp-Session-Id", id),
                ("Authorization", &auth_bob),
                ("MCP-Protocol-Version", "2025-11-25"),
            ],
            Vec::new(),
        )
    };
    let ended = delete(&session);
    let invented = delete("00000000-0000-4000-8000-000000000000");
    assert_eq!(
        (ended.status, &ended.body),
        (invented.status, &invented.body),
        "bob's DELETE of alice's session: {}",
        ended.summary()
    );
    let again = legacy(&server, Some(&alice), Some(&session), &call);
    assert_eq!(
        again.status,
        200,
        "alice's session survived bob's DELETE: {}",
        again.summary()
    );
    let auth_alice = format!("Bearer {alice}");
    let ended = server.request(
        "DELETE",
        "/mcp",
        &[
            ("Mcp-Session-Id", &session),
            ("Authorization", &auth_alice),
            ("MCP-Protocol-Version", "2025-11-25"),
        ],
        Vec::new(),
    );
    // 204: the session is gone and there is nothing to say; afterwards it is an unknown one.
    assert_eq!(ended.status, 204, "{}", ended.summary());
    assert!(ended.body.is_empty(), "{}", ended.summary());
    let after = legacy(&server, Some(&alice), Some(&session), &call);
    let unknown = legacy(&server, Some(&alice), Some("no-such-session"), &call);
    assert_eq!(
        after.status,
        404,
        "the ended session answered: {}",
        after.summary()
    );
    assert_eq!(
        (after.status, &after.body),
        (unknown.status, &unknown.body),
        "an ended session is answered as an unknown one"
    );

    server.stop();
    assert_audit_verifies(&scratch);
}

/// A caller must not learn whether a session id it holds is someone else's live session or a
/// made-up one: both get rmcp's answer for an unknown session, byte for byte.
#[test]
fn someone_elses_session_is_answered_byte_for_byte_as_an_unknown_one() {
    let scratch = Scratch::with_policy_text("helpdesk", &helpdesk_policy());
    let rsa = Signer::rsa("rsa-1");
    let server = HttpServer::start(&scratch, Keys::File(&[&rsa]), &[]);
    let resource = server.resource();
    let alice = rsa.sign(&claims(&resource, "user-alice", "tickets:read"));
    let bob = rsa.sign(&claims(&resource, "user-bob", "tickets:read"));
    let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "toolgate-http-tests", "version": "1.0.0"},
    }});
    let opened = legacy(&server, Some(&alice), None, &initialize);
    let session = opened
        .header("mcp-session-id")
        .unwrap_or_else(|| panic!("no Mcp-Session-Id: {}", opened.summary()))
        .to_owned();
    let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}});
    let hijack = legacy(&server, Some(&bob), Some(&session), &call);
    let unknown = legacy(
        &server,
        Some(&bob),
        Some("00000000-0000-4000-8000-000000000000"),
        &call,
    );
    assert_eq!(
        (
            hijack.status,
            hijack.header("content-type"),
            hijack.body.as_str()
        ),
        (
            unknown.status,
            unknown.header("content-type"),
            unknown.body.as_str()
        ),
        "someone else's session vs an unknown one"
    );
    server.stop();
}

/// What a raw connection gets back within `within` after sending `sent`: the bytes the server
/// wrote before it closed the connection (or before `within` ran out).
fn raw_exchange(server: &HttpServer, sent: &[u8], within: std::time::Duration) -> (String, bool) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(server.addr).expect("connect");
    stream.write_all(sent).expect("send");
    stream.set_read_timeout(Some(within)).expect("timeout");
    let mut answer = Vec::new();
    let mut buffer = [0_u8; 4096];
    let closed = loop {
        match stream.read(&mut buffer) {
            Ok(0) => break true,
            Ok(n) => answer.extend_from_slice(&buffer[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break true,
            Err(_) => break false,
        }
    };
    (String::from_utf8_lossy(&answer).into_owned(), closed)
}

#[test]
fn slow_clients_and_oversized_headers_are_cut_off() {
    let scratch = Scratch::with_policy_text("helpdesk", &helpdesk_policy());
    let rsa = Signer::rsa("rsa-1");
    let server = HttpServer::start(&scratch, Keys::File(&[&rsa]), &["--read-timeout", "1"]);
    let wait = std::time::Duration::from_secs(4);

    // Headers that never end (slowloris): the connection is closed after the read timeout.
    let started = std::time::Instant::now();
    let (_, closed) = raw_exchange(&server, b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n", wait);
    assert!(
        closed,
        "unfinished headers kept the connection open for {wait:?}"
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );

    // A body that never arrives: 408 after the read timeout, and nothing ran.
    let token = rsa.sign(&claims(&server.resource(), "user-alice", "tickets:write"));
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
         Content-Length: 500\r\n\r\n{{\"jsonrpc\":\"2.0\""
    );
    let (answer, _) = raw_exchange(&server, head.as_bytes(), wait);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");

    // 70 KiB of headers: refused with 431 before the token is looked at.
    let huge = format!(
        "GET /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Filler: {}\r\n\r\n",
        "a".repeat(70 * 1024)
    );
    let (answer, _) = raw_exchange(&server, huge.as_bytes(), wait);
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");
    server.stop();
    assert!(
        scratch.records().is_empty(),
        "nothing was decided, nothing recorded"
    );
}

/// Bodies that are not one JSON-RPC message with a single reading get 400 and a JSON-RPC error
/// (415 stays for a wrong Content-Type), whatever token comes with them; nothing runs, and the
/// server goes on serving. The duplicate-name rows are the ones a scope check and a dispatcher
/// could read differently: the front door and rmcp must never disagree about what was asked.
#[test]
fn bodies_without_a_single_reading_get_400_and_nothing_runs() {
    let scratch = Scratch::with_policy_text("helpdesk", &helpdesk_policy());
    let rsa = Signer::rsa("rsa-1");
    let server = HttpServer::start(&scratch, Keys::File(&[&rsa]), &[]);
    let resource = server.resource();
    let read = rsa.sign(&claims(&resource, "user-alice", "tickets:read"));
    let write = rsa.sign(&claims(
        &resource,
        "user-alice",
        "tickets:read tickets:write",
    ));
    let meta = r#""_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientInfo":{"name":"t","version":"1"},"io.modelcontextprotocol/clientCapabilities":{}}"#;
    let note = r#""arguments":{"id":"T-1001","note":"smuggled"}"#;
    let call = |params: &str| {
        format!(r#"{{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{{{params}}}}}"#)
            .into_bytes()
    };
    let deep = format!(
        r#"{{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{{"name":"get_ticket","arguments":{{"id":"T-1001","x":{}{}}},{meta}}}}}"#,
        "[".repeat(62),
        "]".repeat(62)
    );
    let rows: Vec<(&str, &str, Vec<u8>, i64)> = vec![
        ("not JSON", &write, b"{\"jsonrpc\": \"2.0\", \"id\"".to_vec(), -32700),
        (
            "not UTF-8",
            &write,
            [&call(&format!(r#""name":"get_ticket",{meta},"x":""#))[..], b"\xff\"}}"].concat(),
            -32700,
        ),
        ("nested 65 deep", &write, deep.into_bytes(), -32700),
        (
            "a batch",
            &write,
            [b"[".as_slice(), &call(&format!(r#""name":"get_ticket",{meta}"#)), b"]"].concat(),
            -32600,
        ),
        (
            "not JSON-RPC",
            &write,
            br#"{"method":"tools/call","params":{"name":"get_ticket"}}"#.to_vec(),
            -32600,
        ),
        (
            "\"method\" twice",
            &write,
            format!(
                r#"{{"jsonrpc":"2.0","id":7,"method":"tools/list","method":"tools/call","params":{{"name":"add_internal_note",{note},{meta}}}}}"#
            )
            .into_bytes(),
            -32600,
        ),
        (
            "the protocol version twice in _meta",
            &write,
            call(&format!(
                r#""name":"add_internal_note",{note},"_meta":{{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/protocolVersion":"2025-11-25","io.modelcontextprotocol/clientInfo":{{"name":"t","version":"1"}},"io.modelcontextprotocol/clientCapabilities":{{}}}}"#
            )),
            -32600,
        ),
        (
            "\"name\" twice in params (read token)",
            &read,
            call(&format!(r#""name":"get_ticket","name":"add_internal_note",{note},{meta}"#)),
            -32600,
        ),
        (
            "\"name\" twice in params (write token)",
            &write,
            call(&format!(r#""name":"add_internal_note","name":"get_ticket",{note},{meta}"#)),
            -32600,
        ),
    ];
    for (name, token, body, code) in rows {
        let auth = format!("Bearer {token}");
        let reply = server.request(
            "POST",
            "/mcp",
            &[
                ("MCP-Protocol-Version", "2026-07-28"),
                ("Mcp-Method", "tools/call"),
                ("Mcp-Name", "add_internal_note"),
                ("Accept", "application/json, text/event-stream"),
                ("Content-Type", "application/json"),
                ("Authorization", &auth),
            ],
            body,
        );
        eprintln!("{name:<40} -> {}", reply.summary());
        assert_eq!(reply.status, 400, "{name}: {}", reply.summary());
        let answer = reply.json();
        assert_eq!(answer["jsonrpc"], "2.0", "{name}: {answer}");
        assert_eq!(answer["id"], Value::Null, "{name}: {answer}");
        assert_eq!(reply.rpc_error_code(), Some(code), "{name}: {answer}");
    }
    // A wrong Content-Type is still 415.
    let auth = format!("Bearer {write}");
    let reply = server.request(
        "POST",
        "/mcp",
        &[
            ("Accept", "application/json, text/event-stream"),
            ("Content-Type", "text/plain"),
            ("Authorization", &auth),
        ],
        call(&format!(r#""name":"add_internal_note",{note},{meta}"#)),
    );
    assert_eq!(reply.status, 415, "{}", reply.summary());

    // Nothing ran, nothing reached the gate, and the server still answers.
    let notes = scratch.data().join("helpdesk").join("notes.jsonl");
    assert_eq!(std::fs::read_to_string(&notes).unwrap_or_default(), "");
    assert!(
        scratch.records().is_empty(),
        "a refused body reached the gate: {:#?}",
        scratch.records()
    );
    let result = server.call_result(&read, "get_ticket", json!({"id": "T-1001"}));
    assert!(!is_error(&result), "{result}");
    server.stop();
    assert_audit_verifies(&scratch);
}

#[test]
fn a_second_host_or_origin_header_is_refused_whatever_their_order() {
    let scratch = Scratch::with_policy_text("helpdesk", &helpdesk_policy());
    let rsa = Signer::rsa("rsa-1");
    let server = HttpServer::start(
        &scratch,
        Keys::File(&[&rsa]),
        &["--allow-origin", ALLOWED_ORIGIN],
    );
    let token = rsa.sign(&claims(&server.resource(), "user-alice", "tickets:read"));
    let ours = format!("127.0.0.1:{}", server.port());
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {}}}})
    .to_string();
    let exchange = |headers: &[(&str, &str)]| {
        let mut head = String::from("POST /mcp HTTP/1.1\r\n");
        for (name, value) in headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str(&format!(
            "Authorization: Bearer {token}\r\nContent-Type: application/json\r\n\
             Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2026-07-28\r\n\
             Mcp-Method: tools/list\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        ));
        let (answer, _) =
            raw_exchange(&server, head.as_bytes(), std::time::Duration::from_secs(10));
        answer
    };
    // The baseline: one of each gets in.
    let answer = exchange(&[("Host", &ours), ("Origin", ALLOWED_ORIGIN)]);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let rows: &[(&str, &[(&str, &str)])] = &[
        (
            "Host twice, ours first",
            &[("Host", &ours), ("Host", "evil.test")],
        ),
        (
            "Host twice, ours last",
            &[("Host", "evil.test"), ("Host", &ours)],
        ),
        ("Host twice, both ours", &[("Host", &ours), ("Host", &ours)]),
        (
            "Origin twice, allowed first",
            &[
                ("Host", &ours),
                ("Origin", ALLOWED_ORIGIN),
                ("Origin", "https://evil.test"),
            ],
        ),
        (
            "Origin twice, allowed last",
            &[
                ("Host", &ours),
                ("Origin", "https://evil.test"),
                ("Origin", ALLOWED_ORIGIN),
            ],
        ),
    ];
    for (name, headers) in rows {
        let answer = exchange(headers);
        eprintln!(
            "{name:<40} -> {}",
            answer.lines().next().unwrap_or_default()
        );
        assert!(answer.starts_with("HTTP/1.1 400"), "{name}: {answer}");
    }
    server.stop();
    assert!(scratch.records().is_empty(), "tools/list records nothing");
}

/// A load balancer's probes, on a real socket: no token needed, every store of the data
/// directory named and answering, the policy's hash shown, the Host check still in front.
#[test]
fn health_and_readiness_probes_answer_without_a_token() {
    let scratch = Scratch::with_policy_text("helpdesk", &helpdesk_policy());
    let rsa = Signer::rsa("rsa-1");
    let server = HttpServer::start(&scratch, Keys::File(&[&rsa]), &[]);

    let alive = server.request("GET", "/healthz", &[], Vec::new());
    assert_eq!(
        (alive.status, alive.body.as_str()),
        (200, r#"{"status":"ok"}"#)
    );
    let ready = server.request("GET", "/readyz", &[], Vec::new());
    assert_eq!(ready.status, 200, "{}", ready.body);
    let ready: Value = serde_json::from_str(&ready.body).expect("json");
    assert_eq!(ready["ready"], true, "{ready}");
    for check in ["policy", "audit", "approvals", "state", "idempotency"] {
        assert_eq!(ready["checks"][check]["ok"], true, "{check}: {ready}");
    }
    let detail = ready["checks"]["policy"]["detail"]
        .as_str()
        .unwrap_or_default();
    assert!(
        detail.starts_with("sha256 ") && detail.len() == 7 + 64,
        "{detail}"
    );

    let rebound = server.request("GET", "/readyz", &[("host", "evil.example")], Vec::new());
    assert_ne!(rebound.status, 200, "{}", rebound.body);
    server.stop();
}
