//! The outbound decision (reference §10.1): a connection captured from the local workload
//! becomes a plan — plain TCP to a target, or an HBONE tunnel with its next hop,
//! `:authority`, expected server identities and pool key.

use std::net::SocketAddr;
use std::sync::Arc;

use ambit_hbone::headers::{forwarded_value, Baggage};
use ambit_hbone::pool::PoolKey;
use ambit_identity::SpiffeId;
use ambit_state::{route, ProxyState, Route, RouteInput, Service, Workload};
use rand::Rng;

use super::{is_loop_port, Local};
use crate::error::Error;
use crate::settings::ProxyConfig;

/// The facts about one captured outbound connection.
#[derive(Clone, Copy, Debug)]
pub struct Outbound<'a> {
    pub cfg: &'a ProxyConfig,
    pub local: Local<'a>,
    /// The application's address.
    pub src: SocketAddr,
    /// What the application dialed (`SO_ORIGINAL_DST`).
    pub original_dst: SocketAddr,
    /// The address the captured connection arrived on (our outbound listener).
    pub listener: SocketAddr,
}

/// Where a captured connection goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutboundPlan {
    /// The local workload it comes from.
    pub source: Arc<Workload>,
    pub hop: Hop,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Hop {
    /// Plain TCP: a workload outside the mesh, or passthrough to an unknown address.
    Tcp {
        target: SocketAddr,
        destination: Option<Arc<Workload>>,
        service: Option<Arc<Service>>,
    },
    /// Through an HBONE tunnel.
    Hbone(Box<HbonePlan>),
}

/// An HBONE tunnel to open.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HbonePlan {
    /// Where the mutual TLS connection goes: `endpoint-ip:15008`.
    pub next_hop: SocketAddr,
    /// The CONNECT `:authority`: `endpoint-ip:target-port`.
    pub authority: SocketAddr,
    /// The identity we present.
    pub source_identity: SpiffeId,
    /// Identities the server may present: the service's SANs, then the workload's own.
    pub expected_identities: Vec<SpiffeId>,
    pub destination: Arc<Workload>,
    /// The service, when the destination was a service VIP.
    pub service: Option<Arc<Service>>,
    /// The pooled connection this stream may share.
    pub pool_key: PoolKey,
    /// The source workload's metadata for the `baggage` header.
    pub baggage: Baggage,
    /// The `forwarded` header: the client's address and the service's hostname.
    pub forwarded: String,
}

/// Decides where a captured connection goes. `rng` picks among equally good endpoints.
pub fn plan_outbound(
    state: &ProxyState,
    input: &Outbound<'_>,
    rng: &mut impl Rng,
) -> Result<OutboundPlan, Error> {
    let dst = input.original_dst;
    // A connection that reached us without being redirected, or aimed at our own
    // listeners from the workload itself, would loop.
    if is_loop_port(input.cfg, dst.port()) && (dst.ip().is_loopback() || dst == input.listener) {
        return Err(Error::SelfCall { port: dst.port() });
    }
    let source = input.local.workload(state)?;
    let route_input = RouteInput {
        source: &source,
        dst,
        src_ip: input.src.ip(),
        network: &input.cfg.network,
        hbone_port: input.cfg.ports.remote_hbone,
    };
    let hop = match route(state, &route_input, rng)? {
        Route::Tcp {
            target,
            destination,
            service,
        } => Hop::Tcp {
            target,
            destination,
            service,
        },
        Route::Hbone {
            next_hop,
            authority,
            expected_identities,
            destination,
            service,
        } => {
            let source_identity = source.identity();
            let pool_key = PoolKey {
                src_identity: source_identity.to_string(),
                dst_identities: expected_identities.iter().map(|i| i.to_string()).collect(),
                dst: next_hop,
                src_ip: input.src.ip(),
            };
            let forwarded =
                forwarded_value(input.src, service.as_ref().map(|s| s.hostname.as_str()));
            Hop::Hbone(Box::new(HbonePlan {
                next_hop,
                authority,
                source_identity,
                expected_identities,
                destination,
                service,
                pool_key,
                baggage: baggage_of(&source),
                forwarded,
            }))
        }
    };
    Ok(OutboundPlan { source, hop })
}

