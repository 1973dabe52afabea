//! One upstream MCP server: its connection, kept alive by a supervisor that restarts it with
//! backoff, its last known tools, and the forwarding of one call.
//!
//! Either era: the connection probes `server/discover` and falls back to `initialize`
//! (rmcp's `ClientLifecycleMode::Auto`). A crash or a closed connection marks the upstream
//! unavailable (calls answer so, nothing is forwarded), and calls that were in flight learn that
//! their outcome is unknown. Its tool list stays what it last was, so the caller's view does not
//! flicker while it restarts. Progress from the upstream is routed to the caller that asked for
//! it (`progress.rs`); a caller that cancels (or a timeout) sends `notifications/cancelled`
//! upstream. Requests to an `initialize`-era HTTP upstream take a shorter way than rmcp's client
//! (`post.rs`); rmcp keeps the connection and everything else on it.

#![expect(
    deprecated,
    reason = "MCP 2026-07-28 deprecates logging, sampling, roots and resources/subscribe; the revisions before it, which the gateway passes through, have them"
)]

use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResult, CancelledNotification,
    CancelledNotificationParam, ClientCapabilities, ClientConfig, ClientRequest, ClientResult,
    CreateMessageRequest, CreateMessageRequestParams, CreateMessageResult, ElicitRequest,
    ElicitRequestParams, ElicitResult, ElicitationCapability, ListRootsRequest, ListRootsResult,
    LoggingMessageNotificationParam, ProgressNotificationParam, ProtocolVersion, RequestId,
    RequestMetaObject, ResourceUpdatedNotificationParam, RootsCapabilities, SamplingCapability,
    ServerNotification, ServerRequest, ServerResult, SubscriptionFilter, Tool,
};
use rmcp::service::{
    ClientInitializeError, ClientLifecycleMode, ClientServiceExt, NotificationContext,
    PeerRequestOptions, RequestContext, RunningServiceCancellationToken, ServiceError,
};
use rmcp::transport::async_rw::AsyncRwTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{ClientHandler, ErrorData, Peer, RoleClient};
use serde_json::{Map, Value};
use tokio::io::AsyncBufReadExt;
use tokio::sync::Notify;

use toolgate_core::policy::ClientRequest as Question;

use super::error::{ConnectError, PassError};
use super::held::{Holds, Next, Running};
use super::post::{self, Injected, Posted, Poster};
use super::progress::{self, Routes};
use super::relay::{self, Asker, Input, Relay, Round};
use super::spec::{Target, UpstreamSpec};
use super::wire;
use crate::corridor::Gate;
use crate::lock;
use crate::toolset::CallError;

/// First wait before a restart; doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(250);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// A connection that lived this long resets the backoff.
const HEALTHY_AFTER: Duration = Duration::from_secs(60);
/// Bytes buffered each way on the pipe to an in-process upstream.
const IN_PROCESS_PIPE: usize = 64 * 1024;
/// Bound on connecting (start, discover or initialize, first tools/list).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// One upstream and its supervisor's view of it.
#[derive(Debug)]
pub struct Upstream {
    spec: UpstreamSpec,
    peer: Mutex<Option<Peer<RoleClient>>>,
    /// The short way of requests over HTTP (`post.rs`), for the live connection.
    poster: Mutex<Option<Arc<Poster>>>,
    /// Ends the live connection (the supervisor then opens a new one).
    ending: Mutex<Option<Ending>>,
    tools: Arc<RwLock<Arc<Vec<Tool>>>>,
    /// Why it is not connected, for the answer a call gets meanwhile.
    down_because: Mutex<String>,
    routes: Arc<Routes>,
    /// Told whenever this upstream's tools may have changed.
    changed: Arc<Notify>,
    /// Set once the first connection attempt has ended, either way.
    tried: tokio::sync::watch::Sender<bool>,
    /// It answered discover with only `initialize` revisions: use `initialize` from now on.
    legacy_only: AtomicBool,
    /// Its requests of the caller, and the sessions that listen to it.
    relay: Arc<Relay>,
    /// The gateway's gate: what may be asked of callers, and the redaction of what it says.
    gate: Option<Gate>,
}

impl Upstream {
    pub(super) fn new(spec: UpstreamSpec, changed: Arc<Notify>, gate: Option<Gate>) -> Arc<Self> {
        Arc::new(Self {
            relay: Arc::default(),
            gate,
            spec,
            peer: Mutex::new(None),
            poster: Mutex::new(None),
            ending: Mutex::new(None),
            tools: Arc::new(RwLock::new(Arc::new(Vec::new()))),
            down_because: Mutex::new("not connected yet".to_owned()),
            routes: Arc::default(),
            changed,
            tried: tokio::sync::watch::channel(false).0,
            legacy_only: AtomicBool::new(false),
        })
    }

