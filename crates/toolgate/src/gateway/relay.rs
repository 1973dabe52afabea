//! What an upstream asks of the caller, and what it tells it: the way back through the gateway.
//!
//! An upstream may need the caller during a request: its model (`sampling/createMessage`), its
//! user (`elicitation/create`) or its roots (`roots/list`). Two eras carry these differently: an
//! `initialize` session sends them as requests of its own while the call is open; 2026-07-28
//! answers the call `input_required` with the questions, and the caller calls again with the
//! answers and the upstream's `requestState`. Each question goes to the caller whose request caused
//! it (the upstream request it arrived in relation to, SEP-2260, or the only one in flight), in the
//! caller's own era: passed as it came when both speak the same, and translated when they do not
//! (a legacy caller is asked each question by request and the upstream called again with the
//! answers, [`Relay::drive`]). The policy decides per upstream and per kind whether a question
//! passes (`[passthrough] sampling / elicitation / roots`), and each one passed or refused is
//! audited with the call it belongs to.
//!
//! The upstream's log messages and resource updates go the other way, to the sessions that asked
//! for them (`logging/setLevel`, `resources/subscribe`), redacted.

#![expect(
    deprecated,
    reason = "MCP 2026-07-28 deprecates logging, sampling, roots and resources/subscribe; the revisions before it, which the gateway passes through, have them"
)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rmcp::model::{
    ClientCapabilities, ClientResult, Extensions, GetExtensions, InputRequest, InputRequiredResult,
    InputResponses, LoggingMessageNotificationParam, RequestId, ResourceUpdatedNotificationParam,
    ServerRequest,
};
use rmcp::service::{InboundStreamOrigin, OriginatingRequestId, ServiceError};
use rmcp::{ErrorData, Peer, RoleServer};
use serde_json::{Map, Value};
use toolgate_core::audit::{Decision, Outcome};
use toolgate_core::policy::ClientRequest;

use tokio::sync::{mpsc, oneshot};

use super::held::{Holds, Question};
use crate::corridor::{Gate, from_upstream};
use crate::lock;
use crate::toolset::Caller;

/// At most this many `input_required` rounds are answered for a legacy caller before the
/// gateway gives up on the request (rmcp's client stops at the same count).
const MAX_ROUNDS: usize = 10;

/// The caller of one request forwarded upstream, as its questions need it.
#[derive(Clone, Debug)]
pub(crate) struct Asker {
    pub(crate) caller: Caller,
    /// The caller's gate: its policy decides, its principal is audited.
    pub(crate) gate: Gate,
    /// What the request is about (the tool, prompt or resource), for the audit records.
    pub(crate) name: String,
    /// For a 2026-07-28 caller of an `initialize`-era upstream: where the upstream's questions
    /// are parked until the caller comes back with the answer (`held.rs`).
    pub(crate) questions: Option<mpsc::Sender<Question>>,
}

/// One answer of an upstream to a request that may ask the caller for input first.
#[derive(Debug)]
pub(super) enum Round<T> {
    Done(T),
    Asks(InputRequiredResult),
}

/// The answers and state a request is sent upstream with (empty on a first round).
pub(super) type Input = (Option<InputResponses>, Option<String>);

/// Per upstream: who is waiting on which of its requests, and who listens to it.
#[derive(Debug, Default)]
pub(super) struct Relay {
    /// Upstream request id → the caller whose request it is.
    askers: Mutex<HashMap<RequestId, Asker>>,
    /// Sessions that asked for log messages (`logging/setLevel`), with the level they set (as
    /// MCP spells it), which a 2026-07-28 upstream is told on each of their requests.
    listeners: Mutex<Vec<(Peer<RoleServer>, Value)>>,
    /// Resource URI → the sessions subscribed to it.
    subscribers: Mutex<HashMap<String, Vec<Peer<RoleServer>>>>,
    /// Resource URI → the `subscriptions/listen` stream that follows it on a 2026-07-28
    /// upstream (which has no `resources/subscribe`).
    streams: Mutex<HashMap<String, tokio::task::JoinHandle<()>>>,
    /// Calls held open for a 2026-07-28 caller's answer.
    pub(super) holds: Holds,
}

/// Removes its request from the relay when the request ends, however it ends.
pub(super) struct Waiting<'a> {
    relay: &'a Relay,
    id: RequestId,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        lock(&self.relay.askers).remove(&self.id);
    }
}

