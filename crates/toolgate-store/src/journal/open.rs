//! Start-up: lock the files, find the chain's head, repair what a crash can leave, rebuild the index.
//!
//! What a crash can leave, and what is done about it:
//! - a torn last line in `audit.jsonl` (no newline, or not JSON): moved to `audit.jsonl.torn-<ts>`,
//!   and a `recover / torn_tail_moved_aside` record is appended so the chain verifies again;
//! - audit lines of committed effects, or of synced records, that never reached `audit.jsonl`:
//!   re-appended from the WAL or the sync ring (module `ring`), as far as they continue the chain;
//! - a torn last frame in `ledger.wal` (not JSON, or no final newline): cut off (its sync never
//!   finished, so it was never acknowledged and its audit line was never written).
//!
//! Anything else is not a crash's doing: start-up fails and nothing is changed. That covers a
//! complete last record whose hash is wrong, a bad frame in the middle of the WAL, a frame whose
//! audit record does not vouch for its effect (module `frame`), and a complete JSON line, last or
//! not, that is no frame this version can read (a torn write is never complete JSON, so such a line
//! is kept for a newer version or a person, never cut).

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::Path;

use serde_json::{Value, json};
use toolgate_core::audit::{self, Chain, Decision, Event, GENESIS, Outcome};
use toolgate_core::canonical;

use super::frame::{self, Bad};
use super::ring::{self, Ring};
use super::writer::Files;
use super::{AUDIT_FILE, Durability, Index, JournalError, RING_FILE, Recovery, WAL_FILE, now_ns};

pub(crate) struct Opened {
    pub(crate) files: Files,
    pub(crate) chain: Chain,
    pub(crate) effects: Index,
    pub(crate) recovery: Recovery,
}

pub(crate) fn open(dir: &Path, durability: Durability) -> Result<Opened, JournalError> {
    std::fs::create_dir_all(dir).map_err(JournalError::io("cannot create data directory", dir))?;
    let audit_path = dir.join(AUDIT_FILE);
    let wal_path = dir.join(WAL_FILE);
    let mut audit = open_locked(&audit_path)?;
    let wal = open_append(&wal_path)?;
    sync_dir(dir)?;

    let mut recovery = Recovery::default();
    let (head, torn) = audit_tail(&mut audit, &audit_path)?;
    // The WAL is read in full before anything is repaired: if it is corrupt, start-up stops
    // with both files as they were.
    let WalScan {
        effects,
        replay,
        good_len: wal_good_len,
    } = scan_wal(&wal_path, &head)?;
    let ring_path = dir.join(RING_FILE);
    // Copies of records by the head they follow: the ring's, then the WAL's over them.
    let mut copies = ring::scan(&ring_path)?;
    copies.extend(replay);
    let mut chain = Chain::new(head);
    if let Some((offset, bytes)) = &torn {
        let aside = dir.join(format!("{AUDIT_FILE}.torn-{}", now_ns()));
        std::fs::write(&aside, bytes)
            .map_err(JournalError::io("cannot save torn tail to", &aside))?;
        File::open(&aside)
            .and_then(|f| f.sync_all())
            .map_err(JournalError::io("cannot sync", &aside))?;
        audit
            .set_len(*offset)
            .map_err(JournalError::io("cannot truncate", &audit_path))?;
        recovery.torn_audit = Some((aside, bytes.len() as u64));
    }

    let wal_len = wal
        .metadata()
        .map_err(JournalError::io("cannot stat", &wal_path))?
        .len();
    if wal_good_len < wal_len {
        wal.set_len(wal_good_len)
            .map_err(JournalError::io("cannot truncate", &wal_path))?;
        wal.sync_all()
            .map_err(JournalError::io("cannot sync", &wal_path))?;
        recovery.torn_wal_bytes = wal_len - wal_good_len;
    }
    let mut repaired = Vec::new();
    // Only the chain's own continuation is restored; anything else is already in the file.
    while let Some(line) = copies.remove(chain.head()) {
        let sha = audit::line_head(&line).unwrap_or_default();
        repaired.extend_from_slice(&line);
        repaired.push(b'\n');
        chain = Chain::new(sha);
        recovery.replayed += 1;
    }
    if let Some((aside, bytes)) = &recovery.torn_audit {
        let name = aside
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let event = Event {
            request_id: "recovery".to_owned(),
            method: "audit/recover".to_owned(),
            name: AUDIT_FILE.to_owned(),
            decision: Decision::Recover,
            outcome: Outcome::TornTailMovedAside,
            args_digest: canonical::digest(&json!({ "bytes": bytes, "moved_to": name })),
            detail: Default::default(),
        };
        repaired.extend_from_slice(&chain.seal(&event, now_ns()).line);
    }
    if !repaired.is_empty() || torn.is_some() {
        audit
            .write_all(&repaired)
            .map_err(JournalError::io("cannot append to", &audit_path))?;
        audit
            .sync_all()
            .map_err(JournalError::io("cannot sync", &audit_path))?;
    }
    let ring = match durability {
        Durability::Synced => {
            // The ring is overwritten from its start: what it held must be durable in the log.
            audit
                .sync_data()
                .map_err(JournalError::io("cannot sync", &audit_path))?;
            Some(Ring::open(&ring_path)?)
        }
        Durability::Buffered => None,
    };
    Ok(Opened {
        files: Files {
            audit,
            audit_path,
            wal,
            wal_path,
            ring,
        },
        chain,
        effects,
        recovery,
    })
}

fn open_append(path: &Path) -> Result<File, JournalError> {
    OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .open(path)
        .map_err(JournalError::io("cannot open", path))
}

