//! What a kit handler gets besides its arguments (seed 004's `ctx`): the call's cancellation, a
//! logger that writes redacted lines to stderr, and the server's environment.

use std::collections::BTreeMap;
use std::fmt;
use std::io::Write;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use toolgate_core::redact::Redactor;

/// One call's context.
#[derive(Clone, Debug)]
pub struct Context {
    pub(crate) ct: CancellationToken,
    pub(crate) log: Logger,
    pub(crate) env: Env,
    pub(crate) principal: Option<String>,
}

impl Context {
    /// Cancelled when the tool's timeout passes or the client cancels the request: pass it to
    /// whatever the handler waits on (`tokio::select!`, a child process, a request). A cancelled
    /// call gets no response; a timed-out one gets an error result.
    #[must_use]
    pub fn ct(&self) -> &CancellationToken {
        &self.ct
    }

    /// Whether the call was cancelled or timed out.
    #[must_use]
    pub fn is_cancelled(&self) -> bool {
        self.ct.is_cancelled()
    }

    /// The logger: lines go to stderr (stdout carries the protocol), redacted, at or above the
    /// level `MCP_LOG_LEVEL` names (default `info`).
    #[must_use]
    pub fn log(&self) -> &Logger {
        &self.log
    }

    /// The server's environment ([`crate::kit::Server::env`]; by default the process's, read at
    /// start).
    #[must_use]
    pub fn env(&self) -> &Env {
        &self.env
    }

    /// Who made the call (`local:USER` on stdio, the token's subject on HTTP); `None` for a dry
    /// run, which is asked for on no caller's behalf.
    #[must_use]
    pub fn principal(&self) -> Option<&str> {
        self.principal.as_deref()
    }
}

/// A snapshot of environment variables: where a kit reads its gate variables, and what its
/// handlers see. `Debug` lists the names only; values may be secrets.
#[derive(Clone, Default)]
pub struct Env(Arc<BTreeMap<String, String>>);

impl Env {
    /// This process's environment, now (variables that are not valid UTF-8 are left out).
    #[must_use]
    pub fn from_process() -> Self {
        // The kit's gate switches are environment variables by design (seed 004), read once.
        #[allow(clippy::disallowed_methods)]
        let vars = std::env::vars_os()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
            .collect();
        Self(Arc::new(vars))
    }

    /// The value of `name`, if set.
    #[must_use]
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }
}

impl<K: Into<String>, V: Into<String>> FromIterator<(K, V)> for Env {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        Self(Arc::new(
            iter.into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        ))
    }
}

impl fmt::Debug for Env {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.0.keys()).finish()
    }
}

/// How much a logger writes, least to most.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Something failed.
    Error,
    /// Something is wrong but the call goes on.
    Warn,
    /// What happened (the default level).
    Info,
    /// Detail for the person debugging.
    Debug,
}

impl Level {
    /// The level `MCP_LOG_LEVEL` names in `env` (`error`, `warn`, `info`, `debug`, any case);
    /// `info` when unset or unknown.
    #[must_use]
    pub fn from_env(env: &Env) -> Self {
        match env
            .get("MCP_LOG_LEVEL")
            .map(|v| v.trim().to_ascii_lowercase())
            .as_deref()
        {
            Some("error") => Self::Error,
            Some("warn" | "warning") => Self::Warn,
            Some("debug" | "trace") => Self::Debug,
            _ => Self::Info,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Self::Error => "error",
            Self::Warn => "warn",
            Self::Info => "info",
            Self::Debug => "debug",
        }
    }
}

/// A handler's logger: one JSON line per message on stderr, with the server and tool it came
/// from, redacted (registered secrets, key and token shapes) before it is written.
#[derive(Clone)]
pub struct Logger {
    server: Arc<str>,
    tool: Arc<str>,
    level: Level,
    redactor: Arc<Redactor>,
}

impl fmt::Debug for Logger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Logger")
            .field("server", &self.server)
            .field("tool", &self.tool)
            .field("level", &self.level)
            .finish_non_exhaustive()
    }
}

impl Logger {
    pub(crate) fn new(server: Arc<str>, tool: &str, level: Level, redactor: Arc<Redactor>) -> Self {
        Self {
            server,
            tool: Arc::from(tool),
            level,
            redactor,
        }
    }

    /// Logs at `error`.
    pub fn error(&self, message: impl fmt::Display) {
        self.write(Level::Error, &message);
    }

    /// Logs at `warn`.
    pub fn warn(&self, message: impl fmt::Display) {
        self.write(Level::Warn, &message);
    }

    /// Logs at `info`.
    pub fn info(&self, message: impl fmt::Display) {
        self.write(Level::Info, &message);
    }

    /// Logs at `debug`.
    pub fn debug(&self, message: impl fmt::Display) {
        self.write(Level::Debug, &message);
    }

    /// Whether a message at `level` would be written.
    #[must_use]
    pub fn enabled(&self, level: Level) -> bool {
        level <= self.level
    }

    fn write(&self, level: Level, message: &dyn fmt::Display) {
        if !self.enabled(level) {
            return;
        }
        let text = super::secrets::redact(&self.redactor, &message.to_string());
        let line = serde_json::json!({
            "ts": toolgate_core::time::rfc3339(toolgate_core::time::now_ms()),
            "level": level.as_str(),
            "server": &*self.server,
            "tool": &*self.tool,
            "message": text,
        });
        // A log line that cannot be written is dropped: logging must never fail a call.
        let _ = writeln!(std::io::stderr().lock(), "{line}");
    }
}
