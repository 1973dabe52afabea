//! Errors of the journal.

use std::io;
use std::path::PathBuf;

/// The journal cannot make a record durable, or cannot start. A gated call that gets one of these
/// does not run (or is reported failed): nothing is acknowledged that is not on disk.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("{context} {}", path.display())]
    Io {
        context: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{} is in use by another toolgate process (exclusive lock held)", path.display())]
    Locked { path: PathBuf },
    #[error("{} line {line}: {reason}; run `toolgate audit verify` and repair by hand", path.display())]
    Corrupt {
        path: PathBuf,
        line: u64,
        reason: String,
    },
    #[error("journal write failed while this record was being committed; its outcome is unknown")]
    WriteFailed,
    #[error(
        "the audit journal stopped after a write or sync failed; restart the server to recover"
    )]
    Poisoned,
    #[error("journal writer has shut down")]
    Closed,
}

impl JournalError {
    pub(crate) fn io(
        context: &'static str,
        path: &std::path::Path,
    ) -> impl FnOnce(io::Error) -> Self {
        let path = path.to_path_buf();
        move |source| Self::Io {
            context,
            path,
            source,
        }
    }
}
