//! The mesh model (`ambit_state`) as xDS resources: `istio.workload.Address` for workloads
//! (named by uid) and services (named `namespace/hostname`), `istio.security.Authorization`
//! for policies (named `namespace/name`).
//!
//! Resource bytes are deterministic: a workload's `services` map is a `HashMap` in the
//! generated code, whose iteration order changes between runs, so its entries are encoded
//! by hand in key order. Equal resources therefore have equal bytes, and the version (a
//! SHA-256 of the bytes) changes only when the content does, across restarts too.

use std::net::IpAddr;

use ambit_proto::istio::security as sec;
use ambit_proto::istio::workload as pw;
use ambit_proto::{Resource, ADDRESS_TYPE, AUTHORIZATION_TYPE};
use ambit_state::{
    AppTunnelProtocol, Authorization, GatewayAddress, GatewayDestination, HealthStatus, IpFamilies,
    LoadBalancerHealthPolicy, LoadBalancerMode, LoadBalancerScope, NetworkAddress, NetworkMode,
    PolicyAction, PolicyScope, RbacMatch, Service, ServiceAccountMatch, StringMatch,
    TunnelProtocol, Visibility, Workload,
};
use prost::bytes::Bytes;
use prost::encoding::{encode_key, encode_varint, WireType};
use prost::Message;

/// The `istio.workload.Workload` of a workload (without its `services`, see
/// [`workload_resource`]).
pub fn workload_proto(w: &Workload) -> pw::Workload {
    pw::Workload {
        uid: w.uid.clone(),
        name: w.name.clone(),
        namespace: w.namespace.clone(),
        addresses: w.workload_ips.iter().map(|ip| ip_bytes(*ip)).collect(),
        hostname: w.hostname.clone(),
        network: w.network.clone(),
        tunnel_protocol: match w.protocol {
            TunnelProtocol::Hbone => pw::TunnelProtocol::Hbone,
            TunnelProtocol::Tcp => pw::TunnelProtocol::None,
        } as i32,
        trust_domain: w.trust_domain.clone(),
        service_account: w.service_account.clone(),
        waypoint: w.waypoint.as_ref().map(gateway),
        network_gateway: w.network_gateway.as_ref().map(gateway),
        node: w.node.clone(),
        canonical_name: w.canonical_name.clone(),
        canonical_revision: w.canonical_revision.clone(),
        workload_type: workload_type(&w.workload_type) as i32,
        workload_name: w.workload_name.clone(),
        native_tunnel: w.native_tunnel,
        application_tunnel: w
            .application_tunnel
            .as_ref()
            .map(|t| pw::ApplicationTunnel {
                protocol: match t.protocol {
                    AppTunnelProtocol::None => pw::application_tunnel::Protocol::None,
                    AppTunnelProtocol::Proxy => pw::application_tunnel::Protocol::Proxy,
                } as i32,
                port: t.port.map_or(0, u32::from),
            }),
        services: Default::default(),
        authorization_policies: w.authorization_policies.clone(),
        status: match w.status {
            HealthStatus::Healthy => pw::WorkloadStatus::Healthy,
            HealthStatus::Unhealthy => pw::WorkloadStatus::Unhealthy,
        } as i32,
        cluster_id: w.cluster_id.clone(),
        locality: (w.locality != Default::default()).then(|| pw::Locality {
            region: w.locality.region.clone(),
            zone: w.locality.zone.clone(),
            subzone: w.locality.subzone.clone(),
        }),
        network_mode: match w.network_mode {
            NetworkMode::Standard => pw::NetworkMode::Standard,
            NetworkMode::HostNetwork => pw::NetworkMode::HostNetwork,
        } as i32,
        extensions: Vec::new(),
        capacity: Some(w.capacity),
    }
}

/// ztunnel's workload type names (the local config's); anything else is a deployment,
/// which is also what an empty field means.
fn workload_type(t: &str) -> pw::WorkloadType {
    match t.to_ascii_lowercase().as_str() {
        "cronjob" => pw::WorkloadType::Cronjob,
        "pod" => pw::WorkloadType::Pod,
        "job" => pw::WorkloadType::Job,
        _ => pw::WorkloadType::Deployment,
    }
}

