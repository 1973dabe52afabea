//! An `initialize`-era upstream asking a 2026-07-28 caller a question mid-call: the nearest
//! faithful translation.
//!
//! The upstream sends `sampling/createMessage`, `elicitation/create` or `roots/list` as a request
//! of its own and waits for the answer inside its call; a 2026-07-28 caller cannot be sent
//! requests, it is asked by an `input_required` result and calls again with the answer. So the
//! gateway keeps the upstream's call open on a task of its own, answers the caller
//! `input_required` with the question and a `requestState` naming the held call, and, when the
//! caller calls again with that state and the answer, gives the answer to the upstream and waits
//! on the same call for its result (or its next question). The state is a random 128-bit name, of
//! use only to the principal and the tool it was given for; a held call nobody comes back for is
//! abandoned after [`HELD_FOR`] (the upstream is told it was cancelled).

#![expect(
    deprecated,
    reason = "MCP 2026-07-28 deprecates sampling and roots; the upstreams held here speak the revisions before it"
)]

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rmcp::ErrorData;
use rmcp::model::{
    ClientResult, CreateMessageResult, ElicitResult, InputRequest, InputRequests,
    InputRequiredResult, InputResponses, ListRootsResult, ServerRequest, ServerResult,
};
use tokio::sync::{mpsc, oneshot};
use toolgate_core::policy::ClientRequest;

use super::relay::Asker;
use crate::lock;
use crate::toolset::CallError;

/// How long a held call waits for its caller to come back with the answer.
pub(super) const HELD_FOR: Duration = Duration::from_secs(300);

/// `requestState` of a held call starts with this (the rest is its name).
const STATE_PREFIX: &str = "toolgate-held:";

/// The key the question has in `inputRequests` (and its answer in `inputResponses`).
const QUESTION: &str = "upstream";

/// A question an upstream put while a held call was open, with the way back to it.
#[derive(Debug)]
pub(crate) struct Question {
    pub(crate) kind: ClientRequest,
    pub(crate) request: ServerRequest,
    pub(crate) answer: oneshot::Sender<Result<ClientResult, ErrorData>>,
}

/// The upstream's call as it runs on its task: its result, and the questions it puts meanwhile.
#[derive(Debug)]
pub(super) struct Running {
    pub(super) task: tokio::task::JoinHandle<Result<ServerResult, CallError>>,
    pub(super) questions: mpsc::Receiver<Question>,
}

impl Drop for Running {
    /// A call nobody waits for any more (its caller went away before a question, or never came
    /// back with the answer) is dropped, which tells the upstream it was cancelled.
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A call waiting for its caller's answer.
#[derive(Debug)]
struct Held {
    running: Running,
    question: Question,
    /// Whose it is: only the same principal, calling the same thing, may take it back.
    principal: String,
    name: String,
    until: Instant,
}

/// The held calls of one upstream.
#[derive(Debug, Default)]
pub(super) struct Holds {
    held: Mutex<HashMap<String, Held>>,
}

/// How a held call went on: it finished, or it has a question for the caller.
#[derive(Debug)]
pub(super) enum Next {
    Done(Box<Result<ServerResult, CallError>>),
    Asks(Box<InputRequiredResult>),
}

impl Holds {
    /// Whether `state` names a held call (a `requestState` the gateway gave).
    pub(super) fn names(state: Option<&str>) -> Option<&str> {
        state.and_then(|s| s.strip_prefix(STATE_PREFIX))
    }

    /// Waits for the running call to finish or to ask something; a question holds the call and
    /// becomes the caller's `input_required` result.
    pub(super) async fn wait(&self, mut running: Running, asker: &Asker) -> Next {
        tokio::select! {
            finished = &mut running.task => Next::Done(Box::new(finished.unwrap_or_else(|error| {
                Err(CallError::InDoubt(format!("the gateway's task for the call ended ({error})")))
            }))),
            Some(question) = running.questions.recv() => {
                let name = random_name();
                let asks = ask(&question, &name_state(&name));
                let held = Held {
                    running,
                    question,
                    principal: asker.gate.principal().sub.clone(),
                    name: asker.name.clone(),
                    until: Instant::now() + HELD_FOR,
                };
                let mut all = lock(&self.held);
                // Abandoned calls are dropped (`Running`'s drop cancels them upstream).
                let now = Instant::now();
                all.retain(|_, h| h.until > now);
                all.insert(name, held);
                Next::Asks(Box::new(asks))
            }
        }
    }

