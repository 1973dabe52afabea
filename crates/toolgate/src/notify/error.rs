//! Why a notifier could not be configured or started. Delivery failures are not errors anyone
//! handles: they are logged (see `deliver.rs`), because the call that asked never waits for them.

/// A notification target, console address or notifier that cannot be used; found at start, before
/// anything is served.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The generic webhook's URL is not one a request may be sent to.
    #[error("webhook URL {url:?}: {problem}")]
    WebhookUrl {
        /// The URL as given (not a secret: the requests to it are signed).
        url: String,
        /// What is wrong with it.
        problem: UrlProblem,
    },
    /// The Slack incoming-webhook URL is not one a request may be sent to. The URL itself is a
    /// credential, so it is not part of the message.
    #[error("Slack webhook URL: {problem}")]
    SlackUrl {
        /// What is wrong with it.
        problem: UrlProblem,
    },
    /// The console's base URL cannot make links to requests.
    #[error("console URL {url:?}: {problem}")]
    ConsoleUrl {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        problem: UrlProblem,
    },
    /// The webhook's signing secret is too short to sign with (or to be recognised in a log).
    #[error(
        "the webhook secret has {chars} characters after trimming; it needs at least {min} \
         (e.g. the output of `openssl rand -hex 32`)"
    )]
    WeakSecret {
        /// Characters the secret has.
        chars: usize,
        /// Characters it needs.
        min: usize,
    },
    /// Neither a webhook nor a Slack URL was configured: there is nothing to deliver to.
    #[error("no notification target: configure a webhook or a Slack webhook URL")]
    NoTarget,
    /// [`Notifier::start`](super::Notifier::start) was called outside a tokio runtime, where its
    /// delivery task cannot run.
    #[error("the notifier must be started inside a tokio runtime")]
    NoRuntime,
    /// The HTTP client could not be built (TLS roots, settings).
    #[error("the HTTP client for notifications cannot be built: {0}")]
    Client(String),
}

/// What is wrong with a URL given for notifications.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum UrlProblem {
    /// It does not parse as an absolute URL.
    #[error("not an absolute URL")]
    NotUrl,
    /// It has no host to connect to.
    #[error("it has no host")]
    NoHost,
    /// Its scheme is neither `https` nor `http` to this machine.
    #[error("it must use https (plain http only to this machine: localhost, 127.0.0.0/8 or [::1])")]
    PlainHttp,
    /// It carries a user name or password, which would be sent in the clear as basic auth.
    #[error("it carries a user name or password; remove them")]
    Credentials,
    /// A console base URL with a query or fragment, which links to requests could not extend.
    #[error("a base URL takes no query or fragment")]
    QueryOrFragment,
}
