//! Delivery: the task that takes announcements off the queue, one task per delivery (bounded by a
//! semaphore), and each delivery's attempts with backoff. Every outcome is one log line; the
//! lines name the approval and the channel, never the secret, the Slack URL or the arguments.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use reqwest::header::{CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use reqwest::{Client, StatusCode};
use tokio::sync::{Semaphore, mpsc};
use tokio::time::Instant;
use toolgate_store::approval::Approval;

use super::{Console, Retry, Slack, Tracker, Webhook, payload};

/// The header that carries the signature, as `sha256=HEX`.
pub(super) const SIGNATURE_HEADER: &str = "x-toolgate-signature";
/// The header that carries the signing time, in unix seconds.
pub(super) const TIMESTAMP_HEADER: &str = "x-toolgate-timestamp";

/// Where announcements go and how hard to try.
#[derive(Debug)]
pub(super) struct Targets {
    pub(super) client: Client,
    pub(super) webhook: Option<Webhook>,
    pub(super) slack: Option<Slack>,
    pub(super) console: Option<Console>,
    pub(super) retry: Retry,
}

/// One of the configured channels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Channel {
    Webhook,
    Slack,
}

impl Channel {
    fn name(self) -> &'static str {
        match self {
            Self::Webhook => "webhook",
            Self::Slack => "slack",
        }
    }
}

impl Targets {
    /// The channels configured, in a fixed order.
    pub(super) fn channels(&self) -> impl Iterator<Item = Channel> + '_ {
        [
            self.webhook.as_ref().map(|_| Channel::Webhook),
            self.slack.as_ref().map(|_| Channel::Slack),
        ]
        .into_iter()
        .flatten()
    }
}

/// Takes announcements off the queue until every sender is gone, starting one delivery task per
/// channel as a permit frees up: a slow or dead receiver holds up its own deliveries only.
pub(super) async fn dispatch(
    mut queue: mpsc::Receiver<Approval>,
    targets: Arc<Targets>,
    tracker: Arc<Tracker>,
    concurrency: Arc<Semaphore>,
) {
    while let Some(approval) = queue.recv().await {
        let approval = Arc::new(approval);
        for channel in targets.channels() {
            // Counted at enqueue; from here a guard gives the count back however the task ends.
            let done = Done(Arc::clone(&tracker));
            let Ok(permit) = Arc::clone(&concurrency).acquire_owned().await else {
                return;
            };
            let targets = Arc::clone(&targets);
            let approval = Arc::clone(&approval);
            tokio::spawn(async move {
                let _permit = permit;
                let _done = done;
                targets.deliver(channel, &approval).await;
            });
        }
    }
}

/// Gives one delivery back to the tracker when dropped, and wakes `drain` at zero.
struct Done(Arc<Tracker>);

