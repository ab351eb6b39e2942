//! Outlier detection, as Envoy's consecutive-error detectors behave: each endpoint's run
//! of failures is counted; at the threshold it is ejected for `baseEjectionTime` times the
//! number of its ejections (at most [`MAX_EJECTION_TIME`]), unless `maxEjectionPercent`
//! of the pool is already out. Each `interval` an endpoint spends back in the pool takes
//! one off its multiplier. Time is passed in.
//!
//! Where Envoy differs: it returns an endpoint at the first sweep (every `interval`)
//! after its time is up; here it is back as soon as its time is up.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

use crate::{OutlierDetection, MAX_EJECTION_TIME};

/// What one try at an endpoint came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The endpoint answered with this status.
    Status(u16),
    /// An opaque (TCP) connection to the endpoint opened: a success.
    Reached,
    /// No answer: the connection failed, was reset, or the try timed out.
    LocalFailure,
}

/// Which run of failures ejected an endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    Consecutive5xx,
    ConsecutiveGateway,
    ConsecutiveLocalOrigin,
}

impl Reason {
    /// The label value for metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Consecutive5xx => "consecutive_5xx",
            Reason::ConsecutiveGateway => "consecutive_gateway_failure",
            Reason::ConsecutiveLocalOrigin => "consecutive_local_origin_failure",
        }
    }
}

/// An ejection made by [`Detector::record`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ejection {
    pub reason: Reason,
    /// How long the endpoint is out.
    pub duration: Duration,
}

/// What [`Detector::record`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    Nothing,
    Ejected(Ejection),
    /// The threshold was reached, but `maxEjectionPercent` of the pool is already out.
    OverMaxEjection(Reason),
}

#[derive(Debug, Clone, Default)]
struct Host {
    consecutive_5xx: u32,
    consecutive_gateway: u32,
    consecutive_local: u32,
    /// Ejections counting toward the next one's length.
    ejections: u32,
    /// Out of the pool until then.
    ejected_until: Option<Instant>,
}

/// The state of one destination's endpoints, keyed by `K` (an endpoint's address).
#[derive(Debug, Clone)]
pub struct Detector<K> {
    config: OutlierDetection,
    hosts: HashMap<K, Host>,
}

impl<K: Hash + Eq + Clone> Detector<K> {
    pub fn new(config: OutlierDetection) -> Self {
        Detector {
            config,
            hosts: HashMap::new(),
        }
    }

    /// True when `host` is out of the pool at `now`.
    pub fn is_ejected(&self, host: &K, now: Instant) -> bool {
        self.hosts
            .get(host)
            .and_then(|h| h.ejected_until)
            .is_some_and(|until| now < until)
    }

    /// Endpoints out of the pool at `now`.
    pub fn ejected(&self, now: Instant) -> usize {
        self.hosts
            .values()
            .filter(|h| h.ejected_until.is_some_and(|until| now < until))
            .count()
    }

    /// True when ejections are to be ignored: fewer than `minHealthPercent` of the
    /// `pool_size` endpoints are left in.
    pub fn below_min_health(&self, pool_size: usize, now: Instant) -> bool {
        let available = pool_size.saturating_sub(self.ejected(now));
        (available as u64) * 100 < u64::from(self.config.min_health_percent) * pool_size as u64
    }

    /// Records what a try at `host` came to, `pool_size` being the destination's
    /// endpoints; ejects `host` when a run of failures reaches its threshold.
    pub fn record(
        &mut self,
        host: &K,
        outcome: Outcome,
        pool_size: usize,
        now: Instant,
    ) -> Recorded {
        let c = self.config;
        let h = self.hosts.entry(host.clone()).or_default();
        let mut reason = None;
        match outcome {
            Outcome::Status(status) => {
                h.consecutive_local = 0;
                if (500..600).contains(&status) {
                    h.consecutive_5xx += 1;
                    if matches!(status, 502..=504) {
                        h.consecutive_gateway += 1;
                    } else {
                        h.consecutive_gateway = 0;
                    }
                } else {
                    h.consecutive_5xx = 0;
                    h.consecutive_gateway = 0;
                }
            }
            Outcome::Reached => {
                h.consecutive_local = 0;
                h.consecutive_5xx = 0;
                h.consecutive_gateway = 0;
            }
            Outcome::LocalFailure if c.split_local_origin => h.consecutive_local += 1,
            // Not split: a failure to reach the endpoint counts as a 503 would.
            Outcome::LocalFailure => {
                h.consecutive_5xx += 1;
                h.consecutive_gateway += 1;
            }
        }
        let reached = |count: u32, threshold: u32| threshold > 0 && count >= threshold;
        if reached(h.consecutive_gateway, c.consecutive_gateway) {
            reason = Some(Reason::ConsecutiveGateway);
        } else if reached(h.consecutive_5xx, c.consecutive_5xx) {
            reason = Some(Reason::Consecutive5xx);
        } else if c.split_local_origin && reached(h.consecutive_local, c.consecutive_local_origin) {
            reason = Some(Reason::ConsecutiveLocalOrigin);
        }
        let Some(reason) = reason else {
            return Recorded::Nothing;
        };
        if h.ejected_until.is_some_and(|until| now < until) {
            // Already out (a try that was in flight when it was ejected).
            return Recorded::Nothing;
        }
        let ejected = self.ejected(now);
        let h = self.hosts.get_mut(host).expect("inserted above");
        h.consecutive_5xx = 0;
        h.consecutive_gateway = 0;
        h.consecutive_local = 0;
        if (ejected as u64) * 100 >= u64::from(c.max_ejection_percent) * pool_size as u64 {
            return Recorded::OverMaxEjection(reason);
        }
        // Intervals spent back in the pool since the last ejection ended each take one
        // off the multiplier.
        if let (Some(until), false) = (h.ejected_until, c.interval.is_zero()) {
            let healthy = now.saturating_duration_since(until);
            let intervals = healthy.as_nanos() / c.interval.as_nanos();
            h.ejections = h
                .ejections
                .saturating_sub(u32::try_from(intervals).unwrap_or(u32::MAX));
        }
        h.ejections = h.ejections.saturating_add(1);
        let duration = c
            .base_ejection_time
            .saturating_mul(h.ejections)
            .min(MAX_EJECTION_TIME.max(c.base_ejection_time));
        h.ejected_until = Some(now + duration);
        Recorded::Ejected(Ejection { reason, duration })
    }

    /// Forgets endpoints no longer in the destination (so the state is bounded by the
    /// endpoints there are).
    pub fn retain(&mut self, mut present: impl FnMut(&K) -> bool) {
        self.hosts.retain(|k, _| present(k));
    }

    /// Endpoints tracked.
    pub fn len(&self) -> usize {
        self.hosts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.hosts.is_empty()
    }
}

#[cfg(test)]
mod tests;
