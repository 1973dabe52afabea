//! The ledger toolset of seed 000: `write_note`, `read_ledger`, and `rm_rf`, which is registered so
//! that the gate, not the toolset, is what hides it.
//!
//! `write_note` writes exactly one note per `request_id` through the journal: the first call commits,
//! the same call again replays (nothing rewritten), the same `request_id` with other text is refused.
//! `read_ledger` returns every committed note, so a harness can verify a mutation before it goes on.
//!
//! The journal knows nothing of notes. A note is a journal effect keyed by its `request_id`, with
//! the note as its body, and the ledger is the view of the effects whose bodies are notes. That
//! body is exactly `write_note`'s arguments and the key is the call's `request_id`, so each record
//! names its note through `args_digest` and `request_id` alone and gains no effect fields: the
//! audit records are the ones the ledger wrote before notes were generic effects.

use std::sync::Arc;

use rmcp::model::{CallToolResult, Tool, ToolAnnotations};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use toolgate_core::audit::{Decision, Event, Outcome};
use toolgate_store::journal::{Effect, EffectOutcome, JournalError};

use toolgate::corridor::answer;
use toolgate::corridor::{AuditUnavailable, Gate, request_label};
use toolgate::toolset::{Call, CallError, CallFuture, Catalog, Toolset};

/// The seed's three tools.
#[derive(Debug)]
pub struct Ledger {
    catalog: Arc<Catalog>,
}

/// `write_note`'s arguments, and the body of the effect it commits.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Note {
    request_id: String,
    text: String,
}

impl Note {
    /// The journal effect that commits this note: keyed by its `request_id`, the note as its body.
    fn effect(&self) -> Effect {
        let body = json!({ "request_id": self.request_id, "text": self.text });
        Effect::new(self.request_id.clone(), body)
    }
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

    async fn write_note(call: Call<'_>) -> CallResult {
        let gate = call.gate;
        call.admit()?;
        let event = recorder(&call);
        let note: Note = match parse(call.arguments) {
            Ok(note) => note,
            Err(error) => return refuse_invalid(gate, "write_note", event, &error).await,
        };
        let effect = note.effect();
        let request_id = note.request_id;
        let event = event(Decision::Allow, Outcome::Committed);
        Ok(match gate.journal().put_effect(effect, event).await {
            Ok((EffectOutcome::Committed, _)) => {
                answer::success(json!({"request_id": request_id, "status": "committed"}))
            }
            Ok((EffectOutcome::Replay, _)) => {
                answer::success(json!({"request_id": request_id, "status": "replay"}))
            }
            Ok((EffectOutcome::Conflict, _)) => answer::refusal(
                format!(
                    "request_id {request_id:?} was already used with other text; nothing was written"
                ),
                json!({"request_id": request_id, "status": "conflict"}),
            ),
            Err(JournalError::WriteFailed) => {
                answer::in_doubt("write_note", "the audit journal failed while committing")
            }
            Err(error) => {
                tracing::error!(error = %error, "write_note not executed: journal unavailable");
                let why = AuditUnavailable::from(&error).to_string();
                answer::not_run("write_note", "audit.unavailable", &why)
            }
        })
    }

    async fn read_ledger(call: Call<'_>) -> CallResult {
        let gate = call.gate;
        call.admit()?;
        let event = recorder(&call);
        if let Err(error) = parse::<ReadLedger>(call.arguments) {
            return refuse_invalid(gate, "read_ledger", event, &error).await;
        }
        // Effects whose body is not a note are not the ledger's (another toolset's, in a data
        // directory it shares): they are no part of this view.
        let notes: Vec<Note> = gate
            .journal()
            .effects()
            .into_iter()
            .filter_map(|effect| serde_json::from_value(effect.body).ok())
            .collect();
        let mut event = event(Decision::Allow, Outcome::Observed);
        // Seed 000 labels observations this way.
        event.request_id = "observe".to_owned();
        if let Err(unavailable) = gate.record(event).await {
            let why = unavailable.to_string();
            return Ok(answer::not_run("read_ledger", "audit.unavailable", &why));
        }
        Ok(answer::success(json!({ "notes": notes })))
    }

    async fn rm_rf(call: Call<'_>) -> CallResult {
        let gate = call.gate;
        call.admit()?;
        // Only reached when a policy allows it: say plainly that nothing happened.
        let event = recorder(&call)(Decision::Allow, Outcome::Failed);
        if let Err(unavailable) = gate.record(event).await {
            let why = unavailable.to_string();
            return Ok(answer::not_run("rm_rf", "audit.unavailable", &why));
        }
        Ok(answer::refusal(
            "rm_rf is a demonstration tool and deleted nothing",
            json!({}),
        ))
    }
}

type CallResult = Result<CallToolResult, CallError>;

/// Makes this call's audit events (the ledger records its own, with its effect), from the label
/// and digest the corridor computed once.
fn recorder<'c>(call: &Call<'c>) -> impl Fn(Decision, Outcome) -> Event + use<'c> {
    let (gate, name, rule) = (call.gate, call.name, call.rule);
    let label = request_label(&call.arguments);
    let digest = call.args_digest.to_owned();
    move |decision, outcome| {
        gate.event_digested(name, label.clone(), digest.clone(), decision, outcome, rule)
    }
}

/// Arguments into the handler's type.
fn parse<T: serde::de::DeserializeOwned>(arguments: Map<String, Value>) -> serde_json::Result<T> {
    serde_json::from_value(Value::Object(arguments))
}

/// Arguments the handler cannot take: audited `deny / invalid_args`, answered with the reason.
async fn refuse_invalid(
    gate: &Gate,
    tool: &str,
    event: impl Fn(Decision, Outcome) -> Event,
    error: &serde_json::Error,
) -> CallResult {
    if let Err(unavailable) = gate
        .record(event(Decision::Deny, Outcome::InvalidArgs))
        .await
    {
        let why = unavailable.to_string();
        return Ok(answer::not_run(tool, "audit.unavailable", &why));
    }
    Ok(answer::refusal(
        format!("invalid arguments for {tool}: {error}"),
        json!({"status": "invalid_args"}),
    ))
}

impl Toolset for Ledger {
    fn catalog(&self) -> Arc<Catalog> {
        Arc::clone(&self.catalog)
    }

    fn call<'a>(&'a self, call: Call<'a>) -> CallFuture<'a> {
        Box::pin(async move {
            match call.name {
                "write_note" => Self::write_note(call).await,
                "read_ledger" => Self::read_ledger(call).await,
                "rm_rf" => Self::rm_rf(call).await,
                other => Err(CallError::unknown(other)),
            }
        })
    }

    /// The ledger commits each note together with its audit record, so it writes its own.
    fn records_itself(&self, _name: &str) -> bool {
        true
    }
}
