//! The in-memory backend: every table the corridor needs, behind one lock, for fast tests of the
//! gate without a database file or server. Nothing here is durable and nothing is shared with
//! another process; the rules themselves live beside their SQL, in each concept's `memory` module.

/// The tables, locked together by [`crate::db::Db::Memory`].
#[derive(Debug, Default)]
pub(crate) struct Tables {
    /// The idempotency keys.
    pub(crate) keys: crate::idempotency::memory::Keys,
    /// The approval queue and its votes.
    pub(crate) approvals: crate::approval::memory::Queue,
    /// The kill switches and the budget charges.
    pub(crate) state: crate::state::memory::State,
}
