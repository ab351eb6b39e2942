//! Node proxy configuration from the environment, with ztunnel's variable names,
//! meanings and defaults. Every value is checked before anything is bound; a bad one is
//! an error that names the variable and the form it accepts.

use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use ambit_nodeproxy::admission::HandshakeLimits;
use ambit_nodeproxy::config::{Keepalive, OriginalSource, Ports, ProxyConfig};
use ambit_nodeproxy::LocalIdentity;
use ambit_wellknown::{marks, paths, ports};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("{var}={value:?} is not valid: expected {expected}")]
    Invalid {
        var: &'static str,
        value: String,
        expected: &'static str,
    },
    #[error("{0}")]
    Conflict(String),
    #[error("{var} is required when {because}")]
    Missing {
        var: &'static str,
        because: &'static str,
    },
}

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
pub enum LocalConfigSource {
    File(PathBuf),
    Inline(String),
}

/// Where workload certificates come from.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub enum CaSource {
    /// An Istio CA (istiod, `ambit control`) at `CA_ADDRESS`.
    Remote(RemoteCa),
    /// ambit's local CA from a plug-in CA directory (`LOCAL_CA_DIR`).
    LocalDir(PathBuf),
    /// A root made up at start-up (local config without `LOCAL_CA_DIR`).
    Ephemeral,
}

/// How to reach the remote CA, as the variables gave it (interpreted by `ambit-grpc`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RemoteCa {
    /// `https://host:port`.
    pub address: String,
    /// `CA_ROOT_CA` as given: a file path, `SYSTEM` or PEM (unset: the chart's path).
    pub root: Option<String>,
    /// `ALT_CA_HOSTNAME`.
    pub alt_hostname: Option<String>,
    /// `AUTH_TOKEN` as given: a file path or the token itself (unset: the default
    /// token file if present). Never shown in `/config_dump`.
    #[serde(skip)]
    pub token: Option<String>,
    /// `CA_HEADER_<NAME>=v` as (`<NAME>`, v), sorted.
    pub headers: Vec<(String, String)>,
}

/// ztunnel's default CA (and xDS) address.
pub fn default_istiod_address(in_kubernetes: bool) -> &'static str {
    if in_kubernetes {
        "https://istiod.istio-system.svc:15012"
    } else {
        "https://localhost:15012"
    }
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
    #[serde(with = "ambit_nodeproxy::config::secs")]
    pub secret_ttl: Duration,
    #[serde(with = "ambit_nodeproxy::config::secs")]
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
}

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

fn dns_config(env: &Env<'_>) -> Result<Option<DnsProxyConfig>, ConfigError> {
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

/// What the xDS client needs besides the address: the channel (`XDS_ROOT_CA`,
/// `ALT_XDS_HOSTNAME`, `AUTH_TOKEN`, the cluster id, `XDS_HEADER_*`) and the node it
/// announces (`POD_NAME`, `POD_NAMESPACE`, `INSTANCE_IP`, `NODE_NAME`, `ISTIO_META_*`,
/// `ISTIO_METAJSON_*`).
#[derive(Clone, Debug)]
pub struct XdsConfig {
    pub channel: ambit_grpc::ChannelConfig,
    pub node: ambit_xds::NodeConfig,
}

fn xds_config(env: &Env<'_>, address: &str, cluster_id: &str) -> Result<XdsConfig, ConfigError> {
    let mut headers: Vec<(String, String)> = env
        .vars
        .iter()
        .filter_map(|(k, v)| Some((k.strip_prefix("XDS_HEADER_")?.to_string(), v.clone())))
        .filter(|(k, _)| !k.is_empty())
        .collect();
    headers.sort();
    let channel = ambit_grpc::ChannelConfig {
        address: address.to_string(),
        root: ambit_grpc::RootCa::from_env_value(env.get("XDS_ROOT_CA")),
        alt_hostname: env
            .get("ALT_XDS_HOSTNAME")
            .filter(|h| !h.is_empty())
            .map(str::to_string),
        token: ambit_grpc::Token::from_env_value(env.get("AUTH_TOKEN")),
        cluster_id: cluster_id.to_string(),
        headers,
    };
    // Named through `get` so a value that is not UTF-8 is refused (see from_process_env).
    let named = ["POD_NAME", "POD_NAMESPACE", "INSTANCE_IP", "NODE_NAME"]
        .into_iter()
        .filter_map(|k| Some((k.to_string(), env.get(k)?.to_string())));
    let prefixed = env
        .vars
        .iter()
        .filter(|(k, _)| k.starts_with("ISTIO_META_") || k.starts_with("ISTIO_METAJSON_"))
        .map(|(k, v)| (k.clone(), v.clone()));
    let node = ambit_xds::NodeConfig::from_vars(named.chain(prefixed)).map_err(|e| {
        ConfigError::Invalid {
            var: "ISTIO_METAJSON_*",
            value: e.var.clone(),
            expected: "a JSON value in every ISTIO_METAJSON_<NAME> variable",
        }
    })?;
    Ok(XdsConfig { channel, node })
}

struct Env<'a> {
    vars: &'a HashMap<String, String>,
    /// Every variable asked for, so values that could not be read are refused only where
    /// they matter (see [`Config::from_process_env`]).
    read: RefCell<BTreeSet<&'static str>>,
}

