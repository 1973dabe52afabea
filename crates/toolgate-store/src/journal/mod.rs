//! The journal: every audit record and every effect, made durable in order by one writer.
//!
//! Files in the data directory:
//! - `audit.jsonl`: the chained audit log in seed 000's format, the file `toolgate audit verify` reads;
//! - `ledger.wal`: the write-ahead log of effects, one line (a *frame*) per committed effect holding
//!   the effect *and* its complete audit record. The name predates generic effects (the ledger
//!   demo's notes were its only effects) and is kept so that existing data directories open as
//!   they are; their note frames are read as effects (module `frame`, "Compatibility");
//! - `audit.ring`: copies of the latest synced audit records, in a file of a fixed size written
//!   over and over (module `ring`); only [`Journal::open`] reads it, to recover.
//!
//! An effect ([`Effect`]) is an idempotency key and an opaque JSON body: the journal commits at most
//! one body per key and never interprets it. What the body means, and the view built from the
//! committed effects ([`Journal::effects`]), belong to the toolset that puts them.
//!
//! Commit protocol (storage-engine style, one sync per effect instead of the seed's three): an
//! effect's frame is appended to `ledger.wal` and `fdatasync`ed, which makes the effect and its
//! audit record durable together; the audit line is then appended to `audit.jsonl` without a sync of
//! its own. Records that carry no effect (denials, reads, replays) are synced in `audit.ring`
//! (module `ring`): written at the next offset of a file of zeros of a fixed size and synced there,
//! which flushes data only, where a sync after an append must also commit the file's new size; they
//! are then appended to `audit.jsonl` without a sync, and `audit.jsonl` is synced before the ring
//! wraps. So what a crash can take from `audit.jsonl` is only a suffix of records, and each of those
//! is in the WAL or the ring: [`Journal::open`] re-appends those that continue the chain (their
//! `prev_sha256` links onto the recovered head). The in-memory index of effects is derived from the
//! WAL at start, and a frame whose audit record does not vouch for its effect stops start-up
//! (module `frame`).
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
//! at a time between other work, they still go to the writer thread and share its syncs. Where
//! there is a sync to share (synced records, effects), it is judged after yielding to the runtime
//! once, so that calls already runnable on this worker (a burst read in one go) register first. A
//! lone caller blocks its worker for one sync, which is the wait it had anyway.
//!
//! Idempotency lives in the writer, the single sequencer: "is this key new?" and "make it durable"
//! happen in one step, so two concurrent calls with one key cannot both commit.

mod crash;
mod error;
mod frame;
mod open;
mod ring;
mod writer;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock, mpsc};

use serde_json::Value;
use tokio::sync::oneshot;
use toolgate_core::audit::{Event, Outcome};
use toolgate_core::canonical;

pub use error::JournalError;
pub use frame::{EFFECT_KEY, EFFECT_SHA256};

/// A named crash point outside the journal (the agent loop's steps), for the crash tests: with
/// the `failpoints` feature and the point armed (`FAILPOINTS=NAME=return(MARKER)`), the calling
/// thread writes the marker file and stops there for the test to kill the process. Compiled to
/// nothing otherwise.
pub fn crash_point(name: &str) {
    crash::point(name, || {});
}

/// File name of the audit log inside the data directory.
pub const AUDIT_FILE: &str = "audit.jsonl";
/// File name of the write-ahead log of effects inside the data directory.
pub const WAL_FILE: &str = "ledger.wal";
/// File name of the sync ring inside the data directory: a fixed-size file where synced records
/// are made durable before they are appended to the audit log (module header, "Commit protocol").
pub const RING_FILE: &str = "audit.ring";

