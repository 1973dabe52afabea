//! The Chat Completions adapter (`agent::openai`) against a real HTTP server on 127.0.0.1 that
//! replays recorded answers (`tests/data/chat/`) in order and records every request it got, with
//! the time it arrived, so each test can assert what was sent and when, not only what came back.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use toolgate::agent::openai::{ChatCompletions, Config};
use toolgate::agent::{Action, Arguments, Message, Model, ModelError, ToolCall, ToolSpec};
use toolgate_core::secret::Secret;

/// The key the tests send; `unauthorized.json` echoes it, as OpenAI's own 401 once did.
const KEY: &str = "sk-test-toolgate-7f3a9c2e5b1d4f60a8e2";

const TWO_CALLS: &str = include_str!("../data/chat/two_calls.json");
const INVALID_ARGUMENTS: &str = include_str!("../data/chat/invalid_arguments.json");
const INTEGER_ARGUMENT: &str = include_str!("../data/chat/integer_argument.json");
const FINAL: &str = include_str!("../data/chat/final.json");
const UNAUTHORIZED: &str = include_str!("../data/chat/unauthorized.json");
const RATE_LIMITED: &str = include_str!("../data/chat/rate_limited.json");
const UNAVAILABLE: &str = include_str!("../data/chat/unavailable.json");

/// What the server does with the next request.
enum Reply {
    /// Answer with this status, extra headers and JSON body.
    Answer {
        status: u16,
        headers: Vec<(&'static str, &'static str)>,
        body: &'static str,
    },
    /// Read the request and never answer, holding the connection open.
    Silence,
}

fn ok(body: &'static str) -> Reply {
    status(200, body)
}

fn status(status: u16, body: &'static str) -> Reply {
    Reply::Answer {
        status,
        headers: Vec::new(),
        body,
    }
}

/// One request as the server received it.
#[derive(Debug)]
struct Received {
    /// When its last byte arrived.
    at: Instant,
    method: String,
    path: String,
    /// Names in lowercase.
    headers: HashMap<String, String>,
    body: Value,
}

/// A Chat Completions server on 127.0.0.1 replaying `replies` in order.
struct Server {
    base_url: String,
    received: Arc<Mutex<Vec<Received>>>,
    task: JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Server {
    async fn start(replies: Vec<Reply>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let base_url = format!("http://{}/v1", listener.local_addr().expect("address"));
        let received = Arc::new(Mutex::new(Vec::new()));
        let replies = Arc::new(Mutex::new(VecDeque::from(replies)));
        let log = received.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((socket, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(serve(socket, log.clone(), replies.clone()));
            }
        });
        Self {
            base_url,
            received,
            task,
        }
    }

    /// The requests received so far, taken out of the log.
    fn received(&self) -> Vec<Received> {
        std::mem::take(&mut *self.received.lock().expect("log"))
    }

    fn config(&self) -> Config {
        let mut config = Config::new(&self.base_url, "gpt-4.1-mini");
        config.api_key = Some(Secret::new(KEY));
        config
    }
}

/// One request per connection: read it, record it, answer with the next reply, close.
async fn serve(
    mut socket: TcpStream,
    log: Arc<Mutex<Vec<Received>>>,
    replies: Arc<Mutex<VecDeque<Reply>>>,
) {
    let mut data = Vec::new();
    let mut buf = [0u8; 8192];
    let head_end = loop {
        if let Some(at) = data.windows(4).position(|w| w == b"\r\n\r\n") {
            break at;
        }
        match socket.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => data.extend_from_slice(&buf[..n]),
        }
    };
    let head = String::from_utf8_lossy(&data[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut request_line = lines.next().unwrap_or_default().split(' ');
    let method = request_line.next().unwrap_or_default().to_owned();
    let path = request_line.next().unwrap_or_default().to_owned();
    let headers: HashMap<String, String> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_owned()))
        .collect();
    let length: usize = headers
        .get("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut body = data[head_end + 4..].to_vec();
    while body.len() < length {
        match socket.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => body.extend_from_slice(&buf[..n]),
        }
    }
    log.lock().expect("log").push(Received {
        at: Instant::now(),
        method,
        path,
        headers,
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
    });
    let reply = replies.lock().expect("replies").pop_front();
    match reply {
        Some(Reply::Answer {
            status,
            headers,
            body,
        }) => {
            let mut response = format!(
                "HTTP/1.1 {status} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
                 connection: close\r\n",
                reason(status),
                body.len()
            );
            for (name, value) in headers {
                response.push_str(&format!("{name}: {value}\r\n"));
            }
            response.push_str("\r\n");
            response.push_str(body);
            let _ = socket.write_all(response.as_bytes()).await;
            let _ = socket.shutdown().await;
        }
        Some(Reply::Silence) => {
            // Until the client gives up and closes its end.
            while matches!(socket.read(&mut buf).await, Ok(n) if n > 0) {}
        }
        None => {
            let body = r#"{"error":{"message":"the test server ran out of replies"}}"#;
            let response = format!(
                "HTTP/1.1 418 I'm a teapot\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = socket.write_all(response.as_bytes()).await;
        }
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        401 => "Unauthorized",
        429 => "Too Many Requests",
        503 => "Service Unavailable",
        _ => "Whatever",
    }
}

