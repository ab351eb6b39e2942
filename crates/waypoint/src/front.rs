//! What the waypoint fronts: a CONNECT's `:authority` is accepted only when it names a
//! service or workload whose WDS `waypoint` is this waypoint (reference waypoint.md §1.3).
//! Sans-IO: a decision over the mesh state, table-tested.

use std::net::IpAddr;
use std::sync::Arc;

use ambit_hbone::Authority;
use ambit_state::{names_waypoint, AppProtocol, ProxyState, Service, Workload};

/// A destination this waypoint serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fronted {
    /// Service addressing: its VIP (or hostname) and the service port dialed.
    Service {
        service: Arc<Service>,
        port: u16,
        /// The VIP dialed; `None` when the authority was the service's hostname.
        vip: Option<IpAddr>,
    },
    /// Workload addressing: a pod IP and port (workload waypoints).
    Workload { workload: Arc<Workload>, port: u16 },
}

/// How the stream is carried, by the declared protocol of the port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Carriage {
    /// Declared HTTP/1.1, HTTP/2 or gRPC: parsed as HTTP.
    Http,
    /// Declared TCP or TLS: an opaque tunnel, never sniffed (server-first protocols work).
    Opaque,
    /// Undeclared: HTTP/1.1 or HTTP/2 by the first bytes.
    Sniff,
}

impl Fronted {
    /// The port the client dialed.
    pub fn port(&self) -> u16 {
        match self {
            Fronted::Service { port, .. } | Fronted::Workload { port, .. } => *port,
        }
    }

    /// The service, for service addressing.
    pub fn service(&self) -> Option<&Arc<Service>> {
        match self {
            Fronted::Service { service, .. } => Some(service),
            Fronted::Workload { .. } => None,
        }
    }

    /// How this port's traffic is carried.
    pub fn carriage(&self) -> Carriage {
        let declared = self
            .service()
            .and_then(|s| s.app_protocols.get(&self.port()));
        match declared {
            Some(AppProtocol::Http11 | AppProtocol::Http2 | AppProtocol::Grpc) => Carriage::Http,
            Some(AppProtocol::Tcp | AppProtocol::Tls) => Carriage::Opaque,
            None => Carriage::Sniff,
        }
    }

    /// `namespace/hostname` of the service, or the workload's uid: for logs.
    pub fn describe(&self) -> String {
        match self {
            Fronted::Service { service, port, .. } => format!("service {}:{port}", service.key()),
            Fronted::Workload { workload, port } => {
                format!("workload {}:{port}", workload.uid)
            }
        }
    }
}

/// Why an authority is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotFronted {
    /// Nothing in the mesh has that address or hostname.
    #[error("{0} is not a service or workload this waypoint knows")]
    Unknown(String),
    /// It exists, but its `waypoint` is not this waypoint (or it has none).
    #[error("{0} does not use this waypoint")]
    NotOurs(String),
    /// The service is ours, but the port dialled is not one of its ports (Envoy's waypoint
    /// has no filter chain for it).
    #[error("{0} is not a port of the service")]
    PortNotServed(String),
    /// This waypoint's own workload is not in the mesh state yet.
    #[error("this waypoint's own workload is not in the mesh state yet")]
    NoSelf,
}

