//! Workloads: the pods (or VMs) of the mesh, as ztunnel's `istio.workload.Workload`.

use std::net::IpAddr;

use ambit_identity::SpiffeId;
use serde::{de, Deserialize, Deserializer, Serialize, Serializer};

use crate::addr::{AddressError, NamespacedHostname, NetworkAddress};
use crate::ident;
use crate::name::Name;
use crate::names::string_enum;
use crate::ports::ServicePorts;

/// Trust domain used when a workload leaves it empty.
pub const DEFAULT_TRUST_DOMAIN: &str = "cluster.local";
/// Service account used when a workload leaves it empty.
pub const DEFAULT_SERVICE_ACCOUNT: &str = "default";
/// Cluster id used when a workload leaves it empty.
pub const DEFAULT_CLUSTER_ID: &str = "Kubernetes";
/// Workload type used when a workload leaves it empty.
pub const DEFAULT_WORKLOAD_TYPE: &str = "deployment";
/// The HBONE port, used when a gateway address names none.
pub const DEFAULT_HBONE_PORT: u16 = ambit_wellknown::ports::HBONE;

string_enum! {
    /// How a workload receives mesh traffic.
    #[derive(Default)]
    pub enum TunnelProtocol {
        /// HBONE (mTLS HTTP/2 CONNECT on 15008).
        Hbone = "HBONE",
        /// Plain TCP: the workload is not captured by the mesh.
        #[default]
        Tcp = "TCP" | "NONE",
        /// Istio mTLS to the workload's own port: a pod with a sidecar (the middle of a
        /// sidecar to ambient migration). Waypoints reach it so; node proxies never choose
        /// it as a service endpoint (ztunnel refuses such workloads), and send to its
        /// address as to any workload outside the mesh.
        LegacyIstioMtls = "LEGACY_ISTIO_MTLS",
    }
}

string_enum! {
    /// Workload health; unhealthy workloads receive service traffic only under `AllowAll`.
    #[derive(Default)]
    pub enum HealthStatus {
        #[default]
        Healthy = "Healthy" | "HEALTHY",
        Unhealthy = "Unhealthy" | "UNHEALTHY",
    }
}

string_enum! {
    /// Pod network or host network; host-network workloads are not indexed by IP.
    #[derive(Default)]
    pub enum NetworkMode {
        #[default]
        Standard = "Standard" | "STANDARD",
        HostNetwork = "HostNetwork" | "HOST_NETWORK",
    }
}

string_enum! {
    /// How traffic is handed to a workload that terminates tunnels itself.
    #[derive(Default)]
    pub enum AppTunnelProtocol {
        /// Plain bytes.
        #[default]
        None = "NONE" | "None",
        /// A PROXY protocol v2 header first.
        Proxy = "PROXY" | "Proxy",
    }
}

/// Where a workload runs, for locality-aware load balancing.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Locality {
    #[serde(default)]
    pub region: Name,
    #[serde(default)]
    pub zone: Name,
    #[serde(default)]
    pub subzone: Name,
}

/// A workload's application tunnel (the workload itself accepts tunneled traffic).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ApplicationTunnel {
    #[serde(default)]
    pub protocol: AppTunnelProtocol,
    /// Port to deliver tunneled traffic to; `None` (or 0 on the wire) keeps the target port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
}

/// The target of a gateway address: an IP in a network, or a service by hostname.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum GatewayDestination {
    Address(NetworkAddress),
    Hostname(NamespacedHostname),
}

impl Serialize for GatewayDestination {
    /// A string either way, as ztunnel writes it: `"<network>/<ip>"` or
    /// `"<namespace>/<hostname>"`.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            GatewayDestination::Address(a) => a.serialize(s),
            GatewayDestination::Hostname(h) => s.collect_str(h),
        }
    }
}

impl<'de> Deserialize<'de> for GatewayDestination {
    /// A string `"<network>/<ip>"` or `"<namespace>/<hostname>"` (ztunnel's forms: an
    /// address when the part after the slash is an IP), or a map `{namespace, hostname}`.
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> de::Visitor<'de> for V {
            type Value = GatewayDestination;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(
                    "\"<network>/<ip>\", \"<namespace>/<hostname>\" or {namespace, hostname}",
                )
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                match v.parse::<NetworkAddress>() {
                    Ok(a) => Ok(GatewayDestination::Address(a)),
                    // An address after all, just one we refuse: never a hostname.
                    Err(e @ AddressError::Ipv4Mapped { .. }) => Err(E::custom(e)),
                    Err(address_error) => v
                        .parse::<NamespacedHostname>()
                        .map(GatewayDestination::Hostname)
                        .map_err(|_| {
                            E::custom(format!("{address_error}, nor a \"<namespace>/<hostname>\""))
                        }),
                }
            }
            fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                NamespacedHostname::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(GatewayDestination::Hostname)
            }
        }
        d.deserialize_any(V)
    }
}

