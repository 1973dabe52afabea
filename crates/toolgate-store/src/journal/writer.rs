//! The writer: commits a batch of requests, writing each file once and syncing each at most once,
//! then answers them. Its thread takes every queued request as one batch; a caller alone at the
//! journal commits its own request through the same [`Writer::commit`] (module `journal`, "Group
//! commit"). A failed write poisons the journal: nothing later is acknowledged, because the files'
//! state is no longer known.

use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, RwLock, mpsc};

use toolgate_core::audit::Chain;

use super::ring::Ring;
use super::{
    Counters, Effect, EffectOutcome, Index, JournalError, Receipt, Request, crash, effect_audit,
    frame, now_ns,
};

/// Most requests taken into one batch; bounds the latency of the first caller in a flood.
const MAX_BATCH: usize = 4096;

pub(crate) struct Files {
    pub(crate) audit: File,
    pub(crate) audit_path: PathBuf,
    pub(crate) wal: File,
    pub(crate) wal_path: PathBuf,
    /// Where synced records are made durable (module `ring`); `None` for a buffered journal.
    pub(crate) ring: Option<Ring>,
}

pub(crate) struct Writer {
    files: Files,
    chain: Chain,
    effects: Arc<RwLock<Index>>,
    head: Arc<RwLock<String>>,
    counters: Arc<Counters>,
    /// Whether records without an effect are synced before they are acknowledged.
    sync_audit: bool,
    poisoned: bool,
}

enum Reply {
    Record(
        tokio::sync::oneshot::Sender<Result<Receipt, JournalError>>,
        Receipt,
    ),
    Effect(
        tokio::sync::oneshot::Sender<Result<(EffectOutcome, Receipt), JournalError>>,
        EffectOutcome,
        Receipt,
    ),
}

impl Reply {
    fn send(self) {
        // A caller that went away (cancelled) still had its record made durable; nothing to undo.
        match self {
            Self::Record(tx, receipt) => drop(tx.send(Ok(receipt))),
            Self::Effect(tx, outcome, receipt) => drop(tx.send(Ok((outcome, receipt)))),
        }
    }

    fn fail(self, error: impl Fn() -> JournalError) {
        match self {
            Self::Record(tx, _) => drop(tx.send(Err(error()))),
            Self::Effect(tx, _, _) => drop(tx.send(Err(error()))),
        }
    }
}

pub(crate) fn spawn(
    writer: Arc<Mutex<Writer>>,
    rx: mpsc::Receiver<Request>,
) -> Result<(), JournalError> {
    std::thread::Builder::new()
        .name("toolgate-journal".to_owned())
        .spawn(move || run(&writer, &rx))
        .map(drop)
        .map_err(|source| JournalError::Io {
            context: "cannot start the journal writer for",
            path: PathBuf::new(),
            source,
        })
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer")
            .field("head", &self.chain.head())
            .field("poisoned", &self.poisoned)
            .finish_non_exhaustive()
    }
}

/// The writer thread's loop: waits for a request, then commits it with everything queued behind
/// it, until every journal handle is gone.
fn run(writer: &Mutex<Writer>, rx: &mpsc::Receiver<Request>) {
    let mut batch = Vec::new();
    while let Ok(first) = rx.recv() {
        batch.push(first);
        let mut writer = lock(writer);
        // Taken under the lock: requests that queued while a caller committed on its own join.
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        writer.commit(&mut batch);
    }
}

/// The writer, for one commit. A commit that panicked left the files in a state nobody knows:
/// the journal is poisoned and refuses everything after it.
fn lock(writer: &Mutex<Writer>) -> std::sync::MutexGuard<'_, Writer> {
    writer.lock().unwrap_or_else(|poisoned| {
        let mut writer = poisoned.into_inner();
        writer.poison();
        writer
    })
}

impl Writer {
    pub(crate) fn new(
        files: Files,
        chain: Chain,
        effects: Arc<RwLock<Index>>,
        head: Arc<RwLock<String>>,
        counters: Arc<Counters>,
        durability: super::Durability,
    ) -> Self {
        Self {
            files,
            chain,
            effects,
            head,
            counters,
            sync_audit: durability == super::Durability::Synced,
            poisoned: false,
        }
    }

