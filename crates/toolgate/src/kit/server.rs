//! The kit's server builder: a name, tools, options; then `serve_stdio` (or `serve_http` with the
//! `http` feature). Everything the corridor does for `toolgate serve` it does here, from the same
//! code: the builder only assembles a policy, a gate and a toolset.

use std::collections::BTreeSet;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{CacheScope, Implementation};
use toolgate_core::policy::{Policy, PolicyError};
use toolgate_core::redact::Redactor;
use toolgate_store::journal::Durability;

use super::context::{Env, Level};
use super::tool::{KitToolset, Shared, Tool};
use crate::corridor::{Gate, OpenError};
use crate::server::{GateServer, Identity};
use crate::stdio::Bare;

/// Why a kit server could not start. Nothing is served, and nothing was written but the data
/// directory's files, when it is returned.
#[derive(Debug, thiserror::Error)]
pub enum KitError {
    /// A tool's definition cannot be served.
    #[error("tool {tool}: {problem}")]
    Tool {
        /// The tool's name.
        tool: String,
        /// What is wrong with it.
        problem: String,
    },
    /// Two tools have the same name.
    #[error("two tools are named {0}")]
    DuplicateTool(String),
    /// The server's name, the policy file, or a tool's declarations do not make a valid policy,
    /// or the policy does not fit the tools (a rule names an argument a tool does not have).
    #[error("policy: {0}")]
    Policy(#[from] PolicyError),
    /// The policy file could not be read.
    #[error("cannot read policy {path}: {source}")]
    PolicyFile {
        /// The file named.
        path: PathBuf,
        /// Why it could not be read.
        #[source]
        source: std::io::Error,
    },
    /// No data directory was given and none can be derived (neither `XDG_STATE_HOME` nor `HOME`
    /// is set).
    #[error(
        "no data directory: call Server::data_dir, or set XDG_STATE_HOME or HOME (the audit log lives there)"
    )]
    NoDataDir,
    /// The data directory's journal or database could not be opened.
    #[error(transparent)]
    Open(#[from] OpenError),
    /// The transport failed.
    #[error("transport: {0}")]
    Transport(#[from] std::io::Error),
}

/// A gated MCP server of your own tools (seed 004's `createServer`).
///
/// ```no_run
/// use serde::Deserialize;
/// use serde_json::json;
/// use toolgate::kit::{Lookup, Server, Tool, list_result, ok_result};
///
/// #[derive(Deserialize)]
/// struct Id {
///     id: String,
/// }
///
/// #[tokio::main]
/// async fn main() -> Result<(), toolgate::kit::KitError> {
///     Server::new("notes") // gated tools open with NOTES_ALLOW_GATED=1
///         .version("1.0.0")
///         .tool(
///             Tool::new("list_notes")
///                 .description("List the notes.")
///                 .handler(|_: serde_json::Map<String, serde_json::Value>, _ctx| async {
///                     list_result(["groceries", "ideas"], &Lookup::new("notes", "the notes directory"))
///                 }),
///         )
///         .tool(
///             Tool::new("delete_note")
///                 .description("Permanently delete one note file.")
///                 .input_schema(json!({
///                     "type": "object",
///                     "properties": {"id": {"type": "string"}},
///                     "required": ["id"],
///                 }))
///                 .gated()
///                 .dry_run(|Id { id }, _ctx| async move {
///                     Ok(json!({"would": format!("delete the note {id}"), "reversible": false}))
///                 })
///                 .handler(|Id { id }, _ctx| async move { ok_result(json!({"deleted": id})) }),
///         )
///         .serve_stdio()
///         .await
/// }
/// ```
#[derive(Debug)]
pub struct Server {
    name: String,
    version: String,
    instructions: Option<String>,
    timeout: Duration,
    cache_ttl: Duration,
    cache_scope: CacheScope,
    grace: Duration,
    guard_stdout: bool,
    bare: Bare,
    env: Option<Env>,
    tools: Vec<Tool>,
    policy: Option<PolicySource>,
    data_dir: Option<PathBuf>,
    durability: Durability,
    #[cfg(feature = "notify")]
    notifier: Option<crate::notify::Notifier>,
}

#[derive(Debug)]
enum PolicySource {
    Loaded(Box<Policy>),
    File(PathBuf),
}

impl Server {
    /// A server named `name`, which is also the prefix of its gate variable: `notes` and
    /// `notes-mcp` both give `NOTES_ALLOW_GATED`. Letters, digits, `-` and `_`.
    #[must_use]
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            version: "0.0.0".to_owned(),
            instructions: None,
            timeout: Duration::from_secs(60),
            cache_ttl: Duration::ZERO,
            cache_scope: CacheScope::Private,
            grace: Duration::from_secs(5),
            guard_stdout: true,
            bare: Bare::AsCurrent,
            env: None,
            tools: Vec::new(),
            policy: None,
            data_dir: None,
            durability: Durability::Synced,
            #[cfg(feature = "notify")]
            notifier: None,
        }
    }

    /// The version reported to clients (`serverInfo`). Default `0.0.0`.
    #[must_use]
    pub fn version(mut self, version: impl Into<String>) -> Self {
        self.version = version.into();
        self
    }

    /// Text for the model about how to use the server.
    #[must_use]
    pub fn instructions(mut self, instructions: impl Into<String>) -> Self {
        self.instructions = Some(instructions.into());
        self
    }

    /// The timeout of a tool that declares none. Default 60 s. With a policy file, the file's
    /// `defaults.timeout` applies instead.
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Caching hints of 2026-07-28 `tools/list` results: how long a client may reuse the list
    /// (`ttlMs`, default 0) and who may cache it (default private).
    #[must_use]
    pub fn cache(mut self, ttl: Duration, scope: CacheScope) -> Self {
        self.cache_ttl = ttl;
        self.cache_scope = scope;
        self
    }

    /// After stdin closes (or SIGTERM, SIGINT), how long calls already received may finish.
    /// Default 5 s.
    #[must_use]
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// Whether stray writes to stdout (a `println!` in a handler or a dependency) are moved to
    /// stderr as warnings on stdio, instead of corrupting the protocol stream. Default on.
    #[must_use]
    pub fn guard_stdout(mut self, guard: bool) -> Self {
        self.guard_stdout = guard;
        self
    }

    /// What a request gets on stdio that carries no revision in `_meta` on a connection that
    /// never sent `initialize`. Default [`Bare::AsCurrent`], as seed 004's kit: served as a
    /// 2026-07-28 request, so that `echo '{…"method":"tools/call"…}' | server` works from a
    /// shell. [`Bare::Refuse`] answers -32602, to the letter of MCP 2026-07-28.
    #[must_use]
    pub fn bare_requests(mut self, bare: Bare) -> Self {
        self.bare = bare;
        self
    }

    /// Where gate variables and `MCP_LOG_LEVEL` are read, and what handlers see as
    /// [`Context::env`](super::Context::env). Default: the process's environment at start.
    #[must_use]
    pub fn env(mut self, env: Env) -> Self {
        self.env = Some(env);
        self
    }

    /// Adds a tool.
    #[must_use]
    pub fn tool(mut self, tool: Tool) -> Self {
        self.tools.push(tool);
        self
    }

    /// Adds tools.
    #[must_use]
    pub fn tools(mut self, tools: impl IntoIterator<Item = Tool>) -> Self {
        self.tools.extend(tools);
        self
    }

    /// A policy on top of what the tools declare: tiers, approvals, budgets, idempotency keys,
    /// rate limits, argument rules. A tool the code marks gated stays gated. Without one, every
    /// tool runs (gated ones only once their variable is set).
    #[must_use]
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policy = Some(PolicySource::Loaded(Box::new(policy)));
        self
    }

    /// [`Server::policy`], read from a file (TOML version 2, or the seed's JSON version 1) at
    /// start.
    #[must_use]
    pub fn policy_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.policy = Some(PolicySource::File(path.into()));
        self
    }

    /// Where the audit log (`audit.jsonl`) and the database of approvals, kill switch, budgets
    /// and idempotency keys live; created if missing. Default:
    /// `$XDG_STATE_HOME/toolgate/NAME`, else `$HOME/.local/state/toolgate/NAME`.
    #[must_use]
    pub fn data_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.data_dir = Some(dir.into());
        self
    }

    /// Whether each audit record is synced to disk before the answer (`Synced`, the default) or
    /// written without waiting for the disk (`Buffered`: a power cut can lose the last records).
    #[must_use]
    pub fn audit(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// Announces each new approval request through `notifier` (a signed webhook, a Slack
    /// message), as `toolgate serve --webhook …` does.
    #[cfg(feature = "notify")]
    #[must_use]
    pub fn notifier(mut self, notifier: crate::notify::Notifier) -> Self {
        self.notifier = Some(notifier);
        self
    }

    /// Checks everything and opens the data directory: the server, ready for any transport.
    ///
    /// # Errors
    /// A tool or the policy is invalid, or the data directory cannot be opened.
    pub async fn build(mut self) -> Result<Built, KitError> {
        let mut names = BTreeSet::new();
        for tool in &self.tools {
            if let Some(problem) = tool.problems().into_iter().next() {
                return Err(KitError::Tool {
                    tool: tool.name().to_owned(),
                    problem,
                });
            }
            if !names.insert(tool.name()) {
                return Err(KitError::DuplicateTool(tool.name().to_owned()));
            }
        }
        let env = self.env.clone().unwrap_or_else(Env::from_process);
        let policy = kit_policy(self.policy.take(), &self.name, self.timeout, &self.tools)?;
        let redactor = Arc::new(Redactor::new(super::secrets::registered()));
        let shared = Arc::new(Shared {
            server: Arc::from(self.name.as_str()),
            env: env.clone(),
            level: Level::from_env(&env),
            redactor: redactor.clone(),
        });
        let toolset = KitToolset::new(self.tools, shared);
        let catalog = crate::toolset::Toolset::catalog(&toolset);
        if let Some((tool, why)) = catalog.all_withheld().iter().next() {
            return Err(KitError::Tool {
                tool: tool.clone(),
                problem: why.reason.clone(),
            });
        }
        for warning in policy.check_tools(&catalog.argument_types())? {
            tracing::warn!(%warning, "policy");
        }
        let dir = match self.data_dir {
            Some(dir) => dir,
            None => default_data_dir(&env, &self.name).ok_or(KitError::NoDataDir)?,
        };
        let gate = Gate::open(policy, &dir, self.durability)
            .await?
            .with_redactor((*redactor).clone())
            .with_switches(|name| env.get(name).map(str::to_owned))
            .with_principal(crate::identity::local_principal());
        #[cfg(feature = "notify")]
        let gate = match self.notifier {
            Some(notifier) => gate.with_notifier(notifier),
            None => gate,
        };
        let identity = Identity {
            info: Implementation::new(self.name, self.version),
            instructions: self.instructions,
            cache_ttl_ms: u64::try_from(self.cache_ttl.as_millis()).unwrap_or(u64::MAX),
            cache_scope: self.cache_scope,
        };
        let server = GateServer::new(gate, Arc::new(toolset)).with_identity(identity);
        Ok(Built {
            server,
            grace: self.grace,
            guard_stdout: self.guard_stdout,
            bare: self.bare,
            redactor,
        })
    }

    /// Builds and serves on stdin and stdout until stdin closes, or SIGTERM or SIGINT arrives;
    /// calls already received then get the shutdown grace to finish.
    ///
    /// # Errors
    /// As [`Server::build`], or the transport failed.
    pub async fn serve_stdio(self) -> Result<(), KitError> {
        self.build().await?.serve_stdio().await
    }
}

