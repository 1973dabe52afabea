//! Built-in toolsets: tools whose effects toolgate owns, served in-process behind the gate (the kit).
//!
//! A toolset lists its tools (all of them: hiding is the gate's job, not the toolset's) and runs a
//! call the gate admitted. Each handler repeats the policy check before touching anything (defence in
//! depth, seed 000) and makes its effect and its audit record durable before it answers.

mod ledger;

use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;

use rmcp::ErrorData;
use rmcp::model::{CallToolResult, Tool};
use serde_json::{Map, Value};

pub use ledger::Ledger;

use crate::server::Gate;

/// The future a toolset returns for one call.
pub type CallFuture<'a> =
    Pin<Box<dyn Future<Output = Result<CallToolResult, ErrorData>> + Send + 'a>>;

/// A set of tools served behind the gate.
pub trait Toolset: Debug + Send + Sync + 'static {
    /// Every registered tool, visible or not.
    fn tools(&self) -> &[Tool];

    /// Runs `name`, already admitted by the gate.
    fn call<'a>(
        &'a self,
        gate: &'a Gate,
        name: &'a str,
        arguments: Map<String, Value>,
    ) -> CallFuture<'a>;

    /// Whether `name` is registered here.
    fn has(&self, name: &str) -> bool {
        self.tools().iter().any(|tool| tool.name == name)
    }
}

/// Builds the toolset named on the command line.
///
/// # Errors
/// The name is not a built-in toolset; the message lists the ones there are.
pub fn by_name(name: &str) -> Result<Box<dyn Toolset>, String> {
    match name {
        "ledger" => Ok(Box::new(Ledger::new())),
        other => Err(format!("unknown toolset {other:?} (available: ledger)")),
    }
}