/// One effect committed through the journal: the key naming it and the body describing it.
///
/// The journal commits at most one effect per key, and compares bodies only for equality (as JSON
/// values, which is equality of their canonical forms), never reads them.
///
/// The body is a [`serde_json::Value`] rather than pre-encoded text: frames are JSON lines and an
/// audit record names a body by the SHA-256 of its canonical JSON (the digest `args_digest` is made
/// with), so the body has to be JSON anyway. A `Value` cannot be malformed, and the journal writes
/// its canonical form itself, so two equal bodies are equal bytes in the WAL and in the digest; a
/// string would have to be parsed again to be checked canonical, or two encodings of one body
/// would be judged a conflict.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Effect {
    /// The idempotency key naming the effect: at most one effect is ever committed per key.
    pub key: String,
    /// What the effect is, in the terms of the toolset that puts it; opaque to the journal.
    pub body: Value,
}

impl Effect {
    /// The effect named `key` with body `body`.
    #[must_use]
    pub fn new(key: impl Into<String>, body: Value) -> Self {
        Self {
            key: key.into(),
            body,
        }
    }
}

/// What happened to a [`Journal::put_effect`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EffectOutcome {
    /// The key was new: the effect is now durable, and recorded `allow / committed`.
    Committed,
    /// The key was committed with an equal body: nothing was written but the audit record,
    /// `allow / replay`.
    Replay,
    /// The key was committed with another body: nothing was written but the audit record,
    /// `deny / conflict`.
    Conflict,
}

/// Proof that a record is durable: returned only after it is written (and synced, unless the
/// journal is [`Durability::Buffered`] and the record carries no effect).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Receipt {
    /// The record's `sha256` (64 lower-case hex digits): the head of the chain right after it,
    /// what `toolgate audit verify --expect-head` checks a log against.
    pub sha256: String,
}

/// Counters of the writer since open: how well group commit is sharing syncs. Read with relaxed
/// atomics: each counter is exact, but a snapshot taken during a commit may mix before and after.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Stats {
    /// Audit records committed (effects' records included).
    pub records: u64,
    /// `fdatasync` calls on the journal's files (the WAL, the sync ring, the audit log).
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

/// What [`Journal::open`] repaired, for the log line that says so. `Recovery::default()` means
/// nothing needed repair.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recovery {
    /// A torn last line of `audit.jsonl`: the file (beside the log, `audit.jsonl.torn-<ts>`) its
    /// bytes were moved to, and how many bytes it had. A `recover / torn_tail_moved_aside` record
    /// was appended in its place.
    pub torn_audit: Option<(PathBuf, u64)>,
    /// Bytes of a torn last frame cut from `ledger.wal`; 0 if none. Such a frame was never
    /// synced, so its effect was never acknowledged.
    pub torn_wal_bytes: u64,
    /// Audit records that were missing from `audit.jsonl` and were restored, byte for byte, from
    /// their WAL frames (records of committed effects) or the sync ring (synced records).
    pub replayed: u64,
}

/// Effects in commit order, with an index by key.
#[derive(Debug, Default)]
pub(crate) struct Index {
    order: Vec<Effect>,
    by_key: HashMap<String, usize>,
}

impl Index {
    pub(crate) fn get(&self, key: &str) -> Option<&Effect> {
        self.by_key.get(key).map(|&i| &self.order[i])
    }

    pub(crate) fn insert(&mut self, effect: Effect) {
        self.by_key.insert(effect.key.clone(), self.order.len());
        self.order.push(effect);
    }
}

pub(crate) enum Request {
    Record {
        event: Event,
        reply: oneshot::Sender<Result<Receipt, JournalError>>,
    },
    PutEffect {
        effect: Effect,
        /// The body's canonical JSON, made by the caller: it goes into the frame as it is.
        body: Vec<u8>,
        /// Vouches for the effect already (module `frame`).
        event: Event,
        reply: oneshot::Sender<Result<(EffectOutcome, Receipt), JournalError>>,
    },
}

