//! The notification flags of `serve` (shared with `proxy` and `agent`): a flag that cannot work
//! stops start-up with exit 2 and a message naming it, before anything is written; a serving
//! process delivers a new approval request to a webhook and a Slack-compatible receiver on
//! 127.0.0.1, and its log says so without the secret, the Slack URL or the arguments.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};

use super::{Scratch, Server, eventually, policy_with};

/// The webhook's signing secret, as its file holds it.
const SECRET: &str = "whsec_cli_7c1e9a0b3d5f2468ace013579bdf";
/// The Slack URL's secret part.
const SLACK_TOKEN: &str = "XoXsEcReTtOkEn0123456789";
/// In the email body: arguments must not reach the log.
const BODY_MARKER: &str = "body-marker-never-logged";

/// One request a receiver got: lowercased header names, the body.
#[derive(Clone, Debug)]
struct Received {
    path: String,
    headers: BTreeMap<String, String>,
    body: Vec<u8>,
}

/// An HTTP/1.1 receiver on 127.0.0.1 that answers every request 200, on a thread of its own.
struct Receiver {
    base: String,
    got: Arc<Mutex<Vec<Received>>>,
}

impl Receiver {
    fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let base = format!("http://{}", listener.local_addr().expect("addr"));
        let got = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&got);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                if let Some(request) = read_request(stream) {
                    seen.lock().expect("lock").push(request);
                }
            }
        });
        Self { base, got }
    }

    fn received(&self) -> Vec<Received> {
        self.got.lock().expect("lock").clone()
    }
}

