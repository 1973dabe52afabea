//! Verification of an audit file: one pass, bounded memory, first break wins, every core hashing.
//!
//! A line verifies only if it is exactly the canonical encoding of its own content (see
//! [`super::strict`] for why bytes and not content), its hash matches, and it links to the line
//! before.
//!
//! Design decision: records hash independently and only the links are sequential, so the file is
//! cut into blocks of whole lines; worker threads check each block on its own (every line's form
//! and hash, and the links inside the block) and the reading thread stitches the blocks in file
//! order (each block's first link to the head before it). The first break is the same one a
//! sequential pass finds, because a block's summary keeps the order of the checks on each line
//! (form, then link, then hash) and blocks are stitched strictly in order.

use std::collections::VecDeque;
use std::io::{self, BufRead};
use std::num::NonZeroUsize;
use std::ops::Range;
use std::sync::{Mutex, mpsc};

use serde_json::Value;
use sha2::{Digest, Sha256};

use super::strict;
use super::{GENESIS, scan};

/// Why a file is not an intact chain, and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Break {
    /// 1-based line number.
    pub line: u64,
    /// What is wrong with that line, in words for a person (torn, not canonical, bad link or
    /// hash, or the expected head not reached).
    pub reason: String,
}

/// What a verification found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    /// Records that verified before the first break (all of them when intact).
    pub records: u64,
    /// `sha256` of the last record that verified ([`GENESIS`] when none did).
    pub head: String,
    /// The first break found; `None` when every line verified.
    pub broken: Option<Break>,
}

impl Report {
    /// Whether the whole file verified (and, when one was expected, ended at the expected head).
    #[must_use]
    pub fn intact(&self) -> bool {
        self.broken.is_none()
    }
}

/// The file could not be read at all (as opposed to read and found broken).
#[derive(Debug, thiserror::Error)]
#[error("cannot read audit log")]
pub struct VerifyError(#[from] io::Error);

/// Verifies the chain in `reader` on every core; with `expect_head`, an intact chain must also
/// end there.
///
/// # Errors
/// Only when reading fails; a malformed or tampered file is a [`Report`] with `broken` set.
pub fn verify<R: BufRead>(reader: R, expect_head: Option<&str>) -> Result<Report, VerifyError> {
    let threads = std::thread::available_parallelism().unwrap_or(NonZeroUsize::MIN);
    verify_with(reader, expect_head, threads)
}

/// [`verify`] with `threads` hashing threads (1: everything on the calling thread). The report
/// does not depend on the number.
///
/// # Errors
/// Only when reading fails.
pub fn verify_with<R: BufRead>(
    reader: R,
    expect_head: Option<&str>,
    threads: NonZeroUsize,
) -> Result<Report, VerifyError> {
    verify_in_blocks(reader, GENESIS, expect_head, threads, BLOCK)
}

/// [`verify_with`] for a log that starts after record `start` instead of at the beginning: what
/// is left of a chain pruned down to a signed checkpoint, whose first line links to that
/// checkpoint's head. The report counts this file's records only.
///
/// # Errors
/// Only when reading fails.
pub fn verify_from<R: BufRead>(
    reader: R,
    start: &str,
    expect_head: Option<&str>,
    threads: NonZeroUsize,
) -> Result<Report, VerifyError> {
    verify_in_blocks(reader, start, expect_head, threads, BLOCK)
}

/// [`verify_with`] cutting the file into blocks of about `block` bytes (tests cut small blocks to
/// put every kind of break at a block's edge).
pub(super) fn verify_in_blocks<R: BufRead>(
    mut reader: R,
    start: &str,
    expect_head: Option<&str>,
    threads: NonZeroUsize,
    block: usize,
) -> Result<Report, VerifyError> {
    let mut blocks = Blocks::new(block);
    let mut chain = Stitch {
        head: hex_of_str(start),
        records: 0,
    };
    let first = blocks.next(&mut reader)?;
    let broken = match first {
        // A file of one block (or none) is checked here: threads would cost more than they save.
        Some(block) if threads.get() > 1 && !blocks.done => {
            parallel(&mut reader, &mut blocks, block, &mut chain, threads.get())?
        }
        Some(block) => {
            let mut next = Some(block);
            let mut broken = None;
            while let Some(block) = next {
                broken = chain.add(check_block(&block));
                if broken.is_some() {
                    break;
                }
                next = blocks.next(&mut reader)?;
            }
            broken
        }
        None => None,
    };
    let broken = broken.or_else(|| {
        (!blocks.torn.is_empty()).then(|| Break {
            line: chain.records + 1,
            reason: "torn append: the last line has no terminating newline".to_owned(),
        })
    });
    let head = text(&chain.head);
    if broken.is_none()
        && let Some(expected) = expect_head
        && expected != head
    {
        return Ok(Report {
            records: chain.records,
            broken: Some(Break {
                line: chain.records,
                reason: format!(
                    "head {head} is not the expected head {expected} (truncated or rewritten)"
                ),
            }),
            head,
        });
    }
    Ok(Report {
        records: chain.records,
        head,
        broken,
    })
}

/// Blocks of whole lines are checked on `threads` workers while this thread reads ahead and
/// stitches the summaries in file order; on the first break it stops reading, and the workers
/// stop when the queue closes.
fn parallel<R: BufRead>(
    reader: &mut R,
    blocks: &mut Blocks,
    first: Vec<u8>,
    chain: &mut Stitch,
    threads: usize,
) -> Result<Option<Break>, VerifyError> {
    type Job = (Vec<u8>, mpsc::SyncSender<Span>);
    let (work, queue) = mpsc::channel::<Job>();
    let queue = Mutex::new(queue);
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                loop {
                    // The lock is held while waiting for a job and taking it, never while
                    // checking one.
                    let job = queue
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .recv();
                    let Ok((block, done)) = job else { break };
                    let _ = done.send(check_block(&block));
                }
            });
        }
        // Blocks in flight, oldest first: enough to keep every worker busy while the oldest is
        // stitched, and a bound on memory (a few blocks per thread).
        let mut pending: VecDeque<mpsc::Receiver<Span>> = VecDeque::new();
        let mut next = Some(first);
        let mut run = || -> Result<Option<Break>, VerifyError> {
            loop {
                while pending.len() < threads * 3
                    && let Some(block) = next.take()
                {
                    let (done, summary) = mpsc::sync_channel(1);
                    if work.send((block, done)).is_err() {
                        break;
                    }
                    pending.push_back(summary);
                    next = blocks.next(reader)?;
                }
                let Some(oldest) = pending.pop_front() else {
                    return Ok(None);
                };
                // Only a panicking worker drops its sender, and the scope re-raises that panic.
                let Ok(span) = oldest.recv() else {
                    return Ok(None);
                };
                if let Some(broken) = chain.add(span) {
                    return Ok(Some(broken));
                }
            }
        };
        let result = run();
        // Closing the queue ends the workers once they finish what they hold.
        drop(work);
        result
    })
}

