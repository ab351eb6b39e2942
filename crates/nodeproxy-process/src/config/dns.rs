//! The DNS proxy's settings: `ISTIO_META_DNS_CAPTURE`, `ISTIO_META_DNS_PROXY_ADDR`,
//! `CLUSTER_DOMAIN`, `PREFERED_SERVICE_NAMESPACE`, and where other names are forwarded.

use std::path::PathBuf;

use super::ConfigError;
use ambit_process::env::Env;

/// The DNS proxy's settings.
#[derive(Clone, Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DnsProxyConfig {
    /// `ISTIO_META_DNS_PROXY_ADDR` (default `localhost:15053`): the dedicated-mode address;
    /// in shared mode every pod gets 15053 on its loopback.
    pub addr: String,
    #[serde(skip)]
    pub listen: ambit_dns::ListenAddr,
    /// `CLUSTER_DOMAIN` (default `cluster.local`).
    pub cluster_domain: String,
    /// `PREFERED_SERVICE_NAMESPACE`: tie-break namespace for mesh names.
    pub preferred_namespace: Option<String>,
    /// Where the forwarded queries go: the nameservers of this file (ztunnel reads its own
    /// `/etc/resolv.conf`; `AMBIT_DNS_RESOLV_CONF` names another, for tests).
    pub resolv_conf: PathBuf,
}

pub(super) fn dns_config(env: &Env<'_>) -> Result<Option<DnsProxyConfig>, ConfigError> {
    // ztunnel: on unless the proxy metadata says DNS_CAPTURE is something but "true".
    if let Some(v) = env.get("ISTIO_META_DNS_CAPTURE") {
        if !v.trim().eq_ignore_ascii_case("true") {
            return Ok(None);
        }
    }
    let addr = env
        .get("ISTIO_META_DNS_PROXY_ADDR")
        .unwrap_or("localhost:15053")
        .to_string();
    let listen = addr
        .parse::<ambit_dns::ListenAddr>()
        .map_err(|_| ConfigError::Invalid {
            var: "ISTIO_META_DNS_PROXY_ADDR",
            value: addr.clone(),
            expected: "localhost:<port> or <ip>:<port>, such as localhost:15053",
        })?;
    let cluster_domain = env
        .get("CLUSTER_DOMAIN")
        .unwrap_or("cluster.local")
        .trim()
        .trim_end_matches('.')
        .to_ascii_lowercase();
    if cluster_domain.is_empty() {
        return Err(ConfigError::Invalid {
            var: "CLUSTER_DOMAIN",
            value: String::new(),
            expected: "a DNS domain such as cluster.local",
        });
    }
    Ok(Some(DnsProxyConfig {
        addr,
        listen,
        cluster_domain,
        preferred_namespace: env
            .get("PREFERED_SERVICE_NAMESPACE")
            .filter(|v| !v.is_empty())
            .map(str::to_string),
        resolv_conf: env
            .get("AMBIT_DNS_RESOLV_CONF")
            .unwrap_or("/etc/resolv.conf")
            .into(),
    }))
}
