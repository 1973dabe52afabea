//! toolgate-store: the durable state of the gate, kept in the data directory of one server.
//!
//! What it owns:
//! - [`journal`]: the SHA-256 chained audit log (`audit.jsonl`) and the write-ahead log of effects
//!   (`ledger.wal`), committed together by one writer thread with group commit. An effect is an
//!   idempotency key and an opaque JSON body, made durable at most once per key, together with
//!   its audit record, by one `fdatasync`;
//! - [`approval`]: the approval queue, one row per gated call that waits for a person;
//! - [`state`]: the kill switch and the per-principal budget of medium-tier calls;
//! - [`idempotency`]: the idempotency keys of mutations forwarded upstream, so that a retried call
//!   has one effect;
//! - [`runs`]: the agents' runs, paused while a person decides and resumed after;
//! - [`console`]: who is signed in to the approvals console (one-time login links, sessions);
//! - [`tasks`]: calls held for a person that became MCP tasks, which survive a restart;
//! - [`ledger`]: the central audit ledger replicas share (PostgreSQL), with its signed checkpoints.
//!
//! What it must not do: decide policy, or know any toolset. It only makes decisions and effects
//! durable, in order, exactly once, and enforces the rules of the queue, the switch, the budgets
//! and the keys in the statements themselves so that processes cannot race them.
//!
//! Design decision, SQLite in WAL mode for the queue, the switch, the budgets and the keys: these
//! are written by several processes at once (the server, and a person's
//! `toolgate approvals approve` in another terminal), so a rule must hold under the database's
//! write lock, not under a lock inside one process. SQLite serialises the writers of a file, so a
//! rule written as the condition of the one statement that changes a row is judged against the
//! latest committed row; WAL mode lets readers run beside that one writer; `synchronous=FULL` makes
//! every acknowledged decision survive a power cut; and it is a file in the data directory, with
//! no server to run. Replicas that must share one state use PostgreSQL instead
//! ([`Location::Postgres`]): the same rules in the same statement texts, with row locks and
//! advisory locks where SQLite's single writer did the serialising, and each process's lease on
//! the keys it runs. Tests of the corridor can use memory ([`Location::Memory`]).
//!
//! The journal keeps files of its own instead: the audit log is seed 000's chained JSON lines,
//! which `toolgate audit verify` checks without toolgate's database, and it has one writer, the
//! serving process (an exclusive lock keeps a second one out). An effect and its record become
//! durable together the way storage engines commit, with one append and one `fdatasync` of the WAL
//! frame that holds both, and calls that arrive together share that sync.
//!
//! ```
//! use serde_json::json;
//! use toolgate_core::audit::{Decision, Event, GENESIS, Outcome};
//! use toolgate_store::journal::{Effect, EffectOutcome, Journal};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = tempfile::tempdir()?;
//! let (journal, recovery) = Journal::open(dir.path())?;
//! assert_eq!(recovery, Default::default(), "a fresh directory needs no repair");
//! assert_eq!(journal.head(), GENESIS);
//!
//! // A denied call: only its record is written, and the answer waits until it is on disk.
//! let args = json!({ "path": "/" });
//! let denied = Event::tool_call("req-0001", "rm_rf", Decision::Deny, Outcome::NotExecuted, &args);
//! let receipt = journal.record(denied).await?;
//! assert_eq!(journal.head(), receipt.sha256);
//!
//! // An effect, committed once per key: the same call again is a replay, and writes no effect.
//! let args = json!({ "request_id": "req-0002", "text": "hello" });
//! let event = Event::tool_call("req-0002", "write_note", Decision::Allow, Outcome::Committed, &args);
//! let effect = Effect::new("req-0002", args);
//! let (outcome, _) = journal.put_effect(effect.clone(), event.clone()).await?;
//! assert_eq!(outcome, EffectOutcome::Committed);
//! let (outcome, _) = journal.put_effect(effect.clone(), event).await?;
//! assert_eq!(outcome, EffectOutcome::Replay);
//! assert_eq!(journal.effects(), [effect]);
//! # Ok(())
//! # }
//! ```

#![deny(missing_docs)]

pub mod approval;
pub mod console;
mod db;
mod error;
pub mod idempotency;
pub mod journal;
pub mod ledger;
pub mod runs;
pub mod state;
pub mod tasks;

pub use db::Location;
