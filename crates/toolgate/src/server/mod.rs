//! The gated MCP server: the rmcp `ServerHandler` in front of a toolset.
//!
//! It identifies the caller (the token's principal on HTTP), lists only the tools the caller may
//! see, hands every `tools/call` to the corridor (`crate::corridor`, DESIGN.md §1) and passes
//! prompts and resources through under policy. Protocol eras are rmcp's: `server/discover`,
//! per-request `_meta`, `resultType`, -32022 and the `initialize` handshake all come from the SDK;
//! this type narrows the version list on purpose and names itself in `serverInfo`.

#![expect(
    deprecated,
    reason = "MCP 2026-07-28 deprecates logging, sampling, roots and resources/subscribe; the revisions before it, which the gateway passes through, have them"
)]

mod resolutions;
mod sessions;
mod tasks;

use std::borrow::Cow;
use std::sync::Arc;

use rmcp::model::{
    CacheScope, CallToolRequestParams, CallToolResponse, CancelTaskParams, CompleteRequestMethod,
    CompleteRequestParams, CompleteResult, GetPromptRequestMethod, GetPromptRequestParams,
    GetPromptResponse, GetTaskParams, GetTaskResult, InitializeRequestParams, InitializeResult,
    InputResponses, ListPromptsRequestMethod, ListPromptsResult,
    ListResourceTemplatesRequestMethod, ListResourceTemplatesResult, ListResourcesRequestMethod,
    ListResourcesResult, ListToolsResult, MetaObject, PaginatedRequestParams, ProtocolVersion,
    ReadResourceRequestMethod, ReadResourceRequestParams, ReadResourceResponse, Reference,
    ResultType, ServerCapabilities, ServerConfig, SetLevelRequestParams, SubscribeRequestMethod,
    SubscribeRequestParams, SubscriptionFilter, TASKS_EXTENSION_ID, Tool, UnsubscribeRequestMethod,
    UnsubscribeRequestParams, UpdateTaskParams,
};
use rmcp::service::{NotificationContext, RequestContext, SubscriptionContext};
use rmcp::{ErrorData, RoleServer, ServerHandler};
use tokio_util::sync::CancellationToken;
use toolgate_core::audit::{Decision, Outcome};
use toolgate_core::principal::Principal;

pub use resolutions::{Sweeper, audit_resolutions, record_resolutions};
pub use sessions::{Running, SESSION_HEADER, Sessions};

use crate::corridor::{CallState, Corridor, from_upstream};
pub use crate::corridor::{Gate, RateLimits, request_label};
pub use crate::gate::{ReloadError, Reloaded};

use crate::toolset::{Caller, PassFuture, Passthrough, Toolset};

/// Every revision this server speaks: the stateless 2026-07-28 and the four `initialize` revisions.
pub const PROTOCOL_VERSIONS: &[ProtocolVersion] = &[
    ProtocolVersion::V_2026_07_28,
    ProtocolVersion::V_2025_11_25,
    ProtocolVersion::V_2025_06_18,
    ProtocolVersion::V_2025_03_26,
    ProtocolVersion::V_2024_11_05,
];

/// How a server names itself to clients: `serverInfo`, the instructions for the model, and the
/// cache hints of its 2026-07-28 list results.
#[derive(Clone, Debug)]
pub struct Identity {
    /// `serverInfo` (name and version), also in every 2026-07-28 result's `_meta`.
    pub info: rmcp::model::Implementation,
    /// Text for the model about how to use the server.
    pub instructions: Option<String>,
    /// `ttlMs` of `tools/list` results (2026-07-28): how long a client may reuse the list.
    pub cache_ttl_ms: u64,
    /// `cacheScope` of `tools/list` results: whether a shared cache may keep them.
    pub cache_scope: CacheScope,
}

impl Default for Identity {
    /// toolgate itself: never cached, since what is listed depends on the caller's policy.
    fn default() -> Self {
        Self {
            info: crate::implementation(),
            instructions: Some(
                "toolgate: every tool call passes a policy gate and lands in a SHA-256 chained audit log."
                    .to_owned(),
            ),
            cache_ttl_ms: 0,
            cache_scope: CacheScope::Private,
        }
    }
}