/// When an audit record counts as written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Durability {
    /// Synced to disk before the call it records is answered (the default).
    #[default]
    Synced,
    /// Written in chain order before the answer, synced by the OS later: a power cut may lose
    /// the last records (never reorder or corrupt them). Effects are synced either way, since
    /// their WAL frame *is* the effect.
    Buffered,
}

/// Handle to the journal of one data directory; cheap to clone, shared by every call. The writer
/// thread and the lock on the audit log live until the last clone is dropped.
#[derive(Clone, Debug)]
pub struct Journal {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    tx: mpsc::Sender<Request>,
    /// Shared with the writer thread; held for one commit at a time.
    writer: Arc<Mutex<writer::Writer>>,
    /// Callers inside [`Journal::record`] or [`Journal::put_effect`] now.
    callers: Arc<AtomicUsize>,
    /// Calls being served that may write here ([`Journal::occupy`]).
    occupants: Arc<AtomicUsize>,
    /// Whether records without an effect are synced ([`Durability::Synced`]).
    sync_audit: bool,
    effects: Arc<RwLock<Index>>,
    dir: PathBuf,
    head: Arc<RwLock<String>>,
    counters: Arc<Counters>,
}

impl Journal {
    /// Opens (creating if needed) the journal in `dir`, repairs what a crash can leave (a torn audit
    /// tail is moved aside, audit records of committed effects are restored from the WAL, a torn
    /// last WAL frame is cut; see [`Recovery`]), rebuilds the index of effects from the WAL, and
    /// starts the writer thread. Records are synced before they are acknowledged
    /// ([`Durability::Synced`]).
    ///
    /// The audit log stays exclusively locked until the last handle is dropped, so that a second
    /// process cannot open the same directory and fork the chain.
    ///
    /// # Errors
    /// - [`JournalError::Io`]: the directory or a file cannot be created, opened, read, repaired
    ///   or synced, or the writer thread cannot be started;
    /// - [`JournalError::Locked`]: another process has this journal open;
    /// - [`JournalError::Corrupt`]: a file holds something a crash cannot explain; nothing was
    ///   changed, and the caller must not serve.
    pub fn open(dir: &Path) -> Result<(Self, Recovery), JournalError> {
        Self::open_with(dir, Durability::Synced)
    }

