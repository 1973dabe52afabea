//! Errors of the gateway: its upstream configuration, its lock file, and connecting to an upstream.
//!
//! Errors of reading a file keep the I/O or parse error as their `source`, so the command line
//! prints the whole chain; errors of connecting carry their cause in the message, because they are
//! read one line at a time, in the log and in the answer a call gets while the upstream is down.

use std::path::PathBuf;
use std::time::Duration;

use rmcp::ErrorData;
use rmcp::service::{ClientInitializeError, ServiceError};

/// An upstream configuration (a TOML file, `--upstream`, or `-- COMMAND…`) that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("cannot read upstream configuration {path}", path = path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("upstream configuration {path} is not valid", path = path.display())]
    Parse {
        path: PathBuf,
        #[source]
        source: toml::de::Error,
    },
    #[error(
        "upstream {name}: give either `command` (with args, env, cwd) or `url` (with bearer_env), not both or neither"
    )]
    Shape { name: String },
    #[error(
        "upstream name {name:?}: use 1-32 letters, digits, '-' or '_' (no '__', which separates it from tool names)"
    )]
    Name { name: String },
    #[error("upstream URL {url:?}: {problem}")]
    Url { url: String, problem: UrlProblem },
    #[error("--upstream {flag:?}: expected NAME=COMMAND… or NAME=URL")]
    Flag { flag: String },
    #[error("--upstream {name}: unbalanced quotes")]
    Quotes { name: String },
    #[error("upstream {name}: no command given")]
    NoCommand { name: String },
}

/// What is wrong with an upstream's URL.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum UrlProblem {
    #[error("not a URL")]
    NotUrl,
    #[error("credentials do not belong in the URL; use bearer_env")]
    Credentials,
    #[error("no host")]
    NoHost,
    #[error("use https:// (plain http only to 127.0.0.1, localhost or [::1])")]
    PlainHttp,
}

/// A lock file that cannot be read or written.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("cannot read lock file {path}", path = path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("lock file {path} is not a lock file", path = path.display())]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error(
        "lock file {path}: version {found} (this build reads version {expected})",
        path = path.display()
    )]
    Version {
        path: PathBuf,
        found: u32,
        expected: u32,
    },
    #[error("cannot write lock file {path}", path = path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Why an upstream did not connect.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("cannot start {program}: {error}")]
    Start {
        program: String,
        error: std::io::Error,
    },
    /// The specification names `bearer_env`, but the caller gave no token for it (the command line
    /// reads it from its environment and passes it in).
    #[error("no bearer token was given for {var}")]
    NoToken { var: String },
    #[error("cannot set up an HTTP client: {0}")]
    Client(reqwest::Error),
    #[error("the upstream URL does not parse: {0}")]
    Url(String),
    #[error("MCP handshake failed: {0}")]
    Handshake(Box<ClientInitializeError>),
    #[error("tools/list failed: {0}")]
    ListTools(ServiceError),
    #[error("it did not connect within {} s", .0.as_secs())]
    Timeout(Duration),
}

/// Why a request besides tools could not be sent to an upstream (an upstream's own error is
/// passed on as it came, not wrapped in one of these).
#[derive(Debug, thiserror::Error)]
pub(super) enum PassError {
    #[error("prompt not found: {name}")]
    NoPrompt { name: String },
    #[error("resource not found: {uri}")]
    NoResource { uri: String },
    /// `why` is the reason it went down, as the supervisor last recorded it.
    #[error("upstream {upstream} is not connected ({why})")]
    NotConnected { upstream: String, why: String },
}

impl From<PassError> for ErrorData {
    /// Not found: -32602 (with the URI in `data`, as MCP has a missing resource answered); an
    /// upstream that is down: -32603 with the reason.
    fn from(error: PassError) -> Self {
        let message = error.to_string();
        match error {
            PassError::NoPrompt { .. } => ErrorData::invalid_params(message, None),
            PassError::NoResource { uri } => {
                ErrorData::invalid_params(message, Some(serde_json::json!({"uri": uri})))
            }
            PassError::NotConnected { .. } => ErrorData::internal_error(message, None),
        }
    }
}
