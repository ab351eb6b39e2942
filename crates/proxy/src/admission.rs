//! Admission to the HBONE handshake: before a client has proved who it is (TLS with a
//! client certificate, then the HTTP/2 preface), it may only hold a bounded share of the
//! proxy. Limits apply per source IP, per proxy instance (one per pod in shared mode) and
//! per node; a connection over any of them is shed at once, before a byte is read.
//!
//! Sans-IO: a gate counts, the accept loop asks it and closes what it refuses.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How many connections may be in their handshake at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HandshakeLimits {
    /// On the whole node, across every proxy instance.
    pub node: usize,
    /// In one proxy instance: one pod in shared mode (so one flooded pod cannot take the
    /// others' share), the node in dedicated mode.
    pub instance: usize,
    /// From one source IP, in one instance.
    pub source: usize,
}

impl HandshakeLimits {
    /// `AMBIT_MAX_HBONE_HANDSHAKES` default.
    pub const DEFAULT_NODE: usize = 1024;
    /// `AMBIT_MAX_HBONE_HANDSHAKES_PER_POD` default.
    pub const DEFAULT_POD: usize = 256;

    /// Limits for one pod's instance: a quarter of its share per source, so a pool of
    /// connections from one client node fits and four sources are needed to fill it.
    pub fn for_pod(node: usize, pod: usize) -> HandshakeLimits {
        let instance = pod.min(node);
        HandshakeLimits {
            node,
            instance,
            source: (instance / 4).max(1),
        }
    }
}

impl Default for HandshakeLimits {
    fn default() -> Self {
        HandshakeLimits::for_pod(Self::DEFAULT_NODE, Self::DEFAULT_NODE)
    }
}

/// Which limit refused a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Shed {
    #[error("{0} handshakes already in progress from this source")]
    Source(usize),
    #[error("{0} handshakes already in progress on this proxy")]
    Instance(usize),
    #[error("{0} handshakes already in progress on this node")]
    Node(usize),
}

/// The node-wide count, shared by every instance's gate.
#[derive(Debug)]
pub struct NodeHandshakes {
    in_progress: AtomicUsize,
    limit: usize,
    shed: prometheus_client::metrics::counter::Counter,
    /// Shed connections are logged at most once per interval.
    reports: ReportThrottle,
}

/// Says when a repeated event is due to be reported again: the first time, then at most
/// once per interval, so a flood of sheds is one log line every few seconds.
#[derive(Debug, Default)]
pub struct ReportThrottle {
    last: Mutex<Option<Instant>>,
}

impl ReportThrottle {
    /// Whether to report an event at `now`; a `true` starts a new interval.
    pub fn due(&self, now: Instant, interval: Duration) -> bool {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        let due = last.is_none_or(|at| now.saturating_duration_since(at) >= interval);
        if due {
            *last = Some(now);
        }
        due
    }
}

impl NodeHandshakes {
    pub fn new(limit: usize) -> Arc<NodeHandshakes> {
        Arc::new(NodeHandshakes {
            in_progress: AtomicUsize::new(0),
            limit,
            shed: Default::default(),
            reports: ReportThrottle::default(),
        })
    }

    fn try_take(&self) -> bool {
        self.in_progress
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.limit).then_some(n + 1)
            })
            .is_ok()
    }

    fn give_back(&self) {
        self.in_progress.fetch_sub(1, Ordering::AcqRel);
    }

    /// Connections shed so far, on any instance.
    pub fn shed_total(&self) -> u64 {
        self.shed.get()
    }

    /// The shed count as a metric (`ambit_hbone_handshakes_shed_total`).
    pub fn shed_counter(&self) -> prometheus_client::metrics::counter::Counter {
        self.shed.clone()
    }

    /// Counts one shed connection; returns the count to report when a report is due
    /// (the first, then at most one per `interval`).
    pub fn count_shed(&self, now: Instant, interval: Duration) -> Option<u64> {
        let total = self.shed.inc() + 1;
        self.reports.due(now, interval).then_some(total)
    }
}

#[derive(Debug, Default)]
struct InstanceCounts {
    total: usize,
    by_source: HashMap<IpAddr, usize>,
}

/// One proxy instance's gate.
#[derive(Debug)]
pub struct HandshakeGate {
    node: Arc<NodeHandshakes>,
    limits: HandshakeLimits,
    counts: Mutex<InstanceCounts>,
}

impl HandshakeGate {
    pub fn new(node: Arc<NodeHandshakes>, limits: HandshakeLimits) -> Arc<HandshakeGate> {
        Arc::new(HandshakeGate {
            node,
            limits,
            counts: Mutex::new(InstanceCounts::default()),
        })
    }

    /// The node-wide count this gate draws on.
    pub fn node(&self) -> &Arc<NodeHandshakes> {
        &self.node
    }

