//! The in-pod metrics, under ztunnel's `workload_manager_` prefix.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Default)]
pub struct InpodMetrics {
    pub active_proxy_count: Gauge,
    pub pending_proxy_count: Gauge,
    pub proxies_started: Counter,
    pub proxies_stopped: Counter,
}

impl InpodMetrics {
    pub fn register(registry: &mut Registry) -> InpodMetrics {
        let m = InpodMetrics::default();
        let sub = registry.sub_registry_with_prefix("workload_manager");
        sub.register(
            "active_proxy_count",
            "The total number current workloads with active proxies (unstable)",
            m.active_proxy_count.clone(),
        );
        sub.register(
            "pending_proxy_count",
            "The total number current workloads with pending proxies (unstable)",
            m.pending_proxy_count.clone(),
        );
        sub.register(
            "proxies_started",
            "The total number of proxies that were started (unstable)",
            m.proxies_started.clone(),
        );
        sub.register(
            "proxies_stopped",
            "The total number of proxies that were stopped (unstable)",
            m.proxies_stopped.clone(),
        );
        m
    }
}
