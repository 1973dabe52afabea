//! Honest results (seed 004): what a kit handler returns, and the helpers that keep a verified
//! empty list apart from a lookup that failed.
//!
//! A handler returns `Result<Output, ToolError>`. Every helper here returns that same type, so a
//! helper is the handler's last expression and `?` works on any error. `list_result` takes a real
//! collection, so "no value" cannot become an empty list by accident (the type system does what
//! the seed's `LIST_NOT_ARRAY` check does at run time); [`collect`] runs a lookup and turns its
//! failure, or its lack of a value, into an error with the real reason, never into "found nothing".

use std::borrow::Cow;
use std::fmt;
use std::future::Future;

use rmcp::model::{CallToolResult, ContentBlock};
use serde::Serialize;
use serde_json::{Value, json};

/// What a handler answers when it succeeds: a JSON value, text, or a complete MCP result.
///
/// A JSON object becomes the result's `structuredContent`, mirrored as text for clients that read
/// only text; any other JSON value is sent as its JSON text.
#[derive(Clone, Debug, PartialEq)]
pub struct Output(CallToolResult);

impl Output {
    /// A JSON value as the result.
    #[must_use]
    pub fn json(value: Value) -> Self {
        match value {
            Value::Object(_) => Self(crate::corridor::answer::success(value)),
            other => Self(CallToolResult::success(vec![ContentBlock::text(
                other.to_string(),
            )])),
        }
    }

    /// Plain text as the result.
    #[must_use]
    pub fn text(text: impl Into<String>) -> Self {
        Self(CallToolResult::success(vec![ContentBlock::text(text)]))
    }

    /// The MCP result as it is (content blocks, images, `structuredContent`, `isError`).
    #[must_use]
    pub fn result(result: CallToolResult) -> Self {
        Self(result)
    }

    /// The MCP result this output is sent as.
    #[must_use]
    pub fn into_result(self) -> CallToolResult {
        self.0
    }
}

impl From<Value> for Output {
    fn from(value: Value) -> Self {
        Self::json(value)
    }
}

impl From<String> for Output {
    fn from(text: String) -> Self {
        Self::text(text)
    }
}

impl From<&str> for Output {
    fn from(text: &str) -> Self {
        Self::text(text)
    }
}

impl From<CallToolResult> for Output {
    fn from(result: CallToolResult) -> Self {
        Self::result(result)
    }
}

/// A tool's failure, with a code the client can branch on. The client gets `isError: true`, the
/// message (redacted) and the code; the call is audited as failed.
///
/// Any error converts into one with `?` (code `ERROR`, the error's message); like `anyhow::Error`,
/// `ToolError` itself does not implement `std::error::Error`, which is what makes that conversion
/// possible.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolError {
    message: String,
    code: Cow<'static, str>,
    /// Whether the handler ran; false only for arguments that never reached it.
    executed: bool,
}

impl ToolError {
    /// A failure with `message` and the code `ERROR`.
    #[must_use]
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            code: Cow::Borrowed("ERROR"),
            executed: true,
        }
    }

    /// The same failure under `code` (e.g. `UPSTREAM_DOWN`).
    #[must_use]
    pub fn with_code(mut self, code: impl Into<Cow<'static, str>>) -> Self {
        self.code = code.into();
        self
    }

    /// Arguments the schema accepted but the handler's type could not be read from: the handler
    /// did not run.
    pub(crate) fn invalid_arguments(tool: &str, why: &serde_json::Error) -> Self {
        Self {
            message: format!("invalid arguments for {tool}: {why}"),
            code: Cow::Borrowed("INVALID_ARGUMENTS"),
            executed: false,
        }
    }

    /// The message, as written (the client gets it redacted).
    #[must_use]
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The code.
    #[must_use]
    pub fn code(&self) -> &str {
        &self.code
    }

    /// The `isError` result the client gets, its message passed through `redact`.
    pub(crate) fn into_result(self, redact: impl Fn(&str) -> String) -> CallToolResult {
        let executed = if self.executed {
            crate::corridor::answer::Executed::Yes
        } else {
            crate::corridor::answer::Executed::No
        };
        crate::corridor::answer::tool_error(
            redact(&self.message),
            executed,
            json!({"ok": false, "status": "error", "code": self.code}),
        )
    }
}

