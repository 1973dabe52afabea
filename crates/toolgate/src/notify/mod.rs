//! Notifications: when a call opens a new approval request, the people who decide hear about it
//! where they are (DESIGN.md §6, issue 14): a generic webhook (JSON signed with HMAC-SHA256) and a
//! Slack-compatible message to an incoming-webhook URL, each with a link to the request in the
//! console when one is configured.
//!
//! It owns building, signing and delivering those messages. It must not delay or fail the call
//! that asked: the corridor only puts the row on a bounded queue ([`Notifier::requested`]), which
//! never waits; a full queue drops the announcement with an error log. It does not decide who
//! hears what, and it reads no files or environment: the CLI reads the secret and the Slack URL
//! from the files its flags name.
//!
//! Design decision: delivery is at-least-once, from memory, with bounded retries (exponential
//! backoff on connection errors, timeouts, 408, 429 and 5xx; none on other 4xx), not a durable
//! outbox. The approval row is the record that matters and stays decidable from the CLI and the
//! console whatever happens to a notification; a durable outbox would add a second queue to keep
//! consistent with it, for a message that is only a pointer to the row. A process that exits gives
//! deliveries in flight a bounded time ([`Notifier::drain`]), and every delivery that did not
//! arrive is logged with its approval id.
//!
//! The signature follows the scheme of Stripe's and Slack's signed requests: the MAC covers
//! `timestamp + "." + body`, so a receiver can refuse replays by the timestamp (README:
//! "Notifications").

mod deliver;
mod error;
mod payload;

#[cfg(test)]
mod tests;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use ring::hmac;
use tokio::sync::{Notify, Semaphore, mpsc};
use toolgate_core::secret::Secret;
use toolgate_store::approval::Approval;
use url::Url;

pub use error::{ConfigError, UrlProblem};

use deliver::Targets;

/// The `type` every generic webhook body carries.
pub const EVENT_REQUESTED: &str = payload::EVENT;

/// The request header with the signature, `sha256=` and 64 lowercase hex digits.
pub const SIGNATURE_HEADER: &str = deliver::SIGNATURE_HEADER;

/// The request header with the unix time (seconds) the signature was made at.
pub const TIMESTAMP_HEADER: &str = deliver::TIMESTAMP_HEADER;

/// The fewest characters a webhook secret may have.
pub const MIN_SECRET_CHARS: usize = 16;

/// Announcements waiting for a delivery task, by default.
const QUEUE: usize = 256;

/// Deliveries in flight at once, by default.
const CONCURRENCY: usize = 16;

/// The generic webhook: where to POST, and the key its requests are signed with.
#[derive(Clone)]
pub struct Webhook {
    url: Url,
    key: hmac::Key,
}

impl Webhook {
    /// A webhook to `url` (https, or plain http to this machine), signed with `secret` (at least
    /// [`MIN_SECRET_CHARS`] characters after trimming).
    ///
    /// # Errors
    /// [`ConfigError::WebhookUrl`] or [`ConfigError::WeakSecret`].
    pub fn new(url: &str, secret: &Secret) -> Result<Self, ConfigError> {
        let url = target_url(url).map_err(|problem| ConfigError::WebhookUrl {
            url: url.to_owned(),
            problem,
        })?;
        let value = secret.expose().trim();
        let chars = value.chars().count();
        if chars < MIN_SECRET_CHARS {
            return Err(ConfigError::WeakSecret {
                chars,
                min: MIN_SECRET_CHARS,
            });
        }
        Ok(Self {
            url,
            key: hmac::Key::new(hmac::HMAC_SHA256, value.as_bytes()),
        })
    }
}

impl fmt::Debug for Webhook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The path and query may carry a receiver's own token; the host says which receiver.
        f.debug_struct("Webhook")
            .field("host", &self.url.host_str().unwrap_or_default())
            .field("secret", &"<redacted>")
            .finish()
    }
}

/// A Slack incoming webhook. Its URL is the credential (whoever has it can post to the channel),
/// so it is printed as `<redacted>` and never logged.
#[derive(Clone)]
pub struct Slack {
    url: Url,
}

impl Slack {
    /// An incoming webhook at `url` (https, or plain http to this machine).
    ///
    /// # Errors
    /// [`ConfigError::SlackUrl`], which does not repeat the URL.
    pub fn new(url: &Secret) -> Result<Self, ConfigError> {
        let url =
            target_url(url.expose().trim()).map_err(|problem| ConfigError::SlackUrl { problem })?;
        Ok(Self { url })
    }
}

