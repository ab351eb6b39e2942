//! Who sent a tunnel and what it was for, the same for every request in it: the HBONE
//! peer (address, verified identity, its workload) and the destination this waypoint
//! fronts; and the metric labels both halves give.

use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use ambit_identity::SpiffeId;
use ambit_state::{Service, Workload};
use ambit_telemetry::ResponseFlag;

use crate::front::Fronted;
use crate::metrics::{Metrics, RequestLabels, RequestSeries, TrafficLabels};

/// The most request series a tunnel keeps for reuse (endpoints × response codes × flags
/// it has seen); past it, a request looks its series up in the families.
const MAX_HELD_SERIES: usize = 64;

/// Who sent a tunnel and where it goes: the same for every request in it.
#[derive(Debug)]
pub struct Downstream {
    /// The HBONE peer: the client workload's address.
    pub peer_ip: IpAddr,
    /// The HBONE peer's verified identity.
    pub peer_identity: Option<SpiffeId>,
    /// The peer's workload, found by its address and identity.
    pub source: Option<Arc<Workload>>,
    pub fronted: Fronted,
    /// The CONNECT's `:authority` destination IP (the VIP or pod IP dialed), if an IP.
    pub destination_ip: Option<IpAddr>,
    /// The metric labels the tunnel gives every request: made once, not per request.
    traffic: TrafficLabels,
    /// The request series this tunnel has recorded into, by what varies per request.
    series: Mutex<Vec<(Outcome, RequestSeries)>>,
}

/// What a request's series depends on beyond its tunnel.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The endpoint's workload, when the request got as far as choosing one.
    pub destination: Option<Arc<Workload>>,
    /// The Service a route sent the request to, when not the one dialled.
    pub service: Option<Arc<Service>>,
    pub response_code: u16,
    pub response_flags: ResponseFlag,
    /// A gRPC request (`request_protocol="grpc"`), and its `grpc-status` once known.
    pub grpc: bool,
    pub grpc_status: Option<u32>,
}

impl Outcome {
    /// Nothing known yet.
    pub fn new(grpc: bool) -> Outcome {
        Outcome {
            destination: None,
            service: None,
            response_code: 0,
            response_flags: ResponseFlag::None,
            grpc,
            grpc_status: None,
        }
    }
}

impl PartialEq for Outcome {
    fn eq(&self, other: &Self) -> bool {
        // The same workload version: a changed workload is a new `Arc`, and so new labels.
        let same_destination = match (&self.destination, &other.destination) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        };
        let same_service = match (&self.service, &other.service) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        };
        same_destination
            && same_service
            && self.response_code == other.response_code
            && self.response_flags == other.response_flags
            && self.grpc == other.grpc
            && self.grpc_status == other.grpc_status
    }
}

impl Downstream {
    pub fn new(
        peer_ip: IpAddr,
        peer_identity: Option<SpiffeId>,
        source: Option<Arc<Workload>>,
        fronted: Fronted,
        destination_ip: Option<IpAddr>,
    ) -> Downstream {
        let unknown = || "unknown".to_string();
        let src = source.as_deref();
        let mut traffic = TrafficLabels {
            reporter: ambit_telemetry::Reporter::Waypoint.as_str(),
            source_workload: src.map_or_else(unknown, |w| w.workload_name.to_string()),
            source_canonical_service: src.map_or_else(unknown, |w| w.canonical_name.to_string()),
            source_canonical_revision: src
                .map(|w| w.canonical_revision.to_string())
                .filter(|r| !r.is_empty())
                .unwrap_or_else(|| "latest".into()),
            source_workload_namespace: peer_identity
                .as_ref()
                .map_or_else(unknown, |i| i.namespace().to_string()),
            source_principal: peer_identity
                .as_ref()
                .map_or_else(unknown, |i| i.to_string()),
            source_app: src.map_or_else(unknown, |w| w.canonical_name.to_string()),
            source_version: src.map_or_else(unknown, |w| w.canonical_revision.to_string()),
            source_cluster: src.map_or_else(unknown, |w| w.cluster_id.to_string()),
            request_protocol: "http",
            response_flags: ResponseFlag::None,
            connection_security_policy: "mutual_tls",
            ..TrafficLabels::default()
        };
        destination_labels(
            &mut traffic,
            fronted.service().map(|s| &**s),
            &fronted,
            None,
        );
        Downstream {
            peer_ip,
            peer_identity,
            source,
            fronted,
            destination_ip,
            traffic,
            series: Mutex::default(),
        }
    }

    /// A finished request's labels.
    pub fn request_labels(&self, outcome: &Outcome) -> RequestLabels {
        let mut labels = RequestLabels {
            traffic: self.traffic.clone(),
            response_code: outcome.response_code.to_string(),
            grpc_response_status: outcome
                .grpc_status
                .map_or_else(String::new, |s| s.to_string()),
        };
        destination_labels(
            &mut labels.traffic,
            outcome
                .service
                .as_deref()
                .or(self.fronted.service().map(|s| &**s)),
            &self.fronted,
            outcome.destination.as_deref(),
        );
        labels.traffic.response_flags = outcome.response_flags;
        if outcome.grpc {
            labels.traffic.request_protocol = "grpc";
        }
        labels
    }

