//! The `clean` step: secrets never reach the client, and output the policy marks untrusted is
//! sanitised and labelled before the model reads it (DESIGN.md §1 step 9).
//!
//! Only what upstreams and tools produce is touched: the gate's answers are its own words,
//! redacted where they quote anything. A tool's result, and what the gateway passes through from
//! an upstream for a model or person to read (a prompt's messages, a resource's contents), take
//! the same rule. A result that cannot be cleaned is withheld, never sent raw.
//!
//! Binary content is never altered: an `image` or `audio` block's `data` and an embedded
//! resource's `blob` are base64 a client decodes, and replacing any of it with a marker breaks the
//! file without protecting anything a reader sees. Every other string in the result (text blocks,
//! resource text, links, `structuredContent`, `_meta`) is redacted, keeping its JSON type; the
//! random-string rule spares the strings the caller sent in this request ([`Echoes`]), so an id
//! the caller made up comes back as it was sent.

use rmcp::model::{CallToolResult, GetPromptResult, ReadResourceResult};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};
use toolgate_core::redact::{Echoes, Redactor};
use toolgate_core::sanitize;

use super::{Answer, CallState, Corridor, Gate};

impl Corridor<'_> {
    /// Redacts the tool's result, and sanitises it when the policy marks its output untrusted.
    pub(super) fn clean(
        &self,
        call: &CallState<'_>,
        answer: Answer<CallToolResult>,
    ) -> Answer<CallToolResult> {
        if call.nested {
            // A postcondition's read is judged on what it really returned (a redacted note would
            // read as diverged); the verify step cleans the part of it a caller is shown.
            return answer;
        }
        let clean = |result| self.clean_result(call.name, &call.echoes, result);
        let withheld = || Answer::Failed {
            reason: format!(
                "{}: the result could not be cleaned for the client; withheld",
                call.name
            ),
        };
        match answer {
            Answer::Ran(result) => clean(result).map_or_else(withheld, Answer::Ran),
            Answer::ToolError(result) => clean(result).map_or_else(withheld, Answer::ToolError),
            other => other,
        }
    }

    fn clean_result(
        &self,
        name: &str,
        echoes: &Echoes,
        result: CallToolResult,
    ) -> Option<CallToolResult> {
        clean_tool_result(self.gate, self.origin.as_deref(), name, echoes, result)
    }
}

/// A result of tool `name` (served by `origin`, if an upstream) as the client may see it:
/// redacted, and sanitised when the policy marks the tool's output untrusted; `None` when it
/// cannot be cleaned. The corridor's step, and the one a task's result takes when it arrives
/// later (`tasks/get` through the gateway).
pub(crate) fn clean_tool_result(
    gate: &Gate,
    origin: Option<&str>,
    name: &str,
    echoes: &Echoes,
    result: CallToolResult,
) -> Option<CallToolResult> {
    let untrusted = gate.policy().rule(name).is_some_and(|r| r.untrusted_output);
    if untrusted {
        let source = match origin {
            Some(upstream) => format!("upstream {upstream}, tool {name}"),
            None => format!("tool {name}"),
        };
        return sanitise_result(gate.redactor(), &source, result);
    }
    redact_result(gate.redactor(), echoes, result)
}

/// Secrets in a tool's result never reach the client; binary content passes as it is.
fn redact_result(
    redactor: &Redactor,
    echoes: &Echoes,
    result: CallToolResult,
) -> Option<CallToolResult> {
    redact_readable(redactor, echoes, result, "content")
}

/// A prompt an upstream rendered (`prompts/get` through the gateway) as the client may see it:
/// its description and messages redacted as a tool's result is; `None` when it cannot be cleaned.
#[cfg_attr(
    not(any(feature = "gateway", test)),
    expect(
        dead_code,
        reason = "prompts and resources reach the corridor only through the gateway"
    )
)]
pub(crate) fn redact_prompt(
    redactor: &Redactor,
    echoes: &Echoes,
    result: GetPromptResult,
) -> Option<GetPromptResult> {
    redact_readable(redactor, echoes, result, "messages")
}

/// A resource an upstream read (`resources/read` through the gateway) as the client may see it:
/// text contents redacted as a tool's result is, `blob` contents as they came; `None` when it
/// cannot be cleaned.
#[cfg_attr(
    not(any(feature = "gateway", test)),
    expect(
        dead_code,
        reason = "prompts and resources reach the corridor only through the gateway"
    )
)]
pub(crate) fn redact_resource(
    redactor: &Redactor,
    echoes: &Echoes,
    result: ReadResourceResult,
) -> Option<ReadResourceResult> {
    redact_readable(redactor, echoes, result, "contents")
}