/// The `istio.workload.Service` of a service.
pub fn service_proto(s: &Service) -> pw::Service {
    pw::Service {
        name: s.name.clone(),
        namespace: s.namespace.clone(),
        hostname: s.hostname.clone(),
        addresses: s.vips.iter().map(network_address).collect(),
        ports: s
            .ports
            .iter()
            .map(|(sp, tp)| pw::Port {
                service_port: u32::from(*sp),
                target_port: u32::from(*tp),
                app_protocol: pw::AppProtocol::Unknown as i32,
            })
            .collect(),
        subject_alt_names: s.subject_alt_names.clone(),
        waypoint: s.waypoint.as_ref().map(gateway),
        load_balancing: s.load_balancer.as_ref().map(|lb| pw::LoadBalancing {
            routing_preference: lb
                .routing_preferences
                .iter()
                .map(|p| scope(*p) as i32)
                .collect(),
            mode: match lb.mode {
                LoadBalancerMode::Standard => pw::load_balancing::Mode::UnspecifiedMode,
                LoadBalancerMode::Strict => pw::load_balancing::Mode::Strict,
                LoadBalancerMode::Failover => pw::load_balancing::Mode::Failover,
                LoadBalancerMode::Passthrough => pw::load_balancing::Mode::Passthrough,
            } as i32,
            health_policy: match lb.health_policy {
                LoadBalancerHealthPolicy::OnlyHealthy => {
                    pw::load_balancing::HealthPolicy::OnlyHealthy
                }
                LoadBalancerHealthPolicy::AllowAll => pw::load_balancing::HealthPolicy::AllowAll,
            } as i32,
        }),
        ip_families: match s.ip_families {
            IpFamilies::Automatic => pw::IpFamilies::Automatic,
            IpFamilies::Ipv4Only => pw::IpFamilies::Ipv4Only,
            IpFamilies::Ipv6Only => pw::IpFamilies::Ipv6Only,
            IpFamilies::Dual => pw::IpFamilies::Dual,
        } as i32,
        extensions: Vec::new(),
        canonical: s.canonical,
        ingress_use_waypoint: false,
        weighted_waypoints: Vec::new(),
        visibility: match s.visibility {
            Visibility::Public => pw::service::Visibility::Public,
            Visibility::Namespace => pw::service::Visibility::Namespace,
        } as i32,
    }
}

fn scope(s: LoadBalancerScope) -> pw::load_balancing::Scope {
    use pw::load_balancing::Scope;
    match s {
        LoadBalancerScope::Region => Scope::Region,
        LoadBalancerScope::Zone => Scope::Zone,
        LoadBalancerScope::Subzone => Scope::Subzone,
        LoadBalancerScope::Node => Scope::Node,
        LoadBalancerScope::Cluster => Scope::Cluster,
        LoadBalancerScope::Network => Scope::Network,
    }
}

/// The `istio.security.Authorization` of a policy.
pub fn policy_proto(p: &Authorization) -> sec::Authorization {
    sec::Authorization {
        name: p.name.clone(),
        namespace: p.namespace.clone(),
        scope: match p.scope {
            PolicyScope::Global => sec::Scope::Global,
            PolicyScope::Namespace => sec::Scope::Namespace,
            PolicyScope::WorkloadSelector => sec::Scope::WorkloadSelector,
        } as i32,
        action: match p.action {
            PolicyAction::Allow => sec::Action::Allow,
            PolicyAction::Deny => sec::Action::Deny,
        } as i32,
        rules: p
            .rules
            .iter()
            .map(|rule| sec::Rule {
                clauses: rule
                    .iter()
                    .map(|clause| sec::Clause {
                        matches: clause.iter().map(rbac_match).collect(),
                    })
                    .collect(),
            })
            .collect(),
        dry_run: p.dry_run,
        extensions: Vec::new(),
    }
}

fn rbac_match(m: &RbacMatch) -> sec::Match {
    let strings = |v: &[StringMatch]| v.iter().map(string_match).collect();
    let accounts = |v: &[ServiceAccountMatch]| {
        v.iter()
            .map(|a| sec::ServiceAccountMatch {
                namespace: a.namespace.clone(),
                service_account: a.service_account.clone(),
            })
            .collect()
    };
    let cidrs = |v: &[ipnet::IpNet]| {
        v.iter()
            .map(|n| sec::Address {
                address: ip_bytes(n.addr()),
                length: u32::from(n.prefix_len()),
            })
            .collect()
    };
    let ports = |v: &[u16]| v.iter().map(|p| u32::from(*p)).collect();
    sec::Match {
        namespaces: strings(&m.namespaces),
        not_namespaces: strings(&m.not_namespaces),
        service_accounts: accounts(&m.service_accounts),
        not_service_accounts: accounts(&m.not_service_accounts),
        principals: strings(&m.principals),
        not_principals: strings(&m.not_principals),
        source_ips: cidrs(&m.source_ips),
        not_source_ips: cidrs(&m.not_source_ips),
        destination_ips: cidrs(&m.destination_ips),
        not_destination_ips: cidrs(&m.not_destination_ips),
        destination_ports: ports(&m.destination_ports),
        not_destination_ports: ports(&m.not_destination_ports),
        extensions: Vec::new(),
    }
}

