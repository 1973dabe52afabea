//! Built-in toolsets: tools whose effects toolgate owns, served in-process behind the gate (the kit).
//!
//! A toolset lists its tools (all of them: hiding is the gate's job, not the toolset's) and runs a
//! call the gate admitted. Each handler repeats the policy check before touching anything (defence in
//! depth, seed 000) and makes its effect and its audit record durable before it answers.

mod catalog;
mod docs;
mod helpdesk;
mod ledger;
mod notes;
mod orders;

use std::fmt::Debug;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;

use rmcp::model::{
    CallToolResult, GetPromptRequestParams, GetPromptResult, ProgressToken, Prompt,
    ReadResourceRequestParams, ReadResourceResult, Resource,
};
use rmcp::{Peer, RoleServer};
use serde_json::{Map, Value};

pub use catalog::{Catalog, Withheld};
pub use docs::{Docs, DocsConfigError, TestEscape};
pub use helpdesk::Helpdesk;
pub use ledger::Ledger;
pub use notes::Notes;
pub use orders::Orders;

use tokio_util::sync::CancellationToken;
use toolgate_core::policy::Denial;
use toolgate_core::principal::Principal;

use crate::corridor::Gate;

/// The future a toolset returns for one call.
pub type CallFuture<'a> =
    Pin<Box<dyn Future<Output = Result<CallToolResult, CallError>> + Send + 'a>>;

/// Why a call produced no result of its own. The gate turns each into the answer DESIGN.md §4
/// gives it and audits it; a toolset never has to word these itself.
#[derive(Debug)]
pub enum CallError {
    /// Refused before anything was touched (a handler repeating the policy's check): answered
    /// -32602 like the gate's own refusal, audited `deny / not_executed`. `visible`: the caller
    /// may see the tool, so the answer may name the rule.
    Refused { denial: Denial, visible: bool },
    /// The tool failed and says so; the reason reaches the model after redaction.
    Failed(String),
    /// Nothing was attempted: the tool's backend (an upstream server) is not there.
    Unavailable(String),
    /// The call may or may not have taken effect (an upstream vanished mid-call).
    InDoubt(String),
}

impl CallError {
    /// A tool this toolset does not have: refused like any tool the caller cannot see.
    #[must_use]
    pub fn unknown(tool: &str) -> Self {
        Self::Refused {
            denial: Denial {
                tool: tool.to_owned(),
                rule: "unknown_tool".to_owned(),
            },
            visible: false,
        }
    }
}

/// One admitted call, as a handler receives it.
#[derive(Debug)]
pub struct Call<'a> {
    pub gate: &'a Gate,
    pub name: &'a str,
    /// Already checked against the tool's schema and the policy's argument rules.
    pub arguments: Map<String, Value>,
    /// SHA-256 of the canonical arguments (the audit records' `args_digest`), computed once by
    /// the corridor for every record of the call.
    pub args_digest: &'a str,
    pub principal: &'a Principal,
    /// The policy rule that let the call run, for the tool's own audit records.
    pub rule: &'a str,
    /// Cancelled when the client cancels the request or the tool's timeout passes; a handler that
    /// waits on anything should watch it.
    pub ct: CancellationToken,
    /// The caller's connection, for progress notifications on this request.
    pub peer: Option<Peer<RoleServer>>,
    /// The caller's progress token, when it asked for progress.
    pub progress_token: Option<ProgressToken>,
}

/// The future a toolset returns for a dry run.
pub type DryRunFuture<'a> = Pin<Box<dyn Future<Output = Option<Value>> + Send + 'a>>;