/// `result` with every string a reader sees redacted: the field named `blocks` is walked so that
/// the binary fields in it stay as they are ([`redact_blocks`]), every other field is redacted
/// whole. Only a field that holds something to redact is rewritten, and only a result with such a
/// field is rebuilt.
fn redact_readable<T: Serialize + DeserializeOwned>(
    redactor: &Redactor,
    echoes: &Echoes,
    result: T,
    blocks: &str,
) -> Option<T> {
    let mut value = serde_json::to_value(&result).ok()?;
    let Value::Object(fields) = &mut value else {
        return None;
    };
    let mut changed = false;
    let mut redact = |field: &mut Value| {
        if redactor.changes_value(field, echoes) {
            *field = redactor.redact_value_echoing(field, echoes);
            changed = true;
        }
    };
    for (key, field) in fields.iter_mut() {
        if key == blocks {
            redact_blocks(field, &mut redact);
        } else {
            redact(field);
        }
    }
    if !changed {
        return Some(result);
    }
    serde_json::from_value(value).ok()
}

/// Content through `redact`, its binary fields kept as they are: an `image` or `audio` block's
/// `data` (MCP schema, `ImageContent.data`, `AudioContent.data`) and a resource's `blob`
/// (`BlobResourceContents`, embedded in a block or read). Content blocks, prompt messages and
/// resource contents nest in arrays and objects; the walk goes down only where binary sits, and
/// hands every other subtree to `redact` whole, which keeps the sensitive-key rule.
fn redact_blocks(value: &mut Value, redact: &mut impl FnMut(&mut Value)) {
    match value {
        Value::Array(items) => {
            for item in items {
                redact_blocks(item, redact);
            }
        }
        Value::Object(fields) if holds_binary(fields) => {
            let media = is_media(fields);
            let resource = fields.contains_key("uri");
            for (key, field) in fields.iter_mut() {
                match key.as_str() {
                    "data" if media => {}
                    "blob" if resource => {}
                    _ => redact_blocks(field, redact),
                }
            }
        }
        other => redact(other),
    }
}

/// Whether `fields` is an `image` or `audio` content block, whose `data` is base64.
fn is_media(fields: &Map<String, Value>) -> bool {
    matches!(
        fields.get("type").and_then(Value::as_str),
        Some("image" | "audio")
    )
}

/// Whether binary content sits in `fields` or below it.
fn holds_binary(fields: &Map<String, Value>) -> bool {
    (is_media(fields) && fields.contains_key("data"))
        || (fields.contains_key("uri") && fields.contains_key("blob"))
        || fields.values().any(|field| match field {
            Value::Object(inner) => holds_binary(inner),
            Value::Array(items) => items.iter().any(|item| match item {
                Value::Object(inner) => holds_binary(inner),
                _ => false,
            }),
            _ => false,
        })
}

/// Output the policy marks untrusted: every text the model will read (text blocks, embedded
/// resource text, link names and descriptions, structured content) has control, bidi and
/// invisible characters stripped and secrets redacted, is capped, and text blocks are wrapped in a
/// labelled untrusted-content envelope. Binary blocks pass as they are.
fn sanitise_result(
    redactor: &Redactor,
    source: &str,
    result: CallToolResult,
) -> Option<CallToolResult> {
    let mut value = serde_json::to_value(&result).unwrap_or(Value::Null);
    let mut report = sanitize::Report::default();
    let max = sanitize::DEFAULT_MAX_CHARS;
    if let Some(Value::Array(blocks)) = value.get_mut("content") {
        for block in blocks {
            let Value::Object(block) = block else {
                continue;
            };
            if let Some(Value::String(text)) = block.get_mut("text") {
                let clean = sanitize::clean_text(text, redactor, max, &mut report);
                *text = sanitize::envelope(source, &clean);
            }
            if let Some(Value::Object(resource)) = block.get_mut("resource")
                && let Some(Value::String(text)) = resource.get_mut("text")
            {
                let clean = sanitize::clean_text(text, redactor, max, &mut report);
                *text = sanitize::envelope(source, &clean);
            }
            for field in ["name", "title", "description"] {
                if let Some(Value::String(text)) = block.get_mut(field) {
                    *text = sanitize::clean_text(text, redactor, max, &mut report);
                }
            }
        }
    }
    if let Some(structured) = value.get_mut("structuredContent") {
        *structured = sanitize::clean_value(structured, redactor, max, &mut report);
    }
    if let Value::Object(map) = &mut value {
        let meta = map
            .entry("_meta")
            .or_insert_with(|| Value::Object(Map::new()));
        if let Value::Object(meta) = meta {
            meta.insert(
                "io.toolgate/untrusted".to_owned(),
                json!({"source": source, "removed": report.removed, "truncated": report.truncated, "redacted": report.redacted}),
            );
        }
    }
    rebuild(value)
}

/// A cleaned result back in rmcp's type; what cannot be rebuilt is withheld, never sent raw.
fn rebuild(value: Value) -> Option<CallToolResult> {
    serde_json::from_value::<CallToolResult>(value).ok()
}

#[cfg(test)]
mod tests {
    use rmcp::model::{CallToolResult, GetPromptResult, ReadResourceResult};
    use serde_json::json;
    use toolgate_core::redact::{Echoes, Redactor};