/// A workload's metadata for the CONNECT `baggage` header (and the response's).
pub fn baggage_of(w: &Workload) -> Baggage {
    let some = |s: &str| (!s.is_empty()).then(|| s.to_string());
    Baggage {
        cluster_id: some(&w.cluster_id),
        namespace: some(&w.namespace),
        workload_type: some(w.workload_type_or_default()),
        workload_name: some(crate::telemetry::workload_name(w)),
        service_name: some(&w.canonical_name),
        service_version: some(&w.canonical_revision),
        region: some(&w.locality.region),
        zone: some(&w.locality.zone),
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{identity, mesh};
    use super::*;
    use ambit_state::RouteError;
    use rand::SeedableRng;

    const LISTENER: &str = "10.0.0.1:15001";

    fn plan(who: &str, dst: &str) -> Result<OutboundPlan, Error> {
        let state = mesh();
        let cfg = ProxyConfig::default();
        let id = identity(who, who);
        let input = Outbound {
            cfg: &cfg,
            local: Local {
                identity: &id,
                node: None,
            },
            src: "10.0.0.1:40000".parse().unwrap(),
            original_dst: dst.parse().unwrap(),
            listener: LISTENER.parse().unwrap(),
        };
        plan_outbound(&state, &input, &mut rand::rngs::StdRng::seed_from_u64(7))
    }

    /// A plan in one line: protocol, next hop, authority, expected identities.
    fn show(r: Result<OutboundPlan, Error>) -> String {
        match r {
            Err(e) => format!("error: {e}"),
            Ok(p) => match p.hop {
                Hop::Tcp {
                    target,
                    destination,
                    service,
                } => format!(
                    "tcp {target} workload={} service={}",
                    destination.map_or("-".into(), |w| w.name.clone()),
                    service.map_or("-".into(), |s| s.name.clone()),
                ),
                Hop::Hbone(h) => format!(
                    "hbone {} authority={} ids={}",
                    h.next_hop,
                    h.authority,
                    h.expected_identities
                        .iter()
                        .map(|i| i.to_string())
                        .collect::<Vec<_>>()
                        .join(","),
                ),
            },
        }
    }

    #[test]
    fn every_branch_of_the_outbound_decision() {
        let sa = |s: &str| format!("spiffe://cluster.local/ns/shop/sa/{s}");
        let table: &[(&str, &str, String)] = &[
            // §10.1 step 1: a loop into our own listeners.
            (
                "loopback to the outbound port",
                "127.0.0.1:15001",
                "error: refusing connection to the proxy's own port 15001".into(),
            ),
            (
                "loopback to the HBONE port",
                "127.0.0.1:15008",
                "error: refusing connection to the proxy's own port 15008".into(),
            ),
            (
                "not redirected: the listener itself",
                LISTENER,
                "error: refusing connection to the proxy's own port 15001".into(),
            ),
            // Step 8, workload-addressed: HBONE to its node, authority as dialed.
            (
                "a mesh workload by IP",
                "10.0.0.2:8080",
                format!(
                    "hbone 10.0.0.2:15008 authority=10.0.0.2:8080 ids={}",
                    sa("server")
                ),
            ),
            // The same address on a proxy port of another workload is no loop.
            (
                "another workload's 15008",
                "10.0.0.2:15008",
                format!(
                    "hbone 10.0.0.2:15008 authority=10.0.0.2:15008 ids={}",
                    sa("server")
                ),
            ),
            // Step 3/5, service-addressed: load-balanced, port translated, SANs first.
            (
                "a service VIP",
                "10.96.0.10:80",
                format!(
                    "hbone 10.0.0.2:15008 authority=10.0.0.2:8080 ids={},{}",
                    sa("api-san"),
                    sa("server")
                ),
            ),
            (
                "a named service port resolved by the endpoint",
                "10.96.0.9:9000",
                format!(
                    "hbone 10.0.0.2:15008 authority=10.0.0.2:9090 ids={}",
                    sa("server")
                ),
            ),
            // Step 8, TCP-protocol workload: plain TCP to it.
            (
                "a workload outside the mesh",
                "10.0.0.3:8080",
                "tcp 10.0.0.3:8080 workload=legacy service=-".into(),
            ),
            (
                "a service backed by it",
                "10.96.0.13:80",
                "tcp 10.0.0.3:8080 workload=legacy service=legacy".into(),
            ),
            // Step 5: an unknown address passes through; a passthrough service too.
            (
                "an unknown address",
                "192.0.2.7:443",
                "tcp 192.0.2.7:443 workload=- service=-".into(),
            ),
            (
                "a passthrough service",
                "10.96.0.16:443",
                "tcp 10.96.0.16:443 workload=- service=external".into(),
            ),
            // Step 5: a known service nothing can serve.
            (
                "a service port that does not exist",
                "10.96.0.10:81",
                "error: service shop/api.shop.svc.cluster.local has no port 81".into(),
            ),
            (
                "a service without endpoints",
                "10.96.0.12:80",
                "error: no healthy upstream for service shop/other.shop.svc.cluster.local".into(),
            ),
            // Step 6: endpoints in another network need double HBONE: not candidates yet.
            (
                "a service whose endpoints are in another network",
                "10.96.0.15:80",
                "error: no healthy upstream for service shop/far.shop.svc.cluster.local".into(),
            ),
            // Steps 4 and 7: through the waypoint with the original destination as the
            // authority (the full table is in ambit-state's outbound_plan test).
            (
                "a service with a waypoint",
                "10.96.0.14:80",
                format!(
                    "hbone 10.0.9.9:15008 authority=10.96.0.14:80 ids={}",
                    sa("waypoint")
                ),
            ),
            (
                "a workload with a waypoint",
                "10.0.0.4:8080",
                format!(
                    "hbone 10.0.9.9:15008 authority=10.0.0.4:8080 ids={}",
                    sa("waypoint")
                ),
            ),
            (
                "a waypoint that resolves to nothing: refused, never bypassed",
                "10.0.0.5:8080",
                "error: workload wp2 uses a waypoint that cannot be reached: no service or \
                 workload has the waypoint address /10.0.9.8; fix the waypoint's service or \
                 workload in the mesh configuration"
                    .into(),
            ),
        ];
        for (what, dst, want) in table {
            assert_eq!(&show(plan("client", dst)), want, "{what} ({dst})");
        }
    }

    #[test]
    fn without_its_own_workload_the_proxy_sends_nothing() {
        // §10.1 step 2.
        assert_eq!(
            show(plan("ghost", "10.0.0.2:8080")),
            "error: this proxy's workload shop/ghost (service account ghost) is not in the \
             configuration"
        );
        // A loop is refused before anything is looked up.
        assert!(matches!(
            plan("ghost", "127.0.0.1:15006"),
            Err(Error::SelfCall { port: 15006 })
        ));
    }

    #[test]
    fn an_hbone_plan_carries_the_headers_and_the_pool_key() {
        let Hop::Hbone(h) = plan("client", "10.96.0.10:80").unwrap().hop else {
            panic!("expected HBONE")
        };
        assert_eq!(
            h.source_identity.to_string(),
            "spiffe://cluster.local/ns/shop/sa/client"
        );
        assert_eq!(
            h.pool_key,
            PoolKey {
                src_identity: "spiffe://cluster.local/ns/shop/sa/client".into(),
                dst_identities: vec![
                    "spiffe://cluster.local/ns/shop/sa/api-san".into(),
                    "spiffe://cluster.local/ns/shop/sa/server".into(),
                ],
                dst: "10.0.0.2:15008".parse().unwrap(),
                src_ip: "10.0.0.1".parse().unwrap(),
            }
        );
        assert_eq!(
            h.forwarded,
            "for=\"10.0.0.1:40000\";host=api.shop.svc.cluster.local"
        );
        assert_eq!(
            h.baggage.to_header_value(),
            "k8s.cluster.name=east,k8s.namespace.name=shop,k8s.deployment.name=client,\
             service.name=client,service.version=v1,cloud.region=eu,cloud.availability_zone=eu-1"
        );
        assert_eq!(h.service.map(|s| s.name.clone()).as_deref(), Some("api"));
        // Workload-addressed: no host in `forwarded`.
        let Hop::Hbone(h) = plan("client", "10.0.0.2:8080").unwrap().hop else {
            panic!("expected HBONE")
        };
        assert_eq!(h.forwarded, "for=\"10.0.0.1:40000\"");
        assert!(h.service.is_none());
    }

    #[test]
    fn route_errors_keep_their_type() {
        assert!(matches!(
            plan("client", "10.96.0.12:80"),
            Err(Error::Route(RouteError::NoHealthyUpstream { .. }))
        ));
    }
}