/// A waypoint or network gateway: where to send HBONE for a workload or service.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GatewayAddress {
    pub destination: GatewayDestination,
    /// The gateway's HBONE (mTLS) port.
    #[serde(default = "default_hbone_port", alias = "hbonePort")]
    pub hbone_mtls_port: u16,
}

fn default_hbone_port() -> u16 {
    DEFAULT_HBONE_PORT
}

fn default_capacity() -> u32 {
    1
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn is_default_locality(l: &Locality) -> bool {
    *l == Locality::default()
}

/// A workload: one pod (or VM) of the mesh.
///
/// Fields hold what the configuration says, empty strings included, and `/config_dump`
/// shows them that way, as ztunnel does: the defaults an empty field stands for (trust
/// domain, service account, workload type, cluster id) are applied where the value is
/// used, by [`Workload::identity`], [`Workload::workload_type_or_default`] and the
/// telemetry. Only the uid is filled in ([`Workload::normalize`]), since the store is keyed
/// by it. Serialization omits the fields ztunnel omits when empty or default.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Workload {
    /// Unique id; defaults to `<clusterId or Kubernetes>//v1/Pod/<namespace>/<name>`.
    #[serde(default, skip_serializing_if = "str::is_empty")]
    pub uid: Name,
    pub name: Name,
    pub namespace: Name,
    #[serde(default, skip_serializing_if = "str::is_empty")]
    pub service_account: Name,
    #[serde(default, skip_serializing_if = "str::is_empty")]
    pub trust_domain: Name,
    #[serde(default, skip_serializing_if = "str::is_empty")]
    pub node: Name,
    #[serde(default, skip_serializing_if = "str::is_empty")]
    pub network: Name,
    /// As configured: ztunnel shows an empty cluster id as `""` and reports it as unknown.
    #[serde(default)]
    pub cluster_id: Name,
    #[serde(default, skip_serializing_if = "str::is_empty")]
    pub canonical_name: Name,
    #[serde(default, skip_serializing_if = "str::is_empty")]
    pub canonical_revision: Name,
    #[serde(default, skip_serializing_if = "str::is_empty")]
    pub workload_name: Name,
    #[serde(default, skip_serializing_if = "str::is_empty")]
    pub workload_type: Name,
    #[serde(default, skip_serializing_if = "str::is_empty")]
    pub hostname: Name,
    #[serde(default, with = "crate::addr::ip_list")]
    pub workload_ips: Vec<IpAddr>,
    #[serde(default)]
    pub protocol: TunnelProtocol,
    #[serde(default)]
    pub network_mode: NetworkMode,
    #[serde(default)]
    pub status: HealthStatus,
    #[serde(default, skip_serializing_if = "is_default_locality")]
    pub locality: Locality,
    /// Relative load-balancing weight (unset ⇒ 1).
    #[serde(default = "default_capacity")]
    pub capacity: u32,
    /// `namespace/name` of the WORKLOAD_SELECTOR policies that select this workload.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub authorization_policies: Vec<Name>,
    #[serde(default, skip_serializing_if = "is_false")]
    pub native_tunnel: bool,
    /// Boxed, as the network gateway: most workloads have neither, and a workload is held
    /// once per pod of the mesh.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waypoint: Option<Box<GatewayAddress>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_gateway: Option<Box<GatewayAddress>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub application_tunnel: Option<ApplicationTunnel>,
    /// Services this workload serves: `namespace/hostname` → { service port: target port }.
    #[serde(default)]
    pub services: ServicePorts,
}

impl Workload {
    /// A workload with the given name and namespace and every other field at its default.
    pub fn new(name: impl Into<Name>, namespace: impl Into<Name>) -> Self {
        Workload {
            uid: Name::empty(),
            name: name.into(),
            namespace: namespace.into(),
            service_account: Name::empty(),
            trust_domain: Name::empty(),
            node: Name::empty(),
            network: Name::empty(),
            cluster_id: Name::empty(),
            canonical_name: Name::empty(),
            canonical_revision: Name::empty(),
            workload_name: Name::empty(),
            workload_type: Name::empty(),
            hostname: Name::empty(),
            workload_ips: Vec::new(),
            protocol: TunnelProtocol::Tcp,
            network_mode: NetworkMode::Standard,
            status: HealthStatus::Healthy,
            locality: Locality::default(),
            capacity: 1,
            authorization_policies: Vec::new(),
            native_tunnel: false,
            waypoint: None,
            network_gateway: None,
            application_tunnel: None,
            services: ServicePorts::new(),
        }
    }

    /// The workload's SPIFFE identity, `spiffe://<trust domain>/ns/<namespace>/sa/<sa>`,
    /// with the defaults for empty fields.
    ///
    /// Workloads in a [`crate::ProxyState`] were checked on insert, so this cannot fail
    /// for them; use [`Workload::try_identity`] for a workload that was never checked.
    pub fn identity(&self) -> SpiffeId {
        match self.try_identity() {
            Ok(id) => id,
            Err(_) => ident::unusable_identity(),
        }
    }

