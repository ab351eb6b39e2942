//! A token bucket for the rate at which a client may open streams on one connection
//! (sans-IO: the caller passes the clock).

use std::time::{Duration, Instant};

/// Allows `burst` stream opens at once, refilled at `per_second`.
#[derive(Debug, Clone)]
pub(crate) struct StreamRate {
    tokens: f64,
    burst: f64,
    per_second: f64,
    last: Instant,
}

impl StreamRate {
    /// A full bucket. `per_second` 0 means no limit.
    pub(crate) fn new(per_second: u32, burst: u32, now: Instant) -> StreamRate {
        StreamRate {
            tokens: f64::from(burst.max(1)),
            burst: f64::from(burst.max(1)),
            per_second: f64::from(per_second),
            last: now,
        }
    }

    /// Takes a token for one new stream; `false` when the client opens streams faster
    /// than allowed.
    pub(crate) fn take(&mut self, now: Instant) -> bool {
        if self.per_second == 0.0 {
            return true;
        }
        let elapsed = now.saturating_duration_since(self.last);
        self.last = now;
        self.tokens = (self.tokens + elapsed.as_secs_f64() * self.per_second).min(self.burst);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// When a connection last had work, to close it once it has been idle long enough.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Idle {
    timeout: Duration,
    since: Instant,
}

impl Idle {
    /// `timeout` zero means never idle.
    pub(crate) fn new(timeout: Duration, now: Instant) -> Idle {
        Idle {
            timeout,
            since: now,
        }
    }

    /// The connection had (or has) an open stream at `now`.
    pub(crate) fn busy(&mut self, now: Instant) {
        self.since = now;
    }

    /// When to look again, or `None` when idle connections are never closed (a zero
    /// timeout, or one too long to be a point in time).
    pub(crate) fn deadline(&self) -> Option<Instant> {
        if self.timeout.is_zero() {
            return None;
        }
        self.since.checked_add(self.timeout)
    }

    /// Whether a connection without streams at `now` has been idle too long.
    pub(crate) fn expired(&self, now: Instant) -> bool {
        self.deadline().is_some_and(|d| now >= d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_endless_timeout_is_never_idle() {
        let t0 = Instant::now();
        let idle = Idle::new(Duration::MAX, t0);
        assert_eq!(idle.deadline(), None);
        assert!(!idle.expired(t0 + Duration::from_secs(86_400 * 365)));
        assert!(!Idle::new(Duration::ZERO, t0).expired(t0 + Duration::from_secs(1)));
    }

    #[test]
    fn a_burst_is_allowed_then_the_rate() {
        let t0 = Instant::now();
        let mut r = StreamRate::new(10, 3, t0);
        assert!(r.take(t0) && r.take(t0) && r.take(t0));
        assert!(!r.take(t0), "the burst is spent");
        // 10 per second: one token back after 100 ms.
        assert!(!r.take(t0 + Duration::from_millis(50)));
        assert!(r.take(t0 + Duration::from_millis(150)));
        assert!(!r.take(t0 + Duration::from_millis(150)));
        // A long pause refills only up to the burst.
        let later = t0 + Duration::from_secs(60);
        assert!(r.take(later) && r.take(later) && r.take(later));
        assert!(!r.take(later));
    }

    #[test]
    fn a_zero_rate_is_no_limit() {
        let t0 = Instant::now();
        let mut r = StreamRate::new(0, 1, t0);
        assert!((0..10_000).all(|_| r.take(t0)));
    }

    #[test]
    fn idleness_counts_from_the_last_work() {
        let t0 = Instant::now();
        let mut idle = Idle::new(Duration::from_secs(10), t0);
        assert!(!idle.expired(t0 + Duration::from_secs(9)));
        idle.busy(t0 + Duration::from_secs(5));
        assert!(!idle.expired(t0 + Duration::from_secs(14)));
        assert!(idle.expired(t0 + Duration::from_secs(15)));
        let never = Idle::new(Duration::ZERO, t0);
        assert_eq!(never.deadline(), None);
        assert!(!never.expired(t0 + Duration::from_secs(86_400)));
    }
}
