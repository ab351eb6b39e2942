//! The installer's configuration from the environment (the chart's ConfigMap
//! `istio-cni-config` and the DaemonSet's env; istio-cni reference §5.2), sans IO.

pub use crate::env::ConfigError;
use crate::env::{err, parse_bool};
use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::Value;

use super::conflist::{PluginEntry, DEFAULT_OWNED_FILE, DEFAULT_STANDALONE_FILE, PLUGIN_TYPE};

/// The service account's mount.
pub const DEFAULT_SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The host's CNI bin dir, as the chart mounts it.
pub const DEFAULT_CNI_BIN_DIR: &str = "/host/opt/cni/bin";
/// The host's CNI conf dir, as the chart mounts it.
pub const DEFAULT_CNI_NET_DIR: &str = "/host/etc/cni/net.d";
/// Sockets and the plugin's kubeconfig.
pub const DEFAULT_CNI_AGENT_RUN_DIR: &str = "/var/run/istio-cni";
/// The installed plugin's file name: the `type` in the conflist entry.
pub const PLUGIN_BINARY_NAME: &str = PLUGIN_TYPE;

/// Everything the installer needs.
#[derive(Debug, Clone, PartialEq)]
pub struct InstallConfig {
    /// `MOUNTED_CNI_NET_DIR`.
    pub cni_net_dir: PathBuf,
    /// Where the plugin binary goes (the chart mounts the host's bin dir here).
    pub cni_bin_dir: PathBuf,
    /// The binary installed as `istio-cni` (the running `ambit`, which acts as the plugin
    /// when called by that name).
    pub plugin_source: PathBuf,
    /// `CNI_CONF_NAME`: the conf file to edit (chained) or write (standalone).
    pub cni_conf_name: Option<String>,
    /// `CHAINED_CNI_PLUGIN`.
    pub chained: bool,
    /// `ISTIO_OWNED_CNI_CONFIG`.
    pub istio_owned: bool,
    /// `ISTIO_OWNED_CNI_CONFIG_FILENAME` (the agent's name) or
    /// `ISTIO_OWNED_CNI_CONF_FILENAME` (the chart's).
    pub owned_file_name: String,
    /// `CNI_CONF_GROUP_READ`: the owned file is 0640 instead of 0600.
    pub conf_group_read: bool,
    /// `CNI_AGENT_RUN_DIR`.
    pub cni_agent_run_dir: PathBuf,
    /// `KUBECONFIG_MODE`.
    pub kubeconfig_mode: u32,
    /// `KUBE_CA_FILE`: overrides the service account's `ca.crt`.
    pub kube_ca_file: Option<PathBuf>,
    /// `SKIP_TLS_VERIFY`.
    pub skip_tls_verify: bool,
    /// The service account mount (token, ca.crt).
    pub service_account_dir: PathBuf,
    /// `KUBERNETES_SERVICE_PROTOCOL`, `_HOST`, `_PORT`.
    pub kubernetes_service_protocol: String,
    pub kubernetes_service_host: String,
    pub kubernetes_service_port: String,
    /// `AMBIENT_DISABLE_SAFE_UPGRADE`.
    pub disable_safe_upgrade: bool,
    /// `POD_NAMESPACE`.
    pub pod_namespace: String,
    /// `NODE_NAME`.
    pub node_name: String,
    /// `EXCLUDE_NAMESPACES` (comma separated).
    pub exclude_namespaces: Vec<String>,
    /// `AMBIENT_ENABLED`.
    pub ambient_enabled: bool,
    /// `AMBIENT_ENABLEMENT_SELECTOR`, validated, as the JSON the plugin config carries.
    pub enablement_selectors: Value,
    /// `ENABLE_AMBIENT_DETECTION_RETRY`.
    pub enable_ambient_detection_retry: bool,
    /// `NATIVE_NFTABLES`.
    pub native_nftables: bool,
    /// `LOG_LEVEL`: the plugin's level.
    pub plugin_log_level: String,
}