/// The server a client talks to: a gate in front of one toolset.
#[derive(Clone, Debug)]
pub struct GateServer {
    gate: Gate,
    toolset: Arc<dyn Toolset>,
    identity: Arc<Identity>,
    /// `_meta` naming this server, which 2026-07-28 results SHOULD carry (rmcp adds it to
    /// discover only); built once from `identity`.
    meta: MetaObject,
    inflight: crate::stdio::InFlight,
    /// Cancelled when the server stops taking calls (a signal, or stdin closed): calls held for a
    /// person answer pending at once instead of holding the shutdown up.
    shutdown: CancellationToken,
    /// Where calls held for a person become tasks, when this server offers them (`tasks.rs`):
    /// decided once per policy in force.
    tasks: Arc<std::sync::Mutex<tasks::Offered>>,
    /// The legacy HTTP sessions opened with this server, and their clients.
    sessions: Sessions,
}

impl GateServer {
    /// A server for `toolset`'s tools behind `gate`.
    #[must_use]
    pub fn new(gate: Gate, toolset: Arc<dyn Toolset>) -> Self {
        Self {
            tasks: Arc::new(std::sync::Mutex::new(tasks::Offered::new(&gate))),
            gate,
            toolset,
            meta: server_meta(&crate::implementation()),
            identity: Arc::new(Identity::default()),
            inflight: crate::stdio::InFlight::default(),
            shutdown: CancellationToken::new(),
            sessions: Sessions::default(),
        }
    }

    /// The same server under another name, instructions and cache hints (a kit's own).
    #[must_use]
    pub fn with_identity(mut self, identity: Identity) -> Self {
        self.meta = server_meta(&identity.info);
        self.identity = Arc::new(identity);
        self
    }

    /// The gate every call walks through.
    #[must_use]
    pub fn gate(&self) -> &Gate {
        &self.gate
    }

