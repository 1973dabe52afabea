//! What the client sees for each [`Answer`] of the corridor (DESIGN.md §4): the one place an answer
//! becomes a `CallToolResult` or a JSON-RPC error.
//!
//! A refusal by visibility or by a policy argument rule is a JSON-RPC error -32602, raised before any
//! handler runs: the same answer for a denied tool and one that does not exist, so a caller learns
//! nothing about what is registered. Everything the model can act on (bad arguments, a conflict, a
//! failure, an outcome in doubt) is a result with `isError: true`, the reason in words, and
//! `executed` (`false`, `true` or `"unknown"`) in its structured content and in
//! `_meta["io.toolgate/executed"]`; a failure is never success text. The words and fields come from
//! core ([`Answer::message`], [`Answer::detail`]); this file only gives them their MCP shape.
//!
//! The small builders below are also what the built-in toolsets use for results of their own, so a
//! tool's error and the gate's error read the same.

use rmcp::ErrorData;
use rmcp::model::{
    CallToolResponse, CallToolResult, ContentBlock, CreateTaskResult, InputRequiredResult,
};
use serde_json::{Map, Value, json};
pub use toolgate_core::answer::{Answer, Check, Executed, Kind, Rollback, Unverified, Wire};

/// The key under which every error answer also carries `executed` in `_meta`, where a client that
/// ignores structured content (or a tool's own error without any) still finds it.
pub const EXECUTED_META: &str = "io.toolgate/executed";

/// The key under which a result whose postcondition was read back and held carries `true` in
/// `_meta` (and `verified: true` in its structured content, when that is an object).
pub const VERIFIED_META: &str = "io.toolgate/verified";

/// The wire form of `answer` for a call to `tool`.
///
/// # Errors
/// The JSON-RPC error to send instead of a result (-32602 for a refusal before dispatch; an
/// internal error for a cancelled call, which rmcp does not send once the client cancelled).
pub fn to_wire(
    answer: Answer<CallToolResult>,
    tool: &str,
    policy_sha256: &str,
) -> Result<CallToolResponse, ErrorData> {
    if let Answer::InputRequired(value) = answer {
        // Built by the corridor from the toolset's own `InputRequiredResult`, so it reads back.
        return serde_json::from_value::<InputRequiredResult>(value)
            .map(CallToolResponse::InputRequired)
            .map_err(|e| ErrorData::internal_error(format!("input_required result: {e}"), None));
    }
    if let Answer::Task { task, .. } = answer {
        // The upstream's `CreateTaskResult`, kept as a value by the corridor; reads back.
        return serde_json::from_value::<CreateTaskResult>(task)
            .map(CallToolResponse::Task)
            .map_err(|e| ErrorData::internal_error(format!("task result: {e}"), None));
    }
    to_result(answer, tool, policy_sha256).map(CallToolResponse::Complete)
}

/// [`to_wire`] for every answer but `InputRequired` and `Task`.
fn to_result(
    answer: Answer<CallToolResult>,
    tool: &str,
    policy_sha256: &str,
) -> Result<CallToolResult, ErrorData> {
    let kind = answer.kind();
    match kind.wire() {
        Wire::RpcError(_) => {
            let message = answer.message(tool).unwrap_or_default();
            let data = Value::Object(answer.detail(policy_sha256));
            Err(ErrorData::invalid_params(message, Some(data)))
        }
        Wire::NoResponse => Err(ErrorData::internal_error("cancelled by the client", None)),
        Wire::UpstreamError => match answer {
            Answer::Rejected {
                code,
                message,
                data,
            } => Err(ErrorData::new(rmcp::model::ErrorCode(code), message, data)),
            // `Kind::wire` gives `UpstreamError` to `Rejected` only.
            other => Ok(error_result(&other, tool, policy_sha256)),
        },
        Wire::Result => match answer {
            Answer::Ran(result) | Answer::ToolError(result) => Ok(mark_executed(result, kind)),
            Answer::Replay(mut result) => {
                let mut meta = result.meta.take().unwrap_or_default();
                meta.0
                    .insert("io.toolgate/status".to_owned(), json!("replay"));
                result.meta = Some(meta);
                Ok(result)
            }
            // `Kind::wire` gives `Result` to the three variants above only.
            other => Ok(error_result(&other, tool, policy_sha256)),
        },
        Wire::ErrorResult => Ok(error_result(&answer, tool, policy_sha256)),
    }
}

