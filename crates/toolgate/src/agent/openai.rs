//! [`ChatCompletions`]: a [`Model`] on any OpenAI-compatible Chat Completions API (`POST
//! {base_url}/chat/completions`), the real-model adapter of seed 003 ("How do you plug in a real
//! model?").
//!
//! It owns the translation between the agent's conversation ([`Message`], [`ToolSpec`]) and the
//! wire format, and the HTTP exchange: the bearer key, a timeout per request, and bounded retries
//! (RFC 9110 §10.2.3 `Retry-After` on 429 and 503, exponential backoff on other 5xx, 408 and
//! transport failures). It must not judge a call: what the model asked for, however malformed,
//! is handed to the loop as data (seed 003: "invalid JSON arguments should become a validation
//! error rather than an exception"), and the gate decides. It must not let the key out: the key is
//! a [`Secret`], sent only as a header marked sensitive, and every text the service sends back
//! goes through a [`Redactor`] that knows the key before it reaches an error; logs carry statuses
//! and waits, never the key or the conversation.
//!
//! Design decision: the adapter is a pair of pure functions (conversation → request body, answer
//! body → [`Action`]) around one retry loop, with no state between steps. A run resumed after a
//! crash asks again from the stored conversation and gets the same request; even the ids made up
//! for calls the model sent without one are derived from the conversation's length, not a
//! counter. `reqwest` has its `json` feature off in this crate, so bodies are `serde_json` bytes.

use std::collections::HashSet;
use std::time::Duration;

use reqwest::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderMap, HeaderValue, RETRY_AFTER};
use reqwest::{StatusCode, Url};
use serde::Deserialize;
use serde_json::{Map, Value, json};
use toolgate_core::redact::Redactor;
use toolgate_core::secret::Secret;

use super::{Action, Arguments, Message, Model, ModelError, ModelFuture, ToolCall, ToolSpec};

/// Where a Chat Completions API is and how to talk to it. `new` takes what is required; the other
/// fields have defaults meant for a hosted API and may be set after.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Config {
    /// The API's base, such as `https://api.openai.com/v1` or `http://127.0.0.1:8080/v1`; requests
    /// go to `{base_url}/chat/completions`.
    pub base_url: String,
    /// The model's name, sent as `model`.
    pub model: String,
    /// The key, sent as `Authorization: Bearer KEY`; no header when `None` (a local server).
    pub api_key: Option<Secret>,
    /// A system prompt, sent as the first message of every request.
    pub system: Option<String>,
    /// How long one request may take, from connecting to the last byte of the answer.
    pub timeout: Duration,
    /// Requests per step, the first included (0 counts as 1).
    pub max_attempts: u32,
    /// The longest wait between two attempts, whatever the backoff or `Retry-After` says.
    pub max_backoff: Duration,
}

impl Config {
    /// The API at `base_url`, model `model`: no key, no system prompt, 60 s per request, 4
    /// attempts, waits capped at 30 s.
    #[must_use]
    pub fn new(base_url: impl Into<String>, model: impl Into<String>) -> Self {
        Self {
            base_url: base_url.into(),
            model: model.into(),
            api_key: None,
            system: None,
            timeout: Duration::from_secs(60),
            max_attempts: 4,
            max_backoff: Duration::from_secs(30),
        }
    }
}

/// A [`Model`] served by an OpenAI-compatible Chat Completions API.
#[derive(Debug)]
pub struct ChatCompletions {
    config: Config,
    /// `{base_url}/chat/completions`.
    endpoint: Url,
    /// `Bearer KEY`, marked sensitive: its `Debug` prints `Sensitive`, and HTTP/2 never indexes it.
    authorization: Option<HeaderValue>,
    client: reqwest::Client,
    /// Knows the key: every text from the service passes it before it is put in an error.
    redactor: Redactor,
}

