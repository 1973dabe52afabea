//! The gateway (`toolgate proxy`): the gate in front of MCP servers someone else wrote.
//!
//! The upstreams' tools become a toolset like the kit's, so every call walks the same corridor
//! (visibility, schema, tiers, gated dry runs, approvals, idempotency, audit) before anything is
//! forwarded. What is particular to upstreams lives here: their tools change under us (restarts,
//! `list_changed`), so the catalog is rebuilt and swapped whole; with several upstreams tool names
//! carry the upstream's name (`NAME__tool`); pinned definitions that changed are withheld
//! (`pins.rs`); a dry run can be asked of a tool the upstream offers for that purpose.

mod error;
mod held;
mod passthrough;
mod pins;
mod post;
mod progress;
mod relay;
mod spec;
mod tasks;
mod upstream;
mod wire;

use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use rmcp::model::Tool;
use serde_json::{Map, Value, json};
use tokio::sync::Notify;
use toolgate_core::audit::{Decision, Outcome};
use toolgate_core::redact::Echoes;

pub use error::{ConnectError, LockError, SpecError, UrlProblem};
pub use pins::{Lock, Pin, default_path as default_lock_path, definition_sha256};
pub use spec::{InProcess, Target, UpstreamSpec, from_command, from_file, from_flag};
pub use upstream::Upstream;

use crate::server::Gate;
use crate::toolset::{Call, CallError, CallFuture, Catalog, DryRunFuture, Passthrough, Toolset};
use relay::{Asker, Round};

/// Separates the upstream's name from its tool's name when there are several upstreams.
pub const PREFIX_SEPARATOR: &str = "__";

/// The name a client sees for `tool` of `upstream`: prefixed when there are several upstreams.
#[must_use]
pub fn exposed_name(upstream: &str, tool: &str, prefixed: bool) -> String {
    if prefixed {
        format!("{upstream}{PREFIX_SEPARATOR}{tool}")
    } else {
        tool.to_owned()
    }
}

/// How long start-up waits for every upstream's first connection attempt.
const FIRST_CONNECT_WAIT: Duration = Duration::from_secs(30);

/// Tools of every upstream behind one gate.
#[derive(Debug)]
pub struct Gateway {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    upstreams: Vec<Arc<Upstream>>,
    prefixed: bool,
    lock: Option<Lock>,
    gate: Gate,
    snapshot: RwLock<Arc<Snapshot>>,
    /// Bumped when what is offered changes.
    version: tokio::sync::watch::Sender<u64>,
    /// The upstreams' tasks handed to callers (`tasks.rs`).
    tasks: tasks::Tasks,
}

/// One consistent view: the catalog and where each offered name goes.
#[derive(Debug, Default)]
struct Snapshot {
    catalog: Arc<Catalog>,
    /// Offered name → (upstream index, the upstream's own tool name).
    routes: HashMap<String, (usize, String)>,
}

impl Gateway {
    /// Starts a supervisor per upstream, waits (bounded) for each first connection attempt, and
    /// builds the first catalog. Upstreams that are down are retried in the background; their
    /// tools appear when they connect.
    pub async fn start(specs: Vec<UpstreamSpec>, lock: Option<Lock>, gate: Gate) -> Self {
        let changed = Arc::new(Notify::new());
        let upstreams: Vec<Arc<Upstream>> = specs
            .into_iter()
            .map(|spec| Upstream::new(spec, Arc::clone(&changed), Some(gate.clone())))
            .collect();
        let prefixed = upstreams.len() > 1;
        let inner = Arc::new(Inner {
            upstreams,
            prefixed,
            lock,
            gate,
            snapshot: RwLock::default(),
            version: tokio::sync::watch::channel(0).0,
            tasks: tasks::Tasks::default(),
        });
        for upstream in &inner.upstreams {
            upstream.supervise();
        }
        for upstream in &inner.upstreams {
            upstream.first_attempt(FIRST_CONNECT_WAIT).await;
        }
        inner.rebuild().await;
        let weak = Arc::downgrade(&inner);
        tokio::spawn(async move {
            loop {
                changed.notified().await;
                let Some(inner) = weak.upgrade() else { return };
                inner.rebuild().await;
            }
        });
        Self { inner }
    }

    fn snapshot(&self) -> Arc<Snapshot> {
        Arc::clone(
            &self
                .inner
                .snapshot
                .read()
                .unwrap_or_else(PoisonError::into_inner),
        )
    }
}

