//! The inbound decisions: an HBONE CONNECT (15008), or a captured plaintext connection
//! (15006), → which app port it reaches, from which source address, and whether policy
//! lets it through.
//!
//! Two stages, because ztunnel reports them differently: a request that cannot be
//! attributed (malformed, another workload's address, an unknown service port, a loop) is
//! refused before any metric is counted; one that can is counted, then authorized.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use ambit_hbone::headers::Authority;
use ambit_hbone::request::{validate, Rejection};
use ambit_identity::SpiffeId;
use ambit_state::{
    is_waypoint_for, AppTunnelProtocol, ProxyState, RbacContext, RbacObserver, Service, Workload,
};
use http::StatusCode;

use super::{canonical_ip, Spoof};
use super::{is_loop_port, Local, SourcePolicy};
use crate::error::Error;
use crate::proxy_protocol;
use crate::settings::ProxyConfig;

/// The facts about one CONNECT stream.
#[derive(Clone, Copy, Debug)]
pub struct HboneRequest<'a> {
    pub cfg: &'a ProxyConfig,
    pub local: Local<'a>,
    pub request: &'a http::request::Parts,
    /// The HBONE client's address.
    pub peer: SocketAddr,
    /// The address the connection arrived on: the destination pod's IP.
    pub arrived_on: SocketAddr,
    /// The client certificate's SPIFFE id.
    pub peer_identity: Option<&'a SpiffeId>,
    pub source_policy: SourcePolicy,
    /// This proxy's observer of the authorization (its dry-run counter).
    pub rbac: &'a dyn RbacObserver,
}

/// The facts about one captured plaintext connection.
#[derive(Clone, Copy, Debug)]
pub struct PlaintextConnection<'a> {
    pub cfg: &'a ProxyConfig,
    pub local: Local<'a>,
    pub peer: SocketAddr,
    /// What the client dialed (`SO_ORIGINAL_DST`).
    pub original_dst: SocketAddr,
    pub source_policy: SourcePolicy,
    /// This proxy's observer of the authorization (its dry-run counter).
    pub rbac: &'a dyn RbacObserver,
}

/// An attributed inbound connection: where it goes, and whether it may.
#[derive(Debug)]
pub struct InboundPlan {
    /// The app: the local workload's IP and the translated port (the application
    /// tunnel's port when it has one).
    pub target: SocketAddr,
    /// Where to dial: `target`, or loopback for a PROXY application tunnel with
    /// `LOCALHOST_APP_TUNNEL`.
    pub connect: SocketAddr,
    /// The PROXY v2 header to write to the app before any payload (PROXY tunnels only).
    pub proxy_header: Option<Vec<u8>>,
    /// Connect from the client's address (original-source preservation), or from ours.
    pub source: Option<Spoof>,
    pub dst_workload: Arc<Workload>,
    /// The service the client meant, for telemetry.
    pub dst_service: Option<Arc<Service>>,
    /// The client's workload, when its address is a known one.
    pub src_workload: Option<Arc<Workload>>,
    /// The CONNECT `:authority`, as understood (HBONE only).
    pub authority: Option<String>,
    /// `Err(Error::Denied)` when policy refuses the connection.
    pub verdict: Result<(), Error>,
    /// What the verdict was reached on, to decide again when policies change.
    pub rbac: RbacContext,
    /// The state's policy generation the verdict was reached with.
    pub policy_generation: u64,
}

