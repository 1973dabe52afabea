//! The journal: every audit record and every ledger effect, made durable in order by one writer.
//!
//! Files in the data directory:
//! - `audit.jsonl`: the chained audit log in seed 000's format, the file `toolgate audit verify` reads;
//! - `ledger.wal`: the ledger's write-ahead log, one line per committed note holding the note *and*
//!   its complete audit record.
//!
//! Commit protocol (storage-engine style, one sync per note instead of the seed's three): a note's
//! frame is appended to `ledger.wal` and `fdatasync`ed, which makes the effect and its audit record
//! durable together; the audit line is then appended to `audit.jsonl` without a sync of its own.
//! Records that carry no effect (denials, reads, replays) are synced in `audit.jsonl` itself. Because
//! the audit file is written in chain order and every synced record follows the lines before it, what
//! a crash can take from `audit.jsonl` is only a suffix of note records, and each of those is in the
//! WAL: [`Journal::open`] re-appends them (their `prev_sha256` links onto the recovered head). The
//! in-memory note index is derived from the WAL at start.
//!
//! Group commit: callers hand requests to the writer thread over a channel; it takes everything
//! queued, writes each file once, syncs each file at most once, then answers every caller. An answer
//! therefore always leaves after its record is on disk, and concurrent calls share one sync.
//!
//! A caller alone commits its own request instead, on its own thread, through the same commit
//! under the same lock: handing one request to the writer thread and being woken by it cost a
//! sequential call two thread wake-ups and three context switches, a fifth of the server's CPU.
//! Alone means no other caller inside the journal and no other call being served: a server holds
//! an [`Occupant`] for each call it serves, so that under load, when calls reach the journal one
//! at a time between other work, they still go to the writer thread and share its syncs. It is
//! judged after yielding to the runtime once, so that calls already runnable on this worker (a
//! burst read in one go) register first. A lone caller blocks its worker for one sync, which is
//! the wait it had anyway.
//!
//! Idempotency lives in the writer, the single sequencer: "is this request_id new?" and "make it
//! durable" happen in one step, so two concurrent calls with one key cannot both commit.

mod crash;
mod error;
mod open;
mod writer;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock, mpsc};

use tokio::sync::oneshot;
use toolgate_core::audit::{Event, Outcome};

pub use error::JournalError;

/// File name of the audit log inside the data directory.
pub const AUDIT_FILE: &str = "audit.jsonl";
/// File name of the ledger write-ahead log inside the data directory.
pub const WAL_FILE: &str = "ledger.wal";

/// One committed note.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Note {
    pub request_id: String,
    pub text: String,
}

/// What happened to a `put_note`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoteOutcome {
    /// New request_id: the note is now durable.
    Committed,
    /// Same request_id and text as a committed note: nothing written but the audit record.
    Replay,
    /// Same request_id, other text: refused.
    Conflict,
}

/// Proof that a record is durable: its hash, the new head of the chain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Receipt {
    pub sha256: String,
}

/// Counters of the writer since open: how well group commit is sharing syncs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Stats {
    /// Audit records made durable.
    pub records: u64,
    /// `fdatasync` calls on either file.
    pub syncs: u64,
    /// Batches committed (one write per file each).
    pub batches: u64,
    /// Of those, commits a lone caller made on its own thread instead of the writer thread.
    pub lone: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) records: AtomicU64,
    pub(crate) syncs: AtomicU64,
    pub(crate) batches: AtomicU64,
    pub(crate) lone: AtomicU64,
    /// Set once a write or sync failed: the writer refuses everything after it.
    pub(crate) failed: std::sync::atomic::AtomicBool,
}

/// What [`Journal::open`] repaired, for the log line that says so.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recovery {
    /// Where a torn tail of `audit.jsonl` was moved, and how many bytes it had.
    pub torn_audit: Option<(PathBuf, u64)>,
    /// Bytes of a torn last frame cut from `ledger.wal` (never acknowledged).
    pub torn_wal_bytes: u64,
    /// Audit records restored from the WAL.
    pub replayed: u64,
}