impl ChatCompletions {
    /// An adapter for the API `config` names.
    ///
    /// # Errors
    ///
    /// [`ModelError::Refused`] when the base URL is not an `http` or `https` URL (or carries a
    /// user, a query or a fragment), when the key cannot be sent in a header, or when the HTTP
    /// client cannot be built.
    pub fn new(config: Config) -> Result<Self, ModelError> {
        let endpoint = endpoint(&config.base_url)?;
        let authorization = match &config.api_key {
            None => None,
            Some(key) => {
                // The error of `from_str` says nothing about the value; still, say it ourselves.
                let mut value = HeaderValue::from_str(&format!("Bearer {}", key.expose()))
                    .map_err(|_| {
                        ModelError::Refused(
                            "the API key cannot be sent in an HTTP header (it has a control \
                             character or a non-ASCII one)"
                                .to_owned(),
                        )
                    })?;
                value.set_sensitive(true);
                if endpoint.scheme() == "http" && !crate::loopback(&endpoint) {
                    tracing::warn!(
                        host = endpoint.host_str().unwrap_or_default(),
                        "the model's API key goes over plain http to a host that is not this \
                         machine"
                    );
                }
                Some(value)
            }
        };
        crate::install_tls_provider();
        // No redirects: a POST redirected by 301/302 becomes a GET, and a redirect is not what
        // an API answers; it surfaces as a refusal naming the status instead.
        let client = reqwest::Client::builder()
            .timeout(config.timeout)
            .connect_timeout(config.timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| {
                ModelError::Refused(format!("the HTTP client cannot be built: {}", chain(&e)))
            })?;
        let redactor = Redactor::new(config.api_key.iter().cloned().collect());
        Ok(Self {
            config,
            endpoint,
            authorization,
            client,
            redactor,
        })
    }

    /// The answer's body to `body`, after at most `max_attempts` requests.
    async fn complete(&self, body: Vec<u8>) -> Result<Vec<u8>, ModelError> {
        let attempts = self.config.max_attempts.max(1);
        let mut attempt = 1;
        loop {
            let (reason, retry_after) = match self.attempt(&body).await {
                Outcome::Answered(answer) => return Ok(answer),
                Outcome::Failed(error) => return Err(error),
                Outcome::Retry {
                    reason,
                    retry_after,
                } => (reason, retry_after),
            };
            if attempt >= attempts {
                return Err(ModelError::Unavailable(format!(
                    "{reason} (attempt {attempt} of {attempts})"
                )));
            }
            let wait = retry_after
                .unwrap_or_else(|| backoff(attempt))
                .min(self.config.max_backoff);
            tracing::warn!(
                attempt,
                attempts,
                reason = %reason,
                wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
                "the model's service did not answer; retrying"
            );
            tokio::time::sleep(wait).await;
            attempt += 1;
        }
    }

    /// One request and what to do about its outcome.
    async fn attempt(&self, body: &[u8]) -> Outcome {
        let mut request = self
            .client
            .post(self.endpoint.clone())
            .header(CONTENT_TYPE, "application/json")
            .header(ACCEPT, "application/json")
            .body(body.to_vec());
        if let Some(authorization) = &self.authorization {
            request = request.header(AUTHORIZATION, authorization.clone());
        }
        let response = match request.send().await {
            Ok(response) => response,
            Err(error) => {
                return Outcome::Retry {
                    reason: self.transport(&error),
                    retry_after: None,
                };
            }
        };
        let status = response.status();
        let retry_after = retry_after(response.headers());
        let answer = match read(response).await {
            Ok(answer) => answer,
            Err(Read::TooLarge) => {
                return Outcome::Failed(ModelError::Malformed(format!(
                    "the answer is larger than {MAX_ANSWER} bytes"
                )));
            }
            Err(Read::Transport(error)) => {
                return Outcome::Retry {
                    reason: self.transport(&error),
                    retry_after: None,
                };
            }
        };
        if status.is_success() {
            return Outcome::Answered(answer);
        }
        let said = said(&answer, &self.redactor)
            .map(|message| format!(": {message}"))
            .unwrap_or_default();
        let reason = format!("HTTP {status}{said}");
        if status == StatusCode::TOO_MANY_REQUESTS
            || status == StatusCode::REQUEST_TIMEOUT
            || status.is_server_error()
        {
            Outcome::Retry {
                reason,
                retry_after,
            }
        } else {
            Outcome::Failed(ModelError::Refused(reason))
        }
    }

    /// A transport failure in words: no URL (reqwest's `Display` has it), nothing unredacted.
    fn transport(&self, error: &reqwest::Error) -> String {
        if error.is_timeout() {
            return format!("no answer within {:?}", self.config.timeout);
        }
        let text = chain(error);
        let text = self.redactor.redact(&text);
        if error.is_connect() {
            format!("cannot connect: {text}")
        } else {
            text.into_owned()
        }
    }
}