/// Decides what one CONNECT reaches. Status codes follow ztunnel: 400 malformed or aimed
/// at another IP, 503 unknown workload / unresolvable or loop port, 401 denied by policy.
pub fn plan_hbone(state: &ProxyState, input: &HboneRequest<'_>) -> Result<InboundPlan, Error> {
    let request = validate(input.request).map_err(Error::BadRequest)?;
    let local_ip = canonical_ip(input.arrived_on.ip());
    let dst_workload = input.local.serving(state, local_ip)?;
    let (target_port, hostname_service) = match &request.authority {
        Authority::Addr(addr) => {
            let requested = canonical_ip(addr.ip());
            if !may_tunnel_to(state, input.cfg, &dst_workload, local_ip, requested) {
                return Err(Error::IpMismatch {
                    local: local_ip,
                    requested,
                });
            }
            (addr.port(), None)
        }
        Authority::Host { host, port } => {
            match resolve_hostname_port(state, &dst_workload, host, *port) {
                Some((target, service)) => (target, Some(service)),
                None => {
                    return Err(Error::UnknownServicePort {
                        host: host.clone(),
                        port: *port,
                        workload: dst_workload.name.to_string(),
                    })
                }
            }
        }
    };
    if is_loop_port(input.cfg, target_port) {
        return Err(Error::SelfCall { port: target_port });
    }
    let dst_service = hostname_service.or_else(|| {
        intended_service(
            state,
            &dst_workload,
            request.forwarded_host.as_deref(),
            target_port,
        )
    });
    // The target IP is always the one the connection arrived on; an application tunnel
    // may move the port.
    let tunnel = dst_workload.application_tunnel.clone();
    let app_port = tunnel
        .as_ref()
        .and_then(|t| t.port)
        .filter(|p| *p != 0)
        .unwrap_or(target_port);
    // What the tunnel was asked for, as the PROXY header's destination: the authority,
    // or for a hostname a VIP of the service, our network's first, IPv4 first (then the
    // local IP, when the service has no VIP at all).
    let tunnel_target = match &request.authority {
        Authority::Addr(addr) => SocketAddr::new(canonical_ip(addr.ip()), addr.port()),
        Authority::Host { port, .. } => {
            let vips: Vec<_> = dst_service.iter().flat_map(|s| s.vips.iter()).collect();
            let ip = vips
                .iter()
                .min_by_key(|v| (v.network != input.cfg.network, !v.address.is_ipv4()))
                .map_or(local_ip, |v| v.address);
            SocketAddr::new(ip, *port)
        }
    };
    let client = canonical_ip(input.peer.ip());
    let mut plan = admit(
        state,
        input.cfg,
        SocketAddr::new(local_ip, app_port),
        client,
        input.peer_identity.cloned(),
        dst_workload,
        dst_service,
        input.source_policy,
        input.rbac,
    );
    if tunnel.is_some_and(|t| t.protocol == AppTunnelProtocol::Proxy) {
        let peer = SocketAddr::new(client, input.peer.port());
        let id = input.peer_identity.map(|i| i.to_string());
        let header = proxy_protocol::encode(peer, tunnel_target, id.as_deref()).map_err(|e| {
            Error::BadRequest(Rejection::new(StatusCode::BAD_REQUEST, e.to_string()))
        })?;
        plan.proxy_header = Some(header);
        if input.cfg.localhost_app_tunnel {
            let lo: IpAddr = if local_ip.is_ipv4() {
                Ipv4Addr::LOCALHOST.into()
            } else {
                Ipv6Addr::LOCALHOST.into()
            };
            // The real source travels in the header; loopback is never spoofed.
            plan.connect = SocketAddr::new(lo, app_port);
            plan.source = None;
        }
    }
    plan.authority = Some(request.authority.to_string());
    Ok(plan)
}

/// Whether a CONNECT that arrived on `local_ip` may ask for `requested` (reference §2.1,
/// server step 4): its own IP; any IP when the local workload takes an application
/// tunnel; or an IP whose service or workload has this workload as its waypoint (the
/// sandwich). Anything else is refused: the client meant another pod.
pub fn may_tunnel_to(
    state: &ProxyState,
    cfg: &ProxyConfig,
    local: &Workload,
    local_ip: IpAddr,
    requested: IpAddr,
) -> bool {
    requested == local_ip
        || local.application_tunnel.is_some()
        || is_waypoint_for(state, &cfg.network, requested, local)
}

