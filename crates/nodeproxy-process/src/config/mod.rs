//! Node proxy configuration from the environment, with ztunnel's variable names,
//! meanings and defaults, read by topic: [`env`] (the lookup and value forms), [`ca`]
//! (certificates), [`xds`], [`dns`], [`workers`], [`data_path`] and [`operator`]. Every value is checked
//! before anything is bound; a bad one is an error that names the variable and the form it
//! accepts.

mod data_path;
mod dns;
mod operator;
mod workers;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use ambit_nodeproxy::settings::ProxyConfig;
use ambit_nodeproxy::LocalIdentity;
use ambit_wellknown::paths;

pub use ambit_process::ca::{default_istiod_address, CaSource, RemoteCa};
pub use ambit_process::env::parse_duration;
pub use ambit_process::mesh_file::LocalConfigSource;
pub use ambit_process::xds::XdsConfig;
pub use dns::DnsProxyConfig;

use ambit_process::ca::{self, ca_source};
use ambit_process::env::{Env, ProcessEnv};
use ambit_process::xds::xds_config;
use dns::dns_config;
use workers::{available_cores, worker_threads};

pub use ambit_process::ConfigError;

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub enum ProxyMode {
    /// In-pod: listeners inside each pod's network namespace, pods announced over ZDS.
    Shared,
    /// One workload, listeners in the proxy's own network namespace.
    Dedicated,
}

#[derive(Clone, Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Config {
    pub proxy_mode: ProxyMode,
    pub workload: Option<LocalIdentity>,
    pub local_config: Option<LocalConfigSource>,
    /// The xDS server, with its scheme; `None`: no xDS.
    pub xds_address: Option<String>,
    /// The xDS client's channel and node, when `xds_address` is set.
    #[serde(skip)]
    pub xds: Option<XdsConfig>,
    pub trust_domain: String,
    pub node_name: Option<String>,
    pub istio_version: String,
    /// Every `ISTIO_META_<X>` variable as `<X>`: ztunnel's proxy metadata (shown in
    /// `/config_dump`; ambit itself reads `CLUSTER_ID` and `ISTIO_VERSION` of it).
    pub proxy_metadata: std::collections::BTreeMap<String, String>,
    /// The issuer of workload certificates (`CA_ADDRESS`, else `LOCAL_CA_DIR`, ...).
    pub ca: CaSource,
    #[serde(with = "ambit_nodeproxy::settings::secs")]
    pub secret_ttl: Duration,
    #[serde(with = "ambit_nodeproxy::settings::secs")]
    pub termination_deadline: Duration,
    pub inpod_uds: PathBuf,
    /// `SO_REUSEPORT` on pod listeners (`INPOD_PORT_REUSE`).
    pub inpod_port_reuse: bool,
    /// The uid the node agent runs as, when not root (`AMBIT_ZDS_AGENT_UID`): the ZDS
    /// socket's listener is checked with `SO_PEERCRED`; root and our own uid always pass.
    pub inpod_agent_uid: Option<u32>,
    pub admin_addr: SocketAddr,
    pub stats_addr: SocketAddr,
    pub readiness_addr: SocketAddr,
    /// Data-plane worker threads (`ZTUNNEL_WORKER_THREADS` and the CPU limit variables).
    pub worker_threads: usize,
    pub proxy: ProxyConfig,
    /// The DNS proxy; `None` when `ISTIO_META_DNS_CAPTURE` is set and not `true`.
    pub dns: Option<DnsProxyConfig>,
    /// On-demand xDS (`XDS_ON_DEMAND=true`); `None`: the whole mesh (wildcard).
    pub on_demand: Option<OnDemandSettings>,
}

/// `XDS_ON_DEMAND=true` and ambit's knobs for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OnDemandSettings {
    /// How long a connection waits for an address to be answered before it is refused
    /// (`AMBIT_XDS_ON_DEMAND_TIMEOUT`, default 5s).
    #[serde(with = "ambit_nodeproxy::settings::secs")]
    pub timeout: Duration,
    /// A name not looked up for this long is unsubscribed and removed from the store
    /// (`AMBIT_XDS_ON_DEMAND_IDLE`, default 30m).
    #[serde(with = "ambit_nodeproxy::settings::secs")]
    pub idle: Duration,
}