/// Lowercase hex of a SHA-256, as the record spells it. A field that is not 64 bytes is kept as
/// [`NOT_HEX`], which equals no real head or digest.
pub(super) type Hex = [u8; 64];

/// Stands for a `prev_sha256` or `sha256` of the wrong length: not ASCII, so no hex equals it.
const NOT_HEX: Hex = [0xff; 64];

fn hex_of_str(text: &str) -> Hex {
    text.as_bytes().try_into().unwrap_or(NOT_HEX)
}

fn hex_of_digest(digest: &[u8]) -> Hex {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = [0_u8; 64];
    for (pair, byte) in out.chunks_exact_mut(2).zip(digest) {
        pair[0] = DIGITS[usize::from(byte >> 4)];
        pair[1] = DIGITS[usize::from(byte & 0x0f)];
    }
    out
}

/// Only verified heads and digests are ever shown, and those are hex.
pub(super) fn text(hex: &Hex) -> String {
    String::from_utf8_lossy(hex).into_owned()
}

/// The chain so far: the head of the last record that verified and how many did.
struct Stitch {
    head: Hex,
    records: u64,
}

impl Stitch {
    /// Appends a block's summary; the first break, if this block has it.
    fn add(&mut self, span: Span) -> Option<Break> {
        if let Some(prev) = span.first_prev
            && prev != self.head
        {
            return Some(self.broken(Fault::Link));
        }
        self.records += span.lines;
        if let Some(last) = span.last {
            self.head = last;
        }
        span.fault.map(|fault| self.broken(fault))
    }

    fn broken(&self, fault: Fault) -> Break {
        let reason = match fault {
            Fault::Line(reason) => reason,
            Fault::Link => "prev_sha256 does not link to the previous record".to_owned(),
            Fault::Hash => "sha256 does not match the record".to_owned(),
        };
        Break {
            line: self.records + 1,
            reason,
        }
    }
}

/// What one block of whole lines says about itself.
struct Span {
    /// Lines that verified, from the block's first, up to the fault if there is one.
    lines: u64,
    /// The first line's `prev_sha256`, when that line could be read: the caller checks this link.
    first_prev: Option<Hex>,
    /// `sha256` of the last line that verified.
    last: Option<Hex>,
    /// What is wrong with the line after the `lines` that verified.
    fault: Option<Fault>,
}

enum Fault {
    Line(String),
    Link,
    Hash,
}

