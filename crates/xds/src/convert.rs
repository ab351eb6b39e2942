//! xDS resources (`istio.workload.Address`, `istio.security.Authorization`) to the mesh
//! model of `ambit-state` and back.
//!
//! From the wire: every field ztunnel uses is mapped; what the model checks itself
//! (identity characters, `namespace/hostname` keys, host-network indexing) is left to its
//! `normalize()`, the same path the local YAML takes, which [`address_from_proto`] and
//! [`authorization_from_proto`] run so a caller gets every rejection before touching a
//! store. Empty trust domain, service account and cluster id stay empty in the model: it
//! applies ztunnel's defaults (`cluster.local`, `default`, `Kubernetes`) where the values
//! are used. Unknown enum numbers read as the enum's default, as prost's accessors do.
//!
//! Not carried (ztunnel does not act on them either, or ambit's model has no place yet):
//! `extensions`, `app_protocol`, `ingress_use_waypoint`, and `Service.weighted_waypoints`
//! (ambit routes to the single `waypoint`).
//!
//! To the wire ([`to_proto_workload`], [`to_proto_service`], [`to_proto_authorization`]):
//! what `ambit control` serves. The mapping is lossless for everything the proto can say;
//! a `workloadType` outside the proto's four kinds is sent as DEPLOYMENT.

use std::collections::BTreeMap;
use std::fmt;

use ambit_proto::istio::security as psec;
use ambit_proto::istio::workload as pw;
use ambit_state::{
    AppProtocol, AppTunnelProtocol, ApplicationTunnel, Authorization, GatewayAddress,
    GatewayDestination, HealthStatus, IpFamilies, LoadBalancer, LoadBalancerHealthPolicy,
    LoadBalancerMode, LoadBalancerScope, Locality, Name, NamespacedHostname, NetworkAddress,
    NetworkMode, PolicyAction, PolicyScope, PortMap, RbacMatch, Service, ServiceAccountMatch,
    StringMatch, TunnelProtocol, Workload, DEFAULT_HBONE_PORT,
};
use ipnet::IpNet;

/// Why a resource was refused: the field at fault (a path like `addresses[1]` or
/// `waypoint`) and what is wrong with it. The control plane sent it, so the fix is there;
/// the proxy keeps the previous version of the resource, if any.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub struct ConvertError {
    /// The field at fault, empty for the resource as a whole.
    pub field: String,
    pub reason: String,
}

impl ConvertError {
    /// The refusal of `field` (a path in the body, empty for the body as a whole) for
    /// `reason`: what any resource type's conversion says of a field it cannot take.
    pub fn new(field: impl Into<String>, reason: impl fmt::Display) -> ConvertError {
        err(field, reason)
    }
}

impl fmt::Display for ConvertError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_empty() {
            f.write_str(&self.reason)
        } else {
            write!(f, "{}: {}", self.field, self.reason)
        }
    }
}

fn err(field: impl Into<String>, reason: impl fmt::Display) -> ConvertError {
    ConvertError {
        field: field.into(),
        reason: reason.to_string(),
    }
}

/// The model's `normalize()` errors already start with the field name.
fn model_err(message: String) -> ConvertError {
    match message.split_once(": ") {
        Some((field, reason)) if !field.contains(' ') => err(field, reason),
        _ => err("", message),
    }
}

/// One decoded `istio.workload.Address`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AddressResource {
    Workload(Box<Workload>),
    Service(Box<Service>),
}

/// Decodes and checks an `Address` resource (the model's `normalize()` included).
pub fn address_from_proto(a: pw::Address) -> Result<AddressResource, ConvertError> {
    match a.r#type {
        Some(pw::address::Type::Workload(w)) => {
            let mut w = workload_from_proto(w)?;
            w.normalize().map_err(model_err)?;
            Ok(AddressResource::Workload(Box::new(w)))
        }
        Some(pw::address::Type::Service(s)) => {
            let mut s = service_from_proto(s)?;
            s.normalize().map_err(model_err)?;
            Ok(AddressResource::Service(Box::new(s)))
        }
        None => Err(err(
            "type",
            "Address carries neither a workload nor a service",
        )),
    }
}

