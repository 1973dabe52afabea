//! toolgate: the MCP side of the tool-call boundary, on the official Rust SDK (rmcp).
//!
//! It owns the rmcp server adapter (dual-era: MCP 2026-07-28 and the `initialize` revisions on one
//! stream), the mapping of gate outcomes to what an MCP client sees, the stdio transport with its
//! shutdown grace, and the built-in toolsets. Policy and audit logic stay in `toolgate-core`; this
//! crate only walks calls through them, so an rmcp upgrade touches this folder and nothing else.

pub mod gateway;
pub mod http;
pub mod outcome;
pub mod server;
pub mod stdio;
pub mod toolset;

pub use server::GateServer;

/// Name and version this build reports as `serverInfo`.
#[must_use]
pub fn implementation() -> rmcp::model::Implementation {
    rmcp::model::Implementation::new("toolgate", env!("CARGO_PKG_VERSION"))
}

/// Outgoing HTTPS (upstreams, JWKS, documents) uses rustls with ring; installed once per process
/// (a second install is a no-op error).
pub(crate) fn install_tls_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