    /// Counts a finished request in its series, found among those this tunnel holds
    /// (dropping them all once the metrics have forgotten any series) or looked up.
    pub fn record(
        &self,
        metrics: &Metrics,
        outcome: &Outcome,
        duration_ms: f64,
        request_bytes: u64,
        response_bytes: u64,
    ) {
        let generation = metrics.generation();
        let mut held = self.series.lock().unwrap_or_else(|p| p.into_inner());
        if held
            .first()
            .is_some_and(|(_, s)| s.generation != generation)
        {
            held.clear();
        }
        if let Some((_, s)) = held.iter().find(|(o, _)| o == outcome) {
            return s.record(duration_ms, request_bytes, response_bytes);
        }
        let series = metrics.series(self.request_labels(outcome));
        series.record(duration_ms, request_bytes, response_bytes);
        // Full (a long-lived tunnel whose endpoints changed many times): start again
        // rather than keep old workloads alive and miss for good.
        if held.len() >= MAX_HELD_SERIES {
            held.clear();
        }
        held.push((outcome.clone(), series));
    }

    /// An opaque tunnel's labels before its endpoint is known.
    pub fn tcp_labels(&self) -> TrafficLabels {
        TrafficLabels {
            request_protocol: "tcp",
            ..self.traffic.clone()
        }
    }
}

/// Fills the destination half of `l`: the service the request went to (the dialled one,
/// or a route's backend), and the chosen endpoint's workload when there is one.
pub fn destination_labels(
    l: &mut TrafficLabels,
    service: Option<&Service>,
    fronted: &Fronted,
    endpoint: Option<&Workload>,
) {
    let unknown = || "unknown".to_string();
    match service {
        Some(s) => {
            l.destination_service = s.hostname.to_string();
            l.destination_service_name = s.name.to_string();
            l.destination_service_namespace = s.namespace.to_string();
        }
        None => {
            l.destination_service = unknown();
            l.destination_service_name = unknown();
            l.destination_service_namespace = unknown();
        }
    }
    let w = endpoint.or(match fronted {
        Fronted::Workload { workload, .. } => Some(workload.as_ref()),
        Fronted::Service { .. } => None,
    });
    l.destination_workload = w.map_or_else(unknown, |w| w.workload_name.to_string());
    l.destination_workload_namespace = w.map_or_else(unknown, |w| w.namespace.to_string());
    l.destination_canonical_service = w.map_or_else(unknown, |w| w.canonical_name.to_string());
    l.destination_canonical_revision = w
        .map(|w| w.canonical_revision.to_string())
        .filter(|r| !r.is_empty())
        .unwrap_or_else(unknown);
    // Only an endpoint reached over HBONE proves an identity.
    l.destination_principal = w
        .filter(|w| w.protocol == ambit_state::TunnelProtocol::Hbone)
        .map_or_else(unknown, |w| w.identity().to_string());
    l.destination_app = w.map_or_else(unknown, |w| w.canonical_name.to_string());
    l.destination_version = w.map_or_else(unknown, |w| w.canonical_revision.to_string());
    l.destination_cluster = w.map_or_else(unknown, |w| w.cluster_id.to_string());
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::registry::Registry;

    fn workload(name: &str) -> Arc<Workload> {
        let mut w = Workload::new(name, "shop");
        w.workload_name = name.into();
        w.canonical_name = name.into();
        Arc::new(w)
    }

    /// `istio_requests_total` for `destination_workload`, as exposed.
    fn count(r: &Registry, destination: &str, code: u16) -> Option<u64> {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, r).unwrap();
        text.lines()
            .find(|l| {
                l.starts_with("istio_requests_total{")
                    && l.contains(&format!("destination_workload=\"{destination}\""))
                    && l.contains(&format!("response_code=\"{code}\""))
            })
            .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
    }

    #[test]
    fn held_series_count_as_looked_up_ones_and_follow_forgotten_workloads() {
        let mut r = Registry::default();
        let m = Metrics::register(&mut r);
        let fronted = Fronted::Service {
            service: Arc::new(Service::new(
                "reviews",
                "shop",
                "reviews.shop.svc.cluster.local",
            )),
            port: 80,
            vip: None,
        };
        let down = Downstream::new("10.0.0.1".parse().unwrap(), None, None, fronted, None);
        let (v1, v2) = (workload("reviews-v1"), workload("reviews-v2"));
        let outcome = |w: &Arc<Workload>, code| Outcome {
            destination: Some(w.clone()),
            response_code: code,
            ..Outcome::new(false)
        };
        for _ in 0..3 {
            down.record(&m, &outcome(&v1, 200), 1.0, 10, 20);
        }
        down.record(&m, &outcome(&v1, 503), 1.0, 10, 20);
        down.record(&m, &outcome(&v2, 200), 1.0, 10, 20);
        assert_eq!(count(&r, "reviews-v1", 200), Some(3));
        assert_eq!(count(&r, "reviews-v1", 503), Some(1));
        assert_eq!(count(&r, "reviews-v2", 200), Some(1));
        // The same series a fresh lookup finds: one line, not two.
        m.series(down.request_labels(&outcome(&v1, 200)))
            .record(1.0, 10, 20);
        assert_eq!(count(&r, "reviews-v1", 200), Some(4));

        // v1 leaves: its series go. Were the tunnel to keep recording into the handles it
        // held, those counts would never be reported; it looks the series up again.
        m.forget_gone(|_, name| name != "reviews-v1");
        assert_eq!(count(&r, "reviews-v1", 200), None);
        down.record(&m, &outcome(&v1, 200), 1.0, 10, 20);
        assert_eq!(count(&r, "reviews-v1", 200), Some(1));
        assert_eq!(count(&r, "reviews-v2", 200), Some(1));
    }
}