/// Checks every line of `block` (whole lines, each ending in `\n`) in the order a sequential pass
/// would, stopping at the first fault.
fn check_block(block: &[u8]) -> Span {
    let mut span = Span {
        lines: 0,
        first_prev: None,
        last: None,
        fault: None,
    };
    let mut start = 0;
    for end in memchr::memchr_iter(b'\n', block) {
        let body = &block[start..end];
        start = end + 1;
        let checked = match check_line(body) {
            Ok(checked) => checked,
            Err(reason) => {
                span.fault = Some(Fault::Line(reason));
                break;
            }
        };
        match span.last {
            None => span.first_prev = Some(checked.prev),
            Some(last) if last != checked.prev => {
                span.fault = Some(Fault::Link);
                break;
            }
            Some(_) => {}
        }
        if checked.computed != checked.claimed {
            span.fault = Some(Fault::Hash);
            break;
        }
        span.last = Some(checked.claimed);
        span.lines += 1;
    }
    span
}

/// Reads a file as blocks of whole lines; what follows the last newline at the end is `torn`.
struct Blocks {
    /// About how many bytes a block holds.
    size: usize,
    /// Bytes read after the last newline of the previous block.
    carry: Vec<u8>,
    /// The reader is exhausted.
    done: bool,
    /// At the end: the bytes after the file's last newline (empty for an intact file).
    torn: Vec<u8>,
}

/// A block's size: large enough that handing it to a thread costs nothing, small enough that a
/// few per thread are little memory.
const BLOCK: usize = 1 << 20;

impl Blocks {
    fn new(size: usize) -> Self {
        Self {
            size: size.max(1),
            carry: Vec::new(),
            done: false,
            torn: Vec::new(),
        }
    }

    /// The next block of whole lines, `None` at the end. A line longer than a block makes a block
    /// of its own.
    fn next<R: BufRead>(&mut self, reader: &mut R) -> io::Result<Option<Vec<u8>>> {
        if self.done {
            return Ok(None);
        }
        let mut block = std::mem::take(&mut self.carry);
        block.reserve(self.size);
        // `block[..clean]` is known to hold no newline.
        let mut clean = 0;
        loop {
            // Read straight into the block: a reader's buffer smaller than the request is skipped.
            let start = block.len();
            let want = match self.size.checked_sub(start) {
                Some(room) if room > 0 => room,
                _ => self.size,
            };
            block.resize(start + want, 0);
            let read = match reader.read(&mut block[start..]) {
                Ok(read) => read,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {
                    block.truncate(start);
                    continue;
                }
                Err(error) => return Err(error),
            };
            block.truncate(start + read);
            if read == 0 {
                self.done = true;
                let Some(last) = memchr::memrchr(b'\n', &block) else {
                    self.torn = block;
                    return Ok(None);
                };
                self.torn = block.split_off(last + 1);
                return Ok(Some(block));
            }
            if block.len() < self.size {
                continue;
            }
            if let Some(last) = memchr::memrchr(b'\n', &block[clean..]) {
                self.carry = block.split_off(clean + last + 1);
                return Ok(Some(block));
            }
            // One line longer than a block so far: keep reading until it ends.
            clean = block.len();
        }
    }
}

/// One line's claimed link and hash, and the hash its content really has (chained on its own
/// `prev_sha256`; the caller checks that link).
pub(super) struct Checked {
    pub(super) prev: Hex,
    pub(super) claimed: Hex,
    pub(super) computed: Hex,
}

/// Checks one line without its newline: it must be exactly the canonical encoding of its content.
/// The fast path proves that without building a value (what the writer produces); anything else is
/// parsed once, refused if it repeats a member name, and encoded once to compare with the line.
/// Either way the hash is then taken over the line's own bytes minus its `sha256` member.
pub(super) fn check_line(body: &[u8]) -> Result<Checked, String> {
    let slow;
    let (prev, claimed, member): (&[u8], &[u8], Range<usize>) =
        if let Some(fast) = scan::canonical_record(body) {
            (&body[fast.prev], &body[fast.sha], fast.member)
        } else {
            slow = strict::canonical_record(body)?;
            let (Some(Value::String(claimed)), Some(member)) =
                (slow.members.get("sha256"), slow.sha256_member.clone())
            else {
                return Err("record has no sha256 string".to_owned());
            };
            let Some(Value::String(prev)) = slow.members.get("prev_sha256") else {
                return Err("record has no prev_sha256 string".to_owned());
            };
            (prev.as_bytes(), claimed.as_bytes(), member)
        };
    let mut hasher = Sha256::new();
    hasher.update(prev);
    hasher.update(&body[..member.start]);
    hasher.update(&body[member.end..]);
    let field = |bytes: &[u8]| bytes.try_into().unwrap_or(NOT_HEX);
    Ok(Checked {
        prev: field(prev),
        claimed: field(claimed),
        computed: hex_of_digest(&hasher.finalize()),
    })
}
