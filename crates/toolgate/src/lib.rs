//! toolgate: the MCP side of the tool-call boundary, on the official Rust SDK (rmcp).
//!
//! It owns the corridor every call walks, the rmcp server adapter (dual-era: MCP 2026-07-28 and
//! the `initialize` revisions on one stream), the mapping of gate outcomes to what an MCP client
//! sees, the stdio transport with its shutdown grace, and the toolset contract tools are served
//! through (`toolset`); behind features, Streamable HTTP (`http`) and the gateway (`gateway`). The
//! built-in toolsets are users of the contract in their own crate (`toolgate-demos`). Policy and
//! audit logic stay in `toolgate-core`; this crate only walks calls through them, so an rmcp
//! upgrade touches this folder and nothing else.
//!
//! # Your own gated tools: the kit
//!
//! [`kit`] builds an MCP server of your own tools behind the gate. A tool that changes things is
//! [`gated`](kit::Tool::gated): until its switch (`NOTES_ALLOW_GATED` for a server named `notes`)
//! is set in the server's environment, a call to it runs nothing and answers with its dry run.
//! This example serves such a server on an in-memory pipe and calls the gated tool as a
//! 2026-07-28 client would; [`kit::Server::serve_stdio`] serves it on stdin and stdout instead.
//!
//! ```
//! use std::sync::Arc;
//! use std::sync::atomic::{AtomicBool, Ordering};
//!
//! use rmcp::ServiceExt;
//! use serde::Deserialize;
//! use serde_json::{Value, json};
//! use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
//! use toolgate::kit::{Env, Server, Tool, ok_result};
//!
//! #[derive(Deserialize)]
//! struct Id {
//!     id: String,
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let ran = Arc::new(AtomicBool::new(false));
//! let handler_ran = ran.clone();
//! let data = tempfile::tempdir()?; // the audit log and the approval database live here
//! let built = Server::new("notes")
//!     .env(Env::default()) // not the process's: NOTES_ALLOW_GATED is unset
//!     .data_dir(data.path())
//!     .tool(
//!         Tool::new("delete_note")
//!             .description("Permanently delete one note file.")
//!             .input_schema(json!({
//!                 "type": "object",
//!                 "properties": {"id": {"type": "string"}},
//!                 "required": ["id"],
//!             }))
//!             .gated()
//!             .dry_run(|Id { id }, _ctx| async move {
//!                 Ok(json!({"would": format!("delete the file {id}.md"), "reversible": false}))
//!             })
//!             .handler(move |Id { id }, _ctx| {
//!                 handler_ran.store(true, Ordering::SeqCst);
//!                 async move { ok_result(json!({"deleted": id})) }
//!             }),
//!     )
//!     .build()
//!     .await?;
//!
//! // The client's end of the pipe speaks JSON lines, as on stdio. rmcp's `serve` reads the
//! // first message before it returns, so it runs on a task of its own.
//! let (client, server) = tokio::io::duplex(64 * 1024);
//! let serving = tokio::spawn(built.server().clone().serve(tokio::io::split(server)));
//! let (client_read, mut client_write) = tokio::io::split(client);
//! let call = json!({
//!     "jsonrpc": "2.0", "id": 1, "method": "tools/call",
//!     "params": {
//!         "name": "delete_note",
//!         "arguments": {"id": "groceries"},
//!         "_meta": {
//!             "io.modelcontextprotocol/protocolVersion": "2026-07-28",
//!             "io.modelcontextprotocol/clientCapabilities": {},
//!         },
//!     },
//! });
//! client_write.write_all(format!("{call}\n").as_bytes()).await?;
//! let line = BufReader::new(client_read).lines().next_line().await?.unwrap_or_default();
//! let answer: Value = serde_json::from_str(&line)?;
//!
//! let refusal = &answer["result"]["structuredContent"];
//! assert_eq!(refusal["reason"], "gated");
//! assert_eq!(refusal["executed"], false);
//! assert_eq!(refusal["enable_with"]["env_var"], "NOTES_ALLOW_GATED");
//! assert_eq!(refusal["dry_run"]["would"], "delete the file groceries.md");
//! assert!(!ran.load(Ordering::SeqCst), "a refused call runs no handler");
//! serving.await??.cancel().await?;
//! # Ok(())
//! # }
//! ```

#![deny(missing_docs)]

#[cfg(feature = "agent")]
pub mod agent;
#[cfg(feature = "console")]
pub mod console;
pub mod corridor;
pub mod gate;
#[cfg(feature = "gateway")]
pub mod gateway;
#[cfg(feature = "http")]
pub mod http;
pub mod identity;
pub mod kit;
#[cfg(feature = "notify")]
pub mod notify;
pub mod server;
pub mod stdio;
pub mod toolset;

pub use server::GateServer;

/// Name and version this build reports as `serverInfo`.
#[must_use]
pub fn implementation() -> rmcp::model::Implementation {
    rmcp::model::Implementation::new("toolgate", env!("CARGO_PKG_VERSION"))
}

/// `bytes` random bytes from the operating system's generator, as lower-case hex: the ids and
/// secrets others must not guess (task ids, console sessions and login links).
///
/// # Errors
/// The generator failed; then nothing is made of it.
pub(crate) fn random_hex(bytes: usize) -> Result<String, getrandom::Error> {
    let mut buf = vec![0u8; bytes];
    getrandom::fill(&mut buf)?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

/// Locks `mutex`, also after a panic elsewhere poisoned it: the data behind every mutex here stays
/// consistent between statements, so a panicked holder leaves nothing half-changed to refuse.
pub(crate) fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Reads `lock`, also after a panic elsewhere poisoned it (as [`lock`]).
pub(crate) fn read<T>(lock: &std::sync::RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Writes `lock`, also after a panic elsewhere poisoned it (as [`lock`]).
pub(crate) fn write<T>(lock: &std::sync::RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Whole seconds in `wait`, rounded up: what a "retry after N s" may promise.
pub(crate) fn seconds_up(wait: std::time::Duration) -> u64 {
    wait.as_secs() + u64::from(wait.subsec_nanos() > 0)
}

/// Whether `url` names this machine: `localhost` or a loopback address, parsed (so that
/// `http://127.0.0.1.example.com` and `http://localhost@example.com` are other hosts).
#[cfg(any(feature = "gateway", feature = "agent"))]
pub(crate) fn loopback(url: &url::Url) -> bool {
    match url.host() {
        Some(url::Host::Domain(name)) => name.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    }
}

/// Outgoing HTTPS (upstreams, JWKS, documents, notifications) uses rustls with ring; installed once
/// per process (a second install is a no-op error).
#[cfg(any(
    feature = "http",
    feature = "gateway",
    feature = "agent",
    feature = "notify"
))]
pub(crate) fn install_tls_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
