//! Inbound HBONE (15008): mTLS-terminated CONNECT streams, validated, authorized and
//! forwarded to the local workload.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, OnceLock};

use ambit_identity::SpiffeId;

use ambit_hbone::headers::Authority;
use ambit_hbone::request::validate;
use ambit_hbone::server::IncomingConnect;
use ambit_state::{ProxyState, RbacContext, Service, Workload};
use http::StatusCode;

use crate::config::OriginalSource;
use crate::connections::{Connection, Direction, Protocol};
use crate::copy::{proxy_tunnel, TunnelSide};
use crate::drain::DrainWatcher;
use crate::inputs::ProxyInputs;
use crate::metrics::Reporter;
use crate::outbound::baggage_of;
use crate::socket::{self, Spoof};
use crate::telemetry::{ConnectionResult, Endpoints, ResponseFlag};

/// Handles one CONNECT stream. Status codes follow ztunnel: 400 malformed or aimed at
/// another IP, 503 unknown workload / unresolvable or loop port / upstream refused,
/// 401 denied by policy, 200 only once the upstream connection exists.
pub(crate) async fn handle_connect(
    pi: Arc<ProxyInputs>,
    incoming: IncomingConnect,
    drain: DrainWatcher,
    transparent: bool,
    peer_identity: Arc<OnceLock<Option<SpiffeId>>>,
) {
    let peer = incoming.peer().clone();
    let src = socket::canonical(peer.addr);
    let local_ip = socket::canonical_ip(peer.local_addr.ip());
    // The HBONE listener the connection arrived on: what ztunnel logs as `dst.addr`.
    let listener = SocketAddr::new(local_ip, peer.local_addr.port());
    let reject = |incoming: IncomingConnect, status: StatusCode, reason: String| {
        crate::telemetry::early_failure(Reporter::Destination, src, Some(listener), reason);
        incoming.reject(status);
    };
    let request = match validate(incoming.request()) {
        Ok(r) => r,
        Err(rejection) => return reject(incoming, rejection.status, rejection.reason),
    };
    let state = pi.state.get();
    let dst_workload = match pi.serving_workload(&state, local_ip) {
        Ok(w) => w,
        Err(e) => return reject(incoming, StatusCode::SERVICE_UNAVAILABLE, e),
    };
    let (target_port, hostname_service) = match &request.authority {
        Authority::Addr(addr) => {
            let requested = socket::canonical_ip(addr.ip());
            if requested != local_ip {
                return reject(
                    incoming,
                    StatusCode::BAD_REQUEST,
                    format!("ip mismatch: {local_ip} != {requested}"),
                );
            }
            (addr.port(), None)
        }
        Authority::Host { host, port } => {
            match resolve_hostname_port(&state, &dst_workload, host, *port) {
                Some((target, svc)) => (target, Some(svc)),
                None => {
                    return reject(
                        incoming,
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!(
                            "cannot resolve port {port} of {host} on {}",
                            dst_workload.name
                        ),
                    )
                }
            }
        }
    };
    if pi.cfg.loop_ports().contains(&target_port) {
        return reject(
            incoming,
            StatusCode::SERVICE_UNAVAILABLE,
            format!("refusing connection to the proxy's own port {target_port}"),
        );
    }
    let target = SocketAddr::new(local_ip, target_port);
    let src_identity = peer_identity
        .get_or_init(|| ambit_identity::tls::peer_identity(Some(&peer.certificates)))
        .clone();
    let src_workload = state.workload_by_ip(&pi.cfg.network, src.ip());
    let dst_service = hostname_service.or_else(|| {
        intended_service(
            &state,
            &dst_workload,
            request.forwarded_host.as_deref(),
            target_port,
        )
    });
    let mut result = ConnectionResult::open(
        &pi.metrics,
        Reporter::Destination,
        Endpoints {
            src_addr: Some(src),
            src_workload,
            src_identity: src_identity.clone(),
            dst_addr: Some(listener),
            dst_hbone_addr: Some(request.authority.to_string()),
            dst_identity: Some(dst_workload.identity()),
            dst_workload: Some(dst_workload.clone()),
            dst_service,
            mtls: true,
        },
    );
    result.track(
        &pi.connections,
        Direction::Inbound,
        Connection::new(src, None, target, Protocol::Hbone),
    );
    let ctx = RbacContext {
        source_identity: src_identity,
        source_ip: src.ip(),
        destination: target,
    };
    if let Err(denied) = state.authorize(&ctx, &dst_workload) {
        incoming.reject(StatusCode::UNAUTHORIZED);
        return result.finish(Err((
            ResponseFlag::Deny,
            format!("connection closed due to policy rejection: {denied}"),
        )));
    }
    drop(state);
    let source = spoof_source(&pi, transparent, src.ip(), local_ip);
    let upstream = match socket::connect(&*pi.sockets, &pi.cfg, target, source).await {
        Ok(s) => s,
        Err(e) => {
            incoming.reject(StatusCode::SERVICE_UNAVAILABLE);
            return result.finish(Err((
                ResponseFlag::Connect,
                format!("connect to {target}: {e}"),
            )));
        }
    };
    let mut headers = http::HeaderMap::new();
    if pi.cfg.response_baggage {
        if let Ok(v) = http::HeaderValue::from_str(&baggage_of(&dst_workload).to_header_value()) {
            headers.insert("baggage", v);
        }
    }
    let mut tunnel = match incoming.accept(headers) {
        Ok(t) => t,
        Err(e) => {
            return result.finish(Err((ResponseFlag::None, format!("client went away: {e}"))))
        }
    };
    let outcome = proxy_tunnel(&result, &mut tunnel, upstream, TunnelSide::Client, &drain).await;
    result.finish(outcome);
}