fn port(field: impl Fn() -> String, v: u32) -> Result<u16, ConvertError> {
    u16::try_from(v).map_err(|_| err(field(), format!("port {v} is larger than 65535")))
}

/// The declared protocols of a service's ports (UNKNOWN and numbers this build does not
/// know: undeclared). Ports were checked by [`port_map`].
fn app_protocols(ports: &[pw::Port]) -> BTreeMap<u16, AppProtocol> {
    ports
        .iter()
        .filter_map(|p| {
            let protocol = match pw::AppProtocol::try_from(p.app_protocol).ok()? {
                pw::AppProtocol::Unknown => return None,
                pw::AppProtocol::Http11 => AppProtocol::Http11,
                pw::AppProtocol::Http2 => AppProtocol::Http2,
                pw::AppProtocol::Grpc => AppProtocol::Grpc,
                pw::AppProtocol::Tcp => AppProtocol::Tcp,
                pw::AppProtocol::Tls => AppProtocol::Tls,
            };
            Some((u16::try_from(p.service_port).ok()?, protocol))
        })
        .collect()
}

fn to_proto_app_protocol(p: Option<&AppProtocol>) -> i32 {
    (match p {
        None => pw::AppProtocol::Unknown,
        Some(AppProtocol::Http11) => pw::AppProtocol::Http11,
        Some(AppProtocol::Http2) => pw::AppProtocol::Http2,
        Some(AppProtocol::Grpc) => pw::AppProtocol::Grpc,
        Some(AppProtocol::Tcp) => pw::AppProtocol::Tcp,
        Some(AppProtocol::Tls) => pw::AppProtocol::Tls,
    }) as i32
}

fn port_map(field: &str, ports: &[pw::Port]) -> Result<PortMap, ConvertError> {
    let m: Vec<(u16, u16)> = ports
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let sp = port(|| format!("{field}[{i}].servicePort"), p.service_port)?;
            let tp = port(|| format!("{field}[{i}].targetPort"), p.target_port)?;
            Ok((sp, tp))
        })
        .collect::<Result<_, ConvertError>>()?;
    // A repeated service port: the last one wins, as a map's inserts do.
    Ok(m.into_iter().collect())
}

fn gateway_from_proto(field: &str, g: pw::GatewayAddress) -> Result<GatewayAddress, ConvertError> {
    let destination = match g.destination {
        Some(pw::gateway_address::Destination::Hostname(h)) => {
            GatewayDestination::Hostname(NamespacedHostname {
                namespace: h.namespace.into(),
                hostname: h.hostname.into(),
            })
        }
        Some(pw::gateway_address::Destination::Address(a)) => GatewayDestination::Address(
            NetworkAddress::from_parts(a.network, &a.address, a.length)
                .map_err(|e| err(format!("{field}.address"), e))?,
        ),
        None => return Err(err(field, "gateway address has no destination")),
    };
    // 0 is proto3's "unset": the HBONE port, as the local YAML defaults it.
    let hbone_mtls_port = match g.hbone_mtls_port {
        0 => DEFAULT_HBONE_PORT,
        p => port(|| format!("{field}.hboneMtlsPort"), p)?,
    };
    Ok(GatewayAddress {
        destination,
        hbone_mtls_port,
    })
}

fn workload_type_name(t: i32) -> &'static str {
    match pw::WorkloadType::try_from(t).unwrap_or_default() {
        pw::WorkloadType::Deployment => "deployment",
        pw::WorkloadType::Cronjob => "cronjob",
        pw::WorkloadType::Pod => "pod",
        pw::WorkloadType::Job => "job",
    }
}