    /// Its name, as [`UpstreamSpec::name`] gives it.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// The tools it offered last.
    #[must_use]
    pub fn tools(&self) -> Arc<Vec<Tool>> {
        Arc::clone(&self.tools.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// Whether it is connected now.
    #[must_use]
    pub fn connected(&self) -> bool {
        lock(&self.peer).is_some()
    }

    /// The live connection, or why there is none.
    pub(super) fn peer(&self) -> Result<Peer<RoleClient>, PassError> {
        lock(&self.peer)
            .clone()
            .ok_or_else(|| PassError::NotConnected {
                upstream: self.spec.name.clone(),
                why: lock(&self.down_because).clone(),
            })
    }

    /// Waits until the first connection attempt has ended (connected or failed), at most `limit`.
    pub async fn first_attempt(&self, limit: Duration) {
        let mut tried = self.tried.subscribe();
        let _ = tokio::time::timeout(limit, tried.wait_for(|t| *t)).await;
    }

    /// Connects once, reads the tools and disconnects (for `toolgate pin`).
    ///
    /// # Errors
    /// The upstream could not be started, did not complete the handshake or tools/list.
    pub async fn probe(spec: UpstreamSpec) -> Result<Vec<Tool>, ConnectError> {
        let upstream = Self::new(spec, Arc::new(Notify::new()), None);
        let service = tokio::time::timeout(CONNECT_TIMEOUT, upstream.connect())
            .await
            .map_err(|_| ConnectError::Timeout(CONNECT_TIMEOUT))??;
        let _ = service.cancel().await;
        Ok(upstream.tools().as_ref().clone())
    }

    /// Keeps the upstream connected for as long as the returned task runs.
    pub(super) fn supervise(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let upstream = Arc::clone(self);
        tokio::spawn(async move { upstream.run().await })
    }

    async fn run(&self) {
        let mut backoff = FIRST_BACKOFF;
        loop {
            let started = tokio::time::Instant::now();
            match tokio::time::timeout(CONNECT_TIMEOUT, self.connect()).await {
                Ok(Ok(service)) => {
                    let peer = service.peer().clone();
                    let version = peer
                        .peer_info()
                        .map(|info| info.protocol_version.to_string());
                    tracing::info!(upstream = %self.spec.name, protocol = ?version, tools = self.tools().len(), "upstream connected");
                    let listener =
                        listen_for_changes(&peer, &self.tools, &self.changed, &self.spec.name);
                    *lock(&self.peer) = Some(peer);
                    *lock(&self.ending) = Some(Ending(service.cancellation_token()));
                    self.tried.send_replace(true);
                    self.changed.notify_one();
                    let quit = service.waiting().await;
                    if let Some(listener) = listener {
                        listener.abort();
                    }
                    *lock(&self.peer) = None;
                    *lock(&self.poster) = None;
                    *lock(&self.ending) = None;
                    let why = format!("its connection ended ({quit:?})");
                    tracing::warn!(upstream = %self.spec.name, reason = %why, "upstream gone; restarting");
                    *lock(&self.down_because) = why;
                    if started.elapsed() >= HEALTHY_AFTER {
                        backoff = FIRST_BACKOFF;
                    }
                }
                Ok(Err(why)) => {
                    tracing::error!(upstream = %self.spec.name, error = %why, retry_in_ms = backoff.as_millis(), "upstream did not connect");
                    *lock(&self.down_because) = why.to_string();
                    self.tried.send_replace(true);
                }
                Err(_) => {
                    let why = ConnectError::Timeout(CONNECT_TIMEOUT);
                    tracing::error!(upstream = %self.spec.name, error = %why, "upstream did not connect");
                    *lock(&self.down_because) = why.to_string();
                    self.tried.send_replace(true);
                }
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    /// Starts (or dials) the upstream, agrees on a protocol era and reads its tools.
    ///
    /// Era: `server/discover` first, falling back to `initialize` (rmcp's Auto mode). An upstream
    /// whose discover answer lists only `initialize` revisions (an rmcp server narrowed to them
    /// answers so, with -32022) is started again at once and spoken to with `initialize`; it is
    /// remembered, so restarts go straight there.
    async fn connect(
        &self,
    ) -> Result<rmcp::service::RunningService<RoleClient, Handler>, ConnectError> {
        let service = if self.legacy_only.load(Ordering::Relaxed) {
            self.handshake(ClientLifecycleMode::Initialize).await
        } else {
            let auto = ClientLifecycleMode::Auto {
                preferred_versions: vec![ProtocolVersion::V_2026_07_28],
                legacy_version: Some(ProtocolVersion::V_2025_11_25),
            };
            match self.handshake(auto).await {
                Err(ConnectError::Handshake(error)) if legacy_only(&error) => {
                    tracing::info!(upstream = %self.spec.name, "upstream speaks only initialize revisions; reconnecting with initialize");
                    self.legacy_only.store(true, Ordering::Relaxed);
                    self.handshake(ClientLifecycleMode::Initialize).await
                }
                other => other,
            }
        };
        let service = service?;
        let tools = service
            .peer()
            .list_all_tools()
            .await
            .map_err(ConnectError::ListTools)?;
        *self.tools.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(tools);
        Ok(service)
    }

    /// Opens the transport and runs the MCP handshake in `lifecycle`.
    async fn handshake(
        &self,
        lifecycle: ClientLifecycleMode,
    ) -> Result<rmcp::service::RunningService<RoleClient, Handler>, ConnectError> {
        let handler = Handler {
            upstream: self.spec.name.clone(),
            tools: Arc::clone(&self.tools),
            routes: Arc::clone(&self.routes),
            changed: Arc::clone(&self.changed),
            relay: Arc::clone(&self.relay),
            gate: self.gate.clone(),
        };
        match &self.spec.target {
            Target::Command {
                program,
                args,
                env,
                cwd,
            } => {
                let mut command = tokio::process::Command::new(program);
                command.args(args).envs(env).kill_on_drop(true);
                if let Some(cwd) = cwd {
                    command.current_dir(cwd);
                }
                let (transport, stderr) = TokioChildProcess::builder(command)
                    .stderr(Stdio::piped())
                    .spawn()
                    .map_err(|error| ConnectError::Start {
                        program: program.clone(),
                        error,
                    })?;
                if let Some(stderr) = stderr {
                    relay_stderr(self.spec.name.clone(), stderr);
                }
                self.serve_over(handler, transport, None, lifecycle).await
            }
            Target::InProcess(server) => {
                let (ours, theirs) = tokio::io::duplex(IN_PROCESS_PIPE);
                server.start(theirs);
                let (read, write) = tokio::io::split(ours);
                let transport = AsyncRwTransport::new_client(read, write);
                self.serve_over(handler, transport, None, lifecycle).await
            }
            Target::Http {
                url,
                bearer_env,
                bearer,
            } => {
                crate::install_tls_provider();
                let mut config = StreamableHttpClientTransportConfig::with_uri(url.as_str());
                // The upstream's own credential, read by whoever started the gateway; never
                // anything a caller of the gateway presented. One that is named but missing
                // stops the connection rather than calling without it.
                match (bearer, bearer_env) {
                    (Some(token), _) => config = config.auth_header(token.expose()),
                    (None, Some(var)) => return Err(ConnectError::NoToken { var: var.clone() }),
                    (None, None) => {}
                }
                let endpoint =
                    reqwest::Url::parse(url).map_err(|e| ConnectError::Url(e.to_string()))?;
                let client = http_client(&endpoint).map_err(ConnectError::Client)?;
                let (client, poster, injected) = Poster::new(client, endpoint);
                let transport = StreamableHttpClientTransport::with_client(client, config);
                let service = self
                    .serve_over(handler, transport, Some(injected), lifecycle)
                    .await?;
                *lock(&self.poster) = Some(Arc::new(poster));
                Ok(service)
            }
        }
    }

    /// The MCP handshake over `transport`, its progress queued for the calls in arrival order
    /// and `injected` (what the short way read for rmcp, `post.rs`) handed to rmcp before it.
    async fn serve_over<T>(
        &self,
        handler: Handler,
        transport: T,
        injected: Option<Injected>,
        lifecycle: ClientLifecycleMode,
    ) -> Result<rmcp::service::RunningService<RoleClient, Handler>, ConnectError>
    where
        T: rmcp::transport::Transport<RoleClient> + Send + 'static,
        T::Error: std::error::Error + Send + Sync + 'static,
    {
        let transport = progress::Queued::new(transport, Arc::clone(&self.routes), injected);
        handler
            .serve_with_lifecycle(transport, lifecycle)
            .await
            .map_err(|e| ConnectError::Handshake(Box::new(e)))
    }

    /// Forwards one call. `read_only`: the tool says it changes nothing, so losing the
    /// connection mid-call is a plain failure rather than an unknown outcome. With an `asker`,
    /// the upstream's questions go to that caller ([`Relay::drive`]).
    pub(super) async fn call(
        self: &Arc<Self>,
        tool: &str,
        arguments: Map<String, Value>,
        progress: Option<progress::Target>,
        read_only: bool,
        asker: Option<&Asker>,
    ) -> Result<Round<CallToolResult>, CallError> {
        if let Some(asker) = asker
            && asker.caller.modern
            && !self.peer().is_ok_and(|p| speaks_modern(&p))
        {
            return self
                .call_held(tool, arguments, progress, read_only, asker)
                .await;
        }
        let once = |input: Input| {
            let arguments = arguments.clone();
            let progress = progress.clone();
            async move {
                let mut params =
                    CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments);
                params.input_responses = input.0;
                params.request_state = input.1;
                let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
                match self.send(request, asker, progress, read_only).await? {
                    ServerResult::CallToolResult(result) => Ok(Round::Done(result)),
                    ServerResult::InputRequiredResult(asks) => Ok(Round::Asks(asks)),
                    // Offered only to a caller that declared the tasks extension ([`relay::offered`]);
                    // the gateway registers it before it goes out (`tasks.rs`).
                    ServerResult::CreateTaskResult(task) => Err(CallError::Task(Box::new(task))),
                    _ => Err(CallError::Failed(format!(
                        "upstream {} answered tools/call with something else",
                        self.spec.name
                    ))),
                }
            }
        };
        match asker {
            Some(asker) => self.relay.drive(&self.spec.name, asker, once).await,
            None => once((None, None)).await,
        }
    }

    /// A call of a 2026-07-28 caller to an `initialize`-era upstream, whose questions are
    /// asked by request mid-call: the call runs on a task of its own and is held open across
    /// the caller's `input_required` round trips (`held.rs`).
    async fn call_held(
        self: &Arc<Self>,
        tool: &str,
        arguments: Map<String, Value>,
        progress: Option<progress::Target>,
        read_only: bool,
        asker: &Asker,
    ) -> Result<Round<CallToolResult>, CallError> {
        let holds = &self.relay.holds;
        let next = match Holds::names(asker.caller.request_state.as_deref()) {
            Some(name) => {
                let responses = asker.caller.input_responses.as_ref();
                holds.resume(name, responses, asker).await?
            }
            None => {
                let (questions, asked) = tokio::sync::mpsc::channel(1);
                let mut parked = asker.clone();
                parked.questions = Some(questions);
                let params = CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments);
                let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
                let upstream = Arc::clone(self);
                let task = tokio::spawn(async move {
                    upstream
                        .send(request, Some(&parked), progress, read_only)
                        .await
                });
                let running = Running {
                    task,
                    questions: asked,
                };
                holds.wait(running, asker).await
            }
        };
        match next {
            Next::Done(done) => match *done {
                Ok(ServerResult::CallToolResult(result)) => Ok(Round::Done(result)),
                Ok(_) => Err(CallError::Failed(format!(
                    "upstream {} answered tools/call with something else",
                    self.spec.name
                ))),
                Err(error) => Err(error),
            },
            Next::Asks(asks) => Ok(Round::Asks(*asks)),
        }
    }

    /// A request other than `tools/call` (prompts, resources, completion, logging,
    /// subscriptions), answered with the upstream's result or its own error, redacted.
    pub(super) async fn request(
        &self,
        request: ClientRequest,
        asker: Option<&Asker>,
    ) -> Result<ServerResult, ErrorData> {
        self.send(request, asker, None, true)
            .await
            .map_err(|error| match error {
                CallError::Rejected(error) => error,
                other => ErrorData::internal_error(other.to_string(), None),
            })
    }

    /// A request with `input_responses`/`request_state` that may be answered `input_required`,
    /// sent until done, the questions going to `asker` ([`Relay::drive`]).
    pub(super) async fn request_with_input<T>(
        &self,
        asker: &Asker,
        build: impl Fn(Input) -> ClientRequest,
        done: impl Fn(ServerResult) -> Option<T>,
    ) -> Result<Round<T>, ErrorData> {
        let once = |input: Input| {
            let request = build(input);
            let done = &done;
            async move {
                match self.request(request, Some(asker)).await? {
                    ServerResult::InputRequiredResult(asks) => Ok(Round::Asks(asks)),
                    other => done(other).map(Round::Done).ok_or_else(|| {
                        ErrorData::internal_error(
                            format!("upstream {} answered with something else", self.spec.name),
                            None,
                        )
                    }),
                }
            }
        };
        self.relay.drive(&self.spec.name, asker, once).await
    }

    /// Sends one request and waits for its answer: the caller's capabilities (as the policy
    /// lets them through) in a 2026-07-28 request's `_meta`, its progress routed back, its
    /// questions related to it, and a cancellation sent upstream if the wait is abandoned.
    async fn send(
        &self,
        mut request: ClientRequest,
        asker: Option<&Asker>,
        progress: Option<progress::Target>,
        read_only: bool,
    ) -> Result<ServerResult, CallError> {
        let Some(peer) = lock(&self.peer).clone() else {
            let why = lock(&self.down_because).clone();
            return Err(CallError::Unavailable(format!(
                "upstream {} is not connected ({why}); nothing was sent",
                self.spec.name
            )));
        };
        let poster = lock(&self.poster).clone();
        if let Some(poster) = poster
            && poster.ready()
            && !speaks_modern(&peer)
        {
            let posted = self
                .send_posted(&poster, peer.clone(), &mut request, asker, progress.clone())
                .await;
            match posted {
                Posted::Answered(answer) => {
                    return (*answer).map_err(|error| CallError::Rejected(self.redacted(error)));
                }
                Posted::NotSent(why) => return Err(self.not_sent(&why)),
                Posted::Lost(why) => return Err(self.lost(&why, read_only)),
                Posted::SessionEnded(why) => {
                    tracing::warn!(upstream = %self.spec.name, reason = %why, "upstream refused its session; reconnecting");
                    if let Some(Ending(ending)) = lock(&self.ending).take() {
                        ending.cancel();
                    }
                    return Err(CallError::Unavailable(format!(
                        "upstream {} no longer knows the gateway's session ({why}); nothing ran; the gateway reconnects",
                        self.spec.name
                    )));
                }
                Posted::NotReady => {}
            }
        }
        let mut options = PeerRequestOptions::no_options();
        if let Some(asker) = asker
            && speaks_modern(&peer)
        {
            let offered = relay::offered(&asker.gate, &self.spec.name, &asker.caller);
            let mut meta = RequestMetaObject::new();
            meta.set_client_capabilities(offered);
            // 2026-07-28 has no logging/setLevel: the level a legacy session set travels here.
            if let Some(level) = self.relay.level_of(&asker.caller.peer) {
                meta.0.insert(LOG_LEVEL_META.to_owned(), level);
            }
            options.meta = Some(meta);
        }
        let handle = peer
            .send_cancellable_request(request, options)
            .await
            .map_err(|e| self.not_sent(&e.to_string()))?;
        let route = self
            .routes
            .register(handle.progress_token.clone(), progress)
            .await;
        let _waiting = asker.map(|asker| self.relay.wait(handle.id.clone(), asker.clone()));
        let mut cancel = CancelOnDrop {
            peer: Some(peer),
            id: handle.id.clone(),
        };
        let response = handle.await_response().await;
        cancel.peer = None;
        route.finish().await;
        match response {
            Ok(result) => Ok(result),
            Err(ServiceError::McpError(error)) => Err(CallError::Rejected(self.redacted(error))),
            Err(error) => Err(self.lost(&error.to_string(), read_only)),
        }
    }

    /// [`Self::send`] the short way (`post.rs`): the same routes for progress and questions,
    /// and the same cancellation if the wait is abandoned, under an id of the short way's own.
    async fn send_posted(
        &self,
        poster: &Poster,
        peer: Peer<RoleClient>,
        request: &mut ClientRequest,
        asker: Option<&Asker>,
        progress: Option<progress::Target>,
    ) -> Posted {
        let id = poster.next_id();
        let route = self
            .routes
            .register(post::progress_token(&id), progress)
            .await;
        let _waiting = asker.map(|asker| self.relay.wait(id.clone(), asker.clone()));
        let mut cancel = CancelOnDrop {
            peer: Some(peer),
            id: id.clone(),
        };
        let posted = poster.post(&id, request, &self.routes).await;
        cancel.peer = None;
        route.finish().await;
        posted
    }

    /// A request that never reached the upstream.
    fn not_sent(&self, why: &str) -> CallError {
        CallError::Unavailable(format!(
            "upstream {} did not take the request ({why}); nothing was sent",
            self.spec.name
        ))
    }

    /// A request that was sent and got no answer: a plain failure if it changes nothing, else
    /// an unknown outcome.
    fn lost(&self, why: &str, read_only: bool) -> CallError {
        if read_only {
            CallError::Failed(format!(
                "upstream {} was lost mid-call ({why})",
                self.spec.name
            ))
        } else {
            CallError::InDoubt(format!(
                "upstream {} was lost after the call was sent ({why})",
                self.spec.name
            ))
        }
    }

    /// The upstream's own error, its message and data redacted.
    fn redacted(&self, mut error: ErrorData) -> ErrorData {
        if let Some(gate) = &self.gate {
            let redactor = gate.redactor();
            error.message = redactor.redact(&error.message).into_owned().into();
            error.data = error.data.as_ref().map(|d| redactor.redact_value(d));
        }
        error
    }

    /// Who waits on the upstream and who listens to it.
    pub(super) fn relay(&self) -> &Relay {
        &self.relay
    }

    /// Whether the live connection speaks 2026-07-28.
    pub(super) fn speaks_modern(&self) -> bool {
        self.peer().is_ok_and(|p| speaks_modern(&p))
    }

    /// Follows `uri` on a 2026-07-28 upstream, which has no `resources/subscribe`: a
    /// `subscriptions/listen` stream for it, whose updates go to the sessions subscribed.
    ///
    /// # Errors
    /// The upstream is not connected, or refused the stream.
    pub(super) async fn follow(&self, uri: String) -> Result<(), ErrorData> {
        let peer = self.peer()?;
        let filter = SubscriptionFilter::builder()
            .resource_subscription(uri.clone())
            .build();
        let mut subscription = peer.listen(filter).await.map_err(|error| match error {
            ServiceError::McpError(error) => self.redacted(error),
            other => ErrorData::internal_error(
                format!("upstream {}: subscriptions/listen: {other}", self.spec.name),
                None,
            ),
        })?;
        let relay = Arc::clone(&self.relay);
        let stream = tokio::spawn(async move {
            while let Ok(Some(notification)) = subscription.next().await {
                if let ServerNotification::ResourceUpdatedNotification(updated) = notification {
                    relay.updated(updated.params).await;
                }
            }
        });
        self.relay.follow(uri, stream);
        Ok(())
    }

    /// What the upstream declared it offers, once connected.
    pub(super) fn capabilities(&self) -> Option<rmcp::model::ServerCapabilities> {
        lock(&self.peer)
            .as_ref()
            .and_then(Peer::peer_info)
            .map(|info| info.capabilities.clone())
    }
}

/// The `_meta` key of a 2026-07-28 request's log level.
const LOG_LEVEL_META: &str = "io.modelcontextprotocol/logLevel";

/// Whether the connection speaks 2026-07-28 (per-request `_meta` carries the caller's
/// capabilities).
fn speaks_modern(peer: &Peer<RoleClient>) -> bool {
    peer.peer_info().is_some_and(|info| {
        info.protocol_version.as_str() >= ProtocolVersion::V_2026_07_28.as_str()
    })
}

/// What the gateway answers an upstream with: who it is, what its callers may be asked, and
/// the notifications it acts on.
#[derive(Debug)]
struct Handler {
    upstream: String,
    tools: Arc<RwLock<Arc<Vec<Tool>>>>,
    routes: Arc<Routes>,
    changed: Arc<Notify>,
    relay: Arc<Relay>,
    gate: Option<Gate>,
}

impl Handler {
    /// Passes one of the upstream's requests to the caller it belongs to.
    async fn ask(
        &self,
        kind: Question,
        request: ServerRequest,
        context: &RequestContext<RoleClient>,
    ) -> Result<ClientResult, ErrorData> {
        self.relay
            .ask(&self.upstream, kind, request, &context.extensions)
            .await
    }
}

/// The answer the caller gave was not the kind asked for.
fn mismatched(method: &str) -> ErrorData {
    ErrorData::internal_error(
        format!("{method}: the caller answered with something else"),
        None,
    )
}

impl ClientHandler for Handler {
    /// On an `initialize` session the capabilities are declared once for every caller: each
    /// kind the policy passes from this upstream (a caller that cannot answer one is refused
    /// when it is asked). A 2026-07-28 request carries its own caller's.
    fn get_info(&self) -> ClientConfig {
        let mut capabilities = ClientCapabilities::default();
        if let Some(gate) = &self.gate {
            let gate = gate.current();
            let policy = gate.policy();
            if policy.passes_request(Question::Sampling, &self.upstream) {
                capabilities.sampling = Some(SamplingCapability::default());
            }
            if policy.passes_request(Question::Elicitation, &self.upstream) {
                capabilities.elicitation = Some(ElicitationCapability::default());
            }
            if policy.passes_request(Question::Roots, &self.upstream) {
                capabilities.roots = Some(RootsCapabilities::default());
            }
        }
        ClientConfig::new(capabilities, crate::implementation())
    }

    async fn create_message(
        &self,
        params: CreateMessageRequestParams,
        context: RequestContext<RoleClient>,
    ) -> Result<CreateMessageResult, ErrorData> {
        let request = ServerRequest::CreateMessageRequest(CreateMessageRequest::new(params));
        match self.ask(Question::Sampling, request, &context).await? {
            ClientResult::CreateMessageResult(result) => Ok(*result),
            _ => Err(mismatched("sampling/createMessage")),
        }
    }

    async fn create_elicitation(
        &self,
        params: ElicitRequestParams,
        context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        let request = ServerRequest::ElicitRequest(ElicitRequest::new(params));
        match self.ask(Question::Elicitation, request, &context).await? {
            ClientResult::ElicitResult(result) => Ok(result),
            _ => Err(mismatched("elicitation/create")),
        }
    }

    async fn list_roots(
        &self,
        context: RequestContext<RoleClient>,
    ) -> Result<ListRootsResult, ErrorData> {
        let request = ServerRequest::ListRootsRequest(ListRootsRequest::default());
        match self.ask(Question::Roots, request, &context).await? {
            ClientResult::ListRootsResult(result) => Ok(result),
            _ => Err(mismatched("roots/list")),
        }
    }

    async fn on_logging_message(
        &self,
        params: LoggingMessageNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        if let Some(gate) = &self.gate {
            self.relay.log(params, gate).await;
        }
    }

    async fn on_resource_updated(
        &self,
        params: ResourceUpdatedNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.relay.updated(params).await;
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.routes.flush(&params.progress_token).await;
    }

    async fn on_tool_list_changed(&self, context: NotificationContext<RoleClient>) {
        // Re-read on a task of its own: a request awaited inside a notification handler could
        // wait on the very loop that delivers its answer.
        tokio::spawn(reread(
            context.peer,
            Arc::clone(&self.tools),
            Arc::clone(&self.changed),
            self.upstream.clone(),
        ));
    }
}

/// Reads an upstream's tools again after it said they changed, and says so to the gateway.
async fn reread(
    peer: Peer<RoleClient>,
    tools: Arc<RwLock<Arc<Vec<Tool>>>>,
    changed: Arc<Notify>,
    upstream: String,
) {
    match peer.list_all_tools().await {
        Ok(list) => {
            tracing::info!(upstream = %upstream, tools = list.len(), "upstream tool list changed; re-read");
            *tools.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(list);
            changed.notify_one();
        }
        Err(error) => {
            tracing::error!(upstream = %upstream, error = %error, "tools/list after list_changed failed");
        }
    }
}

/// A 2026-07-28 upstream announces tool changes only on a `subscriptions/listen` stream: open
/// one when it advertises `tools.listChanged`, for as long as the connection lives.
fn listen_for_changes(
    peer: &Peer<RoleClient>,
    tools: &Arc<RwLock<Arc<Vec<Tool>>>>,
    changed: &Arc<Notify>,
    upstream: &str,
) -> Option<tokio::task::JoinHandle<()>> {
    let info = peer.peer_info()?;
    let modern = info.protocol_version.as_str() >= ProtocolVersion::V_2026_07_28.as_str();
    let announces = info
        .capabilities
        .tools
        .as_ref()
        .and_then(|t| t.list_changed)
        .unwrap_or(false);
    if !(modern && announces) {
        return None;
    }
    let (peer, tools, changed, upstream) = (
        peer.clone(),
        Arc::clone(tools),
        Arc::clone(changed),
        upstream.to_owned(),
    );
    Some(tokio::spawn(async move {
        let filter = SubscriptionFilter::builder().tools_list_changed().build();
        let mut subscription = match peer.listen(filter).await {
            Ok(subscription) => subscription,
            Err(error) => {
                tracing::warn!(upstream = %upstream, error = %error, "subscriptions/listen refused; tool changes are seen at restart only");
                return;
            }
        };
        while let Ok(Some(notification)) = subscription.next().await {
            if matches!(
                notification,
                ServerNotification::ToolListChangedNotification(_)
            ) {
                reread(
                    peer.clone(),
                    Arc::clone(&tools),
                    Arc::clone(&changed),
                    upstream.clone(),
                )
                .await;
            }
        }
    }))
}

/// What ends a live connection.
struct Ending(RunningServiceCancellationToken);

impl std::fmt::Debug for Ending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Ending")
    }
}

/// Tells the upstream a call was abandoned (the caller cancelled, or its timeout passed).
struct CancelOnDrop {
    peer: Option<Peer<RoleClient>>,
    id: RequestId,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        let Some(peer) = self.peer.take() else {
            return;
        };
        let notification = CancelledNotification::new(CancelledNotificationParam::new(
            Some(self.id.clone()),
            Some("cancelled by the gateway's caller".to_owned()),
        ));
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = peer.send_notification(notification.into()).await;
            });
        }
    }
}

