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
    /// The configuration file could not be read.
    #[error("cannot read upstream configuration {path}", path = path.display())]
    Read {
        /// The file, as given.
        path: PathBuf,
        /// Why reading it failed.
        #[source]
        source: std::io::Error,
    },
    /// The file is not TOML, or has a key other than `[upstreams.NAME]` tables and their
    /// `command`, `args`, `env`, `cwd`, `url` and `bearer_env`.
    #[error("upstream configuration {path} is not valid", path = path.display())]
    Parse {
        /// The file, as given.
        path: PathBuf,
        /// The TOML error, with its line and column.
        #[source]
        source: toml::de::Error,
    },
    /// An entry of the file has both `command` and `url`, neither, or a key of the other kind
    /// (`bearer_env` beside `command`; `args`, `env` or `cwd` beside `url`).
    #[error(
        "upstream {name}: give either `command` (with args, env, cwd) or `url` (with bearer_env), not both or neither"
    )]
    Shape {
        /// The entry's upstream name.
        name: String,
    },
    /// An upstream name is empty, longer than 32 bytes, has a character other than an ASCII
    /// letter, digit, `-` or `_`, or contains `__` (the separator of prefixed tool names).
    #[error(
        "upstream name {name:?}: use 1-32 letters, digits, '-' or '_' (no '__', which separates it from tool names)"
    )]
    Name {
        /// The name, as given.
        name: String,
    },
    /// An HTTP upstream's URL is refused, by the file or by `--upstream`.
    #[error("upstream URL {url:?}: {problem}")]
    Url {
        /// The URL, as given.
        url: String,
        /// What is wrong with it.
        problem: UrlProblem,
    },
    /// An `--upstream` value has no `=` between the name and the command or URL.
    #[error("--upstream {flag:?}: expected NAME=COMMAND… or NAME=URL")]
    Flag {
        /// The whole value, as given.
        flag: String,
    },
    /// The command of an `--upstream NAME=COMMAND…` value has unbalanced quotes (it is split as a
    /// shell splits words).
    #[error("--upstream {name}: unbalanced quotes")]
    Quotes {
        /// The upstream name before the `=`.
        name: String,
    },
    /// A command upstream has no words to run (`--upstream NAME=` with nothing after it, or
    /// [`from_command`](super::from_command) with no words).
    #[error("upstream {name}: no command given")]
    NoCommand {
        /// The upstream name.
        name: String,
    },
}

/// What is wrong with an upstream's URL.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum UrlProblem {
    /// It does not parse as an absolute URL.
    #[error("not a URL")]
    NotUrl,
    /// It has a user name or password, which would end up in logs.
    #[error("credentials do not belong in the URL; use bearer_env")]
    Credentials,
    /// It names no host.
    #[error("no host")]
    NoHost,
    /// Its scheme is neither `https` nor `http` to a loopback host (`localhost`, `127.0.0.0/8`
    /// or `[::1]`), so requests and the upstream's token would travel in the clear.
    #[error("use https:// (plain http only to 127.0.0.1, localhost or [::1])")]
    PlainHttp,
}

/// A lock file that cannot be read or written.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// The lock file could not be read (it is missing, say).
    #[error("cannot read lock file {path}", path = path.display())]
    Read {
        /// The lock file, as given.
        path: PathBuf,
        /// Why reading it failed.
        #[source]
        source: std::io::Error,
    },
    /// The file is not JSON of a lock's shape: a `version` and, per upstream, tool names and
    /// their hashes, nothing else.
    #[error("lock file {path} is not a lock file", path = path.display())]
    Parse {
        /// The lock file, as given.
        path: PathBuf,
        /// The JSON error, with its line and column.
        #[source]
        source: serde_json::Error,
    },
    /// The lock file has a format version this build does not read.
    #[error(
        "lock file {path}: version {found} (this build reads version {expected})",
        path = path.display()
    )]
    Version {
        /// The lock file, as given.
        path: PathBuf,
        /// The version the file declares.
        found: u32,
        /// The one version this build reads and writes.
        expected: u32,
    },
    /// Writing the lock file failed at some step (temporary file, write, sync, rename); the
    /// file at `path` is never left half written.
    #[error("cannot write lock file {path}", path = path.display())]
    Write {
        /// The lock file, as given.
        path: PathBuf,
        /// The step's I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// Why an upstream did not connect.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// A command upstream's process could not be started (no such program, not executable, or
    /// its `cwd` does not exist).
    #[error("cannot start {program}: {error}")]
    Start {
        /// The program, as configured.
        program: String,
        /// What the operating system said.
        error: std::io::Error,
    },
    /// The specification names `bearer_env`, but the caller gave no token for it (the command line
    /// reads it from its environment and passes it in).
    #[error("no bearer token was given for {var}")]
    NoToken {
        /// The environment variable `bearer_env` names.
        var: String,
    },
    /// The HTTP client for an HTTP upstream could not be built (its TLS setup failed).
    #[error("cannot set up an HTTP client: {0}")]
    Client(reqwest::Error),
    /// An HTTP upstream's URL does not parse; holds the parser's message.
    #[error("the upstream URL does not parse: {0}")]
    Url(String),
    /// The upstream was reached but the MCP handshake (`server/discover` or `initialize`)
    /// failed: no common protocol revision, a transport error, or the upstream went away.
    #[error("MCP handshake failed: {0}")]
    Handshake(Box<ClientInitializeError>),
    /// The handshake succeeded but the first `tools/list` failed.
    #[error("tools/list failed: {0}")]
    ListTools(ServiceError),
    /// Starting, the handshake and the first `tools/list` together took longer than the
    /// connect bound, which the field holds (30 s).
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