/// Decides what a captured plaintext connection reaches: only our own workload, always
/// through its policies, with no identity to offer them.
pub fn plan_plaintext(
    state: &ProxyState,
    input: &PlaintextConnection<'_>,
) -> Result<InboundPlan, Error> {
    let dst = SocketAddr::new(
        canonical_ip(input.original_dst.ip()),
        input.original_dst.port(),
    );
    if is_loop_port(input.cfg, dst.port()) {
        return Err(Error::SelfCall { port: dst.port() });
    }
    // An address we cannot attribute is refused, never forwarded unchecked.
    let dst_workload = input.local.serving(state, dst.ip())?;
    Ok(admit(
        state,
        input.cfg,
        dst,
        canonical_ip(input.peer.ip()),
        None,
        dst_workload,
        None,
        input.source_policy,
        input.rbac,
    ))
}

#[allow(clippy::too_many_arguments)]
fn admit(
    state: &ProxyState,
    cfg: &ProxyConfig,
    target: SocketAddr,
    client: IpAddr,
    client_identity: Option<SpiffeId>,
    dst_workload: Arc<Workload>,
    dst_service: Option<Arc<Service>>,
    source_policy: SourcePolicy,
    rbac: &dyn RbacObserver,
) -> InboundPlan {
    let ctx = RbacContext {
        source_identity: client_identity,
        source_ip: client,
        destination: target,
    };
    let verdict = state
        .authorize(&ctx, &dst_workload, rbac)
        .map_err(Error::Denied);
    InboundPlan {
        rbac: ctx,
        policy_generation: state.policy_generation(),
        target,
        connect: target,
        proxy_header: None,
        source: source_policy.source_for(client, target.ip()),
        src_workload: state.workload_by_ip(&cfg.network, client),
        dst_workload,
        dst_service,
        authority: None,
        verdict,
    }
}

/// A hostname authority: the workload must back that service; the service port maps to
/// the endpoint's port first, then to the service's target port.
fn resolve_hostname_port(
    state: &ProxyState,
    workload: &Workload,
    host: &str,
    port: u16,
) -> Option<(u16, Arc<Service>)> {
    let (key, service) = state.workload_service_by_hostname(workload, host)?;
    let ports = workload.services.get(key)?;
    let target = ports
        .get(&port)
        .copied()
        .filter(|p| *p != 0)
        .or_else(|| service.ports.get(&port).copied().filter(|p| *p != 0))?;
    Some((target, service))
}

/// The service the client meant, for telemetry, guessed as ztunnel guesses it: the
/// `forwarded` host when it is one of the workload's services, else the first of them
/// (by `namespace/hostname`) with a port that leads to `target_port`, directly or through
/// the workload's mapping of a named port.
fn intended_service(
    state: &ProxyState,
    workload: &Workload,
    forwarded_host: Option<&str>,
    target_port: u16,
) -> Option<Arc<Service>> {
    if let Some((_, service)) =
        forwarded_host.and_then(|host| state.workload_service_by_hostname(workload, host))
    {
        return Some(service);
    }
    workload.services.iter().find_map(|(key, endpoint_ports)| {
        let service = state.service_by_key(key)?;
        let leads_there = service.ports.iter().any(|(service_port, port)| {
            *port == target_port || endpoint_ports.get(service_port) == Some(&target_port)
        });
        leads_there.then_some(service)
    })
}

#[cfg(test)]
mod tests {
    use super::super::testing::{identity, mesh};
    use super::*;
    use crate::settings::OriginalSource;

    const SERVER_IP: &str = "10.0.0.2";

    fn auto() -> SourcePolicy {
        SourcePolicy {
            original_source: OriginalSource::Auto,
            transparent: true,
            spoof_by_default: true,
        }
    }

    fn connect(authority: &str, headers: &[(&str, &str)]) -> http::request::Parts {
        let mut b = http::Request::builder()
            .method(http::Method::CONNECT)
            .uri(authority);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(()).unwrap().into_parts().0
    }

    fn spiffe(ns: &str, sa: &str) -> SpiffeId {
        SpiffeId::new("cluster.local", ns, sa).unwrap()
    }

