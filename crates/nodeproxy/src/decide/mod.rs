//! What to do with a connection, decided without sockets: the handlers gather the facts
//! (the mesh state, the addresses, the peer's identity), call a function here, and carry
//! out the plan it returns. Every branch is a table test away.
//!
//! - [`outbound`]: a captured connection from the local workload → HBONE or plain TCP;
//! - [`inbound`]: an HBONE CONNECT, or a captured plaintext connection, → a verdict.

pub mod inbound;
pub mod outbound;

use std::net::IpAddr;
use std::sync::Arc;

use ambit_state::{ProxyState, Workload};

use crate::error::Error;
use crate::settings::{OriginalSource, ProxyConfig};

/// Who this proxy acts for: `PROXY_WORKLOAD_INFO` in dedicated mode, the ZDS
/// `WorkloadInfo` in-pod. Resolved against the configured workloads, never from an IP.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct LocalIdentity {
    pub namespace: String,
    pub name: String,
    pub service_account: String,
}

/// Connect to the app from the client's own address (original-source preservation).
#[derive(Clone, Copy, Debug)]
pub struct Spoof {
    pub ip: IpAddr,
    /// `ENABLE_ORIG_SRC=true`: fail rather than fall back to our own address.
    pub required: bool,
}

/// An address as the mesh state keys it: an IPv4-mapped IPv6 address as the IPv4 one.
pub fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    }
}

/// Who this proxy acts for, as the decisions need it.
#[derive(Clone, Copy, Debug)]
pub struct Local<'a> {
    pub identity: &'a LocalIdentity,
    /// This node's name, to prefer the local copy of an ambiguous workload.
    pub node: Option<&'a str>,
}

impl Local<'_> {
    /// The workload this proxy serves, as `state` configures it.
    pub fn workload(&self, state: &ProxyState) -> Result<Arc<Workload>, Error> {
        let id = self.identity;
        state
            .find_local_workload(&id.namespace, &id.name, &id.service_account, self.node)
            .ok_or_else(|| Error::LocalWorkloadMissing {
                namespace: id.namespace.clone(),
                name: id.name.clone(),
                service_account: id.service_account.clone(),
            })
    }

    /// The workload an inbound connection to `ip` reaches: ours, and only if `ip` is one of
    /// its addresses; never another workload that happens to own the address.
    pub fn serving(&self, state: &ProxyState, ip: IpAddr) -> Result<Arc<Workload>, Error> {
        let local = self.workload(state)?;
        if !local.workload_ips.contains(&ip) {
            return Err(Error::NotLocalAddress {
                ip,
                namespace: local.namespace.to_string(),
                name: local.name.to_string(),
            });
        }
        Ok(local)
    }
}

/// How the listener that took a connection can reach the app.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SourcePolicy {
    /// `ENABLE_ORIG_SRC`.
    pub original_source: OriginalSource,
    /// The listener could be made transparent (`IP_TRANSPARENT`).
    pub transparent: bool,
    /// With `ENABLE_ORIG_SRC` unset, whether to spoof: in-pod the agent's connmark routing
    /// returns the replies to us; in dedicated mode nothing does.
    pub spoof_by_default: bool,
}

impl SourcePolicy {
    /// The source address the connection to the app uses: the client's own IP when
    /// original-source preservation applies, else ours (`None`). A workload calling itself
    /// keeps our address.
    pub fn source_for(&self, client: IpAddr, local: IpAddr) -> Option<Spoof> {
        let wanted = match self.original_source {
            OriginalSource::Off => false,
            OriginalSource::Required => true,
            OriginalSource::Auto => self.transparent && self.spoof_by_default,
        };
        (wanted && client != local).then_some(Spoof {
            ip: client,
            required: self.original_source == OriginalSource::Required,
        })
    }
}

/// Ports a captured or tunnelled connection must never be sent to.
fn is_loop_port(cfg: &ProxyConfig, port: u16) -> bool {
    cfg.is_loop_port(port)
}

#[cfg(test)]
pub(crate) mod testing {
    //! A small mesh for the decision tables.
    use super::*;