    use super::{redact_prompt, redact_resource, redact_result};

    /// Random base64 with no file signature, which the text rule would take for a key.
    const DATA: &str = "q8Zt3vXn0LwPj7Ka2RmYc5HsFd9GbE1uNi4OxTl6WzA+AKIAIOSFODNN7EXAMPLE/w==";

    #[test]
    fn a_prompts_messages_are_redacted_and_its_images_kept() {
        let result: GetPromptResult = serde_json::from_value(json!({
            "description": "uses AKIAIOSFODNN7EXAMPLE",
            "messages": [
                {"role": "user", "content": {"type": "text", "text": "key AKIAIOSFODNN7EXAMPLE"}},
                {"role": "user", "content": {"type": "image", "data": DATA, "mimeType": "image/png"}},
                {"role": "assistant", "content": {"type": "resource", "resource": {"uri": "file:///k", "blob": DATA}}},
                {"role": "assistant", "content": {"type": "resource", "resource": {"uri": "file:///t", "text": DATA}}},
            ],
        }))
        .expect("a prompt");
        let out = redact_prompt(&Redactor::default(), &Echoes::NONE, result).expect("cleaned");
        let out = serde_json::to_value(out).expect("serialises");
        assert_eq!(out["description"], json!("uses [REDACTED]"));
        assert_eq!(
            out["messages"],
            json!([
                {"role": "user", "content": {"type": "text", "text": "key [REDACTED]"}},
                {"role": "user", "content": {"type": "image", "data": DATA, "mimeType": "image/png"}},
                {"role": "assistant", "content": {"type": "resource", "resource": {"uri": "file:///k", "blob": DATA}}},
                {"role": "assistant", "content": {"type": "resource", "resource": {"uri": "file:///t", "text": "[REDACTED]"}}},
            ])
        );
    }

    #[test]
    fn a_resources_text_is_redacted_its_blob_kept_and_the_callers_uri_spared() {
        let uri = "test://static/resource/q8Zt3vXn0LwPj7Ka2RmYc5HsFd9GbE1u";
        let result: ReadResourceResult = serde_json::from_value(json!({
            "contents": [
                {"uri": uri, "mimeType": "text/plain", "text": "password=hunter2 key AKIAIOSFODNN7EXAMPLE"},
                {"uri": uri, "mimeType": "application/octet-stream", "blob": DATA},
            ],
        }))
        .expect("a resource");
        let echoes = Echoes::of(&json!({"uri": uri}));
        let out = redact_resource(&Redactor::default(), &echoes, result).expect("cleaned");
        let out = serde_json::to_value(out).expect("serialises");
        let text = out["contents"][0]["text"].as_str().expect("text");
        assert!(!text.contains("AKIAIOSFODNN7EXAMPLE"), "{text}");
        assert_eq!(out["contents"][0]["uri"], json!(uri));
        assert_eq!(
            out["contents"][1],
            json!({"uri": uri, "mimeType": "application/octet-stream", "blob": DATA})
        );
    }

    #[test]
    fn a_clean_prompt_comes_back_as_it_went_in() {
        let value =
            json!({"messages": [{"role": "user", "content": {"type": "text", "text": "hello"}}]});
        let result: GetPromptResult = serde_json::from_value(value.clone()).expect("a prompt");
        let out = redact_prompt(&Redactor::default(), &Echoes::NONE, result).expect("cleaned");
        assert_eq!(serde_json::to_value(out).expect("serialises"), value);
    }

    #[test]
    fn binary_stays_and_text_is_redacted_without_changing_a_type() {
        let data = DATA;
        let result: CallToolResult = serde_json::from_value(json!({
            "content": [
                {"type": "text", "text": "key AKIAIOSFODNN7EXAMPLE"},
                {"type": "image", "data": data, "mimeType": "image/png"},
                {"type": "audio", "data": data, "mimeType": "audio/wav"},
                {"type": "resource", "resource": {"uri": "file:///k", "blob": data}},
                {"type": "resource", "resource": {"uri": "file:///t", "text": data}},
            ],
            "structuredContent": {"token": 1234, "id": "req-journal-fdatasync-EIO-10-000"},
        }))
        .expect("a result");
        let out = redact_result(&Redactor::default(), &Echoes::NONE, result).expect("cleaned");
        let out = serde_json::to_value(out).expect("serialises");
        assert_eq!(
            out["content"],
            json!([
                {"type": "text", "text": "key [REDACTED]"},
                {"type": "image", "data": data, "mimeType": "image/png"},
                {"type": "audio", "data": data, "mimeType": "audio/wav"},
                {"type": "resource", "resource": {"uri": "file:///k", "blob": data}},
                {"type": "resource", "resource": {"uri": "file:///t", "text": "[REDACTED]"}},
            ])
        );
        assert_eq!(
            out["structuredContent"],
            json!({"token": 1234, "id": "req-journal-fdatasync-EIO-10-000"})
        );
    }
}
