//! Services: a hostname, VIPs and ports in front of the workloads that serve them.

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::addr::NetworkAddress;
use crate::name::Name;
use crate::names::string_enum;
use crate::ports::PortMap;
use crate::workload::{check_gateway, GatewayAddress};

string_enum! {
    /// How endpoints are chosen.
    #[derive(Default)]
    pub enum LoadBalancerMode {
        /// No locality preference (proto `UNSPECIFIED_MODE`).
        #[default]
        Standard = "Standard" | "UNSPECIFIED_MODE",
        /// Only endpoints matching every routing preference.
        Strict = "Strict" | "STRICT",
        /// Prefer endpoints matching the most leading routing preferences.
        Failover = "Failover" | "FAILOVER",
        /// Do not pick an endpoint: send to the dialed address as is.
        Passthrough = "Passthrough" | "PASSTHROUGH",
    }
}

string_enum! {
    /// A locality scope compared between the source and an endpoint.
    pub enum LoadBalancerScope {
        Region = "Region" | "REGION",
        Zone = "Zone" | "ZONE",
        Subzone = "Subzone" | "SUBZONE",
        Node = "Node" | "NODE",
        Cluster = "Cluster" | "CLUSTER",
        Network = "Network" | "NETWORK",
    }
}

string_enum! {
    /// What a service port speaks, as the control plane declared it (the port's
    /// `appProtocol` or name prefix); what a waypoint parses it as.
    pub enum AppProtocol {
        Http11 = "HTTP11" | "HTTP",
        Http2 = "HTTP2",
        Grpc = "GRPC",
        Tcp = "TCP",
        Tls = "TLS",
    }
}

string_enum! {
    /// Which endpoints may receive traffic.
    #[derive(Default)]
    pub enum LoadBalancerHealthPolicy {
        /// Unhealthy endpoints are skipped.
        #[default]
        OnlyHealthy = "OnlyHealthy" | "ONLY_HEALTHY",
        /// All endpoints are candidates.
        AllowAll = "AllowAll" | "ALLOW_ALL",
    }
}

string_enum! {
    /// Which endpoint address families a service may use.
    #[derive(Default)]
    pub enum IpFamilies {
        #[default]
        Automatic = "Automatic" | "AUTOMATIC",
        Ipv4Only = "IPv4" | "IPV4_ONLY" | "IPv4Only",
        Ipv6Only = "IPv6" | "IPV6_ONLY" | "IPv6Only",
        Dual = "Dual" | "DUAL",
    }
}

impl IpFamilies {
    /// ztunnel leaves the default out of `/config_dump`.
    pub fn is_automatic(&self) -> bool {
        *self == IpFamilies::Automatic
    }
}

string_enum! {
    /// Who may reach a service by its VIP.
    #[derive(Default)]
    pub enum Visibility {
        /// Everyone.
        #[default]
        Public = "Public" | "PUBLIC",
        /// Only workloads in the service's namespace.
        Namespace = "Namespace" | "NAMESPACE",
    }
}

/// A service's load-balancing settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LoadBalancer {
    /// `routingPreferences`, as ztunnel's local config names it (`routingPreference`, the
    /// name ambit read before, is still accepted).
    #[serde(default, alias = "routingPreference")]
    pub routing_preferences: Vec<LoadBalancerScope>,
    #[serde(default)]
    pub mode: LoadBalancerMode,
    #[serde(default)]
    pub health_policy: LoadBalancerHealthPolicy,
}

/// A service of the mesh.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Service {
    pub name: Name,
    pub namespace: Name,
    pub hostname: Name,
    /// Virtual IPs, `<network>/<ip>` (empty for a headless service).
    #[serde(default)]
    pub vips: Vec<NetworkAddress>,
    /// Service port → target port (0: a named port, resolved per endpoint).
    #[serde(default)]
    pub ports: PortMap,
    /// Service port → its declared protocol; a port not listed is undeclared.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub app_protocols: BTreeMap<u16, AppProtocol>,
    /// Identities the service's endpoints may present, besides their own.
    #[serde(default)]
    pub subject_alt_names: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waypoint: Option<GatewayAddress>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_balancer: Option<LoadBalancer>,
    #[serde(default, skip_serializing_if = "IpFamilies::is_automatic")]
    pub ip_families: IpFamilies,
    /// Preferred when several services share a VIP or hostname.
    #[serde(default)]
    pub canonical: bool,
    #[serde(default)]
    pub visibility: Visibility,
}