    pub const MESH: &str = r#"
workloads:
- uid: c1
  name: client
  namespace: shop
  serviceAccount: client
  workloadName: client
  canonicalName: client
  canonicalRevision: v1
  clusterId: east
  locality: {region: eu, zone: eu-1}
  workloadIps: [10.0.0.1]
  protocol: HBONE
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
- uid: legacy1
  name: legacy
  namespace: shop
  workloadIps: [10.0.0.3]
  protocol: TCP
  services:
    shop/legacy.shop.svc.cluster.local: {80: 8080}
- uid: wp1
  name: behind-waypoint
  namespace: shop
  workloadIps: [10.0.0.4]
  protocol: HBONE
  waypoint: {destination: "/10.0.9.9", hboneMtlsPort: 15008}
- uid: wp2
  name: behind-missing-waypoint
  namespace: shop
  workloadIps: [10.0.0.5]
  protocol: HBONE
  waypoint: {destination: "/10.0.9.8", hboneMtlsPort: 15008}
- uid: waypoint1
  name: waypoint
  namespace: shop
  serviceAccount: waypoint
  workloadIps: [10.0.9.9]
  protocol: HBONE
- uid: tun1
  name: tunnel
  namespace: shop
  serviceAccount: tunnel
  workloadIps: [10.0.0.6, "fd00::6"]
  protocol: HBONE
  applicationTunnel: {protocol: PROXY, port: 15088}
  services:
    shop/tun.shop.svc.cluster.local: {80: 8080}
    shop/tunfar.shop.svc.cluster.local: {80: 8080}
- uid: remote1
  name: remote
  namespace: shop
  network: far
  workloadIps: [10.9.0.5]
  protocol: HBONE
  services:
    shop/far.shop.svc.cluster.local: {80: 8080}
services:
- name: tun
  namespace: shop
  hostname: tun.shop.svc.cluster.local
  vips: ["far/10.97.0.1", "/fd00::97", "/10.96.0.97"]
  ports: {80: 8080}
- name: tunfar
  namespace: shop
  hostname: tunfar.shop.svc.cluster.local
  vips: ["far/10.97.0.2"]
  ports: {80: 8080}
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
  subjectAltNames: ["spiffe://cluster.local/ns/shop/sa/api-san"]
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
- name: legacy
  namespace: shop
  hostname: legacy.shop.svc.cluster.local
  vips: ["/10.96.0.13"]
  ports: {80: 8080}
- name: waypointed
  namespace: shop
  hostname: waypointed.shop.svc.cluster.local
  vips: ["/10.96.0.14"]
  ports: {80: 8080}
  waypoint: {destination: "/10.0.9.9", hboneMtlsPort: 15008}
- name: far
  namespace: shop
  hostname: far.shop.svc.cluster.local
  vips: ["/10.96.0.15"]
  ports: {80: 8080}
- name: external
  namespace: shop
  hostname: external.example.com
  vips: ["/10.96.0.16"]
  ports: {443: 443}
  loadBalancer: {mode: Passthrough}
policies:
- name: deny-legacy
  namespace: shop
  scope: Namespace
  action: Deny
  rules:
  - - - namespaces: [!Exact "legacy"]
- name: app-ports-only
  namespace: shop
  scope: Namespace
  action: Deny
  rules:
  - - - notDestinationPorts: [8080, 8443, 9090]
"#;

    pub fn mesh() -> ProxyState {
        let cfg = ambit_state::parse_local_config("decide-test", MESH).unwrap();
        ProxyState::from_config(cfg).unwrap()
    }

    pub fn identity(name: &str, sa: &str) -> LocalIdentity {
        LocalIdentity {
            namespace: "shop".into(),
            name: name.into(),
            service_account: sa.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use super::*;

    #[test]
    fn the_local_workload_is_found_by_identity_never_by_address() {
        let state = mesh();
        let server = identity("server", "server");
        let local = Local {
            identity: &server,
            node: None,
        };
        assert_eq!(local.workload(&state).unwrap().uid, "s1");
        assert_eq!(
            local
                .serving(&state, "10.0.0.2".parse().unwrap())
                .unwrap()
                .uid,
            "s1"
        );
        // The client's address is configured, but not ours.
        let e = local
            .serving(&state, "10.0.0.1".parse().unwrap())
            .unwrap_err();
        assert!(matches!(e, Error::NotLocalAddress { .. }), "{e}");
        let ghost = identity("ghost", "server");
        let e = Local {
            identity: &ghost,
            node: None,
        }
        .workload(&state)
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "this proxy's workload shop/ghost (service account server) is not in the configuration"
        );
    }

    #[test]
    fn the_source_address_follows_orig_src_and_the_listener() {
        let client: IpAddr = "10.0.0.1".parse().unwrap();
        let local: IpAddr = "10.0.0.2".parse().unwrap();
        let policy = |original_source, transparent, spoof_by_default| SourcePolicy {
            original_source,
            transparent,
            spoof_by_default,
        };
        let spoofed =
            |p: SourcePolicy, from: IpAddr| p.source_for(from, local).map(|s| (s.ip, s.required));
        // Unset: spoof only where replies come back (in-pod) and the listener allows it.
        assert_eq!(
            spoofed(policy(OriginalSource::Auto, true, true), client),
            Some((client, false))
        );
        assert_eq!(
            spoofed(policy(OriginalSource::Auto, false, true), client),
            None
        );
        assert_eq!(
            spoofed(policy(OriginalSource::Auto, true, false), client),
            None
        );
        // true: always, and required; false: never.
        assert_eq!(
            spoofed(policy(OriginalSource::Required, false, false), client),
            Some((client, true))
        );
        assert_eq!(
            spoofed(policy(OriginalSource::Off, true, true), client),
            None
        );
        // Hairpin keeps our address.
        assert_eq!(
            spoofed(policy(OriginalSource::Required, true, true), local),
            None
        );
    }
}