/// `XDS_ON_DEMAND` (as Istio, refused with the DNS proxy: its answers come from the
/// store, which on demand holds only what was asked for) and its knobs.
fn on_demand(env: &Env<'_>, xds: bool, dns: bool) -> Result<Option<OnDemandSettings>, ConfigError> {
    if !env.bool("XDS_ON_DEMAND", false)? {
        return Ok(None);
    }
    if dns {
        return Err(ConfigError::Conflict(
            "XDS_ON_DEMAND=true cannot be used with the DNS proxy (set ISTIO_META_DNS_CAPTURE=false), as in Istio".into(),
        ));
    }
    if !xds {
        return Err(ConfigError::Missing {
            var: "XDS_ADDRESS",
            because: "XDS_ON_DEMAND=true",
        });
    }
    let positive = |var: &'static str, d: Option<Duration>, default: Duration| match d {
        None => Ok(default),
        Some(d) if !d.is_zero() => Ok(d),
        Some(d) => Err(ConfigError::Invalid {
            var,
            value: format!("{d:?}"),
            expected: "a duration above zero, such as 5s",
        }),
    };
    Ok(Some(OnDemandSettings {
        timeout: positive(
            "AMBIT_XDS_ON_DEMAND_TIMEOUT",
            env.duration("AMBIT_XDS_ON_DEMAND_TIMEOUT")?,
            Duration::from_secs(5),
        )?,
        idle: positive(
            "AMBIT_XDS_ON_DEMAND_IDLE",
            env.duration("AMBIT_XDS_ON_DEMAND_IDLE")?,
            Duration::from_secs(30 * 60),
        )?,
    }))
}

/// `TERMINATION_GRACE_PERIOD_SECONDS` to a drain deadline, as ztunnel derives it.
fn deadline_from_grace(secs: u64) -> Duration {
    let d = if secs > 10 {
        secs - 5
    } else {
        secs.saturating_sub(1)
    };
    Duration::from_secs(d.max(1))
}

impl Config {
    pub fn from_process_env() -> Result<Config, ConfigError> {
        // A value that is not UTF-8 is refused by name if it is one of ours (a path must
        // not silently become another); in any other variable it is none of our business.
        let cores = available_cores();
        ProcessEnv::capture().read(|env| Config::from_checked_env(env, cores))
    }

    pub fn from_env(vars: &HashMap<String, String>) -> Result<Config, ConfigError> {
        Config::from_env_on(vars, available_cores())
    }

    /// As [`Config::from_env`], on a machine with `cores` logical cores.
    pub fn from_env_on(
        vars: &HashMap<String, String>,
        cores: usize,
    ) -> Result<Config, ConfigError> {
        Config::from_checked_env(&Env::new(vars), cores)
    }

    fn from_checked_env(env: &Env<'_>, cores: usize) -> Result<Config, ConfigError> {
        let Served {
            proxy_mode,
            workload,
            local_config,
            xds_address,
            node_name,
        } = served(env)?;
        let proxy = data_path::settings(env, proxy_mode)?;
        let termination_deadline = termination_deadline(env)?;
        let trust_domain = env
            .get("TRUST_DOMAIN")
            .unwrap_or("cluster.local")
            .to_string();
        let xds = match &xds_address {
            None => None,
            Some(address) => Some(xds_config(env, address, &proxy.cluster_id)?),
        };
        if ambit_identity::SpiffeId::new(&trust_domain, "ns", "sa").is_err() {
            return Err(ConfigError::Invalid {
                var: "TRUST_DOMAIN",
                value: trust_domain,
                expected: "a SPIFFE trust domain: lowercase letters, digits, '.', '-' and '_'",
            });
        }
        let local_ca_dir = env.get("LOCAL_CA_DIR").map(PathBuf::from);
        let ca = ca_source(env, local_ca_dir.as_ref(), local_config.is_some())?;
        let operator = operator::addresses(env, proxy_mode, proxy.ipv6_enabled)?;
        let dns = dns_config(env)?;
        let on_demand = on_demand(env, xds.is_some(), dns.is_some())?;
        Ok(Config {
            proxy_mode,
            workload,
            local_config,
            xds_address,
            xds,
            trust_domain,
            node_name,
            istio_version: env
                .get("ISTIO_META_ISTIO_VERSION")
                .unwrap_or("unknown")
                .to_string(),
            proxy_metadata: env
                .vars
                .iter()
                .filter_map(|(k, v)| Some((k.strip_prefix("ISTIO_META_")?.to_string(), v.clone())))
                .filter(|(k, _)| !k.is_empty())
                .collect(),
            ca,
            secret_ttl: ca::secret_ttl(env)?,
            termination_deadline,
            inpod_uds: env.get("INPOD_UDS").unwrap_or(paths::ZDS_SOCKET).into(),
            inpod_port_reuse: env.bool("INPOD_PORT_REUSE", true)?,
            inpod_agent_uid: env.parse::<u32>("AMBIT_ZDS_AGENT_UID", "a uid such as 1337")?,
            admin_addr: operator.admin,
            stats_addr: operator.stats,
            readiness_addr: operator.readiness,
            worker_threads: worker_threads(env, cores)?,
            dns,
            on_demand,
            proxy: ProxyConfig {
                reserved_ports: operator.reserved_ports,
                ..proxy
            },
        })
    }
}