    /// The caller came back to held call `name` with `responses`: the answer goes to the
    /// upstream and the call is waited on again. Without the answer the question is put again.
    ///
    /// # Errors
    /// The state names no held call of this principal and tool (unknown, expired, someone
    /// else's), or the answer is not one of the kind asked: -32602, and the call stays held.
    pub(super) async fn resume(
        &self,
        name: &str,
        responses: Option<&InputResponses>,
        asker: &Asker,
    ) -> Result<Next, CallError> {
        let held = {
            let mut all = lock(&self.held);
            match all.get(name) {
                Some(h)
                    if h.until > Instant::now()
                        && h.principal == asker.gate.principal().sub
                        && h.name == asker.name => {}
                _ => {
                    return Err(CallError::Rejected(ErrorData::invalid_params(
                        "requestState names no call held for this caller (unknown, expired or tampered with)",
                        None,
                    )));
                }
            }
            all.remove(name)
        };
        let Some(held) = held else {
            return Err(CallError::Rejected(ErrorData::invalid_params(
                "requestState names no call held for this caller",
                None,
            )));
        };
        let Some(answer) = responses.and_then(|r| r.get(QUESTION)) else {
            let asks = ask(&held.question, &name_state(name));
            lock(&self.held).insert(name.to_owned(), held);
            return Ok(Next::Asks(Box::new(asks)));
        };
        let answer = match read_answer(held.question.kind, answer.clone()) {
            Ok(answer) => answer,
            Err(error) => {
                lock(&self.held).insert(name.to_owned(), held);
                return Err(CallError::Rejected(error));
            }
        };
        let Held {
            running, question, ..
        } = held;
        let _ = question.answer.send(Ok(answer));
        Ok(self.wait(running, asker).await)
    }
}

/// The `requestState` naming held call `name`.
fn name_state(name: &str) -> String {
    format!("{STATE_PREFIX}{name}")
}

/// The caller's `input_required` result for one question, with the held call's state.
fn ask(question: &Question, state: &str) -> InputRequiredResult {
    let request = match question.request.clone() {
        ServerRequest::CreateMessageRequest(r) => InputRequest::CreateMessage(r),
        ServerRequest::ElicitRequest(r) => InputRequest::Elicitation(r),
        ServerRequest::ListRootsRequest(r) => InputRequest::ListRoots(r),
        // `Relay::ask` parks only these three.
        _ => InputRequest::ListRoots(rmcp::model::ListRootsRequest::default()),
    };
    let mut requests = InputRequests::new();
    requests.insert(QUESTION.to_owned(), request);
    InputRequiredResult::new(Some(requests), Some(state.to_owned()))
}

/// The caller's answer as the result the upstream asked for.
fn read_answer(kind: ClientRequest, answer: serde_json::Value) -> Result<ClientResult, ErrorData> {
    let invalid = |e: serde_json::Error| {
        ErrorData::invalid_params(
            format!(
                "inputResponses.{QUESTION}: not a {} result: {e}",
                kind.method()
            ),
            None,
        )
    };
    Ok(match kind {
        ClientRequest::Sampling => ClientResult::CreateMessageResult(Box::new(
            serde_json::from_value::<CreateMessageResult>(answer).map_err(invalid)?,
        )),
        ClientRequest::Elicitation => ClientResult::ElicitResult(
            serde_json::from_value::<ElicitResult>(answer).map_err(invalid)?,
        ),
        ClientRequest::Roots => ClientResult::ListRootsResult(
            serde_json::from_value::<ListRootsResult>(answer).map_err(invalid)?,
        ),
    })
}

/// 128 random bits, hex.
pub(super) fn random_name() -> String {
    let mut bytes = [0u8; 16];
    // The OS's generator; without it no state could be unguessable, so nothing is held.
    getrandom::fill(&mut bytes).expect("the operating system's random generator");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
