use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;
use toolgate_core::secret::Secret;
use toolgate_store::approval::{Approval, Status};

use super::deliver::{Attempt, backoff, judge};
use super::*;

fn row() -> Approval {
    Approval {
        id: "apr_0123456789ab".to_owned(),
        fingerprint: "f".repeat(64),
        requester: "agent:<!channel>".to_owned(),
        tool: "send_email".to_owned(),
        args_redacted: json!({"to": "x@y.test", "body": "<https://evil.test|click> [REDACTED]"}),
        tier: "high".to_owned(),
        reason: "tier high (rule tools.send_email.escalate[0]) & more".to_owned(),
        dry_run: json!({"would": "send an email to x@y.test"}),
        policy_sha256: "ab".repeat(32),
        status: Status::Pending,
        created_at: 1_767_225_600_000,
        expires_at: 1_767_225_900_000,
        decided_by: None,
        decided_at: None,
        decision_reason: None,
        used_at: None,
        result: None,
        approvers: None,
        approvals_required: 1,
    }
}

#[test]
fn the_signature_matches_a_fixed_vector() {
    // Computed independently: Python's hmac.new(b"whsec_test_secret",
    // b"1767225600." + body, hashlib.sha256).hexdigest(). If this changes, every receiver's
    // verification breaks.
    let key = hmac::Key::new(hmac::HMAC_SHA256, b"whsec_test_secret");
    let body = br#"{"type":"approval.requested","approval_id":"apr_0123456789ab"}"#;
    assert_eq!(
        payload::signature(&key, 1_767_225_600, body),
        "05693ab1962bcd4c55ef0b787042b45696fcf6d79f9107f416147c5ba0c25548"
    );
}

#[test]
fn the_webhook_body_has_every_field_a_receiver_acts_on() {
    let console = Console::new("https://gate.example.com/console/").expect("console");
    let body = payload::webhook(&row(), Some(&console));
    assert_eq!(body["type"], "approval.requested");
    assert_eq!(body["approval_id"], "apr_0123456789ab");
    assert_eq!(body["tool"], "send_email");
    assert_eq!(body["arguments"]["to"], "x@y.test");
    assert_eq!(body["requester"], "agent:<!channel>");
    assert_eq!(body["tier"], "high");
    assert_eq!(body["dry_run"]["would"], "send an email to x@y.test");
    assert_eq!(body["requested_at"], "2026-01-01T00:00:00Z");
    assert_eq!(body["expires_at"], "2026-01-01T00:05:00Z");
    assert_eq!(body["policy_sha256"], "ab".repeat(32));
    assert_eq!(
        body["console_url"],
        "https://gate.example.com/console/approvals/apr_0123456789ab"
    );
    assert!(payload::webhook(&row(), None)["console_url"].is_null());
    // Who may decide, so a receiver can route the request to them.
    assert!(body["approvers"].is_null(), "anyone but the requester");
    assert_eq!(body["approvals_required"], 1);
    let two = Approval {
        approvers: Some(vec!["group:finance".to_owned()]),
        approvals_required: 2,
        ..row()
    };
    let body = payload::webhook(&two, None);
    assert_eq!(body["approvers"], json!(["group:finance"]));
    assert_eq!(body["approvals_required"], 2);
}

#[test]
fn a_slack_message_cannot_be_made_to_mention_or_link_by_the_caller() {
    let console = Console::new("https://gate.example.com").expect("console");
    let message = payload::slack(&row(), Some(&console));
    let text = message.to_string();
    assert!(!text.contains("<!channel>"), "{text}");
    assert!(!text.contains("<https://evil.test"), "{text}");
    assert!(text.contains("&lt;!channel&gt;"), "{text}");
    assert!(text.contains("&amp; more"), "{text}");
    // The one link is the console's.
    assert!(
        message["text"].as_str().expect("text").contains(
            "<https://gate.example.com/approvals/apr_0123456789ab|Review request apr_0123456789ab>"
        ),
        "{text}"
    );
    assert!(text.contains("<!date^1767225900^"), "{text}");
}

#[test]
fn a_long_slack_argument_block_stays_within_slacks_limits() {
    let mut approval = row();
    approval.args_redacted = json!({"body": "<".repeat(10_000)});
    let message = payload::slack(&approval, None);
    for block in message["blocks"].as_array().expect("blocks") {
        if let Some(text) = block["text"]["text"].as_str() {
            assert!(text.chars().count() <= 3000, "{}", text.len());
            // No entity is cut in half.
            assert!(!text.contains("&l…") && !text.contains("&…"), "{text}");
        }
    }
}