/// The `isError` result of an answer that is not the tool's own: its words, `status`, `executed`
/// and detail.
fn error_result<R>(answer: &Answer<R>, tool: &str, policy_sha256: &str) -> CallToolResult {
    let kind = answer.kind();
    let mut detail = answer.detail(policy_sha256);
    detail.insert("status".to_owned(), json!(kind.status()));
    let message = answer.message(tool).unwrap_or_default();
    let mut result = tool_error(message.clone(), kind.executed(), Value::Object(detail));
    if kind == Kind::DryRun
        && let Some(structured) = &result.structured_content
    {
        // Seed 004's refusal: a client that shows only text still shows the person the dry run
        // and how to enable the tool.
        let pretty = serde_json::to_string_pretty(structured).unwrap_or_default();
        result.content = vec![ContentBlock::text(format!("{message}\n\n{pretty}"))];
    }
    result
}

/// A tool's own error result says that it ran (`executed: true`), unless it said otherwise itself.
fn mark_executed(mut result: CallToolResult, kind: Kind) -> CallToolResult {
    if result.is_error != Some(true) {
        return result;
    }
    let executed = kind.executed().to_json();
    if let Some(Value::Object(structured)) = result.structured_content.as_mut() {
        structured
            .entry("executed")
            .or_insert_with(|| executed.clone());
    }
    let mut meta = result.meta.take().unwrap_or_default();
    meta.0.entry(EXECUTED_META.to_owned()).or_insert(executed);
    result.meta = Some(meta);
    result
}

/// The tool ran (or replayed): its structured result, mirrored as text for older clients.
#[must_use]
pub fn success(value: Value) -> CallToolResult {
    CallToolResult::structured(value)
}

/// `isError: true` with a reason the model can read, the same as structured content, and whether
/// anything ran.
#[must_use]
pub fn tool_error(reason: impl Into<String>, executed: Executed, detail: Value) -> CallToolResult {
    let reason = reason.into();
    let executed = executed.to_json();
    let mut structured = Map::new();
    structured.insert("error".to_owned(), Value::String(reason.clone()));
    structured.insert("executed".to_owned(), executed.clone());
    if let Value::Object(extra) = detail {
        structured.extend(extra);
    }
    let mut result = CallToolResult::structured_error(Value::Object(structured));
    result.content = vec![ContentBlock::text(reason)];
    let mut meta = result.meta.take().unwrap_or_default();
    meta.0.insert(EXECUTED_META.to_owned(), executed);
    result.meta = Some(meta);
    result
}

/// A tool's own refusal of its arguments or of the request (nothing was done).
#[must_use]
pub fn refusal(reason: impl Into<String>, detail: Value) -> CallToolResult {
    tool_error(reason, Executed::No, detail)
}

/// A mutation whose outcome is not known (`why` says what cut it off): the model must check
/// before it tries again, and must not read it as done or as not done.
#[must_use]
pub fn in_doubt(tool: &str, why: &str) -> CallToolResult {
    let answer: Answer<()> = Answer::InDoubt {
        why: why.to_owned(),
    };
    error_result(&answer, tool, "")
}

/// Nothing was attempted because something the call needs could not answer (`rule` names it).
#[must_use]
pub fn not_run(tool: &str, rule: &str, why: &str) -> CallToolResult {
    let answer: Answer<()> = Answer::NotRun {
        rule: rule.to_owned(),
        why: why.to_owned(),
    };
    error_result(&answer, tool, "")
}

#[cfg(test)]
mod tests;
