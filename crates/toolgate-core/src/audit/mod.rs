//! The audit chain: what one record holds, how it is sealed, and how a file of records is verified.
//!
//! Format of seed 000 (`vectors/README.md`): one canonical JSON object per line, separated by `\n`
//! only; `sha256 = SHA-256(prev_sha256 as 64 hex chars || canonical(record without "sha256"))`, and
//! `prev_sha256` of the first record is 64 zeros. Arguments appear only as `args_digest`.
//!
//! This module owns the format and nothing else: it never touches a file. The writer
//! (`toolgate-store`) and the verifier (`toolgate audit verify`) both go through [`Chain::seal`] and
//! [`verify`], so the encoder that writes a record is the one that checks it. The check is on bytes:
//! a line verifies only if it is exactly the canonical encoding of its own content.

mod scan;
mod strict;
mod verify;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::canonical;

pub use verify::{Break, Report, VerifyError, verify, verify_from, verify_with};

/// `prev_sha256` of the first record of a chain.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// What the gate decided about a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// The call was let through to its handler (whatever the handler then did).
    Allow,
    /// Refused by a rule before anything ran.
    Deny,
    /// Refused with a dry run (a gated tool whose switch is off).
    Refuse,
    /// The approval queue: a request opened, or resolved by a person or by expiry.
    Approval,
    /// An operator's control changed state (the kill switch).
    Control,
    /// The log itself was repaired at start (a torn last line moved aside).
    Recover,
    /// A mutation's postcondition was read back and judged (seed 000's execute-verify-stop): the
    /// outcome says whether the caller may go on.
    Verify,
}

impl Decision {
    /// The record's `decision` field: `allow`, `deny`, `refuse`, `approval`, `control`,
    /// `recover` or `verify`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Allow => "allow",
            Self::Deny => "deny",
            Self::Refuse => "refuse",
            Self::Approval => "approval",
            Self::Control => "control",
            Self::Recover => "recover",
            Self::Verify => "verify",
        }
    }
}

/// What happened after the decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The effect was made durable by this call.
    Committed,
    /// The effect already existed for this idempotency key; nothing was done again.
    Replay,
    /// A read observed state.
    Observed,
    /// Refused before any handler ran.
    NotExecuted,
    /// The idempotency key was used before with other arguments.
    Conflict,
    /// The arguments do not fit the tool's schema; nothing ran.
    InvalidArgs,
    /// The handler ran and failed.
    Failed,
    /// A torn final line was moved out of the log file.
    TornTailMovedAside,
    /// Answered with what the call would do; nothing ran.
    DryRun,
    /// An approval request was opened (or the call attached to an open one).
    Requested,
    /// A person approved the request.
    Approved,
    /// A person denied the request.
    Denied,
    /// Nobody decided in time: denial.
    Expired,
    /// The handler ran past its timeout; its result was discarded.
    Timeout,
    /// The client cancelled the call.
    Cancelled,
    /// The effect may or may not have happened.
    InDoubt,
    /// The kill switch was turned on: every tool is blocked.
    SwitchOn,
    /// The kill switch was turned off.
    SwitchOff,
    /// The caller used up its rate limit for the tool; nothing ran.
    RateLimited,
    /// The tool (an upstream's) asked the caller for input before it can finish.
    InputRequired,
    /// The postcondition held: the caller may go on.
    Continue,
    /// The postcondition did not hold, or could not be read or decided: the caller stops.
    Stop,
    /// The postcondition did not hold and the policy's compensating tool is called; the caller
    /// stops.
    Rollback,
    /// A new policy was loaded while the server ran: calls from now on are decided by it.
    PolicyLoaded,
    /// A new policy file was read and refused (malformed, or not fitting the tools): the policy in
    /// force stays.
    PolicyRefused,
}

