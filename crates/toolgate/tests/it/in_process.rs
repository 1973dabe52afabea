//! An rmcp server written with rmcp's own `#[tool_router]` / `#[tool]` macros, gated without
//! being rewritten: the gateway runs it in this process as an upstream
//! (`UpstreamSpec::in_process`), and an rmcp client talks to the gate in front of it. The policy
//! hides one tool, blocks another and lets the third run; the server's own counters say which
//! handlers ran.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolRequestParams;
use rmcp::service::ServiceError;
use rmcp::{ServiceExt, schemars, tool, tool_router};
use serde::Deserialize;
use serde_json::json;
use toolgate::GateServer;
use toolgate::gateway::{Gateway, UpstreamSpec};
use toolgate::server::Gate;
use toolgate_core::policy::Policy;
use toolgate_store::journal::Journal;

use super::audit;

/// What each handler of the wrapped server was asked to do, counted by the server itself.
#[derive(Debug, Default)]
struct Ran {
    add: AtomicUsize,
    wipe: AtomicUsize,
    secret: AtomicUsize,
}

#[derive(Clone)]
struct Calculator {
    ran: Arc<Ran>,
}

#[derive(Deserialize, schemars::JsonSchema)]
struct Sum {
    left: i64,
    right: i64,
}

#[tool_router(server_handler)]
impl Calculator {
    #[tool(description = "Add two integers.")]
    fn add(&self, Parameters(Sum { left, right }): Parameters<Sum>) -> String {
        self.ran.add.fetch_add(1, Ordering::SeqCst);
        (left + right).to_string()
    }

    #[tool(description = "Forget every stored result.")]
    fn wipe(&self) -> String {
        self.ran.wipe.fetch_add(1, Ordering::SeqCst);
        "wiped".to_owned()
    }

    #[tool(description = "An internal tool the policy does not name.")]
    fn secret(&self) -> String {
        self.ran.secret.fetch_add(1, Ordering::SeqCst);
        "internal".to_owned()
    }
}

const POLICY: &str = r#"
version = 2
name = "in-process"

[defaults]
tier = "blocked"

[tools.add]
tier = "low"

[tools.wipe]
tier = "blocked"
"#;

#[tokio::test]
async fn an_rmcp_tool_router_server_is_gated_in_process_without_rewriting_its_tools() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (journal, _) = Journal::open(dir.path()).expect("journal");
    let gate = Gate::new(
        Policy::from_bytes(POLICY.as_bytes()).expect("policy"),
        journal,
    );
    let ran = Arc::new(Ran::default());
    let calculator = Calculator {
        ran: Arc::clone(&ran),
    };
    let spec = UpstreamSpec::in_process("calc", calculator);
    let gateway = Gateway::start(vec![spec], None, gate.clone()).await;
    let server = GateServer::new(gate, Arc::new(gateway));
    let (client_io, server_io) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        let running = server.serve(server_io).await.expect("gate starts");
        let _ = running.waiting().await;
    });
    let client = ().serve(client_io).await.expect("client connects");
    let peer = client.peer();

    let tools = peer.list_all_tools().await.expect("tools/list");
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    assert_eq!(names, ["add"], "only what the policy lets the caller see");
    let schema = serde_json::Value::Object((*tools[0].input_schema).clone());
    assert_eq!(
        schema["required"],
        json!(["left", "right"]),
        "the macro's schema, as rmcp derived it: {schema}"
    );

    let sum = peer
        .call_tool(
            CallToolRequestParams::new("add").with_arguments(
                json!({"left": 2, "right": 40})
                    .as_object()
                    .cloned()
                    .expect("object"),
            ),
        )
        .await
        .expect("add runs");
    assert_eq!(
        serde_json::to_value(&sum).expect("json")["content"][0]["text"],
        "42"
    );

    for (tool, arguments) in [("wipe", json!({})), ("secret", json!({}))] {
        let refused = peer
            .call_tool(
                CallToolRequestParams::new(tool)
                    .with_arguments(arguments.as_object().cloned().expect("object")),
            )
            .await;
        let Err(ServiceError::McpError(error)) = refused else {
            panic!("{tool} must be refused: {refused:?}")
        };
        assert_eq!(error.code.0, -32602, "{tool}: {error:?}");
    }
    // Arguments the macro's schema refuses never reach the handler either.
    let bad = peer
        .call_tool(
            CallToolRequestParams::new("add")
                .with_arguments(json!({"left": "two"}).as_object().cloned().expect("object")),
        )
        .await;
    assert!(
        matches!(bad, Err(ServiceError::McpError(_)))
            || bad.as_ref().is_ok_and(|r| r.is_error == Some(true)),
        "{bad:?}"
    );

    assert_eq!(ran.add.load(Ordering::SeqCst), 1);
    assert_eq!(ran.wipe.load(Ordering::SeqCst), 0, "a blocked handler ran");
    assert_eq!(ran.secret.load(Ordering::SeqCst), 0, "a hidden handler ran");

    let _ = client.cancel().await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let records: Vec<(String, String, String)> = audit(&dir)
        .iter()
        .map(|r| {
            let field = |k: &str| r[k].as_str().unwrap_or_default().to_owned();
            (field("name"), field("decision"), field("upstream"))
        })
        .collect();
    let expect =
        |name: &str, decision: &str| (name.to_owned(), decision.to_owned(), "calc".to_owned());
    assert_eq!(
        records[..3],
        [
            expect("add", "allow"),
            expect("wipe", "deny"),
            expect("secret", "deny")
        ],
        "{records:?}"
    );
}
