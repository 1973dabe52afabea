//! Raw JSON lines, where the exact wire format is the guarantee: the seed's three lines, version
//! errors, the legacy handshake of every `initialize` revision, and what a refusal looks like.

use rmcp::ServiceExt;
use serde_json::{Value, json};
use tokio::io::{
    AsyncBufReadExt, AsyncWriteExt, BufReader, DuplexStream, Lines, ReadHalf, WriteHalf,
};

use super::{audit, server};

struct Wire {
    tx: WriteHalf<DuplexStream>,
    rx: Lines<BufReader<ReadHalf<DuplexStream>>>,
    dir: tempfile::TempDir,
}

impl Wire {
    fn start() -> Self {
        let (server, dir) = server();
        let (client_io, server_io) = tokio::io::duplex(64 * 1024);
        tokio::spawn(async move {
            let running = server.serve(server_io).await.expect("server starts");
            let _ = running.waiting().await;
        });
        let (rx, tx) = tokio::io::split(client_io);
        Self {
            tx,
            rx: BufReader::new(rx).lines(),
            dir,
        }
    }

    async fn send(&mut self, line: &str) {
        self.tx.write_all(line.as_bytes()).await.expect("write");
        self.tx.write_all(b"\n").await.expect("write");
    }

    async fn exchange(&mut self, line: &str) -> Value {
        self.send(line).await;
        let reply = tokio::time::timeout(std::time::Duration::from_secs(5), self.rx.next_line())
            .await
            .expect("an answer within 5 s")
            .expect("read")
            .expect("a line");
        serde_json::from_str(&reply).expect("JSON")
    }
}

const META: &str = r#""_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}"#;