    /// [`Journal::open`] with a choice of when records count as written.
    ///
    /// # Errors
    /// As for [`Journal::open`].
    pub fn open_with(dir: &Path, durability: Durability) -> Result<(Self, Recovery), JournalError> {
        let opened = open::open(dir, durability)?;
        let effects = Arc::new(RwLock::new(opened.effects));
        let head = Arc::new(RwLock::new(opened.chain.head().to_owned()));
        let counters = Arc::new(Counters::default());
        let (tx, rx) = mpsc::channel();
        let writer = Arc::new(Mutex::new(writer::Writer::new(
            opened.files,
            opened.chain,
            Arc::clone(&effects),
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
            sync_audit: durability == Durability::Synced,
            effects,
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

    /// Appends `event` to the audit chain, stamped with its commit's time; returns once it is
    /// written and, with [`Durability::Synced`], synced. Records are chained in the order the
    /// writer takes them; concurrent callers share one sync (group commit).
    ///
    /// # Errors
    /// [`JournalError::WriteFailed`]: the record may or may not be on disk;
    /// [`JournalError::Poisoned`]: an earlier failure stopped the journal, nothing was written;
    /// [`JournalError::Closed`]: the writer is gone. The call the record is about must not be
    /// answered as if it were recorded.
    pub async fn record(&self, event: Event) -> Result<Receipt, JournalError> {
        let (reply, answer) = oneshot::channel();
        let _inside = self.commit(Request::Record { event, reply }).await?;
        answer.await.map_err(|_| JournalError::Closed)?
    }

    /// Commits `effect` at most once per key, and records `event` with the outcome filled in;
    /// returns once both are durable.
    ///
    /// The single writer decides, so of any number of concurrent calls with one key exactly one
    /// commits:
    /// - a new key: the effect's frame (the effect and its record) is appended to the WAL and
    ///   `fdatasync`ed, then the record to the audit log: [`EffectOutcome::Committed`],
    ///   recorded `allow / committed`;
    /// - a key committed with an equal body: [`EffectOutcome::Replay`], recorded
    ///   `allow / replay`; nothing else is written;
    /// - a key committed with another body: [`EffectOutcome::Conflict`], recorded
    ///   `deny / conflict`; nothing else is written.
    ///
    /// `event`'s decision and outcome are replaced accordingly. Before it is sealed, `event` is made
    /// to name the effect, so that recovery can tell a frame from a tampered one: if `args_digest`
    /// is not the SHA-256 of the body's canonical JSON, [`EFFECT_SHA256`] is set to that digest;
    /// if `request_id` is not the key, [`EFFECT_KEY`] is set to the key; otherwise each is
    /// removed. An effect whose body is its call's arguments, keyed by the call's `request_id`,
    /// leaves the record as the call made it.
    ///
    /// # Errors
    /// The effect or its record could not be made durable ([`JournalError::WriteFailed`]: the
    /// outcome is unknown), the journal stopped after an earlier failure
    /// ([`JournalError::Poisoned`]) or its writer is gone ([`JournalError::Closed`]). The caller
    /// must not report success.
    pub async fn put_effect(
        &self,
        effect: Effect,
        mut event: Event,
    ) -> Result<(EffectOutcome, Receipt), JournalError> {
        // Encoded and digested here, on the caller's thread, not under the writer's lock.
        let body = canonical::to_vec(&effect.body);
        frame::vouch(&mut event, &effect.key, &canonical::sha256_hex(&body));
        let (reply, answer) = oneshot::channel();
        let request = Request::PutEffect {
            effect,
            body,
            event,
            reply,
        };
        let _inside = self.commit(request).await?;
        answer.await.map_err(|_| JournalError::Closed)?
    }

    /// Every committed effect, in commit order: the state after every acknowledged
    /// [`Journal::put_effect`], including those recovered from the WAL at open. A snapshot:
    /// effects committed after it is taken are not in it.
    #[must_use]
    pub fn effects(&self) -> Vec<Effect> {
        self.inner
            .effects
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .order
            .clone()
    }

    /// Hash (`sha256`, 64 lower-case hex digits) of the last acknowledged record: the chain's
    /// head, [`GENESIS`](toolgate_core::audit::GENESIS) for an empty log.
    #[must_use]
    pub fn head(&self) -> String {
        self.inner
            .head
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Writer counters since open (see [`Stats`]).
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

    /// Path of the audit log, `audit.jsonl` in the data directory.
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
        // Under load nobody is alone: straight to the queue, without the yield. A record that is
        // not synced (buffered, without an effect) has no sync to share, so it does not wait for
        // others either: the yield costs a lone call a wake-up of the runtime's driver.
        let syncs = self.inner.sync_audit || matches!(request, Request::PutEffect { .. });
        if syncs && self.alone() {
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
/// a caller inside [`Journal::record`] or [`Journal::put_effect`].
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

/// The outcome an effect request ends with, as the audit sees it.
pub(crate) fn effect_audit(outcome: EffectOutcome) -> (toolgate_core::audit::Decision, Outcome) {
    use toolgate_core::audit::Decision;
    match outcome {
        EffectOutcome::Committed => (Decision::Allow, Outcome::Committed),
        EffectOutcome::Replay => (Decision::Allow, Outcome::Replay),
        EffectOutcome::Conflict => (Decision::Deny, Outcome::Conflict),
    }
}

/// Wall-clock nanoseconds since the epoch, the audit record's `ts`.
pub(crate) fn now_ns() -> u64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    u64::try_from(since.as_nanos()).unwrap_or(u64::MAX)
}