    /// The token that, once cancelled, makes held calls answer pending at once.
    #[must_use]
    pub fn shutdown(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    /// The legacy HTTP sessions opened with this server (and its clones).
    #[must_use]
    pub fn sessions(&self) -> &Sessions {
        &self.sessions
    }

    /// Counter of calls being served, which the stdio transport waits on at EOF.
    #[must_use]
    pub fn inflight(&self) -> crate::stdio::InFlight {
        self.inflight.clone()
    }

    /// Tools the caller may see. Gated tools say so in their description and in `_meta`, with the
    /// variable that opens them; annotations pass through untouched.
    fn visible_tools(&self, gate: &Gate) -> Vec<Tool> {
        let policy = gate.policy();
        self.toolset
            .catalog()
            .tools()
            .iter()
            .filter(|tool| gate.visible(&tool.name))
            .map(|tool| {
                let mut tool = tool.clone();
                if policy.rule(&tool.name).is_some_and(|r| r.gated) {
                    let env = policy.gate_env(&tool.name);
                    let open = gate.gate_open(&tool.name);
                    let note = if open {
                        format!(" [gated: enabled by {env}]")
                    } else {
                        format!(" [gated: off until {env} is set; calls answer with a dry run]")
                    };
                    tool.description = Some(
                        format!("{}{note}", tool.description.as_deref().unwrap_or_default()).into(),
                    );
                    let mut meta = tool.meta.take().unwrap_or_default();
                    meta.0.insert(
                        "io.toolgate/gated".to_owned(),
                        serde_json::json!({"env": env, "enabled": open}),
                    );
                    tool.meta = Some(meta);
                }
                tool
            })
            .collect()
    }

    /// Every scope the policy names, sorted: the metadata's `scopes_supported`, and the scope hint
    /// of a 401 that is not about one tool.
    #[must_use]
    pub fn scopes(&self) -> Vec<String> {
        self.gate
            .current()
            .policy()
            .scopes()
            .into_iter()
            .map(str::to_owned)
            .collect()
    }

    /// The scope a call to `tool` needs, when the tool is offered and the policy shows it (a tool
    /// that does not exist for anyone gets no scope challenge that would reveal it).
    #[must_use]
    pub fn required_scope(&self, tool: &str) -> Option<String> {
        let gate = self.gate.current();
        let policy = gate.policy();
        if !self.toolset.catalog().has(tool) || !policy.visible(tool) {
            return None;
        }
        policy.scope(tool).map(str::to_owned)
    }

    /// Audits a call the HTTP layer refused with 403 `insufficient_scope` (a denial is often the
    /// first sign of an injected instruction, so it is recorded like any other).
    pub async fn record_scope_refusal(
        &self,
        principal: &Principal,
        tool: &str,
        arguments: Option<&serde_json::Map<String, serde_json::Value>>,
    ) {
        let gate = self
            .gate
            .current()
            .into_owned()
            .with_principal(principal.clone());
        let empty = serde_json::Map::new();
        let event = gate.event(
            tool,
            arguments.unwrap_or(&empty),
            Decision::Deny,
            Outcome::NotExecuted,
            "scope",
        );
        // The 403 goes out whatever happens here; a lost record is logged by `record`.
        let _ = gate
            .record(from_upstream(event, self.toolset.origin(tool).as_deref()))
            .await;
    }

    /// The gate as this request's caller sees it: on HTTP, with the principal the transport
    /// verified (the access token's subject and scopes); elsewhere the server's own.
    fn gate_for(&self, context: &RequestContext<RoleServer>) -> Cow<'_, Gate> {
        let verified = context
            .extensions
            .get::<http::request::Parts>()
            .and_then(|parts| parts.extensions.get::<Principal>());
        // The policy in force when the request arrives: a reload after this leaves it alone.
        let current = self.gate.current();
        match verified {
            Some(principal) => Cow::Owned(current.into_owned().with_principal(principal.clone())),
            None => current,
        }
    }
}

impl ServerHandler for GateServer {
    /// Declares exactly what is answered: `tools` always, `prompts` / `resources` only when a
    /// toolset passes an upstream's through and the policy lets some through (MCP: a client
    /// must not send a request for a capability the server did not declare, and a server that
    /// answers one it did not declare misleads it into listing nothing forever).
    fn get_info(&self) -> ServerConfig {
        let mut capabilities = ServerCapabilities::builder()
            .enable_tools()
            .enable_prompts()
            .enable_resources()
            .enable_completions()
            .enable_logging()
            .build();
        let features = self
            .toolset
            .passthrough()
            .map(Passthrough::features)
            .unwrap_or_default();
        if !self.passes(Kind::Prompts) {
            capabilities.prompts = None;
        }
        if self.passes(Kind::Resources) {
            if let Some(resources) = capabilities.resources.as_mut() {
                resources.subscribe = features.subscribe.then_some(true);
            }
        } else {
            capabilities.resources = None;
        }
        // Completions are of a prompt's or a resource template's arguments: only with one of them.
        let completes = self.passes(Kind::Prompts) || self.passes(Kind::Resources);
        if !(completes && features.completions) {
            capabilities.completions = None;
        }
        if self.toolset.changes().is_some()
            && let Some(tools) = capabilities.tools.as_mut()
        {
            tools.list_changed = Some(true);
        }
        // Decided by the policy alone, like prompts and resources: what is declared stays the
        // same while upstreams come and go. `initialize` sessions do not see it ([`Self::initialize`]).
        if self.passes_tasks() || self.approval_tasks().is_some() {
            capabilities
                .extensions
                .get_or_insert_default()
                .insert(TASKS_EXTENSION_ID.to_owned(), serde_json::Map::new());
        }
        let config = ServerConfig::new(capabilities).with_server_info(self.identity.info.clone());
        match &self.identity.instructions {
            Some(text) => config.with_instructions(text.clone()),
            None => config,
        }
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Borrowed(PROTOCOL_VERSIONS)
    }

