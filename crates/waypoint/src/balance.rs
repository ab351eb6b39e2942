//! The endpoint for one request (or one opaque tunnel): the fronted service's endpoints
//! from WDS, ranked and weighted as the node proxy ranks them (health, network, locality,
//! capacity: `ambit_state::pick_endpoint`), the target port translated; HBONE to an
//! endpoint in the mesh, plaintext to one outside it. Sans-IO apart from the random draw.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use ambit_identity::SpiffeId;
use ambit_state::{
    endpoint_candidates, hostname_candidates, pick_waypoint_endpoint, PickMode, Picked, ProxyState,
    RouteError, TunnelProtocol, Workload,
};

use crate::balancing::Balancer;
use crate::tls_origin::TlsOrigin;

use crate::front::Fronted;
use crate::upstream::{Endpoint, Transport};

/// Where one request goes.
#[derive(Debug, Clone)]
pub struct Choice {
    pub endpoint: Endpoint,
    /// The endpoint's workload, for the destination labels.
    pub workload: Option<Arc<Workload>>,
}

/// Why no endpoint could be chosen.
#[derive(Debug, thiserror::Error)]
pub enum NoEndpoint {
    #[error(transparent)]
    Route(#[from] RouteError),
    /// The waypoint's own workload is not in the mesh state, so locality cannot be ranked.
    #[error("this waypoint's workload is not in the mesh state")]
    NoSelf,
    /// The destination's DestinationRule asks for TLS that cannot be set up.
    #[error("{0}")]
    Tls(String),
    /// The workload has no address in this network.
    #[error("workload {0} has no address")]
    NoAddress(String),
}

/// Chooses the endpoint for `fronted` on behalf of the waypoint `me`; `hbone_port` is
/// where endpoints' node proxies listen (15008).
pub fn choose_endpoint(
    state: &ProxyState,
    me: Option<&Workload>,
    fronted: &Fronted,
    hbone_port: u16,
    rng: &mut impl rand::Rng,
) -> Result<Choice, NoEndpoint> {
    match fronted {
        Fronted::Service { service, port, vip } => {
            let me = me.ok_or(NoEndpoint::NoSelf)?;
            let dialed = vip.or_else(|| service.vips.first().map(|v| v.address));
            let dialed = dialed.unwrap_or(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED));
            let picked = pick_waypoint_endpoint(state, service, *port, dialed, me, rng)?;
            Ok(service_choice(service, picked, hbone_port, None))
        }
        Fronted::Workload { workload, port } => {
            let ip = *workload
                .workload_ips
                .first()
                .ok_or_else(|| NoEndpoint::NoAddress(workload.uid.to_string()))?;
            Ok(Choice {
                endpoint: endpoint_of(workload, ip, *port, vec![workload.identity()], hbone_port),
                workload: Some(workload.clone()),
            })
        }
    }
}

fn endpoint_of(
    w: &Workload,
    ip: IpAddr,
    port: u16,
    identities: Vec<SpiffeId>,
    hbone_port: u16,
) -> Endpoint {
    let target = SocketAddr::new(ip, port);
    let transport = match w.protocol {
        TunnelProtocol::Hbone => Transport::Hbone {
            next_hop: SocketAddr::new(ip, hbone_port),
            identities,
        },
        TunnelProtocol::LegacyIstioMtls => Transport::IstioMtls { identities },
        TunnelProtocol::Tcp => Transport::Plain,
    };
    Endpoint { target, transport }
}

/// Draws over the endpoints for a retry before settling for one already tried.
const RETRY_DRAWS: usize = 8;

/// [`choose_endpoint`] avoiding the endpoints in `tried` (a retry goes elsewhere when it
/// can, as Envoy's retries skip the hosts already tried); with every endpoint tried, one
/// of them again.
pub fn choose_avoiding(
    state: &ProxyState,
    me: Option<&Workload>,
    fronted: &Fronted,
    hbone_port: u16,
    tried: &[SocketAddr],
    rng: &mut impl rand::Rng,
) -> Result<Choice, NoEndpoint> {
    let mut choice = choose_endpoint(state, me, fronted, hbone_port, rng)?;
    for _ in 1..RETRY_DRAWS {
        if !tried.contains(&choice.endpoint.target) {
            break;
        }
        choice = choose_endpoint(state, me, fronted, hbone_port, rng)?;
    }
    Ok(choice)
}

