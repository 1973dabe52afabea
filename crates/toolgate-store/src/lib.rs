//! toolgate-store: the durable state of the gate.
//!
//! Today that is the [`journal`]: the SHA-256 chained audit log and the ledger's write-ahead log,
//! committed together by one writer thread with group commit. Approvals, budgets and the kill switch
//! (SQLite, PostgreSQL) will live beside it. Nothing here decides policy; it only makes decisions and
//! effects durable, in order, exactly once.

pub mod approval;
mod db;
pub mod journal;
pub mod state;
