//! Picking an endpoint of a service for a connection (reference §10.3): health, network,
//! target port, address family, locality, then capacity-weighted at random.

use std::net::IpAddr;
use std::sync::Arc;

use rand::Rng;

use super::types::RouteError;
use crate::ports::PortMap;
use crate::service::{LoadBalancerHealthPolicy, LoadBalancerMode, LoadBalancerScope, Service};
use crate::store::ProxyState;
use crate::workload::{HealthStatus, Workload};

/// An endpoint chosen for a connection: the workload, the IP to dial and the (translated)
/// target port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Picked {
    pub workload: Arc<Workload>,
    pub ip: IpAddr,
    pub port: u16,
}

/// What the endpoint is picked for (reference §10.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PickMode {
    /// A service the application dialed: the service must define the port.
    Standard,
    /// A waypoint service: the port may be absent when the endpoint has an application
    /// tunnel (then the service port itself is used).
    Waypoint,
}

/// How many weighted draws over all endpoints are tried before the exact scan.
const DRAWS: usize = 8;

/// Picks an endpoint of `svc` for a connection to `dialed_ip:port` from `source`, by the
/// rules of reference §10.3: health (unless `AllowAll`), the source's network, the target
/// port (endpoint map, then the service's target port, then an application tunnel's
/// service port), an IP the service's families allow (the dialed family first); with
/// STRICT/FAILOVER the best-ranked locality; then at random weighted by capacity.
///
/// Standard mode without locality preferences draws from all endpoints by capacity and
/// keeps the first eligible draw (O(log n) each); after a few ineligible ones it scans
/// all endpoints. Either way the result is distributed exactly as the scan alone.
/// Does not look at waypoints or PASSTHROUGH: the caller decides those.
pub fn pick_endpoint(
    state: &ProxyState,
    svc: &Service,
    port: u16,
    dialed_ip: IpAddr,
    source: &Workload,
    mode: PickMode,
    rng: &mut impl Rng,
) -> Result<Picked, RouteError> {
    let eligible = Eligibility::new(svc, port, dialed_ip, source, mode, false)?;
    pick_eligible(state, svc, eligible, rng)
}

/// [`pick_endpoint`] for a waypoint: endpoints on sidecars (`LEGACY_ISTIO_MTLS`) are
/// candidates too, reached with Istio mTLS.
pub fn pick_waypoint_endpoint(
    state: &ProxyState,
    svc: &Service,
    port: u16,
    dialed_ip: IpAddr,
    source: &Workload,
    rng: &mut impl Rng,
) -> Result<Picked, RouteError> {
    let eligible = Eligibility::new(svc, port, dialed_ip, source, PickMode::Standard, true)?;
    pick_eligible(state, svc, eligible, rng)
}

fn pick_eligible(
    state: &ProxyState,
    svc: &Service,
    eligible: Eligibility<'_>,
    rng: &mut impl Rng,
) -> Result<Picked, RouteError> {
    let no_upstream = || RouteError::NoHealthyUpstream { service: svc.key() };
    let Some(index) = state.endpoint_index(&eligible.key) else {
        return Err(no_upstream());
    };
    if !eligible.ranked() {
        for _ in 0..DRAWS {
            let Some(i) = index.pick(rng) else { break };
            if let Some(p) = eligible.check(&index.endpoints[i]) {
                return Ok(p);
            }
        }
    }
    pick_weighted(eligible.all(index.endpoints.iter()), rng).ok_or_else(no_upstream)
}

/// Every endpoint [`pick_endpoint`] could pick, in the endpoint index's order (the best
/// locality only, under STRICT or FAILOVER), for a caller that balances by its own rule
/// (a waypoint's DestinationRule). Empty when none is eligible.
pub fn endpoint_candidates(
    state: &ProxyState,
    svc: &Service,
    port: u16,
    dialed_ip: IpAddr,
    source: &Workload,
    mode: PickMode,
) -> Result<Vec<Picked>, RouteError> {
    let eligible = Eligibility::new(svc, port, dialed_ip, source, mode, true)?;
    Ok(match state.endpoint_index(&eligible.key) {
        Some(index) => eligible.all(index.endpoints.iter()),
        None => Vec::new(),
    })
}