impl Model for ChatCompletions {
    fn next<'a>(&'a self, messages: &'a [Message], tools: &'a [ToolSpec]) -> ModelFuture<'a> {
        Box::pin(async move {
            tracing::debug!(
                model = %self.config.model,
                messages = messages.len(),
                tools = tools.len(),
                "asking the model for the next step"
            );
            let body = request(
                &self.config.model,
                self.config.system.as_deref(),
                messages,
                tools,
            );
            let answer = self.complete(body.to_string().into_bytes()).await?;
            action(&answer, messages.len(), &self.redactor)
        })
    }
}

/// What one attempt came to.
enum Outcome {
    /// A 2xx and its body.
    Answered(Vec<u8>),
    /// Worth another attempt: a transport failure, a timeout, 408, 429 or 5xx.
    Retry {
        /// What went wrong, for the log and the final error.
        reason: String,
        /// How long the service asked us to wait.
        retry_after: Option<Duration>,
    },
    /// Not worth another attempt.
    Failed(ModelError),
}

/// The first wait of the exponential backoff; the n-th retry waits `FIRST_BACKOFF × 2^(n-1)`.
const FIRST_BACKOFF: Duration = Duration::from_millis(250);

/// The largest answer read: far above any step's answer, far below what hurts a process.
const MAX_ANSWER: usize = 16 * 1024 * 1024;

/// The longest text from the service quoted in an error.
const MAX_SAID: usize = 300;

/// The wait before attempt `attempt + 1` when the service named none (uncapped).
fn backoff(attempt: u32) -> Duration {
    FIRST_BACKOFF.saturating_mul(2u32.saturating_pow(attempt.saturating_sub(1)))
}

/// The wait the service asked for: `retry-after-ms` (OpenAI's own), then `Retry-After` in seconds.
/// An HTTP date, or anything else unreadable, counts as no wait named (the backoff applies).
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let number = |name: &str| -> Option<f64> {
        let value = headers
            .get(name)?
            .to_str()
            .ok()?
            .trim()
            .parse::<f64>()
            .ok()?;
        // Capped well below what `Duration::from_secs_f64` panics on; `max_backoff` caps it again.
        (value.is_finite() && value >= 0.0).then_some(value.min(1e9))
    };
    if let Some(ms) = number("retry-after-ms") {
        return Some(Duration::from_secs_f64(ms / 1000.0));
    }
    number(RETRY_AFTER.as_str()).map(Duration::from_secs_f64)
}

/// Why a body could not be read.
enum Read {
    TooLarge,
    Transport(reqwest::Error),
}

/// A response's body, at most [`MAX_ANSWER`] bytes.
async fn read(mut response: reqwest::Response) -> Result<Vec<u8>, Read> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(Read::Transport)? {
        if body.len() + chunk.len() > MAX_ANSWER {
            return Err(Read::TooLarge);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// `error` and its sources, joined by `: `, without the URL.
fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(inner) = source {
        let inner_text = inner.to_string();
        // hyper and reqwest sometimes repeat their source's text in their own.
        if !text.ends_with(&inner_text) {
            text.push_str(": ");
            text.push_str(&inner_text);
        }
        source = inner.source();
    }
    // reqwest's own text names the URL ("error sending request for url (…)"); the caller knows it.
    match text.find(" for url (") {
        Some(start) => match text[start..].find(')') {
            Some(end) => format!("{}{}", &text[..start], &text[start + end + 1..]),
            None => text[..start].to_owned(),
        },
        None => text,
    }
}

/// `{base_url}/chat/completions`, if `base_url` is a URL this adapter may use.
fn endpoint(base_url: &str) -> Result<Url, ModelError> {
    let refused = |why: String| ModelError::Refused(format!("the model's base URL {why}"));
    let mut url = Url::parse(base_url.trim()).map_err(|e| refused(format!("is not a URL: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(refused(format!(
            "must be http or https, not {}",
            url.scheme()
        )));
    }
    // A user or password would be sent as Basic credentials beside the bearer key, and a URL is
    // printed in places a key must not be: the key belongs in `api_key`.
    if !url.username().is_empty() || url.password().is_some() {
        return Err(refused(
            "must not carry a user or password (set the API key instead)".to_owned(),
        ));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(refused("must not have a query or a fragment".to_owned()));
    }
    url.path_segments_mut()
        .map_err(|()| refused("cannot have a path".to_owned()))?
        .pop_if_empty()
        .extend(["chat", "completions"]);
    Ok(url)
}

