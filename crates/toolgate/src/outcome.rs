//! What the client sees for each outcome of the corridor (DESIGN.md §4), in one place.
//!
//! A refusal by visibility or by a policy argument rule is a JSON-RPC error -32602, raised before any
//! handler runs: the same answer for a denied tool and one that does not exist, so a caller learns
//! nothing about what is registered. Everything the model can act on (bad arguments, a conflict, a
//! failure) is a result with `isError: true` and the reason in words; a failure is never success text.

use rmcp::ErrorData;
use rmcp::model::{CallToolResult, ContentBlock};
use serde_json::{Value, json};
use toolgate_core::policy::Denial;

/// -32602 for a tool the caller may not see, or a call that breaks a policy argument rule.
#[must_use]
pub fn denied(denial: &Denial, visible: bool, policy_sha256: &str) -> ErrorData {
    if visible {
        // The tool exists for this caller, so naming the broken rule tells nothing new and lets the
        // model correct the call.
        ErrorData::invalid_params(
            format!("tool denied: {} (policy rule {})", denial.tool, denial.rule),
            Some(json!({ "rule": denial.rule, "policy_sha256": policy_sha256 })),
        )
    } else {
        // Denied, not allowed and unregistered all read the same, so a caller learns nothing
        // about what exists; the exact rule is in the server's log.
        ErrorData::invalid_params(
            format!("tool denied: {}", denial.tool),
            Some(json!({ "rule": "visibility", "policy_sha256": policy_sha256 })),
        )
    }
}

/// The tool ran (or replayed): its structured result, mirrored as text for older clients.
#[must_use]
pub fn success(value: Value) -> CallToolResult {
    CallToolResult::structured(value)
}

/// `isError: true` with a reason the model can read, and the same as structured content.
#[must_use]
pub fn tool_error(reason: impl Into<String>, detail: Value) -> CallToolResult {
    let reason = reason.into();
    let mut structured = json!({ "error": reason, "executed": false });
    if let (Value::Object(map), Value::Object(extra)) = (&mut structured, detail) {
        map.extend(extra);
    }
    let mut result = CallToolResult::structured_error(structured);
    result.content = vec![ContentBlock::text(reason)];
    result
}

/// A mutation whose outcome is not known (`why` says what cut it off): the model must check
/// before it tries again, and must not read it as done or as not done.
#[must_use]
pub fn in_doubt(tool: &str, why: &str) -> CallToolResult {
    let mut result = CallToolResult::structured_error(json!({
        "status": "in_doubt",
        "error": "outcome unknown: verify before retrying",
        "why": why,
    }));
    result.content = vec![ContentBlock::text(format!(
        "{tool}: outcome unknown: verify before retrying ({why})"
    ))];
    result
}

/// The audit log could not record the call, so its answer is withheld (fail closed).
#[must_use]
pub fn audit_unavailable(tool: &str) -> CallToolResult {
    tool_error(
        format!("{tool}: not completed: the audit log is unavailable"),
        json!({}),
    )
}