/// How long a connection to an HTTP upstream stays open unused before the gateway closes it:
/// below the 5 s after which Node's `http` server and uvicorn close an idle keep-alive
/// connection, so that the gateway, not the server, closes it, and a request is never written
/// to a connection the server is closing at that moment.
pub(super) const IDLE_CONNECTION: Duration = Duration::from_secs(2);

/// The HTTP client of one upstream connection: it keeps its connections open between requests.
/// rmcp's default client keeps none, so that each POST of a call (and each reply) opened a new
/// TCP connection, which both the gateway and the upstream paid for on every call. Redirects
/// are followed as rmcp's default client follows them: only 307 and 308 (which keep the method
/// and body) to the same origin (so the session id and the upstream's token go nowhere else),
/// at most [`MAX_REDIRECTS`]. An endpoint on this machine is reached without a proxy, as the short
/// way reaches it (`wire.rs`).
pub(super) fn http_client(endpoint: &reqwest::Url) -> reqwest::Result<reqwest::Client> {
    let redirects = reqwest::redirect::Policy::custom(|attempt| {
        let keeps_body = matches!(
            attempt.status(),
            reqwest::StatusCode::TEMPORARY_REDIRECT | reqwest::StatusCode::PERMANENT_REDIRECT
        );
        let same_origin = attempt
            .previous()
            .first()
            .is_some_and(|first| first.origin() == attempt.url().origin());
        if !keeps_body || !same_origin {
            attempt.stop()
        } else if attempt.previous().len() > MAX_REDIRECTS {
            attempt.error(format!("more than {MAX_REDIRECTS} redirects"))
        } else {
            attempt.follow()
        }
    });
    let builder = reqwest::Client::builder()
        .pool_idle_timeout(IDLE_CONNECTION)
        .tcp_nodelay(true)
        .redirect(redirects);
    if wire::direct(endpoint) {
        builder.no_proxy().build()
    } else {
        builder.build()
    }
}

