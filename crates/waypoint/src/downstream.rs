//! Who sent a tunnel and what it was for, the same for every request in it: the HBONE
//! peer (address, verified identity, its workload) and the destination this waypoint
//! fronts; and the metric labels both halves give.

use std::net::IpAddr;
use std::sync::Arc;

use ambit_identity::SpiffeId;
use ambit_state::Workload;

use crate::front::Fronted;
use crate::metrics::{RequestLabels, TrafficLabels};

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
            reporter: "waypoint",
            source_workload: src.map_or_else(unknown, |w| w.workload_name.clone()),
            source_canonical_service: src.map_or_else(unknown, |w| w.canonical_name.clone()),
            source_canonical_revision: src
                .map(|w| w.canonical_revision.clone())
                .filter(|r| !r.is_empty())
                .unwrap_or_else(|| "latest".into()),
            source_workload_namespace: peer_identity
                .as_ref()
                .map_or_else(unknown, |i| i.namespace().to_string()),
            source_principal: peer_identity
                .as_ref()
                .map_or_else(unknown, |i| i.to_string()),
            source_app: src.map_or_else(unknown, |w| w.canonical_name.clone()),
            source_version: src.map_or_else(unknown, |w| w.canonical_revision.clone()),
            source_cluster: src.map_or_else(unknown, |w| w.cluster_id.clone()),
            request_protocol: "http",
            response_flags: "-",
            connection_security_policy: "mutual_tls",
            ..TrafficLabels::default()
        };
        destination_labels(&mut traffic, &fronted, None);
        Downstream {
            peer_ip,
            peer_identity,
            source,
            fronted,
            destination_ip,
            traffic,
        }
    }

    /// A request's labels before its endpoint and response are known.
    pub fn labels(&self) -> RequestLabels {
        RequestLabels {
            traffic: self.traffic.clone(),
            ..RequestLabels::default()
        }
    }

    /// An opaque tunnel's labels before its endpoint is known.
    pub fn tcp_labels(&self) -> TrafficLabels {
        TrafficLabels {
            request_protocol: "tcp",
            ..self.traffic.clone()
        }
    }
}

/// Fills the destination half of `l`: the service being served, and the chosen
/// endpoint's workload when there is one.
pub fn destination_labels(l: &mut TrafficLabels, fronted: &Fronted, endpoint: Option<&Workload>) {
    let unknown = || "unknown".to_string();
    match fronted.service() {
        Some(s) => {
            l.destination_service = s.hostname.clone();
            l.destination_service_name = s.name.clone();
            l.destination_service_namespace = s.namespace.clone();
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
    l.destination_workload = w.map_or_else(unknown, |w| w.workload_name.clone());
    l.destination_workload_namespace = w.map_or_else(unknown, |w| w.namespace.clone());
    l.destination_canonical_service = w.map_or_else(unknown, |w| w.canonical_name.clone());
    l.destination_canonical_revision = w
        .map(|w| w.canonical_revision.clone())
        .filter(|r| !r.is_empty())
        .unwrap_or_else(unknown);
    // Only an endpoint reached over HBONE proves an identity.
    l.destination_principal = w
        .filter(|w| w.protocol == ambit_state::TunnelProtocol::Hbone)
        .map_or_else(unknown, |w| w.identity().to_string());
    l.destination_app = w.map_or_else(unknown, |w| w.canonical_name.clone());
    l.destination_version = w.map_or_else(unknown, |w| w.canonical_revision.clone());
    l.destination_cluster = w.map_or_else(unknown, |w| w.cluster_id.clone());
}