/// Who the proxy serves and where its mesh comes from.
struct Served {
    proxy_mode: ProxyMode,
    workload: Option<LocalIdentity>,
    local_config: Option<LocalConfigSource>,
    xds_address: Option<String>,
    node_name: Option<String>,
}

/// `PROXY_MODE`, `PROXY_WORKLOAD_INFO`, `LOCAL_XDS_PATH`/`LOCAL_XDS`, `XDS_ADDRESS` and
/// `NODE_NAME`, with what each mode requires of them.
fn served(env: &Env<'_>) -> Result<Served, ConfigError> {
    let proxy_mode = match env.get("PROXY_MODE").unwrap_or("shared") {
        "shared" => ProxyMode::Shared,
        "dedicated" => ProxyMode::Dedicated,
        other => {
            return Err(ConfigError::Invalid {
                var: "PROXY_MODE",
                value: other.into(),
                expected: "shared or dedicated",
            })
        }
    };
    let workload = match env.get("PROXY_WORKLOAD_INFO") {
        None => None,
        Some(v) => {
            let parts: Vec<&str> = v.split('/').collect();
            match parts.as_slice() {
                [ns, name, sa] if !ns.is_empty() && !name.is_empty() && !sa.is_empty() => {
                    Some(LocalIdentity {
                        namespace: ns.to_string(),
                        name: name.to_string(),
                        service_account: sa.to_string(),
                    })
                }
                _ => {
                    return Err(ConfigError::Invalid {
                        var: "PROXY_WORKLOAD_INFO",
                        value: v.into(),
                        expected: "namespace/name/service-account",
                    })
                }
            }
        }
    };
    if proxy_mode == ProxyMode::Dedicated && workload.is_none() {
        return Err(ConfigError::Missing {
            var: "PROXY_WORKLOAD_INFO",
            because: "PROXY_MODE=dedicated",
        });
    }
    let local_config = match (env.get("LOCAL_XDS_PATH"), env.get("LOCAL_XDS")) {
        (Some(_), Some(_)) => {
            return Err(ConfigError::Conflict(
                "LOCAL_XDS_PATH and LOCAL_XDS are both set: use only one".into(),
            ))
        }
        (Some(p), None) => Some(LocalConfigSource::File(PathBuf::from(p))),
        (None, Some(y)) => Some(LocalConfigSource::Inline(y.to_string())),
        (None, None) => None,
    };
    // ztunnel dials istiod by default. ambit does too, except when a local config is
    // given: then the local config alone describes the mesh unless XDS_ADDRESS is set
    // (single-host setups keep working without an istiod to reach).
    let xds_address = match env.get("XDS_ADDRESS") {
        Some("") => None,
        Some(a) => Some(ambit_grpc::with_scheme(a)),
        None if local_config.is_some() => None,
        None => {
            Some(default_istiod_address(env.get("KUBERNETES_SERVICE_HOST").is_some()).to_string())
        }
    };
    if local_config.is_none() && xds_address.is_none() {
        return Err(ConfigError::Missing {
            var: "LOCAL_XDS_PATH (or LOCAL_XDS)",
            because: "XDS_ADDRESS is empty (no xDS server)",
        });
    }
    let node_name = env
        .get("NODE_NAME")
        .filter(|n| !n.is_empty())
        .map(str::to_string);
    if proxy_mode == ProxyMode::Shared && node_name.is_none() {
        // Pods are matched to the workloads configured on this node only.
        return Err(ConfigError::Missing {
            var: "NODE_NAME",
            because: "PROXY_MODE=shared",
        });
    }
    Ok(Served {
        proxy_mode,
        workload,
        local_config,
        xds_address,
        node_name,
    })
}

