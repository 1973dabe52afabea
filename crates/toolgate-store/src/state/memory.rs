//! The kill switches and budgets held in memory: the rules of [`super::StateStore`]'s statements,
//! each run under the one lock of the tables.

use std::collections::BTreeMap;

/// The switch for everyone, each principal's switch, and the budget charges.
#[derive(Debug, Default)]
pub(crate) struct State {
    engaged: bool,
    changed_by: Option<String>,
    changed_at: Option<i64>,
    /// Principal → (who turned its switch on, when).
    principals: BTreeMap<String, (String, i64)>,
    /// Principal → when each of its counted calls was charged.
    charges: BTreeMap<String, Vec<i64>>,
    /// (principal, tool, quota) → when the rate bucket is full again.
    buckets: BTreeMap<(String, String, String), i64>,
}

impl State {
    pub(crate) fn killswitch(&self) -> (bool, Option<String>, Option<i64>) {
        (self.engaged, self.changed_by.clone(), self.changed_at)
    }

    pub(crate) fn set_killswitch(
        &mut self,
        on: bool,
        by: &str,
        now: i64,
    ) -> (bool, Option<String>, Option<i64>) {
        if self.engaged != on {
            self.engaged = on;
            self.changed_by = Some(by.to_owned());
            self.changed_at = Some(now);
        }
        self.killswitch()
    }

    /// Oldest first, as the SQL orders them.
    pub(crate) fn principal_switches(&self) -> Vec<(String, String, i64)> {
        let mut rows: Vec<(String, String, i64)> = self
            .principals
            .iter()
            .map(|(principal, (by, at))| (principal.clone(), by.clone(), *at))
            .collect();
        rows.sort_by(|a, b| (a.2, &a.0).cmp(&(b.2, &b.0)));
        rows
    }

    pub(crate) fn set_principal(&mut self, principal: &str, on: bool, by: &str, now: i64) -> bool {
        if on {
            if self.principals.contains_key(principal) {
                return false;
            }
            self.principals
                .insert(principal.to_owned(), (by.to_owned(), now));
            true
        } else {
            self.principals.remove(principal).is_some()
        }
    }

    pub(crate) fn charge(
        &mut self,
        principal: &str,
        limit: u32,
        window_ms: i64,
        keep_from: i64,
        now: i64,
    ) -> bool {
        let charges = self.charges.entry(principal.to_owned()).or_default();
        charges.retain(|at| *at > keep_from);
        let in_window = charges.iter().filter(|at| **at > now - window_ms).count();
        if in_window < usize::try_from(limit).unwrap_or(usize::MAX) {
            charges.push(now);
            true
        } else {
            false
        }
    }

    /// `None`: taken. `Some(full_at)`: refused, the bucket being full again at `full_at`.
    pub(crate) fn take_rate(
        &mut self,
        principal: &str,
        tool: &str,
        quota: &str,
        every_ms: i64,
        slack: i64,
        now: i64,
    ) -> Option<i64> {
        let key = (principal.to_owned(), tool.to_owned(), quota.to_owned());
        let full_at = self.buckets.get(&key).copied().unwrap_or(now).max(now);
        if full_at - now > slack {
            return Some(full_at);
        }
        self.buckets.insert(key, full_at + every_ms);
        None
    }
}