/// A set of tools served behind the gate.
pub trait Toolset: Debug + Send + Sync + 'static {
    /// The tools on offer now, visible or not (hiding is the gate's job). Cheap: an `Arc` clone.
    fn catalog(&self) -> Arc<Catalog>;

    /// Runs a call the gate admitted. The result is what the client sees; a failure is an
    /// `isError` result with the real reason, never success text.
    fn call<'a>(&'a self, call: Call<'a>) -> CallFuture<'a>;

    /// What the call would do, without doing anything: an object with at least `would` (a
    /// sentence) and `reversible` (bool), plus whatever sizes or targets help a person decide.
    /// `None` lets the gate synthesise a preview from the arguments and the rule.
    fn dry_run<'a>(
        &'a self,
        _name: &'a str,
        _arguments: &'a Map<String, Value>,
    ) -> DryRunFuture<'a> {
        Box::pin(std::future::ready(None))
    }

    /// Whether the tool writes its own audit record together with its effect (the ledger does);
    /// otherwise the gate records the outcome after the call.
    fn records_itself(&self, _name: &str) -> bool {
        false
    }

    /// Where the tool's effects happen, for audit records (the gateway names the upstream).
    fn origin(&self, _name: &str) -> Option<String> {
        None
    }

    /// Bumped whenever the catalog changes, for toolsets whose tools can change while serving
    /// (the gateway); the server then tells its sessions `notifications/tools/list_changed`.
    fn changes(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        None
    }

    /// Prompts and resources from elsewhere that the server may pass through (the gateway's
    /// upstreams); the policy decides which.
    fn passthrough(&self) -> Option<&dyn Passthrough> {
        None
    }
}

/// A boxed future of a pass-through request; the error is a sentence for the log and the client.
pub type PassFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, String>> + Send + 'a>>;

/// Upstream prompts and resources, listed and fetched on the caller's behalf. Names and URIs are
/// as the client sees them (prefixed when there are several upstreams).
pub trait Passthrough: Send + Sync {
    fn prompts(&self) -> PassFuture<'_, Vec<Prompt>>;
    fn get_prompt(&self, params: GetPromptRequestParams) -> PassFuture<'_, GetPromptResult>;
    fn resources(&self) -> PassFuture<'_, Vec<Resource>>;
    fn read_resource(
        &self,
        params: ReadResourceRequestParams,
    ) -> PassFuture<'_, ReadResourceResult>;
}

/// What the command line tells the built-in toolsets beyond their data directory.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// docs: the hosts `fetch_doc` may fetch from (empty: its built-in documentation sites).
    pub docs_hosts: Vec<String>,
    /// docs, tests only: pinned hosts that may reach trusted private networks, and an extra root
    /// certificate. Never read from a file, a flag or the environment; see [`TestEscape`].
    pub docs_test_escape: Option<TestEscape>,
}

/// Why [`by_name`] built no toolset. Each message carries its cause, so it reads whole in one line.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("unknown toolset {name:?} (available: docs, helpdesk, ledger, notes, orders)")]
    Unknown { name: String },
    /// The docs toolset's options do not hold (its allow-list, say).
    #[error("docs toolset: {0}")]
    Docs(Box<dyn std::error::Error + Send + Sync>),
    /// A toolset's state under the data directory cannot be opened.
    #[error("{toolset} toolset in {dir}: {error}", dir = dir.display())]
    State {
        toolset: &'static str,
        dir: PathBuf,
        error: std::io::Error,
    },
}

/// Builds the toolset named on the command line. Toolsets that keep state put it under `data`.
///
/// # Errors
/// The name is not a built-in toolset (the message lists the ones there are), or its state cannot
/// be opened.
pub fn by_name(name: &str, data: &Path, options: &Options) -> Result<Box<dyn Toolset>, OpenError> {
    fn state(toolset: &'static str, dir: &Path) -> impl FnOnce(std::io::Error) -> OpenError {
        let dir = dir.to_owned();
        move |error| OpenError::State {
            toolset,
            dir,
            error,
        }
    }
    match name {
        "docs" => Ok(Box::new(
            Docs::from_options(options).map_err(|e| OpenError::Docs(e.into()))?,
        )),
        "ledger" => Ok(Box::new(Ledger::new())),
        "notes" => {
            let dir = data.join("notes");
            Notes::seed_demo(&dir).map_err(state("notes", &dir))?;
            Ok(Box::new(
                Notes::new(dir.clone()).map_err(state("notes", &dir))?,
            ))
        }
        "orders" => {
            let dir = data.join("orders");
            Ok(Box::new(Orders::open(&dir).map_err(state("orders", &dir))?))
        }
        "helpdesk" => {
            let dir = data.join("helpdesk");
            Ok(Box::new(
                Helpdesk::open(&dir).map_err(state("helpdesk", &dir))?,
            ))
        }
        other => Err(OpenError::Unknown {
            name: other.to_owned(),
        }),
    }
}
