//! toolgate: the MCP side of the tool-call boundary, on the official Rust SDK (rmcp).
//!
//! It owns the corridor every call walks, the rmcp server adapter (dual-era: MCP 2026-07-28 and
//! the `initialize` revisions on one stream), the mapping of gate outcomes to what an MCP client
//! sees, the stdio transport with its shutdown grace, and the toolset contract tools are served
//! through (`toolset`); behind features, Streamable HTTP (`http`) and the gateway (`gateway`). The
//! built-in toolsets are users of the contract in their own crate (`toolgate-demos`). Policy and
//! audit logic stay in `toolgate-core`; this crate only walks calls through them, so an rmcp
//! upgrade touches this folder and nothing else.

pub mod corridor;
#[cfg(feature = "gateway")]
pub mod gateway;
#[cfg(feature = "http")]
pub mod http;
pub mod server;
pub mod stdio;
pub mod toolset;

pub use server::GateServer;

/// Name and version this build reports as `serverInfo`.
#[must_use]
pub fn implementation() -> rmcp::model::Implementation {
    rmcp::model::Implementation::new("toolgate", env!("CARGO_PKG_VERSION"))
}

/// Locks `mutex`, also after a panic elsewhere poisoned it: the data behind every mutex here stays
/// consistent between statements, so a panicked holder leaves nothing half-changed to refuse.
pub(crate) fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Whole seconds in `wait`, rounded up: what a "retry after N s" may promise.
pub(crate) fn seconds_up(wait: std::time::Duration) -> u64 {
    wait.as_secs() + u64::from(wait.subsec_nanos() > 0)
}

/// Outgoing HTTPS (upstreams, JWKS, documents) uses rustls with ring; installed once per process
/// (a second install is a no-op error).
#[cfg(any(feature = "http", feature = "gateway"))]
pub(crate) fn install_tls_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