/// A file mode as Go reads an int with base 0: `0600`/`0o600` octal, `384` decimal.
fn parse_mode(name: &'static str, v: &str) -> Result<u32, ConfigError> {
    let t = v.trim();
    let parsed = if let Some(o) = t.strip_prefix("0o").or_else(|| t.strip_prefix("0O")) {
        u32::from_str_radix(o, 8)
    } else if t.len() > 1 && t.starts_with('0') {
        u32::from_str_radix(&t[1..], 8)
    } else {
        t.parse::<u32>()
    };
    match parsed {
        Ok(m) if m <= 0o777 => Ok(m),
        Ok(_) => Err(err(name, v, "a file mode is at most 0777")),
        Err(_) => Err(err(name, v, "expected a file mode such as 0600")),
    }
}

/// The default selectors (§4.4) as plugin-config JSON.
pub fn default_selectors_json() -> Value {
    let list: Vec<Value> = ambit_k8s::enablement::default_raw_selectors()
        .into_iter()
        .map(|r| {
            let mut o = serde_json::Map::new();
            if let Some(p) = r.pod_selector {
                o.insert(
                    "podSelector".into(),
                    serde_json::to_value(p).unwrap_or_default(),
                );
            }
            if let Some(n) = r.namespace_selector {
                o.insert(
                    "namespaceSelector".into(),
                    serde_json::to_value(n).unwrap_or_default(),
                );
            }
            Value::Object(o)
        })
        .collect();
    Value::Array(list)
}

impl InstallConfig {
    /// Reads the configuration from `env` (the process environment in production).
    pub fn from_env(env: &BTreeMap<String, String>) -> Result<InstallConfig, ConfigError> {
        let get = |k: &str| env.get(k).map(|v| v.trim()).filter(|v| !v.is_empty());
        let text = |k: &str, d: &str| get(k).unwrap_or(d).to_owned();
        let flag = |k: &'static str, d: bool| get(k).map_or(Ok(d), |v| parse_bool(k, v));
        let enablement_selectors = match get("AMBIENT_ENABLEMENT_SELECTOR") {
            None => default_selectors_json(),
            Some(yaml) => {
                ambit_k8s::enablement::parse_selectors(yaml)
                    .map_err(|e| err("AMBIENT_ENABLEMENT_SELECTOR", yaml, e.to_string()))?;
                yaml_serde::from_str::<Value>(yaml)
                    .map_err(|e| err("AMBIENT_ENABLEMENT_SELECTOR", yaml, e.to_string()))?
            }
        };
        let owned_file_name = get("ISTIO_OWNED_CNI_CONFIG_FILENAME")
            .or_else(|| get("ISTIO_OWNED_CNI_CONF_FILENAME"))
            .unwrap_or(DEFAULT_OWNED_FILE)
            .to_owned();
        if owned_file_name.contains('/') || !owned_file_name.ends_with(".conflist") {
            return Err(err(
                "ISTIO_OWNED_CNI_CONFIG_FILENAME",
                &owned_file_name,
                "expected a file name ending in .conflist",
            ));
        }
        let cni_conf_name = get("CNI_CONF_NAME").map(str::to_owned);
        if let Some(n) = &cni_conf_name {
            if n.contains('/') {
                return Err(err("CNI_CONF_NAME", n, "expected a file name, not a path"));
            }
        }
        let kubeconfig_mode =
            get("KUBECONFIG_MODE").map_or(Ok(0o600), |v| parse_mode("KUBECONFIG_MODE", v))?;
        Ok(InstallConfig {
            cni_net_dir: text("MOUNTED_CNI_NET_DIR", DEFAULT_CNI_NET_DIR).into(),
            cni_bin_dir: DEFAULT_CNI_BIN_DIR.into(),
            plugin_source: "/proc/self/exe".into(),
            cni_conf_name,
            chained: flag("CHAINED_CNI_PLUGIN", true)?,
            istio_owned: flag("ISTIO_OWNED_CNI_CONFIG", false)?,
            owned_file_name,
            conf_group_read: flag("CNI_CONF_GROUP_READ", false)?,
            cni_agent_run_dir: text("CNI_AGENT_RUN_DIR", DEFAULT_CNI_AGENT_RUN_DIR).into(),
            kubeconfig_mode,
            kube_ca_file: get("KUBE_CA_FILE").map(PathBuf::from),
            skip_tls_verify: flag("SKIP_TLS_VERIFY", false)?,
            service_account_dir: DEFAULT_SERVICE_ACCOUNT_DIR.into(),
            kubernetes_service_protocol: text("KUBERNETES_SERVICE_PROTOCOL", "https"),
            kubernetes_service_host: text("KUBERNETES_SERVICE_HOST", ""),
            kubernetes_service_port: text("KUBERNETES_SERVICE_PORT", "443"),
            disable_safe_upgrade: flag("AMBIENT_DISABLE_SAFE_UPGRADE", false)?,
            pod_namespace: text("POD_NAMESPACE", ""),
            node_name: text("NODE_NAME", ""),
            exclude_namespaces: get("EXCLUDE_NAMESPACES")
                .unwrap_or_default()
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect(),
            ambient_enabled: flag("AMBIENT_ENABLED", false)?,
            enablement_selectors,
            enable_ambient_detection_retry: flag("ENABLE_AMBIENT_DETECTION_RETRY", false)?,
            native_nftables: flag("NATIVE_NFTABLES", false)?,
            plugin_log_level: text("LOG_LEVEL", "warn"),
        })
    }