/// [`choose_avoiding`] for the running waypoint; with a DestinationRule's balancer, or
/// endpoints resolved by name (`resolved`), a choice among every eligible endpoint
/// ([`choose_among`]).
pub fn choose(
    wp: &crate::Waypoint,
    state: &ProxyState,
    fronted: &Fronted,
    tried: &[SocketAddr],
    balanced: Option<(&Balancer, Option<u64>)>,
    resolved: &[Picked],
) -> Result<Choice, NoEndpoint> {
    let me = wp.me(state);
    let mut rng = rand::thread_rng();
    let hbone = ambit_wellknown::ports::HBONE;
    if balanced.is_none() && resolved.is_empty() {
        return choose_avoiding(state, me.as_deref(), fronted, hbone, tried, &mut rng);
    }
    choose_among(
        state,
        me.as_deref(),
        fronted,
        hbone,
        tried,
        balanced,
        resolved,
        &mut rng,
    )
}

/// The endpoint for `fronted` among those [`choose_endpoint`] could pick and the
/// `resolved` ones (endpoints known by hostname, with an address each): chosen by
/// `balanced`'s balancer (a DestinationRule's; `Option<u64>`: the request's hash), or by
/// capacity at random avoiding `tried`.
#[allow(clippy::too_many_arguments)]
pub fn choose_among(
    state: &ProxyState,
    me: Option<&Workload>,
    fronted: &Fronted,
    hbone_port: u16,
    tried: &[SocketAddr],
    balanced: Option<(&Balancer, Option<u64>)>,
    resolved: &[Picked],
    rng: &mut impl rand::Rng,
) -> Result<Choice, NoEndpoint> {
    let Fronted::Service { service, port, vip } = fronted else {
        return choose_avoiding(state, me, fronted, hbone_port, tried, rng);
    };
    let me = me.ok_or(NoEndpoint::NoSelf)?;
    let dialed = vip.or_else(|| service.vips.first().map(|v| v.address));
    let dialed = dialed.unwrap_or(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED));
    let mut candidates =
        endpoint_candidates(state, service, *port, dialed, me, PickMode::Standard)?;
    candidates.extend(resolved.iter().cloned());
    let no_upstream = || RouteError::NoHealthyUpstream {
        service: service.key(),
    };
    let (picked, tls) = match balanced {
        Some((balancer, hash)) => {
            let tls = balancer.tls().map_err(|e| NoEndpoint::Tls(e.to_string()))?;
            let picked = balancer
                .pick(candidates, tried, hash, std::time::Instant::now(), rng)
                .ok_or_else(no_upstream)?;
            (picked, tls)
        }
        None => {
            let fresh: Vec<Picked> = candidates
                .iter()
                .filter(|c| !tried.contains(&SocketAddr::new(c.ip, c.port)))
                .cloned()
                .collect();
            if !fresh.is_empty() {
                candidates = fresh;
            }
            (weighted(candidates, rng).ok_or_else(no_upstream)?, None)
        }
    };
    Ok(service_choice(service, picked, hbone_port, tls))
}

/// One of `candidates` at random, weighted by capacity.
fn weighted(mut candidates: Vec<Picked>, rng: &mut impl rand::Rng) -> Option<Picked> {
    let index = ambit_state::weighted_index(&candidates, rng)?;
    Some(candidates.swap_remove(index))
}