    /// The workload's SPIFFE identity, or why its fields do not make one.
    pub fn try_identity(&self) -> Result<SpiffeId, String> {
        ident::make(
            or_default(&self.trust_domain, DEFAULT_TRUST_DOMAIN),
            &self.namespace,
            or_default(&self.service_account, DEFAULT_SERVICE_ACCOUNT),
        )
    }

    /// True for a host-network workload (shares the node's IP; never looked up by IP).
    pub fn is_host_network(&self) -> bool {
        self.network_mode == NetworkMode::HostNetwork
    }

    /// The workload type baggage and telemetry name (`deployment` when empty).
    pub fn workload_type_or_default(&self) -> &str {
        or_default(&self.workload_type, DEFAULT_WORKLOAD_TYPE)
    }

    /// Fills in the uid when empty and checks the workload; other empty fields stay as
    /// configured (see the type's documentation). The error names the field at fault.
    pub fn normalize(&mut self) -> Result<(), String> {
        if self.name.is_empty() {
            return Err("name: must not be empty".into());
        }
        if self.namespace.is_empty() {
            return Err("namespace: must not be empty".into());
        }
        if self.uid.is_empty() {
            self.uid = format!(
                "{}//v1/Pod/{}/{}",
                or_default(&self.cluster_id, DEFAULT_CLUSTER_ID),
                self.namespace,
                self.name
            )
            .into();
        }
        self.try_identity()
            .map_err(|e| format!("identity (trustDomain/namespace/serviceAccount): {e}"))?;
        for key in self.services.keys() {
            key.parse::<NamespacedHostname>()
                .map_err(|e| format!("services: key {e}"))?;
        }
        for (field, gw) in [
            ("waypoint", &self.waypoint),
            ("networkGateway", &self.network_gateway),
        ] {
            if let Some(gw) = gw {
                check_gateway(gw).map_err(|e| format!("{field}: {e}"))?;
            }
        }
        if let Some(t) = &mut self.application_tunnel {
            if t.port == Some(0) {
                t.port = None;
            }
        }
        Ok(())
    }

    /// The IP to use for this workload when the caller dialed `dialed`: the dialed IP if it
    /// is one of ours, else our first IP of the same family, else our first IP.
    pub fn pick_ip(&self, dialed: IpAddr) -> Option<IpAddr> {
        if self.workload_ips.contains(&dialed) {
            return Some(dialed);
        }
        self.workload_ips
            .iter()
            .find(|ip| ip.is_ipv4() == dialed.is_ipv4())
            .or_else(|| self.workload_ips.first())
            .copied()
    }
}

/// Checks a gateway address (the destination is required by the type; the port must be set).
pub fn check_gateway(gw: &GatewayAddress) -> Result<(), String> {
    if gw.hbone_mtls_port == 0 {
        return Err("hboneMtlsPort: must not be 0".into());
    }
    if let GatewayDestination::Hostname(h) = &gw.destination {
        if h.namespace.is_empty() || h.hostname.is_empty() {
            return Err("destination: namespace and hostname must not be empty".into());
        }
    }
    Ok(())
}

fn or_default<'a>(v: &'a str, default: &'a str) -> &'a str {
    if v.is_empty() {
        default
    } else {
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalize_defaults() {
        let mut w = Workload::new("client", "default");
        w.normalize().unwrap();
        assert_eq!(w.uid, "Kubernetes//v1/Pod/default/client");
        // As configured, as ztunnel keeps them; the defaults apply where they are used.
        assert_eq!(w.trust_domain, "");
        assert_eq!(w.service_account, "");
        assert_eq!(w.cluster_id, "");
        assert_eq!(w.workload_type_or_default(), "deployment");
        w.uid = Name::empty();
        w.cluster_id = "c1".into();
        w.normalize().unwrap();
        assert_eq!(w.uid, "c1//v1/Pod/default/client");
        assert_eq!(
            w.identity().to_string(),
            "spiffe://cluster.local/ns/default/sa/default"
        );
    }

    #[test]
    fn identity_without_normalize() {
        let mut w = Workload::new("client", "ns1");
        w.service_account = "sa1".into();
        w.trust_domain = "example.org".into();
        assert_eq!(
            w.identity().to_string(),
            "spiffe://example.org/ns/ns1/sa/sa1"
        );
    }

    #[test]
    fn pick_ip_prefers_family() {
        let mut w = Workload::new("a", "b");
        w.workload_ips = vec!["fd00::2".parse().unwrap(), "10.0.0.2".parse().unwrap()];
        assert_eq!(
            w.pick_ip("10.9.9.9".parse().unwrap()),
            Some("10.0.0.2".parse().unwrap())
        );
        assert_eq!(
            w.pick_ip("fd00::9".parse().unwrap()),
            Some("fd00::2".parse().unwrap())
        );
        assert_eq!(
            w.pick_ip("10.0.0.2".parse().unwrap()),
            Some("10.0.0.2".parse().unwrap())
        );
        w.workload_ips.truncate(1);
        assert_eq!(
            w.pick_ip("10.9.9.9".parse().unwrap()),
            Some("fd00::2".parse().unwrap())
        );
    }
}
