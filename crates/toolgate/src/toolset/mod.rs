//! Built-in toolsets: tools whose effects toolgate owns, served in-process behind the gate (the kit).
//!
//! A toolset lists its tools (all of them: hiding is the gate's job, not the toolset's) and runs a
//! call the gate admitted. Each handler repeats the policy check before touching anything (defence in
//! depth, seed 000) and makes its effect and its audit record durable before it answers.

mod ledger;
mod notes;
mod orders;

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;

use rmcp::ErrorData;
use rmcp::model::{CallToolResult, Tool};
use serde_json::{Map, Value};

pub use ledger::Ledger;
pub use notes::Notes;
pub use orders::Orders;

use tokio_util::sync::CancellationToken;
use toolgate_core::principal::Principal;
use toolgate_core::schema::ToolSchema;

use crate::server::Gate;

/// The future a toolset returns for one call.
pub type CallFuture<'a> =
    Pin<Box<dyn Future<Output = Result<CallToolResult, ErrorData>> + Send + 'a>>;

/// One admitted call, as a handler receives it.
#[derive(Debug)]
pub struct Call<'a> {
    pub gate: &'a Gate,
    pub name: &'a str,
    /// Already checked against the tool's schema and the policy's argument rules.
    pub arguments: Map<String, Value>,
    pub principal: &'a Principal,
    /// The policy rule that let the call run, for the tool's own audit records.
    pub rule: &'a str,
    /// Cancelled when the client cancels the request or the tool's timeout passes; a handler that
    /// waits on anything should watch it.
    pub ct: CancellationToken,
}

/// A set of tools served behind the gate.
pub trait Toolset: Debug + Send + Sync + 'static {
    /// Every registered tool, visible or not.
    fn tools(&self) -> &[Tool];

    /// Runs a call the gate admitted. The result is what the client sees; a failure is an
    /// `isError` result with the real reason, never success text.
    fn call<'a>(&'a self, call: Call<'a>) -> CallFuture<'a>;

    /// What the call would do, without doing anything: an object with at least `would` (a
    /// sentence) and `reversible` (bool), plus whatever sizes or targets help a person decide.
    /// `None` lets the gate synthesise a preview from the arguments and the rule.
    fn dry_run(&self, _name: &str, _arguments: &Map<String, Value>) -> Option<Value> {
        None
    }

    /// Whether the tool writes its own audit record together with its effect (the ledger does);
    /// otherwise the gate records the outcome after the call.
    fn records_itself(&self, _name: &str) -> bool {
        false
    }

    /// Whether `name` is registered here.
    fn has(&self, name: &str) -> bool {
        self.tools().iter().any(|tool| tool.name == name)
    }
}

/// Every tool's input schema, compiled.
///
/// # Errors
/// A schema is not valid JSON Schema for an object; the message names the tool.
pub fn schemas(toolset: &dyn Toolset) -> Result<BTreeMap<String, ToolSchema>, String> {
    toolset
        .tools()
        .iter()
        .map(|tool| {
            let schema = Value::Object((*tool.input_schema).clone());
            ToolSchema::compile(&schema)
                .map(|compiled| (tool.name.to_string(), compiled))
                .map_err(|e| format!("tool {}: input schema: {e}", tool.name))
        })
        .collect()
}

/// Each tool's arguments and their declared JSON types, for the policy's load-time checks.
#[must_use]
pub fn argument_types(
    schemas: &BTreeMap<String, ToolSchema>,
) -> BTreeMap<String, BTreeMap<String, Vec<String>>> {
    schemas
        .iter()
        .map(|(name, schema)| {
            let types = schema
                .property_types()
                .iter()
                .map(|(arg, types)| {
                    (
                        arg.clone(),
                        types.iter().map(|t| t.as_str().to_owned()).collect(),
                    )
                })
                .collect();
            (name.clone(), types)
        })
        .collect()
}

/// Builds the toolset named on the command line.
///
/// # Errors
/// The name is not a built-in toolset; the message lists the ones there are.
/// Toolsets that keep state put it under `data`.
///
/// # Errors
/// The name is not a built-in toolset (the message lists the ones there are), or its state cannot
/// be opened.
pub fn by_name(name: &str, data: &std::path::Path) -> Result<Box<dyn Toolset>, String> {
    match name {
        "ledger" => Ok(Box::new(Ledger::new())),
        "notes" => {
            let dir = data.join("notes");
            let failed = |e: std::io::Error| format!("notes toolset in {}: {e}", dir.display());
            Notes::seed_demo(&dir).map_err(failed)?;
            Ok(Box::new(Notes::new(dir.clone()).map_err(failed)?))
        }
        "orders" => {
            let dir = data.join("orders");
            let orders = Orders::open(&dir)
                .map_err(|e| format!("orders toolset in {}: {e}", dir.display()))?;
            Ok(Box::new(orders))
        }
        other => Err(format!(
            "unknown toolset {other:?} (available: ledger, notes, orders)"
        )),
    }
}
