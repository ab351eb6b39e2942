//! What a routing decision takes and gives: the connection to decide ([`RouteInput`]),
//! where and how it goes ([`Route`]), and why it cannot ([`RouteError`]).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use ambit_identity::SpiffeId;

use crate::service::Service;
use crate::workload::Workload;

/// One outbound connection to decide.
#[derive(Debug, Clone, Copy)]
pub struct RouteInput<'a> {
    /// The workload this proxy acts for (never inferred from the source IP).
    pub source: &'a Workload,
    /// The original destination, as dialed by the application.
    pub dst: SocketAddr,
    /// The application's address (the connection's source IP), to recognise a waypoint
    /// sending traffic on to its destination.
    pub src_ip: IpAddr,
    /// This proxy's network (`NETWORK`), where the destination is looked up.
    pub network: &'a str,
    /// The HBONE port of remote proxies (15008).
    pub hbone_port: u16,
}

/// Where and how to send a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// Through an HBONE tunnel.
    Hbone {
        /// Where to open the mTLS connection: `endpoint-ip:hbone_port`, or the waypoint's
        /// `ip:hbone_mtls_port`.
        next_hop: SocketAddr,
        /// The CONNECT `:authority`: `endpoint-ip:target-port`; through a waypoint, the
        /// original destination.
        authority: SocketAddr,
        /// Identities the server may present (service SANs, then the workload identity;
        /// for a waypoint its identity, then its service's SANs).
        expected_identities: Vec<SpiffeId>,
        /// The workload the tunnel reaches: the endpoint, or the waypoint.
        destination: Arc<Workload>,
        /// The service, when the destination was a service VIP (the original one, also
        /// through a waypoint).
        service: Option<Arc<Service>>,
    },
    /// Plain TCP: to a workload outside the mesh, or passthrough to an unknown address.
    Tcp {
        target: SocketAddr,
        destination: Option<Arc<Workload>>,
        service: Option<Arc<Service>>,
    },
}

impl Route {
    /// The service the connection was addressed to, if any.
    pub fn service(&self) -> Option<&Arc<Service>> {
        match self {
            Route::Hbone { service, .. } | Route::Tcp { service, .. } => service.as_ref(),
        }
    }

    /// The destination workload, if known.
    pub fn destination(&self) -> Option<&Arc<Workload>> {
        match self {
            Route::Hbone { destination, .. } => Some(destination),
            Route::Tcp { destination, .. } => destination.as_ref(),
        }
    }
}

/// Why no route exists. All are the destination's side (a retry may help once the
/// mesh configuration changes, not before).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RouteError {
    /// A known service with no endpoint able to take the connection.
    #[error("no healthy upstream for service {service}")]
    NoHealthyUpstream { service: String },
    /// The service does not define the dialed port.
    #[error("service {service} has no port {port}")]
    UnknownTargetPort { service: String, port: u16 },
    /// The waypoint configured for the destination does not resolve to a pod.
    #[error("{target} uses a waypoint that cannot be reached: {why}; fix the waypoint's service or workload in the mesh configuration")]
    WaypointNotFound { target: String, why: String },
    /// The waypoint is in another network: that needs double HBONE through a network
    /// gateway, which this proxy does not do; refused rather than bypassing the waypoint.
    #[error("{target} uses a waypoint in network {network:?}, which needs double HBONE (not supported); traffic is refused rather than sent around the waypoint")]
    WaypointInOtherNetwork { target: String, network: String },
}