impl Outcome {
    /// The record's `outcome` field, in snake case (`not_executed`, `in_doubt`, …).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Committed => "committed",
            Self::Replay => "replay",
            Self::Observed => "observed",
            Self::NotExecuted => "not_executed",
            Self::Conflict => "conflict",
            Self::InvalidArgs => "invalid_args",
            Self::Failed => "failed",
            Self::TornTailMovedAside => "torn_tail_moved_aside",
            Self::DryRun => "dry_run",
            Self::Requested => "requested",
            Self::Approved => "approved",
            Self::Denied => "denied",
            Self::Expired => "expired",
            Self::Timeout => "timeout",
            Self::Cancelled => "cancelled",
            Self::InDoubt => "in_doubt",
            Self::SwitchOn => "switch_on",
            Self::SwitchOff => "switch_off",
            Self::RateLimited => "rate_limited",
            Self::InputRequired => "input_required",
            Self::Continue => "continue",
            Self::Stop => "stop",
            Self::Rollback => "rollback",
            Self::PolicyLoaded => "policy_loaded",
            Self::PolicyRefused => "policy_refused",
        }
    }
}

/// A record before it is placed in the chain: everything but `ts`, `prev_sha256` and `sha256`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// The JSON-RPC id of the request, as text; a fixed word (`killswitch`, `recovery`) for
    /// records no request made.
    pub request_id: String,
    /// What was done: `tools/call`, or an operator's action such as `killswitch/set`.
    pub method: String,
    /// The tool called, or the thing acted on.
    pub name: String,
    /// What the gate decided.
    pub decision: Decision,
    /// What happened after the decision.
    pub outcome: Outcome,
    /// SHA-256 of the canonical arguments ([`canonical::digest`]).
    pub args_digest: String,
    /// More fields, e.g. `rule`, `policy_sha256`, `approval_id`, `approver`. They are hashed with
    /// the rest; a key that names a core field is ignored.
    pub detail: BTreeMap<String, Value>,
}

impl Event {
    /// An event for a `tools/call`, digesting `arguments`.
    #[must_use]
    pub fn tool_call(
        request_id: impl Into<String>,
        name: impl Into<String>,
        decision: Decision,
        outcome: Outcome,
        arguments: &Value,
    ) -> Self {
        let digest = canonical::digest(arguments);
        Self::tool_call_digested(request_id, name, decision, outcome, digest)
    }

    /// An event for a `tools/call` whose arguments were digested already ([`canonical::digest`]).
    #[must_use]
    pub fn tool_call_digested(
        request_id: impl Into<String>,
        name: impl Into<String>,
        decision: Decision,
        outcome: Outcome,
        args_digest: String,
    ) -> Self {
        Self {
            request_id: request_id.into(),
            method: "tools/call".to_owned(),
            name: name.into(),
            decision,
            outcome,
            args_digest,
            detail: BTreeMap::new(),
        }
    }

    /// Adds a field to the record.
    #[must_use]
    pub fn with(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.detail.insert(key.to_owned(), value.into());
        self
    }
}

/// The fields every record has; `Event::detail` cannot override them.
const CORE_FIELDS: &[&str] = &[
    "args_digest",
    "decision",
    "method",
    "name",
    "outcome",
    "prev_sha256",
    "request_id",
    "sha256",
    "ts",
];

/// A record placed in the chain: its line as written (with the trailing `\n`) and its hash.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sealed {
    /// The canonical record and its `\n`, ready to append to the log as it is.
    pub line: Vec<u8>,
    /// The record's hash: 64 lower-case hex characters, the chain's new head.
    pub sha256: String,
}

/// The head of a chain; sealing an event advances it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chain {
    head: String,
}

impl Chain {
    /// A chain whose last record has hash `head` ([`GENESIS`] for an empty log).
    #[must_use]
    pub fn new(head: String) -> Self {
        Self { head }
    }

    /// The hash of the last record sealed, which the next record's `prev_sha256` will name.
    #[must_use]
    pub fn head(&self) -> &str {
        &self.head
    }

