//! What a POST to the endpoint asks for, read before rmcp reads it: one JSON-RPC 2.0 message
//! (JSON-RPC 2.0 §4-5; MCP basic protocol), and for a `tools/call` the tool it names and the
//! arguments it passes, which the scope check and its audit record need.
//!
//! It owns the refusal of anything rmcp could read otherwise than we do, or not at all: a body
//! with no single reading as JSON ([`super::strict`]), a batch (no MCP revision this server
//! speaks has them), and a message of no JSON-RPC shape. It must not judge what a method's params
//! mean beyond the tool name and arguments; rmcp does that, and `dispatch` (`mod.rs`) turns rmcp's
//! 415 for a message it still cannot read into the same 400 as ours (415 is for a wrong
//! `Content-Type` only).
//!
//! The shape rules follow rmcp's own reading (a request has `method` and `id`, a notification
//! `method` alone, a response `result` or `error`; an id is a string or an integer), so a message
//! let through here is one rmcp reads the same way.

use rmcp::model::{NumberOrString, RequestId};
use serde_json::{Map, Value};

use toolgate_core::json::{self as strict, JsonError};

/// JSON-RPC 2.0 §5.1: invalid JSON.
pub(super) const PARSE_ERROR: i64 = -32700;
/// JSON-RPC 2.0 §5.1: not a valid request object.
pub(super) const INVALID_REQUEST: i64 = -32600;
/// JSON-RPC 2.0 §5.1: the params do not fit the method.
pub(super) const INVALID_PARAMS: i64 = -32602;

/// The tool a `tools/call` names and its arguments; empty for every other message. Rides in the
/// request's extensions from the `json_rpc` layer to the token and scope layers, and to
/// `dispatch`, which may answer the call itself ([`Short`]).
#[derive(Debug, Clone, Default)]
pub(super) struct Called {
    pub(super) tool: Option<String>,
    pub(super) arguments: Option<Map<String, Value>>,
    /// Set when the call may take the front door's short way (`short.rs`).
    pub(super) short: Option<Short>,
    /// The request a `notifications/cancelled` is about.
    pub(super) cancelled: Option<RequestId>,
}

/// A `tools/call` request that says nothing beyond its tool, arguments and plain `_meta`: no
/// progress token (progress rides the request's own stream, which only rmcp keeps), no
/// per-request protocol metadata (2026-07-28), no `inputResponses` or `requestState`.
#[derive(Debug, Clone)]
pub(super) struct Short {
    pub(super) id: RequestId,
    pub(super) meta: Map<String, Value>,
}

