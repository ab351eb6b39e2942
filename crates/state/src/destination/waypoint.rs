//! Waypoints: resolving a `waypoint` gateway address to the pod that takes the traffic,
//! and telling whether a connection comes from a waypoint (the "sandwich").
//!
//! Reference §10.1 steps 4 and 7, §10.3 (Waypoint mode), §2.1 (expected SANs). A waypoint
//! is addressed by IP (its service VIP, load-balanced like any service, or a pod IP) or by
//! `namespace/hostname` (its service). HBONE goes to the chosen pod at the gateway's
//! `hbone_mtls_port`, translated by the waypoint service's port map. A waypoint in
//! another network would need double HBONE (reference §10.2), which this proxy does not
//! do: such traffic is refused, never sent around the waypoint.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use ambit_identity::SpiffeId;
use rand::Rng;

use super::pick::{pick_endpoint, PickMode};
use super::types::{RouteError, RouteInput};
use crate::service::LoadBalancerMode;
use crate::service::Service;
use crate::store::AddressTarget;
use crate::store::ProxyState;
use crate::workload::{GatewayAddress, GatewayDestination, Workload};

/// The pod a waypoint address resolved to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedWaypoint {
    /// The waypoint pod.
    pub workload: Arc<Workload>,
    /// Where to open HBONE: `pod-ip:translated hbone_mtls_port`.
    pub next_hop: SocketAddr,
    /// The identities the waypoint may present: its workload identity, then the waypoint
    /// service's SANs (reference §2.1).
    pub expected_identities: Vec<SpiffeId>,
}

/// Resolves `gw` for a connection from `input.source` (its network and namespace).
/// `target` names what the waypoint serves, for the error messages.
pub fn resolve_waypoint(
    state: &ProxyState,
    input: &RouteInput<'_>,
    gw: &GatewayAddress,
    target: &str,
    rng: &mut impl Rng,
) -> Result<ResolvedWaypoint, RouteError> {
    let not_found = |why: String| RouteError::WaypointNotFound {
        target: target.to_string(),
        why,
    };
    let other_network = |network: &str| RouteError::WaypointInOtherNetwork {
        target: target.to_string(),
        network: network.to_string(),
    };
    let service = match &gw.destination {
        GatewayDestination::Address(addr) => {
            if addr.network != input.source.network {
                return Err(other_network(&addr.network));
            }
            match state.lookup_address(&addr.network, addr.address, &input.source.namespace) {
                Some(AddressTarget::Service(svc)) => svc,
                // A waypoint pod by its own IP: its HBONE port as given.
                Some(AddressTarget::Workload(wl)) => {
                    return Ok(ResolvedWaypoint {
                        next_hop: SocketAddr::new(addr.address, gw.hbone_mtls_port),
                        expected_identities: identities(&wl, None),
                        workload: wl,
                    })
                }
                None => {
                    return Err(not_found(format!(
                        "no service or workload has the waypoint address {addr}"
                    )))
                }
            }
        }
        GatewayDestination::Hostname(h) => state
            .service_by_key(&format!("{}/{}", h.namespace, h.hostname))
            .ok_or_else(|| not_found(format!("no service {}/{}", h.namespace, h.hostname)))?,
    };
    if service.lb_mode() == LoadBalancerMode::Passthrough {
        return Err(not_found(format!(
            "the waypoint service {} is a passthrough service",
            service.key()
        )));
    }
    let dialed = match &gw.destination {
        GatewayDestination::Address(a) => a.address,
        // A hostname keeps the caller's IP family.
        GatewayDestination::Hostname(_) => input.dst.ip(),
    };
    // Waypoint mode (§10.3): the waypoint service need not list the HBONE port when its
    // pods take it through an application tunnel.
    match pick_endpoint(
        state,
        &service,
        gw.hbone_mtls_port,
        dialed,
        input.source,
        PickMode::Waypoint,
        rng,
    ) {
        Ok(picked) => Ok(ResolvedWaypoint {
            next_hop: SocketAddr::new(picked.ip, picked.port),
            expected_identities: identities(&picked.workload, Some(&service)),
            workload: picked.workload,
        }),
        Err(e) => {
            // Endpoints in another network only: double HBONE territory, refused loudly.
            let mut endpoints = state.endpoints(&service.key()).peekable();
            if let Some(first) = endpoints.peek().map(|ep| ep.workload.network.clone()) {
                if endpoints.all(|ep| ep.workload.network != input.source.network) {
                    return Err(other_network(&first));
                }
            }
            Err(not_found(format!(
                "the waypoint service {}: {e}",
                service.key()
            )))
        }
    }
}

