//! End-to-end tests of the gated MCP server, in-process over `tokio::io::duplex`: an rmcp client in
//! each protocol era, and raw JSON lines where the wire format is the point.

#[cfg(feature = "agent")]
mod agent;
#[cfg(feature = "agent")]
mod agent_openai;
mod corridor;
mod eras;
mod features;
#[cfg(feature = "gateway")]
mod in_process;
mod kit;
#[cfg(feature = "notify")]
mod notify;
mod verify;
mod wire;

use std::sync::Arc;

use tempfile::TempDir;
use toolgate::GateServer;
use toolgate::server::Gate;
use toolgate_core::policy::Policy;
use toolgate_core::policy::SEED_POLICY;
use toolgate_demos::Ledger;
use toolgate_store::journal::Journal;

/// A server over a fresh data directory, and that directory.
fn server() -> (GateServer, TempDir) {
    let dir = tempfile::tempdir().expect("temp dir");
    let (journal, _) = Journal::open(dir.path()).expect("journal");
    let policy = Policy::from_json(SEED_POLICY.as_bytes()).expect("policy");
    let server = GateServer::new(Gate::new(policy, journal), Arc::new(Ledger::new()));
    (server, dir)
}

/// The audit log's records as JSON values.
fn audit(dir: &TempDir) -> Vec<serde_json::Value> {
    std::fs::read_to_string(dir.path().join("audit.jsonl"))
        .expect("audit log")
        .lines()
        .map(|line| serde_json::from_str(line).expect("record"))
        .collect()
}