fn string_match(m: &StringMatch) -> sec::StringMatch {
    use sec::string_match::MatchType;
    sec::StringMatch {
        match_type: Some(match m {
            StringMatch::Exact(s) => MatchType::Exact(s.clone()),
            StringMatch::Prefix(s) => MatchType::Prefix(s.clone()),
            StringMatch::Suffix(s) => MatchType::Suffix(s.clone()),
            StringMatch::Presence => MatchType::Presence(()),
        }),
    }
}

fn gateway(g: &GatewayAddress) -> pw::GatewayAddress {
    pw::GatewayAddress {
        hbone_mtls_port: u32::from(g.hbone_mtls_port),
        destination: Some(match &g.destination {
            GatewayDestination::Address(a) => {
                pw::gateway_address::Destination::Address(network_address(a))
            }
            GatewayDestination::Hostname(h) => {
                pw::gateway_address::Destination::Hostname(pw::NamespacedHostname {
                    namespace: h.namespace.clone(),
                    hostname: h.hostname.clone(),
                })
            }
        }),
    }
}

fn network_address(a: &NetworkAddress) -> pw::NetworkAddress {
    pw::NetworkAddress {
        network: a.network.clone(),
        address: ip_bytes(a.address),
        length: a.prefix_len.map(u32::from),
    }
}

fn ip_bytes(ip: IpAddr) -> Bytes {
    match ip {
        IpAddr::V4(v4) => Bytes::copy_from_slice(&v4.octets()),
        IpAddr::V6(v6) => Bytes::copy_from_slice(&v6.octets()),
    }
}

/// Field numbers used when encoding by hand.
const ADDRESS_WORKLOAD_FIELD: u32 = 1;
const ADDRESS_SERVICE_FIELD: u32 = 2;
const WORKLOAD_SERVICES_FIELD: u32 = 22;

/// One entry of `Workload.services` (a protobuf map entry: key 1, value 2).
#[derive(Clone, PartialEq, prost::Message)]
struct ServicesEntry {
    #[prost(string, tag = "1")]
    key: String,
    #[prost(message, optional, tag = "2")]
    value: Option<pw::PortList>,
}

/// Appends a length-delimited field.
fn put_message_bytes(field: u32, bytes: &[u8], out: &mut Vec<u8>) {
    encode_key(field, WireType::LengthDelimited, out);
    encode_varint(bytes.len() as u64, out);
    out.extend_from_slice(bytes);
}

/// The workload as an Address resource named by its uid.
pub fn workload_resource(w: &Workload) -> Resource {
    let mut body = workload_proto(w).encode_to_vec();
    for (key, ports) in &w.services {
        let entry = ServicesEntry {
            key: key.clone(),
            value: Some(pw::PortList {
                ports: ports
                    .iter()
                    .map(|(sp, tp)| pw::Port {
                        service_port: u32::from(*sp),
                        target_port: u32::from(*tp),
                        app_protocol: pw::AppProtocol::Unknown as i32,
                    })
                    .collect(),
            }),
        };
        put_message_bytes(WORKLOAD_SERVICES_FIELD, &entry.encode_to_vec(), &mut body);
    }
    let mut address = Vec::with_capacity(body.len() + 8);
    put_message_bytes(ADDRESS_WORKLOAD_FIELD, &body, &mut address);
    resource(w.uid.clone(), ADDRESS_TYPE, address)
}

/// The service as an Address resource named `namespace/hostname`.
pub fn service_resource(s: &Service) -> Resource {
    let mut address = Vec::new();
    put_message_bytes(
        ADDRESS_SERVICE_FIELD,
        &service_proto(s).encode_to_vec(),
        &mut address,
    );
    resource(
        format!("{}/{}", s.namespace, s.hostname),
        ADDRESS_TYPE,
        address,
    )
}

/// The policy as an Authorization resource named `namespace/name`.
pub fn policy_resource(p: &Authorization) -> Resource {
    resource(p.key(), AUTHORIZATION_TYPE, policy_proto(p).encode_to_vec())
}

fn resource(name: String, type_url: &str, value: Vec<u8>) -> Resource {
    Resource {
        name,
        version: version_of(&value),
        resource: Some(prost_types::Any {
            type_url: type_url.to_string(),
            value,
        }),
        ..Default::default()
    }
}

/// The version of a resource: the first 16 hex digits of the SHA-256 of its bytes.
pub fn version_of(bytes: &[u8]) -> String {
    let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, bytes);
    digest.as_ref()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MESH: &str = r#"
workloads:
- uid: c1//v1/Pod/default/client
  name: client
  namespace: default
  serviceAccount: client
  workloadIps: ["10.0.0.2", "fd00::2"]
  protocol: HBONE
  node: node1
  workloadType: pod
  locality: {region: r1}
  waypoint: {destination: "/10.0.0.9", hboneMtlsPort: 15008}
  applicationTunnel: {protocol: PROXY, port: 15088}
  authorizationPolicies: ["default/allow"]
  services:
    default/a.default.svc.cluster.local: {80: 8080}
    default/b.default.svc.cluster.local: {90: 9090, 91: 0}
    default/c.default.svc.cluster.local: {1: 2}