/// `CONNECTION_TERMINATION_DEADLINE`, else derived from `TERMINATION_GRACE_PERIOD_SECONDS`.
fn termination_deadline(env: &Env<'_>) -> Result<Duration, ConfigError> {
    Ok(match env.duration("CONNECTION_TERMINATION_DEADLINE")? {
        Some(d) => d,
        None => match env.parse::<u64>(
            "TERMINATION_GRACE_PERIOD_SECONDS",
            "a whole number of seconds",
        )? {
            Some(secs) => deadline_from_grace(secs),
            None => Duration::from_secs(5),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ambit_nodeproxy::settings::OriginalSource;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        let mut m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        m.entry("LOCAL_XDS".into()).or_insert_with(|| "{}".into());
        m.entry("NODE_NAME".into())
            .or_insert_with(|| "node1".into());
        m
    }

    fn err(pairs: &[(&str, &str)]) -> String {
        Config::from_env(&env(pairs)).unwrap_err().to_string()
    }

    #[test]
    fn defaults_match_ztunnel() {
        let c = Config::from_env(&env(&[])).unwrap();
        assert_eq!(c.proxy_mode, ProxyMode::Shared);
        assert_eq!(c.proxy.packet_mark, Some(1337));
        assert_eq!(c.trust_domain, "cluster.local");
        assert_eq!(c.proxy.cluster_id, "Kubernetes");
        assert_eq!(c.proxy.h2.stream_window, 4_194_304);
        assert_eq!(c.proxy.h2.connection_window, 16_777_216);
        assert_eq!(c.proxy.h2.frame_size, 1_048_576);
        assert_eq!(c.proxy.pool.max_streams_per_connection, 100);
        assert_eq!(c.proxy.pool.idle_timeout, Duration::from_secs(300));
        assert_eq!(c.termination_deadline, Duration::from_secs(5));
        assert_eq!(c.secret_ttl, Duration::from_secs(86400));
        assert_eq!(c.admin_addr, "127.0.0.1:15000".parse().unwrap());
        assert_eq!(c.proxy.ports.inbound_hbone, 15008);
        assert_eq!(c.proxy.original_source, OriginalSource::Auto);
    }

    #[test]
    fn dns_proxy_settings() {
        let c = Config::from_env(&env(&[])).unwrap();
        let dns = c.dns.expect("DNS proxy on by default");
        assert_eq!(dns.listen, ambit_dns::ListenAddr::Localhost(15053));
        assert_eq!(dns.cluster_domain, "cluster.local");
        assert_eq!(dns.resolv_conf, PathBuf::from("/etc/resolv.conf"));
        assert!(dns.preferred_namespace.is_none());
        for on in ["true", "TRUE", "True"] {
            let c = Config::from_env(&env(&[("ISTIO_META_DNS_CAPTURE", on)])).unwrap();
            assert!(c.dns.is_some(), "{on}");
        }
        for off in ["false", "", "no"] {
            let c = Config::from_env(&env(&[("ISTIO_META_DNS_CAPTURE", off)])).unwrap();
            assert!(c.dns.is_none(), "{off:?}");
        }
        let c = Config::from_env(&env(&[
            ("ISTIO_META_DNS_PROXY_ADDR", "10.0.0.5:53"),
            ("CLUSTER_DOMAIN", "Corp.Example."),
            ("PREFERED_SERVICE_NAMESPACE", "shared"),
            ("AMBIT_DNS_RESOLV_CONF", "/tmp/r.conf"),
        ]))
        .unwrap();
        let dns = c.dns.unwrap();
        assert_eq!(
            dns.listen,
            ambit_dns::ListenAddr::Exact("10.0.0.5:53".parse().unwrap())
        );
        assert_eq!(dns.cluster_domain, "corp.example");
        assert_eq!(dns.preferred_namespace.as_deref(), Some("shared"));
        assert_eq!(dns.resolv_conf, PathBuf::from("/tmp/r.conf"));
        assert!(err(&[("ISTIO_META_DNS_PROXY_ADDR", "somewhere")])
            .contains("ISTIO_META_DNS_PROXY_ADDR"));
    }

    #[test]
    fn dedicated_mode_needs_workload_info_and_has_no_default_mark() {
        assert_eq!(
            err(&[("PROXY_MODE", "dedicated")]),
            "PROXY_WORKLOAD_INFO is required when PROXY_MODE=dedicated"
        );
        let c = Config::from_env(&env(&[
            ("PROXY_MODE", "dedicated"),
            ("PROXY_WORKLOAD_INFO", "default/client/sleep"),
        ]))
        .unwrap();
        assert_eq!(c.proxy.packet_mark, None);
        assert_eq!(c.workload.unwrap().service_account, "sleep");
        // The operator ports share the workload's addresses, so the loop guard has them.
        assert_eq!(c.proxy.reserved_ports, [15020, 15021]);
        let moved = Config::from_env(&env(&[
            ("PROXY_MODE", "dedicated"),
            ("PROXY_WORKLOAD_INFO", "default/client/sleep"),
            ("AMBIT_STATS_ADDR", "127.0.0.1:9090"),
        ]))
        .unwrap();
        assert!(moved.proxy.is_loop_port(9090) && !moved.proxy.is_loop_port(15020));
        let shared = Config::from_env(&env(&[])).unwrap();
        assert!(shared.proxy.reserved_ports.is_empty());
    }

    #[test]
    fn invalid_values_name_the_variable_and_the_form() {
        let cases: &[(&str, &str, &str)] = &[
            ("PROXY_MODE", "sidecar", "shared or dedicated"),
            (
                "PROXY_WORKLOAD_INFO",
                "default/client",
                "namespace/name/service-account",
            ),
            (
                "PROXY_WORKLOAD_INFO",
                "a//b",
                "namespace/name/service-account",
            ),
            ("PACKET_MARK", "0x539", "32-bit unsigned integer"),
            ("HTTP2_FRAME_SIZE", "100", "16384 to 16777215"),
            ("HTTP2_STREAM_WINDOW_SIZE", "-1", "window size"),
            ("HTTP2_CONNECTION_WINDOW_SIZE", "big", "window size"),
            ("HTTP2_STREAM_WINDOW_SIZE", "1024", "65535"),
            ("KEEPALIVE_TIME", "0s", "1s to 32767s"),
            ("KEEPALIVE_TIME", "500ms", "1s to 32767s"),
            ("KEEPALIVE_TIME", "32768s", "1s to 32767s"),
            ("KEEPALIVE_INTERVAL", "10h", "1s to 32767s"),
            ("KEEPALIVE_RETRIES", "0", "1 to 127"),
            ("KEEPALIVE_RETRIES", "1000", "1 to 127"),
            ("SECRET_TTL", "0", "at least 10s"),
            ("POOL_MAX_STREAMS_PER_CONNECTION", "0", "1 to 65535"),
            ("POOL_UNUSED_RELEASE_TIMEOUT", "5 minutes", "duration"),
            ("ENABLE_ORIG_SRC", "yes", "true or false"),
            ("IPV6_ENABLED", "1", "true or false"),
            (
                "TERMINATION_GRACE_PERIOD_SECONDS",
                "30s",
                "whole number of seconds",
            ),
            ("CONNECTION_TERMINATION_DEADLINE", "soon", "duration"),
            ("SECRET_TTL", "1y", "duration"),
            ("TRUST_DOMAIN", "Cluster.Local", "trust domain"),
            ("AMBIT_ADMIN_ADDR", "0.0.0.0:15000", "loopback"),
            ("AMBIT_HBONE_PORT", "70000", "port number"),
        ];
        for (var, value, expected) in cases {
            let msg = err(&[(var, value)]);
            assert!(msg.starts_with(&format!("{var}=")), "{var}: {msg}");
            assert!(msg.contains(expected), "{var}={value}: {msg}");
        }
    }

    #[test]
    fn handshake_limits_default_per_mode_and_take_each_variable() {
        let shared = Config::from_env(&env(&[])).unwrap().proxy.handshakes;
        assert_eq!(
            (shared.node, shared.instance, shared.source),
            (1024, 256, 64)
        );
        let dedicated = Config::from_env(&env(&[
            ("PROXY_MODE", "dedicated"),
            ("PROXY_WORKLOAD_INFO", "default/client/sleep"),
            ("AMBIT_MAX_HBONE_HANDSHAKES_PER_POD", "7"),
        ]))
        .unwrap()
        .proxy
        .handshakes;
        // One instance, the node's share; the per-pod variable does not apply.
        assert_eq!(
            (dedicated.node, dedicated.instance, dedicated.source),
            (1024, 1024, 256)
        );
        let set = Config::from_env(&env(&[
            ("AMBIT_MAX_HBONE_HANDSHAKES", "100"),
            ("AMBIT_MAX_HBONE_HANDSHAKES_PER_POD", "60"),
            ("AMBIT_MAX_HBONE_HANDSHAKES_PER_SOURCE", "40"),
        ]))
        .unwrap()
        .proxy
        .handshakes;
        assert_eq!((set.node, set.instance, set.source), (100, 60, 40));
        assert!(err(&[("AMBIT_MAX_HBONE_HANDSHAKES_PER_SOURCE", "0")])
            .contains("AMBIT_MAX_HBONE_HANDSHAKES_PER_SOURCE"));
    }

    #[test]
    fn keepalive_counts_whole_seconds() {
        let c = Config::from_env(&env(&[
            ("KEEPALIVE_TIME", "1500ms"),
            ("KEEPALIVE_INTERVAL", "1m30s"),
        ]))
        .unwrap();
        assert_eq!(c.proxy.keepalive.time, Duration::from_secs(1));
        assert_eq!(c.proxy.keepalive.interval, Duration::from_secs(90));
    }

    #[test]
    fn local_config_sources_are_exclusive_and_required() {
        let mut both = env(&[("LOCAL_XDS_PATH", "/x.yaml")]);
        both.insert("LOCAL_XDS".into(), "{}".into());
        assert!(Config::from_env(&both)
            .unwrap_err()
            .to_string()
            .contains("both set"));
        let none: HashMap<String, String> = [("XDS_ADDRESS", ""), ("NODE_NAME", "n")]
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .into();
        assert_eq!(
            Config::from_env(&none).unwrap_err().to_string(),
            "LOCAL_XDS_PATH (or LOCAL_XDS) is required when XDS_ADDRESS is empty (no xDS server)"
        );
    }

    #[test]
    fn xds_defaults_and_variables() {
        let xds_env = |pairs: &[(&str, &str)]| -> HashMap<String, String> {
            let mut m: HashMap<String, String> = pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            m.entry("NODE_NAME".into())
                .or_insert_with(|| "node1".into());
            m
        };
        // No local config: ztunnel's default address.
        let c = Config::from_env(&xds_env(&[])).unwrap();
        assert_eq!(c.xds_address.as_deref(), Some("https://localhost:15012"));
        let c = Config::from_env(&xds_env(&[("KUBERNETES_SERVICE_HOST", "10.96.0.1")])).unwrap();
        assert_eq!(
            c.xds_address.as_deref(),
            Some("https://istiod.istio-system.svc:15012")
        );
        // A local config and no XDS_ADDRESS: no xDS (ambit's difference).
        let c = Config::from_env(&env(&[])).unwrap();
        assert!(c.xds_address.is_none() && c.xds.is_none());
        // Both: the local config, then xDS on top.
        let c = Config::from_env(&env(&[("XDS_ADDRESS", "cp.example:15012")])).unwrap();
        assert_eq!(c.xds_address.as_deref(), Some("https://cp.example:15012"));
        let c = Config::from_env(&xds_env(&[
            ("XDS_ADDRESS", "https://cp:15012"),
            ("XDS_ROOT_CA", "SYSTEM"),
            ("ALT_XDS_HOSTNAME", "istiod.example"),
            ("AUTH_TOKEN", "literal-token"),
            ("CLUSTER_ID", "c2"),
            ("XDS_HEADER_X-Tenant", "t1"),
            ("POD_NAME", "ztunnel-1"),
            ("POD_NAMESPACE", "istio-system"),
            ("INSTANCE_IP", "10.0.0.9"),
            ("ISTIO_META_DNS_CAPTURE", "true"),
            ("ISTIO_METAJSON_LABELS", "{\"a\":\"b\"}"),
        ]))
        .unwrap();
        let x = c.xds.unwrap();
        assert_eq!(x.channel.address, "https://cp:15012");
        assert_eq!(x.channel.root, ambit_grpc::RootCa::System);
        assert_eq!(x.channel.alt_hostname.as_deref(), Some("istiod.example"));
        assert_eq!(
            x.channel.token,
            ambit_grpc::Token::Literal("literal-token".into())
        );
        assert_eq!(x.channel.cluster_id, "c2");
        assert_eq!(
            x.channel.headers,
            [("X-Tenant".to_string(), "t1".to_string())]
        );
        assert_eq!(
            x.node.node_id(),
            "ztunnel~10.0.0.9~ztunnel-1.istio-system~istio-system.svc.cluster.local"
        );
        assert_eq!(x.node.node_name, "node1");
        assert_eq!(
            x.node.proxy_metadata,
            [("DNS_CAPTURE".to_string(), "true".to_string())]
        );
        assert_eq!(x.node.json_metadata[0].0, "LABELS");
        let bad = Config::from_env(&xds_env(&[("ISTIO_METAJSON_X", "{")]));
        assert!(bad.unwrap_err().to_string().contains("ISTIO_METAJSON_X"));
    }

    #[test]
    fn shared_mode_needs_the_node_name() {
        let mut vars = env(&[]);
        vars.remove("NODE_NAME");
        assert_eq!(
            Config::from_env(&vars).unwrap_err().to_string(),
            "NODE_NAME is required when PROXY_MODE=shared"
        );
    }

    #[test]
    fn termination_deadline_follows_grace_period() {
        let d = |s: &str| {
            Config::from_env(&env(&[("TERMINATION_GRACE_PERIOD_SECONDS", s)]))
                .unwrap()
                .termination_deadline
        };
        assert_eq!(d("30"), Duration::from_secs(25));
        assert_eq!(d("10"), Duration::from_secs(9));
        assert_eq!(d("1"), Duration::from_secs(1));
        let explicit = Config::from_env(&env(&[
            ("TERMINATION_GRACE_PERIOD_SECONDS", "30"),
            ("CONNECTION_TERMINATION_DEADLINE", "2s"),
        ]))
        .unwrap();
        assert_eq!(explicit.termination_deadline, Duration::from_secs(2));
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("5m"), Some(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h30m"), Some(Duration::from_secs(5400)));
        assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_duration("7"), Some(Duration::from_secs(7)));
        for bad in ["", "m", "5x", "-5s", "1.5s", "99999999999999999999h"] {
            assert_eq!(parse_duration(bad), None, "{bad}");
        }
    }

    #[test]
    fn worker_threads_follow_ztunnel_forms() {
        let threads = |pairs: &[(&str, &str)], cores: usize| {
            Config::from_env_on(&env(pairs), cores)
                .unwrap()
                .worker_threads
        };
        // Default: a quarter of the cores, rounded up, at least one.
        assert_eq!(threads(&[], 2), 1);
        assert_eq!(threads(&[], 16), 4);
        assert_eq!(threads(&[], 17), 5);
        // Explicit count, a share of the cores, or every core.
        assert_eq!(threads(&[("ZTUNNEL_WORKER_THREADS", "3")], 16), 3);
        assert_eq!(threads(&[("ZTUNNEL_WORKER_THREADS", "50%")], 6), 3);
        assert_eq!(threads(&[("ZTUNNEL_WORKER_THREADS", "10%")], 4), 1);
        assert_eq!(threads(&[("ZTUNNEL_WORKER_THREADS", "0")], 6), 6);
        assert_eq!(threads(&[("ZTUNNEL_WORKER_THREADS", "12.5%")], 16), 2);
        assert_eq!(threads(&[("ZTUNNEL_WORKER_THREADS", "0")], 4096), 1024);
        // A share or "all" counts ZTUNNEL_CPU_LIMIT's CPUs rather than the machine's.
        let of_limit = [
            ("ZTUNNEL_WORKER_THREADS", "50%"),
            ("ZTUNNEL_CPU_LIMIT", "4"),
        ];
        assert_eq!(threads(&of_limit, 64), 2);
        let all_of_limit = [("ZTUNNEL_WORKER_THREADS", "0"), ("ZTUNNEL_CPU_LIMIT", "3")];
        assert_eq!(threads(&all_of_limit, 64), 3);
        // The count overrides the CPU limits.
        let over = [
            ("ZTUNNEL_WORKER_THREADS", "2"),
            ("ZTUNNEL_RESOURCE_CPU_LIMIT", "8"),
        ];
        assert_eq!(threads(&over, 16), 2);
        // An explicit limit is used as it is, raised to the request; quantities round up.
        assert_eq!(threads(&[("ZTUNNEL_RESOURCE_CPU_LIMIT", "3")], 64), 3);
        assert_eq!(threads(&[("ZTUNNEL_RESOURCE_CPU_LIMIT", "1500m")], 64), 2);
        assert_eq!(threads(&[("ZTUNNEL_RESOURCE_CPU_LIMIT", "0.5")], 64), 1);
        assert_eq!(threads(&[("ZTUNNEL_RESOURCE_CPU_LIMIT", "5000")], 64), 1024);
        let limit_and_request = [
            ("ZTUNNEL_RESOURCE_CPU_LIMIT", "2"),
            ("ZTUNNEL_RESOURCE_CPU_REQUEST", "4"),
        ];
        assert_eq!(threads(&limit_and_request, 64), 4);
        // Otherwise the CPU count (ZTUNNEL_CPU_LIMIT over the machine's) is quartered,
        // and the request is a floor.
        assert_eq!(threads(&[("ZTUNNEL_CPU_LIMIT", "8")], 64), 2);
        assert_eq!(threads(&[("ZTUNNEL_RESOURCE_CPU_REQUEST", "3")], 4), 3);
    }

    #[test]
    fn bad_worker_thread_values_name_the_variable() {
        for bad in [
            "two", "-1", "150%", "0%", "%", "1.5", "100000", "1025", "NaN%", "-5%",
        ] {
            let e = err(&[("ZTUNNEL_WORKER_THREADS", bad)]);
            assert!(
                e.starts_with("ZTUNNEL_WORKER_THREADS=") && e.contains("share of the CPUs"),
                "{bad}: {e}"
            );
        }
        for (var, bad) in [
            ("ZTUNNEL_RESOURCE_CPU_LIMIT", "lots"),
            ("ZTUNNEL_RESOURCE_CPU_REQUEST", "1.2345"),
            ("ZTUNNEL_RESOURCE_CPU_LIMIT", "."),
            ("ZTUNNEL_CPU_LIMIT", "2.5"),
        ] {
            let e = err(&[(var, bad)]);
            assert!(e.starts_with(&format!("{var}=")), "{var}={bad}: {e}");
        }
    }

    #[test]
    fn the_default_config_keeps_todays_local_ca_choice() {
        let mut vars = HashMap::new();
        vars.insert("LOCAL_XDS".to_string(), "{}".to_string());
        vars.insert("NODE_NAME".to_string(), "node1".to_string());
        assert_eq!(Config::from_env(&vars).unwrap().ca, CaSource::Ephemeral);
        vars.insert("CA_ADDRESS".to_string(), "ca:15012".to_string());
        assert!(matches!(
            Config::from_env(&vars).unwrap().ca,
            CaSource::Remote(RemoteCa { ref address, .. }) if address == "https://ca:15012"
        ));
    }
}