/// The addresses of `fronted`'s endpoints known by hostname only, each address an
/// endpoint (empty when it has none, or none resolves).
pub async fn resolve_hostnames(
    wp: &crate::Waypoint,
    state: &ProxyState,
    fronted: &Fronted,
) -> Vec<Picked> {
    let Fronted::Service { service, port, .. } = fronted else {
        return Vec::new();
    };
    // The common case, a Service of the mesh: one index lookup, no search for this
    // waypoint's workload, no resolver.
    if !ambit_state::has_hostname_endpoints(state, service) {
        return Vec::new();
    }
    let Some(me) = wp.me(state) else {
        return Vec::new();
    };
    let Ok(named) = hostname_candidates(state, service, *port, &me, PickMode::Standard) else {
        return Vec::new();
    };
    if named.is_empty() {
        return Vec::new();
    }
    let Some(resolver) = &wp.resolver else {
        return Vec::new();
    };
    let mut resolved = Vec::new();
    for (workload, port) in named {
        match resolver.resolve(&workload.hostname).await {
            Ok(ips) => resolved.extend(ips.iter().map(|ip| Picked {
                workload: workload.clone(),
                ip: *ip,
                port,
            })),
            Err(e) => tracing::info!(service = %service.hostname, "endpoint not resolved: {e}"),
        }
    }
    resolved
}