    /// Places `event` after the current head, stamped `ts` (nanoseconds since the epoch).
    ///
    /// The record is written straight into its canonical bytes (keys in byte order, each value
    /// through [`canonical::write`]) rather than assembled as a `serde_json` object and encoded
    /// twice: sealing is on every call's path, and the line it makes must be exactly what
    /// [`canonical::to_vec`] of the record would give, which the audit tests check.
    pub fn seal(&mut self, event: &Event, ts: u64) -> Sealed {
        let ts = ts.to_string();
        let mut fields: Vec<(&str, Field<'_>)> = event
            .detail
            .iter()
            .filter(|(key, _)| !CORE_FIELDS.contains(&key.as_str()))
            .map(|(key, value)| (key.as_str(), Field::Value(value)))
            .collect();
        fields.extend([
            ("args_digest", Field::Str(&event.args_digest)),
            ("decision", Field::Str(event.decision.as_str())),
            ("method", Field::Str(&event.method)),
            ("name", Field::Str(&event.name)),
            ("outcome", Field::Str(event.outcome.as_str())),
            ("prev_sha256", Field::Str(&self.head)),
            ("request_id", Field::Str(&event.request_id)),
            ("ts", Field::Integer(&ts)),
        ]);
        // Byte order of UTF-8 is code-point order, the canonical order; keys are unique.
        fields.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
        let mut body = Vec::with_capacity(512);
        body.push(b'{');
        // Where `"sha256":…,` goes in the line: before the first key that sorts after it.
        let mut at = None;
        for (i, (key, field)) in fields.iter().enumerate() {
            if i > 0 {
                body.push(b',');
            }
            if at.is_none() && key.as_bytes() > b"sha256".as_slice() {
                at = Some(body.len());
            }
            canonical::write_str(key, &mut body);
            body.push(b':');
            match field {
                Field::Str(text) => canonical::write_str(text, &mut body),
                Field::Integer(digits) => body.extend_from_slice(digits.as_bytes()),
                Field::Value(value) => canonical::write(value, &mut body),
            }
        }
        body.push(b'}');
        let sha256 = record_hash(&self.head, &body);
        let mut member = Vec::with_capacity(sha256.len() + 12);
        canonical::write_str("sha256", &mut member);
        member.push(b':');
        canonical::write_str(&sha256, &mut member);
        let mut line = Vec::with_capacity(body.len() + member.len() + 2);
        match at {
            Some(at) => {
                line.extend_from_slice(&body[..at]);
                line.extend_from_slice(&member);
                line.push(b',');
                line.extend_from_slice(&body[at..]);
            }
            None => {
                line.extend_from_slice(&body[..body.len() - 1]);
                line.push(b',');
                line.extend_from_slice(&member);
                line.push(b'}');
            }
        }
        line.push(b'\n');
        self.head.clone_from(&sha256);
        Sealed { line, sha256 }
    }
}

/// One member's value in [`Chain::seal`].
enum Field<'a> {
    Str(&'a str),
    /// Decimal digits, written as they are.
    Integer(&'a str),
    Value(&'a Value),
}

/// `SHA-256(prev || body)` as hex, where `body` is the canonical record without its `sha256`.
#[must_use]
pub fn record_hash(prev: &str, body: &[u8]) -> String {
    let mut hasher = Sha256::new();
    hasher.update(prev.as_bytes());
    hasher.update(body);
    canonical::lower_hex(&hasher.finalize())
}

/// The `sha256` of one complete line, if it is a canonical record whose own hash matches its
/// content.
///
/// Used at start to recover the head from the last line without reading the whole file.
#[must_use]
pub fn line_head(line: &[u8]) -> Option<String> {
    line_link(line).map(|(_, sha256)| sha256)
}

/// The `prev_sha256` and `sha256` of one complete line, if it is a canonical record whose own hash
/// matches its content: where the record joins a chain, and the head it leaves.
///
/// Used at start to tell which recovered copies of records continue the log.
#[must_use]
pub fn line_link(line: &[u8]) -> Option<(String, String)> {
    let checked = verify::check_line(line).ok()?;
    (checked.computed == checked.claimed)
        .then(|| (verify::text(&checked.prev), verify::text(&checked.claimed)))
}
