//! Logs: JSON lines on stderr, because stdout is the stdio transport's wire.
//! `TOOLGATE_LOG` takes a tracing filter; the default depends on the command (`info` for a server,
//! `warn` where stdout is a report a person reads).
//!
//! Every line passes through the redactor before it is written, whoever logged it: the SDK logs
//! whole requests at debug level, arguments included, and a registered secret or a secret-shaped
//! string must not reach a log file by that route either.

use std::io::{self, Write};
use std::sync::{Arc, OnceLock, RwLock};

use toolgate_core::redact::Redactor;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;

/// The redactor every log line goes through; `serve` installs one with its registered secrets.
static REDACTOR: RwLock<Option<Arc<Redactor>>> = RwLock::new(None);

pub(crate) fn init(default: &str) {
    let filter =
        EnvFilter::try_from_env("TOOLGATE_LOG").unwrap_or_else(|_| EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .json()
        .with_env_filter(filter)
        .with_writer(RedactingStderr)
        .with_current_span(false)
        .try_init();
}

/// Makes later log lines redact `redactor`'s registered secrets too.
pub(crate) fn use_redactor(redactor: Arc<Redactor>) {
    *REDACTOR
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(redactor);
}

#[derive(Debug, Clone, Copy)]
struct RedactingStderr;

/// Collects one formatted event, then writes it redacted in one piece.
#[derive(Debug, Default)]
struct Line(Vec<u8>);

impl Write for Line {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for Line {
    fn drop(&mut self) {
        let text = String::from_utf8_lossy(&self.0);
        static SHAPES_ONLY: OnceLock<Redactor> = OnceLock::new();
        let installed = REDACTOR.read().ok().and_then(|r| r.clone());
        let redactor = installed
            .as_deref()
            .unwrap_or_else(|| SHAPES_ONLY.get_or_init(Redactor::default));
        let clean = redactor.redact(&text);
        let _ = io::stderr().lock().write_all(clean.as_bytes());
    }
}

impl<'a> MakeWriter<'a> for RedactingStderr {
    type Writer = Line;

    fn make_writer(&'a self) -> Self::Writer {
        Line::default()
    }
}