/// Decodes a workload without running the model's `normalize()`.
pub fn workload_from_proto(p: pw::Workload) -> Result<Workload, ConvertError> {
    let protocol = match pw::TunnelProtocol::try_from(p.tunnel_protocol).unwrap_or_default() {
        pw::TunnelProtocol::None => TunnelProtocol::Tcp,
        pw::TunnelProtocol::Hbone => TunnelProtocol::Hbone,
        pw::TunnelProtocol::LegacyIstioMtls => TunnelProtocol::LegacyIstioMtls,
    };
    let mut workload_ips = Vec::with_capacity(p.addresses.len());
    for (i, a) in p.addresses.iter().enumerate() {
        workload_ips
            .push(ambit_state::ip_from_bytes(a).map_err(|e| err(format!("addresses[{i}]"), e))?);
    }
    let mut services = Vec::with_capacity(p.services.len());
    for (key, list) in p.services {
        let ports = port_map(&format!("services[{key}].ports"), &list.ports)?;
        services.push((Name::from(key), ports));
    }
    let application_tunnel = match p.application_tunnel {
        None => None,
        Some(t) => Some(ApplicationTunnel {
            protocol: match pw::application_tunnel::Protocol::try_from(t.protocol)
                .unwrap_or_default()
            {
                pw::application_tunnel::Protocol::None => AppTunnelProtocol::None,
                pw::application_tunnel::Protocol::Proxy => AppTunnelProtocol::Proxy,
            },
            port: match t.port {
                0 => None,
                v => Some(port(|| "applicationTunnel.port".into(), v)?),
            },
        }),
    };
    let locality = p
        .locality
        .map(|l| Locality {
            region: l.region.into(),
            zone: l.zone.into(),
            subzone: l.subzone.into(),
        })
        .unwrap_or_default();
    let waypoint = p
        .waypoint
        .map(|g| gateway_from_proto("waypoint", g))
        .transpose()?;
    let network_gateway = p
        .network_gateway
        .map(|g| gateway_from_proto("networkGateway", g))
        .transpose()?;
    let mut w = Workload::new(p.name, p.namespace);
    w.uid = p.uid.into();
    w.service_account = p.service_account.into();
    w.trust_domain = p.trust_domain.into();
    w.node = p.node.into();
    w.network = p.network.into();
    w.cluster_id = p.cluster_id.into();
    w.canonical_name = p.canonical_name.into();
    w.canonical_revision = p.canonical_revision.into();
    w.workload_name = p.workload_name.into();
    w.workload_type = workload_type_name(p.workload_type).into();
    w.hostname = p.hostname.into();
    w.workload_ips = workload_ips;
    w.protocol = protocol;
    w.network_mode = match pw::NetworkMode::try_from(p.network_mode).unwrap_or_default() {
        pw::NetworkMode::Standard => NetworkMode::Standard,
        pw::NetworkMode::HostNetwork => NetworkMode::HostNetwork,
    };
    w.status = match pw::WorkloadStatus::try_from(p.status).unwrap_or_default() {
        pw::WorkloadStatus::Healthy => HealthStatus::Healthy,
        pw::WorkloadStatus::Unhealthy => HealthStatus::Unhealthy,
    };
    w.locality = locality;
    w.capacity = p.capacity.unwrap_or(1);
    w.authorization_policies = p
        .authorization_policies
        .into_iter()
        .map(Name::from)
        .collect();
    w.native_tunnel = p.native_tunnel;
    w.waypoint = waypoint.map(Box::new);
    w.network_gateway = network_gateway.map(Box::new);
    w.application_tunnel = application_tunnel;
    w.services = services.into_iter().collect();
    Ok(w)
}