impl<'a> Env<'a> {
    fn new(vars: &'a HashMap<String, String>) -> Env<'a> {
        Env {
            vars,
            read: RefCell::default(),
        }
    }

    fn get(&self, var: &'static str) -> Option<&str> {
        self.read.borrow_mut().insert(var);
        self.vars.get(var).map(String::as_str)
    }

    fn parse<T: std::str::FromStr>(
        &self,
        var: &'static str,
        expected: &'static str,
    ) -> Result<Option<T>, ConfigError> {
        match self.get(var) {
            None => Ok(None),
            Some(v) => v
                .trim()
                .parse()
                .map(Some)
                .map_err(|_| ConfigError::Invalid {
                    var,
                    value: v.to_string(),
                    expected,
                }),
        }
    }

    fn bool(&self, var: &'static str, default: bool) -> Result<bool, ConfigError> {
        Ok(self.parse::<bool>(var, "true or false")?.unwrap_or(default))
    }

    fn duration(&self, var: &'static str) -> Result<Option<Duration>, ConfigError> {
        match self.get(var) {
            None => Ok(None),
            Some(v) => parse_duration(v).map(Some).ok_or(ConfigError::Invalid {
                var,
                value: v.to_string(),
                expected: "a duration such as 500ms, 30s, 5m, 1h or 1h30m",
            }),
        }
    }

    fn u32_in(
        &self,
        var: &'static str,
        default: u32,
        range: std::ops::RangeInclusive<u32>,
        expected: &'static str,
    ) -> Result<u32, ConfigError> {
        match self.parse::<u32>(var, expected)? {
            None => Ok(default),
            Some(v) if range.contains(&v) => Ok(v),
            Some(v) => Err(ConfigError::Invalid {
                var,
                value: v.to_string(),
                expected,
            }),
        }
    }

    /// A keepalive time or interval: whole seconds as the kernel takes them, 1 to 32767.
    fn keepalive_seconds(&self, var: &'static str, default: u64) -> Result<Duration, ConfigError> {
        // The kernel counts keepalive in whole seconds: a fraction is dropped, as it would
        // be by the socket option, but less than a second would mean "never" and is refused.
        let d = self.duration(var)?.unwrap_or(Duration::from_secs(default));
        if !(1..=32_767).contains(&d.as_secs()) {
            return Err(ConfigError::Invalid {
                var,
                value: self.get(var).unwrap_or_default().to_string(),
                expected: "a duration from 1s to 32767s, such as 180s or 3m (whole seconds count)",
            });
        }
        Ok(Duration::from_secs(d.as_secs()))
    }

    fn addr(&self, var: &'static str, default: &str) -> Result<SocketAddr, ConfigError> {
        Ok(self
            .parse::<SocketAddr>(var, "an address such as 127.0.0.1:15000 or [::]:15020")?
            .unwrap_or_else(|| default.parse().expect("default address")))
    }

    fn port(&self, var: &'static str, default: u16) -> Result<u16, ConfigError> {
        Ok(self
            .parse::<u16>(var, "a TCP port number 0-65535")?
            .unwrap_or(default))
    }
}

/// Durations as ztunnel accepts them: a sequence of `<number><unit>`, unit one of
/// `ns us ms s m h d`; a bare number means seconds.
pub fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    if s.is_empty() {
        return None;
    }
    if let Ok(secs) = s.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let mut total = Duration::ZERO;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits == 0 {
            return None;
        }
        let n: u64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let unit = match &rest[..unit_len] {
            "ns" => Duration::from_nanos(n),
            "us" | "µs" => Duration::from_micros(n),
            "ms" => Duration::from_millis(n),
            "s" => Duration::from_secs(n),
            "m" => Duration::from_secs(n.checked_mul(60)?),
            "h" => Duration::from_secs(n.checked_mul(3600)?),
            "d" => Duration::from_secs(n.checked_mul(86400)?),
            _ => return None,
        };
        total = total.checked_add(unit)?;
        rest = &rest[unit_len..];
    }
    Some(total)
}

