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
use toolgate_core::audit::{Decision, Outcome};
use toolgate_store::journal::{JournalError, Note, NoteOutcome};

use super::{Call, CallFuture, Catalog, Toolset};
use crate::outcome;
use crate::server::Gate;

/// The seed's three tools.
#[derive(Debug)]
pub struct Ledger {
    catalog: Arc<Catalog>,
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
        Self {
            catalog: Arc::new(Catalog::new(tools)),
        }
    }

    async fn write_note(gate: &Gate, arguments: Map<String, Value>, rule: &str) -> CallResult {
        gate.admit("write_note", &arguments, true).await?;
        let args = Value::Object(arguments);
        let call: WriteNote = match parse(gate, "write_note", &args).await {
            Ok(call) => call,
            Err(result) => return Ok(result),
        };
        let map = args.as_object().cloned().unwrap_or_default();
        let event = gate.event(
            "write_note",
            &map,
            Decision::Allow,
            Outcome::Committed,
            rule,
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
            Err(JournalError::WriteFailed) => {
                outcome::in_doubt("write_note", "the audit journal failed while committing")
            }
            Err(error) => {
                tracing::error!(error = %error, "write_note not executed: journal unavailable");
                outcome::tool_error(
                    "write_note not executed: the journal is unavailable",
                    json!({}),
                )
            }
        })
    }

    async fn read_ledger(gate: &Gate, arguments: Map<String, Value>, rule: &str) -> CallResult {
        gate.admit("read_ledger", &arguments, true).await?;
        let args = Value::Object(arguments);
        if let Err(result) = parse::<ReadLedger>(gate, "read_ledger", &args).await {
            return Ok(result);
        }
        let notes = gate.journal().notes();
        let map = args.as_object().cloned().unwrap_or_default();
        let mut event = gate.event(
            "read_ledger",
            &map,
            Decision::Allow,
            Outcome::Observed,
            rule,
        );
        // Seed 000 labels observations this way.
        event.request_id = "observe".to_owned();
        if let Err(error) = gate.journal().record(event).await {
            tracing::error!(error = %error, "read_ledger answer withheld: audit failed");
            return Ok(outcome::audit_unavailable("read_ledger"));
        }
        Ok(outcome::success(json!({ "notes": notes })))
    }

    async fn rm_rf(gate: &Gate, arguments: Map<String, Value>, rule: &str) -> CallResult {
        gate.admit("rm_rf", &arguments, true).await?;
        // Only reached when a policy allows it: say plainly that nothing happened.
        let args = Value::Object(arguments);
        let map = args.as_object().cloned().unwrap_or_default();
        let event = gate.event("rm_rf", &map, Decision::Allow, Outcome::Failed, rule);
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
            let map = args.as_object().cloned().unwrap_or_default();
            let event = gate.event(tool, &map, Decision::Deny, Outcome::InvalidArgs, "schema");
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
    fn catalog(&self) -> Arc<Catalog> {
        Arc::clone(&self.catalog)
    }

    fn call<'a>(&'a self, call: Call<'a>) -> CallFuture<'a> {
        Box::pin(async move {
            let Call {
                gate,
                name,
                arguments,
                rule,
                ..
            } = call;
            let result = match name {
                "write_note" => Self::write_note(gate, arguments, rule).await,
                "read_ledger" => Self::read_ledger(gate, arguments, rule).await,
                "rm_rf" => Self::rm_rf(gate, arguments, rule).await,
                other => Err(rmcp::ErrorData::invalid_params(
                    format!("tool denied: {other}"),
                    None,
                )),
            };
            Ok(result?)
        })
    }

    /// The ledger commits each note together with its audit record, so it writes its own.
    fn records_itself(&self, _name: &str) -> bool {
        true
    }
}