    /// The handshake of the `initialize` revisions, less the 2026-07-28 tasks extension: their
    /// sessions stay as they were (2025-11-25's experimental tasks are another protocol, which
    /// the gateway does not pass).
    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, ErrorData> {
        context.peer.set_peer_info(request.clone());
        let mut result = self.negotiate_initialize(&request)?;
        if let Some(extensions) = result.capabilities.extensions.as_mut() {
            extensions.remove(TASKS_EXTENSION_ID);
            if extensions.is_empty() {
                result.capabilities.extensions = None;
            }
        }
        Ok(result)
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        if request.task_id.starts_with(tasks::PREFIX) {
            // Boxed: it walks a corridor, and rmcp's `handle_request` is as large as its
            // largest handler's future, which every request's handling copies (module
            // `corridor`, "Sizes").
            return Box::pin(self.get_approval_task(&request.task_id, &context)).await;
        }
        let (pass, gate) = self.task_pass(&context, &request.task_id)?;
        let caller = caller(&context, (None, None));
        let mut result = pass.get_task(request, caller, gate).await?;
        result.meta = Some(self.meta.clone());
        Ok(result)
    }

    async fn update_task(
        &self,
        request: UpdateTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        if request.task_id.starts_with(tasks::PREFIX) {
            // A task that waits for a person asks the caller nothing.
            return Err(ErrorData::invalid_params(
                format!(
                    "task {} takes no input: it waits for a person's approval",
                    request.task_id
                ),
                None,
            ));
        }
        let (pass, gate) = self.task_pass(&context, &request.task_id)?;
        pass.update_task(request, caller(&context, (None, None)), gate)
            .await
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        if request.task_id.starts_with(tasks::PREFIX) {
            return self.cancel_approval_task(&request.task_id, &context).await;
        }
        let (pass, gate) = self.task_pass(&context, &request.task_id)?;
        pass.cancel_task(request, caller(&context, (None, None)), gate)
            .await
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let gate = self.gate_for(&context);
        let mut result = ListToolsResult::with_all_items(self.visible_tools(&gate));
        if is_modern(&context) {
            // toolgate's own: private and never stale, since what is listed depends on the
            // caller's policy; a kit chooses its own. Legacy revisions have no cache hints, so
            // their sessions get none.
            result = result
                .with_ttl_ms(self.identity.cache_ttl_ms)
                .with_cache_scope(self.identity.cache_scope);
            result.meta = Some(self.meta.clone());
        }
        Ok(result)
    }