fn read_request(mut stream: TcpStream) -> Option<Received> {
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let mut buffer = Vec::new();
    let mut chunk = [0_u8; 4096];
    let head_end = loop {
        if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break at;
        }
        let n = stream.read(&mut chunk).ok().filter(|n| *n > 0)?;
        buffer.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buffer[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let path = lines.next()?.split(' ').nth(1)?.to_owned();
    let headers: BTreeMap<String, String> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let length: usize = headers.get("content-length")?.parse().ok()?;
    let mut body = buffer[head_end + 4..].to_vec();
    while body.len() < length {
        let n = stream.read(&mut chunk).ok().filter(|n| *n > 0)?;
        body.extend_from_slice(&chunk[..n]);
    }
    let _ =
        stream.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok");
    Some(Received {
        path,
        headers,
        body,
    })
}

/// `serve` with `flags`, run to its exit with stdin closed: exit code and stderr.
fn serve_with(scratch: &Scratch, flags: &[&str]) -> (Option<i32>, String) {
    let output = scratch
        .serve_command()
        .args(flags)
        .stdin(Stdio::null())
        .output()
        .expect("run toolgate serve");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn a_notification_flag_that_cannot_work_exits_2_naming_it_before_anything_is_written() {
    let scratch = Scratch::with_policy("orders.toml");
    let short = scratch.path("short.secret");
    std::fs::write(&short, "tooshort\n").expect("write");
    let good = scratch.path("good.secret");
    std::fs::write(&good, format!("{SECRET}\n")).expect("write");
    let slack_plain = scratch.path("slack.url");
    std::fs::write(
        &slack_plain,
        format!("http://hooks.slack.example/services/T0/B0/{SLACK_TOKEN}\n"),
    )
    .expect("write");
    let missing = scratch.path("missing.secret");
    let (short, good, slack_plain, missing) = (
        short.to_str().expect("UTF-8 path"),
        good.to_str().expect("UTF-8 path"),
        slack_plain.to_str().expect("UTF-8 path"),
        missing.to_str().expect("UTF-8 path"),
    );
    let cases: [(&[&str], &str); 7] = [
        (
            &["--webhook", "https://hooks.example.com/in"],
            "--webhook-secret-file",
        ),
        (&["--webhook-secret-file", good], "--webhook <URL>"),
        (
            &[
                "--webhook",
                "https://hooks.example.com/in",
                "--webhook-secret-file",
                missing,
            ],
            "cannot read webhook secret file",
        ),
        (
            &[
                "--webhook",
                "https://hooks.example.com/in",
                "--webhook-secret-file",
                short,
            ],
            "needs at least 16",
        ),
        (
            &[
                "--webhook",
                "http://hooks.example.com/in",
                "--webhook-secret-file",
                good,
            ],
            "--webhook: webhook URL \"http://hooks.example.com/in\": it must use https",
        ),
        (
            &["--slack-webhook-file", slack_plain],
            "Slack webhook URL: it must use https",
        ),
        (
            &["--console-url", "https://gate.example.com/?x=1"],
            "--console-url: console URL",
        ),
    ];
    for (flags, expected) in cases {
        let (code, stderr) = serve_with(&scratch, flags);
        assert_eq!(code, Some(2), "{flags:?}: {stderr}");
        assert!(stderr.contains(expected), "{flags:?}: {stderr}");
        assert!(!stderr.contains(SECRET), "{flags:?}: {stderr}");
        assert!(
            !stderr.contains(SLACK_TOKEN),
            "the Slack URL is a credential: {stderr}"
        );
        assert!(
            !scratch.data().exists(),
            "{flags:?}: the data directory was created"
        );
    }
}

#[test]
fn a_serving_process_delivers_a_new_request_and_never_logs_the_secret() {
    let webhook = Receiver::start();
    let slack = Receiver::start();
    let text = policy_with("orders.toml", &[("approval_wait", "\"1ms\"")]);
    let scratch = Scratch::with_policy_text("orders", &text);
    let secret_file = scratch.path("webhook.secret");
    std::fs::write(&secret_file, format!("{SECRET}\n")).expect("write");
    let slack_file = scratch.path("slack.url");
    let slack_url = format!("{}/services/T0/B0/{SLACK_TOKEN}", slack.base);
    std::fs::write(&slack_file, format!("{slack_url}\n")).expect("write");
    let log = scratch.path("serve.log");
    let webhook_url = format!("{}/hooks/toolgate", webhook.base);
    let mut command = scratch.serve_command();
    command
        .arg("--webhook")
        .arg(&webhook_url)
        .arg("--webhook-secret-file")
        .arg(&secret_file)
        .arg("--slack-webhook-file")
        .arg(&slack_file)
        .arg("--console-url")
        .arg("https://gate.example.com/console");
    let stderr = std::fs::File::create(&log).expect("log file");
    let mut server = Server::spawn(command, &[], Stdio::from(stderr));

    let reply = server.call(
        "send_email",
        json!({"to": "ada@customer.test", "subject": "Hello", "body": BODY_MARKER}),
    );
    let pending = &reply["result"]["structuredContent"];
    assert_eq!(pending["status"], "pending_approval", "{reply}");
    let id = pending["approval_id"]
        .as_str()
        .expect("approval id")
        .to_owned();
    // Delivered while the server still serves: the call did not wait for it, the task did.
    let got = eventually("the webhook delivery", Duration::from_secs(10), || {
        let got = webhook.received();
        (!got.is_empty()).then_some(got)
    });
    server.close();

    assert_eq!(got.len(), 1, "{got:?}");
    let request = &got[0];
    assert_eq!(request.path, "/hooks/toolgate");
    let timestamp = &request.headers["x-toolgate-timestamp"];
    let signature = request.headers["x-toolgate-signature"]
        .strip_prefix("sha256=")
        .expect("sha256= prefix");
    let mut message = timestamp.as_bytes().to_vec();
    message.push(b'.');
    message.extend_from_slice(&request.body);
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, SECRET.as_bytes());
    ring::hmac::verify(
        &key,
        &message,
        &hex::decode(signature).expect("hex signature"),
    )
    .expect("the signature verifies with the secret from the file");
    let body: Value = serde_json::from_slice(&request.body).expect("JSON");
    assert_eq!(body["approval_id"], id.as_str());
    assert_eq!(
        body["console_url"],
        format!("https://gate.example.com/console/approvals/{id}")
    );

    let posted = slack.received();
    assert_eq!(posted.len(), 1, "{posted:?}");
    assert_eq!(posted[0].path, format!("/services/T0/B0/{SLACK_TOKEN}"));
    let message: Value = serde_json::from_slice(&posted[0].body).expect("JSON");
    assert!(
        message["text"]
            .as_str()
            .expect("text")
            .contains(&format!("|Review request {id}>")),
        "{message}"
    );

    let text = std::fs::read_to_string(&log).expect("log");
    assert!(
        !text.contains(SECRET),
        "the webhook secret is in the log:\n{text}"
    );
    assert!(
        !text.contains(SLACK_TOKEN),
        "the Slack URL is in the log:\n{text}"
    );
    assert!(
        !text.contains(BODY_MARKER),
        "the arguments are in the log:\n{text}"
    );
    let delivered: Vec<Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|l| l["fields"]["message"] == "approval notification delivered")
        .collect();
    let mut channels: Vec<&str> = delivered
        .iter()
        .map(|l| {
            assert_eq!(l["fields"]["approval_id"], id.as_str(), "{l}");
            assert_eq!(l["fields"]["status"], 200, "{l}");
            assert_eq!(l["fields"]["attempts"], 1, "{l}");
            l["fields"]["channel"].as_str().unwrap_or_default()
        })
        .collect();
    channels.sort_unstable();
    assert_eq!(
        channels,
        ["slack", "webhook"],
        "one line per delivery:\n{text}"
    );
}
