//! The DNS metrics, with ztunnel's names and labels (reference §4.2).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use ambit_state::Workload;

use crate::message::Protocol;

/// ztunnel's buckets for the upstream duration, in seconds.
pub const DURATION_BUCKETS: [f64; 6] = [0.0005, 0.001, 0.01, 0.1, 1.0, 5.0];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DnsLabels {
    pub request_query_type: String,
    pub request_protocol: &'static str,
    pub source_canonical_service: String,
    pub source_canonical_revision: String,
}

impl DnsLabels {
    pub fn new(query_type: String, protocol: Protocol, client: Option<&Workload>) -> DnsLabels {
        let or_unknown = |s: Option<&str>| match s {
            Some(s) if !s.is_empty() => s.to_string(),
            _ => "unknown".to_string(),
        };
        DnsLabels {
            request_query_type: query_type,
            request_protocol: protocol.as_str(),
            source_canonical_service: or_unknown(client.map(|w| w.canonical_name.as_str())),
            source_canonical_revision: or_unknown(client.map(|w| w.canonical_revision.as_str())),
        }
    }
}

fn duration_histogram() -> Histogram {
    Histogram::new(DURATION_BUCKETS.into_iter())
}

/// Shared by every DNS server of the node proxy.
#[derive(Clone)]
pub struct DnsMetrics {
    pub requests: Family<DnsLabels, Counter>,
    pub upstream_requests: Family<DnsLabels, Counter>,
    pub upstream_failures: Family<DnsLabels, Counter>,
    pub upstream_duration: Family<DnsLabels, Histogram, fn() -> Histogram>,
}

impl Default for DnsMetrics {
    fn default() -> Self {
        DnsMetrics {
            requests: Family::default(),
            upstream_requests: Family::default(),
            upstream_failures: Family::default(),
            upstream_duration: Family::new_with_constructor(duration_histogram),
        }
    }
}

impl DnsMetrics {
    /// Registers the families (only when the DNS proxy is on, as ztunnel does).
    pub fn register(registry: &mut Registry) -> DnsMetrics {
        let m = DnsMetrics::default();
        registry.register(
            "istio_dns_requests",
            "Total number of DNS requests (unstable)",
            m.requests.clone(),
        );
        registry.register(
            "istio_dns_upstream_requests",
            "Total number of DNS requests forwarded to upstream (unstable)",
            m.upstream_requests.clone(),
        );
        registry.register(
            "istio_dns_upstream_failures",
            "Total number of DNS requests that failed to forward upstream (unstable)",
            m.upstream_failures.clone(),
        );
        registry.register(
            "istio_dns_upstream_request_duration_seconds",
            "Total time in seconds Istio takes to get DNS response from upstream (unstable)",
            m.upstream_duration.clone(),
        );
        m
    }
}