/// Decodes a service without running the model's `normalize()`.
pub fn service_from_proto(p: pw::Service) -> Result<Service, ConvertError> {
    let mut vips = Vec::with_capacity(p.addresses.len());
    for (i, a) in p.addresses.into_iter().enumerate() {
        vips.push(
            NetworkAddress::from_parts(a.network, &a.address, a.length)
                .map_err(|e| err(format!("addresses[{i}]"), e))?,
        );
    }
    let ports = port_map("ports", &p.ports)?;
    let app_protocols = app_protocols(&p.ports);
    let waypoint = p
        .waypoint
        .map(|g| gateway_from_proto("waypoint", g))
        .transpose()?;
    let load_balancer = p.load_balancing.map(|lb| {
        use pw::load_balancing::{HealthPolicy, Mode, Scope};
        LoadBalancer {
            // UNSPECIFIED_SCOPE and unknown numbers name no scope: nothing to compare.
            routing_preferences: lb
                .routing_preference
                .iter()
                .filter_map(|s| match Scope::try_from(*s).ok()? {
                    Scope::UnspecifiedScope => None,
                    Scope::Region => Some(LoadBalancerScope::Region),
                    Scope::Zone => Some(LoadBalancerScope::Zone),
                    Scope::Subzone => Some(LoadBalancerScope::Subzone),
                    Scope::Node => Some(LoadBalancerScope::Node),
                    Scope::Cluster => Some(LoadBalancerScope::Cluster),
                    Scope::Network => Some(LoadBalancerScope::Network),
                })
                .collect(),
            mode: match Mode::try_from(lb.mode).unwrap_or_default() {
                Mode::UnspecifiedMode => LoadBalancerMode::Standard,
                Mode::Strict => LoadBalancerMode::Strict,
                Mode::Failover => LoadBalancerMode::Failover,
                Mode::Passthrough => LoadBalancerMode::Passthrough,
            },
            health_policy: match HealthPolicy::try_from(lb.health_policy).unwrap_or_default() {
                HealthPolicy::OnlyHealthy => LoadBalancerHealthPolicy::OnlyHealthy,
                HealthPolicy::AllowAll => LoadBalancerHealthPolicy::AllowAll,
            },
        }
    });
    let mut s = Service::new(p.name, p.namespace, p.hostname);
    s.vips = vips;
    s.ports = ports;
    s.app_protocols = app_protocols;
    s.subject_alt_names = p.subject_alt_names;
    s.waypoint = waypoint;
    s.load_balancer = load_balancer;
    s.ip_families = match pw::IpFamilies::try_from(p.ip_families).unwrap_or_default() {
        pw::IpFamilies::Automatic => IpFamilies::Automatic,
        pw::IpFamilies::Ipv4Only => IpFamilies::Ipv4Only,
        pw::IpFamilies::Ipv6Only => IpFamilies::Ipv6Only,
        pw::IpFamilies::Dual => IpFamilies::Dual,
    };
    s.canonical = p.canonical;
    s.visibility = match pw::service::Visibility::try_from(p.visibility).unwrap_or_default() {
        pw::service::Visibility::Public => ambit_state::Visibility::Public,
        pw::service::Visibility::Namespace => ambit_state::Visibility::Namespace,
    };
    Ok(s)
}

fn string_matches(v: Vec<psec::StringMatch>) -> Vec<StringMatch> {
    use psec::string_match::MatchType;
    // A StringMatch without a variant says nothing: dropped, as ztunnel does.
    v.into_iter()
        .filter_map(|m| match m.match_type? {
            MatchType::Exact(s) => Some(StringMatch::Exact(s)),
            MatchType::Prefix(s) => Some(StringMatch::Prefix(s)),
            MatchType::Suffix(s) => Some(StringMatch::Suffix(s)),
            MatchType::Presence(()) => Some(StringMatch::Presence),
        })
        .collect()
}

fn service_accounts(v: Vec<psec::ServiceAccountMatch>) -> Vec<ServiceAccountMatch> {
    v.into_iter()
        .map(|m| ServiceAccountMatch {
            namespace: m.namespace,
            service_account: m.service_account,
        })
        .collect()
}

fn cidrs(v: &[psec::Address]) -> Vec<IpNet> {
    // An address that does not decode is dropped from the list, as ztunnel does.
    v.iter()
        .filter_map(|a| {
            let ip = ambit_state::ip_from_bytes(&a.address).ok()?;
            IpNet::new(ip, u8::try_from(a.length).ok()?).ok()
        })
        .collect()
}

fn ports(field: String, v: &[u32]) -> Result<Vec<u16>, ConvertError> {
    // Refused rather than dropped: dropping the only entry of a list would widen the match.
    v.iter()
        .enumerate()
        .map(|(i, p)| port(|| format!("{field}[{i}]"), *p))
        .collect()
}

