//! Istio's request metrics as a waypoint reports them (`reporter="waypoint"`, reference
//! waypoint.md §4.1): `istio_requests_total`, `istio_request_duration_milliseconds`,
//! `istio_request_bytes`, `istio_response_bytes`, and `istio_tcp_*` for opaque ports.
//! Series whose source or destination workload has left the mesh are dropped
//! ([`Metrics::forget_gone`]), so cardinality follows the mesh, not its history.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

pub use ambit_telemetry::TrafficLabels;

/// The request metrics' labels: the response and the shared set.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub response_code: String,
    pub grpc_response_status: String,
    // Last: the derive hands the encoder on to a flattened field.
    #[prometheus(flatten)]
    pub traffic: TrafficLabels,
}

fn duration_histogram() -> Histogram {
    // Istio's default buckets for request durations, in milliseconds.
    Histogram::new(
        [
            0.5, 1.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0,
            30000.0, 60000.0, 300000.0, 600000.0, 1800000.0, 3600000.0,
        ]
        .into_iter(),
    )
}

fn bytes_histogram() -> Histogram {
    // Powers of ten, 1 B to 1 GB, as Istio's size buckets.
    Histogram::new((0..10).map(|e| 10f64.powi(e)))
}

/// The waypoint's request and TCP metrics.
#[derive(Clone)]
pub struct Metrics {
    requests: Family<RequestLabels, Counter>,
    duration: Family<RequestLabels, Histogram, fn() -> Histogram>,
    request_bytes: Family<RequestLabels, Histogram, fn() -> Histogram>,
    response_bytes: Family<RequestLabels, Histogram, fn() -> Histogram>,
    tcp_opened: Family<TrafficLabels, Counter>,
    tcp_closed: Family<TrafficLabels, Counter>,
    tcp_sent: Family<TrafficLabels, Counter>,
    tcp_received: Family<TrafficLabels, Counter>,
    /// Every label set written, to drop those of workloads that are gone.
    seen: Arc<Mutex<HashSet<RequestLabels>>>,
    seen_tcp: Arc<Mutex<HashSet<TrafficLabels>>>,
    /// Bumped when [`Metrics::forget_gone`] drops series, so that handles held for reuse
    /// ([`RequestSeries`]) are known to be stale.
    generation: Arc<AtomicU64>,
    /// `RBAC` denials and refused authorities, ambit's own.
    pub refused_authorities: Counter,
    /// Retries sent (Envoy's `upstream_rq_retry`).
    pub retries: Counter,
    /// Retries wanted and not made, by reason: `limit` (the route's attempts were used:
    /// Envoy's `upstream_rq_retry_limit_exceeded`), `budget` (the destination's retry
    /// budget: Envoy's `upstream_rq_retry_overflow`).
    retries_refused: Family<ReasonLabel, Counter>,
    /// Endpoints ejected by a DestinationRule's outlier detection, by destination and
    /// reason (Envoy's `outlier_detection.ejections_enforced_*`).
    ejections: Family<DestinationReason, Counter>,
    /// Requests (and retries) a DestinationRule's connection pool had no room for, by
    /// destination and limit: `pending` (answered 503 `UO`, Envoy's
    /// `upstream_rq_pending_overflow`), `retries` (`upstream_rq_retry_overflow`),
    /// `connections` (an opaque tunnel refused, `upstream_cx_overflow`).
    overflows: Family<DestinationLimit, Counter>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DestinationReason {
    destination_service: String,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DestinationLimit {
    destination_service: String,
    limit: &'static str,
}

/// A `reason` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

/// One label set's four request metrics, looked up once: they share their values with
/// the families', so a tunnel can keep them and record without hashing its labels again
/// (the labels are some twenty strings; hashing them four times per request was a
/// measurable part of its cost).
#[derive(Clone, Debug)]
pub struct RequestSeries {
    requests: Counter,
    duration: Histogram,
    request_bytes: Histogram,
    response_bytes: Histogram,
    /// [`Metrics::generation`] when it was looked up.
    pub generation: u64,
}

impl RequestSeries {
    pub fn record(&self, duration_ms: f64, request_bytes: u64, response_bytes: u64) {
        self.requests.inc();
        self.duration.observe(duration_ms);
        self.request_bytes.observe(request_bytes as f64);
        self.response_bytes.observe(response_bytes as f64);
    }
}

impl Metrics {
    pub fn register(registry: &mut Registry) -> Metrics {
        let m = Metrics {
            requests: Family::default(),
            duration: Family::new_with_constructor(duration_histogram),
            request_bytes: Family::new_with_constructor(bytes_histogram),
            response_bytes: Family::new_with_constructor(bytes_histogram),
            tcp_opened: Family::default(),
            tcp_closed: Family::default(),
            tcp_sent: Family::default(),
            tcp_received: Family::default(),
            seen: Arc::default(),
            seen_tcp: Arc::default(),
            generation: Arc::default(),
            refused_authorities: Counter::default(),
            retries: Counter::default(),
            retries_refused: Family::default(),
            ejections: Family::default(),
            overflows: Family::default(),
        };
        registry.register("istio_requests", "Total requests", m.requests.clone());
        registry.register(
            "istio_request_duration_milliseconds",
            "Request duration in milliseconds",
            m.duration.clone(),
        );
        registry.register(
            "istio_request_bytes",
            "Request size in bytes",
            m.request_bytes.clone(),
        );
        registry.register(
            "istio_response_bytes",
            "Response size in bytes",
            m.response_bytes.clone(),
        );
        registry.register(
            "istio_tcp_connections_opened",
            "The total number of TCP connections opened",
            m.tcp_opened.clone(),
        );
        registry.register(
            "istio_tcp_connections_closed",
            "The total number of TCP connections closed",
            m.tcp_closed.clone(),
        );
        registry.register(
            "istio_tcp_sent_bytes",
            "The size of total bytes sent during response in case of a TCP connection",
            m.tcp_sent.clone(),
        );
        registry.register(
            "istio_tcp_received_bytes",
            "The size of total bytes received during request in case of a TCP connection",
            m.tcp_received.clone(),
        );
        registry.register(
            "ambit_waypoint_refused_authorities",
            "CONNECT streams refused because their authority is not fronted by this waypoint",
            m.refused_authorities.clone(),
        );
        registry.register(
            "ambit_waypoint_upstream_retries",
            "Retries sent to upstreams",
            m.retries.clone(),
        );
        registry.register(
            "ambit_waypoint_upstream_retries_refused",
            "Retries a request's outcome asked for and did not get: its route's attempts used (limit) or its destination's retry budget spent (budget)",
            m.retries_refused.clone(),
        );
        registry.register(
            "ambit_waypoint_outlier_ejections",
            "Endpoints ejected by a DestinationRule's outlier detection",
            m.ejections.clone(),
        );
        registry.register(
            "ambit_waypoint_upstream_overflows",
            "Requests, retries and tunnels a DestinationRule's connection pool had no room for",
            m.overflows.clone(),
        );
        m
    }

    /// Counts an ejection of an endpoint of `destination_service`.
    pub fn ejection(&self, destination_service: &str, reason: &'static str) {
        self.ejections
            .get_or_create(&DestinationReason {
                destination_service: destination_service.to_string(),
                reason,
            })
            .inc();
    }

    /// Counts what a connection pool of `destination_service` had no room for.
    pub fn overflow(&self, destination_service: &str, limit: &'static str) {
        self.overflows
            .get_or_create(&DestinationLimit {
                destination_service: destination_service.to_string(),
                limit,
            })
            .inc();
    }

    /// Counts a retry not made, `reason` `limit` or `budget`.
    pub fn retry_refused(&self, reason: &'static str) {
        self.retries_refused
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }

    /// The series of `labels`, made if new.
    pub fn series(&self, labels: RequestLabels) -> RequestSeries {
        // Read before the lookups: a drop racing with them leaves the handles stale by
        // this number, never current by a newer one.
        let generation = self.generation();
        let series = RequestSeries {
            requests: self.requests.get_or_create(&labels).clone(),
            duration: self.duration.get_or_create(&labels).clone(),
            request_bytes: self.request_bytes.get_or_create(&labels).clone(),
            response_bytes: self.response_bytes.get_or_create(&labels).clone(),
            generation,
        };
        self.seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(labels);
        series
    }

    /// Changes whenever series are dropped: a held [`RequestSeries`] of an older
    /// generation may no longer be reported.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Counts an opened opaque connection.
    pub fn tcp_opened(&self, labels: &TrafficLabels) {
        self.tcp_opened.get_or_create(labels).inc();
        self.seen_tcp
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(labels.clone());
    }

    /// Counts a closed opaque connection and its bytes (`received`: from the client).
    pub fn tcp_closed(&self, labels: &TrafficLabels, received: u64, sent: u64) {
        self.tcp_closed.get_or_create(labels).inc();
        self.tcp_received.get_or_create(labels).inc_by(received);
        self.tcp_sent.get_or_create(labels).inc_by(sent);
    }

    /// Drops the series of workloads no longer in the mesh: `present(namespace, name)`
    /// says whether a workload is. Series with an `unknown` side are kept.
    pub fn forget_gone(&self, present: impl Fn(&str, &str) -> bool) {
        let gone =
            |ns: &str, name: &str| ns != "unknown" && name != "unknown" && !present(ns, name);
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        // Marked stale before any is removed, so that tunnels holding them look them up
        // again from here on (a request already past its check can still count into one).
        if seen.iter().any(|l| l.traffic.names_one_of(gone)) {
            self.generation.fetch_add(1, Ordering::AcqRel);
        }
        seen.retain(|l| {
            let drop = l.traffic.names_one_of(gone);
            if drop {
                self.requests.remove(l);
                self.duration.remove(l);
                self.request_bytes.remove(l);
                self.response_bytes.remove(l);
            }
            !drop
        });
        self.seen_tcp
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|l| {
                let drop = l.names_one_of(gone);
                if drop {
                    self.tcp_opened.remove(l);
                    self.tcp_closed.remove(l);
                    self.tcp_sent.remove(l);
                    self.tcp_received.remove(l);
                }
                !drop
            });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(r: &Registry) -> String {
        let mut s = String::new();
        prometheus_client::encoding::text::encode(&mut s, r).unwrap();
        s
    }

    #[test]
    fn gone_workloads_lose_their_series() {
        let mut r = Registry::default();
        let m = Metrics::register(&mut r);
        let labels = |src: &str| RequestLabels {
            traffic: TrafficLabels {
                reporter: "waypoint",
                source_workload: src.into(),
                source_workload_namespace: "shop".into(),
                destination_workload: "reviews".into(),
                destination_workload_namespace: "shop".into(),
                request_protocol: "http",
                response_flags: ambit_telemetry::ResponseFlag::None,
                connection_security_policy: "mutual_tls",
                ..TrafficLabels::default()
            },
            response_code: "200".into(),
            ..RequestLabels::default()
        };
        for src in ["a", "b"] {
            m.series(labels(src)).record(1.0, 10, 20);
        }
        let before = text(&r);
        assert!(before.contains("source_workload=\"a\""), "{before}");
        assert!(before.contains("source_workload=\"b\""), "{before}");
        assert!(before.contains("istio_requests_total{"), "{before}");
        m.forget_gone(|_, name| name != "a");
        let after = text(&r);
        assert!(!after.contains("source_workload=\"a\""), "{after}");
        assert!(after.contains("source_workload=\"b\""), "{after}");
    }
}