/// Notes in commit order, with an index by request_id.
#[derive(Debug, Default)]
pub(crate) struct Ledger {
    order: Vec<Note>,
    by_id: HashMap<String, usize>,
}

impl Ledger {
    pub(crate) fn get(&self, request_id: &str) -> Option<&Note> {
        self.by_id.get(request_id).map(|&i| &self.order[i])
    }

    pub(crate) fn insert(&mut self, note: Note) {
        self.by_id.insert(note.request_id.clone(), self.order.len());
        self.order.push(note);
    }
}

pub(crate) enum Request {
    Record {
        event: Event,
        reply: oneshot::Sender<Result<Receipt, JournalError>>,
    },
    PutNote {
        note: Note,
        event: Event,
        reply: oneshot::Sender<Result<(NoteOutcome, Receipt), JournalError>>,
    },
}

/// When an audit record counts as written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Durability {
    /// Synced to disk before the call it records is answered (the default).
    #[default]
    Synced,
    /// Written in chain order before the answer, synced by the OS later: a power cut may lose
    /// the last records (never reorder or corrupt them). Ledger notes are synced either way,
    /// since their WAL frame *is* the effect.
    Buffered,
}

/// Handle to the journal; cheap to clone, shared by every call.
#[derive(Clone, Debug)]
pub struct Journal {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    tx: mpsc::Sender<Request>,
    /// Shared with the writer thread; held for one commit at a time.
    writer: Arc<Mutex<writer::Writer>>,
    /// Callers inside [`Journal::record`] or [`Journal::put_note`] now.
    callers: Arc<AtomicUsize>,
    /// Calls being served that may write here ([`Journal::occupy`]).
    occupants: Arc<AtomicUsize>,
    ledger: Arc<RwLock<Ledger>>,
    dir: PathBuf,
    head: Arc<RwLock<String>>,
    counters: Arc<Counters>,
}

impl Journal {
    /// Opens (creating if needed) the journal in `dir`, repairs a crash's leftovers, and starts the
    /// writer. Holds an exclusive lock on the audit log until the last handle is dropped.
    ///
    /// # Errors
    /// The directory cannot be used, another process holds the lock, or a file is corrupt in a way
    /// a crash cannot explain (then nothing is changed and the caller must not serve).
    pub fn open(dir: &Path) -> Result<(Self, Recovery), JournalError> {
        Self::open_with(dir, Durability::Synced)
    }

    /// [`Journal::open`] with a choice of when records count as written.
    ///
    /// # Errors
    /// As for [`Journal::open`].
    pub fn open_with(dir: &Path, durability: Durability) -> Result<(Self, Recovery), JournalError> {
        let opened = open::open(dir)?;
        let ledger = Arc::new(RwLock::new(opened.ledger));
        let head = Arc::new(RwLock::new(opened.chain.head().to_owned()));
        let counters = Arc::new(Counters::default());
        let (tx, rx) = mpsc::channel();
        let writer = Arc::new(Mutex::new(writer::Writer::new(
            opened.files,
            opened.chain,
            Arc::clone(&ledger),
            Arc::clone(&head),
            Arc::clone(&counters),
            durability,
        )));
        writer::spawn(Arc::clone(&writer), rx)?;
        let inner = Inner {
            tx,
            writer,
            callers: Arc::default(),
            occupants: Arc::default(),
            ledger,
            dir: dir.to_path_buf(),
            head,
            counters,
        };
        Ok((
            Self {
                inner: Arc::new(inner),
            },
            opened.recovery,
        ))
    }

    /// Appends `event` to the audit chain; returns once it is durable.
    ///
    /// # Errors
    /// The record could not be made durable.
    pub async fn record(&self, event: Event) -> Result<Receipt, JournalError> {
        let (reply, answer) = oneshot::channel();
        let _inside = self.commit(Request::Record { event, reply }).await?;
        answer.await.map_err(|_| JournalError::Closed)?
    }

    /// Commits `note` once per request_id and records `event` with the outcome filled in
    /// (`allow/committed`, `allow/replay` or `deny/conflict`); returns once both are durable.
    ///
    /// # Errors
    /// The note or its record could not be made durable; the caller must not report success.
    pub async fn put_note(
        &self,
        note: Note,
        event: Event,
    ) -> Result<(NoteOutcome, Receipt), JournalError> {
        let (reply, answer) = oneshot::channel();
        let _inside = self.commit(Request::PutNote { note, event, reply }).await?;
        answer.await.map_err(|_| JournalError::Closed)?
    }