#[test]
fn statuses_are_judged_as_a_receiver_means_them() {
    assert_eq!(
        judge(StatusCode::NO_CONTENT, None),
        Attempt::Delivered(StatusCode::NO_CONTENT)
    );
    for retried in [500, 502, 503, 504, 429, 408] {
        let status = StatusCode::from_u16(retried).expect("status");
        assert!(
            matches!(judge(status, None), Attempt::Retry { .. }),
            "{retried}"
        );
    }
    for final_ in [400, 401, 403, 404, 410, 301, 302, 307] {
        let status = StatusCode::from_u16(final_).expect("status");
        assert!(
            matches!(judge(status, None), Attempt::GiveUp(_)),
            "{final_}"
        );
    }
}

#[test]
fn backoff_doubles_from_the_first_pause_and_is_capped() {
    let retry = Retry::default();
    let pauses: Vec<Duration> = (2..=7).map(|next| backoff(&retry, next)).collect();
    assert_eq!(
        pauses,
        [500, 1000, 2000, 4000, 8000, 8000].map(Duration::from_millis)
    );
}

#[test]
fn urls_must_be_https_or_loopback_and_carry_no_credentials() {
    let secret = Secret::new("0123456789abcdef");
    assert!(Webhook::new("https://hooks.example.com/in", &secret).is_ok());
    assert!(Webhook::new("http://127.0.0.1:9/in", &secret).is_ok());
    assert!(Webhook::new("http://localhost/in", &secret).is_ok());
    assert!(Webhook::new("http://[::1]:8080/in", &secret).is_ok());
    let problem = |r: Result<Webhook, ConfigError>| match r {
        Err(ConfigError::WebhookUrl { problem, .. }) => problem,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        problem(Webhook::new("http://hooks.example.com/in", &secret)),
        UrlProblem::PlainHttp
    );
    assert_eq!(
        problem(Webhook::new("https://u:p@hooks.example.com/", &secret)),
        UrlProblem::Credentials
    );
    assert_eq!(
        problem(Webhook::new("hooks.example.com", &secret)),
        UrlProblem::NotUrl
    );
    assert_eq!(
        problem(Webhook::new("ftp://hooks.example.com/", &secret)),
        UrlProblem::PlainHttp
    );
    assert!(matches!(
        Webhook::new("https://hooks.example.com/", &Secret::new("  short \n")),
        Err(ConfigError::WeakSecret { chars: 5, .. })
    ));
    assert!(matches!(
        Console::new("https://gate.example.com/?x=1"),
        Err(ConfigError::ConsoleUrl {
            problem: UrlProblem::QueryOrFragment,
            ..
        })
    ));
}

#[test]
fn a_slack_url_never_appears_in_an_error_or_debug_output() {
    let url = "http://hooks.slack.example/services/T0/B0/sekrit-token-value";
    let error = Slack::new(&Secret::new(url)).expect_err("plain http to another host");
    assert!(!error.to_string().contains("sekrit"), "{error}");
    let slack = Slack::new(&Secret::new(url.replace("http:", "https:"))).expect("https");
    assert!(!format!("{slack:?}").contains("sekrit"));
    let webhook = Webhook::new(
        "https://hooks.example.com/in?token=abc",
        &Secret::new("0123456789abcdef-secret"),
    )
    .expect("webhook");
    let shown = format!("{webhook:?}");
    assert!(
        !shown.contains("0123456789abcdef") && !shown.contains("token=abc"),
        "{shown}"
    );
}

#[test]
fn a_notifier_needs_a_target_and_a_runtime() {
    assert!(matches!(
        Notifier::start(Config::new()),
        Err(ConfigError::NoTarget)
    ));
    let webhook =
        Webhook::new("http://127.0.0.1:9/", &Secret::new("0123456789abcdef")).expect("webhook");
    assert!(matches!(
        Notifier::start(Config::new().with_webhook(webhook)),
        Err(ConfigError::NoRuntime)
    ));
}

#[tokio::test]
async fn a_full_queue_drops_without_waiting_and_drain_counts_it_out() {
    // Port 9 (discard) on loopback: nothing listens, every attempt fails at once.
    let webhook =
        Webhook::new("http://127.0.0.1:9/", &Secret::new("0123456789abcdef")).expect("webhook");
    let retry = Retry {
        attempts: 1,
        ..Retry::default()
    };
    let notifier = Notifier::start(
        Config::new()
            .with_webhook(webhook)
            .with_retry(retry)
            .with_queue(1),
    )
    .expect("notifier");
    // Nothing has run yet on this single-threaded runtime: the first fills the queue.
    assert!(notifier.requested(&row()));
    assert!(!notifier.requested(&row()), "a full queue refuses at once");
    assert_eq!(notifier.in_flight(), 1);
    assert_eq!(notifier.drain(Duration::from_secs(10)).await, 0);
}