fn service_choice(
    service: &ambit_state::Service,
    picked: Picked,
    hbone_port: u16,
    tls: Option<&Arc<TlsOrigin>>,
) -> Choice {
    let mut identities = vec![picked.workload.identity()];
    identities.extend(
        service
            .subject_alt_names
            .iter()
            .filter_map(|s| SpiffeId::parse(s).ok()),
    );
    let mut endpoint = endpoint_of(
        &picked.workload,
        picked.ip,
        picked.port,
        identities,
        hbone_port,
    );
    // A rule's TLS toward endpoints outside the mesh; the mesh's are HBONE already.
    if let (Transport::Plain, Some(origin)) = (&endpoint.transport, tls) {
        let server_name = origin.sni.clone().unwrap_or_else(|| {
            if picked.workload.hostname.is_empty() {
                service.hostname.to_string()
            } else {
                picked.workload.hostname.to_string()
            }
        });
        endpoint.transport = Transport::Tls {
            origin: origin.clone(),
            server_name,
        };
    }
    Choice {
        endpoint,
        workload: Some(picked.workload),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use std::collections::BTreeMap;

    const MESH: &str = r#"
workloads:
- {uid: wp, name: waypoint, namespace: shop, serviceAccount: waypoint, workloadIps: ["10.0.0.9"], protocol: HBONE}
- uid: r1
  name: reviews-1
  namespace: shop
  serviceAccount: reviews
  workloadIps: ["10.0.1.1"]
  protocol: HBONE
  services: {"shop/reviews.shop.svc.cluster.local": {80: 8080}}
- uid: r2
  name: reviews-2
  namespace: shop
  serviceAccount: reviews
  workloadIps: ["10.0.1.2"]
  protocol: NONE
  services: {"shop/reviews.shop.svc.cluster.local": {80: 9090}}
- uid: r3
  name: reviews-3
  namespace: shop
  serviceAccount: reviews
  workloadIps: ["10.0.1.3"]
  protocol: HBONE
  status: Unhealthy
  services: {"shop/reviews.shop.svc.cluster.local": {80: 8080}}
services:
- name: reviews
  namespace: shop
  hostname: reviews.shop.svc.cluster.local
  vips: ["/10.96.0.1"]
  ports: {80: 8080}
  subjectAltNames: ["spiffe://cluster.local/ns/shop/sa/reviews-san"]
- name: empty
  namespace: shop
  hostname: empty.shop.svc.cluster.local
  vips: ["/10.96.0.2"]
  ports: {80: 8080}
"#;

    #[test]
    fn every_request_draws_again_over_healthy_endpoints() {
        let state = ProxyState::from_yaml("mesh", MESH).unwrap();
        let me = state.workload_by_uid("wp");
        let service = state
            .service_by_key("shop/reviews.shop.svc.cluster.local")
            .unwrap();
        let fronted = Fronted::Service {
            service,
            port: 80,
            vip: Some("10.96.0.1".parse().unwrap()),
        };
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut seen: BTreeMap<String, usize> = BTreeMap::new();
        for _ in 0..5000 {
            let c = choose_endpoint(&state, me.as_deref(), &fronted, 15008, &mut rng).unwrap();
            let how = match &c.endpoint.transport {
                Transport::Hbone {
                    next_hop,
                    identities,
                } => format!(
                    "{} hbone via {next_hop} as {}",
                    c.endpoint.target,
                    identities
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(",")
                ),
                Transport::Plain => format!("{} plain", c.endpoint.target),
                Transport::Tls { server_name, .. } => {
                    format!("{} tls to {server_name}", c.endpoint.target)
                }
                Transport::IstioMtls { .. } => format!("{} istio mtls", c.endpoint.target),
            };
            *seen.entry(how).or_default() += 1;
        }
        let keys: Vec<&String> = seen.keys().collect();
        assert_eq!(
            keys,
            [
                "10.0.1.1:8080 hbone via 10.0.1.1:15008 as spiffe://cluster.local/ns/shop/sa/reviews,spiffe://cluster.local/ns/shop/sa/reviews-san",
                "10.0.1.2:9090 plain",
            ],
            "the unhealthy endpoint is never chosen; both others are"
        );
        // An even draw, 5,000 times, 2372..=2628 each: a correct 50 % passes with
        // p = 0.99972 (over seeds); 45 % or 55 % fails with p = 0.99972 (verified in
        // ambit_netns_lab::stats).
        assert!(seen.values().all(|n| (2372..=2628).contains(n)), "{seen:?}");
    }

    #[test]
    fn a_retry_goes_to_an_endpoint_not_tried() {
        let state = ProxyState::from_yaml("mesh", MESH).unwrap();
        let me = state.workload_by_uid("wp");
        let service = state
            .service_by_key("shop/reviews.shop.svc.cluster.local")
            .unwrap();
        let fronted = Fronted::Service {
            service,
            port: 80,
            vip: None,
        };
        let tried: Vec<SocketAddr> = vec!["10.0.1.1:8080".parse().unwrap()];
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        for _ in 0..100 {
            let c =
                choose_avoiding(&state, me.as_deref(), &fronted, 15008, &tried, &mut rng).unwrap();
            assert_eq!(c.endpoint.target.to_string(), "10.0.1.2:9090");
        }
        // Every endpoint tried: one of them again rather than none.
        let all: Vec<SocketAddr> = vec![
            "10.0.1.1:8080".parse().unwrap(),
            "10.0.1.2:9090".parse().unwrap(),
        ];
        assert!(choose_avoiding(&state, me.as_deref(), &fronted, 15008, &all, &mut rng).is_ok());
    }

    #[test]
    fn no_endpoint_and_no_self() {
        let state = ProxyState::from_yaml("mesh", MESH).unwrap();
        let me = state.workload_by_uid("wp");
        let empty = Fronted::Service {
            service: state
                .service_by_key("shop/empty.shop.svc.cluster.local")
                .unwrap(),
            port: 80,
            vip: None,
        };
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let e = choose_endpoint(&state, me.as_deref(), &empty, 15008, &mut rng).unwrap_err();
        assert!(e.to_string().contains("no healthy upstream"), "{e}");
        let e = choose_endpoint(&state, None, &empty, 15008, &mut rng).unwrap_err();
        assert!(matches!(e, NoEndpoint::NoSelf), "{e}");
    }

    #[test]
    fn a_workload_is_its_own_endpoint() {
        let state = ProxyState::from_yaml("mesh", MESH).unwrap();
        let reviews = state
            .service_by_key("shop/reviews.shop.svc.cluster.local")
            .unwrap();
        assert!(!ambit_state::has_hostname_endpoints(&state, &reviews));
        let workload = state.workload_by_uid("r2").unwrap();
        let fronted = Fronted::Workload {
            workload,
            port: 9090,
        };
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let c = choose_endpoint(&state, None, &fronted, 15008, &mut rng).unwrap();
        assert_eq!(c.endpoint.target.to_string(), "10.0.1.2:9090");
        assert_eq!(c.endpoint.transport, Transport::Plain);
    }

    const EGRESS: &str = r#"
workloads:
- {uid: wp, name: waypoint, namespace: shop, serviceAccount: waypoint, workloadIps: ["10.0.0.9"], protocol: HBONE}
- {uid: se, name: api, namespace: shop, serviceAccount: default, hostname: api.example.test, protocol: NONE, services: {"shop/api.example.test": {80: 443}}}
services:
- {name: api, namespace: shop, hostname: api.example.test, vips: ["/240.240.0.10"], ports: {80: 443}}
"#;

    fn balancer_of(state: &ProxyState, fronted: &Fronted, tls: &str) -> Arc<Balancer> {
        let text = format!("apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {{name: api, namespace: shop}}\nspec: {{host: api.example.test, trafficPolicy: {{tls: {tls}}}}}\n");
        let parsed = ambit_manifests::parse_documents("dr.yaml", &text, &Default::default());
        assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
        let rules = crate::destination_rules::DestinationRules::new(
            parsed
                .destination_rules
                .into_iter()
                .map(|r| r.value)
                .collect(),
        );
        let viewer = crate::destination_rules::Viewer {
            namespace: "shop",
            root_namespace: "istio-system",
            cluster_domain: "cluster.local",
        };
        let _ = state;
        crate::balancing::Balancers::default()
            .for_target(&rules, viewer, fronted)
            .unwrap()
    }

    #[test]
    fn endpoints_known_by_hostname_with_and_without_tls_origination() {
        let state = ProxyState::from_yaml("mesh", EGRESS).unwrap();
        let me = state.workload_by_uid("wp");
        let fronted = Fronted::Service {
            service: state.service_by_key("shop/api.example.test").unwrap(),
            port: 80,
            vip: None,
        };
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        assert!(ambit_state::has_hostname_endpoints(
            &state,
            fronted.service().unwrap()
        ));
        // Without an address it is no candidate.
        assert!(choose_endpoint(&state, me.as_deref(), &fronted, 15008, &mut rng).is_err());
        let named = hostname_candidates(
            &state,
            fronted.service().unwrap(),
            80,
            me.as_deref().unwrap(),
            PickMode::Standard,
        )
        .unwrap();
        assert_eq!(named.len(), 1);
        assert_eq!(named[0].1, 443, "the target port");
        let resolved: Vec<Picked> = ["10.79.0.1", "10.79.0.2"]
            .iter()
            .map(|ip| Picked {
                workload: named[0].0.clone(),
                ip: ip.parse().unwrap(),
                port: named[0].1,
            })
            .collect();
        let choose = |balanced: Option<(&Balancer, Option<u64>)>,
                      tried: &[SocketAddr],
                      rng: &mut rand::rngs::StdRng| {
            choose_among(
                &state,
                me.as_deref(),
                &fronted,
                15008,
                tried,
                balanced,
                &resolved,
                rng,
            )
            .unwrap()
            .endpoint
        };
        // Plaintext to a resolved address; a retry to the other.
        let e = choose(None, &[], &mut rng);
        assert_eq!(e.transport, Transport::Plain);
        let other = choose(None, &[e.target], &mut rng);
        assert_ne!(other.target, e.target);
        // SIMPLE: TLS, the SNI the ServiceEntry's host unless the rule names one.
        let simple = balancer_of(&state, &fronted, "{mode: SIMPLE, insecureSkipVerify: true}");
        match choose(Some((&simple, None)), &[], &mut rng).transport {
            Transport::Tls { server_name, .. } => assert_eq!(server_name, "api.example.test"),
            t => panic!("{t:?}"),
        }
        let named_sni = balancer_of(
            &state,
            &fronted,
            "{mode: SIMPLE, insecureSkipVerify: true, sni: edge.example.test}",
        );
        match choose(Some((&named_sni, None)), &[], &mut rng).transport {
            Transport::Tls { server_name, .. } => assert_eq!(server_name, "edge.example.test"),
            t => panic!("{t:?}"),
        }
        // A rule whose files are missing: no endpoint is chosen (nothing is sent in
        // plaintext instead), and the error names the file.
        let broken = balancer_of(
            &state,
            &fronted,
            "{mode: SIMPLE, caCertificates: /nonexistent/ca.pem}",
        );
        let e = choose_among(
            &state,
            me.as_deref(),
            &fronted,
            15008,
            &[],
            Some((&broken, None)),
            &resolved,
            &mut rng,
        )
        .unwrap_err();
        assert!(e.to_string().contains("/nonexistent/ca.pem"), "{e}");
    }
}