/// A Kubernetes CPU quantity (`2`, `1.5`, `500m`) as whole cores, rounded up.
fn cpu_quantity_cores(s: &str) -> Option<usize> {
    let s = s.trim();
    let millis: u64 = match s.strip_suffix('m') {
        Some(m) => m.parse().ok()?,
        None => {
            let (whole, frac) = s.split_once('.').unwrap_or((s, ""));
            if whole.is_empty() && frac.is_empty() || frac.len() > 3 {
                return None;
            }
            let whole: u64 = if whole.is_empty() {
                0
            } else {
                whole.parse().ok()?
            };
            let frac: u64 = if frac.is_empty() {
                0
            } else {
                format!("{frac:0<3}").parse().ok()?
            };
            whole.checked_mul(1000)?.checked_add(frac)?
        }
    };
    usize::try_from(millis.div_ceil(1000)).ok()
}

/// The most worker threads any setting yields.
const MAX_WORKER_THREADS: usize = 1024;

/// Data-plane worker threads, sized the way ztunnel sizes them from the same variables,
/// except that the default keeps one thread where ztunnel keeps two: ambit's data path
/// never blocks a worker, and on small nodes one worker leaves the cores to the workloads
/// (on 2 cores: 42 % instead of 24 % of the direct new-connection rate, see
/// BENCHMARKS.md). `cores` is the machine's logical core count; `ZTUNNEL_CPU_LIMIT`
/// (set from the pod's limit by the Helm chart) stands in for it when set.
fn worker_threads(env: &Env<'_>, cores: usize) -> Result<usize, ConfigError> {
    const THREADS: &str = "a thread count from 1 to 1024 such as 2, a share of the CPUs \
                           such as 50% or 12.5%, or 0 for one thread per CPU";
    let cpus = env
        .parse::<usize>("ZTUNNEL_CPU_LIMIT", "a whole number of cores")?
        .filter(|n| *n > 0)
        .unwrap_or(cores)
        .max(1);
    if let Some(v) = env.get("ZTUNNEL_WORKER_THREADS") {
        let invalid = || ConfigError::Invalid {
            var: "ZTUNNEL_WORKER_THREADS",
            value: v.to_string(),
            expected: THREADS,
        };
        let v = v.trim();
        return match v.strip_suffix('%') {
            Some(pct) => {
                let pct: f64 = pct.trim().parse().map_err(|_| invalid())?;
                if !(pct > 0.0 && pct <= 100.0) {
                    return Err(invalid());
                }
                let threads = (cpus as f64 * pct / 100.0).ceil() as usize;
                Ok(threads.clamp(1, MAX_WORKER_THREADS))
            }
            None => match v.parse::<usize>().map_err(|_| invalid())? {
                0 => Ok(cpus.min(MAX_WORKER_THREADS)),
                n if n <= MAX_WORKER_THREADS => Ok(n),
                _ => Err(invalid()),
            },
        };
    }
    let quantity = |var: &'static str| -> Result<Option<usize>, ConfigError> {
        match env.get(var) {
            None => Ok(None),
            Some(v) => cpu_quantity_cores(v).map(Some).ok_or(ConfigError::Invalid {
                var,
                value: v.to_string(),
                expected: "a CPU quantity such as 2, 1.5 or 500m",
            }),
        }
    };
    let request = quantity("ZTUNNEL_RESOURCE_CPU_REQUEST")?.unwrap_or(0);
    let threads = match quantity("ZTUNNEL_RESOURCE_CPU_LIMIT")? {
        Some(limit) => limit.max(request),
        None => cpus.div_ceil(4).max(request),
    };
    Ok(threads.clamp(1, MAX_WORKER_THREADS))
}