impl Inner {
    /// Rebuilds the catalog from every upstream's current tools, applying pins; audits each tool
    /// that is newly withheld.
    async fn rebuild(&self) {
        let mut offered = Vec::new();
        let mut routes = HashMap::new();
        let mut withheld = Vec::new();
        for (index, upstream) in self.upstreams.iter().enumerate() {
            for tool in upstream.tools().iter() {
                let name = exposed_name(upstream.name(), &tool.name, self.prefixed);
                let pin = self
                    .lock
                    .as_ref()
                    .map_or(Pin::Matches, |lock| lock.check(upstream.name(), tool));
                match pin {
                    Pin::Matches => {
                        routes.insert(name.clone(), (index, tool.name.to_string()));
                        let mut tool = tool.clone();
                        tool.name = name.into();
                        offered.push(tool);
                    }
                    Pin::Changed { pinned, now } => withheld.push((
                        name,
                        upstream.name().to_owned(),
                        "pin.changed",
                        format!("definition changed since it was pinned (pinned {pinned}, now {now}); review it and run `toolgate pin` to accept"),
                    )),
                    Pin::New { now } => withheld.push((
                        name,
                        upstream.name().to_owned(),
                        "pin.new",
                        format!("not in the lock file (definition {now}); review it and run `toolgate pin` to accept"),
                    )),
                }
            }
        }
        let mut catalog = Catalog::new(offered);
        // The policy is checked against each tool as the upstream describes it now: a rule that no
        // longer fits (an argument it names is gone, a condition no longer type-checks) withholds
        // the tool rather than being evaluated against arguments it was not written for.
        for (name, types) in catalog.argument_types() {
            let one = std::iter::once((name.clone(), types)).collect();
            if let Err(error) = self.gate.current().policy().check_tools(&one) {
                withheld.push((
                    name.clone(),
                    routes
                        .get(&name)
                        .map_or_else(String::new, |(i, _)| self.upstreams[*i].name().to_owned()),
                    "policy.mismatch",
                    format!("the policy does not fit this tool: {error}"),
                ));
            }
        }
        let before = self
            .snapshot
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .catalog
            .clone();
        for (name, upstream, rule, reason) in withheld {
            let known = before.withheld(&name).is_some_and(|w| w.reason == reason);
            if !known {
                tracing::warn!(tool = %name, upstream = %upstream, rule, reason = %reason, "tool withheld");
                let event = self
                    .gate
                    .event(
                        &name,
                        &Map::new(),
                        Decision::Deny,
                        Outcome::NotExecuted,
                        rule,
                    )
                    .with("upstream", upstream.as_str())
                    .with("reason", reason.as_str());
                // The tool is withheld whether or not this lands; `record` logs a failure.
                let _ = self.gate.record(event).await;
            }
            catalog.withhold(&name, rule, reason);
        }
        for (name, why) in catalog.all_withheld() {
            if why.rule == "schema.invalid" && before.withheld(name).is_none() {
                tracing::warn!(tool = %name, reason = %why.reason, "tool withheld");
            }
        }
        let snapshot = Snapshot {
            catalog: Arc::new(catalog),
            routes,
        };
        *self
            .snapshot
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Arc::new(snapshot);
        // Callers are told whenever an upstream said its list changed (or reconnected), even if
        // what they see is the same: the upstream may have changed a tool in place, and a
        // client that asked to hear of changes expects to hear of each one.
        self.version.send_modify(|v| *v += 1);
    }
}

impl Toolset for Gateway {
    fn catalog(&self) -> Arc<Catalog> {
        Arc::clone(&self.snapshot().catalog)
    }

    fn call<'a>(&'a self, call: Call<'a>) -> CallFuture<'a> {
        Box::pin(async move {
            let snapshot = self.snapshot();
            let Some((index, tool)) = snapshot.routes.get(call.name).cloned() else {
                return Err(crate::toolset::CallError::Unavailable(format!(
                    "{} is no longer offered by its upstream",
                    call.name
                )));
            };
            let read_only = read_only(snapshot.catalog.get(call.name));
            let progress = call
                .caller
                .as_ref()
                .map(|c| c.peer.clone())
                .zip(call.progress_token.clone());
            // Taken before the arguments go upstream, for a caller that may be handed a task.
            let origin = call
                .caller
                .as_ref()
                .is_some_and(|c| c.modern && c.capabilities.supports_tasks())
                .then(|| tasks::Origin {
                    upstream: index,
                    tool: call.name.to_owned(),
                    principal: call.principal.sub.clone(),
                    label: crate::corridor::request_label(&call.arguments),
                    digest: call.args_digest.to_owned(),
                    echoes: Echoes::of(&Value::Object(call.arguments.clone())),
                });
            let asker = call.caller.map(|caller| Asker {
                caller,
                gate: call.gate.clone(),
                name: call.name.to_owned(),
                questions: None,
            });
            let round = match self.inner.upstreams[index]
                .call(&tool, call.arguments, progress, read_only, asker.as_ref())
                .await
            {
                Err(CallError::Task(task)) => {
                    return Err(match origin {
                        Some(origin) => {
                            CallError::Task(Box::new(self.inner.tasks.hand_out(origin, *task)))
                        }
                        // Never offered, so never passed on: a caller that did not declare
                        // the extension cannot follow a task, and it may be doing the work.
                        None => CallError::InDoubt(format!(
                            "upstream {} answered with a task the caller cannot follow",
                            self.inner.upstreams[index].name()
                        )),
                    });
                }
                other => other?,
            };
            match round {
                Round::Done(result) => Ok(result),
                Round::Asks(asks) => Err(CallError::NeedsInput(Box::new(asks))),
            }
        })
    }

