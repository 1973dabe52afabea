//! The rmcp client, in each era, driving `toolgate serve` as a real child process over its pipes.

use rmcp::model::{CallToolRequestParams, ProtocolVersion};
use rmcp::service::{ClientLifecycleMode, ClientServiceExt};
use rmcp::transport::TokioChildProcess;
use serde_json::json;

use super::Scratch;

async fn scenario(lifecycle: ClientLifecycleMode, expected: ProtocolVersion) {
    let scratch = Scratch::new();
    let command = tokio::process::Command::from(scratch.serve_command());
    let (transport, _) = TokioChildProcess::builder(command)
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn");
    let client = ().serve_with_lifecycle(transport, lifecycle).await.expect("connect");
    assert_eq!(
        client.peer().peer_info().expect("info").protocol_version,
        expected
    );

    let names: Vec<String> = client
        .peer()
        .list_all_tools()
        .await
        .expect("list")
        .iter()
        .map(|t| t.name.to_string())
        .collect();
    assert_eq!(names, ["write_note", "read_ledger"]);
    let note = json!({"request_id": "req-child-01", "text": "from a child"});
    let args = note.as_object().cloned().unwrap_or_default();
    for expected in ["committed", "replay"] {
        let result = client
            .peer()
            .call_tool(CallToolRequestParams::new("write_note").with_arguments(args.clone()))
            .await
            .expect("write_note");
        assert_eq!(
            result
                .structured_content
                .as_ref()
                .map(|v| v["status"].clone()),
            Some(json!(expected))
        );
    }
    let ledger = client
        .peer()
        .call_tool(CallToolRequestParams::new("read_ledger"))
        .await
        .expect("read_ledger");
    assert_eq!(ledger.structured_content, Some(json!({"notes": [note]})));
    client.cancel().await.expect("close");
}

#[tokio::test]
async fn a_2026_rmcp_client_over_a_child_process() {
    scenario(
        ClientLifecycleMode::Discover {
            preferred_versions: vec![ProtocolVersion::V_2026_07_28],
        },
        ProtocolVersion::V_2026_07_28,
    )
    .await;
}

#[tokio::test]
async fn a_legacy_rmcp_client_over_a_child_process() {
    scenario(
        ClientLifecycleMode::Initialize,
        ProtocolVersion::V_2025_11_25,
    )
    .await;
}
