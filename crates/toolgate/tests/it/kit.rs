//! The notes example (`examples/notes.rs`, seed 004's server on the kit) against seed 004's own
//! console transcript: `echo "$REQ" | server` refuses `delete_note` with its dry run, and deletes
//! once `NOTES_ALLOW_GATED=1` is set.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{Value, json};

/// The request of the transcript, byte for byte.
const REQ: &str = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"delete_note","arguments":{"id":"groceries"}}}"#;

/// The example binary, which `cargo test` builds beside this test binary.
fn example() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let profile = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/PROFILE/deps");
    let path = profile.join("examples").join("notes");
    assert!(
        path.exists(),
        "{} is missing: `cargo test -p toolgate` builds the examples",
        path.display()
    );
    path
}

/// `echo "$REQ" | [env] notes 2>/dev/null`: the one line of stdout, parsed.
fn echo_into(notes: &Path, data: &Path, gate: Option<&str>) -> Value {
    let mut command = Command::new(example());
    command
        .env("NOTES_DIR", notes)
        .env("NOTES_DATA", data)
        .env_remove("NOTES_ALLOW_GATED")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    if let Some(value) = gate {
        command.env("NOTES_ALLOW_GATED", value);
    }
    let mut child = command.spawn().expect("spawn the notes example");
    let mut stdin = child.stdin.take().expect("stdin");
    writeln!(stdin, "{REQ}").expect("write the request");
    drop(stdin);
    let output = child.wait_with_output().expect("the example exits");
    assert!(output.status.success(), "{:?}", output.status);
    let stdout = String::from_utf8(output.stdout).expect("UTF-8");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines.len(),
        1,
        "one answer, nothing else on stdout: {stdout}"
    );
    serde_json::from_str(lines[0]).expect("a JSON-RPC message")
}