    /// The process environment, for [`InstallConfig::from_env`].
    pub fn process_env() -> BTreeMap<String, String> {
        std::env::vars_os()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
            .collect()
    }

    /// Our conflist entry.
    pub fn plugin_entry(&self) -> PluginEntry {
        PluginEntry {
            name: PLUGIN_TYPE.into(),
            plugin_type: PLUGIN_TYPE.into(),
            plugin_log_level: self.plugin_log_level.clone(),
            cni_agent_run_dir: self.cni_agent_run_dir.display().to_string(),
            ambient_enabled: self.ambient_enabled,
            enablement_selectors: self.enablement_selectors.clone(),
            exclude_namespaces: self.exclude_namespaces.clone(),
            pod_namespace: self.pod_namespace.clone(),
            native_nftables: self.native_nftables,
            enable_ambient_detection_retry: self.enable_ambient_detection_retry,
        }
    }

    /// Whether the istio-owned file is in use (only chained and ambient, §4.1).
    pub fn owns_config(&self) -> bool {
        self.istio_owned && self.chained && self.ambient_enabled
    }

    /// The standalone file's name (not chained).
    pub fn standalone_name(&self) -> &str {
        self.cni_conf_name
            .as_deref()
            .unwrap_or(DEFAULT_STANDALONE_FILE)
    }

    /// The mode of the owned file.
    pub fn owned_mode(&self) -> u32 {
        if self.conf_group_read {
            0o640
        } else {
            0o600
        }
    }

    /// The plugin's kubeconfig.
    pub fn kubeconfig_path(&self) -> PathBuf {
        self.cni_agent_run_dir.join(super::files::KUBECONFIG_FILE)
    }