impl Service {
    /// A service with the given identity and every other field at its default.
    pub fn new(
        name: impl Into<Name>,
        namespace: impl Into<Name>,
        hostname: impl Into<Name>,
    ) -> Self {
        Service {
            name: name.into(),
            namespace: namespace.into(),
            hostname: hostname.into(),
            vips: Vec::new(),
            ports: PortMap::new(),
            app_protocols: BTreeMap::new(),
            subject_alt_names: Vec::new(),
            waypoint: None,
            load_balancer: None,
            ip_families: IpFamilies::Automatic,
            canonical: false,
            visibility: Visibility::Public,
        }
    }

    /// The key workloads use to name this service: `namespace/hostname`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.hostname)
    }

    /// Checks the service. The error names the field at fault.
    pub fn normalize(&mut self) -> Result<(), String> {
        if self.name.is_empty() {
            return Err("name: must not be empty".into());
        }
        if self.namespace.is_empty() || self.namespace.contains('/') {
            return Err("namespace: must be non-empty and contain no '/'".into());
        }
        if self.hostname.is_empty() || self.hostname.contains('/') {
            return Err("hostname: must be non-empty and contain no '/'".into());
        }
        if let Some(gw) = &self.waypoint {
            check_gateway(gw).map_err(|e| format!("waypoint: {e}"))?;
        }
        Ok(())
    }

    /// True if a workload in `namespace` may reach this service by VIP.
    pub fn visible_to(&self, namespace: &str) -> bool {
        match self.visibility {
            Visibility::Public => true,
            Visibility::Namespace => self.namespace == namespace,
        }
    }

    /// The load-balancing mode (Standard when unset).
    pub fn lb_mode(&self) -> LoadBalancerMode {
        self.load_balancer
            .as_ref()
            .map(|lb| lb.mode)
            .unwrap_or_default()
    }

    /// The health policy (OnlyHealthy when unset).
    pub fn health_policy(&self) -> LoadBalancerHealthPolicy {
        self.load_balancer
            .as_ref()
            .map(|lb| lb.health_policy)
            .unwrap_or_default()
    }

    /// True if the service's `ip_families` allows sending to `ip`.
    pub fn allows_ip(&self, ip: IpAddr) -> bool {
        match self.ip_families {
            IpFamilies::Automatic | IpFamilies::Dual => true,
            IpFamilies::Ipv4Only => ip.is_ipv4(),
            IpFamilies::Ipv6Only => ip.is_ipv6(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn visibility_and_families() {
        let mut s = Service::new("echo", "default", "echo.default.svc.cluster.local");
        assert!(s.visible_to("other"));
        s.visibility = Visibility::Namespace;
        assert!(s.visible_to("default"));
        assert!(!s.visible_to("other"));
        assert!(s.allows_ip("fd00::1".parse().unwrap()));
        s.ip_families = IpFamilies::Ipv4Only;
        assert!(!s.allows_ip("fd00::1".parse().unwrap()));
        assert!(s.allows_ip("10.0.0.1".parse().unwrap()));
        assert_eq!(s.key(), "default/echo.default.svc.cluster.local");
        assert_eq!(s.lb_mode(), LoadBalancerMode::Standard);
    }

    #[test]
    fn normalize_checks() {
        let mut s = Service::new("", "default", "h");
        assert!(s.normalize().unwrap_err().starts_with("name"));
        let mut s = Service::new("n", "", "h");
        assert!(s.normalize().unwrap_err().starts_with("namespace"));
        let mut s = Service::new("n", "ns", "a/b");
        assert!(s.normalize().unwrap_err().starts_with("hostname"));
    }
}