/// Redirects one upstream request may follow.
const MAX_REDIRECTS: usize = 10;

/// Whether a failed discover means "this server speaks only `initialize` revisions".
fn legacy_only(error: &ClientInitializeError) -> bool {
    match error {
        ClientInitializeError::NoCompatibleProtocolVersion {
            server_supported, ..
        } => {
            !server_supported.is_empty()
                && server_supported.iter().all(ProtocolVersion::has_initialize)
        }
        _ => false,
    }
}

/// The upstream's stderr, line by line, into our own (redacting) log.
fn relay_stderr(upstream: String, stderr: tokio::process::ChildStderr) {
    tokio::spawn(async move {
        let mut lines = tokio::io::BufReader::new(stderr).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            tracing::info!(upstream = %upstream, "upstream stderr: {line}");
        }
    });
}

#[cfg(test)]
mod tests {
    use toolgate_core::secret::Secret;

    use super::*;

    fn http(bearer_env: Option<&str>) -> UpstreamSpec {
        UpstreamSpec {
            name: "up".to_owned(),
            target: Target::Http {
                // Nothing listens on port 1 of this machine.
                url: "http://127.0.0.1:1/mcp".to_owned(),
                bearer_env: bearer_env.map(str::to_owned),
                bearer: None,
            },
        }
    }

    /// The token comes from whoever built the spec, never from the environment: `PATH` is set
    /// wherever tests run, and a library that read it would have sent it as the credential.
    #[tokio::test]
    async fn a_named_token_that_was_not_given_stops_the_connection_before_it_is_tried() {
        let error = Upstream::probe(http(Some("PATH")))
            .await
            .expect_err("no token was given");
        assert!(
            matches!(&error, ConnectError::NoToken { var } if var == "PATH"),
            "{error}"
        );
    }

    /// With the token given, the connection is tried (and fails here: nothing listens).
    #[tokio::test]
    async fn a_given_token_lets_the_connection_be_tried() {
        let spec = http(Some("PATH")).with_bearer(Secret::new("t0ken"));
        let error = Upstream::probe(spec).await.expect_err("nothing listens");
        assert!(matches!(error, ConnectError::Handshake(_)), "{error}");
        assert!(!error.to_string().contains("t0ken"), "{error}");
    }
}
