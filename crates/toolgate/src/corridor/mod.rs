//! The corridor (DESIGN.md §1): the one path every `tools/call` walks, in order, to one [`Answer`].
//!
//! `kill_switch` → `visibility` (with the token's scopes and the policy's argument rules) →
//! `rate_limit` → `schema` → `decide` (tier, escalation, gate switch, then the medium budget, spent
//! only by a call that will run) → `approve` → `claim` (idempotency key) → `run` (timeout and the
//! caller's cancellation) → `settle` (the key's outcome) → `clean` (redact, sanitise untrusted
//! output) → `audit` → `verify` (the policy's postcondition, for a call that ran). Each step either
//! lets the call go on or ends it with an [`Answer`]; nothing here builds a reply. `audit` is the
//! only writer of the call's outcome record, and its one rule is the fail-closed one: an answer
//! whose effect happened (or may have) and could not be recorded becomes in doubt; a refusal stays
//! a refusal. `verify` comes after it, not before (DESIGN.md §1 lists it as step 8) so that the
//! effect's record is durable before the gate makes any call of its own about it (see
//! `verify.rs`). [`answer::to_wire`] then gives the answer its MCP shape. Kit tools and upstream
//! tools (the gateway) walk the same steps; only the toolset behind `Toolset::call` differs.
//!
//! Sizes: an `async fn`'s future is as large as its largest await point, and each `.await`
//! builds the callee's future and copies all of it into the caller's, whether or not the call
//! takes the branch that needs the space. A store's future is about 9 KB (sqlx's), so every step
//! that awaited one made every call copy it, several times over, up the chain to rmcp's request
//! handling (`memcpy` was a fifth of a gateway call's instructions under callgrind,
//! docs/performance.md). Where a step awaits a store or a whole nested corridor (`verify.rs`) on
//! a branch only some calls take, the awaited future is boxed: a call that takes the branch pays
//! one allocation, the others copy a pointer.
//!
//! Files: `admit.rs` (kill switch to decide), `approval.rs`, `execute.rs` (claim, run, settle),
//! `clean.rs`, `verify.rs`, `answer.rs` (answer → wire), `gate.rs` (policy, stores, switches),
//! `limits.rs`.

mod admit;
pub mod answer;
mod approval;
mod clean;
mod execute;
mod verify;

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use rmcp::ErrorData;
use rmcp::model::{CallToolResponse, CallToolResult, ProgressToken};
use serde_json::{Map, Value};
use tokio_util::sync::CancellationToken;
use toolgate_core::audit::{Decision, Event};
use toolgate_core::canonical;
use toolgate_core::policy::{Tier, Verdict};
use toolgate_core::redact::Echoes;

pub use crate::gate::{
    AuditUnavailable, ENABLING, Gate, OpenError, RateLimits, enabling, request_label,
};
pub use answer::Answer;
#[cfg(feature = "gateway")]
pub(crate) use clean::{clean_tool_result, redact_prompt, redact_resource};
pub use verify::Verify;

use crate::gate::Laps;
use crate::toolset::{Caller, Catalog, Toolset};

/// What the steps pass on: a step ends the call with an answer (`Break`) or lets it go on.
type Flow<T = ()> = ControlFlow<Answer<CallToolResult>, T>;

/// Everything the corridor needs besides the call: the gate, the toolset, and the catalog as it
/// was when the call arrived (a list change mid-call does not change what this call checks).
pub(crate) struct Corridor<'a> {
    gate: &'a Gate,
    toolset: &'a dyn Toolset,
    catalog: Arc<Catalog>,
    /// The upstream that serves the tool, named in every audit record of the call.
    origin: Option<String>,
}