impl Relay {
    /// Notes that upstream request `id` is `asker`'s, until the returned guard drops.
    pub(super) fn wait(&self, id: RequestId, asker: Asker) -> Waiting<'_> {
        lock(&self.askers).insert(id.clone(), asker);
        Waiting { relay: self, id }
    }

    /// The caller an upstream request belongs to: the request it came in relation to, or, when
    /// the transport cannot say (stdio), the only request in flight. A request on a stream of no
    /// request of ours (HTTP's standalone stream), or with several in flight and no relation,
    /// belongs to nobody: a question is never put to the wrong caller.
    fn asker(&self, extensions: &Extensions) -> Option<Asker> {
        let askers = lock(&self.askers);
        match extensions.get::<InboundStreamOrigin>() {
            Some(InboundStreamOrigin::OutboundRequest(id)) => askers.get(id).cloned(),
            Some(InboundStreamOrigin::Unassociated) => None,
            None if askers.len() == 1 => askers.values().next().cloned(),
            None => None,
        }
    }

    /// An upstream's request of the caller, sent on an `initialize` session (`sampling`,
    /// `elicitation`, `roots`): passed to the caller it belongs to when the policy lets it.
    pub(super) async fn ask(
        &self,
        upstream: &str,
        kind: ClientRequest,
        request: ServerRequest,
        extensions: &Extensions,
    ) -> Result<ClientResult, ErrorData> {
        let Some(asker) = self.asker(extensions) else {
            tracing::warn!(
                upstream,
                method = kind.method(),
                "request from an upstream with no call of its own in flight; refused"
            );
            return Err(ErrorData::invalid_request(
                format!(
                    "{}: the gateway cannot tell which of its callers this is for",
                    kind.method()
                ),
                None,
            ));
        };
        if let (true, Some(questions)) = (asker.caller.modern, &asker.questions) {
            if let Err((refused, rule)) = passes(&asker, upstream, kind) {
                audit(&asker, upstream, kind, Err(rule)).await;
                return Err(refused);
            }
            audit(&asker, upstream, kind, Ok(())).await;
            let (answer, answered) = oneshot::channel();
            let question = Question {
                kind,
                request,
                answer,
            };
            if questions.send(question).await.is_err() {
                return Err(ErrorData::internal_error(
                    "the caller's call has ended",
                    None,
                ));
            }
            return answered.await.unwrap_or_else(|_| {
                Err(ErrorData::internal_error(
                    format!(
                        "{}: the caller did not come back with an answer",
                        kind.method()
                    ),
                    None,
                ))
            });
        }
        if asker.caller.modern {
            // A 2026-07-28 caller cannot be asked mid-request; its questions travel in results.
            audit(&asker, upstream, kind, Err(CALLER_RULE)).await;
            return Err(ErrorData::new(
                rmcp::model::ErrorCode(-32021),
                format!(
                    "{}: the caller speaks 2026-07-28, where a server cannot send it requests; ask with an input_required result",
                    kind.method()
                ),
                None,
            ));
        }
        if let Err((refused, rule)) = passes(&asker, upstream, kind) {
            audit(&asker, upstream, kind, Err(rule)).await;
            return Err(refused);
        }
        audit(&asker, upstream, kind, Ok(())).await;
        put(&asker.caller, request).await
    }

    /// Sends a request upstream with `once` until it is done, answering the upstream's questions
    /// on the way: a 2026-07-28 caller gets them (as `input_required`, after the policy's check);
    /// a legacy caller is asked each one by request and the upstream called again with the
    /// answers, for at most [`MAX_ROUNDS`] rounds.
    ///
    /// # Errors
    /// `once`'s own error, or a question the policy or the caller does not allow (the request
    /// then ends: the upstream cannot finish without it).
    pub(super) async fn drive<T, E, F, Fut>(
        &self,
        upstream: &str,
        asker: &Asker,
        mut once: F,
    ) -> Result<Round<T>, E>
    where
        E: From<ErrorData>,
        F: FnMut(Input) -> Fut,
        Fut: Future<Output = Result<Round<T>, E>>,
    {
        let caller = &asker.caller;
        let mut input = (caller.input_responses.clone(), caller.request_state.clone());
        for _ in 0..MAX_ROUNDS {
            let asks = match once(input).await? {
                Round::Done(done) => return Ok(Round::Done(done)),
                Round::Asks(asks) => asks,
            };
            let questions = asks.input_requests.clone().unwrap_or_default();
            let mut kinds = Vec::with_capacity(questions.len());
            for request in questions.values() {
                let kind = kind_of(request).ok_or_else(|| {
                    ErrorData::internal_error(
                        format!("upstream {upstream} asked the caller something the gateway does not know"),
                        None,
                    )
                })?;
                if let Err((refused, rule)) = passes(asker, upstream, kind) {
                    audit(asker, upstream, kind, Err(rule)).await;
                    return Err(refused.into());
                }
                kinds.push(kind);
            }
            if caller.modern {
                for kind in kinds {
                    audit(asker, upstream, kind, Ok(())).await;
                }
                return Ok(Round::Asks(asks));
            }
            let mut answers = InputResponses::new();
            for ((key, request), kind) in questions.into_iter().zip(kinds) {
                audit(asker, upstream, kind, Ok(())).await;
                let answer = put(caller, server_request(request)).await?;
                answers.insert(key, serde_json::to_value(answer).unwrap_or(Value::Null));
            }
            input = (Some(answers), asks.request_state);
        }
        Err(ErrorData::internal_error(
            format!("upstream {upstream} asked for input more than {MAX_ROUNDS} times; gave up"),
            None,
        )
        .into())
    }

    /// The session wants the upstream's log messages.
    pub(super) fn listen(&self, peer: Peer<RoleServer>, level: Value) {
        let mut listeners = lock(&self.listeners);
        listeners.retain(|(p, _)| !p.is_transport_closed() && !same_session(p, &peer));
        listeners.push((peer, level));
    }

    /// The log level the caller's session set, if it set one.
    pub(super) fn level_of(&self, peer: &Peer<RoleServer>) -> Option<Value> {
        lock(&self.listeners)
            .iter()
            .find(|(p, _)| same_session(p, peer))
            .map(|(_, level)| level.clone())
    }

    /// Keeps `stream` (a listen stream following `uri` upstream) until [`Relay::unfollow`].
    pub(super) fn follow(&self, uri: String, stream: tokio::task::JoinHandle<()>) {
        if let Some(old) = lock(&self.streams).insert(uri, stream) {
            old.abort();
        }
    }

    /// Ends the listen stream that follows `uri`, if there is one.
    pub(super) fn unfollow(&self, uri: &str) {
        if let Some(stream) = lock(&self.streams).remove(uri) {
            stream.abort();
        }
    }

    /// A log message of the upstream, redacted, to every session that asked for log messages.
    pub(super) async fn log(&self, mut message: LoggingMessageNotificationParam, gate: &Gate) {
        message.data = gate.redactor().redact_value(&message.data);
        let listeners: Vec<_> = lock(&self.listeners)
            .iter()
            .map(|(p, _)| p.clone())
            .collect();
        for peer in listeners {
            let _ = peer.notify_logging_message(message.clone()).await;
        }
    }

    pub(super) fn subscribe(&self, uri: String, peer: Peer<RoleServer>) -> bool {
        let mut subscribers = lock(&self.subscribers);
        let first = !subscribers.contains_key(&uri);
        let sessions = subscribers.entry(uri).or_default();
        sessions.retain(|p| !p.is_transport_closed());
        if !sessions.iter().any(|p| same_session(p, &peer)) {
            sessions.push(peer);
        }
        first
    }

    /// Whether nobody is subscribed to `uri` any more (the upstream may be told so).
    pub(super) fn unsubscribe(&self, uri: &str, peer: &Peer<RoleServer>) -> bool {
        let mut subscribers = lock(&self.subscribers);
        let Some(sessions) = subscribers.get_mut(uri) else {
            return false;
        };
        sessions.retain(|p| !same_session(p, peer) && !p.is_transport_closed());
        if sessions.is_empty() {
            subscribers.remove(uri);
            return true;
        }
        false
    }

    /// The upstream says a resource changed: every session subscribed to it is told.
    pub(super) async fn updated(&self, update: ResourceUpdatedNotificationParam) {
        let sessions = lock(&self.subscribers)
            .get(&update.uri)
            .cloned()
            .unwrap_or_default();
        for peer in sessions {
            let _ = peer.notify_resource_updated(update.clone()).await;
        }
    }
}