fn tools() -> Vec<ToolSpec> {
    vec![
        ToolSpec {
            name: "lookup_order".to_owned(),
            description: "Look up an order by id.".to_owned(),
            input_schema: json!({
                "type": "object",
                "properties": {"order_id": {"type": "string"}},
                "required": ["order_id"],
                "additionalProperties": false,
            }),
        },
        ToolSpec {
            name: "refund".to_owned(),
            description: "Refund part or all of an order.".to_owned(),
            input_schema: json!({
                "type": "object",
                "properties": {"order_id": {"type": "string"}, "amount": {"type": "number"}},
                "required": ["order_id", "amount"],
                "additionalProperties": false,
            }),
        },
    ]
}

fn task() -> Vec<Message> {
    vec![Message::User {
        content: "Refund order A-100.".to_owned(),
    }]
}

/// The calls of a step that must be one.
fn calls(step: Action) -> Vec<ToolCall> {
    match step {
        Action::Call { calls, .. } => calls,
        Action::Final(text) => panic!("a call, not the final answer {text:?}"),
    }
}

fn object(arguments: &Arguments) -> &Map<String, Value> {
    match arguments {
        Arguments::Object { value } => value,
        Arguments::Unparsed { raw, error } => panic!("an object, not {raw:?} ({error})"),
    }
}

#[tokio::test]
async fn two_calls_in_one_message_are_two_calls_in_order_and_the_request_carries_everything() {
    let server = Server::start(vec![ok(TWO_CALLS)]).await;
    let mut config = server.config();
    config.system = Some("You are a support agent. Refunds over $25 need approval.".to_owned());
    let adapter = ChatCompletions::new(config).expect("adapter");

    let calls = calls(adapter.next(&task(), &tools()).await.expect("a step"));

    let got: Vec<(&str, &str)> = calls
        .iter()
        .map(|c| (c.id.as_str(), c.name.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            ("call_Xk3v9QeR2mTzL8pWnB4yHc1s", "lookup_order"),
            ("call_7GdFh2JqN5aVbK0rS6wUeM3t", "refund"),
        ]
    );
    assert_eq!(
        Value::Object(object(&calls[0].arguments).clone()),
        json!({"order_id": "A-100"})
    );
    assert_eq!(
        Value::Object(object(&calls[1].arguments).clone()),
        json!({"order_id": "A-100", "amount": 12.5})
    );

    let received = server.received();
    assert_eq!(received.len(), 1);
    let request = &received[0];
    assert_eq!(request.method, "POST");
    assert_eq!(request.path, "/v1/chat/completions");
    assert_eq!(request.headers["authorization"], format!("Bearer {KEY}"));
    assert_eq!(request.headers["content-type"], "application/json");
    assert_eq!(request.body["model"], "gpt-4.1-mini");
    assert_eq!(
        request.body["messages"],
        json!([
            {"role": "system", "content": "You are a support agent. Refunds over $25 need approval."},
            {"role": "user", "content": "Refund order A-100."},
        ])
    );
    let wire_tools: Vec<Value> = tools()
        .into_iter()
        .map(|t| {
            json!({"type": "function", "function": {
                "name": t.name, "description": t.description, "parameters": t.input_schema,
            }})
        })
        .collect();
    assert_eq!(request.body["tools"], Value::Array(wire_tools));
}

#[tokio::test]
async fn the_key_is_in_no_debug_output() {
    let server = Server::start(Vec::new()).await;
    let config = server.config();
    assert!(!format!("{config:?}").contains(KEY));
    let adapter = ChatCompletions::new(config).expect("adapter");
    let debug = format!("{adapter:?}");
    assert!(!debug.contains(KEY), "{debug}");
    assert!(!debug.contains("7f3a9c2e"), "{debug}");
}

#[tokio::test]
async fn invalid_json_arguments_are_unparsed_data_not_an_error() {
    let server = Server::start(vec![ok(INVALID_ARGUMENTS)]).await;
    let adapter = ChatCompletions::new(server.config()).expect("adapter");

    let calls = calls(
        adapter
            .next(&task(), &tools())
            .await
            .expect("a step, not an error"),
    );

    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].id, "call_Pq8sLm2NvX4cR6tY0wZaE1bF");
    assert_eq!(calls[0].name, "refund");
    match &calls[0].arguments {
        Arguments::Unparsed { raw, error } => {
            assert_eq!(raw, r#"{"order_id": "A-100", "amount": 49"#);
            assert!(error.contains("not valid JSON"), "{error}");
        }
        other => panic!("unparsed, not {other:?}"),
    }
}

