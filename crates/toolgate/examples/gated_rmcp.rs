//! An rmcp server written with rmcp's `#[tool_router]` / `#[tool]` macros, served on stdio behind
//! toolgate's gate without changing a line of it: the gateway runs it in this process as an
//! upstream, and the policy below decides what a client sees and what runs. `add` runs; `wipe` is
//! gated: refused with a dry run of what it would do, unless this process was started with
//! `GATED_RMCP_ALLOW_GATED=1`; `reveal`, which the policy does not name, is hidden and refused.
//! Every decision lands in `audit.jsonl` in the data directory.
//!
//! ```text
//! cargo run -p toolgate --example gated_rmcp -- DATA_DIR
//! ```
//!
//! Point an MCP client at that command (it speaks MCP on stdin/stdout); `toolgate audit verify
//! DATA_DIR/audit.jsonl` checks the log afterwards.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use rmcp::handler::server::wrapper::Parameters;
use rmcp::{schemars, tool, tool_router};
use serde::Deserialize;
use toolgate::GateServer;
use toolgate::gateway::{Gateway, UpstreamSpec};
use toolgate::server::Gate;
use toolgate_core::policy::Policy;
use toolgate_store::journal::Journal;

/// The server as its author wrote it for rmcp, nothing toolgate-specific in it.
#[derive(Clone, Default)]
struct Calculator;

#[derive(Deserialize, schemars::JsonSchema)]
struct Sum {
    left: i64,
    right: i64,
}

#[tool_router(server_handler)]
impl Calculator {
    #[tool(description = "Add two integers.")]
    fn add(&self, Parameters(Sum { left, right }): Parameters<Sum>) -> String {
        left.saturating_add(right).to_string()
    }

    #[tool(description = "Forget every stored result.")]
    fn wipe(&self) -> String {
        "wiped".to_owned()
    }

    #[tool(description = "Print the server's configuration.")]
    fn reveal(&self) -> String {
        "configuration".to_owned()
    }
}

/// What the gate allows: `add` at once, `wipe` only with its switch on, nothing else.
const POLICY: &str = r#"
version = 2
name = "gated-rmcp"

[defaults]
tier = "blocked"

[tools.add]
tier = "low"

[tools.wipe]
tier = "low"
gated = true
"#;

#[tokio::main]
async fn main() -> ExitCode {
    let data = std::env::args_os()
        .nth(1)
        .map_or_else(|| PathBuf::from("gated-rmcp-data"), PathBuf::from);
    match run(data).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("gated_rmcp: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn run(data: PathBuf) -> Result<(), Box<dyn std::error::Error>> {
    let policy = Policy::from_bytes(POLICY.as_bytes())?;
    let (journal, _recovery) = Journal::open(&data)?;
    let gate = Gate::new(policy, journal);
    let upstream = UpstreamSpec::in_process("calculator", Calculator);
    let gateway = Gateway::start(vec![upstream], None, gate.clone()).await;
    let server = GateServer::new(gate, Arc::new(gateway));
    toolgate::stdio::serve(server, Duration::from_secs(5)).await?;
    Ok(())
}