/// Two handles on one `initialize` session: the session's handshake record is shared by both.
/// (2026-07-28 has no sessions; nothing of it is kept here.)
fn same_session(a: &Peer<RoleServer>, b: &Peer<RoleServer>) -> bool {
    match (a.peer_info(), b.peer_info()) {
        (Some(a), Some(b)) => Arc::ptr_eq(&a, &b),
        _ => false,
    }
}

/// What the gateway may tell an upstream that the caller can answer: the caller's own
/// capabilities, less the kinds the policy does not pass from this upstream. The tasks extension
/// only for a 2026-07-28 caller that declared it on this request, and only from an upstream
/// whose tasks the policy passes (`[passthrough] tasks`): an upstream never returns a task to a
/// caller that could not follow it.
pub(super) fn offered(gate: &Gate, upstream: &str, caller: &Caller) -> ClientCapabilities {
    let (policy, modern, caller) = (gate.policy(), caller.modern, &caller.capabilities);
    let mut offered = ClientCapabilities::default();
    if policy.passes_request(ClientRequest::Sampling, upstream) {
        offered.sampling.clone_from(&caller.sampling);
    }
    if policy.passes_request(ClientRequest::Elicitation, upstream) {
        offered.elicitation.clone_from(&caller.elicitation);
    }
    if policy.passes_request(ClientRequest::Roots, upstream) {
        offered.roots.clone_from(&caller.roots);
    }
    if modern && caller.supports_tasks() && policy.passes_tasks_from(upstream) {
        offered.extensions.get_or_insert_default().insert(
            rmcp::model::TASKS_EXTENSION_ID.to_owned(),
            serde_json::Map::new(),
        );
    }
    offered
}