/// The request body of one step.
fn request(model: &str, system: Option<&str>, messages: &[Message], tools: &[ToolSpec]) -> Value {
    let mut wire: Vec<Value> = Vec::with_capacity(messages.len() + 1);
    if let Some(system) = system {
        wire.push(json!({"role": "system", "content": system}));
    }
    wire.extend(messages.iter().map(message));
    let mut body = json!({"model": model, "messages": wire});
    // An empty `tools` array is refused by some servers: with no tools, the field is left out.
    if !tools.is_empty() {
        body["tools"] = tools.iter().map(tool).collect();
    }
    body
}

/// One message as the wire has it.
fn message(message: &Message) -> Value {
    match message {
        Message::User { content } => json!({"role": "user", "content": content}),
        Message::Assistant {
            content,
            tool_calls,
        } => {
            if tool_calls.is_empty() {
                // OpenAI refuses an empty `tool_calls`, and a null content without calls.
                return json!({"role": "assistant", "content": content.as_deref().unwrap_or("")});
            }
            let calls: Vec<Value> = tool_calls
                .iter()
                .map(|call| {
                    json!({
                        "id": call.id,
                        "type": "function",
                        "function": {"name": call.name, "arguments": arguments_text(&call.arguments)},
                    })
                })
                .collect();
            json!({"role": "assistant", "content": content, "tool_calls": calls})
        }
        // The wire's tool content is text; the outcome object goes as its JSON.
        Message::Tool {
            tool_call_id,
            content,
        } => json!({"role": "tool", "tool_call_id": tool_call_id, "content": content.to_string()}),
    }
}

/// A call's arguments as the model sent them: the object's JSON, or the text that was not one
/// (so the model sees what it wrote beside the error it is told about).
fn arguments_text(arguments: &Arguments) -> String {
    match arguments {
        Arguments::Object { value } => serde_json::to_string(value).unwrap_or_default(),
        Arguments::Unparsed { raw, .. } => raw.clone(),
    }
}

/// One tool as the wire has it.
fn tool(spec: &ToolSpec) -> Value {
    json!({
        "type": "function",
        "function": {
            "name": spec.name,
            "description": spec.description,
            "parameters": spec.input_schema,
        },
    })
}

/// A Chat Completions answer, as far as a step needs it.
#[derive(Deserialize)]
struct Completion {
    choices: Vec<Choice>,
}

#[derive(Deserialize)]
struct Choice {
    message: Reply,
}

#[derive(Deserialize)]
struct Reply {
    /// A string; `null`; or, from some compatible servers, an array of `{"type":"text","text"}`.
    #[serde(default)]
    content: Value,
    /// OpenAI's safety refusal, in place of content.
    #[serde(default)]
    refusal: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<WireCall>>,
}

#[derive(Deserialize)]
struct WireCall {
    #[serde(default)]
    id: Option<String>,
    function: WireFunction,
}

#[derive(Deserialize)]
struct WireFunction {
    name: String,
    /// Text on the wire; some servers send the object itself.
    #[serde(default)]
    arguments: Value,
}

/// The step an answer `body` asks for; `turn` (the conversation's length) names calls without id.
fn action(body: &[u8], turn: usize, redactor: &Redactor) -> Result<Action, ModelError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ModelError::Malformed(format!("the answer is not JSON: {e}")))?;
    if value.get("choices").is_none() {
        let said = said(body, redactor)
            .map(|message| format!(" (the service said: {message})"))
            .unwrap_or_default();
        return Err(ModelError::Malformed(format!(
            "the answer has no choices{said}"
        )));
    }
    let completion: Completion = serde_json::from_value(value)
        .map_err(|e| ModelError::Malformed(format!("the answer is not a chat completion: {e}")))?;
    let Some(choice) = completion.choices.into_iter().next() else {
        return Err(ModelError::Malformed(
            "the answer has an empty list of choices".to_owned(),
        ));
    };
    let reply = choice.message;
    let content = text(&reply.content);
    let wire_calls = reply.tool_calls.unwrap_or_default();
    if wire_calls.is_empty() {
        // Whatever the finish_reason ("stop", "length", "content_filter"): no call is an answer.
        return Ok(Action::Final(content.or(reply.refusal).unwrap_or_default()));
    }
    let mut seen = HashSet::new();
    let calls = wire_calls
        .into_iter()
        .enumerate()
        .map(|(index, call)| {
            // A missing, empty or repeated id would leave a tool message nothing to answer.
            let id = call
                .id
                .filter(|id| !id.is_empty() && !seen.contains(id))
                .unwrap_or_else(|| format!("call_{turn}_{index}"));
            seen.insert(id.clone());
            ToolCall {
                id,
                name: call.function.name,
                arguments: arguments(call.function.arguments),
            }
        })
        .collect();
    Ok(Action::Call {
        content: content.filter(|c| !c.is_empty()),
        calls,
    })
}