/// Decodes and checks an `Authorization` resource (the model's `normalize()` included).
pub fn authorization_from_proto(p: psec::Authorization) -> Result<Authorization, ConvertError> {
    let scope = match psec::Scope::try_from(p.scope).unwrap_or_default() {
        psec::Scope::Global => PolicyScope::Global,
        psec::Scope::Namespace => PolicyScope::Namespace,
        psec::Scope::WorkloadSelector => PolicyScope::WorkloadSelector,
    };
    let action = match psec::Action::try_from(p.action).unwrap_or_default() {
        psec::Action::Allow => PolicyAction::Allow,
        psec::Action::Deny => PolicyAction::Deny,
    };
    let mut rules = Vec::with_capacity(p.rules.len());
    for (r, rule) in p.rules.into_iter().enumerate() {
        let mut clauses = Vec::with_capacity(rule.clauses.len());
        for (c, clause) in rule.clauses.into_iter().enumerate() {
            let mut matches = Vec::with_capacity(clause.matches.len());
            for (m, x) in clause.matches.into_iter().enumerate() {
                let at = |f: &str| format!("rules[{r}].clauses[{c}].matches[{m}].{f}");
                matches.push(RbacMatch {
                    source_ips: cidrs(&x.source_ips),
                    not_source_ips: cidrs(&x.not_source_ips),
                    destination_ips: cidrs(&x.destination_ips),
                    not_destination_ips: cidrs(&x.not_destination_ips),
                    destination_ports: ports(at("destinationPorts"), &x.destination_ports)?,
                    not_destination_ports: ports(
                        at("notDestinationPorts"),
                        &x.not_destination_ports,
                    )?,
                    namespaces: string_matches(x.namespaces),
                    not_namespaces: string_matches(x.not_namespaces),
                    service_accounts: service_accounts(x.service_accounts),
                    not_service_accounts: service_accounts(x.not_service_accounts),
                    principals: string_matches(x.principals),
                    not_principals: string_matches(x.not_principals),
                    ..RbacMatch::default()
                });
            }
            clauses.push(matches);
        }
        rules.push(clauses);
    }
    let mut a = Authorization {
        name: p.name,
        namespace: p.namespace,
        scope,
        action,
        rules,
        dry_run: p.dry_run,
    };
    a.normalize().map_err(model_err)?;
    Ok(a)
}

// ----- to the wire --------------------------------------------------------------------

fn to_proto_network_address(a: &NetworkAddress) -> pw::NetworkAddress {
    pw::NetworkAddress {
        network: a.network.to_string(),
        address: ip_bytes(a.address).into(),
        length: a.prefix_len.map(u32::from),
    }
}

fn ip_bytes(ip: std::net::IpAddr) -> Vec<u8> {
    match ip {
        std::net::IpAddr::V4(v4) => v4.octets().to_vec(),
        std::net::IpAddr::V6(v6) => v6.octets().to_vec(),
    }
}

fn to_proto_gateway(g: &GatewayAddress) -> pw::GatewayAddress {
    pw::GatewayAddress {
        destination: Some(match &g.destination {
            GatewayDestination::Address(a) => {
                pw::gateway_address::Destination::Address(to_proto_network_address(a))
            }
            GatewayDestination::Hostname(h) => {
                pw::gateway_address::Destination::Hostname(pw::NamespacedHostname {
                    namespace: h.namespace.to_string(),
                    hostname: h.hostname.to_string(),
                })
            }
        }),
        hbone_mtls_port: u32::from(g.hbone_mtls_port),
    }
}

fn to_proto_ports(m: &PortMap, protocols: &BTreeMap<u16, AppProtocol>) -> Vec<pw::Port> {
    m.iter()
        .map(|(s, t)| pw::Port {
            service_port: u32::from(*s),
            target_port: u32::from(*t),
            app_protocol: to_proto_app_protocol(protocols.get(s)),
        })
        .collect()
}

