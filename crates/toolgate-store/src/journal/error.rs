//! Errors of the journal.

use std::io;
use std::path::PathBuf;

/// The journal cannot make a record durable, or cannot start. A gated call that gets one of these
/// does not run (or is reported failed): nothing is acknowledged that is not on disk.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// A file or the data directory could not be created, opened, read, written or synced.
    #[error("{context} {}", path.display())]
    Io {
        /// What was being done, for the message (e.g. "cannot sync").
        context: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// What the operating system said.
        #[source]
        source: io::Error,
    },
    /// Another process holds the exclusive lock on the audit log: two writers would fork the
    /// chain. Nothing was changed.
    #[error("{} is in use by another toolgate process (exclusive lock held)", path.display())]
    Locked {
        /// The audit log.
        path: PathBuf,
    },
    /// A file holds something a crash cannot explain: a complete record whose hash is wrong, a bad
    /// frame in the middle of the WAL, a frame whose audit record does not vouch for its effect, a
    /// complete line that is no frame this version can read. Start-up stops and nothing is changed.
    #[error("{} line {line}: {reason}; run `toolgate audit verify` and repair by hand", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// The 1-based line of a WAL frame; 0 for the audit log's last record, which start-up
        /// finds by reading backwards, without counting lines.
        line: u64,
        /// What is wrong with it.
        reason: String,
    },
    /// A write or sync failed while this request's batch was being committed: its record (and its
    /// effect) may or may not be on disk. The journal is poisoned from then on.
    #[error("journal write failed while this record was being committed; its outcome is unknown")]
    WriteFailed,
    /// An earlier write or sync failed: nothing was written for this request, and nothing will be
    /// until the process restarts and [`Journal::open`](super::Journal::open) repairs the files.
    #[error(
        "the audit journal stopped after a write or sync failed; restart the server to recover"
    )]
    Poisoned,
    /// The writer thread is gone (it panicked while committing): a request handed over after that
    /// was not written; one it was committing when it died may or may not be on disk.
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