    /// The policy's `dry_run_tool` for this tool, called on the same upstream with the call's
    /// arguments and the policy's `dry_run_args` over them. Only a tool the upstream marks
    /// read-only, or one the policy gives `dry_run_args` (which say how to make it a preview), is
    /// ever called this way; anything else gets the gate's synthesised preview.
    fn dry_run<'a>(&'a self, name: &'a str, arguments: &'a Map<String, Value>) -> DryRunFuture<'a> {
        Box::pin(async move {
            let gate = self.inner.gate.current();
            let policy = gate.policy();
            let rule = policy.rule(name)?;
            let preview_tool = rule.dry_run_tool.as_deref()?;
            let snapshot = self.snapshot();
            let (index, _) = snapshot.routes.get(name)?;
            let upstream = &self.inner.upstreams[*index];
            let offered = exposed_name(upstream.name(), preview_tool, self.inner.prefixed);
            let (_, upstream_name) = snapshot.routes.get(&offered)?;
            let safe = read_only(snapshot.catalog.get(&offered)) || !rule.dry_run_args.is_empty();
            if !safe {
                tracing::warn!(
                    tool = name,
                    dry_run_tool = preview_tool,
                    "dry_run_tool is neither read-only nor given dry_run_args; not called"
                );
                return None;
            }
            let mut args = arguments.clone();
            args.extend(rule.dry_run_args.clone());
            let timeout = rule.timeout.unwrap_or(policy.defaults().timeout);
            let call = upstream.call(upstream_name, args, None, true, None);
            let answer = match tokio::time::timeout(timeout, call).await {
                Ok(Ok(Round::Done(result))) => serde_json::to_value(&result).unwrap_or(Value::Null),
                Ok(Ok(Round::Asks(_))) => json!({"error": "it asked for the caller's input"}),
                Ok(Err(error)) => json!({"error": error.to_string()}),
                Err(_) => json!({"error": "timed out"}),
            };
            Some(json!({
                "would": format!("call {name} upstream; {preview_tool} describes the effect"),
                "reversible": Value::Null,
                "dry_run_tool": preview_tool,
                "preview": answer,
            }))
        })
    }

    fn passthrough(&self) -> Option<&dyn Passthrough> {
        Some(self)
    }

    fn upstreams(&self) -> Vec<(String, bool)> {
        let upstreams = &self.inner.upstreams;
        upstreams
            .iter()
            .map(|upstream| (upstream.name().to_owned(), upstream.connected()))
            .collect()
    }

    fn changes(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        Some(self.inner.version.subscribe())
    }

    fn tracks_task(&self, principal: &str, task_id: &str) -> bool {
        self.inner.tasks.knows(principal, task_id)
    }

    /// The upstream the name's prefix (or the only upstream) names; withheld tools included.
    fn origin(&self, name: &str) -> Option<String> {
        self.route(name)
            .map(|(upstream, _)| upstream.name().to_owned())
    }
}

/// Whether the upstream says the tool changes nothing.
fn read_only(tool: Option<&Tool>) -> bool {
    tool.and_then(|t| t.annotations.as_ref())
        .and_then(|a| a.read_only_hint)
        .unwrap_or(false)
}

impl Gateway {
    /// The upstream a prefixed name belongs to, and the upstream's own name for it.
    fn route<'n>(&self, name: &'n str) -> Option<(&Arc<Upstream>, &'n str)> {
        if !self.inner.prefixed {
            return self.inner.upstreams.first().map(|u| (u, name));
        }
        self.inner.upstreams.iter().find_map(|u| {
            name.strip_prefix(u.name())
                .and_then(|rest| rest.strip_prefix(PREFIX_SEPARATOR))
                .map(|own| (u, own))
        })
    }
}