    fn hbone(
        request: &http::request::Parts,
        peer: &str,
        peer_identity: Option<&SpiffeId>,
    ) -> Result<InboundPlan, Error> {
        let state = mesh();
        let cfg = ProxyConfig::default();
        let id = identity("server", "server");
        plan_hbone(
            &state,
            &HboneRequest {
                cfg: &cfg,
                local: Local {
                    identity: &id,
                    node: None,
                },
                request,
                peer: format!("{peer}:45000").parse().unwrap(),
                arrived_on: format!("{SERVER_IP}:15008").parse().unwrap(),
                peer_identity,
                source_policy: auto(),
                rbac: &ambit_state::Unobserved,
            },
        )
    }

    /// An outcome in one line: the early refusal and its status, or the target, the
    /// source address, the service and the verdict.
    fn show(r: Result<InboundPlan, Error>) -> String {
        match r {
            Err(e) => format!("{} {e}", e.hbone_status().as_u16()),
            Ok(p) => format!(
                "{} from {} service={} -> {}",
                p.target,
                p.source.map_or("proxy".into(), |s| s.ip.to_string()),
                p.dst_service.map_or("-".into(), |s| s.name.clone()),
                match p.verdict {
                    Ok(()) => "allow".to_string(),
                    Err(e) => format!("{} {e}", e.hbone_status().as_u16()),
                }
            ),
        }
    }

    #[test]
    fn every_branch_of_the_hbone_decision() {
        let client = spiffe("shop", "client");
        let legacy = spiffe("legacy", "old");
        let post = {
            let mut r = connect("10.0.0.2:8080", &[]);
            r.method = http::Method::POST;
            r
        };
        let table: Vec<(&str, http::request::Parts, &str, Option<&SpiffeId>, &str)> = vec![
            (
                "an allowed CONNECT to the app",
                connect("10.0.0.2:8080", &[]),
                "10.0.0.1",
                Some(&client),
                "10.0.0.2:8080 from 10.0.0.1 service=api -> allow",
            ),
            (
                "the forwarded host names the service",
                connect(
                    "10.0.0.2:8080",
                    &[(
                        "forwarded",
                        "for=\"10.0.0.1:1\";host=web.shop.svc.cluster.local",
                    )],
                ),
                "10.0.0.1",
                Some(&client),
                "10.0.0.2:8080 from 10.0.0.1 service=web -> allow",
            ),
            (
                "a hostname authority maps the service port",
                connect("web.shop.svc.cluster.local:443", &[]),
                "10.0.0.1",
                Some(&client),
                "10.0.0.2:8443 from 10.0.0.1 service=web -> allow",
            ),
            (
                "a hostname whose service port does not exist",
                connect("web.shop.svc.cluster.local:8080", &[]),
                "10.0.0.1",
                Some(&client),
                "503 cannot resolve port 8080 of web.shop.svc.cluster.local on server",
            ),
            (
                "a hostname the workload does not back",
                connect("other.shop.svc.cluster.local:80", &[]),
                "10.0.0.1",
                Some(&client),
                "503 cannot resolve port 80 of other.shop.svc.cluster.local on server",
            ),
            (
                "not CONNECT",
                post,
                "10.0.0.1",
                Some(&client),
                "400 method POST is not CONNECT",
            ),
            (
                "another workload's IP",
                connect("10.0.0.3:8080", &[]),
                "10.0.0.1",
                Some(&client),
                "400 ip mismatch: 10.0.0.2 != 10.0.0.3",
            ),
            (
                "one of the proxy's own ports",
                connect("10.0.0.2:15006", &[]),
                "10.0.0.1",
                Some(&client),
                "503 refusing connection to the proxy's own port 15006",
            ),
            (
                "denied by namespace",
                connect("10.0.0.2:8080", &[]),
                "10.0.0.1",
                Some(&legacy),
                "10.0.0.2:8080 from 10.0.0.1 service=api -> 401 connection closed due to \
                 policy rejection: explicitly denied by: shop/deny-legacy",
            ),
            (
                "denied by port",
                connect("10.0.0.2:7000", &[]),
                "10.0.0.1",
                Some(&client),
                "10.0.0.2:7000 from 10.0.0.1 service=- -> 401 connection closed due to \
                 policy rejection: explicitly denied by: shop/app-ports-only",
            ),
            (
                "a workload calling itself keeps the proxy's address",
                connect("10.0.0.2:8080", &[]),
                "10.0.0.2",
                Some(&client),
                "10.0.0.2:8080 from proxy service=api -> allow",
            ),
        ];
        for (what, request, peer, identity, want) in table {
            let got = show(hbone(&request, peer, identity));
            // The validator's own wording is its concern; only the status is ours here.
            if want.starts_with("400 method") {
                assert!(got.starts_with("400 "), "{what}: {got}");
                continue;
            }
            assert_eq!(got, want, "{what}");
        }
    }

