//! The idempotency rules over keys held in memory: the same rules the statements of
//! [`super::IdempotencyStore`] enforce, each run under the one lock of the tables. One process
//! owns these keys, so a row in flight under another owner is a dead run's, as in SQLite.

use std::collections::BTreeMap;

use super::{Entry, Key, State};

/// Every key, by (principal, tool, key).
#[derive(Debug, Default)]
pub(crate) struct Keys(BTreeMap<(String, String, String), Entry>);

fn id(key: Key<'_>) -> (String, String, String) {
    (
        key.principal.to_owned(),
        key.tool.to_owned(),
        key.key.to_owned(),
    )
}

impl Keys {
    /// `None`: the key is now `owner`'s. `Some(row)`: refused, and the row that refused it.
    pub(crate) fn claim(
        &mut self,
        key: Key<'_>,
        args_digest: &str,
        owner: &str,
        retry_in_doubt: bool,
        now: i64,
    ) -> Option<Entry> {
        match self.0.get_mut(&id(key)) {
            None => {
                self.0.insert(
                    id(key),
                    Entry {
                        principal: key.principal.to_owned(),
                        tool: key.tool.to_owned(),
                        key: key.key.to_owned(),
                        args_digest: args_digest.to_owned(),
                        state: State::InFlight,
                        owner: owner.to_owned(),
                        result: None,
                        created_at: now,
                        updated_at: now,
                    },
                );
                None
            }
            Some(row)
                if retry_in_doubt
                    && row.args_digest == args_digest
                    && (row.state == State::InDoubt
                        || (row.state == State::InFlight && row.owner != owner)) =>
            {
                row.state = State::InFlight;
                owner.clone_into(&mut row.owner);
                row.updated_at = now;
                None
            }
            Some(row) => Some(row.clone()),
        }
    }

    /// `owner`'s row in flight, if it is there.
    fn owned(&mut self, key: Key<'_>, owner: &str) -> Option<&mut Entry> {
        self.0
            .get_mut(&id(key))
            .filter(|row| row.state == State::InFlight && row.owner == owner)
    }

    pub(crate) fn complete(
        &mut self,
        key: Key<'_>,
        owner: &str,
        result: &serde_json::Value,
        now: i64,
    ) -> bool {
        let Some(row) = self.owned(key, owner) else {
            return false;
        };
        row.state = State::Done;
        row.result = Some(result.clone());
        row.updated_at = now;
        true
    }

    pub(crate) fn release(&mut self, key: Key<'_>, owner: &str) -> bool {
        self.owned(key, owner).is_some() && self.0.remove(&id(key)).is_some()
    }

    pub(crate) fn mark_in_doubt(&mut self, key: Key<'_>, owner: &str, now: i64) -> bool {
        let Some(row) = self.owned(key, owner) else {
            return false;
        };
        row.state = State::InDoubt;
        row.updated_at = now;
        true
    }

    pub(crate) fn unresolved_counts(&self, owner: &str) -> (i64, i64) {
        self.0.values().fold((0, 0), |(running, doubt), row| {
            match (row.state, row.owner == owner) {
                (State::InFlight, true) => (running + 1, doubt),
                (State::InFlight, false) | (State::InDoubt, _) => (running, doubt + 1),
                (State::Done, _) => (running, doubt),
            }
        })
    }

    pub(crate) fn unresolved(&self, owner: &str) -> Vec<Entry> {
        let mut rows: Vec<Entry> = self
            .0
            .values()
            .filter(|row| {
                row.state == State::InDoubt || (row.state == State::InFlight && row.owner != owner)
            })
            .cloned()
            .collect();
        rows.sort_by(|a, b| {
            (a.created_at, &a.principal, &a.tool, &a.key).cmp(&(
                b.created_at,
                &b.principal,
                &b.tool,
                &b.key,
            ))
        });
        rows
    }

    pub(crate) fn forget(&mut self, key: Key<'_>) -> bool {
        let unresolved = self
            .0
            .get(&id(key))
            .is_some_and(|row| row.state != State::Done);
        unresolved && self.0.remove(&id(key)).is_some()
    }

    pub(crate) fn get(&self, key: Key<'_>) -> Option<Entry> {
        self.0.get(&id(key)).cloned()
    }
}