    /// A legacy session is open: note its client for the HTTP front door ([`Sessions`]) and tell
    /// it when the tools change (2026-07-28 clients re-list on their own; `ttlMs` is 0).
    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        self.sessions.opened(&context);
        let Some(mut changes) = self.toolset.changes() else {
            return;
        };
        let peer = context.peer;
        tokio::spawn(async move {
            while changes.changed().await.is_ok() {
                if peer.notify_tool_list_changed().await.is_err() {
                    return;
                }
            }
        });
    }

    /// 2026-07-28 clients learn of tool changes on a `subscriptions/listen` stream (the SDK
    /// intersects this with what the client asked for and what `get_info` advertises).
    fn accepted_subscription_filter(
        &self,
        _requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        self.toolset
            .changes()
            .map(|_| SubscriptionFilter::builder().tools_list_changed().build())
    }

    /// Runs until the client ends the stream or the server stops taking calls: a listen stream
    /// is not a call in flight, so it must not hold the end of a session up (a stdio session
    /// whose stdin closed would otherwise wait for rmcp's drain to give up on it).
    async fn listen(&self, context: SubscriptionContext) -> Result<(), ErrorData> {
        let shutdown = self.shutdown.clone();
        let Some(mut changes) = self.toolset.changes() else {
            tokio::select! {
                () = context.cancelled() => {}
                () = shutdown.cancelled() => {}
            }
            return Ok(());
        };
        let sink = context.sink().clone();
        loop {
            tokio::select! {
                () = context.cancelled() => return Ok(()),
                () = shutdown.cancelled() => return Ok(()),
                changed = changes.changed() => {
                    if changed.is_err() || sink.notify_tool_list_changed().await.is_err() {
                        return Ok(());
                    }
                }
            }
        }
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, ErrorData> {
        let Some(pass) = self.passthrough(Kind::Prompts) else {
            return Err(ErrorData::method_not_found::<ListPromptsRequestMethod>());
        };
        let gate = self.gate.current();
        let policy = gate.policy();
        let prompts = pass.prompts().await?;
        let allowed = prompts
            .into_iter()
            .filter(|p| policy.prompt_allowed(&p.name));
        Ok(ListPromptsResult::with_all_items(allowed.collect()))
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, ErrorData> {
        let name = request.name.to_string();
        let allowed = self.gate.current().policy().prompt_allowed(&name);
        if !self.passes(Kind::Prompts) {
            return Err(ErrorData::method_not_found::<GetPromptRequestMethod>());
        }
        let kind = ("prompts/get", "prompt", "passthrough.prompts");
        let gate = self.gate_for(&context);
        let input = (
            request.input_responses.clone(),
            request.request_state.clone(),
        );
        let caller = caller(&context, input);
        let own = gate.clone().into_owned();
        self.pass_through(&gate, kind, name, allowed, move |pass| {
            pass.get_prompt(request, caller, own)
        })
        .await
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let Some(pass) = self.passthrough(Kind::Resources) else {
            return Err(ErrorData::method_not_found::<ListResourcesRequestMethod>());
        };
        let gate = self.gate.current();
        let policy = gate.policy();
        let resources = pass.resources().await?;
        let allowed = resources
            .into_iter()
            .filter(|r| policy.resource_allowed(&r.uri));
        Ok(ListResourcesResult::with_all_items(allowed.collect()))
    }

    /// Templates whose URI template the policy's resource patterns cover.
    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        let Some(pass) = self.passthrough(Kind::Resources) else {
            return Err(ErrorData::method_not_found::<
                ListResourceTemplatesRequestMethod,
            >());
        };
        let gate = self.gate.current();
        let policy = gate.policy();
        let templates = pass.resource_templates().await?;
        let allowed = templates
            .into_iter()
            .filter(|t| policy.resource_allowed(&t.uri_template));
        Ok(ListResourceTemplatesResult::with_all_items(
            allowed.collect(),
        ))
    }

    /// Completion of a prompt's or a template's argument, for what the policy passes.
    async fn complete(
        &self,
        request: CompleteRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, ErrorData> {
        let gate = self.gate.current();
        let policy = gate.policy();
        let (kind, name) = match &request.r#ref {
            Reference::Prompt(prompt) => (Kind::Prompts, prompt.name.clone()),
            Reference::Resource(resource) => (Kind::Resources, resource.uri.clone()),
            _ => return Err(ErrorData::invalid_params("unknown reference type", None)),
        };
        if self.passthrough(kind).is_none() || self.get_info().capabilities.completions.is_none() {
            return Err(ErrorData::method_not_found::<CompleteRequestMethod>());
        }
        let allowed = match kind {
            Kind::Prompts => policy.prompt_allowed(&name),
            Kind::Resources => policy.resource_allowed(&name),
        };
        let what = (
            "completion/complete",
            "reference",
            "passthrough.completions",
        );
        let gate = self.gate_for(&context);
        self.pass_through(&gate, what, name, allowed, move |pass| {
            pass.complete(request)
        })
        .await
    }

    /// Accepted on every server (it declares `logging`); the gateway's upstreams are told, and
    /// their log messages reach the sessions that asked for them.
    async fn set_level(
        &self,
        request: SetLevelRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        match self.toolset.passthrough() {
            Some(pass) => {
                pass.set_level(request, caller(&context, (None, None)))
                    .await
            }
            None => Ok(()),
        }
    }

    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        if !self.passes(Kind::Resources) {
            return Err(ErrorData::method_not_found::<SubscribeRequestMethod>());
        }
        let uri = request.uri.clone();
        let allowed = self.gate.current().policy().resource_allowed(&uri);
        let kind = ("resources/subscribe", "resource", "passthrough.resources");
        let gate = self.gate_for(&context);
        let caller = caller(&context, (None, None));
        self.pass_through(&gate, kind, uri, allowed, move |pass| {
            pass.subscribe(request, caller)
        })
        .await
    }

    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let Some(pass) = self.passthrough(Kind::Resources) else {
            return Err(ErrorData::method_not_found::<UnsubscribeRequestMethod>());
        };
        pass.unsubscribe(request, caller(&context, (None, None)))
            .await
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let uri = request.uri.clone();
        let allowed = self.gate.current().policy().resource_allowed(&uri);
        if !self.passes(Kind::Resources) {
            return Err(ErrorData::method_not_found::<ReadResourceRequestMethod>());
        }
        let kind = ("resources/read", "resource", "passthrough.resources");
        let gate = self.gate_for(&context);
        let input = (
            request.input_responses.clone(),
            request.request_state.clone(),
        );
        let caller = caller(&context, input);
        let own = gate.clone().into_owned();
        self.pass_through(&gate, kind, uri, allowed, move |pass| {
            pass.read_resource(request, caller, own)
        })
        .await
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.visible_tools(&self.gate.current())
            .into_iter()
            .find(|tool| tool.name == name)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        // Boxed: rmcp and tokio move the request's future by value several times on the way to
        // being polled (into the service task, into the task cell), and the corridor's state
        // machine is kilobytes. A pointer moves for free.
        Box::pin(self.serve_call(request, context)).await
    }
}