/// The waypoint's workload identity, then its service's SANs (invalid ones skipped).
fn identities(wl: &Workload, service: Option<&Service>) -> Vec<SpiffeId> {
    let mut ids = vec![wl.identity()];
    let sans = service.iter().flat_map(|s| s.subject_alt_names.iter());
    for id in sans.filter_map(|s| SpiffeId::parse(s).ok()) {
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    ids
}

/// Whether `pred` holds for any workload `gw` may resolve to (in the network of its
/// address): the one with that IP, or an endpoint of the waypoint service.
fn any_waypoint_workload(
    state: &ProxyState,
    namespace: &str,
    gw: &GatewayAddress,
    mut pred: impl FnMut(&Workload) -> bool,
) -> bool {
    let service = match &gw.destination {
        GatewayDestination::Address(addr) => {
            match state.lookup_address(&addr.network, addr.address, namespace) {
                Some(AddressTarget::Service(s)) => s,
                Some(AddressTarget::Workload(w)) => return pred(&w),
                None => return false,
            }
        }
        GatewayDestination::Hostname(h) => {
            match state.service_by_key(&format!("{}/{}", h.namespace, h.hostname)) {
                Some(s) => s,
                None => return false,
            }
        }
    };
    // Walked, not collected: this runs for connections to workloads with a waypoint.
    state.endpoints(&service.key()).any(|ep| pred(ep.workload))
}

/// Whether `gw` names the waypoint `local`: it resolves to that very workload (its pod
/// IP, or its service's VIP or hostname). What a waypoint checks before fronting a
/// service or workload.
pub fn names_waypoint(state: &ProxyState, gw: &GatewayAddress, local: &Workload) -> bool {
    any_waypoint_workload(state, &local.namespace, gw, |w| w.uid == local.uid)
}

/// Whether a connection from `source` at `src_ip` comes from the waypoint `gw` itself
/// (its identity and one of its IPs): then it is not sent back through it (reference
/// §10.1 step 7).
pub fn is_from_waypoint(
    state: &ProxyState,
    gw: &GatewayAddress,
    source: &Workload,
    src_ip: IpAddr,
) -> bool {
    let identity = source.identity();
    any_waypoint_workload(state, &source.namespace, gw, |w| {
        w.workload_ips.contains(&src_ip) && w.identity() == identity
    })
}

/// Whether `local` is a waypoint of what `authority_ip` names (a service VIP or a
/// workload IP in `network`): inbound then accepts an authority that is not its own IP
/// (reference §2.1, server step 4).
pub fn is_waypoint_for(
    state: &ProxyState,
    network: &str,
    authority_ip: IpAddr,
    local: &Workload,
) -> bool {
    // The workload at that IP, and every service with exactly that VIP (whoever may see
    // it: the client chose the address, not us); a CIDR VIP only when nothing else has it.
    let mut gateways: Vec<GatewayAddress> = Vec::new();
    if let Some(gw) = state
        .workload_by_ip(network, authority_ip)
        .and_then(|w| w.waypoint.as_deref().cloned())
    {
        gateways.push(gw);
    }
    gateways.extend(
        state
            .services_at_vip(network, authority_ip)
            .filter_map(|s| s.waypoint.clone()),
    );
    if gateways.is_empty() {
        if let Some(AddressTarget::Service(s)) =
            state.lookup_address(network, authority_ip, &local.namespace)
        {
            gateways.extend(s.waypoint.clone());
        }
    }
    gateways
        .iter()
        .any(|gw| any_waypoint_workload(state, &local.namespace, gw, |w| w.uid == local.uid))
}