#[tokio::test]
async fn an_integer_where_the_schema_says_number_stays_the_integer() {
    let server = Server::start(vec![ok(INTEGER_ARGUMENT)]).await;
    let adapter = ChatCompletions::new(server.config()).expect("adapter");

    let calls = calls(adapter.next(&task(), &tools()).await.expect("a step"));

    let amount = &object(&calls[0].arguments)["amount"];
    assert_eq!(*amount, json!(49));
    assert!(amount.is_u64(), "an integer, not {amount:?}");
    assert_eq!(amount.to_string(), "49");
}

#[tokio::test]
async fn no_tool_call_is_the_final_answer_and_no_key_means_no_authorization_header() {
    let server = Server::start(vec![ok(FINAL)]).await;
    let mut config = server.config();
    config.api_key = None;
    let adapter = ChatCompletions::new(config).expect("adapter");

    let step = adapter.next(&task(), &tools()).await.expect("a step");

    assert_eq!(
        step,
        Action::Final(
            "Order A-100 was refunded $12.50. The refund of $49 needs a person's approval, so I \
             have not made it."
                .to_owned()
        )
    );
    let received = server.received();
    assert_eq!(received.len(), 1);
    assert!(!received[0].headers.contains_key("authorization"));
}

#[tokio::test]
async fn too_many_requests_waits_for_retry_after_then_succeeds() {
    let server = Server::start(vec![
        Reply::Answer {
            status: 429,
            headers: vec![("retry-after", "1")],
            body: RATE_LIMITED,
        },
        ok(FINAL),
    ])
    .await;
    let adapter = ChatCompletions::new(server.config()).expect("adapter");

    let step = adapter.next(&task(), &tools()).await.expect("a step");

    assert!(matches!(step, Action::Final(_)), "{step:?}");
    let received = server.received();
    assert_eq!(received.len(), 2);
    let waited = received[1].at - received[0].at;
    assert!(waited >= Duration::from_millis(950), "{waited:?}");
    assert!(waited < Duration::from_secs(5), "{waited:?}");
    assert_eq!(received[0].body, received[1].body, "the same request again");
}

#[tokio::test]
async fn service_unavailable_twice_then_success_backs_off_and_succeeds() {
    let server = Server::start(vec![
        status(503, UNAVAILABLE),
        status(503, UNAVAILABLE),
        ok(TWO_CALLS),
    ])
    .await;
    let adapter = ChatCompletions::new(server.config()).expect("adapter");

    let calls = calls(adapter.next(&task(), &tools()).await.expect("a step"));

    assert_eq!(calls.len(), 2);
    let received = server.received();
    assert_eq!(received.len(), 3);
    // 250 ms, then 500 ms: the backoff doubles.
    let first = received[1].at - received[0].at;
    let second = received[2].at - received[1].at;
    assert!(first >= Duration::from_millis(240), "{first:?}");
    assert!(second >= Duration::from_millis(490), "{second:?}");
}

#[tokio::test]
async fn server_errors_on_every_attempt_are_unavailable_after_exactly_max_attempts() {
    let server = Server::start((0..6).map(|_| status(503, UNAVAILABLE)).collect()).await;
    let mut config = server.config();
    config.max_attempts = 3;
    config.max_backoff = Duration::from_millis(20);
    let adapter = ChatCompletions::new(config).expect("adapter");

    let error = adapter
        .next(&task(), &tools())
        .await
        .expect_err("unavailable");

    let ModelError::Unavailable(reason) = &error else {
        panic!("unavailable, not {error:?}")
    };
    assert!(reason.contains("503"), "{reason}");
    assert!(reason.contains("overloaded"), "{reason}");
    assert_eq!(server.received().len(), 3);
}

#[tokio::test]
async fn unauthorized_is_refused_at_once_and_the_error_never_shows_the_key() {
    let server = Server::start(vec![status(401, UNAUTHORIZED), ok(FINAL)]).await;
    let adapter = ChatCompletions::new(server.config()).expect("adapter");

    let error = adapter.next(&task(), &tools()).await.expect_err("refused");

    assert!(matches!(error, ModelError::Refused(_)), "{error:?}");
    let shown = error.to_string();
    assert!(shown.contains("401"), "{shown}");
    assert!(shown.contains("Incorrect API key provided"), "{shown}");
    assert!(!shown.contains(KEY), "{shown}");
    assert!(!format!("{error:?}").contains(KEY));
    assert_eq!(server.received().len(), 1, "no retry");
}