fn open_locked(path: &Path) -> Result<File, JournalError> {
    let file = open_append(path)?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(JournalError::Locked {
            path: path.to_path_buf(),
        }),
        Err(std::fs::TryLockError::Error(source)) => Err(JournalError::Io {
            context: "cannot lock",
            path: path.to_path_buf(),
            source,
        }),
    }
}

pub(super) fn sync_dir(dir: &Path) -> Result<(), JournalError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(JournalError::io("cannot sync directory", dir))
}

/// A torn last line of the audit log: where it starts and what it holds.
type Torn = (u64, Vec<u8>);

/// The head from the last complete line, plus a torn tail (its offset and bytes) if there is one.
/// Reads backwards from the end: O(1) in the size of the log.
fn audit_tail(file: &mut File, path: &Path) -> Result<(String, Option<Torn>), JournalError> {
    let len = file
        .metadata()
        .map_err(JournalError::io("cannot stat", path))?
        .len();
    let read_io = JournalError::io("cannot read", path);
    let last_lines = read_back(file, len, 2).map_err(read_io)?;
    // `last_lines` starts at a line start (or the file start) and holds the last two lines at most.
    let (start, bytes) = last_lines;
    let mut lines: Vec<(u64, &[u8])> = Vec::new();
    let mut offset = start;
    for piece in bytes.split_inclusive(|b| *b == b'\n') {
        lines.push((offset, piece));
        offset += piece.len() as u64;
    }
    let mut torn: Option<Torn> = None;
    if let Some(&(at, piece)) = lines.last() {
        let complete = piece.ends_with(b"\n");
        let parses = serde_json::from_slice::<Value>(piece).is_ok_and(|v| v.is_object());
        if !complete || !parses {
            torn = Some((at, piece.to_vec()));
            lines.pop();
        }
    }
    let head =
        match lines.last() {
            None if start == 0 => GENESIS.to_owned(),
            None => {
                return Err(JournalError::Corrupt {
                    path: path.to_path_buf(),
                    line: 0,
                    reason: "cannot find the last complete record".to_owned(),
                });
            }
            Some(&(_, line)) => audit::line_head(line.strip_suffix(b"\n").unwrap_or(line))
                .ok_or_else(|| JournalError::Corrupt {
                    path: path.to_path_buf(),
                    line: 0,
                    reason: "the last complete record does not match its own sha256".to_owned(),
                })?,
        };
    Ok((head, torn))
}

/// The last `want` line-pieces of the file: returns the offset where they start and their bytes.
fn read_back(file: &mut File, len: u64, want: usize) -> std::io::Result<(u64, Vec<u8>)> {
    let mut start = len;
    let mut buf: Vec<u8> = Vec::new();
    let mut chunk = 4096_u64;
    loop {
        // Newlines strictly before the final byte separate complete lines.
        let body = buf.len().saturating_sub(1);
        let newlines: Vec<usize> = buf[..body]
            .iter()
            .enumerate()
            .filter(|(_, b)| **b == b'\n')
            .map(|(i, _)| i)
            .collect();
        if newlines.len() >= want || start == 0 {
            let cut = if newlines.len() >= want {
                newlines[newlines.len() - want] + 1
            } else {
                0
            };
            return Ok((start + cut as u64, buf[cut..].to_vec()));
        }
        let next = start.saturating_sub(chunk);
        let mut more = vec![0; usize::try_from(start - next).unwrap_or(0)];
        file.seek(SeekFrom::Start(next))?;
        file.read_exact(&mut more)?;
        more.extend_from_slice(&buf);
        buf = more;
        start = next;
        chunk = chunk.saturating_mul(2);
    }
}

/// What the WAL holds: the index of effects, the audit lines after the head as
/// `(prev_sha256, line)`, and the length of its valid prefix.
struct WalScan {
    effects: Index,
    replay: Vec<(String, Vec<u8>)>,
    good_len: u64,
}

/// Reads the whole WAL; a torn last frame is left out of the valid prefix.
fn scan_wal(path: &Path, head: &str) -> Result<WalScan, JournalError> {
    let file = File::open(path).map_err(JournalError::io("cannot open", path))?;
    let mut reader = BufReader::with_capacity(1 << 16, file);
    let mut effects = Index::default();
    let mut replay = Vec::new();
    let mut good = 0_u64;
    let mut number = 0_u64;
    let mut line = Vec::new();
    let mut after_head = head == GENESIS;
    loop {
        line.clear();
        let n = reader
            .read_until(b'\n', &mut line)
            .map_err(JournalError::io("cannot read", path))?;
        if n == 0 {
            break;
        }
        number += 1;
        let corrupt = |reason: &str| JournalError::Corrupt {
            path: path.to_path_buf(),
            line: number,
            reason: reason.to_owned(),
        };
        let Some(body) = line.strip_suffix(b"\n") else {
            break; // torn last frame
        };
        let frame = match frame::decode(body) {
            Ok(frame) => frame,
            Err(Bad::NotJson) => {
                if reader
                    .fill_buf()
                    .map_err(JournalError::io("cannot read", path))?
                    .is_empty()
                {
                    break; // torn last frame that happens to end in a newline byte
                }
                return Err(corrupt("not a WAL frame"));
            }
            Err(Bad::Invalid(reason)) => return Err(corrupt(reason)),
        };
        // From the frame that follows the head on: the audit lines a crash may have taken.
        after_head |= frame.prev == head;
        if after_head {
            replay.push((frame.prev, frame.record));
        }
        if frame.sha256 == head {
            after_head = true;
        }
        effects.insert(frame.effect);
        good += n as u64;
    }
    Ok(WalScan {
        effects,
        replay,
        good_len: good,
    })
}