    /// A slot for one handshake from `source`, held until the permit is dropped.
    pub fn admit(self: &Arc<Self>, source: IpAddr) -> Result<HandshakePermit, Shed> {
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        let from_source = counts.by_source.get(&source).copied().unwrap_or(0);
        if from_source >= self.limits.source {
            return Err(Shed::Source(self.limits.source));
        }
        if counts.total >= self.limits.instance {
            return Err(Shed::Instance(self.limits.instance));
        }
        if !self.node.try_take() {
            return Err(Shed::Node(self.node.limit));
        }
        counts.total += 1;
        *counts.by_source.entry(source).or_insert(0) += 1;
        Ok(HandshakePermit {
            gate: self.clone(),
            source,
        })
    }

    fn release(&self, source: IpAddr) {
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        counts.total = counts.total.saturating_sub(1);
        if let Some(n) = counts.by_source.get_mut(&source) {
            *n -= 1;
            if *n == 0 {
                counts.by_source.remove(&source);
            }
        }
        drop(counts);
        self.node.give_back();
    }

    /// Handshakes in progress on this instance.
    pub fn in_progress(&self) -> usize {
        self.counts.lock().map(|c| c.total).unwrap_or(0)
    }
}

/// A handshake slot; dropping it gives the slot back.
#[derive(Debug)]
pub struct HandshakePermit {
    gate: Arc<HandshakeGate>,
    source: IpAddr,
}

impl Drop for HandshakePermit {
    fn drop(&mut self) {
        self.gate.release(self.source);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    #[test]
    fn each_limit_sheds_what_is_over_it() {
        let node = NodeHandshakes::new(5);
        let limits = HandshakeLimits {
            node: 5,
            instance: 4,
            source: 2,
        };
        let a = HandshakeGate::new(node.clone(), limits);
        let b = HandshakeGate::new(node.clone(), limits);
        let a1 = a.admit(ip(1)).unwrap();
        let _a2 = a.admit(ip(1)).unwrap();
        // The source's share is spent; another source still gets in.
        assert_eq!(a.admit(ip(1)).unwrap_err(), Shed::Source(2));
        let _a3 = a.admit(ip(2)).unwrap();
        let _a4 = a.admit(ip(3)).unwrap();
        // The instance is full; the other instance is not.
        assert_eq!(a.admit(ip(4)).unwrap_err(), Shed::Instance(4));
        let b1 = b.admit(ip(4)).unwrap();
        // The node is full.
        assert_eq!(b.admit(ip(5)).unwrap_err(), Shed::Node(5));
        // Slots come back when handshakes end.
        drop(b1);
        let _b2 = b.admit(ip(5)).unwrap();
        drop(a1);
        assert_eq!(a.in_progress(), 3);
        let _a5 = a.admit(ip(1)).unwrap();
        assert_eq!(
            b.admit(ip(6)).unwrap_err(),
            Shed::Node(5),
            "the node is full again"
        );
    }

    #[test]
    fn one_flooded_pod_leaves_the_others_their_share() {
        let node = NodeHandshakes::new(1024);
        let limits = HandshakeLimits::for_pod(1024, 256);
        assert_eq!(limits.source, 64);
        let flooded = HandshakeGate::new(node.clone(), limits);
        let quiet = HandshakeGate::new(node.clone(), limits);
        let mut held = Vec::new();
        for source in 1..=10 {
            for _ in 0..100 {
                if let Ok(p) = flooded.admit(ip(source)) {
                    held.push(p);
                }
            }
        }
        assert_eq!(
            held.len(),
            256,
            "the flooded pod holds its share and no more"
        );
        assert!(quiet.admit(ip(99)).is_ok());
    }

    #[test]
    fn shedding_is_reported_at_most_once_per_interval() {
        let node = NodeHandshakes::new(1);
        let t0 = Instant::now();
        let every = Duration::from_secs(10);
        assert_eq!(node.count_shed(t0, every), Some(1));
        assert_eq!(node.count_shed(t0 + Duration::from_secs(1), every), None);
        assert_eq!(node.count_shed(t0 + Duration::from_secs(2), every), None);
        assert_eq!(
            node.count_shed(t0 + Duration::from_secs(10), every),
            Some(4)
        );
        assert_eq!(node.shed_total(), 4);
    }

    #[test]
    fn dedicated_mode_gives_the_node_one_instance() {
        let limits = HandshakeLimits::default();
        assert_eq!(limits.instance, HandshakeLimits::DEFAULT_NODE);
        assert_eq!(limits.source, HandshakeLimits::DEFAULT_NODE / 4);
        // A pod's share never exceeds the node's.
        assert_eq!(HandshakeLimits::for_pod(100, 256).instance, 100);
    }
}
