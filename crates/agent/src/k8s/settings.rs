//! The agent's Kubernetes-mode configuration, from the environment the istio-cni chart sets
//! (its ConfigMap `istio-cni-config` and the DaemonSet's env; reference §5.2). Sans IO: the
//! parser takes a lookup function, so it is tested without touching the process env.

pub use crate::env::ConfigError;
use crate::env::{err, parse_bool};
use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;

use ambit_k8s::enablement::{default_raw_selectors, parse_selectors, validate};
use ambit_k8s::{labels, Enablement};

/// Where the host's netns is reached from inside the agent's pod (`ALLOW_SWITCH_TO_HOST_NS`).
pub const HOST_NETNS: &str = "/host/proc/1/ns/net";
/// The host's `/proc` as the chart mounts it.
pub const DEFAULT_PROC_ROOT: &str = "/host/proc";
pub const DEFAULT_RUN_DIR: &str = "/var/run/istio-cni";
pub const DEFAULT_ZTUNNEL_UDS: &str = "/var/run/ztunnel/ztunnel.sock";
pub const DEFAULT_MONITORING_PORT: u16 = 15014;
/// The health port (`/healthz`, `/readyz`), fixed in Istio.
pub const HEALTH_PORT: u16 = 8000;
const DEFAULT_SNAT_V4: Ipv4Addr = ambit_wellknown::probes::SNAT_V4;
const DEFAULT_SNAT_V6: Ipv6Addr = ambit_wellknown::probes::SNAT_V6;

/// Everything Kubernetes mode needs besides the API client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct K8sConfig {
    /// `AMBIENT_ENABLED`: without it the agent has nothing to do in ambient mode.
    pub ambient_enabled: bool,
    /// `AMBIENT_ENABLEMENT_SELECTOR` and `EXCLUDE_NAMESPACES`.
    pub enablement: Enablement,
    /// `AMBIENT_DNS_CAPTURE` (default true).
    pub dns_capture: bool,
    /// `AMBIENT_IPV6` (default true).
    pub ipv6: bool,
    /// `AMBIENT_RECONCILE_POD_RULES_ON_STARTUP` (default true): re-apply the in-pod rules of
    /// the snapshot pods at startup.
    pub reconcile_on_startup: bool,
    /// `CNI_AGENT_RUN_DIR`: holds `pluginevent.sock`.
    pub run_dir: PathBuf,
    /// `ZTUNNEL_UDS_ADDRESS`: the ZDS socket.
    pub zds_socket: PathBuf,
    /// `SYSTEM_NAMESPACE`: where ztunnel pods live.
    pub system_namespace: String,
    /// `NODE_NAME`, else `KUBERNETES_NODE_NAME`, else the hostname.
    pub node_name: String,
    /// `POD_NAME`, `POD_NAMESPACE`: the agent's own pod (for messages).
    pub pod_name: String,
    pub pod_namespace: String,
    /// `ALLOW_SWITCH_TO_HOST_NS`: host rules and ipsets go into [`HOST_NETNS`].
    pub host_netns: Option<PathBuf>,
    /// The host's `/proc` (`AMBIT_HOST_PROC`, default [`DEFAULT_PROC_ROOT`]).
    pub proc_root: PathBuf,
    /// Where the host's root is mounted: the plugin's netns paths are opened under it
    /// (`AMBIT_HOST_ROOT`, default `/host`, as Istio's `/host` + `CNI_NETNS`).
    pub host_root: PathBuf,
    /// `/healthz` and `/readyz` (`:8000`).
    pub health_addr: SocketAddr,
    /// `/metrics` (`MONITORING_PORT`, default 15014).
    pub metrics_addr: SocketAddr,
    /// Where the enrolled pods are kept between restarts of one agent process tree.
    pub state_dir: PathBuf,
    /// `AMBIT_CNI_PLUGIN_UID`: the uid the CNI plugin runs as, when not root. Only root,
    /// the agent's own uid and this one may call `pluginevent.sock` (checked with
    /// `SO_PEERCRED`).
    pub plugin_uid: Option<u32>,
    /// `AMBIT_ZDS_PROXY_UID`: the uid the node proxy runs as, when not root (the ZDS
    /// socket's peer check, as `ambit agent --zds-proxy-uid`).
    pub zds_proxy_uid: Option<u32>,
}