/// The policy a kit server runs: the file's or the one given, else the kit's own
/// ([`Policy::for_kit`]), with each tool's declarations laid under it.
fn kit_policy(
    source: Option<PolicySource>,
    name: &str,
    timeout: Duration,
    tools: &[Tool],
) -> Result<Policy, KitError> {
    let mut policy = match source {
        None => Policy::for_kit(name, timeout)?,
        Some(PolicySource::Loaded(policy)) => *policy,
        Some(PolicySource::File(path)) => {
            let bytes = std::fs::read(&path).map_err(|source| KitError::PolicyFile {
                path: path.clone(),
                source,
            })?;
            Policy::from_bytes(&bytes)?
        }
    };
    policy.name_if_unnamed(name);
    for tool in tools {
        policy.declare(tool.name(), tool.declared())?;
    }
    Ok(policy)
}

/// `$XDG_STATE_HOME/toolgate/NAME`, else `$HOME/.local/state/toolgate/NAME` (the XDG base
/// directory specification's place for state that should persist, such as logs).
fn default_data_dir(env: &Env, name: &str) -> Option<PathBuf> {
    let state = match env.get("XDG_STATE_HOME").filter(|v| !v.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(env.get("HOME").filter(|v| !v.is_empty())?).join(".local/state"),
    };
    Some(state.join("toolgate").join(name))
}