/// The arguments of a wire call. Empty text (or none) is `{}`: models send `""` for tools without
/// parameters. Numbers stay as sent (`49` is not turned into `49.0`); the gate's schema check takes
/// an integer where the schema says number.
fn arguments(wire: Value) -> Arguments {
    match wire {
        Value::Null => Arguments::Object { value: Map::new() },
        Value::String(text) if text.trim().is_empty() => Arguments::Object { value: Map::new() },
        Value::String(text) => Arguments::parse(&text),
        Value::Object(value) => Arguments::Object { value },
        other => Arguments::parse(&other.to_string()),
    }
}

/// A message's text content.
fn text(content: &Value) -> Option<String> {
    match content {
        Value::String(text) => Some(text.clone()),
        Value::Array(parts) => {
            let texts: Vec<&str> = parts
                .iter()
                .filter_map(|part| part.get("text").and_then(Value::as_str))
                .collect();
            (!texts.is_empty()).then(|| texts.concat())
        }
        _ => None,
    }
}

/// What an error body says (`{"error":{"message"}}`, `{"error":"…"}`, or short plain text),
/// redacted, on one line, and short.
fn said(body: &[u8], redactor: &Redactor) -> Option<String> {
    let text = match serde_json::from_slice::<Value>(body) {
        Ok(value) => match value.get("error") {
            Some(Value::Object(error)) => error.get("message")?.as_str()?.to_owned(),
            Some(Value::String(message)) => message.clone(),
            _ => return None,
        },
        Err(_) => String::from_utf8_lossy(body).into_owned(),
    };
    let line: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let line = redactor.redact(line.trim()).into_owned();
    if line.is_empty() {
        return None;
    }
    if line.chars().count() <= MAX_SAID {
        return Some(line);
    }
    let cut: String = line.chars().take(MAX_SAID).collect();
    Some(format!("{cut}…"))
}

#[cfg(test)]
mod tests {
    //! The pure halves: conversation → request body, answer body → step, and the URL and wait
    //! rules. The HTTP exchange is tested against a real socket in `tests/it/agent_openai.rs`.

    use super::*;

    fn spec() -> ToolSpec {
        ToolSpec {
            name: "refund".to_owned(),
            description: "Refund an order.".to_owned(),
            input_schema: json!({
                "type": "object",
                "properties": {"order_id": {"type": "string"}, "amount": {"type": "number"}},
                "required": ["order_id", "amount"],
            }),
        }
    }

    fn answer(message: &Value) -> Vec<u8> {
        json!({
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1_760_000_000,
            "model": "m",
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
        })
        .to_string()
        .into_bytes()
    }

    fn step(message: &Value) -> Result<Action, ModelError> {
        action(&answer(message), 3, &Redactor::default())
    }

    #[test]
    fn the_request_has_the_system_prompt_first_and_the_tools_with_their_schemas() {
        let messages = [Message::User {
            content: "refund A-100".to_owned(),
        }];
        let body = request("m", Some("be careful"), &messages, &[spec()]);
        assert_eq!(
            body,
            json!({
                "model": "m",
                "messages": [
                    {"role": "system", "content": "be careful"},
                    {"role": "user", "content": "refund A-100"},
                ],
                "tools": [{"type": "function", "function": {
                    "name": "refund",
                    "description": "Refund an order.",
                    "parameters": spec().input_schema,
                }}],
            })
        );
    }

    #[test]
    fn no_tools_and_no_system_prompt_leave_both_out() {
        let body = request("m", None, &[], &[]);
        assert_eq!(body, json!({"model": "m", "messages": []}));
    }