/// The wire form of a workload (as `ambit control` serves it).
pub fn to_proto_workload(w: &Workload) -> pw::Workload {
    let workload_type = match w.workload_type.to_ascii_lowercase().as_str() {
        "cronjob" => pw::WorkloadType::Cronjob,
        "pod" => pw::WorkloadType::Pod,
        "job" => pw::WorkloadType::Job,
        _ => pw::WorkloadType::Deployment,
    };
    pw::Workload {
        uid: w.uid.to_string(),
        name: w.name.to_string(),
        namespace: w.namespace.to_string(),
        addresses: w
            .workload_ips
            .iter()
            .map(|ip| ip_bytes(*ip).into())
            .collect(),
        hostname: w.hostname.to_string(),
        network: w.network.to_string(),
        tunnel_protocol: match w.protocol {
            TunnelProtocol::Hbone => pw::TunnelProtocol::Hbone,
            TunnelProtocol::Tcp => pw::TunnelProtocol::None,
            TunnelProtocol::LegacyIstioMtls => pw::TunnelProtocol::LegacyIstioMtls,
        } as i32,
        trust_domain: w.trust_domain.to_string(),
        service_account: w.service_account.to_string(),
        waypoint: w.waypoint.as_deref().map(to_proto_gateway),
        network_gateway: w.network_gateway.as_deref().map(to_proto_gateway),
        node: w.node.to_string(),
        canonical_name: w.canonical_name.to_string(),
        canonical_revision: w.canonical_revision.to_string(),
        workload_type: workload_type as i32,
        workload_name: w.workload_name.to_string(),
        native_tunnel: w.native_tunnel,
        application_tunnel: w
            .application_tunnel
            .as_ref()
            .map(|t| pw::ApplicationTunnel {
                protocol: match t.protocol {
                    AppTunnelProtocol::None => pw::application_tunnel::Protocol::None,
                    AppTunnelProtocol::Proxy => pw::application_tunnel::Protocol::Proxy,
                } as i32,
                port: t.port.map(u32::from).unwrap_or(0),
            }),
        services: w
            .services
            .iter()
            .map(|(k, m)| {
                (
                    k.to_string(),
                    pw::PortList {
                        ports: to_proto_ports(m, &BTreeMap::new()),
                    },
                )
            })
            .collect(),
        authorization_policies: w
            .authorization_policies
            .iter()
            .map(|p| p.to_string())
            .collect(),
        status: match w.status {
            HealthStatus::Healthy => pw::WorkloadStatus::Healthy,
            HealthStatus::Unhealthy => pw::WorkloadStatus::Unhealthy,
        } as i32,
        cluster_id: w.cluster_id.to_string(),
        locality: (w.locality != Locality::default()).then(|| pw::Locality {
            region: w.locality.region.to_string(),
            zone: w.locality.zone.to_string(),
            subzone: w.locality.subzone.to_string(),
        }),
        network_mode: match w.network_mode {
            NetworkMode::Standard => pw::NetworkMode::Standard,
            NetworkMode::HostNetwork => pw::NetworkMode::HostNetwork,
        } as i32,
        extensions: Vec::new(),
        capacity: Some(w.capacity),
    }
}