/// One call as it walks the corridor: what was asked, and what the steps found out so far.
pub(crate) struct CallState<'c> {
    name: &'c str,
    /// The call's arguments, always an object (kept as a `Value` so that the schema and the
    /// handler get them without a copy).
    arguments: Value,
    /// The `request_id` every record of the call carries ([`request_label`]).
    label: String,
    /// SHA-256 of the canonical arguments, computed once for every record and key of the call.
    digest: String,
    /// The caller's own strings, which its answer may repeat unredacted (the handler takes the
    /// arguments, so they are copied here first).
    echoes: Echoes,
    /// Set by `decide` (and replaced by `approve` with the approval that let it run).
    verdict: Option<Verdict>,
    /// The approval this run consumed; its row keeps the answer for repeats.
    approval: Option<String>,
    /// The idempotency key this call claimed, settled after the run.
    key: Option<String>,
    /// The caller's own idempotency key for the call (the agent's, one per tool call), used when
    /// the policy names none for the tool.
    own_key: Option<String>,
    /// Whether a call that needs a person is held open for the policy's wait (an MCP client's
    /// call), or answers pending at once (the agent, which pauses its run instead).
    hold: bool,
    /// Set when the caller may open no new approval request (the agent's cap per run): why.
    approvals_closed: Option<String>,
    /// Whether the handler was started (a lost record then makes the answer in doubt, and a
    /// cancellation is the handler's, not a waiting call's).
    started: bool,
    /// A call the gate makes itself (a postcondition's read or compensating call): its result is
    /// the gate's to judge, so it is neither cleaned nor verified in turn.
    nested: bool,
    /// The arguments, kept by `run` for a tool whose postcondition reads them after the handler
    /// took the originals.
    kept: Option<Map<String, Value>>,
    /// What `verify` decided, for a call the policy gives a postcondition.
    verify: Option<Verify>,
    /// Fields the audit record carries besides the answer's own (`approval_id`, `forwarded`).
    detail: Vec<(&'static str, Value)>,
    ct: CancellationToken,
    /// Fires when the server shuts down: a call held for a person answers pending at once.
    shutdown: CancellationToken,
    caller: Option<Caller>,
    progress: Option<ProgressToken>,
}

impl<'c> CallState<'c> {
    /// A call to `name` with `arguments`, cancelled by `ct`.
    pub(crate) fn new(
        name: &'c str,
        arguments: Map<String, Value>,
        ct: CancellationToken,
        shutdown: CancellationToken,
    ) -> Self {
        let digest = canonical::digest_object(&arguments);
        let label = request_label(&arguments);
        let arguments = Value::Object(arguments);
        Self {
            name,
            echoes: Echoes::of(&arguments),
            arguments,
            label,
            digest,
            verdict: None,
            approval: None,
            key: None,
            own_key: None,
            hold: true,
            approvals_closed: None,
            started: false,
            nested: false,
            kept: None,
            verify: None,
            detail: Vec::new(),
            ct,
            shutdown,
            caller: None,
            progress: None,
        }
    }

    /// The client behind the call and its progress token, for notifications and questions on
    /// this request.
    pub(crate) fn with_caller(mut self, caller: Caller, progress: Option<ProgressToken>) -> Self {
        self.caller = Some(caller);
        self.progress = progress;
        self
    }

    /// The caller's own idempotency key, for a tool the policy gives none.
    pub(crate) fn with_own_key(mut self, key: Option<String>) -> Self {
        self.own_key = key;
        self
    }

    /// A field every audit record of the call carries (`task_id` for a call a task runs).
    pub(crate) fn with_detail(mut self, key: &'static str, value: Value) -> Self {
        self.detail.push((key, value));
        self
    }

    /// A call that needs a person answers pending at once instead of being held open.
    pub(crate) fn unheld(mut self) -> Self {
        self.hold = false;
        self
    }

    /// No new approval request may be opened for this call (`why` says so to the caller); an
    /// existing one for the same call is still attached to and used.
    pub(crate) fn with_approvals_closed(mut self, why: Option<String>) -> Self {
        self.approvals_closed = why;
        self
    }

    /// The arguments as the object they are.
    fn arguments(&self) -> &Map<String, Value> {
        match &self.arguments {
            Value::Object(map) => map,
            // `new` stores an object; `run` moves it into the handler, after which nothing
            // reads the arguments (records use the label and digest made at the start).
            _ => empty_map(),
        }
    }

    fn rule(&self) -> &str {
        self.verdict.as_ref().map_or("", |v| v.rule.as_str())
    }
}

impl<'a> Corridor<'a> {
    pub(crate) fn new(gate: &'a Gate, toolset: &'a dyn Toolset, name: &str) -> Self {
        Self {
            gate,
            toolset,
            catalog: toolset.catalog(),
            origin: toolset.origin(name),
        }
    }

