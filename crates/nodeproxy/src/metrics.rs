//! Istio's standard TCP metrics, with ztunnel's names, labels and byte orientation.

use std::sync::Arc;

use ambit_state::RbacObserver;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

pub use ambit_telemetry::{Reporter, TrafficLabels, UNKNOWN};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReporterLabel {
    pub reporter: &'static str,
}

/// One socket the proxy accepted, counted in `istio_tcp_sockets_open` while it lives: an
/// app connection on the outbound listener (`source`), an HBONE or plaintext connection
/// on the inbound listeners (`destination`), as ztunnel counts them.
pub struct OpenSocket(Gauge);

impl Drop for OpenSocket {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    component: &'static str,
    tag: String,
}

/// The proxy's metric families, registered once per process.
#[derive(Clone)]
pub struct Metrics {
    pub connections_opened: Family<TrafficLabels, Counter>,
    pub connections_closed: Family<TrafficLabels, Counter>,
    pub connections_failed: Family<TrafficLabels, Counter>,
    pub received_bytes: Family<TrafficLabels, Counter>,
    pub sent_bytes: Family<TrafficLabels, Counter>,
    pub sockets_open: Family<ReporterLabel, Gauge>,
    /// Told of the dry-run policies each authorization matched: a
    /// [`DryRunMatches`](crate::dry_run::DryRunMatches) of this proxy's registry, which the
    /// process sets; nobody until it does.
    pub rbac: Arc<dyn RbacObserver + Send + Sync>,
}

impl Metrics {
    /// Registers the families in `registry`. `istio_version` is the `tag` of `istio_build`.
    pub fn register(registry: &mut Registry, istio_version: &str) -> Metrics {
        let build = Family::<BuildLabels, Gauge>::default();
        build
            .get_or_create(&BuildLabels {
                component: "ztunnel",
                tag: istio_version.to_string(),
            })
            .set(1);
        registry.register("istio_build", "Istio component build info", build);
        let m = Metrics {
            connections_opened: Family::default(),
            connections_closed: Family::default(),
            connections_failed: Family::default(),
            received_bytes: Family::default(),
            sent_bytes: Family::default(),
            sockets_open: Family::default(),
            rbac: Arc::new(ambit_state::Unobserved),
        };
        registry.register(
            "istio_tcp_connections_opened",
            "The total number of TCP connections opened",
            m.connections_opened.clone(),
        );
        registry.register(
            "istio_tcp_connections_closed",
            "The total number of TCP connections closed",
            m.connections_closed.clone(),
        );
        registry.register(
            "istio_tcp_connections_failed",
            "The total number of TCP connections that failed to establish (unstable)",
            m.connections_failed.clone(),
        );
        registry.register(
            "istio_tcp_received_bytes",
            "The size of total bytes received during request in case of a TCP connection",
            m.received_bytes.clone(),
        );
        registry.register(
            "istio_tcp_sent_bytes",
            "The size of total bytes sent during response in case of a TCP connection",
            m.sent_bytes.clone(),
        );
        registry.register(
            "istio_tcp_sockets_open",
            "The current number of open TCP sockets (unstable)",
            m.sockets_open.clone(),
        );
        m
    }

    /// Counts an accepted socket until the returned guard is dropped.
    pub fn socket_opened(&self, reporter: Reporter) -> OpenSocket {
        let gauge = self
            .sockets_open
            .get_or_create(&ReporterLabel {
                reporter: reporter.as_str(),
            })
            .clone();
        gauge.inc();
        OpenSocket(gauge)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::text::encode;

    #[test]
    fn names_carry_total_and_labels_keep_order() {
        let mut registry = Registry::default();
        let m = Metrics::register(&mut registry, "1.24.0");
        m.connections_opened
            .get_or_create(&TrafficLabels::new(Reporter::Source))
            .inc();
        let mut out = String::new();
        encode(&mut out, &registry).unwrap();
        assert!(out.contains("istio_build{component=\"ztunnel\",tag=\"1.24.0\"} 1"));
        let line = out
            .lines()
            .find(|l| l.starts_with("istio_tcp_connections_opened_total{"))
            .expect("opened counter sample");
        assert!(line.starts_with(
            "istio_tcp_connections_opened_total{reporter=\"source\",source_workload=\"unknown\""
        ));
        assert!(line.contains(
            "request_protocol=\"tcp\",response_flags=\"-\",connection_security_policy=\"unknown\"} 1"
        ));
        // Families without samples are not printed as samples.
        assert!(!out.contains("istio_tcp_sent_bytes_total{"));
    }

    #[test]
    fn open_sockets_are_counted_while_their_guard_lives() {
        let mut registry = Registry::default();
        let m = Metrics::register(&mut registry, "x");
        let text = |r: &Registry| {
            let mut out = String::new();
            encode(&mut out, r).unwrap();
            let mut samples: Vec<String> = out
                .lines()
                .filter(|l| l.starts_with("istio_tcp_sockets_open{"))
                .map(str::to_string)
                .collect();
            samples.sort();
            samples
        };
        assert!(
            text(&registry).is_empty(),
            "no sample before the first socket"
        );
        let a = m.socket_opened(Reporter::Source);
        let b = m.socket_opened(Reporter::Source);
        let c = m.socket_opened(Reporter::Destination);
        assert_eq!(
            text(&registry),
            [
                "istio_tcp_sockets_open{reporter=\"destination\"} 1",
                "istio_tcp_sockets_open{reporter=\"source\"} 2",
            ]
        );
        drop((a, b, c));
        assert_eq!(
            text(&registry),
            [
                "istio_tcp_sockets_open{reporter=\"destination\"} 0",
                "istio_tcp_sockets_open{reporter=\"source\"} 0",
            ]
        );
    }

    #[test]
    fn locality_labels_come_last_and_only_with_workload_information() {
        let mut registry = Registry::default();
        let m = Metrics::register(&mut registry, "1.24.0");
        let mut known = TrafficLabels::new(Reporter::Destination);
        known.set_locality(Some(("eu-west", "")), None);
        m.connections_opened.get_or_create(&known).inc();
        m.connections_closed
            .get_or_create(&TrafficLabels::new(Reporter::Destination))
            .inc();
        let mut out = String::new();
        encode(&mut out, &registry).unwrap();
        let sample = |name: &str| {
            out.lines()
                .find(|l| l.starts_with(name))
                .unwrap_or_else(|| panic!("{name} in {out}"))
                .to_string()
        };
        assert!(sample("istio_tcp_connections_opened_total{").ends_with(
            "connection_security_policy=\"unknown\",source_region=\"eu-west\",\
             source_zone=\"unknown\",destination_region=\"unknown\",\
             destination_zone=\"unknown\"} 1"
        ));
        let closed = sample("istio_tcp_connections_closed_total{");
        assert!(
            closed.ends_with("connection_security_policy=\"unknown\"} 1"),
            "{closed}"
        );
        assert!(!closed.contains("region"), "{closed}");
    }
}