fn available_cores() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

/// How many connections may be in their HBONE handshake at once: on the node
/// (`AMBIT_MAX_HBONE_HANDSHAKES`), per pod in shared mode
/// (`AMBIT_MAX_HBONE_HANDSHAKES_PER_POD`; in dedicated mode the node is the one instance)
/// and per source IP (`AMBIT_MAX_HBONE_HANDSHAKES_PER_SOURCE`, default a quarter of the
/// instance's share).
fn handshake_limits(env: &Env, mode: ProxyMode) -> Result<HandshakeLimits, ConfigError> {
    let count = |var, default: usize| {
        env.u32_in(
            var,
            default as u32,
            1..=1_000_000,
            "a number of connections, 1 to 1000000",
        )
        .map(|n| n as usize)
    };
    let node = count("AMBIT_MAX_HBONE_HANDSHAKES", HandshakeLimits::DEFAULT_NODE)?;
    let pod = match mode {
        ProxyMode::Dedicated => node,
        ProxyMode::Shared => count(
            "AMBIT_MAX_HBONE_HANDSHAKES_PER_POD",
            HandshakeLimits::DEFAULT_POD,
        )?,
    };
    let mut limits = HandshakeLimits::for_pod(node, pod);
    limits.source = count("AMBIT_MAX_HBONE_HANDSHAKES_PER_SOURCE", limits.source)?;
    Ok(limits)
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
        // Not `std::env::vars()`, which panics on a value that is not UTF-8. Such a value
        // is left out, and refused by name if it is one of ours (a path must not silently
        // become another); in any other variable it is none of our business.
        let mut vars = HashMap::new();
        let mut unreadable = BTreeSet::new();
        for (k, v) in std::env::vars_os() {
            match (k.into_string(), v.into_string()) {
                (Ok(k), Ok(v)) => {
                    vars.insert(k, v);
                }
                (Ok(k), Err(_)) => {
                    unreadable.insert(k);
                }
                (Err(_), _) => {}
            }
        }
        let env = Env::new(&vars);
        let result = Config::from_checked_env(&env, available_cores());
        if let Some(var) = env.read.borrow().iter().find(|v| unreadable.contains(**v)) {
            return Err(ConfigError::Invalid {
                var,
                value: "(not UTF-8)".into(),
                expected: "a UTF-8 value",
            });
        }
        result
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
            None => Some(
                default_istiod_address(env.get("KUBERNETES_SERVICE_HOST").is_some()).to_string(),
            ),
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
        let packet_mark =
            match env.parse::<u32>("PACKET_MARK", "a 32-bit unsigned integer such as 1337")? {
                Some(m) => Some(m),
                None if proxy_mode == ProxyMode::Shared => Some(marks::PROXY),
                None => None,
            };
        let h2_defaults = ambit_hbone::H2Settings::default();
        let stream_window = env.u32_in(
            "HTTP2_STREAM_WINDOW_SIZE",
            h2_defaults.stream_window,
            65_535..=(i32::MAX as u32),
            "a window size in bytes, 65535 (HTTP/2's initial window) to 2147483647",
        )?;
        let connection_window = env.u32_in(
            "HTTP2_CONNECTION_WINDOW_SIZE",
            h2_defaults.connection_window,
            65_535..=(i32::MAX as u32),
            "a window size in bytes, 65535 (HTTP/2's initial window) to 2147483647",
        )?;
        let frame_size = env.u32_in(
            "HTTP2_FRAME_SIZE",
            h2_defaults.frame_size,
            16_384..=16_777_215,
            "a frame size in bytes, 16384 to 16777215",
        )?;
        let max_streams = env.u32_in(
            "POOL_MAX_STREAMS_PER_CONNECTION",
            ambit_hbone::ClientSettings::default().max_streams_per_connection,
            1..=u16::MAX as u32,
            "a stream count, 1 to 65535",
        )?;
        let idle = env
            .duration("POOL_UNUSED_RELEASE_TIMEOUT")?
            .unwrap_or(ambit_hbone::ClientSettings::default().idle_timeout);
        let original_source = match env.get("ENABLE_ORIG_SRC") {
            None => OriginalSource::Auto,
            Some(_) => {
                if env.bool("ENABLE_ORIG_SRC", false)? {
                    OriginalSource::Required
                } else {
                    OriginalSource::Off
                }
            }
        };
        let termination_deadline = match env.duration("CONNECTION_TERMINATION_DEADLINE")? {
            Some(d) => d,
            None => match env.parse::<u64>(
                "TERMINATION_GRACE_PERIOD_SECONDS",
                "a whole number of seconds",
            )? {
                Some(secs) => deadline_from_grace(secs),
                None => Duration::from_secs(5),
            },
        };
        let keepalive = Keepalive {
            enabled: env.bool("KEEPALIVE_ENABLED", true)?,
            time: env.keepalive_seconds("KEEPALIVE_TIME", 180)?,
            interval: env.keepalive_seconds("KEEPALIVE_INTERVAL", 180)?,
            retries: env.u32_in(
                "KEEPALIVE_RETRIES",
                9,
                1..=127,
                "a number of probes, 1 to 127",
            )?,
            user_timeout: env.bool("USER_TIMEOUT_ENABLED", false)?,
        };
        let ipv6_enabled = env.bool("IPV6_ENABLED", true)?;
        let hbone_port = env.port("AMBIT_HBONE_PORT", ports::HBONE)?;
        let ports = Ports {
            outbound: env.port("AMBIT_OUTBOUND_PORT", ports::OUTBOUND)?,
            inbound_plaintext: env
                .port("AMBIT_INBOUND_PLAINTEXT_PORT", ports::INBOUND_PLAINTEXT)?,
            inbound_hbone: hbone_port,
            remote_hbone: env.port("AMBIT_REMOTE_HBONE_PORT", hbone_port)?,
            socks5: env
                .bool("UNSTABLE_ENABLE_SOCKS5", false)?
                .then_some(ports::SOCKS5),
        };
        let h2 = ambit_hbone::H2Settings {
            stream_window,
            connection_window,
            frame_size,
            idle_timeout: env
                .duration("AMBIT_HBONE_IDLE_TIMEOUT")?
                .unwrap_or(h2_defaults.idle_timeout),
            max_stream_rate: env.u32_in(
                "AMBIT_HBONE_MAX_STREAM_RATE",
                h2_defaults.max_stream_rate,
                0..=u32::MAX,
                "streams per second a client may open on one connection (0: no limit)",
            )?,
            ..Default::default()
        };
        let handshakes = handshake_limits(env, proxy_mode)?;
        let pool = ambit_hbone::ClientSettings {
            h2: h2.clone(),
            max_streams_per_connection: max_streams,
            idle_timeout: idle,
            ..Default::default()
        };
        let cluster_id = env
            .get("ISTIO_META_CLUSTER_ID")
            .or(env.get("CLUSTER_ID"))
            .unwrap_or("Kubernetes")
            .to_string();
        let trust_domain = env
            .get("TRUST_DOMAIN")
            .unwrap_or("cluster.local")
            .to_string();
        let xds = match &xds_address {
            None => None,
            Some(address) => Some(xds_config(env, address, &cluster_id)?),
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
        let admin_addr = env.addr("AMBIT_ADMIN_ADDR", &format!("127.0.0.1:{}", ports::ADMIN))?;
        if !admin_addr.ip().is_loopback() {
            return Err(ConfigError::Invalid {
                var: "AMBIT_ADMIN_ADDR",
                value: admin_addr.to_string(),
                expected: "a loopback address: the admin endpoint can shut the proxy down",
            });
        }
        let wildcard = if ipv6_enabled { "[::]" } else { "0.0.0.0" };
        let stats_addr = env.addr("AMBIT_STATS_ADDR", &format!("{wildcard}:{}", ports::STATS))?;
        let readiness_addr = env.addr(
            "AMBIT_READINESS_ADDR",
            &format!("{wildcard}:{}", ports::READINESS),
        )?;
        // In dedicated mode the operator ports share the workload's addresses: captured
        // or tunnelled traffic must not reach them. In-pod they are in the node's netns.
        let reserved_ports = match proxy_mode {
            ProxyMode::Dedicated => vec![stats_addr.port(), readiness_addr.port()],
            ProxyMode::Shared => Vec::new(),
        };
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
            secret_ttl: match env.duration("SECRET_TTL")? {
                None => Duration::from_secs(86400),
                Some(ttl) if ttl >= Duration::from_secs(10) => ttl,
                Some(_) => {
                    return Err(ConfigError::Invalid {
                        var: "SECRET_TTL",
                        value: env.get("SECRET_TTL").unwrap_or_default().to_string(),
                        expected: "a certificate lifetime of at least 10s, such as 24h",
                    })
                }
            },
            termination_deadline,
            inpod_uds: env.get("INPOD_UDS").unwrap_or(paths::ZDS_SOCKET).into(),
            inpod_port_reuse: env.bool("INPOD_PORT_REUSE", true)?,
            inpod_agent_uid: env.parse::<u32>("AMBIT_ZDS_AGENT_UID", "a uid such as 1337")?,
            admin_addr,
            stats_addr,
            readiness_addr,
            worker_threads: worker_threads(env, cores)?,
            dns: dns_config(env)?,
            proxy: ProxyConfig {
                ports,
                packet_mark,
                network: env.get("NETWORK").unwrap_or("").to_string(),
                cluster_id,
                ipv6_enabled,
                original_source,
                keepalive,
                h2,
                pool,
                response_baggage: env.bool("ENABLE_RESPONSE_BAGGAGE", true)?,
                localhost_app_tunnel: env.bool("LOCALHOST_APP_TUNNEL", true)?,
                handshakes,
                reserved_ports,
            },
        })
    }
}