/// Why a body is not a message we will pass on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum MessageError {
    #[error(transparent)]
    Json(#[from] JsonError),
    #[error("a batch is not accepted: send one message per request")]
    Batch,
    #[error("not a JSON-RPC 2.0 message: {why}")]
    Shape { why: &'static str },
    #[error("invalid tools/call params: {why}")]
    CallParams { why: &'static str },
}

impl MessageError {
    /// The JSON-RPC error code the client gets.
    pub(super) fn code(&self) -> i64 {
        match self {
            // A repeated name is valid JSON (RFC 8259), only not a request we accept.
            Self::Json(JsonError::Duplicate { .. }) | Self::Batch | Self::Shape { .. } => {
                INVALID_REQUEST
            }
            Self::Json(_) => PARSE_ERROR,
            Self::CallParams { .. } => INVALID_PARAMS,
        }
    }
}

/// Reads `body` as one JSON-RPC message.
///
/// # Errors
/// See [`MessageError`].
pub(super) fn read(body: &[u8]) -> Result<Called, MessageError> {
    let mut message = match strict::parse(body)? {
        Value::Object(message) => message,
        Value::Array(_) => return Err(MessageError::Batch),
        _ => return Err(shape("the body is not a JSON object")),
    };
    if message.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err(shape("\"jsonrpc\" must be \"2.0\""));
    }
    let id = message.get("id");
    let (is_call, is_cancel) = match (
        message.get("method"),
        message.contains_key("result"),
        message.contains_key("error"),
    ) {
        (Some(Value::String(method)), false, false) => {
            // An id, when there is one (a request), must name the request: never null.
            if id.is_some_and(|id| !request_id(id)) {
                return Err(shape("\"id\" must be a string or an integer"));
            }
            (
                method == "tools/call",
                method == "notifications/cancelled" && id.is_none(),
            )
        }
        (Some(_), false, false) => return Err(shape("\"method\" must be a string")),
        // A response to a request of ours; an error about a request that could not be read
        // has id null.
        (None, true, false) if id.is_some_and(request_id) => return Ok(Called::default()),
        (None, false, true) if id.is_some_and(|id| id.is_null() || request_id(id)) => {
            return Ok(Called::default());
        }
        (None, true, false) | (None, false, true) => {
            return Err(shape("a response needs the id of the request it answers"));
        }
        _ => {
            return Err(shape(
                "not a request, a notification or a response \
                 (method, result and error exclude each other)",
            ));
        }
    };
    // null is read as absent, as rmcp reads an optional field.
    let params = match message.remove("params") {
        None | Some(Value::Null) => None,
        Some(Value::Object(params)) => Some(params),
        Some(_) => return Err(shape("\"params\" must be an object")),
    };
    if is_call {
        let id = message.get("id").and_then(plain_id);
        return called(params, id);
    }
    if is_cancel {
        let cancelled = params
            .as_ref()
            .and_then(|params| params.get("requestId"))
            .and_then(plain_id);
        return Ok(Called {
            cancelled,
            ..Called::default()
        });
    }
    Ok(Called::default())
}

/// A string or an `i64` id, as rmcp holds it (rmcp's other readings stay its own to make).
fn plain_id(id: &Value) -> Option<RequestId> {
    match id {
        Value::String(id) => Some(NumberOrString::String(id.as_str().into())),
        Value::Number(n) => n.as_i64().map(NumberOrString::Number),
        _ => None,
    }
}

fn shape(why: &'static str) -> MessageError {
    MessageError::Shape { why }
}

/// A string, or a number that is an integer (rmcp also reads `1.0` as 1, when the float says
/// exactly which integer it is).
fn request_id(id: &Value) -> bool {
    const MAX_EXACT: f64 = 9_007_199_254_740_992.0; // 2^53
    match id {
        Value::String(_) => true,
        Value::Number(n) => {
            n.as_i64().is_some()
                || n.as_f64()
                    .is_some_and(|f| f.fract() == 0.0 && f.abs() < MAX_EXACT)
        }
        _ => false,
    }
}

/// The tool and arguments of `tools/call`: without a tool name there is no scope to check, so
/// such a call goes no further (fail closed), whatever rmcp would have made of it. A request
/// (`id`) whose params hold nothing else but a plain `_meta` may take the short way.
fn called(
    params: Option<Map<String, Value>>,
    id: Option<RequestId>,
) -> Result<Called, MessageError> {
    let mut params = params.ok_or(MessageError::CallParams {
        why: "params are missing",
    })?;
    let Some(Value::String(tool)) = params.remove("name") else {
        return Err(MessageError::CallParams {
            why: "\"name\" must be a string",
        });
    };
    let arguments = match params.remove("arguments") {
        None | Some(Value::Null) => None,
        Some(Value::Object(arguments)) => Some(arguments),
        Some(_) => {
            return Err(MessageError::CallParams {
                why: "\"arguments\" must be an object",
            });
        }
    };
    let meta = match params.remove("_meta") {
        None | Some(Value::Null) => Some(Map::new()),
        Some(Value::Object(meta)) => Some(meta),
        Some(_) => None,
    };
    let short = match (id, meta) {
        (Some(id), Some(meta)) if params.is_empty() && plain_meta(&meta) => {
            Some(Short { id, meta })
        }
        _ => None,
    };
    Ok(Called {
        tool: Some(tool),
        arguments,
        short,
        cancelled: None,
    })
}

/// `_meta` with no progress token and no key of the protocol's own (`io.modelcontextprotocol/`).
fn plain_meta(meta: &Map<String, Value>) -> bool {
    meta.keys()
        .all(|key| key != "progressToken" && !key.starts_with("io.modelcontextprotocol/"))
}
