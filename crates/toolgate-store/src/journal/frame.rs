//! The WAL frame: one line of `ledger.wal` per committed effect, holding the effect and its
//! complete audit record, `{"audit":<record>,"body":<body>,"key":<key>}` in canonical JSON.
//!
//! A frame is trusted at start only if its audit record *vouches* for its effect:
//! - the record matches its own `sha256`, so it is the record that was sealed into the chain;
//! - the SHA-256 of the body's canonical JSON is the record's [`EFFECT_SHA256`] if it has one,
//!   else its `args_digest`;
//! - the key is the record's [`EFFECT_KEY`] if it has one, else its `request_id`.
//!
//! The record is hashed into the chain, so an effect edited in the WAL no longer matches its record,
//! and the record cannot be edited to match without breaking its hash: recovery refuses the frame
//! (start-up fails, nothing is changed). The check knows nothing of what a body means. [`vouch`]
//! makes every record the journal seals for an effect pass it, before anything is written, so the
//! writer never writes a frame that recovery would refuse.
//!
//! Design decision: a record names its effect through fields it has anyway whenever it can. When
//! the effect *is* the call (its body is the call's arguments, its key the call's `request_id`, as
//! for the ledger's notes), `args_digest` and `request_id` already name it and the record is exactly
//! the one the call would have had without an effect; only an effect that differs from its call
//! adds `effect_sha256` and/or `effect_key` to its record.
//!
//! Compatibility: earlier versions wrote note frames, `{"audit":…,"request_id":…,"text":…}`. They
//! are still read, as the effect `key = request_id`, `body = {"request_id":…,"text":…}` (what the
//! ledger now writes for the same note), and checked as they were then: the body's digest must be
//! the record's `args_digest`, which covers the key since the key is inside the body. New frames are
//! always effect frames, so a WAL may begin with note frames and go on with effect frames. Earlier
//! versions cannot read effect frames: going back to one after an upgrade is not supported.

use serde::Deserialize;
use serde_json::{Value, json};
use toolgate_core::audit::{self, Event, Sealed};
use toolgate_core::canonical;

use super::Effect;

/// Audit field naming an effect's body by the SHA-256 (64 lower-case hex digits) of its canonical
/// JSON, set by [`Journal::put_effect`](super::Journal::put_effect) when the body is not the
/// call's arguments (whose digest is `args_digest` already). Reserved: on an effect's record the
/// journal sets or removes it, whatever the caller put there.
pub const EFFECT_SHA256: &str = "effect_sha256";

/// Audit field naming an effect's key, set by [`Journal::put_effect`](super::Journal::put_effect)
/// when the key is not the record's `request_id`. Reserved like [`EFFECT_SHA256`].
pub const EFFECT_KEY: &str = "effect_key";

/// Makes `event` vouch for the effect `key` whose body's canonical JSON has SHA-256
/// `body_sha256` (module header). A caller's own value of a reserved field is replaced or
/// removed: left in place, it would name some other effect.
pub(crate) fn vouch(event: &mut Event, key: &str, body_sha256: &str) {
    let detail = &mut event.detail;
    if event.args_digest == body_sha256 {
        detail.remove(EFFECT_SHA256);
    } else {
        detail.insert(EFFECT_SHA256.to_owned(), body_sha256.into());
    }
    if event.request_id == key {
        detail.remove(EFFECT_KEY);
    } else {
        detail.insert(EFFECT_KEY.to_owned(), key.into());
    }
}

/// One frame's line (with its `\n`): the effect's key, its body in canonical JSON, and the sealed
/// record. Written directly in canonical form: the record and the body are canonical already and
/// the keys are in sorted order.
pub(crate) fn encode(key: &str, body: &[u8], sealed: &Sealed) -> Vec<u8> {
    let record = sealed.line.strip_suffix(b"\n").unwrap_or(&sealed.line);
    let mut line = Vec::with_capacity(record.len() + body.len() + key.len() + 32);
    line.extend_from_slice(b"{\"audit\":");
    line.extend_from_slice(record);
    line.extend_from_slice(b",\"body\":");
    line.extend_from_slice(body);
    line.extend_from_slice(b",\"key\":");
    canonical::write_str(key, &mut line);
    line.extend_from_slice(b"}\n");
    line
}

/// A frame read back and checked.
#[derive(Debug)]
pub(crate) struct Frame {
    /// The audit record's line, canonical, without its `\n`.
    pub(crate) record: Vec<u8>,
    /// The record's `sha256`.
    pub(crate) sha256: String,
    /// The record's `prev_sha256`.
    pub(crate) prev: String,
    pub(crate) effect: Effect,
}

/// Why a line is not a frame that can be trusted.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Bad {
    /// Not JSON at all: a torn write, when it is the last line.
    NotJson,
    /// Complete JSON that is not a trustworthy frame: never a crash's doing.
    Invalid(&'static str),
}

/// Either kind of frame, as parsed; which fields are present tells them apart.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    audit: Value,
    key: Option<String>,
    body: Option<Value>,
    request_id: Option<String>,
    text: Option<String>,
}

/// Parses and checks one line (without its `\n`).
pub(crate) fn decode(line: &[u8]) -> Result<Frame, Bad> {
    let raw = match serde_json::from_slice::<Raw>(line) {
        Ok(raw) => raw,
        Err(_) if serde_json::from_slice::<serde::de::IgnoredAny>(line).is_ok() => {
            return Err(Bad::Invalid(
                "complete JSON but not a frame this version can read (written by a newer \
                 version?)",
            ));
        }
        Err(_) => return Err(Bad::NotJson),
    };
    let record = canonical::to_vec(&raw.audit);
    let sha256 = audit::line_head(&record)
        .ok_or(Bad::Invalid("its audit record does not match its sha256"))?;
    let field = |name: &str| raw.audit.get(name).and_then(Value::as_str);
    // The field that names a part of the effect: the reserved one if the record has it.
    let named = |reserved: &str, core: &str| {
        if raw.audit.get(reserved).is_some() {
            field(reserved)
        } else {
            field(core)
        }
    };
    let effect = match (raw.key, raw.body, raw.request_id, raw.text) {
        (Some(key), Some(body), None, None) => {
            if named(EFFECT_SHA256, "args_digest") != Some(canonical::digest(&body).as_str()) {
                return Err(Bad::Invalid(
                    "the effect's body does not match its audit record (effect_sha256, else \
                     args_digest)",
                ));
            }
            if named(EFFECT_KEY, "request_id") != Some(key.as_str()) {
                return Err(Bad::Invalid(
                    "the effect's key does not match its audit record (effect_key, else \
                     request_id)",
                ));
            }
            Effect { key, body }
        }
        (None, None, Some(request_id), Some(text)) => {
            let body = json!({ "request_id": request_id, "text": text });
            if field("args_digest") != Some(canonical::digest(&body).as_str()) {
                return Err(Bad::Invalid(
                    "the note does not match its audit record's args_digest",
                ));
            }
            Effect {
                key: request_id,
                body,
            }
        }
        _ => {
            return Err(Bad::Invalid(
                "neither an effect frame (audit, body, key) nor a note frame of an earlier \
                 version (audit, request_id, text)",
            ));
        }
    };
    let prev = field("prev_sha256").unwrap_or_default().to_owned();
    Ok(Frame {
        record,
        sha256,
        prev,
        effect,
    })
}