/// The endpoints of `svc` known by a hostname only (a ServiceEntry's with `resolution:
/// DNS`), each with its target port, eligible as [`endpoint_candidates`]'s are but for
/// the address, which the caller resolves.
pub fn hostname_candidates(
    state: &ProxyState,
    svc: &Service,
    port: u16,
    source: &Workload,
    mode: PickMode,
) -> Result<Vec<(Arc<Workload>, u16)>, RouteError> {
    let unspecified = IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED);
    let eligible = Eligibility::new(svc, port, unspecified, source, mode, true)?;
    Ok(match state.endpoint_index(&eligible.key) {
        Some(index) => index
            .hostname_only
            .iter()
            .filter_map(|w| eligible.check_but_address(w).map(|port| (w.clone(), port)))
            .collect(),
        None => Vec::new(),
    })
}

/// True when `svc` has endpoints known by a hostname only: the check a caller makes before
/// it looks for its own workload and resolves names (the index holds the list, so this is a
/// lookup, not a scan).
pub fn has_hostname_endpoints(state: &ProxyState, svc: &Service) -> bool {
    state
        .endpoint_index(&svc.key())
        .is_some_and(|index| !index.hostname_only.is_empty())
}

/// What makes an endpoint of one service eligible for one connection.
struct Eligibility<'a> {
    svc: &'a Service,
    key: String,
    port: u16,
    svc_target: u16,
    dialed_ip: IpAddr,
    source: &'a Workload,
    allow_unhealthy: bool,
    /// Whether endpoints on sidecars (`LEGACY_ISTIO_MTLS`) are candidates: a waypoint's.
    sidecars: bool,
}

impl<'a> Eligibility<'a> {
    fn new(
        svc: &'a Service,
        port: u16,
        dialed_ip: IpAddr,
        source: &'a Workload,
        mode: PickMode,
        sidecars: bool,
    ) -> Result<Self, RouteError> {
        let svc_target = match (svc.ports.get(&port), mode) {
            (Some(&t), _) => t,
            (None, PickMode::Waypoint) => 0,
            (None, PickMode::Standard) => {
                return Err(RouteError::UnknownTargetPort {
                    service: svc.key(),
                    port,
                })
            }
        };
        Ok(Eligibility {
            svc,
            key: svc.key(),
            port,
            svc_target,
            dialed_ip,
            source,
            allow_unhealthy: svc.health_policy() == LoadBalancerHealthPolicy::AllowAll,
            sidecars,
        })
    }

    fn ranked(&self) -> bool {
        matches!(
            self.svc.lb_mode(),
            LoadBalancerMode::Strict | LoadBalancerMode::Failover
        )
    }

    /// Every check but the address's: the target port.
    fn check_but_address(&self, wl: &Arc<Workload>) -> Option<u16> {
        let ports = wl.services.get(self.key.as_str())?;
        if !self.allow_unhealthy && wl.status != HealthStatus::Healthy {
            return None;
        }
        if !self.sidecars && wl.protocol == crate::workload::TunnelProtocol::LegacyIstioMtls {
            return None;
        }
        // Endpoints in another network need double HBONE through their network gateway
        // (reference §10.2); not candidates until that exists.
        if wl.network != self.source.network {
            return None;
        }
        target_port(wl, ports, self.port, self.svc_target)
    }

    fn check(&self, wl: &Arc<Workload>) -> Option<Picked> {
        let port = self.check_but_address(wl)?;
        // Endpoints without a usable IP (hostname-only: on-demand DNS; none: network
        // gateway) are not candidates yet.
        let ip = pick_ip(self.svc, wl, self.dialed_ip)?;
        Some(Picked {
            workload: wl.clone(),
            ip,
            port,
        })
    }