#[tokio::test]
async fn the_seeds_three_lines_work_as_written() {
    let mut wire = Wire::start();
    let discover = wire
        .exchange(r#"{"jsonrpc":"2.0","id":"d1","method":"server/discover","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}"#)
        .await;
    let result = &discover["result"];
    assert_eq!(discover["id"], "d1");
    assert_eq!(result["resultType"], "complete");
    assert_eq!(
        result["supportedVersions"],
        json!([
            "2026-07-28",
            "2025-11-25",
            "2025-06-18",
            "2025-03-26",
            "2024-11-05"
        ])
    );
    assert_eq!(
        result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"],
        "toolgate"
    );
    assert!(
        result["ttlMs"].is_u64() && result["cacheScope"].is_string(),
        "{result}"
    );

    let list = wire
        .exchange(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}"#)
        .await;
    let names: Vec<&str> = list["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["write_note", "read_ledger"]);
    assert_eq!(list["result"]["resultType"], "complete");
    assert_eq!(list["result"]["cacheScope"], "private");
    assert_eq!(list["result"]["ttlMs"], 0);

    let call = wire
        .exchange(r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"write_note","arguments":{"request_id":"req-0001","text":"gate aplicado"},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}"#)
        .await;
    assert_eq!(call["id"], 2);
    assert_eq!(call["result"]["resultType"], "complete");
    assert_eq!(
        call["result"]["structuredContent"],
        json!({"request_id": "req-0001", "status": "committed"})
    );
    assert_ne!(call["result"]["isError"], true);
    for result in [&list["result"], &call["result"]] {
        assert_eq!(
            result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"],
            "toolgate"
        );
    }
}

#[tokio::test]
async fn an_unsupported_version_gets_32022_with_the_supported_list() {
    let mut wire = Wire::start();
    let reply = wire
        .exchange(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2099-01-01","io.modelcontextprotocol/clientCapabilities":{}}}}"#)
        .await;
    assert_eq!(reply["error"]["code"], -32022, "{reply}");
    assert_eq!(reply["error"]["data"]["requested"], "2099-01-01");
    assert!(
        reply["error"]["data"]["supported"]
            .as_array()
            .unwrap()
            .contains(&json!("2026-07-28"))
    );
}

#[tokio::test]
async fn missing_request_meta_gets_32602() {
    let mut wire = Wire::start();
    let reply = wire
        .exchange(r#"{"jsonrpc":"2.0","id":1,"method":"server/discover","params":{}}"#)
        .await;
    assert_eq!(reply["error"]["code"], -32602, "{reply}");
    let partial = wire
        .exchange(r#"{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#)
        .await;
    assert_eq!(partial["error"]["code"], -32602, "{partial}");
}

#[tokio::test]
async fn every_initialize_revision_is_served_with_legacy_shapes() {
    for version in ["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"] {
        let mut wire = Wire::start();
        let init = wire
            .exchange(&format!(
                r#"{{"jsonrpc":"2.0","id":0,"method":"initialize","params":{{"protocolVersion":"{version}","capabilities":{{}},"clientInfo":{{"name":"raw","version":"0"}}}}}}"#
            ))
            .await;
        assert_eq!(init["result"]["protocolVersion"], version, "{init}");
        assert_eq!(init["result"]["serverInfo"]["name"], "toolgate");
        assert_eq!(
            init["result"]["serverInfo"]["version"],
            env!("CARGO_PKG_VERSION")
        );
        wire.send(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#)
            .await;
        let list = wire
            .exchange(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#)
            .await;
        assert_eq!(
            list["result"]["tools"].as_array().map(Vec::len),
            Some(2),
            "{version}: {list}"
        );
        for modern_only in ["ttlMs", "cacheScope", "_meta"] {
            assert!(
                list["result"].get(modern_only).is_none(),
                "{version}: {list}"
            );
        }
        assert!(
            list["result"].get("resultType").is_none(),
            "{version}: legacy results carry no resultType"
        );
        let call = wire
            .exchange(r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"write_note","arguments":{"request_id":"req-legacy1","text":"x"}}}"#)
            .await;
        assert_eq!(
            call["result"]["structuredContent"]["status"], "committed",
            "{version}: {call}"
        );
        assert!(call["result"].get("resultType").is_none());
        let denied = wire
            .exchange(r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"rm_rf","arguments":{"path":"/"}}}"#)
            .await;
        assert_eq!(denied["error"]["code"], -32602, "{version}: {denied}");
    }
}

#[tokio::test]
async fn a_2026_request_in_initialize_is_answered_with_the_newest_legacy_revision() {
    let mut wire = Wire::start();
    let init = wire
        .exchange(r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2026-07-28","capabilities":{},"clientInfo":{"name":"raw","version":"0"}}}"#)
        .await;
    assert_eq!(init["result"]["protocolVersion"], "2025-11-25", "{init}");
}

#[tokio::test]
async fn refusals_are_32602_before_dispatch_and_audited_as_not_executed() {
    let mut wire = Wire::start();
    for (id, name, args, message, rule) in [
        (
            1,
            "rm_rf",
            r#"{"path":"/"}"#,
            "tool denied: rm_rf",
            "visibility",
        ),
        (
            2,
            "no_such_tool",
            "{}",
            "tool denied: no_such_tool",
            "visibility",
        ),
        (
            3,
            "write_note",
            r#"{"request_id":"short","text":"x"}"#,
            "tool denied: write_note (policy rule arg_rules.write_note.request_id.min_len)",
            "arg_rules.write_note.request_id.min_len",
        ),
    ] {
        let reply = wire
            .exchange(&format!(
                r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"{name}","arguments":{args},{META}}}}}"#
            ))
            .await;
        assert_eq!(reply["error"]["code"], -32602, "{reply}");
        assert_eq!(reply["error"]["message"], message);
        // A denied tool and one that does not exist are told apart by nothing.
        assert_eq!(reply["error"]["data"]["rule"], rule);
        assert_eq!(
            reply["error"]["data"]["policy_sha256"]
                .as_str()
                .map(str::len),
            Some(64)
        );
    }
    let records = audit(&wire.dir);
    assert_eq!(records.len(), 3);
    for record in &records {
        assert_eq!(
            (record["decision"].as_str(), record["outcome"].as_str()),
            (Some("deny"), Some("not_executed"))
        );
    }
    assert_eq!(records[0]["request_id"], "missing");
    assert_eq!(records[2]["request_id"], "short");
}

#[tokio::test]
async fn arguments_that_do_not_fit_the_schema_are_a_tool_error_the_model_can_fix() {
    let mut wire = Wire::start();
    let reply = wire
        .exchange(&format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"write_note","arguments":{{"request_id":"req-00001","text":"x","extra":1}},{META}}}}}"#
        ))
        .await;
    assert_eq!(reply["result"]["isError"], true, "{reply}");
    assert!(
        reply["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("extra")
    );
    let records = audit(&wire.dir);
    assert_eq!(records[0]["outcome"], "invalid_args");
    let ledger = wire
        .exchange(&format!(r#"{{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{{"name":"read_ledger","arguments":{{}},{META}}}}}"#))
        .await;
    assert_eq!(
        ledger["result"]["structuredContent"],
        json!({"notes": []}),
        "nothing was written"
    );
}