    /// The installed plugin binary.
    pub fn plugin_path(&self) -> PathBuf {
        self.cni_bin_dir.join(PLUGIN_BINARY_NAME)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn defaults_are_istios() {
        let c = InstallConfig::from_env(&env(&[])).unwrap();
        assert_eq!(c.cni_net_dir, PathBuf::from("/host/etc/cni/net.d"));
        assert_eq!(c.cni_bin_dir, PathBuf::from("/host/opt/cni/bin"));
        assert_eq!(c.cni_agent_run_dir, PathBuf::from("/var/run/istio-cni"));
        assert!(c.chained && !c.istio_owned && !c.ambient_enabled);
        assert_eq!(c.kubeconfig_mode, 0o600);
        assert_eq!(c.owned_file_name, "02-istio-cni.conflist");
        assert_eq!(c.kubernetes_service_protocol, "https");
        assert!(c.exclude_namespaces.is_empty());
        assert_eq!(c.enablement_selectors, default_selectors_json());
        assert_eq!(
            c.enablement_selectors[1]["podSelector"]["matchExpressions"][0]["operator"],
            "NotIn"
        );
        assert_eq!(c.standalone_name(), "YYY-istio-cni.conf");
        assert!(!c.owns_config());
    }

    #[test]
    fn values_from_the_chart() {
        let c = InstallConfig::from_env(&env(&[
            ("MOUNTED_CNI_NET_DIR", "/n"),
            ("CNI_CONF_NAME", "10-calico.conflist"),
            ("CHAINED_CNI_PLUGIN", "true"),
            ("ISTIO_OWNED_CNI_CONFIG", "true"),
            ("ISTIO_OWNED_CNI_CONF_FILENAME", "01-mine.conflist"),
            ("AMBIENT_ENABLED", "true"),
            ("EXCLUDE_NAMESPACES", "kube-system, istio-system,"),
            ("KUBECONFIG_MODE", "0640"),
            ("CNI_CONF_GROUP_READ", "True"),
            (
                "AMBIENT_ENABLEMENT_SELECTOR",
                "- podSelector:\n    matchLabels: {a: b}\n",
            ),
            ("POD_NAMESPACE", "istio-system"),
            ("ENABLE_AMBIENT_DETECTION_RETRY", "1"),
        ]))
        .unwrap();
        assert_eq!(c.cni_net_dir, PathBuf::from("/n"));
        assert_eq!(c.cni_conf_name.as_deref(), Some("10-calico.conflist"));
        assert!(c.owns_config());
        assert_eq!(c.owned_file_name, "01-mine.conflist");
        assert_eq!(c.owned_mode(), 0o640);
        assert_eq!(c.kubeconfig_mode, 0o640);
        assert_eq!(c.exclude_namespaces, ["kube-system", "istio-system"]);
        assert_eq!(
            c.enablement_selectors,
            serde_json::json!([{"podSelector": {"matchLabels": {"a": "b"}}}])
        );
        let e = c.plugin_entry();
        assert!(e.ambient_enabled && e.enable_ambient_detection_retry);
        assert_eq!(e.pod_namespace, "istio-system");
        // The agent's own name wins over the chart's.
        let c = InstallConfig::from_env(&env(&[
            ("ISTIO_OWNED_CNI_CONF_FILENAME", "01-chart.conflist"),
            ("ISTIO_OWNED_CNI_CONFIG_FILENAME", "01-agent.conflist"),
        ]))
        .unwrap();
        assert_eq!(c.owned_file_name, "01-agent.conflist");
    }

    #[test]
    fn errors_name_the_variable() {
        let cases = [
            ("CHAINED_CNI_PLUGIN", "yes"),
            ("KUBECONFIG_MODE", "0999"),
            ("KUBECONFIG_MODE", "01777"),
            ("AMBIENT_ENABLEMENT_SELECTOR", "- podSelectr: {}"),
            ("ISTIO_OWNED_CNI_CONFIG_FILENAME", "x.conf"),
            ("CNI_CONF_NAME", "../x.conf"),
            ("SKIP_TLS_VERIFY", "maybe"),
        ];
        for (k, v) in cases {
            let e = InstallConfig::from_env(&env(&[(k, v)])).unwrap_err();
            assert_eq!(e.name, k, "{e}");
            assert!(e.to_string().contains(k), "{e}");
        }
        assert_eq!(
            InstallConfig::from_env(&env(&[("KUBECONFIG_MODE", "384")]))
                .unwrap()
                .kubeconfig_mode,
            0o600
        );
    }
}
