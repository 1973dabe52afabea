//! Secrets a kit's code knows (seed 004's `loadSecret` / `registerSecret`): each value is replaced
//! with `[REDACTED]` in every log line, error and echoed argument.
//!
//! The registry is process-wide, as the seed's is: a secret registered anywhere in the program is
//! known to every server it runs. Secrets registered before a server starts are part of its
//! redactor (log lines, errors, echoed arguments, results); one registered while it serves is
//! still scrubbed from the kit's own log lines and tool errors ([`redact`]).

use std::path::Path;
use std::sync::{Arc, RwLock};

use toolgate_core::redact::Redactor;
use toolgate_core::secret::Secret;

/// Values shorter than this are not registered: replacing every "ab" in every log line would
/// destroy the log without protecting anything.
const MIN_SECRET_CHARS: usize = 4;

static REGISTRY: RwLock<Vec<Arc<str>>> = RwLock::new(Vec::new());

/// Why a secret could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// The file could not be read.
    #[error("cannot read secret file {path}: {source}")]
    Read {
        /// The file named.
        path: String,
        /// Why it could not be read.
        #[source]
        source: std::io::Error,
    },
    /// The file holds nothing (after trimming), or fewer than 4 characters.
    #[error("secret file {path} holds no secret of at least {MIN_SECRET_CHARS} characters")]
    Empty {
        /// The file named.
        path: String,
    },
}

/// Reads a credential from `path` (trimmed), registers it, and returns it. The value is never
/// printed: [`Secret`]'s `Debug` shows `<redacted>`.
///
/// # Errors
/// The file cannot be read, or holds no secret of at least 4 characters.
pub fn load_secret(path: impl AsRef<Path>) -> Result<Secret, SecretError> {
    let path = path.as_ref();
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| SecretError::Read {
        path: shown.clone(),
        source,
    })?;
    let value = text.trim();
    if value.chars().count() < MIN_SECRET_CHARS {
        return Err(SecretError::Empty { path: shown });
    }
    register_secret(value);
    Ok(Secret::new(value.to_owned()))
}

/// Registers a value obtained some other way (an environment variable, a vault) so that it is
/// redacted everywhere. Values shorter than 4 characters are ignored.
pub fn register_secret(value: impl AsRef<str>) {
    let value = value.as_ref();
    if value.chars().count() < MIN_SECRET_CHARS {
        return;
    }
    let mut registry = crate::write(&REGISTRY);
    if !registry.iter().any(|known| known.as_ref() == value) {
        registry.push(Arc::from(value));
    }
}

/// Every registered secret, for a server's redactor at start.
pub(crate) fn registered() -> Vec<Secret> {
    crate::read(&REGISTRY)
        .iter()
        .map(|value| Secret::new(value.to_string()))
        .collect()
}

/// `text` as the kit writes it to a log or an error: through the server's redactor, then with
/// every registered secret replaced, including those registered after the server started.
pub(crate) fn redact(redactor: &Redactor, text: &str) -> String {
    scrub(&redactor.redact(text))
}

/// `text` with every registered secret replaced.
fn scrub(text: &str) -> String {
    let registry = crate::read(&REGISTRY);
    let mut text = text.to_owned();
    for value in registry.iter() {
        if text.contains(value.as_ref()) {
            text = text.replace(value.as_ref(), "[REDACTED]");
        }
    }
    text
}
