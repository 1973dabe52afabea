//! toolgate-store: the durable state of the gate.
//!
//! - [`journal`]: the SHA-256 chained audit log and the ledger's write-ahead log, committed together
//!   by one writer thread with group commit;
//! - [`approval`] and [`state`]: the approval queue, the kill switch and medium budgets, in one
//!   SQLite file shared by the server and the people deciding from other processes (PostgreSQL, for
//!   replicas sharing state, is still to come).
//!
//! Nothing here decides policy; it only makes decisions and effects durable, in order, exactly once,
//! and enforces the queue's rules in the statements themselves so that processes cannot race them.

pub mod approval;
mod db;
mod error;
pub mod idempotency;
pub mod journal;
pub mod state;