impl fmt::Debug for Slack {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Slack").field("url", &"<redacted>").finish()
    }
}

/// The console's base URL: a request's page is `BASE/approvals/ID`.
#[derive(Clone, Debug)]
pub struct Console {
    /// Without a trailing slash.
    base: String,
}

impl Console {
    /// Links under `base` (https, or plain http to this machine; no query or fragment).
    ///
    /// # Errors
    /// [`ConfigError::ConsoleUrl`].
    pub fn new(base: &str) -> Result<Self, ConfigError> {
        let refuse = |problem| ConfigError::ConsoleUrl {
            url: base.to_owned(),
            problem,
        };
        let url = target_url(base).map_err(refuse)?;
        if url.query().is_some() || url.fragment().is_some() {
            return Err(refuse(UrlProblem::QueryOrFragment));
        }
        Ok(Self {
            base: url.as_str().trim_end_matches('/').to_owned(),
        })
    }

    /// The page of approval `id`.
    #[must_use]
    pub fn link(&self, id: &str) -> String {
        format!("{}/approvals/{id}", self.base)
    }
}

/// How hard a delivery is tried. A delivery ends at the first 2xx, at an answer another try would
/// not change, after `attempts` attempts, or when the next attempt would start after `deadline`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retry {
    /// Attempts in all, the first included (at least 1).
    pub attempts: u32,
    /// The pause before the first retry; each later pause doubles it.
    pub first_backoff: Duration,
    /// The longest pause, also for a receiver's `Retry-After`.
    pub max_backoff: Duration,
    /// How long one attempt may take, connecting included.
    pub timeout: Duration,
    /// No attempt starts later than this after the first.
    pub deadline: Duration,
}

impl Default for Retry {
    /// 5 attempts, 0.5 s, 1 s, 2 s, 4 s apart (8 s at most), 5 s each, within a minute.
    fn default() -> Self {
        Self {
            attempts: 5,
            first_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(8),
            timeout: Duration::from_secs(5),
            deadline: Duration::from_secs(60),
        }
    }
}

/// What a [`Notifier`] delivers to, and how.
#[derive(Clone, Debug)]
pub struct Config {
    webhook: Option<Webhook>,
    slack: Option<Slack>,
    console: Option<Console>,
    retry: Retry,
    queue: usize,
    concurrency: usize,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            webhook: None,
            slack: None,
            console: None,
            retry: Retry::default(),
            queue: QUEUE,
            concurrency: CONCURRENCY,
        }
    }
}

impl Config {
    /// No target yet, default retries, a queue of 256 and 16 deliveries at once.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Also POST the signed generic JSON to `webhook`.
    #[must_use]
    pub fn with_webhook(mut self, webhook: Webhook) -> Self {
        self.webhook = Some(webhook);
        self
    }

    /// Also post a Slack-compatible message to `slack`.
    #[must_use]
    pub fn with_slack(mut self, slack: Slack) -> Self {
        self.slack = Some(slack);
        self
    }

    /// Link each message to the request's page in `console`.
    #[must_use]
    pub fn with_console(mut self, console: Console) -> Self {
        self.console = Some(console);
        self
    }

    /// Retry deliveries as `retry` says.
    #[must_use]
    pub fn with_retry(mut self, retry: Retry) -> Self {
        self.retry = retry;
        self
    }

    /// At most `capacity` announcements wait for delivery (at least 1); more are dropped.
    #[must_use]
    pub fn with_queue(mut self, capacity: usize) -> Self {
        self.queue = capacity.max(1);
        self
    }

    /// At most `deliveries` deliveries in flight at once (at least 1).
    #[must_use]
    pub fn with_concurrency(mut self, deliveries: usize) -> Self {
        self.concurrency = deliveries.max(1);
        self
    }

    /// Whether there is nothing to deliver to.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.webhook.is_none() && self.slack.is_none()
    }
}

/// Deliveries announced and not finished, and a wake-up for [`Notifier::drain`] when that reaches
/// zero.
#[derive(Debug, Default)]
struct Tracker {
    open: AtomicUsize,
    idle: Notify,
}

/// Announces new approval requests; cheap to clone (every clone feeds the same queue and delivery
/// task). Lives on the [`Gate`](crate::gate::Gate), so the kit, `serve`, `proxy` and the agent
/// announce the same way.
#[derive(Clone)]
pub struct Notifier {
    queue: mpsc::Sender<Approval>,
    tracker: Arc<Tracker>,
    /// Deliveries per announcement: one per configured channel.
    channels: usize,
    names: &'static str,
}