/// Which source address the connection to the app uses: the client's own IP when the
/// listener is transparent and original-source preservation is on, else our own.
pub(crate) fn spoof_source(
    pi: &ProxyInputs,
    transparent: bool,
    client: IpAddr,
    local: IpAddr,
) -> Option<Spoof> {
    let wanted = match pi.cfg.original_source {
        OriginalSource::Off => false,
        OriginalSource::Required => true,
        OriginalSource::Auto => transparent && pi.spoof_by_default,
    };
    // Hairpin (a workload calling itself) keeps our address.
    (wanted && client != local).then_some(Spoof {
        ip: client,
        required: pi.cfg.original_source == OriginalSource::Required,
    })
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
    use super::*;

    const MESH: &str = r#"
workloads:
- uid: s1
  name: server
  namespace: shop
  serviceAccount: server
  workloadIps: [10.0.0.2]
  protocol: HBONE
  services:
    shop/admin.shop.svc.cluster.local: {9000: 9090}
    shop/api.shop.svc.cluster.local: {80: 8080}
    shop/web.shop.svc.cluster.local: {80: 8080, 443: 8443}
    shop/shared.example.com: {80: 8080}
services:
- name: shared-legacy
  namespace: legacy
  hostname: shared.example.com
  vips: ["/10.96.0.20"]
  ports: {80: 8080}
- name: shared-shop
  namespace: shop
  hostname: shared.example.com
  vips: ["/10.96.0.21"]
  ports: {80: 8080}
- name: admin
  namespace: shop
  hostname: admin.shop.svc.cluster.local
  vips: ["/10.96.0.9"]
  ports: {9000: 0}
- name: api
  namespace: shop
  hostname: api.shop.svc.cluster.local
  vips: ["/10.96.0.10"]
  ports: {80: 8080}
- name: web
  namespace: shop
  hostname: web.shop.svc.cluster.local
  vips: ["/10.96.0.11"]
  ports: {80: 8080, 443: 8443}
- name: other
  namespace: shop
  hostname: other.shop.svc.cluster.local
  vips: ["/10.96.0.12"]
  ports: {80: 8080}
"#;

    fn mesh() -> (ProxyState, Arc<Workload>) {
        let cfg = ambit_state::parse_local_config("test", MESH).unwrap();
        let state = ProxyState::from_config(cfg).unwrap();
        let server = state
            .workload_by_ip("", "10.0.0.2".parse().unwrap())
            .unwrap();
        (state, server)
    }

    fn guess(host: Option<&str>, port: u16) -> Option<String> {
        let (state, server) = mesh();
        intended_service(&state, &server, host, port).map(|s| s.name.clone())
    }

    #[test]
    fn a_hostname_authority_resolves_to_the_service_the_workload_backs() {
        let (state, server) = mesh();
        let resolve = |host: &str, port: u16| {
            resolve_hostname_port(&state, &server, host, port).map(|(p, s)| (p, s.name.clone()))
        };
        // Two namespaces use this hostname; only shop's has the workload as an endpoint.
        assert_eq!(
            resolve("shared.example.com", 80),
            Some((8080, "shared-shop".to_string()))
        );
        assert_eq!(
            resolve("web.shop.svc.cluster.local", 443),
            Some((8443, "web".to_string()))
        );
        // Not one of the workload's services, or no such port: refused.
        assert_eq!(resolve("other.shop.svc.cluster.local", 80), None);
        assert_eq!(resolve("web.shop.svc.cluster.local", 8080), None);
    }

    #[test]
    fn the_forwarded_host_wins_when_it_is_one_of_the_workloads_services() {
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
    }

    #[test]
    fn without_a_host_the_first_service_leading_to_the_port_is_taken() {
        assert_eq!(guess(None, 8080).as_deref(), Some("api"));
        assert_eq!(guess(None, 8443).as_deref(), Some("web"));
        // A named port (target 0) resolves through the workload's own mapping.
        assert_eq!(guess(None, 9090).as_deref(), Some("admin"));
        assert_eq!(guess(None, 7000), None);
    }
}