    /// Every committed note, in commit order: the state after every acknowledged mutation.
    #[must_use]
    pub fn notes(&self) -> Vec<Note> {
        self.inner
            .ledger
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .order
            .clone()
    }

    /// Hash of the last durable record.
    #[must_use]
    pub fn head(&self) -> String {
        self.inner
            .head
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Writer counters since open.
    #[must_use]
    pub fn stats(&self) -> Stats {
        let c = &self.inner.counters;
        Stats {
            records: c.records.load(Ordering::Relaxed),
            syncs: c.syncs.load(Ordering::Relaxed),
            batches: c.batches.load(Ordering::Relaxed),
            lone: c.lone.load(Ordering::Relaxed),
        }
    }

    /// No other caller inside the journal and no other call being served.
    fn alone(&self) -> bool {
        self.inner.callers.load(Ordering::Acquire) == 1
            && self.inner.occupants.load(Ordering::Acquire) <= 1
    }

    /// Registers a call being served, until the guard is dropped. A server takes one per call it
    /// serves, from its start: while more than one is held, records go to the writer thread to
    /// share its syncs (module header, "Group commit").
    #[must_use]
    pub fn occupy(&self) -> Occupant {
        Occupant::enter(&self.inner.occupants)
    }

    /// Whether a write or sync failed since open. After a failed fsync the kernel may have dropped
    /// the dirty pages, so nothing later can be trusted to be on disk: the journal refuses every
    /// record until the process is restarted, and callers refuse calls up front.
    #[must_use]
    pub fn failed(&self) -> bool {
        self.inner.counters.failed.load(Ordering::Acquire)
    }

    /// Path of the audit log.
    #[must_use]
    pub fn audit_path(&self) -> PathBuf {
        self.inner.dir.join(AUDIT_FILE)
    }

    /// Commits `request` here when this caller is alone at the journal, else hands it to the
    /// writer thread (module header, "Group commit"). Either way its reply is sent once it is
    /// durable; the caller counts as inside the journal until it drops the returned guard, after
    /// its reply. Cancel-safe: dropped before the commit, nothing was written.
    async fn commit(&self, request: Request) -> Result<Occupant, JournalError> {
        let inside = Occupant::enter(&self.inner.callers);
        // Under load nobody is alone: straight to the queue, without the yield.
        if self.alone() {
            tokio::task::yield_now().await;
        }
        if self.alone()
            && let Ok(mut writer) = self.inner.writer.try_lock()
        {
            self.inner.counters.lone.fetch_add(1, Ordering::Relaxed);
            writer.commit(&mut vec![request]);
            return Ok(inside);
        }
        self.inner
            .tx
            .send(request)
            .map_err(|_| JournalError::Closed)?;
        Ok(inside)
    }
}

/// One holder of a journal count until dropped: a call being served ([`Journal::occupy`]), or
/// a caller inside [`Journal::record`] or [`Journal::put_note`].
#[derive(Debug)]
pub struct Occupant(Arc<AtomicUsize>);

impl Occupant {
    fn enter(count: &Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::AcqRel);
        Self(Arc::clone(count))
    }
}

impl Drop for Occupant {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The outcome a note request ends with, as the audit sees it.
pub(crate) fn note_audit(outcome: NoteOutcome) -> (toolgate_core::audit::Decision, Outcome) {
    use toolgate_core::audit::Decision;
    match outcome {
        NoteOutcome::Committed => (Decision::Allow, Outcome::Committed),
        NoteOutcome::Replay => (Decision::Allow, Outcome::Replay),
        NoteOutcome::Conflict => (Decision::Deny, Outcome::Conflict),
    }
}

/// Wall-clock nanoseconds since the epoch, the audit record's `ts`.
pub(crate) fn now_ns() -> u64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    u64::try_from(since.as_nanos()).unwrap_or(u64::MAX)
}