impl fmt::Debug for Notifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Notifier")
            .field("channels", &self.names)
            .field("in_flight", &self.in_flight())
            .finish_non_exhaustive()
    }
}

impl Notifier {
    /// Builds the HTTP client and starts the delivery task on the current tokio runtime. Stops
    /// when the last clone is dropped (after the queue is emptied).
    ///
    /// # Errors
    /// [`ConfigError::NoTarget`], [`ConfigError::NoRuntime`] or [`ConfigError::Client`].
    pub fn start(config: Config) -> Result<Self, ConfigError> {
        if config.is_empty() {
            return Err(ConfigError::NoTarget);
        }
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| ConfigError::NoRuntime)?;
        crate::install_tls_provider();
        let client = reqwest::Client::builder()
            .user_agent(concat!("toolgate/", env!("CARGO_PKG_VERSION")))
            .timeout(config.retry.timeout)
            .connect_timeout(config.retry.timeout)
            // A redirect is an answer to fix in the configuration, not to follow (deliver.rs).
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| ConfigError::Client(e.without_url().to_string()))?;
        let targets = Targets {
            client,
            webhook: config.webhook,
            slack: config.slack,
            console: config.console,
            retry: config.retry,
        };
        let channels = targets.channels().count();
        let names = match (targets.webhook.is_some(), targets.slack.is_some()) {
            (true, true) => "webhook, slack",
            (true, false) => "webhook",
            _ => "slack",
        };
        let (queue, receiver) = mpsc::channel(config.queue);
        let tracker = Arc::new(Tracker::default());
        runtime.spawn(deliver::dispatch(
            receiver,
            Arc::new(targets),
            Arc::clone(&tracker),
            Arc::new(Semaphore::new(config.concurrency)),
        ));
        Ok(Self {
            queue,
            tracker,
            channels,
            names,
        })
    }

    /// Announces that `approval` was just requested. Never waits: the row is queued for the
    /// delivery task, or, when the queue is full or the task is gone, dropped with an error log.
    /// Returns whether it was queued.
    pub fn requested(&self, approval: &Approval) -> bool {
        // Counted before it is queued, so that `drain` never sees a queued announcement as done.
        self.tracker.open.fetch_add(self.channels, Ordering::AcqRel);
        match self.queue.try_send(approval.clone()) {
            Ok(()) => true,
            Err(refused) => {
                let why = match refused {
                    mpsc::error::TrySendError::Full(_) => "the notification queue is full",
                    mpsc::error::TrySendError::Closed(_) => "the notification task has stopped",
                };
                tracing::error!(
                    approval_id = %approval.id,
                    why,
                    "approval notification dropped; the request is still decidable"
                );
                if self.tracker.open.fetch_sub(self.channels, Ordering::AcqRel) == self.channels {
                    self.tracker.idle.notify_waiters();
                }
                false
            }
        }
    }

    /// The channels each announcement goes to: `webhook`, `slack` or `webhook, slack`.
    #[must_use]
    pub fn channels(&self) -> &'static str {
        self.names
    }

    /// Deliveries queued or under way.
    #[must_use]
    pub fn in_flight(&self) -> usize {
        self.tracker.open.load(Ordering::Acquire)
    }

    /// Waits up to `limit` for every queued delivery to end (delivered or given up); returns how
    /// many had not. For a process about to exit: its announcements are not lost to the exit.
    pub async fn drain(&self, limit: Duration) -> usize {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            // Made before the count is read: `notify_waiters` wakes a `Notified` from its creation.
            let idle = self.tracker.idle.notified();
            let open = self.in_flight();
            if open == 0 {
                return 0;
            }
            if tokio::time::timeout_at(deadline, idle).await.is_err() {
                return self.in_flight();
            }
        }
    }
}

/// A URL a notification may be sent to (or a console link may point at): absolute, with a host,
/// https or plain http to this machine, without credentials.
fn target_url(text: &str) -> Result<Url, UrlProblem> {
    let url = Url::parse(text).map_err(|_| UrlProblem::NotUrl)?;
    if !url.username().is_empty() || url.password().is_some() {
        return Err(UrlProblem::Credentials);
    }
    let loopback = match url.host() {
        Some(url::Host::Domain(name)) => name.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => return Err(UrlProblem::NoHost),
    };
    match url.scheme() {
        "https" => Ok(url),
        "http" if loopback => Ok(url),
        _ => Err(UrlProblem::PlainHttp),
    }
}
