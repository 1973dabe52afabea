//! Rate limits per principal and tool, as the policy sets them: a bucket of `burst` calls that
//! refills one call every `every`.
//!
//! Each bucket is kept as the generic cell rate algorithm keeps it, by one instant: when the
//! bucket will be full again (its "theoretical arrival time"). A call is let through unless that
//! instant is more than `every * (burst - 1)` ahead, and moves it on by `every`. Buckets are keyed
//! by (quota, principal, tool): a looping agent exhausts its own bucket for that tool and nobody
//! else's. A breach is an answer and an audit record, never a silent drop (seed 003, "How do you
//! rate-limit an agent that loops?"). Buckets live in this process; replicas on a shared
//! PostgreSQL store take from buckets kept there instead (`StateStore::take_rate`, the same
//! algorithm as one conditional upsert), so a caller gets the same numbers whichever replica its
//! call lands on. Written here rather than taken from a
//! rate-limiting crate so that a stdio-only build of the kit carries no such dependency (issue
//! 12); the algorithm is a dozen lines.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use toolgate_core::policy::RateLimit;

/// Checks between two sweeps of full buckets.
const SWEEP_EVERY: u32 = 4096;

/// Buckets for every quota in use.
#[derive(Debug, Default)]
pub struct RateLimits {
    buckets: Mutex<Buckets>,
}

#[derive(Debug, Default)]
struct Buckets {
    /// When each bucket is full again; a bucket that is not here is full.
    full_at: HashMap<(RateLimit, String, String), Instant>,
    checks: u32,
}

impl RateLimits {
    /// Takes one call from `principal`'s bucket for `tool`; `Err` holds how long until the next
    /// call would be let through.
    ///
    /// # Errors
    /// The bucket is empty.
    pub fn take(&self, limit: RateLimit, principal: &str, tool: &str) -> Result<(), Duration> {
        self.take_at(limit, principal, tool, Instant::now())
    }

    fn take_at(
        &self,
        limit: RateLimit,
        principal: &str,
        tool: &str,
        now: Instant,
    ) -> Result<(), Duration> {
        let mut buckets = crate::lock(&self.buckets);
        // Forget full buckets now and then, so a stream of new principals cannot grow memory for
        // ever (a forgotten bucket is a full one).
        buckets.checks = buckets.checks.wrapping_add(1);
        if buckets.checks.is_multiple_of(SWEEP_EVERY) {
            buckets.full_at.retain(|_, full_at| *full_at > now);
        }
        let key = (limit, principal.to_owned(), tool.to_owned());
        let full_at = buckets.full_at.get(&key).copied().unwrap_or(now).max(now);
        // `every` is at least a millisecond and `burst` at least one (the policy parser says so).
        let slack = limit.every.saturating_mul(limit.burst.get() - 1);
        let ahead = full_at - now;
        if ahead > slack {
            return Err(ahead - slack);
        }
        // A period too long for the clock to add refuses (fail closed) rather than panics.
        let next = full_at.checked_add(limit.every).ok_or(limit.every)?;
        buckets.full_at.insert(key, next);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;
    use std::time::{Duration, Instant};

    use toolgate_core::policy::RateLimit;

    use super::RateLimits;

    #[test]
    fn a_burst_is_let_through_then_refused_with_a_wait_per_principal_and_tool() {
        let limits = RateLimits::default();
        let limit = RateLimit {
            burst: NonZeroU32::new(3).unwrap(),
            every: Duration::from_secs(2),
        };
        for _ in 0..3 {
            assert!(limits.take(limit, "alice", "search").is_ok());
        }
        let wait = limits.take(limit, "alice", "search").unwrap_err();
        assert!(
            wait > Duration::from_millis(1500) && wait <= Duration::from_secs(2),
            "{wait:?}"
        );
        // Other buckets are untouched.
        assert!(limits.take(limit, "bob", "search").is_ok());
        assert!(limits.take(limit, "alice", "get").is_ok());
    }

    #[test]
    fn the_bucket_refills_one_call_every_period_and_never_beyond_its_burst() {
        let limits = RateLimits::default();
        let limit = RateLimit {
            burst: NonZeroU32::new(2).unwrap(),
            every: Duration::from_secs(10),
        };
        let start = Instant::now();
        let at = |secs: u64| start + Duration::from_secs(secs);
        assert!(limits.take_at(limit, "a", "t", at(0)).is_ok());
        assert!(limits.take_at(limit, "a", "t", at(0)).is_ok());
        assert_eq!(
            limits.take_at(limit, "a", "t", at(4)),
            Err(Duration::from_secs(6))
        );
        // One call back after one period, not two.
        assert!(limits.take_at(limit, "a", "t", at(10)).is_ok());
        assert!(limits.take_at(limit, "a", "t", at(10)).is_err());
        // Idle for an hour: a full bucket of two, no more.
        assert!(limits.take_at(limit, "a", "t", at(3600)).is_ok());
        assert!(limits.take_at(limit, "a", "t", at(3600)).is_ok());
        assert!(limits.take_at(limit, "a", "t", at(3600)).is_err());
    }

    #[test]
    fn a_burst_of_one_lets_one_call_through_per_period() {
        let limits = RateLimits::default();
        let limit = RateLimit {
            burst: NonZeroU32::new(1).unwrap(),
            every: Duration::from_millis(500),
        };
        let start = Instant::now();
        assert!(limits.take_at(limit, "a", "t", start).is_ok());
        assert_eq!(
            limits.take_at(limit, "a", "t", start + Duration::from_millis(100)),
            Err(Duration::from_millis(400))
        );
        assert!(
            limits
                .take_at(limit, "a", "t", start + Duration::from_millis(500))
                .is_ok()
        );
    }
}