    /// The eligible endpoints of `endpoints`; under STRICT or FAILOVER, only those of the
    /// best-ranked locality.
    fn all<'w>(&self, endpoints: impl Iterator<Item = &'w Arc<Workload>>) -> Vec<Picked> {
        let mut candidates: Vec<Picked> = endpoints.filter_map(|w| self.check(w)).collect();
        if self.ranked() {
            let source = self.source;
            let prefs = self
                .svc
                .load_balancer
                .as_ref()
                .map(|lb| lb.routing_preferences.as_slice())
                .unwrap_or_default();
            if self.svc.lb_mode() == LoadBalancerMode::Strict {
                candidates.retain(|c| prefs.iter().all(|s| scope_matches(*s, source, &c.workload)));
            }
            let ranks: Vec<usize> = candidates
                .iter()
                .map(|c| rank(prefs, source, &c.workload))
                .collect();
            if let Some(&best) = ranks.iter().max() {
                let mut i = 0;
                candidates.retain(|_| {
                    let keep = ranks[i] == best;
                    i += 1;
                    keep
                });
            }
        }
        candidates
    }
}

/// Target port for a service port on one endpoint: the endpoint's own map first, then
/// the service's target port, then (application tunnel with a port) the service port.
/// A named port (target 0) needs the endpoint map.
fn target_port(wl: &Workload, ports: &PortMap, svc_port: u16, svc_target: u16) -> Option<u16> {
    if let Some(&p) = ports.get(&svc_port).filter(|p| **p != 0) {
        return Some(p);
    }
    if svc_target != 0 {
        return Some(svc_target);
    }
    match &wl.application_tunnel {
        Some(t) if t.port.is_some_and(|p| p != 0) => Some(svc_port),
        _ => None,
    }
}

/// The endpoint IP to use: allowed by the service's IP families, the dialed family first.
fn pick_ip(svc: &Service, wl: &Workload, dialed: IpAddr) -> Option<IpAddr> {
    let allowed = || wl.workload_ips.iter().filter(|ip| svc.allows_ip(**ip));
    allowed()
        .find(|ip| ip.is_ipv4() == dialed.is_ipv4())
        .or_else(|| allowed().next())
        .copied()
}

fn scope_matches(scope: LoadBalancerScope, src: &Workload, dst: &Workload) -> bool {
    match scope {
        LoadBalancerScope::Region => src.locality.region == dst.locality.region,
        LoadBalancerScope::Zone => src.locality.zone == dst.locality.zone,
        LoadBalancerScope::Subzone => src.locality.subzone == dst.locality.subzone,
        LoadBalancerScope::Node => src.node == dst.node,
        LoadBalancerScope::Cluster => src.cluster_id == dst.cluster_id,
        LoadBalancerScope::Network => src.network == dst.network,
    }
}

/// How many leading routing preferences the endpoint shares with the source. When
/// NETWORK is the first preference, a network match outweighs all later scopes (it adds
/// `len - 1` on top of its own point) and a mismatch does not end the scan.
pub(super) fn rank(prefs: &[LoadBalancerScope], src: &Workload, dst: &Workload) -> usize {
    let mut rank = 0;
    for (i, scope) in prefs.iter().enumerate() {
        let matched = scope_matches(*scope, src, dst);
        if i == 0 && *scope == LoadBalancerScope::Network {
            if matched {
                rank += prefs.len();
            }
            continue;
        }
        if !matched {
            break;
        }
        rank += 1;
    }
    rank
}

/// Picks one candidate at random, weighted by workload capacity (all-zero capacities:
/// uniformly).
fn pick_weighted(mut candidates: Vec<Picked>, rng: &mut impl Rng) -> Option<Picked> {
    let index = weighted_index(&candidates, rng)?;
    Some(candidates.swap_remove(index))
}

/// The index of one of `candidates` drawn at random, weighted by workload capacity
/// (all-zero capacities: uniformly); `None` when there is none.
pub fn weighted_index(candidates: &[Picked], rng: &mut impl Rng) -> Option<usize> {
    match candidates.len() {
        0 => return None,
        1 => return Some(0),
        _ => {}
    }
    let total: u64 = candidates
        .iter()
        .map(|c| u64::from(c.workload.capacity))
        .sum();
    if total == 0 {
        return Some(rng.gen_range(0..candidates.len()));
    }
    let mut r = rng.gen_range(0..total);
    for (i, c) in candidates.iter().enumerate() {
        let w = u64::from(c.workload.capacity);
        if r < w {
            return Some(i);
        }
        r -= w;
    }
    Some(candidates.len() - 1)
}
