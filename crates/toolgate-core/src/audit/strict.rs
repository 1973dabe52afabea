//! The verifier's slow path: read a line the fast scanner could not vouch for, and accept it only
//! if it is byte for byte the canonical encoding of what it says.
//!
//! Why bytes and not content: the hash covers the canonical form of the content, so any other
//! spelling of the same content (spaces, another key order, `\u0041` for `A`, a CR before the
//! newline) hashes the same. Accepting those would let a file say one thing to a tool that reads
//! its bytes (`grep`, a log shipper) and another to the verifier.
//!
//! Why the one-reading parser (`crate::json`): JSON leaves the meaning of repeated member names to
//! the reader (RFC 8259 §4) and readers disagree: serde_json and Python keep the last, `grep` and many
//! streaming readers see the first. A forged `"decision"` placed before the real one hashes as the
//! real one and reads as the forgery. The byte comparison alone would refuse such a line (its
//! canonical form has one member), but it could only say "not canonical"; refusing the repeat while
//! parsing, at every depth, names it. The line is parsed once and encoded once: that encoding serves
//! both the comparison and the hash.

use std::ops::Range;

use serde_json::{Map, Value};

use crate::canonical;
use crate::json::{self, JsonError};

/// Records nest far less than this; the limit only keeps a hostile line from costing stack.
const RECORD_MAX_DEPTH: usize = 128;

/// Why a line is not a record, for [`super::Break::reason`].
pub(super) const NOT_RECORD: &str = "not a complete JSON record (torn append or corrupted line)";

/// A line that is exactly the canonical encoding of a JSON object.
pub(super) struct Record {
    pub(super) members: Map<String, Value>,
    /// Where the line's `sha256` member is, with one comma that joins it to a neighbour: the line
    /// without these bytes is the canonical record without `sha256`, which is what was hashed.
    pub(super) sha256_member: Option<Range<usize>>,
}

/// The line as a [`Record`] when it is a JSON object without repeated member names whose canonical
/// encoding is exactly `line`; otherwise why not.
pub(super) fn canonical_record(line: &[u8]) -> Result<Record, String> {
    let members = match json::parse_nested(line, RECORD_MAX_DEPTH) {
        Ok(Value::Object(members)) => members,
        Err(JsonError::Duplicate { name }) => {
            return Err(format!(
                "duplicate key {}: readers disagree on which one counts",
                shown(&name)
            ));
        }
        // Syntax, not UTF-8, absurd nesting: a torn or corrupted line.
        Ok(_) | Err(_) => return Err(NOT_RECORD.to_owned()),
    };
    let (encoded, sha256_member) = encode(&members);
    if encoded != line {
        return Err(not_canonical(line, &encoded));
    }
    Ok(Record {
        members,
        sha256_member,
    })
}

/// The canonical encoding of the object `members`, and where its `sha256` member is (see
/// [`Record::sha256_member`]): one encoding serves both the comparison and the hash.
fn encode(members: &Map<String, Value>) -> (Vec<u8>, Option<Range<usize>>) {
    let entries = canonical::sorted(members);
    let last = entries.len().saturating_sub(1);
    let mut out = Vec::with_capacity(512);
    let mut sha256_member = None;
    out.push(b'{');
    for (i, (key, value)) in entries.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        let start = out.len();
        canonical::write_str(key, &mut out);
        out.push(b':');
        canonical::write(value, &mut out);
        if key == "sha256" {
            sha256_member = Some(if i > 0 {
                start - 1..out.len()
            } else if i < last {
                start..out.len() + 1
            } else {
                start..out.len()
            });
        }
    }
    out.push(b'}');
    (out, sha256_member)
}

/// Where `line` first departs from its canonical encoding, and what is there.
fn not_canonical(line: &[u8], encoded: &[u8]) -> String {
    let at = line
        .iter()
        .zip(encoded)
        .position(|(a, b)| a != b)
        .unwrap_or_else(|| line.len().min(encoded.len()));
    // Everything before `at` is identical, and inside a string a raw character is written as is,
    // so whitespace found here lies outside any string.
    let what = match line.get(at) {
        Some(b'\r') if at + 1 == line.len() => "a carriage return before the newline",
        Some(b' ' | b'\t' | b'\r' | b'\n') => "whitespace outside strings",
        _ => "key order, an escape or a number written otherwise than in canonical form",
    };
    format!(
        "not the canonical encoding of its content (column {}): {what}",
        at + 1
    )
}

/// A key from a possibly hostile line, quoted with control characters escaped and cut short, for
/// a message a person reads in a terminal.
fn shown(key: &str) -> String {
    const MAX_CHARS: usize = 64;
    match key.char_indices().nth(MAX_CHARS) {
        Some((cut, _)) => format!("{:?}…", &key[..cut]),
        None => format!("{key:?}"),
    }
}