services:
- name: echo
  namespace: default
  hostname: echo.default.svc.cluster.local
  vips: ["/10.96.0.10", "net1/10.96.0.0/16"]
  ports: {80: 8080}
  loadBalancer: {routingPreferences: [Network, Region], mode: Failover}
  visibility: Namespace
policies:
- name: allow
  namespace: default
  scope: WorkloadSelector
  action: Deny
  rules:
  - - - principals: [{prefix: "cluster.local/"}, {presence: {}}]
        sourceIps: ["10.0.0.0/8"]
        destinationPorts: [8080]
"#;

    fn mesh() -> ambit_state::LocalConfig {
        let mut cfg = ambit_state::parse_local_config("t.yaml", MESH).unwrap();
        for w in &mut cfg.workloads {
            w.normalize().unwrap();
        }
        cfg
    }

    fn decode_address(r: &Resource) -> pw::Address {
        let any = r.resource.as_ref().unwrap();
        assert_eq!(any.type_url, ADDRESS_TYPE);
        pw::Address::decode(any.value.as_slice()).unwrap()
    }

    #[test]
    fn a_workload_decodes_as_written_and_its_bytes_are_stable() {
        let cfg = mesh();
        let w = &cfg.workloads[0];
        let r = workload_resource(w);
        assert_eq!(r.name, "c1//v1/Pod/default/client");
        let Some(pw::address::Type::Workload(got)) = decode_address(&r).r#type else {
            panic!("not a workload");
        };
        assert_eq!(got.addresses.len(), 2);
        assert_eq!(got.addresses[0].as_ref(), [10, 0, 0, 2]);
        assert_eq!(got.tunnel_protocol, pw::TunnelProtocol::Hbone as i32);
        assert_eq!(got.workload_type, pw::WorkloadType::Pod as i32);
        assert_eq!(got.node, "node1");
        assert_eq!(got.capacity, Some(1));
        assert_eq!(got.services.len(), 3);
        let b = &got.services["default/b.default.svc.cluster.local"];
        assert_eq!(b.ports.len(), 2);
        assert_eq!(
            (b.ports[0].service_port, b.ports[0].target_port),
            (90, 9090)
        );
        assert_eq!(got.application_tunnel.unwrap().port, 15088);
        // The map decoded equals the map the proto would hold.
        let mut expected = workload_proto(w);
        expected.services = got.services.clone();
        assert_eq!(got, expected);
        // Same content, same bytes, same version; different content, new version.
        assert_eq!(workload_resource(w), r);
        let mut w2 = w.clone();
        w2.services
            .get_mut("default/c.default.svc.cluster.local")
            .unwrap()
            .insert(1, 3);
        assert_ne!(workload_resource(&w2).version, r.version);
        assert_eq!(r.version.len(), 16);
    }

    #[test]
    fn services_and_policies_are_named_as_istiod_names_them() {
        let cfg = mesh();
        let s = service_resource(&cfg.services[0]);
        assert_eq!(s.name, "default/echo.default.svc.cluster.local");
        let Some(pw::address::Type::Service(got)) = decode_address(&s).r#type else {
            panic!("not a service");
        };
        assert_eq!(got.addresses.len(), 2);
        assert_eq!(got.addresses[1].network, "net1");
        assert_eq!(got.addresses[1].length, Some(16));
        assert_eq!(got.addresses[0].length, None);
        assert_eq!(got.visibility, pw::service::Visibility::Namespace as i32);
        let lb = got.load_balancing.unwrap();
        assert_eq!(
            lb.routing_preference,
            [
                pw::load_balancing::Scope::Network as i32,
                pw::load_balancing::Scope::Region as i32
            ]
        );
        assert_eq!(lb.mode, pw::load_balancing::Mode::Failover as i32);

        let p = policy_resource(&cfg.policies[0]);
        assert_eq!(p.name, "default/allow");
        let any = p.resource.unwrap();
        assert_eq!(any.type_url, AUTHORIZATION_TYPE);
        let got = sec::Authorization::decode(any.value.as_slice()).unwrap();
        assert_eq!(got.action, sec::Action::Deny as i32);
        assert_eq!(got.scope, sec::Scope::WorkloadSelector as i32);
        let m = &got.rules[0].clauses[0].matches[0];
        assert_eq!(m.principals.len(), 2);
        assert_eq!(
            m.principals[1].match_type,
            Some(sec::string_match::MatchType::Presence(()))
        );
        assert_eq!(m.source_ips[0].length, 8);
        assert_eq!(m.source_ips[0].address.as_ref(), [10, 0, 0, 0]);
        assert_eq!(m.destination_ports, [8080]);
    }
}