    /// Walks `call` through every step, records its answer and gives it its wire form, with what
    /// kind of answer it was, the tier it was decided at and the approval it involved.
    pub(crate) async fn call_for_outcome(&self, mut call: CallState<'_>) -> Outcome {
        let arrived = std::time::Instant::now();
        let mut laps = self.gate.metrics().laps();
        let answer = match self.walk(&mut call, &mut laps).await {
            ControlFlow::Break(answer) | ControlFlow::Continue(answer) => answer,
        };
        let answer = laps.time("audit", self.audit(&call, answer).await);
        let answer = laps.time("verify", self.verify(&mut call, answer).await);
        let kind = answer.kind();
        self.count(&call, kind, arrived.elapsed());
        let rule = answer.rule().unwrap_or_else(|| call.rule()).to_owned();
        let approval_id = match &answer {
            Answer::Pending(pending) => Some(pending.approval_id.clone()),
            // `approve` notes the approval a call ran under, was replayed from or refused by.
            _ => call
                .detail
                .iter()
                .find(|(key, _)| *key == "approval_id")
                .and_then(|(_, id)| id.as_str())
                .map(str::to_owned),
        };
        let wire = answer::to_wire(answer, call.name, self.gate.policy().sha256());
        if let (Some(id), Ok(CallToolResponse::Complete(result))) = (&call.approval, &wire) {
            self.keep_approved_result(id, result).await;
        }
        Outcome {
            kind,
            rule,
            tier: call.verdict.as_ref().map(|v| v.tier),
            approval_id,
            verify: call.verify.take(),
            response: wire,
        }
    }

    /// Counts the call's answer for metrics, under its tool's name only if the toolset has that
    /// tool (any other name is the caller's invention, and would grow the series without bound).
    fn count(&self, call: &CallState<'_>, kind: answer::Kind, took: Duration) {
        let known = self.catalog.has(call.name) || self.catalog.withheld(call.name).is_some();
        let tool = if known {
            call.name
        } else {
            crate::gate::UNKNOWN_TOOL
        };
        let (decision, outcome) = kind.audit();
        self.gate.metrics().call(tool, decision, outcome, took);
    }

    /// The steps, in DESIGN.md §1's order, each timed for metrics (the step a call ends at too).
    async fn walk(
        &self,
        call: &mut CallState<'_>,
        laps: &mut Laps<'_>,
    ) -> Flow<Answer<CallToolResult>> {
        laps.time("kill_switch", self.kill_switch(call).await)?;
        laps.time("visibility", self.visibility(call))?;
        laps.time("rate_limit", self.rate_limit(call).await)?;
        laps.time("schema", self.schema(call))?;
        laps.time("decide", self.decide(call).await)?;
        laps.time("approve", self.approve(call).await)?;
        laps.time("claim", self.claim(call).await)?;
        let answer = laps.time("run", self.run(call).await);
        self.settle(call, &answer).await;
        laps.lap("settle");
        ControlFlow::Continue(laps.time("clean", self.clean(call, answer)))
    }

    /// The call's one outcome record, written before the answer leaves. A tool that writes its
    /// own record with its effect (the ledger) is not recorded twice; a call cancelled while it
    /// waited (before its handler started) leaves the approval or key as it was and is not an
    /// outcome of its own.
    async fn audit(
        &self,
        call: &CallState<'_>,
        answer: Answer<CallToolResult>,
    ) -> Answer<CallToolResult> {
        let kind = answer.kind();
        let handler_recorded =
            call.started && self.toolset.records_itself(call.name) && kind != answer::Kind::Denied;
        let waited_and_left = kind == answer::Kind::Cancelled && !call.started;
        // A pending answer's record was written when the request was opened (`approve`).
        if handler_recorded || waited_and_left || kind == answer::Kind::Pending {
            return answer;
        }
        let event = self.event(call, &answer);
        if kind == answer::Kind::Denied {
            tracing::info!(
                tool = call.name,
                rule = answer.rule().unwrap_or_default(),
                "call denied"
            );
        }
        match self.gate.record(event).await {
            Ok(_) => answer,
            Err(unavailable) => answer.unrecorded(&unavailable.to_string()),
        }
    }