impl Drop for Done {
    fn drop(&mut self) {
        if self.0.open.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

/// What one attempt came to.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Attempt {
    /// The receiver took it (2xx).
    Delivered(StatusCode),
    /// Worth another try (connection error, timeout, 408, 429, 5xx), after the receiver's own
    /// `Retry-After` when it gave one.
    Retry {
        why: String,
        after: Option<Duration>,
    },
    /// Another try would get the same answer (another 4xx, a redirect).
    GiveUp(String),
}

/// How an answer's status is judged.
pub(super) fn judge(status: StatusCode, retry_after: Option<Duration>) -> Attempt {
    if status.is_success() {
        Attempt::Delivered(status)
    } else if status.is_server_error()
        || status == StatusCode::TOO_MANY_REQUESTS
        || status == StatusCode::REQUEST_TIMEOUT
    {
        Attempt::Retry {
            why: format!("the receiver answered {status}"),
            after: retry_after,
        }
    } else if status.is_redirection() {
        // A POST redirected by 301/302 becomes a GET, and a redirect could carry the body to a
        // host nobody configured; the configured URL is the one to fix.
        Attempt::GiveUp(format!(
            "the receiver answered {status} (a redirect; redirects are not followed)"
        ))
    } else {
        Attempt::GiveUp(format!("the receiver answered {status}"))
    }
}

/// The pause before attempt `next` (2 for the first retry): the first backoff, doubled each
/// time, capped.
pub(super) fn backoff(retry: &Retry, next: u32) -> Duration {
    let doublings = next.saturating_sub(2).min(20);
    retry
        .first_backoff
        .saturating_mul(1 << doublings)
        .min(retry.max_backoff)
}

impl Targets {
    /// Delivers one announcement on one channel, retrying as [`Retry`] allows, and logs how it
    /// ended.
    async fn deliver(&self, channel: Channel, approval: &Approval) {
        let body = match channel {
            Channel::Webhook => payload::webhook(approval, self.console.as_ref()),
            Channel::Slack => payload::slack(approval, self.console.as_ref()),
        };
        let body = serde_json::to_vec(&body).unwrap_or_default();
        let started = Instant::now();
        let attempts = self.retry.attempts.max(1);
        let mut attempt = 0;
        loop {
            attempt += 1;
            let outcome = self.attempt(channel, &body).await;
            let elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
            let (why, after) = match outcome {
                Attempt::Delivered(status) => {
                    tracing::info!(
                        approval_id = %approval.id,
                        channel = channel.name(),
                        attempts = attempt,
                        status = status.as_u16(),
                        elapsed_ms,
                        "approval notification delivered"
                    );
                    return;
                }
                Attempt::GiveUp(why) => {
                    give_up(approval, channel, attempt, elapsed_ms, &why);
                    return;
                }
                Attempt::Retry { why, after } => (why, after),
            };
            if attempt >= attempts {
                give_up(approval, channel, attempt, elapsed_ms, &why);
                return;
            }
            let wait = after
                .unwrap_or_else(|| backoff(&self.retry, attempt + 1))
                .min(self.retry.max_backoff);
            if started.elapsed() + wait > self.retry.deadline {
                let why = format!("{why}; no time left for another attempt");
                give_up(approval, channel, attempt, elapsed_ms, &why);
                return;
            }
            tracing::debug!(
                approval_id = %approval.id,
                channel = channel.name(),
                attempt,
                retry_in_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
                why = %why,
                "approval notification attempt failed; retrying"
            );
            tokio::time::sleep(wait).await;
        }
    }

    /// One POST of `body` on `channel`.
    async fn attempt(&self, channel: Channel, body: &[u8]) -> Attempt {
        let request = match channel {
            Channel::Webhook => {
                let Some(webhook) = &self.webhook else {
                    return Attempt::GiveUp("no webhook is configured".to_owned());
                };
                // Signed per attempt: a retry a minute later carries a fresh timestamp, so a
                // receiver's replay window does not refuse it.
                let timestamp = unix_seconds();
                let signature = payload::signature(&webhook.key, timestamp, body);
                self.client
                    .post(webhook.url.clone())
                    .header(TIMESTAMP_HEADER, timestamp)
                    .header(SIGNATURE_HEADER, format!("sha256={signature}"))
            }
            Channel::Slack => {
                let Some(slack) = &self.slack else {
                    return Attempt::GiveUp("no Slack webhook is configured".to_owned());
                };
                self.client.post(slack.url.clone())
            }
        };
        let sent = request
            .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
            .body(body.to_vec())
            .send()
            .await;
        match sent {
            Ok(answer) => {
                let after = answer
                    .headers()
                    .get(RETRY_AFTER)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .map(Duration::from_secs);
                judge(answer.status(), after)
            }
            Err(error) => Attempt::Retry {
                why: failure(&error, self.retry.timeout),
                after: None,
            },
        }
    }
}

/// The one line a delivery that did not arrive leaves.
fn give_up(approval: &Approval, channel: Channel, attempts: u32, elapsed_ms: u64, why: &str) {
    tracing::error!(
        approval_id = %approval.id,
        channel = channel.name(),
        attempts,
        elapsed_ms,
        why,
        "approval notification not delivered; gave up"
    );
}

/// Why a request got no answer, without its URL (a Slack URL is a credential).
fn failure(error: &reqwest::Error, timeout: Duration) -> String {
    if error.is_timeout() {
        return format!("no answer within {} ms", timeout.as_millis());
    }
    let mut why = if error.is_connect() {
        "cannot connect".to_owned()
    } else {
        "the request failed".to_owned()
    };
    // reqwest's own message names the URL; its causes (the connector's, the OS's) do not.
    let mut cause = std::error::Error::source(error);
    while let Some(inner) = cause {
        why.push_str(": ");
        why.push_str(&inner.to_string());
        cause = inner.source();
    }
    why
}

/// Unix seconds now, as the signature's timestamp.
fn unix_seconds() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
