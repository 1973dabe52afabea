//! Streaming verification of an audit file: one pass, constant memory, first break wins.
//!
//! A line verifies only if it is exactly the canonical encoding of its own content (see
//! [`super::strict`] for why bytes and not content), its hash matches, and it links to the line before.

use std::io::{self, BufRead};
use std::ops::Range;

use serde_json::Value;
use sha2::{Digest, Sha256};

use super::strict::{self, NOT_RECORD};
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

/// Verifies the chain in `reader`; with `expect_head`, an intact chain must also end there.
///
/// # Errors
/// Only when reading fails; a malformed or tampered file is a [`Report`] with `broken` set.
pub fn verify<R: BufRead>(mut reader: R, expect_head: Option<&str>) -> Result<Report, VerifyError> {
    let mut head = GENESIS.to_owned();
    let mut records = 0_u64;
    let mut line = Vec::with_capacity(512);
    let broken = |line: u64, reason: &str, head: String, records: u64| Report {
        records,
        head,
        broken: Some(Break {
            line,
            reason: reason.to_owned(),
        }),
    };
    loop {
        line.clear();
        if reader.read_until(b'\n', &mut line)? == 0 {
            break;
        }
        let number = records + 1;
        let Some(body) = line.strip_suffix(b"\n") else {
            return Ok(broken(
                number,
                "torn append: the last line has no terminating newline",
                head,
                records,
            ));
        };
        let checked = match check_line(body) {
            Ok(checked) => checked,
            Err(reason) => return Ok(broken(number, &reason, head, records)),
        };
        if checked.prev != head {
            return Ok(broken(
                number,
                "prev_sha256 does not link to the previous record",
                head,
                records,
            ));
        }
        if checked.computed != checked.claimed {
            return Ok(broken(
                number,
                "sha256 does not match the record",
                head,
                records,
            ));
        }
        head = checked.claimed;
        records = number;
    }
    if let Some(expected) = expect_head
        && expected != head
    {
        return Ok(Report {
            records,
            broken: Some(Break {
                line: records,
                reason: format!(
                    "head {head} is not the expected head {expected} (truncated or rewritten)"
                ),
            }),
            head,
        });
    }
    Ok(Report {
        records,
        head,
        broken: None,
    })
}

/// One line's claimed link and hash, and the hash its content really has (chained on its own
/// `prev_sha256`; the caller checks that link).
pub(super) struct Checked {
    pub(super) prev: String,
    pub(super) claimed: String,
    pub(super) computed: String,
}

/// Checks one line without its newline: it must be exactly the canonical encoding of its content.
/// The fast path proves that without building a value (what the writer produces); anything else is
/// parsed once, refused if it repeats a member name, and encoded once to compare with the line.
/// Either way the hash is then taken over the line's own bytes minus its `sha256` member.
pub(super) fn check_line(body: &[u8]) -> Result<Checked, String> {
    let (prev, claimed, member) = if let Some(fast) = scan::canonical_record(body) {
        let text = |range: Range<usize>| std::str::from_utf8(&body[range]).map(str::to_owned);
        let prev = text(fast.prev).map_err(|_| NOT_RECORD)?;
        let claimed = text(fast.sha).map_err(|_| NOT_RECORD)?;
        (prev, claimed, fast.member)
    } else {
        let record = strict::canonical_record(body)?;
        let (Some(Value::String(claimed)), Some(member)) =
            (record.members.get("sha256"), record.sha256_member)
        else {
            return Err("record has no sha256 string".to_owned());
        };
        let Some(Value::String(prev)) = record.members.get("prev_sha256") else {
            return Err("record has no prev_sha256 string".to_owned());
        };
        (prev.clone(), claimed.clone(), member)
    };
    let mut hasher = Sha256::new();
    hasher.update(prev.as_bytes());
    hasher.update(&body[..member.start]);
    hasher.update(&body[member.end..]);
    Ok(Checked {
        prev,
        claimed,
        computed: hex::encode(hasher.finalize()),
    })
}
