//! The `clean` step: secrets never reach the client, and output the policy marks untrusted is
//! sanitised and labelled before the model reads it (DESIGN.md §1 step 9).
//!
//! Only the tool's own results are touched: the gate's answers are its own words, redacted where
//! they quote anything. A result that cannot be cleaned is withheld, never sent raw.

use std::borrow::Cow;

use rmcp::model::CallToolResult;
use serde_json::{Map, Value, json};
use toolgate_core::sanitize;

use super::{Answer, CallState, Corridor};

impl Corridor<'_> {
    /// Redacts the tool's result, and sanitises it when the policy marks its output untrusted.
    pub(super) fn clean(
        &self,
        call: &CallState<'_>,
        answer: Answer<CallToolResult>,
    ) -> Answer<CallToolResult> {
        let clean = |result| self.clean_result(call.name, result);
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

    fn clean_result(&self, name: &str, result: CallToolResult) -> Option<CallToolResult> {
        let untrusted = self
            .gate
            .policy()
            .rule(name)
            .is_some_and(|r| r.untrusted_output);
        if untrusted {
            let source = match &self.origin {
                Some(upstream) => format!("upstream {upstream}, tool {name}"),
                None => format!("tool {name}"),
            };
            return sanitise_result(self.gate.redactor(), &source, result);
        }
        redact_result(self.gate.redactor(), result)
    }
}

/// Secrets in a tool's result never reach the client. One pass over the serialised result decides;
/// only a result that holds something secret-shaped is rebuilt.
fn redact_result(
    redactor: &toolgate_core::redact::Redactor,
    result: CallToolResult,
) -> Option<CallToolResult> {
    let Ok(text) = serde_json::to_string(&result) else {
        return Some(result);
    };
    if matches!(redactor.redact(&text), Cow::Borrowed(_)) {
        return Some(result);
    }
    let value = serde_json::to_value(&result).unwrap_or(Value::Null);
    rebuild(&redactor.redact_value(&value))
}

/// Output the policy marks untrusted: every text the model will read (text blocks, embedded
/// resource text, link names and descriptions, structured content) has control, bidi and
/// invisible characters stripped and secrets redacted, is capped, and text blocks are wrapped in a
/// labelled untrusted-content envelope. Binary blocks pass as they are.
fn sanitise_result(
    redactor: &toolgate_core::redact::Redactor,
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
    rebuild(&value)
}

/// A cleaned result back in rmcp's type; what cannot be rebuilt is withheld, never sent raw.
fn rebuild(value: &Value) -> Option<CallToolResult> {
    serde_json::from_value::<CallToolResult>(value.clone()).ok()
}
