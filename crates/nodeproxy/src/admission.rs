//! Admission to the HBONE handshake: before a client has proved who it is (TLS with a
//! client certificate, then the HTTP/2 preface), it may only hold a bounded share of the
//! proxy. Limits apply per source IP, per proxy instance (one per pod in shared mode) and
//! per node.
//!
//! Over the node's limit a connection is shed at once, before a byte is read. Over a
//! source's or an instance's share, the newcomer is admitted and the stalest handshake in
//! that share is closed instead ([`ambit_admission`]: the one least far along, then the
//! longest without progress), so a flood of stalled connections, even from the client's
//! own address, cannot keep out a client that completes its handshake promptly.

use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use ambit_admission::ReportThrottle;
use ambit_admission::{Full, Gate, Limits, Ticket};

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

/// One proxy instance's gate.
#[derive(Debug)]
pub struct HandshakeGate {
    node: Arc<NodeHandshakes>,
    gate: Arc<Gate>,
}

impl HandshakeGate {
    pub fn new(node: Arc<NodeHandshakes>, limits: HandshakeLimits) -> Arc<HandshakeGate> {
        Arc::new(HandshakeGate {
            node,
            gate: Gate::new(Limits {
                total: limits.instance,
                per_source: limits.source,
            }),
        })
    }

    /// The node-wide count this gate draws on.
    pub fn node(&self) -> &Arc<NodeHandshakes> {
        &self.node
    }

    /// A slot for one handshake from `source`, held until the permit is dropped. Over a
    /// source's or the instance's share, the stalest handshake of that share is evicted
    /// (its owner sees [`HandshakePermit::evicted`]) for this one.
    pub fn admit(self: &Arc<Self>, source: IpAddr) -> Result<HandshakePermit, Shed> {
        let admitted = self.gate.admit(source).map_err(|full| match full {
            Full::Source(n) => Shed::Source(n),
            Full::Total(n) => Shed::Instance(n),
        })?;
        // An evicted handshake hands its node slot to the newcomer at once (its own task
        // may run only later); otherwise the newcomer needs a slot of its own, and without
        // one it leaves the gate again.
        if admitted.evicted.is_none() && !self.node.try_take() {
            return Err(Shed::Node(self.node.limit));
        }
        Ok(HandshakePermit {
            ticket: admitted.ticket,
            node: self.node.clone(),
        })
    }

    /// Handshakes in progress on this instance.
    pub fn in_progress(&self) -> usize {
        self.gate.held()
    }
}

/// A handshake slot; dropping it gives the slot back.
#[derive(Debug)]
pub struct HandshakePermit {
    ticket: Ticket,
    node: Arc<NodeHandshakes>,
}

impl HandshakePermit {
    /// Records how far the handshake has got: a handshake further along is evicted later.
    pub fn progress(&self, step: ambit_hbone::HandshakeStep) {
        self.ticket.advance(match step {
            ambit_hbone::HandshakeStep::ClientHello => 1,
            ambit_hbone::HandshakeStep::Tls => 2,
        });
    }

    /// Resolves when this handshake is evicted for a newcomer; close the connection then.
    pub async fn evicted(&self) {
        self.ticket.evicted().await
    }

    pub fn is_evicted(&self) -> bool {
        self.ticket.is_evicted()
    }
}

impl Drop for HandshakePermit {
    fn drop(&mut self) {
        // An evicted handshake's node slot went to the newcomer that evicted it.
        if !self.ticket.is_evicted() {
            self.node.give_back();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    #[test]
    fn over_a_share_the_stalest_goes_and_over_the_node_the_newcomer() {
        let node = NodeHandshakes::new(5);
        let limits = HandshakeLimits {
            node: 5,
            instance: 4,
            source: 2,
        };
        let a = HandshakeGate::new(node.clone(), limits);
        let b = HandshakeGate::new(node.clone(), limits);
        let a1 = a.admit(ip(1)).unwrap();
        let a2 = a.admit(ip(1)).unwrap();
        a2.progress(ambit_hbone::HandshakeStep::ClientHello);
        // The source's share is spent: its stalest (a1, nothing received yet) goes.
        let a3 = a.admit(ip(1)).unwrap();
        assert!(a1.is_evicted() && !a2.is_evicted());
        drop(a1);
        let a4 = a.admit(ip(2)).unwrap();
        a4.progress(ambit_hbone::HandshakeStep::Tls);
        // The instance is full (a2, a3, a4 and this one): the next newcomer evicts a3,
        // the stalest of the instance; the other instance is untouched.
        let a5 = a.admit(ip(3)).unwrap();
        a5.progress(ambit_hbone::HandshakeStep::ClientHello);
        let _a6 = a.admit(ip(4)).unwrap();
        assert!(a3.is_evicted() && !a2.is_evicted() && !a4.is_evicted() && !a5.is_evicted());
        drop(a3);
        assert_eq!(a.in_progress(), 4);
        let b1 = b.admit(ip(4)).unwrap();
        // The node is full: shed, nothing evicted.
        assert_eq!(b.admit(ip(5)).unwrap_err(), Shed::Node(5));
        assert!(!b1.is_evicted());
        // Slots come back when handshakes end.
        drop(b1);
        let _b2 = b.admit(ip(5)).unwrap();
    }

    #[test]
    fn a_progressing_client_outlives_a_flood_from_its_own_address() {
        let node = NodeHandshakes::new(1024);
        let gate = HandshakeGate::new(node, HandshakeLimits::for_pod(1024, 256));
        let mut flood: Vec<_> = (0..64).map(|_| gate.admit(ip(1)).unwrap()).collect();
        let client = gate.admit(ip(1)).unwrap();
        client.progress(ambit_hbone::HandshakeStep::ClientHello);
        for _ in 0..2000 {
            flood.push(gate.admit(ip(1)).unwrap());
            flood.retain(|p| !p.is_evicted());
        }
        assert!(!client.is_evicted());
        assert_eq!(
            gate.in_progress(),
            64,
            "the source holds its share and no more"
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
            held.retain(|p| !p.is_evicted());
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
