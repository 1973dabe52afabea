//! An rmcp client in each era drives the whole ledger scenario.

use rmcp::model::{CallToolRequestParams, ProtocolVersion};
use rmcp::service::{ClientLifecycleMode, ClientServiceExt, ServiceError};
use rmcp::{RoleClient, ServiceExt, service::RunningService};
use serde_json::{Value, json};

use super::{audit, server};

async fn connect(
    lifecycle: ClientLifecycleMode,
) -> (RunningService<RoleClient, ()>, tempfile::TempDir) {
    let (server, dir) = server();
    let (client_io, server_io) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        let running = server.serve(server_io).await.expect("server starts");
        let _ = running.waiting().await;
    });
    let client = ().serve_with_lifecycle(client_io, lifecycle).await.expect("client connects");
    (client, dir)
}

async fn call(
    client: &RunningService<RoleClient, ()>,
    tool: &str,
    args: Value,
) -> Result<rmcp::model::CallToolResult, ServiceError> {
    let arguments = args.as_object().cloned().unwrap_or_default();
    client
        .peer()
        .call_tool(CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments))
        .await
}

async fn scenario(lifecycle: ClientLifecycleMode, expected_version: ProtocolVersion) {
    let (client, dir) = connect(lifecycle).await;
    let info = client.peer().peer_info().expect("server info");
    assert_eq!(info.protocol_version, expected_version);
    let server_info = info.server_info.clone().expect("serverInfo");
    assert_eq!(
        (server_info.name.as_str(), server_info.version.as_str()),
        ("toolgate", env!("CARGO_PKG_VERSION"))
    );

    let tools = client.peer().list_all_tools().await.expect("tools/list");
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    assert_eq!(names, ["write_note", "read_ledger"]);
    let write_note = &tools[0];
    let annotations = write_note.annotations.as_ref().expect("seed annotations");
    assert_eq!(
        (
            annotations.idempotent_hint,
            annotations.destructive_hint,
            annotations.read_only_hint
        ),
        (Some(true), Some(false), Some(false))
    );

    let denied = call(&client, "rm_rf", json!({"path": "/"})).await;
    let Err(ServiceError::McpError(error)) = denied else {
        panic!("rm_rf must be a JSON-RPC error: {denied:?}")
    };
    assert_eq!(error.code.0, -32602);
    assert_eq!(error.message, "tool denied: rm_rf");

    let note = json!({"request_id": "req-0001", "text": "gate applied"});
    let first = call(&client, "write_note", note.clone())
        .await
        .expect("write_note");
    assert_eq!(
        first.structured_content,
        Some(json!({"request_id": "req-0001", "status": "committed"}))
    );
    let again = call(&client, "write_note", note.clone())
        .await
        .expect("write_note replay");
    assert_eq!(
        again.structured_content,
        Some(json!({"request_id": "req-0001", "status": "replay"}))
    );
    let conflict = call(
        &client,
        "write_note",
        json!({"request_id": "req-0001", "text": "other"}),
    )
    .await
    .expect("conflict");
    assert_eq!(conflict.is_error, Some(true));

    let observed = call(&client, "read_ledger", json!({}))
        .await
        .expect("read_ledger");
    assert_eq!(observed.structured_content, Some(json!({"notes": [note]})));

    let outcomes: Vec<(String, String)> = audit(&dir)
        .iter()
        .map(|r| {
            (
                r["decision"].as_str().unwrap().to_owned(),
                r["outcome"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let expected = [
        ("deny", "not_executed"),
        ("allow", "committed"),
        ("allow", "replay"),
        ("deny", "conflict"),
        ("allow", "observed"),
    ];
    assert_eq!(
        outcomes,
        expected.map(|(d, o)| (d.to_owned(), o.to_owned()))
    );
    client.cancel().await.expect("close");
}

#[tokio::test]
async fn a_2026_client_runs_the_scenario_without_a_handshake() {
    scenario(
        ClientLifecycleMode::Discover {
            preferred_versions: vec![ProtocolVersion::V_2026_07_28],
        },
        ProtocolVersion::V_2026_07_28,
    )
    .await;
}

#[tokio::test]
async fn an_auto_client_discovers_the_2026_revision() {
    scenario(
        ClientLifecycleMode::Auto {
            preferred_versions: vec![ProtocolVersion::V_2026_07_28],
            legacy_version: Some(ProtocolVersion::V_2025_11_25),
        },
        ProtocolVersion::V_2026_07_28,
    )
    .await;
}

#[tokio::test]
async fn a_legacy_initialize_client_runs_the_same_scenario() {
    scenario(
        ClientLifecycleMode::Initialize,
        ProtocolVersion::V_2025_11_25,
    )
    .await;
}
