//! The ledger toolset of seed 000: `write_note`, `read_ledger`, and `rm_rf`, which is registered so
//! that the gate, not the toolset, is what hides it.
//!
//! `write_note` writes exactly one note per `request_id` through the journal: the first call commits,
//! the same call again replays (nothing rewritten), the same `request_id` with other text is refused.
//! `read_ledger` returns every committed note, so a harness can verify a mutation before it goes on.

use std::sync::Arc;

use rmcp::model::{CallToolResult, Tool, ToolAnnotations};
use serde::Deserialize;
use serde_json::{Map, Value, json};
use toolgate_core::audit::{Decision, Event, Outcome};
use toolgate_store::journal::{JournalError, Note, NoteOutcome};

use super::{CallFuture, Toolset};
use crate::outcome;
use crate::server::Gate;

/// The seed's three tools.
#[derive(Debug)]
pub struct Ledger {
    tools: Vec<Tool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WriteNote {
    request_id: String,
    text: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReadLedger {}

impl Default for Ledger {
    fn default() -> Self {
        Self::new()
    }
}

impl Ledger {
    #[must_use]
    pub fn new() -> Self {
        let schema = |value: Value| match value {
            Value::Object(map) => Arc::new(map),
            _ => Arc::new(Map::new()),
        };
        let tools = vec![
            Tool::new(
                "write_note",
                "Write one note per request_id. Calling again with the same request_id and text replays \
                 the first result; other text with a used request_id is refused.",
                schema(json!({
                    "type": "object",
                    "properties": {
                        "request_id": {"type": "string", "description": "Idempotency key: one note per value."},
                        "text": {"type": "string", "description": "The note."}
                    },
                    "required": ["request_id", "text"],
                    "additionalProperties": false
                })),
            )
            .with_annotations(ToolAnnotations::new().read_only(false).destructive(false).idempotent(true)),
            Tool::new(
                "read_ledger",
                "Observe committed notes.",
                schema(json!({"type": "object", "properties": {}, "additionalProperties": false})),
            )
            .with_annotations(ToolAnnotations::new().read_only(true).destructive(false).idempotent(true)),
            Tool::new(
                "rm_rf",
                "Registered to prove that list and call have independent gates; it deletes nothing.",
                schema(json!({
                    "type": "object",
                    "properties": {"path": {"type": "string"}},
                    "required": ["path"]
                })),
            ),
        ];
        Self { tools }
    }

    async fn write_note(gate: &Gate, arguments: Map<String, Value>) -> CallResult {
        gate.admit("write_note", &arguments, true).await?;
        let args = Value::Object(arguments);
        let call: WriteNote = match parse(gate, "write_note", &args).await {
            Ok(call) => call,
            Err(result) => return Ok(result),
        };
        let event = Event::tool_call(
            &call.request_id,
            "write_note",
            Decision::Allow,
            Outcome::Committed,
            &args,
        );
        let note = Note {
            request_id: call.request_id,
            text: call.text,
        };
        let request_id = note.request_id.clone();
        Ok(match gate.journal().put_note(note, event).await {
            Ok((NoteOutcome::Committed, _)) => {
                outcome::success(json!({"request_id": request_id, "status": "committed"}))
            }
            Ok((NoteOutcome::Replay, _)) => {
                outcome::success(json!({"request_id": request_id, "status": "replay"}))
            }
            Ok((NoteOutcome::Conflict, _)) => outcome::tool_error(
                format!(
                    "request_id {request_id:?} was already used with other text; nothing was written"
                ),
                json!({"request_id": request_id, "status": "conflict"}),
            ),
            Err(JournalError::WriteFailed) => outcome::in_doubt("write_note"),
            Err(error) => {
                tracing::error!(error = %error, "write_note not executed: journal unavailable");
                outcome::tool_error(
                    "write_note not executed: the journal is unavailable",
                    json!({}),
                )
            }
        })
    }

    async fn read_ledger(gate: &Gate, arguments: Map<String, Value>) -> CallResult {
        gate.admit("read_ledger", &arguments, true).await?;
        let args = Value::Object(arguments);
        if let Err(result) = parse::<ReadLedger>(gate, "read_ledger", &args).await {
            return Ok(result);
        }
        let notes = gate.journal().notes();
        let event = Event::tool_call(
            "observe",
            "read_ledger",
            Decision::Allow,
            Outcome::Observed,
            &args,
        );
        if let Err(error) = gate.journal().record(event).await {
            tracing::error!(error = %error, "read_ledger answer withheld: audit failed");
            return Ok(outcome::audit_unavailable("read_ledger"));
        }
        Ok(outcome::success(json!({ "notes": notes })))
    }

    async fn rm_rf(gate: &Gate, arguments: Map<String, Value>) -> CallResult {
        gate.admit("rm_rf", &arguments, true).await?;
        // Only reached when a policy allows it: say plainly that nothing happened.
        let args = Value::Object(arguments);
        let event = Event::tool_call(
            crate::server::request_label(args.as_object().unwrap_or(&Map::new())),
            "rm_rf",
            Decision::Allow,
            Outcome::Failed,
            &args,
        );
        if gate.journal().record(event).await.is_err() {
            return Ok(outcome::audit_unavailable("rm_rf"));
        }
        Ok(outcome::tool_error(
            "rm_rf is a demonstration tool and deleted nothing",
            json!({}),
        ))
    }
}

type CallResult = Result<CallToolResult, rmcp::ErrorData>;

/// Arguments into the handler's type; on failure the `isError` result to send, already audited
/// `deny / invalid_args`.
async fn parse<T: serde::de::DeserializeOwned>(
    gate: &Gate,
    tool: &str,
    args: &Value,
) -> Result<T, CallToolResult> {
    match T::deserialize(args) {
        Ok(call) => Ok(call),
        Err(error) => {
            let label = crate::server::request_label(args.as_object().unwrap_or(&Map::new()));
            let event = Event::tool_call(label, tool, Decision::Deny, Outcome::InvalidArgs, args);
            if gate.journal().record(event).await.is_err() {
                return Err(outcome::audit_unavailable(tool));
            }
            Err(outcome::tool_error(
                format!("invalid arguments for {tool}: {error}"),
                json!({"status": "invalid_args"}),
            ))
        }
    }
}

impl Toolset for Ledger {
    fn tools(&self) -> &[Tool] {
        &self.tools
    }

    fn call<'a>(
        &'a self,
        gate: &'a Gate,
        name: &'a str,
        arguments: Map<String, Value>,
    ) -> CallFuture<'a> {
        Box::pin(async move {
            match name {
                "write_note" => Self::write_note(gate, arguments).await,
                "read_ledger" => Self::read_ledger(gate, arguments).await,
                "rm_rf" => Self::rm_rf(gate, arguments).await,
                other => Err(rmcp::ErrorData::invalid_params(
                    format!("tool denied: {other}"),
                    None,
                )),
            }
        })
    }
}