/// The certificate issuer: `CA_ADDRESS` ⇒ that CA; else `LOCAL_CA_DIR` ⇒ the local CA;
/// else, with no local config (the mesh comes over xDS), ztunnel's default CA address;
/// else an ephemeral root.
fn ca_source(
    env: &Env<'_>,
    local_ca_dir: Option<&PathBuf>,
    has_local_config: bool,
) -> Result<CaSource, ConfigError> {
    let address = match env.get("CA_ADDRESS") {
        Some(a) if a.trim().is_empty() => {
            return Err(ConfigError::Invalid {
                var: "CA_ADDRESS",
                value: a.to_string(),
                expected: "the CA's address, such as https://istiod.istio-system.svc:15012 (unset it to use LOCAL_CA_DIR)",
            })
        }
        Some(a) => Some(ambit_grpc::with_scheme(a.trim())),
        None => match local_ca_dir {
            Some(dir) => return Ok(CaSource::LocalDir(dir.clone())),
            None if !has_local_config => Some(
                default_istiod_address(env.get("KUBERNETES_SERVICE_HOST").is_some()).to_string(),
            ),
            None => None,
        },
    };
    let Some(address) = address else {
        return Ok(CaSource::Ephemeral);
    };
    let mut headers: Vec<(String, String)> = env
        .vars
        .iter()
        .filter_map(|(k, v)| Some((k.strip_prefix("CA_HEADER_")?.to_string(), v.clone())))
        .filter(|(k, _)| !k.is_empty())
        .collect();
    headers.sort();
    Ok(CaSource::Remote(RemoteCa {
        address,
        root: env.get("CA_ROOT_CA").map(str::to_string),
        alt_hostname: env
            .get("ALT_CA_HOSTNAME")
            .filter(|h| !h.is_empty())
            .map(str::to_string),
        token: env.get("AUTH_TOKEN").map(str::to_string),
        headers,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

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
}

#[cfg(test)]
mod ca_tests {
    use super::*;

    fn source(pairs: &[(&str, &str)], has_local_config: bool) -> Result<CaSource, ConfigError> {
        let vars: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let env = Env::new(&vars);
        let dir = env.get("LOCAL_CA_DIR").map(PathBuf::from);
        ca_source(&env, dir.as_ref(), has_local_config)
    }

    fn remote(pairs: &[(&str, &str)], has_local_config: bool) -> RemoteCa {
        match source(pairs, has_local_config).unwrap() {
            CaSource::Remote(r) => r,
            other => panic!("not remote: {other:?}"),
        }
    }

    #[test]
    fn ca_address_wins_and_gets_a_scheme() {
        let r = remote(
            &[
                ("CA_ADDRESS", "istiod.example:15012"),
                ("LOCAL_CA_DIR", "/ca"),
                ("CA_ROOT_CA", "SYSTEM"),
                ("ALT_CA_HOSTNAME", "istiod.istio-system.svc"),
                ("AUTH_TOKEN", "/var/run/token"),
                ("CA_HEADER_X-B", "2"),
                ("CA_HEADER_X-A", "1"),
                ("XDS_HEADER_X-C", "3"),
            ],
            true,
        );
        assert_eq!(r.address, "https://istiod.example:15012");
        assert_eq!(r.root.as_deref(), Some("SYSTEM"));
        assert_eq!(r.alt_hostname.as_deref(), Some("istiod.istio-system.svc"));
        assert_eq!(r.token.as_deref(), Some("/var/run/token"));
        assert_eq!(
            r.headers,
            [
                ("X-A".to_string(), "1".to_string()),
                ("X-B".into(), "2".into())
            ]
        );
        // The token never appears in the config dump.
        let shown = serde_json::to_string(&CaSource::Remote(r)).unwrap();
        assert!(!shown.contains("/var/run/token"), "{shown}");
        assert_eq!(
            remote(&[("CA_ADDRESS", "https://ca:1")], true).address,
            "https://ca:1"
        );
    }

    #[test]
    fn without_ca_address_the_local_ca_or_istiod_or_an_ephemeral_root() {
        assert_eq!(
            source(&[("LOCAL_CA_DIR", "/ca")], true).unwrap(),
            CaSource::LocalDir("/ca".into())
        );
        assert_eq!(
            source(&[("LOCAL_CA_DIR", "/ca")], false).unwrap(),
            CaSource::LocalDir("/ca".into())
        );
        assert_eq!(source(&[], true).unwrap(), CaSource::Ephemeral);
        // On xDS without a local CA: ztunnel's default istiod address.
        let r = remote(&[], false);
        assert_eq!(r.address, "https://localhost:15012");
        assert_eq!(r.root, None);
        assert_eq!(
            remote(&[("KUBERNETES_SERVICE_HOST", "10.96.0.1")], false).address,
            "https://istiod.istio-system.svc:15012"
        );
    }

    #[test]
    fn an_empty_ca_address_is_refused() {
        let e = source(&[("CA_ADDRESS", "")], true).unwrap_err().to_string();
        assert!(e.contains("CA_ADDRESS"), "{e}");
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