impl fmt::Display for ToolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.message, self.code)
    }
}

impl<E: std::error::Error + Send + Sync + 'static> From<E> for ToolError {
    fn from(error: E) -> Self {
        Self::new(error.to_string())
    }
}

/// What a lookup looked for and where: named in every list, empty and failed result, so that the
/// model can tell "no invoices in billing db" from "billing api is down".
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lookup {
    what: String,
    source: String,
}

impl Lookup {
    /// A lookup of `what` (e.g. `"notes"`) in `source` (e.g. `"the notes directory"`).
    #[must_use]
    pub fn new(what: impl Into<String>, source: impl Into<String>) -> Self {
        Self {
            what: what.into(),
            source: source.into(),
        }
    }
}

/// The items a lookup found. An empty collection gives `status: "empty"` with a note that the
/// lookup ran and found nothing ([`empty_result`]).
///
/// # Errors
/// An item cannot be serialised (code `LIST_NOT_SERIALISABLE`).
pub fn list_result<T: Serialize>(
    items: impl IntoIterator<Item = T>,
    lookup: &Lookup,
) -> Result<Output, ToolError> {
    let items = items
        .into_iter()
        .map(serde_json::to_value)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| {
            ToolError::new(format!("{} from {}: {e}", lookup.what, lookup.source))
                .with_code("LIST_NOT_SERIALISABLE")
        })?;
    if items.is_empty() {
        return empty_result(lookup, None);
    }
    Ok(Output::json(json!({
        "ok": true,
        "status": "ok",
        "what": lookup.what,
        "source": lookup.source,
        "count": items.len(),
        "items": items,
    })))
}

/// Runs a lookup. Its failure is an error with the real reason (code `COLLECT_FAILED`); no value
/// at all (`None`) is an error too (code `COLLECT_NO_VALUE`); only a real empty collection is an
/// empty result.
///
/// # Errors
/// As above, or [`list_result`]'s.
pub async fn collect<T, E, F>(lookup: &Lookup, producer: F) -> Result<Output, ToolError>
where
    T: Serialize,
    E: fmt::Display,
    F: Future<Output = Result<Option<Vec<T>>, E>>,
{
    match producer.await {
        Ok(Some(items)) => list_result(items, lookup),
        Ok(None) => Err(ToolError::new(format!(
            "the lookup of {} in {} returned no value; this is not an empty result",
            lookup.what, lookup.source
        ))
        .with_code("COLLECT_NO_VALUE")),
        Err(error) => Err(ToolError::new(format!(
            "the lookup of {} in {} failed: {error}",
            lookup.what, lookup.source
        ))
        .with_code("COLLECT_FAILED")),
    }
}

/// The verified empty result, built by hand: use it only after the lookup ran. `reason` says why
/// it is empty when that is known (e.g. "no note contains the phrase").
///
/// # Errors
/// Never; the `Result` lets it be a handler's last expression like the other helpers.
pub fn empty_result(lookup: &Lookup, reason: Option<&str>) -> Result<Output, ToolError> {
    let note = format!(
        "The lookup of {} in {} ran and found nothing. This is a verified empty result, not a failure.",
        lookup.what, lookup.source
    );
    let mut value = json!({
        "ok": true,
        "status": "empty",
        "verified_empty": true,
        "what": lookup.what,
        "source": lookup.source,
        "count": 0,
        "items": [],
        "note": note,
    });
    if let (Some(reason), Value::Object(map)) = (reason, &mut value) {
        map.insert("reason".to_owned(), Value::String(reason.to_owned()));
    }
    Ok(Output::json(value))
}

/// `data` as a successful result: `{"ok": true, "status": "ok", "data": …}`.
///
/// # Errors
/// `data` cannot be serialised (code `RESULT_NOT_SERIALISABLE`).
pub fn ok_result(data: impl Serialize) -> Result<Output, ToolError> {
    let data = serde_json::to_value(data).map_err(|e| {
        ToolError::new(format!("the result cannot be serialised: {e}"))
            .with_code("RESULT_NOT_SERIALISABLE")
    })?;
    Ok(Output::json(
        json!({"ok": true, "status": "ok", "data": data}),
    ))
}