    #[test]
    fn an_assistant_turn_sends_object_arguments_as_json_text_and_unparsed_ones_as_sent() {
        let turn = Message::Assistant {
            content: None,
            tool_calls: vec![
                ToolCall {
                    id: "a".to_owned(),
                    name: "refund".to_owned(),
                    arguments: Arguments::parse(r#"{"amount": 49}"#),
                },
                ToolCall {
                    id: "b".to_owned(),
                    name: "refund".to_owned(),
                    arguments: Arguments::parse(r#"{"amount": 4"#),
                },
            ],
        };
        assert_eq!(
            message(&turn),
            json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "refund", "arguments": "{\"amount\":49}"}},
                {"id": "b", "type": "function", "function": {"name": "refund", "arguments": "{\"amount\": 4"}},
            ]})
        );
    }

    #[test]
    fn an_assistant_turn_without_calls_has_no_tool_calls_field() {
        let turn = Message::Assistant {
            content: None,
            tool_calls: Vec::new(),
        };
        assert_eq!(message(&turn), json!({"role": "assistant", "content": ""}));
    }

    #[test]
    fn a_tool_turn_sends_its_outcome_as_json_text() {
        let turn = Message::Tool {
            tool_call_id: "a".to_owned(),
            content: json!({"ran": true, "output": {"refunded": 49}}),
        };
        let wire = message(&turn);
        assert_eq!(wire["role"], "tool");
        assert_eq!(wire["tool_call_id"], "a");
        let text = wire["content"].as_str().expect("a string");
        assert_eq!(
            serde_json::from_str::<Value>(text).expect("JSON"),
            json!({"ran": true, "output": {"refunded": 49}})
        );
    }

    #[test]
    fn several_calls_keep_their_order_and_ids() {
        let step = step(&json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "x", "type": "function", "function": {"name": "one", "arguments": "{\"n\":1}"}},
            {"id": "y", "type": "function", "function": {"name": "two", "arguments": "{\"n\":2}"}},
        ]}))
        .expect("a step");
        let Action::Call { content, calls } = step else {
            panic!("a call: {step:?}")
        };
        assert_eq!(content, None);
        let got: Vec<(&str, &str)> = calls
            .iter()
            .map(|c| (c.id.as_str(), c.name.as_str()))
            .collect();
        assert_eq!(got, [("x", "one"), ("y", "two")]);
    }

    #[test]
    fn empty_or_missing_arguments_are_an_empty_object() {
        for wire in [json!(""), json!("  "), Value::Null] {
            assert_eq!(arguments(wire), Arguments::Object { value: Map::new() });
        }
    }

    #[test]
    fn invalid_or_non_object_arguments_are_unparsed_with_the_text_as_sent() {
        let Arguments::Unparsed { raw, .. } = arguments(json!(r#"{"amount": 49"#)) else {
            panic!("unparsed")
        };
        assert_eq!(raw, r#"{"amount": 49"#);
        let Arguments::Unparsed { raw, error } = arguments(json!("[1]")) else {
            panic!("unparsed")
        };
        assert_eq!(raw, "[1]");
        assert!(error.contains("an array"), "{error}");
        // A server that sent a number rather than text: still data, not a crash.
        assert!(matches!(
            arguments(json!(7)),
            Arguments::Unparsed { raw, .. } if raw == "7"
        ));
    }

    #[test]
    fn object_arguments_sent_as_an_object_are_taken_as_is() {
        let Arguments::Object { value } = arguments(json!({"amount": 49})) else {
            panic!("an object")
        };
        assert!(value["amount"].is_u64());
    }

    #[test]
    fn an_integer_stays_an_integer() {
        let Arguments::Object { value } = arguments(json!(r#"{"amount": 49, "f": 49.5}"#)) else {
            panic!("an object")
        };
        assert!(value["amount"].is_u64(), "{value:?}");
        assert_eq!(value["amount"].to_string(), "49");
        assert!(value["f"].is_f64());
    }

    #[test]
    fn calls_without_a_usable_id_get_one_made_from_the_turn_and_position() {
        let step = step(&json!({"role": "assistant", "tool_calls": [
            {"type": "function", "function": {"name": "one", "arguments": "{}"}},
            {"id": "", "type": "function", "function": {"name": "two", "arguments": "{}"}},
            {"id": "z", "type": "function", "function": {"name": "three", "arguments": "{}"}},
            {"id": "z", "type": "function", "function": {"name": "four", "arguments": "{}"}},
        ]}))
        .expect("a step");
        let Action::Call { calls, .. } = step else {
            panic!("a call")
        };
        let ids: Vec<&str> = calls.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(ids, ["call_3_0", "call_3_1", "z", "call_3_3"]);
    }

    #[test]
    fn no_call_is_a_final_answer_whatever_the_finish_reason() {
        assert_eq!(
            step(&json!({"role": "assistant", "content": "Done."})).expect("a step"),
            Action::Final("Done.".to_owned())
        );
        assert_eq!(
            step(&json!({"role": "assistant", "content": null, "tool_calls": []})).expect("step"),
            Action::Final(String::new())
        );
        assert_eq!(
            step(&json!({"role": "assistant", "content": null, "refusal": "I can't."}))
                .expect("a step"),
            Action::Final("I can't.".to_owned())
        );
        assert_eq!(
            step(&json!({"role": "assistant", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}))
                .expect("a step"),
            Action::Final("ab".to_owned())
        );
    }

    #[test]
    fn what_is_not_a_chat_completion_is_malformed() {
        let redactor = Redactor::default();
        for body in [
            &b"<html>502</html>"[..],
            br#"{"object": "list"}"#,
            br#"{"choices": []}"#,
            br#"{"choices": [{"message": {"tool_calls": [{"id": "a"}]}}]}"#,
        ] {
            let got = action(body, 0, &redactor);
            assert!(
                matches!(got, Err(ModelError::Malformed(_))),
                "{}: {got:?}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn an_error_body_is_quoted_redacted_on_one_line_and_short() {
        let key = "sk-test-0123456789abcdefghij";
        let redactor = Redactor::new(vec![Secret::new(key)]);
        let body = json!({"error": {"message": format!("Incorrect API key provided: {key}.\nSee the docs.")}});
        let got = said(body.to_string().as_bytes(), &redactor).expect("a message");
        assert!(!got.contains(key), "{got}");
        assert!(got.starts_with("Incorrect API key provided: "), "{got}");
        assert!(!got.contains('\n'), "{got}");
        let long = "x ".repeat(1000);
        let got = said(long.as_bytes(), &redactor).expect("a message");
        assert!(got.chars().count() <= MAX_SAID + 1, "{}", got.len());
        assert_eq!(said(br#"{"id": 1}"#, &redactor), None);
    }

    #[test]
    fn the_endpoint_is_the_base_with_chat_completions() {
        for (base, want) in [
            (
                "http://127.0.0.1:8080/v1",
                "http://127.0.0.1:8080/v1/chat/completions",
            ),
            (
                "http://127.0.0.1:8080/v1/",
                "http://127.0.0.1:8080/v1/chat/completions",
            ),
            (
                "https://api.example.com",
                "https://api.example.com/chat/completions",
            ),
        ] {
            assert_eq!(endpoint(base).expect("a URL").as_str(), want);
        }
        for base in [
            "not a url",
            "ftp://example.com/v1",
            "https://user:pw@example.com/v1",
            "https://example.com/v1?key=x",
        ] {
            assert!(
                matches!(endpoint(base), Err(ModelError::Refused(_))),
                "{base}"
            );
        }
    }

    #[test]
    fn waits_double_from_a_quarter_second() {
        let waits: Vec<u128> = (1..=4).map(|n| backoff(n).as_millis()).collect();
        assert_eq!(waits, [250, 500, 1000, 2000]);
        assert!(backoff(u32::MAX) >= Duration::from_secs(30));
    }

    #[test]
    fn retry_after_is_read_in_seconds_or_milliseconds() {
        let mut headers = HeaderMap::new();
        assert_eq!(retry_after(&headers), None);
        headers.insert(RETRY_AFTER, HeaderValue::from_static("2"));
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(2)));
        headers.insert(
            RETRY_AFTER,
            HeaderValue::from_static("Wed, 21 Oct 2026 07:28:00 GMT"),
        );
        assert_eq!(retry_after(&headers), None);
        headers.insert(RETRY_AFTER, HeaderValue::from_static("-1"));
        assert_eq!(retry_after(&headers), None);
        headers.insert("retry-after-ms", HeaderValue::from_static("1500"));
        assert_eq!(retry_after(&headers), Some(Duration::from_millis(1500)));
    }

    #[test]
    fn the_key_is_not_in_the_debug_output() {
        let key = "sk-test-0123456789abcdefghij";
        let mut config = Config::new("https://api.example.com/v1", "m");
        config.api_key = Some(Secret::new(key));
        let adapter = ChatCompletions::new(config).expect("an adapter");
        let debug = format!("{adapter:?}");
        assert!(!debug.contains(key), "{debug}");
        assert!(!debug.contains("0123456789"), "{debug}");
    }
}