/// The wire form of a service.
pub fn to_proto_service(s: &Service) -> pw::Service {
    use pw::load_balancing::{HealthPolicy, Mode, Scope};
    pw::Service {
        name: s.name.to_string(),
        namespace: s.namespace.to_string(),
        hostname: s.hostname.to_string(),
        addresses: s.vips.iter().map(to_proto_network_address).collect(),
        ports: to_proto_ports(&s.ports, &s.app_protocols),
        subject_alt_names: s.subject_alt_names.clone(),
        waypoint: s.waypoint.as_ref().map(to_proto_gateway),
        load_balancing: s.load_balancer.as_ref().map(|lb| pw::LoadBalancing {
            routing_preference: lb
                .routing_preferences
                .iter()
                .map(|p| {
                    let scope = match p {
                        LoadBalancerScope::Region => Scope::Region,
                        LoadBalancerScope::Zone => Scope::Zone,
                        LoadBalancerScope::Subzone => Scope::Subzone,
                        LoadBalancerScope::Node => Scope::Node,
                        LoadBalancerScope::Cluster => Scope::Cluster,
                        LoadBalancerScope::Network => Scope::Network,
                    };
                    scope as i32
                })
                .collect(),
            mode: match lb.mode {
                LoadBalancerMode::Standard => Mode::UnspecifiedMode,
                LoadBalancerMode::Strict => Mode::Strict,
                LoadBalancerMode::Failover => Mode::Failover,
                LoadBalancerMode::Passthrough => Mode::Passthrough,
            } as i32,
            health_policy: match lb.health_policy {
                LoadBalancerHealthPolicy::OnlyHealthy => HealthPolicy::OnlyHealthy,
                LoadBalancerHealthPolicy::AllowAll => HealthPolicy::AllowAll,
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
            ambit_state::Visibility::Public => pw::service::Visibility::Public,
            ambit_state::Visibility::Namespace => pw::service::Visibility::Namespace,
        } as i32,
    }
}

/// An `Address` resource holding a workload.
pub fn to_proto_address_workload(w: &Workload) -> pw::Address {
    pw::Address {
        r#type: Some(pw::address::Type::Workload(to_proto_workload(w))),
    }
}

/// An `Address` resource holding a service.
pub fn to_proto_address_service(s: &Service) -> pw::Address {
    pw::Address {
        r#type: Some(pw::address::Type::Service(to_proto_service(s))),
    }
}

fn to_proto_string_matches(v: &[StringMatch]) -> Vec<psec::StringMatch> {
    use psec::string_match::MatchType;
    v.iter()
        .map(|m| psec::StringMatch {
            match_type: Some(match m {
                StringMatch::Exact(s) => MatchType::Exact(s.clone()),
                StringMatch::Prefix(s) => MatchType::Prefix(s.clone()),
                StringMatch::Suffix(s) => MatchType::Suffix(s.clone()),
                StringMatch::Presence => MatchType::Presence(()),
            }),
        })
        .collect()
}

fn to_proto_service_accounts(v: &[ServiceAccountMatch]) -> Vec<psec::ServiceAccountMatch> {
    v.iter()
        .map(|m| psec::ServiceAccountMatch {
            namespace: m.namespace.clone(),
            service_account: m.service_account.clone(),
        })
        .collect()
}

fn to_proto_cidrs(v: &[IpNet]) -> Vec<psec::Address> {
    v.iter()
        .map(|n| psec::Address {
            address: ip_bytes(n.addr()).into(),
            length: u32::from(n.prefix_len()),
        })
        .collect()
}

fn to_proto_ports_list(v: &[u16]) -> Vec<u32> {
    v.iter().map(|p| u32::from(*p)).collect()
}

/// The wire form of a match object's L4 fields.
fn to_proto_match(m: &RbacMatch) -> psec::Match {
    psec::Match {
        namespaces: to_proto_string_matches(&m.namespaces),
        not_namespaces: to_proto_string_matches(&m.not_namespaces),
        service_accounts: to_proto_service_accounts(&m.service_accounts),
        not_service_accounts: to_proto_service_accounts(&m.not_service_accounts),
        principals: to_proto_string_matches(&m.principals),
        not_principals: to_proto_string_matches(&m.not_principals),
        source_ips: to_proto_cidrs(&m.source_ips),
        not_source_ips: to_proto_cidrs(&m.not_source_ips),
        destination_ips: to_proto_cidrs(&m.destination_ips),
        not_destination_ips: to_proto_cidrs(&m.not_destination_ips),
        destination_ports: to_proto_ports_list(&m.destination_ports),
        not_destination_ports: to_proto_ports_list(&m.not_destination_ports),
        extensions: Vec::new(),
    }
}

/// The wire form of a policy. The wire has no field for L7 attributes (paths, methods,
/// ...), so a policy that uses them is written as the node proxy decides it
/// (`ambit_state::policy_matches`), never wider: an ALLOW rule that uses one is left out
/// (it never matches); in a DENY they are left out, and a clause with a match object that
/// has no L4 field besides them is written empty (it matches everything).
pub fn to_proto_authorization(a: &Authorization) -> psec::Authorization {
    let deny = a.action == PolicyAction::Deny;
    psec::Authorization {
        name: a.name.clone(),
        namespace: a.namespace.clone(),
        scope: match a.scope {
            PolicyScope::Global => psec::Scope::Global,
            PolicyScope::Namespace => psec::Scope::Namespace,
            PolicyScope::WorkloadSelector => psec::Scope::WorkloadSelector,
        } as i32,
        action: match a.action {
            PolicyAction::Allow => psec::Action::Allow,
            PolicyAction::Deny => psec::Action::Deny,
        } as i32,
        rules: a
            .rules
            .iter()
            .filter(|rule| deny || !rule.iter().flatten().any(RbacMatch::has_l7))
            .map(|rule| psec::Rule {
                clauses: rule
                    .iter()
                    .map(|clause| psec::Clause {
                        matches: if deny && clause.iter().any(|m| m.has_l7() && m.has_no_l4_field())
                        {
                            Vec::new()
                        } else {
                            clause.iter().map(to_proto_match).collect()
                        },
                    })
                    .collect(),
            })
            .collect(),
        dry_run: a.dry_run,
        extensions: Vec::new(),
    }
}

#[cfg(test)]
mod tests;
