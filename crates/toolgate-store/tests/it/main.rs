//! The store's guarantees as a user of the crate relies on them, run against every backend: the
//! same suite over SQLite (a file in a temporary directory), PostgreSQL (a fresh schema in the
//! server `TOOLGATE_TEST_POSTGRES` names, by default the local one) and memory.

mod backends;
mod durable;
mod guarantees;
mod ledger;