/// The rule a question is refused by when the caller cannot take it (it did not declare the
/// capability, or its era has no requests from the server).
const CALLER_RULE: &str = "caller.capabilities";

/// The policy passes `kind` from `upstream`, and the caller said it can answer it; else the
/// error for the upstream and the rule that refused it.
pub(super) fn passes(
    asker: &Asker,
    upstream: &str,
    kind: ClientRequest,
) -> Result<(), (ErrorData, &'static str)> {
    if !asker.gate.policy().passes_request(kind, upstream) {
        let error = ErrorData::invalid_request(
            format!(
                "{}: the policy does not pass this from upstream {upstream} (policy rule {})",
                kind.method(),
                kind.rule()
            ),
            None,
        );
        return Err((error, kind.rule()));
    }
    let capabilities = &asker.caller.capabilities;
    let declared = match kind {
        ClientRequest::Sampling => capabilities.sampling.is_some(),
        ClientRequest::Elicitation => capabilities.elicitation.is_some(),
        ClientRequest::Roots => capabilities.roots.is_some(),
    };
    if !declared {
        let error = ErrorData::new(
            rmcp::model::ErrorCode(-32021),
            format!(
                "{}: the caller did not declare it can answer this",
                kind.method()
            ),
            None,
        );
        return Err((error, CALLER_RULE));
    }
    Ok(())
}

/// One record per question: passed (allow / observed, by the policy's rule) or refused by
/// `rule` (deny / not executed), with the upstream and the request it belongs to.
pub(super) async fn audit(
    asker: &Asker,
    upstream: &str,
    kind: ClientRequest,
    passed: Result<(), &str>,
) {
    let (decision, outcome, rule) = match passed {
        Ok(()) => (Decision::Allow, Outcome::Observed, kind.rule()),
        Err(rule) => (Decision::Deny, Outcome::NotExecuted, rule),
    };
    let event = asker
        .gate
        .event(&asker.name, &Map::new(), decision, outcome, rule);
    let mut event = from_upstream(event, Some(upstream));
    kind.method().clone_into(&mut event.method);
    // The question is answered (or refused) either way; `record` logs a record it lost.
    let _ = asker.gate.record(event).await;
}

/// Sends `request` to the caller, on the stream of the request it belongs to.
async fn put(caller: &Caller, mut request: ServerRequest) -> Result<ClientResult, ErrorData> {
    request
        .extensions_mut()
        .insert(OriginatingRequestId(caller.request_id.clone()));
    caller
        .peer
        .send_request(request)
        .await
        .map_err(|error| match error {
            ServiceError::McpError(error) => error,
            other => ErrorData::internal_error(format!("the caller did not answer: {other}"), None),
        })
}

/// What an `input_required` question asks for (`None`: a kind this build does not know).
pub(super) fn kind_of(request: &InputRequest) -> Option<ClientRequest> {
    match request {
        InputRequest::CreateMessage(_) => Some(ClientRequest::Sampling),
        InputRequest::Elicitation(_) => Some(ClientRequest::Elicitation),
        InputRequest::ListRoots(_) => Some(ClientRequest::Roots),
        _ => None,
    }
}

/// An `input_required` question as the request a legacy caller is sent (only kinds
/// [`kind_of`] knows reach here).
fn server_request(request: InputRequest) -> ServerRequest {
    match request {
        InputRequest::CreateMessage(request) => ServerRequest::CreateMessageRequest(request),
        InputRequest::Elicitation(request) => ServerRequest::ElicitRequest(request),
        InputRequest::ListRoots(request) => ServerRequest::ListRootsRequest(request),
        other => ServerRequest::CustomRequest(rmcp::model::CustomRequest::new(
            "unknown",
            serde_json::to_value(other).ok(),
        )),
    }
}