impl GateServer {
    /// `tools/call`: the corridor, then this server's `_meta` on a modern result.
    async fn serve_call(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let _guard = self.inflight.enter();
        // Counted by the journal: with other calls in flight, records share the writer's syncs.
        let _occupant = self.gate.journal().occupy();
        let arguments = request.arguments.unwrap_or_default();
        let gate = self.gate_for(&context);
        let corridor = Corridor::new(&gate, self.toolset.as_ref(), &request.name);
        let input = (request.input_responses, request.request_state);
        // A caller that takes tasks is not held for a person: a pending call becomes a task.
        let tasks = self.approval_tasks_for(&context);
        let kept = tasks.as_ref().map(|_| arguments.clone());
        let mut call = CallState::new(
            &request.name,
            arguments,
            context.ct.clone(),
            self.shutdown.clone(),
        )
        .with_caller(caller(&context, input), context.meta.get_progress_token());
        if tasks.is_some() {
            call = call.unheld();
        }
        let outcome = corridor.call_for_outcome(call).await;
        if let (Some(store), Some(arguments), Some(approval)) = (&tasks, kept, &outcome.approval_id)
            && outcome.kind == toolgate_core::answer::Kind::Pending
        {
            return self
                .hand_out_task(store, &gate, &request.name, arguments, approval)
                .await;
        }
        let mut result = match outcome.response? {
            CallToolResponse::Complete(result) => result,
            other => return Ok(other),
        };
        if is_modern(&context) {
            // Ours joins what the result carries (the gate's replay and untrusted marks).
            let mut meta = result.meta.take().unwrap_or_default();
            meta.0.extend(self.meta.0.clone());
            result.meta = Some(meta);
            // Results from legacy upstreams have none; 2026-07-28 requires it on every result.
            result.result_type.get_or_insert(ResultType::COMPLETE);
        }
        Ok(CallToolResponse::Complete(result))
    }
}

/// What a toolset may pass through from its upstreams besides tools.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Prompts,
    Resources,
}

impl GateServer {
    /// Whether `kind` is served at all: the toolset passes an upstream's through and the policy
    /// names at least one. The one rule behind both what `get_info` declares and what is answered.
    fn passes(&self, kind: Kind) -> bool {
        self.passthrough(kind).is_some()
    }