    /// The audit event for `answer`: its decision and outcome, the rule that made it, the tier
    /// and whatever the steps noted, naming the upstream when there is one.
    fn event(&self, call: &CallState<'_>, answer: &Answer<CallToolResult>) -> Event {
        let (decision, outcome) = answer.kind().audit();
        let rule = answer.rule().unwrap_or_else(|| call.rule());
        let mut event = self.gate.event_digested(
            call.name,
            call.label.clone(),
            call.digest.clone(),
            decision,
            outcome,
            rule,
        );
        if let Some(verdict) = &call.verdict
            && matches!(decision, Decision::Allow | Decision::Approval)
        {
            event = event.with("tier", verdict.tier.as_str());
        }
        for (key, value) in &call.detail {
            event = event.with(key, value.clone());
        }
        if let Answer::Task { task, .. } = answer
            && let Some(id) = task.get("taskId")
        {
            // Its end is recorded under the same id when the gateway sees it (`tasks/get`).
            event = event.with("task_id", id.clone());
        }
        from_upstream(event, self.origin.as_deref())
    }

    /// The tool's timeout from the policy.
    fn timeout(&self, name: &str) -> Duration {
        self.gate.policy().timeout(name)
    }
}

/// One call made in-process rather than over MCP (the agent's): the tool, its arguments, and how
/// the caller waits and keys it.
#[derive(Debug)]
pub struct Request {
    /// The tool's name.
    pub name: String,
    /// The arguments (an object).
    pub arguments: Map<String, Value>,
    /// The caller's idempotency key for this call, used for a tool the policy gives none: a
    /// repeat with the same key replays the first call's answer instead of running again.
    pub key: Option<String>,
    /// Set when this call may open no new approval request: why, for the caller.
    pub approvals_closed: Option<String>,
    /// Cancels the call.
    pub ct: CancellationToken,
}

/// What became of an in-process call.
#[derive(Debug)]
pub struct Outcome {
    /// The kind of answer (ran, denied, pending, …).
    pub kind: answer::Kind,
    /// The rule that decided it, as the audit record names it (even where the caller's answer
    /// withholds it).
    pub rule: String,
    /// The tier the call was decided at, once the policy decided it.
    pub tier: Option<Tier>,
    /// The approval the call waits for, ran under, was replayed from or was refused by.
    pub approval_id: Option<String>,
    /// What the gate decided after reading back the call's effect, for a call that ran and whose
    /// tool the policy gives a postcondition (`None` otherwise): on anything but
    /// [`Check::Continue`](answer::Check::Continue) the caller ends its run.
    pub verify: Option<Verify>,
    /// What an MCP client would have been sent.
    pub response: Result<CallToolResponse, ErrorData>,
}

/// Walks one in-process call through the corridor behind `gate` (whose principal is the caller)
/// to `toolset`, exactly as a `tools/call` from an MCP client walks it, except that a call that
/// needs a person answers pending at once (the caller pauses instead of holding the call).
pub async fn call(gate: &Gate, toolset: &dyn Toolset, request: Request) -> Outcome {
    let _occupant = gate.journal().occupy();
    let corridor = Corridor::new(gate, toolset, &request.name);
    let state = CallState::new(
        &request.name,
        request.arguments,
        request.ct,
        CancellationToken::new(),
    )
    .with_own_key(request.key)
    .with_approvals_closed(request.approvals_closed)
    .unheld();
    corridor.call_for_outcome(state).await
}

/// `event`, naming the upstream whose tool it is about (the gateway's records), if any.
pub(crate) fn from_upstream(event: Event, upstream: Option<&str>) -> Event {
    match upstream {
        Some(upstream) => event.with("upstream", upstream),
        None => event,
    }
}

/// Waits `period`, or less when the call is cancelled (`Err`): every poll loop of the corridor
/// (an approval being decided, a key held by another copy of the call) waits this way.
async fn pause(period: Duration, ct: &CancellationToken) -> Result<(), Cancelled> {
    tokio::select! {
        () = tokio::time::sleep(period) => Ok(()),
        () = ct.cancelled() => Err(Cancelled),
    }
}

/// An empty object, for arguments already handed to the handler.
fn empty_map() -> &'static Map<String, Value> {
    static EMPTY: std::sync::OnceLock<Map<String, Value>> = std::sync::OnceLock::new();
    EMPTY.get_or_init(Map::new)
}

/// The caller cancelled while the corridor waited.
#[derive(Debug)]
struct Cancelled;