    /// A CONNECT to a local workload other than `server`, arriving on `arrived_on`.
    fn hbone_to(
        cfg: &ProxyConfig,
        local: (&str, &str),
        arrived_on: &str,
        authority: &str,
        peer: &str,
    ) -> Result<InboundPlan, Error> {
        let state = mesh();
        let id = identity(local.0, local.1);
        let client = spiffe("shop", "client");
        let request = connect(authority, &[]);
        plan_hbone(
            &state,
            &HboneRequest {
                cfg,
                local: Local {
                    identity: &id,
                    node: None,
                },
                request: &request,
                peer: peer.parse().unwrap(),
                arrived_on: arrived_on.parse().unwrap(),
                peer_identity: Some(&client),
                source_policy: auto(),
                rbac: &ambit_state::Unobserved,
            },
        )
    }

    #[test]
    fn an_authority_for_another_ip_only_for_our_own_waypoint_or_an_app_tunnel() {
        let cfg = ProxyConfig::default();
        let waypoint = ("waypoint", "waypoint");
        // Accepted ones are still authorized, on the local IP and the port reached: the
        // shop namespace allows only its app ports (8080, 8443, 9090).
        let denied = "401 connection closed due to policy rejection: explicitly denied by: \
                      shop/app-ports-only";
        // (what, local workload name and service account, arrived on, authority, outcome)
        type Row<'a> = (&'a str, (&'a str, &'a str), &'a str, &'a str, String);
        let table: &[Row] = &[
            (
                "the waypoint of a service: the service's VIP",
                waypoint,
                "10.0.9.9:15008",
                "10.96.0.14:80",
                format!("10.0.9.9:80 from 10.0.0.1 service=- -> {denied}"),
            ),
            (
                "the waypoint of a workload: its pod IP",
                waypoint,
                "10.0.9.9:15008",
                "10.0.0.4:8080",
                "10.0.9.9:8080 from 10.0.0.1 service=- -> allow".into(),
            ),
            (
                "the waypoint asked for a pod it does not serve",
                waypoint,
                "10.0.9.9:15008",
                "10.0.0.2:8080",
                "400 ip mismatch: 10.0.9.9 != 10.0.0.2".into(),
            ),
            (
                "a pod asked for a workload whose waypoint is another pod",
                ("server", "server"),
                "10.0.0.2:15008",
                "10.0.0.4:8080",
                "400 ip mismatch: 10.0.0.2 != 10.0.0.4".into(),
            ),
            (
                "a pod asked for a VIP whose waypoint is another pod",
                ("server", "server"),
                "10.0.0.2:15008",
                "10.96.0.14:80",
                "400 ip mismatch: 10.0.0.2 != 10.96.0.14".into(),
            ),
            (
                "an application tunnel takes any authority, on its own port",
                ("tunnel", "tunnel"),
                "10.0.0.6:15008",
                "10.96.0.10:80",
                format!("10.0.0.6:15088 from proxy service=- -> {denied}"),
            ),
        ];
        for (what, local, arrived, authority, want) in table {
            let got = show(hbone_to(&cfg, *local, arrived, authority, "10.0.0.1:45000"));
            assert_eq!(&got, want, "{what}");
        }
    }

    #[test]
    fn a_proxy_application_tunnel_gets_the_header_on_loopback_by_default() {
        let on = ProxyConfig::default();
        let p = hbone_to(
            &on,
            ("tunnel", "tunnel"),
            "10.0.0.6:15008",
            "10.96.0.10:80",
            "10.0.0.1:45000",
        )
        .unwrap();
        assert_eq!(p.target, "10.0.0.6:15088".parse().unwrap());
        assert_eq!(p.connect, "127.0.0.1:15088".parse().unwrap());
        assert!(p.source.is_none(), "loopback is never spoofed");
        let want = crate::proxy_protocol::encode(
            "10.0.0.1:45000".parse().unwrap(),
            "10.96.0.10:80".parse().unwrap(),
            Some("spiffe://cluster.local/ns/shop/sa/client"),
        )
        .unwrap();
        assert_eq!(p.proxy_header.as_deref(), Some(want.as_slice()));
        // A hostname authority: the header names a VIP of the service, one of our network
        // before another network's, IPv4 before IPv6; with only another network's VIP,
        // that one rather than the pod's own address.
        for (authority, named) in [
            ("tun.shop.svc.cluster.local:80", "10.96.0.97:80"),
            ("tunfar.shop.svc.cluster.local:80", "10.97.0.2:80"),
        ] {
            let p = hbone_to(
                &on,
                ("tunnel", "tunnel"),
                "10.0.0.6:15008",
                authority,
                "10.0.0.1:45000",
            )
            .unwrap();
            let want = crate::proxy_protocol::encode(
                "10.0.0.1:45000".parse().unwrap(),
                named.parse().unwrap(),
                Some("spiffe://cluster.local/ns/shop/sa/client"),
            )
            .unwrap();
            assert_eq!(
                p.proxy_header.as_deref(),
                Some(want.as_slice()),
                "{authority}"
            );
        }
        // IPv6 arrival: IPv6 loopback.
        let p = hbone_to(
            &on,
            ("tunnel", "tunnel"),
            "[fd00::6]:15008",
            "[fd00::6]:80",
            "[fd00::1]:45000",
        )
        .unwrap();
        assert_eq!(p.connect, "[::1]:15088".parse().unwrap());
        // LOCALHOST_APP_TUNNEL=false: the pod IP, spoofed as any inbound.
        let off = ProxyConfig {
            localhost_app_tunnel: false,
            ..ProxyConfig::default()
        };
        let p = hbone_to(
            &off,
            ("tunnel", "tunnel"),
            "10.0.0.6:15008",
            "10.0.0.6:80",
            "10.0.0.1:45000",
        )
        .unwrap();
        assert_eq!(p.connect, "10.0.0.6:15088".parse().unwrap());
        assert_eq!(p.source.map(|s| s.ip), Some("10.0.0.1".parse().unwrap()));
        assert!(p.proxy_header.is_some());
        // No tunnel: no header, the pod IP.
        let p = hbone_to(
            &on,
            ("server", "server"),
            "10.0.0.2:15008",
            "10.0.0.2:8080",
            "10.0.0.1:45000",
        )
        .unwrap();
        assert_eq!(p.connect, p.target);
        assert!(p.proxy_header.is_none());
    }

    #[test]
    fn in_dedicated_mode_the_stats_and_readiness_ports_are_never_reached() {
        let state = mesh();
        let cfg = ProxyConfig {
            reserved_ports: vec![15020, 15021],
            ..ProxyConfig::default()
        };
        let id = identity("server", "server");
        let client = spiffe("shop", "client");
        let local = Local {
            identity: &id,
            node: None,
        };
        for port in [15020, 15021] {
            let request = connect(&format!("10.0.0.2:{port}"), &[]);
            let tunnelled = plan_hbone(
                &state,
                &HboneRequest {
                    cfg: &cfg,
                    local,
                    request: &request,
                    peer: "10.0.0.1:45000".parse().unwrap(),
                    arrived_on: format!("{SERVER_IP}:15008").parse().unwrap(),
                    peer_identity: Some(&client),
                    source_policy: auto(),
                    rbac: &ambit_state::Unobserved,
                },
            );
            assert_eq!(
                show(tunnelled),
                format!("503 refusing connection to the proxy's own port {port}")
            );
            let captured = plan_plaintext(
                &state,
                &PlaintextConnection {
                    cfg: &cfg,
                    local,
                    peer: "192.0.2.9:50000".parse().unwrap(),
                    original_dst: format!("10.0.0.2:{port}").parse().unwrap(),
                    source_policy: auto(),
                    rbac: &ambit_state::Unobserved,
                },
            );
            assert_eq!(
                show(captured),
                format!("503 refusing connection to the proxy's own port {port}")
            );
        }
        // Without them reserved (in-pod mode, where they live in the node's netns) the
        // same port of the workload is an ordinary one.
        let request = connect("10.0.0.2:15020", &[]);
        let plain = ProxyConfig::default();
        assert!(plan_hbone(
            &state,
            &HboneRequest {
                cfg: &plain,
                local,
                request: &request,
                peer: "10.0.0.1:45000".parse().unwrap(),
                arrived_on: format!("{SERVER_IP}:15008").parse().unwrap(),
                peer_identity: Some(&client),
                source_policy: auto(),
                rbac: &ambit_state::Unobserved,
            },
        )
        .is_ok());
    }

    #[test]
    fn a_mapped_address_is_the_ipv4_one() {
        // A `[::]` listener sees IPv4 clients as ::ffff:a.b.c.d.
        let state = mesh();
        let cfg = ProxyConfig::default();
        let id = identity("server", "server");
        let request = connect("10.0.0.2:8080", &[]);
        let plan = plan_hbone(
            &state,
            &HboneRequest {
                cfg: &cfg,
                local: Local {
                    identity: &id,
                    node: None,
                },
                request: &request,
                peer: "[::ffff:10.0.0.1]:45000".parse().unwrap(),
                arrived_on: "[::ffff:10.0.0.2]:15008".parse().unwrap(),
                peer_identity: None,
                source_policy: auto(),
                rbac: &ambit_state::Unobserved,
            },
        )
        .unwrap();
        assert_eq!(plan.target, "10.0.0.2:8080".parse().unwrap());
        assert_eq!(
            plan.src_workload.map(|w| w.uid.clone()).as_deref(),
            Some("c1")
        );
    }

    #[test]
    fn a_plaintext_connection_reaches_only_our_workload_through_policy() {
        let state = mesh();
        let cfg = ProxyConfig::default();
        let id = identity("server", "server");
        let run = |dst: &str| {
            show(plan_plaintext(
                &state,
                &PlaintextConnection {
                    cfg: &cfg,
                    local: Local {
                        identity: &id,
                        node: None,
                    },
                    peer: "192.0.2.9:50000".parse().unwrap(),
                    original_dst: dst.parse().unwrap(),
                    source_policy: auto(),
                    rbac: &ambit_state::Unobserved,
                },
            ))
        };
        assert_eq!(
            run("10.0.0.2:8080"),
            "10.0.0.2:8080 from 192.0.2.9 service=- -> allow"
        );
        assert_eq!(
            run("10.0.0.2:7000"),
            "10.0.0.2:7000 from 192.0.2.9 service=- -> 401 connection closed due to policy \
             rejection: explicitly denied by: shop/app-ports-only"
        );
        assert_eq!(
            run("10.0.0.3:8080"),
            "503 10.0.0.3 is not an address of workload shop/server"
        );
        assert_eq!(
            run("10.0.0.2:15008"),
            "503 refusing connection to the proxy's own port 15008"
        );
    }

    /// Two proxies in one process (as the pods of a node's shared mode are, or a node proxy
    /// beside a waypoint), each with its own registry: the dry-run policies their
    /// decisions match are counted by each in its own, HBONE and plaintext alike.
    #[test]
    fn two_proxies_in_one_process_each_count_their_own_dry_runs() {
        use crate::dry_run::DryRunMatches;
        use prometheus_client::registry::Registry;

        let mut state = mesh();
        let dry = ambit_state::parse_local_config(
            "t",
            "policies:\n- {name: audit, namespace: shop, scope: Namespace, action: Deny, dryRun: true, rules: [[]]}\n",
        )
        .unwrap();
        for p in dry.policies {
            state.insert_policy(p).unwrap();
        }
        let cfg = ProxyConfig::default();
        let id = identity("server", "server");
        let local = Local {
            identity: &id,
            node: None,
        };
        let client = spiffe("shop", "client");
        let request = connect("10.0.0.2:8080", &[]);
        let (mut registry_a, mut registry_b) = (Registry::default(), Registry::default());
        let a = DryRunMatches::register(&mut registry_a);
        let b = DryRunMatches::register(&mut registry_b);
        let hbone = |rbac: &DryRunMatches| {
            plan_hbone(
                &state,
                &HboneRequest {
                    cfg: &cfg,
                    local,
                    request: &request,
                    peer: "10.0.0.1:45000".parse().unwrap(),
                    arrived_on: format!("{SERVER_IP}:15008").parse().unwrap(),
                    peer_identity: Some(&client),
                    source_policy: auto(),
                    rbac,
                },
            )
        };
        let plaintext = |rbac: &DryRunMatches| {
            plan_plaintext(
                &state,
                &PlaintextConnection {
                    cfg: &cfg,
                    local,
                    peer: "192.0.2.9:50000".parse().unwrap(),
                    original_dst: "10.0.0.2:8080".parse().unwrap(),
                    source_policy: auto(),
                    rbac,
                },
            )
        };
        // Not enforced: both allowed.
        assert!(hbone(&a).unwrap().verdict.is_ok());
        assert!(hbone(&a).unwrap().verdict.is_ok());
        assert!(plaintext(&a).unwrap().verdict.is_ok());
        assert!(hbone(&b).unwrap().verdict.is_ok());
        let count = |r: &Registry| {
            let mut out = String::new();
            prometheus_client::encoding::text::encode(&mut out, r).unwrap();
            out.lines()
                .filter(|l| l.starts_with("ambit_rbac_dry_run_matches_total{"))
                .map(str::to_string)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            count(&registry_a),
            ["ambit_rbac_dry_run_matches_total{policy=\"shop/audit\",action=\"DENY\"} 3"]
        );
        assert_eq!(
            count(&registry_b),
            ["ambit_rbac_dry_run_matches_total{policy=\"shop/audit\",action=\"DENY\"} 1"]
        );
    }

    #[test]
    fn the_intended_service_is_guessed_as_ztunnel_guesses_it() {
        let state = mesh();
        let server = state
            .workload_by_ip("", SERVER_IP.parse().unwrap())
            .unwrap();
        let guess = |host: Option<&str>, port: u16| {
            intended_service(&state, &server, host, port).map(|s| s.name.clone())
        };
        assert_eq!(
            guess(Some("web.shop.svc.cluster.local"), 8080).as_deref(),
            Some("web")
        );
        // A service the workload is not part of is not believed.
        assert_eq!(
            guess(Some("other.shop.svc.cluster.local"), 8080).as_deref(),
            Some("api")
        );
        // A hostname two namespaces use names the service this workload backs.
        assert_eq!(
            guess(Some("shared.example.com"), 8080).as_deref(),
            Some("shared-shop")
        );
        assert_eq!(guess(None, 8080).as_deref(), Some("api"));
        assert_eq!(guess(None, 8443).as_deref(), Some("web"));
        // A named port (target 0) resolves through the workload's own mapping.
        assert_eq!(guess(None, 9090).as_deref(), Some("admin"));
        assert_eq!(guess(None, 7000), None);
    }

    #[test]
    fn a_hostname_authority_resolves_to_the_service_the_workload_backs() {
        let state = mesh();
        let server = state
            .workload_by_ip("", SERVER_IP.parse().unwrap())
            .unwrap();
        let resolve = |host: &str, port: u16| {
            resolve_hostname_port(&state, &server, host, port).map(|(p, s)| (p, s.name.clone()))
        };
        assert_eq!(
            resolve("shared.example.com", 80),
            Some((8080, "shared-shop".into()))
        );
        assert_eq!(
            resolve("web.shop.svc.cluster.local", 443),
            Some((8443, "web".into()))
        );
        assert_eq!(resolve("other.shop.svc.cluster.local", 80), None);
        assert_eq!(resolve("web.shop.svc.cluster.local", 8080), None);
    }
}
