//! What the agent loop and a model say to each other: the conversation ([`Message`]), the tools on
//! offer ([`ToolSpec`]), the model's next step ([`Action`]), and the one trait a model implements
//! ([`Model`], seed 003's `next(messages, tools) -> Action`).
//!
//! The shapes follow the Chat Completions wire format closely (a user turn, an assistant turn with
//! tool calls, one tool turn per call), so an adapter for any API that speaks it is a translation,
//! not a redesign, and a stored run reads like the transcript it was. A model never sees an
//! approval API: it can only ask for tools; the gate decides.

use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// One turn of a run's conversation, as stored with the run and shown to the model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum Message {
    /// The task as the user gave it.
    User {
        /// What the user asked.
        content: String,
    },
    /// The model's turn: the tool calls it asked for (possibly several), and any text beside them.
    Assistant {
        /// Text the model wrote beside its calls, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        content: Option<String>,
        /// The calls, in the order the model gave them; each is answered by one [`Message::Tool`].
        tool_calls: Vec<ToolCall>,
    },
    /// What became of one call, as the data the model reads (seed 003: failures are data).
    Tool {
        /// The [`ToolCall::id`] this answers.
        tool_call_id: String,
        /// The outcome as a JSON object (`ran`, `tier`, `output` or `error`, …).
        content: Value,
    },
}

/// One tool call the model asked for.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The model's id for the call (the adapter or the loop makes one, from the conversation,
    /// when the model gives none), echoed in the [`Message::Tool`] that answers it.
    pub id: String,
    /// The tool's name, as the model wrote it (it may name a tool that does not exist).
    pub name: String,
    /// The arguments, or the text the model sent when it was not a JSON object.
    pub arguments: Arguments,
}

/// A call's arguments as the model sent them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Arguments {
    /// A JSON object: what a tool takes.
    Object {
        /// The arguments.
        value: Map<String, Value>,
    },
    /// Not a JSON object (invalid JSON, or JSON of another type): refused as invalid arguments
    /// and fed back to the model, never run and never shown to an approver.
    Unparsed {
        /// The text as the model sent it.
        raw: String,
        /// Why it is not an object, for the model to correct.
        error: String,
    },
}

impl Arguments {
    /// The arguments of a call whose text is `raw` (a Chat Completions `function.arguments`).
    #[must_use]
    pub fn parse(raw: &str) -> Self {
        match serde_json::from_str::<Value>(raw) {
            Ok(Value::Object(value)) => Self::Object { value },
            Ok(other) => Self::Unparsed {
                raw: raw.to_owned(),
                error: format!("the arguments must be a JSON object, not {}", kind(&other)),
            },
            Err(error) => Self::Unparsed {
                raw: raw.to_owned(),
                error: format!("the arguments are not valid JSON: {error}"),
            },
        }
    }
}

impl From<Map<String, Value>> for Arguments {
    fn from(value: Map<String, Value>) -> Self {
        Self::Object { value }
    }
}

/// The JSON type of `value`, in words.
fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A tool as the model is told about it: only the tools the agent's principal may see.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// The name to call it by.
    pub name: String,
    /// What it does, from the tool's own description.
    pub description: String,
    /// The JSON Schema of its arguments (an object schema).
    pub input_schema: Value,
}

/// What the model wants next.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Run these tools (at least one), in order.
    Call {
        /// Text the model wrote beside its calls, if any.
        content: Option<String>,
        /// The calls.
        calls: Vec<ToolCall>,
    },
    /// The run is done: the answer for the user.
    Final(String),
}

/// Why a model gave no next step. The run ends (`run_aborted`) and keeps its state, so it can be
/// resumed once the model is reachable again.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The model could not be reached or kept failing (connection, timeout, 5xx, 429) after the
    /// adapter's bounded retries.
    #[error("the model is unavailable: {0}")]
    Unavailable(String),
    /// The model's service refused the request (a 4xx other than 429: a bad key, an unknown model
    /// name); retrying the same request will not help.
    #[error("the model refused the request: {0}")]
    Refused(String),
    /// The model answered with something that is not a next step (not the wire format, no choice).
    #[error("the model's answer could not be read: {0}")]
    Malformed(String),
    /// A scripted model's plan cannot be read or does not fit the run.
    #[error("the plan cannot be used: {0}")]
    Plan(String),
}

/// The future a model returns for one step.
pub type ModelFuture<'a> = Pin<Box<dyn Future<Output = Result<Action, ModelError>> + Send + 'a>>;

/// A model: given the conversation so far and the tools on offer, the next step.
///
/// An implementation must be a function of `messages` (no hidden cursor): a run resumed after a
/// pause or a crash asks again from the stored conversation and must get the step it would have.
pub trait Model: Debug + Send + Sync {
    /// The next step of the run whose conversation is `messages`.
    fn next<'a>(&'a self, messages: &'a [Message], tools: &'a [ToolSpec]) -> ModelFuture<'a>;
}