/// A kit server, built and ready to serve.
#[derive(Debug)]
pub struct Built {
    server: GateServer,
    grace: Duration,
    guard_stdout: bool,
    bare: Bare,
    redactor: Arc<Redactor>,
}

impl Built {
    /// The rmcp server: serve it on any rmcp transport (`rmcp::ServiceExt::serve`).
    #[must_use]
    pub fn server(&self) -> &GateServer {
        &self.server
    }

    /// Serves on stdin and stdout ([`Server::serve_stdio`]).
    ///
    /// # Errors
    /// The transport failed, or stdout could not be guarded.
    pub async fn serve_stdio(self) -> Result<(), KitError> {
        let _sweeper = crate::server::Sweeper::start(self.server.gate());
        let result = if self.guard_stdout {
            let redactor = self.redactor.clone();
            let scrub: crate::stdio::guard::Scrub =
                Arc::new(move |text| super::secrets::redact(&redactor, text));
            let guard = crate::stdio::guard::StrayStdout::install(scrub)?;
            crate::stdio::serve_on(self.server, self.grace, guard.protocol(), self.bare).await
        } else {
            let stdout = std::io::stdout();
            crate::stdio::serve_on(self.server, self.grace, stdout.as_fd(), self.bare).await
        };
        Ok(result?)
    }

    /// Serves Streamable HTTP on `listener` until SIGINT or SIGTERM, as an OAuth 2.1 resource
    /// server when `verifier` is given (without one, every caller is the local user: bind a
    /// loopback address only).
    ///
    /// # Errors
    /// The HTTP server failed.
    #[cfg(feature = "http")]
    pub async fn serve_http(
        self,
        listener: tokio::net::TcpListener,
        config: crate::http::HttpConfig,
        verifier: Option<Arc<crate::http::Verifier>>,
    ) -> Result<(), KitError> {
        let _sweeper = crate::server::Sweeper::start(self.server.gate());
        let shutdown = self.server.shutdown();
        tokio::spawn(crate::http::stop_on_signal(shutdown.clone()));
        let app = crate::http::router(self.server, config.clone(), verifier, shutdown.clone());
        let result = crate::http::serve(listener, app, &config, shutdown, self.grace).await;
        Ok(result?)
    }
}