#[tokio::test]
async fn a_server_that_never_answers_is_unavailable_in_bounded_time() {
    let server = Server::start(vec![Reply::Silence, Reply::Silence, Reply::Silence]).await;
    let mut config = server.config();
    config.timeout = Duration::from_millis(300);
    config.max_attempts = 2;
    let adapter = ChatCompletions::new(config).expect("adapter");

    let started = Instant::now();
    let outcome = tokio::time::timeout(Duration::from_secs(10), adapter.next(&task(), &tools()))
        .await
        .expect("the adapter gives up by itself");
    let took = started.elapsed();

    assert!(
        matches!(outcome, Err(ModelError::Unavailable(_))),
        "{outcome:?}"
    );
    // Two timeouts of 300 ms and one backoff of 250 ms.
    assert!(took >= Duration::from_millis(600), "{took:?}");
    assert!(took < Duration::from_secs(3), "{took:?}");
    assert_eq!(server.received().len(), 2);
}

#[tokio::test]
async fn a_body_that_is_not_a_chat_completion_is_malformed() {
    let server = Server::start(vec![ok("<html><body>Bad gateway</body></html>"), ok(FINAL)]).await;
    let adapter = ChatCompletions::new(server.config()).expect("adapter");

    let error = adapter
        .next(&task(), &tools())
        .await
        .expect_err("malformed");

    assert!(matches!(error, ModelError::Malformed(_)), "{error:?}");
    assert_eq!(server.received().len(), 1, "no retry");
}

#[tokio::test]
async fn the_conversation_goes_back_in_the_wire_shape() {
    let server = Server::start(vec![ok(FINAL)]).await;
    let adapter = ChatCompletions::new(server.config()).expect("adapter");
    let truncated = r#"{"order_id": "A-100", "amount": 49"#;
    let lookup_outcome = json!({"ran": true, "tier": "low", "output": {"status": "delivered"}});
    let refund_outcome = json!({"ran": false, "error": "invalid arguments: not valid JSON"});
    let messages = vec![
        Message::User {
            content: "Refund order A-100.".to_owned(),
        },
        Message::Assistant {
            content: Some("Checking the order first.".to_owned()),
            tool_calls: vec![
                ToolCall {
                    id: "call_1".to_owned(),
                    name: "lookup_order".to_owned(),
                    arguments: Arguments::parse(r#"{"order_id": "A-100"}"#),
                },
                ToolCall {
                    id: "call_2".to_owned(),
                    name: "refund".to_owned(),
                    arguments: Arguments::parse(truncated),
                },
            ],
        },
        Message::Tool {
            tool_call_id: "call_1".to_owned(),
            content: lookup_outcome.clone(),
        },
        Message::Tool {
            tool_call_id: "call_2".to_owned(),
            content: refund_outcome.clone(),
        },
    ];

    adapter.next(&messages, &tools()).await.expect("a step");

    let received = server.received();
    let wire = received[0].body["messages"]
        .as_array()
        .expect("messages")
        .clone();
    assert_eq!(wire.len(), 4);
    assert_eq!(
        wire[0],
        json!({"role": "user", "content": "Refund order A-100."})
    );
    assert_eq!(
        wire[1],
        json!({
            "role": "assistant",
            "content": "Checking the order first.",
            "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "lookup_order", "arguments": "{\"order_id\":\"A-100\"}"}},
                {"id": "call_2", "type": "function",
                 "function": {"name": "refund", "arguments": truncated}},
            ],
        })
    );
    for (turn, id, outcome) in [
        (&wire[2], "call_1", &lookup_outcome),
        (&wire[3], "call_2", &refund_outcome),
    ] {
        assert_eq!(turn["role"], "tool");
        assert_eq!(turn["tool_call_id"], id);
        let text = turn["content"]
            .as_str()
            .expect("the outcome as a JSON string");
        assert_eq!(&serde_json::from_str::<Value>(text).expect("JSON"), outcome);
    }
}

#[tokio::test]
async fn a_refused_connection_is_unavailable_and_the_error_names_no_url() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let base_url = format!("http://{}/v1", listener.local_addr().expect("address"));
    drop(listener);
    let mut config = Config::new(&base_url, "gpt-4.1-mini");
    config.api_key = Some(Secret::new(KEY));
    config.max_attempts = 2;
    config.max_backoff = Duration::from_millis(10);
    let adapter = ChatCompletions::new(config).expect("adapter");

    let error = adapter
        .next(&task(), &tools())
        .await
        .expect_err("unavailable");

    let ModelError::Unavailable(reason) = &error else {
        panic!("unavailable, not {error:?}")
    };
    assert!(reason.contains("cannot connect"), "{reason}");
    assert!(reason.contains("attempt 2 of 2"), "{reason}");
    assert!(!reason.contains(&base_url), "{reason}");
}