impl K8sConfig {
    /// From the process environment; `hostname` is the fallback node name.
    pub fn from_env(hostname: &str) -> Result<K8sConfig, ConfigError> {
        K8sConfig::from_lookup(|k| std::env::var(k).ok(), hostname)
    }

    /// From `lookup` (an empty value counts as unset, as with Istio's env vars).
    pub fn from_lookup(
        lookup: impl Fn(&str) -> Option<String>,
        hostname: &str,
    ) -> Result<K8sConfig, ConfigError> {
        let get = |k: &str| lookup(k).filter(|v| !v.is_empty());
        let flag = |name: &'static str, default: bool| match get(name) {
            Some(v) => parse_bool(name, v.trim()),
            None => Ok(default),
        };
        let selectors = match get("AMBIENT_ENABLEMENT_SELECTOR") {
            Some(v) => parse_selectors(&v)
                .map_err(|e| err("AMBIENT_ENABLEMENT_SELECTOR", &v, e.to_string()))?,
            None => validate(&default_raw_selectors()).unwrap_or_default(),
        };
        let exclude_namespaces: BTreeSet<String> = match get("EXCLUDE_NAMESPACES") {
            Some(v) => v
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect(),
            None => BTreeSet::from(["kube-system".to_owned()]),
        };
        let port = |name: &'static str, default: u16| match get(name) {
            Some(v) => v
                .trim()
                .parse::<u16>()
                .map_err(|_| err(name, &v, "expected a port number (0-65535)")),
            None => Ok(default),
        };
        let monitoring = port("MONITORING_PORT", DEFAULT_MONITORING_PORT)?;
        let uid = |name: &'static str| match get(name) {
            Some(v) => v
                .trim()
                .parse::<u32>()
                .map(Some)
                .map_err(|_| err(name, &v, "expected a numeric uid")),
            None => Ok(None),
        };
        // The probe SNAT address is built into the rule sets (Istio's defaults); another one
        // would silently not match the host rules, so it is refused.
        for (name, default) in [
            ("HOST_PROBE_SNAT_IP", IpAddr::V4(DEFAULT_SNAT_V4)),
            ("HOST_PROBE_SNAT_IPV6", IpAddr::V6(DEFAULT_SNAT_V6)),
        ] {
            if let Some(v) = get(name) {
                let ip: IpAddr = v
                    .trim()
                    .parse()
                    .map_err(|_| err(name, &v, "expected an IP address"))?;
                if ip != default {
                    return Err(err(
                        name,
                        &v,
                        format!("only the default {default} is supported; unset it"),
                    ));
                }
            }
        }
        let node_name = get("NODE_NAME")
            .or_else(|| get("KUBERNETES_NODE_NAME"))
            .unwrap_or_else(|| hostname.to_owned());
        if node_name.is_empty() {
            return Err(err(
                "NODE_NAME",
                "",
                "the node name is unknown: set NODE_NAME (the chart sets it from spec.nodeName)",
            ));
        }
        let run_dir = PathBuf::from(get("CNI_AGENT_RUN_DIR").unwrap_or(DEFAULT_RUN_DIR.into()));
        Ok(K8sConfig {
            ambient_enabled: flag("AMBIENT_ENABLED", false)?,
            enablement: Enablement {
                selectors,
                exclude_namespaces,
            },
            dns_capture: flag("AMBIENT_DNS_CAPTURE", true)?,
            ipv6: flag("AMBIENT_IPV6", true)?,
            reconcile_on_startup: flag("AMBIENT_RECONCILE_POD_RULES_ON_STARTUP", true)?,
            state_dir: run_dir.join("ambit-pods"),
            run_dir,
            zds_socket: get("ZTUNNEL_UDS_ADDRESS")
                .unwrap_or(DEFAULT_ZTUNNEL_UDS.into())
                .into(),
            system_namespace: get("SYSTEM_NAMESPACE")
                .unwrap_or(labels::DEFAULT_SYSTEM_NAMESPACE.into()),
            node_name,
            pod_name: get("POD_NAME").unwrap_or_default(),
            pod_namespace: get("POD_NAMESPACE").unwrap_or_default(),
            host_netns: flag("ALLOW_SWITCH_TO_HOST_NS", false)?.then(|| HOST_NETNS.into()),
            host_root: get("AMBIT_HOST_ROOT").unwrap_or("/host".into()).into(),
            proc_root: get("AMBIT_HOST_PROC")
                .unwrap_or(DEFAULT_PROC_ROOT.into())
                .into(),
            health_addr: SocketAddr::from((Ipv4Addr::UNSPECIFIED, HEALTH_PORT)),
            metrics_addr: SocketAddr::from((Ipv4Addr::UNSPECIFIED, monitoring)),
            plugin_uid: uid("AMBIT_CNI_PLUGIN_UID")?,
            zds_proxy_uid: uid("AMBIT_ZDS_PROXY_UID")?,
        })
    }

    /// `<run_dir>/pluginevent.sock`.
    pub fn plugin_socket(&self) -> PathBuf {
        self.run_dir.join(ambit_cni::istio_api::SOCKET_NAME)
    }

    /// Whether `pod` (namespace, labels) is a ztunnel pod, which the agent never enrolls.
    pub fn is_ztunnel(
        &self,
        namespace: &str,
        pod_labels: &std::collections::BTreeMap<String, String>,
    ) -> bool {
        namespace == self.system_namespace
            && pod_labels.get(labels::APP_LABEL).map(String::as_str) == Some(labels::ZTUNNEL_APP)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn parse(vars: &[(&str, &str)]) -> Result<K8sConfig, ConfigError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        K8sConfig::from_lookup(|k| map.get(k).cloned(), "host-1")
    }

    #[test]
    fn defaults_are_the_charts() {
        let c = parse(&[]).unwrap();
        assert!(!c.ambient_enabled);
        assert!(c.dns_capture && c.ipv6 && c.reconcile_on_startup);
        assert_eq!(c.enablement, Enablement::default());
        assert_eq!(
            c.plugin_socket(),
            PathBuf::from("/var/run/istio-cni/pluginevent.sock")
        );
        assert_eq!(c.zds_socket, PathBuf::from(DEFAULT_ZTUNNEL_UDS));
        assert_eq!(c.system_namespace, "istio-system");
        assert_eq!(c.node_name, "host-1");
        assert_eq!(c.host_netns, None);
        assert_eq!(c.proc_root, PathBuf::from("/host/proc"));
        assert_eq!(c.host_root, PathBuf::from("/host"));
        assert_eq!(c.metrics_addr.port(), 15014);
        assert_eq!(c.health_addr.port(), 8000);
        assert_eq!((c.plugin_uid, c.zds_proxy_uid), (None, None));
    }

    #[test]
    fn every_variable_is_read() {
        let c = parse(&[
            ("AMBIENT_ENABLED", "true"),
            (
                "AMBIENT_ENABLEMENT_SELECTOR",
                "- podSelector:\n    matchLabels: {team: mesh}\n",
            ),
            ("AMBIENT_DNS_CAPTURE", "false"),
            ("AMBIENT_IPV6", "0"),
            ("AMBIENT_RECONCILE_POD_RULES_ON_STARTUP", "F"),
            ("EXCLUDE_NAMESPACES", "kube-system, istio-system,,x"),
            ("CNI_AGENT_RUN_DIR", "/run/a"),
            ("ZTUNNEL_UDS_ADDRESS", "/run/z.sock"),
            ("MONITORING_PORT", "9000"),
            ("SYSTEM_NAMESPACE", "mesh"),
            ("KUBERNETES_NODE_NAME", "node-b"),
            ("POD_NAME", "istio-cni-node-x"),
            ("POD_NAMESPACE", "mesh"),
            ("HOST_PROBE_SNAT_IP", "169.254.7.127"),
            ("ALLOW_SWITCH_TO_HOST_NS", "true"),
            ("AMBIT_HOST_PROC", "/tmp/proc"),
            ("AMBIT_HOST_ROOT", "/"),
            ("AMBIT_CNI_PLUGIN_UID", "1337"),
            ("AMBIT_ZDS_PROXY_UID", " 65534 "),
        ])
        .unwrap();
        assert_eq!((c.plugin_uid, c.zds_proxy_uid), (Some(1337), Some(65534)));
        assert!(c.ambient_enabled && !c.dns_capture && !c.ipv6 && !c.reconcile_on_startup);
        assert_eq!(c.enablement.selectors.len(), 1);
        assert_eq!(
            c.enablement.exclude_namespaces,
            BTreeSet::from(["kube-system".into(), "istio-system".into(), "x".into()])
        );
        assert_eq!(c.plugin_socket(), PathBuf::from("/run/a/pluginevent.sock"));
        assert_eq!(c.zds_socket, PathBuf::from("/run/z.sock"));
        assert_eq!(c.metrics_addr.port(), 9000);
        assert_eq!(c.system_namespace, "mesh");
        assert_eq!(c.node_name, "node-b");
        assert_eq!(
            (c.pod_name.as_str(), c.pod_namespace.as_str()),
            ("istio-cni-node-x", "mesh")
        );
        assert_eq!(c.host_netns, Some(PathBuf::from(HOST_NETNS)));
        assert_eq!(c.proc_root, PathBuf::from("/tmp/proc"));
        assert_eq!(c.host_root, PathBuf::from("/"));
        let c = parse(&[("NODE_NAME", "a"), ("KUBERNETES_NODE_NAME", "b")]).unwrap();
        assert_eq!(c.node_name, "a");
    }

    #[test]
    fn errors_name_the_variable() {
        for (vars, name) in [
            (vec![("AMBIENT_ENABLED", "yes")], "AMBIENT_ENABLED"),
            (vec![("AMBIENT_IPV6", "on")], "AMBIENT_IPV6"),
            (vec![("MONITORING_PORT", "70000")], "MONITORING_PORT"),
            (
                vec![("AMBIENT_ENABLEMENT_SELECTOR", "- podSelectr: {}")],
                "AMBIENT_ENABLEMENT_SELECTOR",
            ),
            (
                vec![("HOST_PROBE_SNAT_IP", "10.0.0.1")],
                "HOST_PROBE_SNAT_IP",
            ),
            (
                vec![("HOST_PROBE_SNAT_IPV6", "nope")],
                "HOST_PROBE_SNAT_IPV6",
            ),
            (
                vec![("ALLOW_SWITCH_TO_HOST_NS", "x")],
                "ALLOW_SWITCH_TO_HOST_NS",
            ),
            (
                vec![("AMBIT_CNI_PLUGIN_UID", "root")],
                "AMBIT_CNI_PLUGIN_UID",
            ),
            (vec![("AMBIT_ZDS_PROXY_UID", "-1")], "AMBIT_ZDS_PROXY_UID"),
        ] {
            let e = parse(&vars).unwrap_err();
            assert_eq!(e.name, name);
            assert!(e.to_string().contains(name), "{e}");
        }
        let e = K8sConfig::from_lookup(|_| None, "").unwrap_err();
        assert!(e.to_string().contains("NODE_NAME"), "{e}");
    }

    #[test]
    fn ztunnel_pods_are_app_ztunnel_in_the_system_namespace() {
        let c = parse(&[]).unwrap();
        let l = |v: &str| [("app".to_owned(), v.to_owned())].into();
        assert!(c.is_ztunnel("istio-system", &l("ztunnel")));
        assert!(!c.is_ztunnel("default", &l("ztunnel")));
        assert!(!c.is_ztunnel("istio-system", &l("web")));
    }
}