    /// Commits `batch` (emptied) and answers each request in it.
    pub(crate) fn commit(&mut self, batch: &mut Vec<Request>) {
        if self.poisoned {
            for request in batch.drain(..) {
                match request {
                    Request::Record { reply, .. } => drop(reply.send(Err(JournalError::Poisoned))),
                    Request::PutEffect { reply, .. } => {
                        drop(reply.send(Err(JournalError::Poisoned)));
                    }
                }
            }
            return;
        }
        let start_head = self.chain.clone();
        let mut wal = Vec::new();
        let mut audit = Vec::new();
        let mut audit_needs_sync = false;
        let mut new_effects: Vec<Effect> = Vec::new();
        let mut pending: HashMap<String, usize> = HashMap::new();
        let mut replies = Vec::with_capacity(batch.len());
        let ts = now_ns();
        let records = batch.len() as u64;
        for request in batch.drain(..) {
            match request {
                Request::Record { event, reply } => {
                    let sealed = self.chain.seal(&event, ts);
                    audit.extend_from_slice(&sealed.line);
                    audit_needs_sync = true;
                    replies.push(Reply::Record(
                        reply,
                        Receipt {
                            sha256: sealed.sha256,
                        },
                    ));
                }
                Request::PutEffect {
                    effect,
                    body,
                    mut event,
                    reply,
                } => {
                    let outcome = {
                        let effects = self
                            .effects
                            .read()
                            .unwrap_or_else(std::sync::PoisonError::into_inner);
                        let existing = effects
                            .get(&effect.key)
                            .or_else(|| pending.get(&effect.key).map(|&i| &new_effects[i]));
                        match existing {
                            None => EffectOutcome::Committed,
                            Some(stored) if stored.body == effect.body => EffectOutcome::Replay,
                            Some(_) => EffectOutcome::Conflict,
                        }
                    };
                    (event.decision, event.outcome) = effect_audit(outcome);
                    let sealed = self.chain.seal(&event, ts);
                    if outcome == EffectOutcome::Committed {
                        wal.extend_from_slice(&frame::encode(&effect.key, &body, &sealed));
                        pending.insert(effect.key.clone(), new_effects.len());
                        new_effects.push(effect);
                    } else {
                        audit_needs_sync = true;
                    }
                    audit.extend_from_slice(&sealed.line);
                    replies.push(Reply::Effect(
                        reply,
                        outcome,
                        Receipt {
                            sha256: sealed.sha256,
                        },
                    ));
                }
            }
        }
        if let Err(error) = self.write(&wal, &audit, audit_needs_sync) {
            tracing::error!(error = %error, "journal write failed; every later call is refused until the server is restarted");
            self.poison();
            self.chain = start_head;
            for reply in replies {
                reply.fail(|| JournalError::WriteFailed);
            }
            return;
        }
        {
            let mut effects = self
                .effects
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            for effect in new_effects {
                effects.insert(effect);
            }
        }
        *self
            .head
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = self.chain.head().to_owned();
        self.counters.records.fetch_add(records, Ordering::Relaxed);
        self.counters.batches.fetch_add(1, Ordering::Relaxed);
        crash::point(crash::BEFORE_ANSWER, || {});
        for reply in replies {
            reply.send();
        }
    }

    fn poison(&mut self) {
        self.poisoned = true;
        self.counters.failed.store(true, Ordering::Release);
    }

    fn write(
        &mut self,
        wal: &[u8],
        audit: &[u8],
        audit_needs_sync: bool,
    ) -> Result<(), JournalError> {
        let Files {
            audit: audit_file,
            audit_path,
            wal: wal_file,
            wal_path,
            ring,
        } = &mut self.files;
        crash::point(crash::BEFORE_APPEND, || {});
        if !wal.is_empty() {
            crash::point(crash::TORN_WAL, || {
                let _ = wal_file.write_all(&wal[..wal.len() / 2]);
            });
            wal_file
                .write_all(wal)
                .map_err(JournalError::io("cannot append to", wal_path))?;
            wal_file
                .sync_data()
                .map_err(JournalError::io("cannot sync", wal_path))?;
            self.counters.syncs.fetch_add(1, Ordering::Relaxed);
            crash::point(crash::AFTER_WAL_SYNC, || {});
        }
        if audit.is_empty() {
            return Ok(());
        }
        let needs_sync = audit_needs_sync && self.sync_audit;
        // Synced in the ring when it can hold the batch, else in the log itself (module `ring`).
        let ring = ring
            .as_mut()
            .filter(|ring| needs_sync && ring.holds(audit.len()));
        let in_ring = ring.is_some();
        if let Some(ring) = ring {
            if !ring.fits(audit.len()) {
                // What the ring is about to overwrite must be durable in the log first.
                audit_file
                    .sync_data()
                    .map_err(JournalError::io("cannot sync", audit_path))?;
                self.counters.syncs.fetch_add(1, Ordering::Relaxed);
                ring.wrap();
            }
            crash::io_error(crash::AUDIT_SYNC_FAILS)
                .and_then(|()| ring.put(audit))
                .map_err(JournalError::io("cannot sync", &ring.path))?;
            self.counters.syncs.fetch_add(1, Ordering::Relaxed);
            crash::point(crash::AFTER_RING_SYNC, || {});
        }
        crash::point(crash::TORN_AUDIT, || {
            let _ = audit_file.write_all(&audit[..audit.len() / 2]);
        });
        audit_file
            .write_all(audit)
            .map_err(JournalError::io("cannot append to", audit_path))?;
        if needs_sync && !in_ring {
            crash::io_error(crash::AUDIT_SYNC_FAILS)
                .and_then(|()| audit_file.sync_data())
                .map_err(JournalError::io("cannot sync", audit_path))?;
            self.counters.syncs.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }
}