fn note_files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("notes dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn the_seed_transcript_refuses_delete_note_with_its_dry_run_then_deletes_when_enabled() {
    let notes = tempfile::tempdir().expect("notes dir");
    let data = tempfile::tempdir().expect("data dir");
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/data/notes");
    for name in ["groceries.md", "ideas.md", "trip.md"] {
        std::fs::copy(shipped.join(name), notes.path().join(name)).expect("copy a note");
    }
    let groceries = notes.path().join("groceries.md");
    let before = std::fs::read(&groceries).expect("groceries");

    // $ echo "$REQ" | node examples/server.mjs 2>/dev/null | jq -r '.result.content[0].text'
    let refused = echo_into(notes.path(), data.path(), None);
    assert_eq!(refused["id"], 1, "{refused}");
    let text = refused["result"]["content"][0]["text"]
        .as_str()
        .expect("a text block");
    let head = "REFUSED (gated off). Nothing was executed.\nTool: delete_note\nSet NOTES_ALLOW_GATED=1 in this server's environment to enable it.\n\n";
    assert!(text.starts_with(head), "{text}");
    let body: Value = serde_json::from_str(&text[head.len()..]).expect("the JSON after the head");
    let path = groceries.display().to_string();
    let expected = json!({
        "ok": false,
        "status": "refused",
        "reason": "gated",
        "executed": false,
        "tool": "delete_note",
        "message": "\"delete_note\" is gated off. Its handler did NOT run and nothing was changed.",
        "default_state": "disabled: NOTES_ALLOW_GATED is unset or not set to an enabling value",
        "dry_run": {
            "preview_available": true,
            "would": format!("delete the file {path}"),
            "bytes": 48,
            "title": "Groceries",
            "reversible": false,
        },
        "tool_description": "Permanently delete one note file.",
        "arguments_received": {"id": "groceries"},
    });
    for (key, value) in expected.as_object().expect("object") {
        assert_eq!(&body[key], value, "{key} in {body:#}");
    }
    assert_eq!(
        body["enable_with"]["env_var"], "NOTES_ALLOW_GATED",
        "{body:#}"
    );
    assert_eq!(body["enable_with"]["set_to"], "1");
    assert_eq!(
        body["enable_with"]["scope"],
        "this server's process environment"
    );
    assert_eq!(refused["result"]["isError"], true);
    assert_eq!(refused["result"]["structuredContent"], body);

    // $ ls examples/notes: nothing was touched.
    assert_eq!(
        note_files(notes.path()),
        ["groceries.md", "ideas.md", "trip.md"]
    );
    assert_eq!(std::fs::read(&groceries).expect("groceries"), before);

    // $ echo "$REQ" | NOTES_ALLOW_GATED=1 node examples/server.mjs 2>/dev/null | jq …
    let deleted = echo_into(notes.path(), data.path(), Some("1"));
    let text = deleted["result"]["content"][0]["text"]
        .as_str()
        .expect("a text block");
    let body: Value = serde_json::from_str(text).expect("JSON text");
    assert_eq!(
        body,
        json!({"ok": true, "status": "ok", "data": {"deleted": path, "bytes": 48}}),
        "{deleted}"
    );
    assert_ne!(deleted["result"]["isError"], true);
    assert_eq!(note_files(notes.path()), ["ideas.md", "trip.md"]);

    // Both decisions are in the audit chain, in order.
    let audit = std::fs::read_to_string(data.path().join("audit.jsonl")).expect("audit log");
    let decisions: Vec<(String, String)> = audit
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).expect("record"))
        .filter(|r| r["name"] == "delete_note")
        .map(|r| {
            (
                r["decision"].as_str().unwrap_or_default().to_owned(),
                r["outcome"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        decisions,
        [
            ("refuse".to_owned(), "dry_run".to_owned()),
            ("allow".to_owned(), "committed".to_owned())
        ]
    );
}

/// A kit server on Streamable HTTP (`Built::serve_http`), over a real socket: the same gate, the
/// same refusal, a 2026-07-28 call in one POST.
#[cfg(feature = "http")]
#[tokio::test]
async fn a_kit_server_serves_streamable_http_behind_the_same_gate() {
    use toolgate::http::HttpConfig;
    use toolgate::kit::{Env, Server, Tool, ok_result};

    let data = tempfile::tempdir().expect("data dir");
    let built = Server::new("shop")
        .env(Env::default())
        .data_dir(data.path())
        .tool(
            Tool::new("greet")
                .handler(|_: serde_json::Map<String, Value>, _ctx| async { ok_result("hello") }),
        )
        .tool(
            Tool::new("refund")
                .gated()
                .handler(|_: serde_json::Map<String, Value>, _ctx| async { ok_result("refunded") }),
        )
        .build()
        .await
        .expect("kit server");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let bound = listener.local_addr().expect("address");
    let url = format!("http://{bound}/mcp");
    let config = HttpConfig::new(&url)
        .expect("resource")
        .with_loopback_origins(bound);
    let serving = tokio::spawn(built.serve_http(listener, config, None));
    // reqwest is built without a TLS provider of its own; plain HTTP still asks for one.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::new();
    let call = |tool: &str| {
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
            "name": tool, "arguments": {}, "_meta": {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": {}}}});
        client
            .post(&url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", "tools/call")
            .header("mcp-name", tool)
            .body(body.to_string())
            .send()
    };
    let answer = |text: String| -> Value {
        // JSON, or one SSE event whose data is the answer.
        let json = text
            .lines()
            .find_map(|l| l.strip_prefix("data:"))
            .map_or(text.as_str(), str::trim)
            .to_owned();
        serde_json::from_str(&json).unwrap_or_else(|e| panic!("{text:?}: {e}"))
    };
    let greeted = answer(
        call("greet")
            .await
            .expect("POST")
            .text()
            .await
            .expect("body"),
    );
    assert_eq!(
        greeted["result"]["structuredContent"]["data"], "hello",
        "{greeted}"
    );
    let refused = answer(
        call("refund")
            .await
            .expect("POST")
            .text()
            .await
            .expect("body"),
    );
    let refusal = &refused["result"]["structuredContent"];
    assert_eq!(refusal["reason"], "gated", "{refused}");
    assert_eq!(refusal["enable_with"]["env_var"], "SHOP_ALLOW_GATED");
    serving.abort();
    let audit = std::fs::read_to_string(data.path().join("audit.jsonl")).expect("audit log");
    assert_eq!(audit.lines().count(), 2, "{audit}");
}