/// Decides whether `authority` is fronted by `me` in `network`.
///
/// A VIP is tried first (service addressing: any service at that VIP that names this
/// waypoint), then a pod IP (workload addressing: that workload names it); a hostname
/// must be a service's hostname, that service naming this waypoint. A service is fronted
/// on its own ports only; a pod on any port.
pub fn front(
    state: &ProxyState,
    network: &str,
    me: Option<&Workload>,
    authority: &Authority,
) -> Result<Fronted, NotFronted> {
    let me = me.ok_or(NotFronted::NoSelf)?;
    let ours = |gw: Option<&ambit_state::GatewayAddress>| {
        gw.is_some_and(|gw| names_waypoint(state, gw, me))
    };
    match authority {
        Authority::Addr(addr) => {
            let ip = addr.ip();
            let mut known = false;
            let mut port_not_served = false;
            for service in state.services_at_vip(network, ip) {
                known = true;
                if ours(service.waypoint.as_ref()) {
                    if !service.ports.contains_key(&addr.port()) {
                        port_not_served = true;
                        continue;
                    }
                    return Ok(Fronted::Service {
                        service: service.clone(),
                        port: addr.port(),
                        vip: Some(ip),
                    });
                }
            }
            if port_not_served {
                return Err(NotFronted::PortNotServed(addr.to_string()));
            }
            if let Some(workload) = state.workload_by_ip(network, ip) {
                if ours(workload.waypoint.as_deref()) {
                    return Ok(Fronted::Workload {
                        workload,
                        port: addr.port(),
                    });
                }
                known = true;
            }
            Err(if known {
                NotFronted::NotOurs(addr.to_string())
            } else {
                NotFronted::Unknown(addr.to_string())
            })
        }
        Authority::Host { host, port } => {
            let mut known = false;
            let mut port_not_served = false;
            for service in state.services_with_hostname(host) {
                known = true;
                if ours(service.waypoint.as_ref()) {
                    if !service.ports.contains_key(port) {
                        port_not_served = true;
                        continue;
                    }
                    return Ok(Fronted::Service {
                        service: service.clone(),
                        port: *port,
                        vip: None,
                    });
                }
            }
            let shown = format!("{host}:{port}");
            Err(if port_not_served {
                NotFronted::PortNotServed(shown)
            } else if known {
                NotFronted::NotOurs(shown)
            } else {
                NotFronted::Unknown(shown)
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MESH: &str = r#"
workloads:
- {uid: wp, name: waypoint, namespace: shop, serviceAccount: waypoint, workloadIps: ["10.0.0.9"], protocol: HBONE, services: {"shop/waypoint.shop.svc.cluster.local": {15008: 15008}}}
- {uid: other-wp, name: other, namespace: shop, serviceAccount: other, workloadIps: ["10.0.0.8"], protocol: HBONE}
- uid: a
  name: a
  namespace: shop
  serviceAccount: a
  workloadIps: ["10.0.0.1"]
  protocol: HBONE
  waypoint: {destination: "shop/waypoint.shop.svc.cluster.local", hboneMtlsPort: 15008}
  services: {"shop/reviews.shop.svc.cluster.local": {80: 8080}}
- {uid: b, name: b, namespace: shop, serviceAccount: b, workloadIps: ["10.0.0.2"], protocol: HBONE}
services:
- name: waypoint
  namespace: shop
  hostname: waypoint.shop.svc.cluster.local
  vips: ["/10.96.0.9"]
  ports: {15008: 15008}
- name: reviews
  namespace: shop
  hostname: reviews.shop.svc.cluster.local
  vips: ["/10.96.0.1"]
  ports: {80: 8080, 3306: 3306, 9000: 9000}
  appProtocols: {80: HTTP, 3306: TCP}
  waypoint: {destination: "/10.96.0.9", hboneMtlsPort: 15008}
- name: ratings
  namespace: shop
  hostname: ratings.shop.svc.cluster.local
  vips: ["/10.96.0.2"]
  ports: {80: 8080}
  waypoint: {destination: "/10.0.0.8", hboneMtlsPort: 15008}
- name: plain
  namespace: shop
  hostname: plain.shop.svc.cluster.local
  vips: ["/10.96.0.3"]
  ports: {80: 8080}
"#;

    fn decide(state: &ProxyState, me: &str, authority: &str) -> Result<String, NotFronted> {
        let me = state.workload_by_uid(me);
        let authority = ambit_hbone::parse_authority(authority).unwrap();
        front(state, "", me.as_deref(), &authority).map(|f| {
            let carriage = f.carriage();
            format!("{} {carriage:?}", f.describe())
        })
    }

    #[test]
    fn authority_table() {
        let state = ProxyState::from_yaml("mesh", MESH).unwrap();
        let not_ours = |s: &str| Err(NotFronted::NotOurs(s.into()));
        let unknown = |s: &str| Err(NotFronted::Unknown(s.into()));
        let ok = |s: &str| Ok(s.to_string());
        let cases: &[(&str, &str, Result<String, NotFronted>)] = &[
            // A VIP whose service names this waypoint by its service VIP.
            (
                "wp",
                "10.96.0.1:80",
                ok("service shop/reviews.shop.svc.cluster.local:80 Http"),
            ),
            (
                "wp",
                "10.96.0.1:3306",
                ok("service shop/reviews.shop.svc.cluster.local:3306 Opaque"),
            ),
            (
                "wp",
                "10.96.0.1:9000",
                ok("service shop/reviews.shop.svc.cluster.local:9000 Sniff"),
            ),
            // Its hostname.
            (
                "wp",
                "reviews.shop.svc.cluster.local:80",
                ok("service shop/reviews.shop.svc.cluster.local:80 Http"),
            ),
            // Ours, but not one of the service's ports (by VIP and by hostname).
            (
                "wp",
                "10.96.0.1:81",
                Err(NotFronted::PortNotServed("10.96.0.1:81".into())),
            ),
            (
                "wp",
                "reviews.shop.svc.cluster.local:8080",
                Err(NotFronted::PortNotServed(
                    "reviews.shop.svc.cluster.local:8080".into(),
                )),
            ),
            // Another waypoint's service, and a service without one.
            ("wp", "10.96.0.2:80", not_ours("10.96.0.2:80")),
            (
                "other-wp",
                "10.96.0.2:80",
                ok("service shop/ratings.shop.svc.cluster.local:80 Sniff"),
            ),
            ("wp", "10.96.0.3:80", not_ours("10.96.0.3:80")),
            (
                "wp",
                "plain.shop.svc.cluster.local:80",
                not_ours("plain.shop.svc.cluster.local:80"),
            ),
            // A pod whose workload names this waypoint by hostname; one without.
            ("wp", "10.0.0.1:8080", ok("workload a:8080 Sniff")),
            ("other-wp", "10.0.0.1:8080", not_ours("10.0.0.1:8080")),
            ("wp", "10.0.0.2:8080", not_ours("10.0.0.2:8080")),
            // Unknown addresses and names.
            ("wp", "10.1.1.1:80", unknown("10.1.1.1:80")),
            (
                "wp",
                "nowhere.shop.svc.cluster.local:80",
                unknown("nowhere.shop.svc.cluster.local:80"),
            ),
            // Not in the mesh ourselves: nothing is fronted.
            ("absent", "10.96.0.1:80", Err(NotFronted::NoSelf)),
        ];
        for (me, authority, want) in cases {
            assert_eq!(&decide(&state, me, authority), want, "{me} {authority}");
        }
    }
}
