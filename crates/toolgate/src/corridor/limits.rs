//! Rate limits per principal and tool (token buckets, `governor`), as the policy sets them.
//!
//! One keyed limiter per distinct quota, made when a call first needs it, keyed by (principal,
//! tool): a looping agent exhausts its own bucket for that tool and nobody else's. A breach is an
//! answer and an audit record, never a silent drop (seed 003, "How do you rate-limit an agent that
//! loops?"). Buckets live in this process: replicas behind a load balancer each keep their own,
//! which the README says.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota};
use toolgate_core::policy::RateLimit;

type Limiter = DefaultKeyedRateLimiter<(Arc<str>, Arc<str>)>;

/// Buckets for every quota in use.
#[derive(Debug, Default)]
pub struct RateLimits {
    limiters: Mutex<HashMap<RateLimit, Arc<Limiter>>>,
    checks: AtomicU32,
}

impl RateLimits {
    /// Takes one call from `principal`'s bucket for `tool`; `Err` holds how long until the next
    /// call would be let through.
    ///
    /// # Errors
    /// The bucket is empty.
    pub fn take(&self, limit: RateLimit, principal: &str, tool: &str) -> Result<(), Duration> {
        let limiter = self.limiter(limit);
        // Forget idle keys now and then, so a stream of new principals cannot grow memory for
        // ever (a forgotten bucket is a full one: the caller was idle for a whole refill).
        if self.checks.fetch_add(1, Ordering::Relaxed) % 4096 == 4095 {
            limiter.retain_recent();
        }
        let key = (Arc::from(principal), Arc::from(tool));
        limiter
            .check_key(&key)
            .map_err(|not_until| not_until.wait_time_from(DefaultClock::default().now()))
    }

    fn limiter(&self, limit: RateLimit) -> Arc<Limiter> {
        let mut limiters = crate::lock(&self.limiters);
        limiters
            .entry(limit)
            .or_insert_with(|| {
                // `every` is at least a millisecond (the policy parser refuses zero).
                let quota = Quota::with_period(limit.every)
                    .unwrap_or_else(|| Quota::per_second(limit.burst))
                    .allow_burst(limit.burst);
                Arc::new(Limiter::keyed(quota))
            })
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;
    use std::time::Duration;

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
}