    /// Whether the server passes upstream tasks: a toolset with upstreams, and a policy that
    /// passes some upstream's tasks (`[passthrough] tasks`).
    fn passes_tasks(&self) -> bool {
        self.toolset.passthrough().is_some() && self.gate.current().policy().passes_tasks()
    }

    /// Where a `tasks/*` request goes, and the caller's gate. rmcp has answered a request the
    /// server does not declare the extension for, or whose caller did not declare it; a legacy
    /// session, which was never handed a task, gets the answer to an unknown one.
    fn task_pass(
        &self,
        context: &RequestContext<RoleServer>,
        id: &str,
    ) -> Result<(&dyn Passthrough, Gate), ErrorData> {
        let unknown = || ErrorData::invalid_params(format!("unknown task: {id}"), None);
        let pass = self
            .toolset
            .passthrough()
            .filter(|_| is_modern(context))
            .ok_or_else(unknown)?;
        Ok((pass, self.gate_for(context).into_owned()))
    }

    fn passthrough(&self, kind: Kind) -> Option<&dyn Passthrough> {
        let gate = self.gate.current();
        let policy = gate.policy();
        let named = match kind {
            Kind::Prompts => policy.passes_prompts(),
            Kind::Resources => policy.passes_resources(),
        };
        self.toolset.passthrough().filter(|_| named)
    }

    /// One pass-through request (`method` for `name`, a `what` the policy's `rule` names):
    /// refused as not found unless the policy allows it, fetched from the upstream otherwise,
    /// audited either way like a call without arguments, with the upstream named.
    async fn pass_through<'a, T>(
        &'a self,
        gate: &Gate,
        (method, what, rule): (&str, &str, &str),
        name: String,
        allowed: bool,
        fetch: impl FnOnce(&'a dyn Passthrough) -> PassFuture<'a, T>,
    ) -> Result<T, ErrorData> {
        let audit = |decision, outcome| {
            let event = gate.event(&name, &serde_json::Map::new(), decision, outcome, rule);
            let mut event = from_upstream(event, self.toolset.origin(&name).as_deref());
            method.clone_into(&mut event.method);
            gate.record(event)
        };
        let Some(pass) = self.toolset.passthrough().filter(|_| allowed) else {
            // Refused either way; a lost record is logged by `record`.
            let _ = audit(Decision::Deny, Outcome::NotExecuted).await;
            let data = (what == "resource").then(|| serde_json::json!({"uri": name}));
            return Err(ErrorData::invalid_params(
                format!("{what} not found: {name}"),
                data,
            ));
        };
        let result = fetch(pass).await;
        let outcome = if result.is_ok() {
            Outcome::Observed
        } else {
            Outcome::Failed
        };
        if let Err(unavailable) = audit(Decision::Allow, outcome).await {
            return Err(ErrorData::internal_error(unavailable.to_string(), None));
        }
        result
    }
}

/// The client behind `context`, with the answers and state of an `input_required` retry.
fn caller(
    context: &RequestContext<RoleServer>,
    (input_responses, request_state): (Option<InputResponses>, Option<String>),
) -> Caller {
    Caller {
        peer: context.peer.clone(),
        request_id: context.id.clone(),
        modern: is_modern(context),
        capabilities: context.client_capabilities().unwrap_or_default(),
        input_responses,
        request_state,
    }
}

/// Whether this request is served under 2026-07-28 or later (stateless, per-request `_meta`).
fn is_modern(context: &RequestContext<RoleServer>) -> bool {
    // ISO dates compare lexically as they do in time.
    context
        .protocol_version()
        .is_some_and(|v| v.as_str() >= ProtocolVersion::V_2026_07_28.as_str())
}

/// `_meta` naming the server `info`, which 2026-07-28 results SHOULD carry.
fn server_meta(info: &rmcp::model::Implementation) -> MetaObject {
    let mut meta = serde_json::Map::new();
    let info = serde_json::to_value(info).unwrap_or_default();
    meta.insert("io.modelcontextprotocol/serverInfo".to_owned(), info);
    MetaObject::from(meta)
}
