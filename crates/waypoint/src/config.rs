//! The waypoint's environment: Istio's names where they exist (`POD_NAME`,
//! `POD_NAMESPACE`, `SERVICE_ACCOUNT`, `INSTANCE_IP`, `CLUSTER_ID`, `TRUST_DOMAIN`,
//! `XDS_ADDRESS`, `CA_ADDRESS`, …), read by the same reader as the node proxy's
//! (the process kit, `ambit-process`), and ambit's own for what Istio has no name for.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use ambit_identity::SpiffeId;
use ambit_process::ca::{ca_source, secret_ttl, CaSource};
use ambit_process::env::{Env, ProcessEnv};
use ambit_process::xds::{xds_config, XdsConfig};
use ambit_process::ConfigError;
use ambit_state::PathNormalization;
use ambit_wellknown::ports;

/// Everything the waypoint is started with.
#[derive(Debug, Clone)]
pub struct Config {
    /// `POD_NAMESPACE`: the waypoint's namespace (its Gateway's).
    pub namespace: String,
    /// `POD_NAME`.
    pub pod_name: String,
    /// `GATEWAY_NAME`: the Gateway this pod serves (default: the service account, as
    /// Istio names a waypoint's service account after its Gateway).
    pub gateway: String,
    /// `GATEWAY_CLASS`: its GatewayClass, for policies that target one (default
    /// `istio-waypoint`).
    pub gateway_class: String,
    /// `SERVICE_ACCOUNT`.
    pub service_account: String,
    /// `TRUST_DOMAIN` (default `cluster.local`).
    pub trust_domain: String,
    /// `CLUSTER_ID` (default `Kubernetes`).
    pub cluster_id: String,
    /// `NETWORK`: where authorities and endpoints are looked up.
    pub network: String,
    /// `CLUSTER_DOMAIN` (default `cluster.local`): a route's backend Service `name` in
    /// `namespace` is `<name>.<namespace>.svc.<domain>`.
    pub cluster_domain: String,
    /// `INSTANCE_IP`: the pod's address, the source of onward connections (so the
    /// destination's node proxy sees the waypoint at its own address).
    pub instance_ip: Option<std::net::IpAddr>,
    /// The mesh: `LOCAL_XDS_PATH` (a file, re-read when it changes), else `XDS_ADDRESS`.
    pub mesh: MeshSource,
    /// Where the L7 configuration (AuthorizationPolicy, RequestAuthentication, HTTPRoute,
    /// GRPCRoute) comes from.
    pub l7: L7Source,
    /// Where certificates come from.
    pub ca: CaSource,
    pub secret_ttl: Duration,
    /// `AMBIT_HBONE_ADDR` (default `[::]:15008`, or `0.0.0.0:15008` without IPv6).
    pub hbone_addr: SocketAddr,
    /// `AMBIT_ADMIN_ADDR` (loopback only, default `127.0.0.1:15000`).
    pub admin_addr: SocketAddr,
    /// `AMBIT_STATS_ADDR` (default port 15020).
    pub stats_addr: SocketAddr,
    /// `AMBIT_READINESS_ADDR` (default port 15021).
    pub readiness_addr: SocketAddr,
    /// `AMBIT_PATH_NORMALIZATION`: MeshConfig's `pathNormalization` (default `BASE`).
    pub path_normalization: PathNormalization,
    /// How long in-flight requests may run on after SIGTERM
    /// (`TERMINATION_GRACE_PERIOD_SECONDS` less 5 s, at least 1 s; default 25 s).
    pub drain_deadline: Duration,
    /// `AMBIT_MAX_HBONE_CONNECTIONS`: connections in their handshake, in all (a quarter per
    /// source).
    pub max_handshakes: usize,
    /// `ISTIO_VERSION` for `istio_build`.
    pub istio_version: String,
    /// `AMBIT_ACCESS_LOG`: one `access` line per request (default off, as Istio's
    /// waypoints log nothing until `accessLogFile` is set).
    pub access_log: bool,
    /// `AMBIT_WORKER_THREADS`: the data path's worker threads, each with its own event
    /// loop and onward pools (default: the cores available, at most 2, as Istio's
    /// waypoints run two workers).
    pub worker_threads: usize,
    /// `AMBIT_UPGRADE_TYPES`: the HTTP/1.1 upgrades joined (default `websocket`, as Istio
    /// configures Envoy; never `h2c`).
    pub upgrade_types: crate::head::UpgradeTypes,
    /// `AMBIT_XFCC_INCLUDE_CLIENT_IDENTITY`: send the caller's identity to the backend in
    /// `x-forwarded-client-cert` (default off), as Istio's Gateway annotation
    /// `ambient.istio.io/xfcc-include-client-identity` does.
    pub xfcc_client_identity: bool,
    /// `AMBIT_RESOLV_CONF` (default `/etc/resolv.conf`): the nameservers that resolve
    /// endpoints known by hostname (ServiceEntry `resolution: DNS`).
    pub resolv_conf: PathBuf,
}

/// Where the L7 configuration comes from. Never the `XDS_ADDRESS` stream: istiod answers
/// ambit's types there with nothing (then no policy would be enforced) or with an error
/// that closes the whole stream, workloads included.
#[derive(Debug, Clone)]
pub enum L7Source {
    /// `AMBIT_WAYPOINT_CONFIG`: a file or directory of Kubernetes-shaped documents.
    File(PathBuf),
    /// `AMBIT_CONTROL_ADDRESS`: a second delta xDS stream, to `ambit control`, for the
    /// `ambit.waypoint.v1.*` types (default in istiod's pod: the chart's Service).
    Control(Box<XdsConfig>),
    /// `AMBIT_WAYPOINT_NO_L7_POLICY=true`: none, said explicitly.
    Nothing,
}

/// Where the chart installs `ambit control`: found by default from istiod's pod.
pub const DEFAULT_CONTROL_ADDRESS: &str = "https://ambit-control.istio-system.svc:15012";

/// Where the mesh state comes from.
#[derive(Debug, Clone)]
pub enum MeshSource {
    /// `LOCAL_XDS_PATH`: ztunnel's local config file.
    File(PathBuf),
    /// `XDS_ADDRESS`: delta xDS from istiod or `ambit control`.
    Xds(Box<XdsConfig>),
}

impl Config {
    /// The waypoint's own SPIFFE identity.
    pub fn identity(&self) -> SpiffeId {
        SpiffeId::new(&self.trust_domain, &self.namespace, &self.service_account).unwrap_or_else(
            |_| {
                // Checked in `from_env`; unreachable in practice, refused loudly if not.
                panic!("identity checked at start-up")
            },
        )
    }

    /// Reads the process environment (a value that is not UTF-8 is refused where read).
    pub fn from_process_env() -> Result<Config, ConfigError> {
        Config::from_process(&ProcessEnv::capture())
    }

    /// Reads `env`, refusing by name a variable it reads whose value is not UTF-8.
    pub fn from_process(env: &ProcessEnv) -> Result<Config, ConfigError> {
        env.read(Config::from_checked_env)
    }

    /// Reads `vars`; an error names the variable, its value and what was expected.
    pub fn from_env(vars: &HashMap<String, String>) -> Result<Config, ConfigError> {
        Config::from_checked_env(&Env::new(vars))
    }

    /// Istio's names (istiod's pod) are read first, each where ambit's own is unset
    /// ([`crate::istio_pod`]); then everything from the result.
    fn from_checked_env(env: &Env<'_>) -> Result<Config, ConfigError> {
        let info_dir = env
            .get("AMBIT_POD_INFO_DIR")
            .filter(|d| !d.trim().is_empty())
            .unwrap_or(crate::istio_pod::DEFAULT_POD_INFO_DIR);
        let labels_path = std::path::Path::new(info_dir).join("labels");
        let labels = std::fs::read(&labels_path).ok().map(|bytes| {
            let path = labels_path.display().to_string();
            (path, String::from_utf8_lossy(&bytes).into_owned())
        });
        let translated = crate::istio_pod::translate(
            env,
            labels.as_ref().map(|(p, t)| (p.as_str(), t.as_str())),
        )?;
        let vars = crate::istio_pod::overlay(env, &translated);
        let inner = Env::new(&vars);
        let read = Config::from_translated_env(&inner, translated.from_istiod);
        env.read.borrow_mut().extend(inner.read.borrow().iter());
        read
    }

    fn from_translated_env(env: &Env<'_>, from_istiod: bool) -> Result<Config, ConfigError> {
        let required = |var: &'static str| -> Result<String, ConfigError> {
            match env.get(var).map(str::trim) {
                Some(v) if !v.is_empty() => Ok(v.to_string()),
                _ => Err(ConfigError::Missing {
                    var,
                    because: "running a waypoint (it names the waypoint's pod and identity)",
                }),
            }
        };
        let namespace = required("POD_NAMESPACE")?;
        let pod_name = required("POD_NAME")?;
        let service_account = required("SERVICE_ACCOUNT")?;
        let gateway = env
            .get("GATEWAY_NAME")
            .filter(|g| !g.trim().is_empty())
            .map_or_else(|| service_account.clone(), |g| g.trim().to_string());
        let trust_domain = env
            .get("TRUST_DOMAIN")
            .filter(|t| !t.is_empty())
            .unwrap_or("cluster.local")
            .to_string();
        if SpiffeId::new(&trust_domain, &namespace, &service_account).is_err() {
            return Err(ConfigError::Invalid {
                var: "TRUST_DOMAIN",
                value: format!("{trust_domain} (POD_NAMESPACE={namespace}, SERVICE_ACCOUNT={service_account})"),
                expected: "values that make a SPIFFE id spiffe://<trust domain>/ns/<namespace>/sa/<service account>",
            });
        }
        let cluster_id = env
            .get("CLUSTER_ID")
            .filter(|c| !c.is_empty())
            .unwrap_or("Kubernetes")
            .to_string();
        let local_path = env
            .get("LOCAL_XDS_PATH")
            .filter(|p| !p.is_empty())
            .map(PathBuf::from);
        let mesh =
            match (local_path, env.get("XDS_ADDRESS").filter(|a| !a.is_empty())) {
                (Some(path), _) => MeshSource::File(path),
                (None, Some(address)) => MeshSource::Xds(Box::new(xds_config(
                    env,
                    &ambit_grpc::with_scheme(address.trim()),
                    &cluster_id,
                )?)),
                (None, None) => return Err(ConfigError::Missing {
                    var: "XDS_ADDRESS",
                    because:
                        "LOCAL_XDS_PATH is not set (the waypoint needs the mesh from one of them)",
                }),
            };
        let local_ca_dir = env
            .get("LOCAL_CA_DIR")
            .filter(|d| !d.is_empty())
            .map(PathBuf::from);
        let ca = ca_source(
            env,
            local_ca_dir.as_ref(),
            matches!(mesh, MeshSource::File(_)),
        )?;
        let l7 = l7_source(env, from_istiod, &cluster_id, &trust_domain)?;
        let ipv6 = env.bool("IPV6_ENABLED", true)?;
        let wildcard = if ipv6 { "[::]" } else { "0.0.0.0" };
        let admin_addr = env.addr("AMBIT_ADMIN_ADDR", &format!("127.0.0.1:{}", ports::ADMIN))?;
        if !admin_addr.ip().is_loopback() {
            return Err(ConfigError::Invalid {
                var: "AMBIT_ADMIN_ADDR",
                value: admin_addr.to_string(),
                expected: "a loopback address: the admin endpoint can shut the waypoint down",
            });
        }
        let path_normalization = match env.get("AMBIT_PATH_NORMALIZATION") {
            None => PathNormalization::default(),
            Some(v) => PathNormalization::from_name(v.trim()).ok_or(ConfigError::Invalid {
                var: "AMBIT_PATH_NORMALIZATION",
                value: v.to_string(),
                expected: "NONE, BASE, MERGE_SLASHES or DECODE_AND_MERGE_SLASHES",
            })?,
        };
        let grace = env
            .parse::<u64>("TERMINATION_GRACE_PERIOD_SECONDS", "a number of seconds")?
            .unwrap_or(30);
        let max_handshakes = env
            .parse::<usize>("AMBIT_MAX_HBONE_CONNECTIONS", "a number of connections")?
            .unwrap_or(1024)
            .max(4);
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let worker_threads = env
            .parse::<usize>("AMBIT_WORKER_THREADS", "a number of threads from 1")?
            .unwrap_or(cores.min(2))
            .max(1);
        let upgrade_types = match env.get("AMBIT_UPGRADE_TYPES") {
            None => crate::head::UpgradeTypes::default(),
            Some(v) => crate::head::UpgradeTypes::parse(v).map_err(|_| ConfigError::Invalid {
                var: "AMBIT_UPGRADE_TYPES",
                value: v.to_string(),
                expected: "a comma-separated list of protocol tokens other than h2c (a joined \
                           h2c connection would carry requests that no policy sees)",
            })?,
        };
        Ok(Config {
            upgrade_types,
            xfcc_client_identity: env.bool("AMBIT_XFCC_INCLUDE_CLIENT_IDENTITY", false)?,
            resolv_conf: env
                .get("AMBIT_RESOLV_CONF")
                .filter(|p| !p.is_empty())
                .map_or_else(|| PathBuf::from("/etc/resolv.conf"), PathBuf::from),
            namespace,
            pod_name,
            gateway,
            gateway_class: env
                .get("GATEWAY_CLASS")
                .filter(|c| !c.trim().is_empty())
                .unwrap_or("istio-waypoint")
                .trim()
                .to_string(),
            worker_threads,
            access_log: env.bool("AMBIT_ACCESS_LOG", false)?,
            service_account,
            trust_domain,
            cluster_id,
            network: env.get("NETWORK").unwrap_or_default().to_string(),
            cluster_domain: env
                .get("CLUSTER_DOMAIN")
                .map(|d| d.trim().trim_end_matches('.'))
                .filter(|d| !d.is_empty())
                .unwrap_or("cluster.local")
                .to_string(),
            instance_ip: env.parse("INSTANCE_IP", "the pod's IP address")?,
            mesh,
            l7,
            ca,
            secret_ttl: secret_ttl(env)?,
            hbone_addr: env.addr("AMBIT_HBONE_ADDR", &format!("{wildcard}:{}", ports::HBONE))?,
            admin_addr,
            stats_addr: env.addr("AMBIT_STATS_ADDR", &format!("{wildcard}:{}", ports::STATS))?,
            readiness_addr: env.addr(
                "AMBIT_READINESS_ADDR",
                &format!("{wildcard}:{}", ports::READINESS),
            )?,
            path_normalization,
            drain_deadline: Duration::from_secs(grace.saturating_sub(5).max(1)),
            max_handshakes,
            istio_version: ambit_runtime::version::istio_version(),
        })
    }
}

/// `AMBIT_WAYPOINT_CONFIG` (a file wins), else `AMBIT_CONTROL_ADDRESS` (in istiod's pod,
/// the chart's Service unless set empty), else nothing only when said explicitly.
fn l7_source(
    env: &Env<'_>,
    from_istiod: bool,
    cluster_id: &str,
    trust_domain: &str,
) -> Result<L7Source, ConfigError> {
    if let Some(path) = env.get("AMBIT_WAYPOINT_CONFIG").filter(|p| !p.is_empty()) {
        return Ok(L7Source::File(PathBuf::from(path)));
    }
    let address = match env.get("AMBIT_CONTROL_ADDRESS").map(str::trim) {
        Some("") => None,
        Some(a) => Some(ambit_grpc::with_scheme(a)),
        None if from_istiod => Some(DEFAULT_CONTROL_ADDRESS.to_string()),
        None => None,
    };
    let no_policy = env.bool("AMBIT_WAYPOINT_NO_L7_POLICY", false)?;
    let Some(address) = address else {
        return if no_policy {
            Ok(L7Source::Nothing)
        } else {
            Err(ConfigError::Missing {
                var: "AMBIT_CONTROL_ADDRESS",
                because: "AMBIT_WAYPOINT_CONFIG is not set either: the waypoint would enforce \
                          no AuthorizationPolicy at all (set AMBIT_WAYPOINT_NO_L7_POLICY=true \
                          to run without L7 configuration on purpose)",
            })
        };
    };
    let identity = match env.get("AMBIT_CONTROL_IDENTITY").map(str::trim) {
        Some(id) => SpiffeId::parse(id).map_err(|_| ConfigError::Invalid {
            var: "AMBIT_CONTROL_IDENTITY",
            value: id.to_string(),
            expected: "the control server's SPIFFE id, spiffe://<trust domain>/ns/<namespace>/sa/<service account>",
        })?,
        None => {
            let namespace = service_namespace(&address).unwrap_or("istio-system");
            SpiffeId::new(trust_domain, namespace, "ambit-control").map_err(|_| {
                ConfigError::Invalid {
                    var: "AMBIT_CONTROL_ADDRESS",
                    value: address.clone(),
                    expected: "a Service address <name>.<namespace>.svc:<port> whose namespace \
                               makes a SPIFFE id (or set AMBIT_CONTROL_IDENTITY)",
                }
            })?
        }
    };
    // The xDS node and token as for istiod; the server proves its SPIFFE id with a
    // certificate chaining to the mesh root (XDS_ROOT_CA), not a host name.
    let mut control = xds_config(env, &address, cluster_id)?;
    control.channel.alt_hostname = None;
    control.channel.headers.clear();
    control.channel.server_identity = Some(identity);
    Ok(L7Source::Control(Box::new(control)))
}

/// The namespace of a Service address (`https://<name>.<namespace>.svc[.<domain>]:<port>`).
fn service_namespace(address: &str) -> Option<&str> {
    let host = address.split_once("://").map_or(address, |(_, h)| h);
    let host = host.split(['/', ':']).next()?;
    let mut labels = host.split('.');
    let (_name, namespace, svc) = (labels.next()?, labels.next()?, labels.next()?);
    (svc == "svc" && !namespace.is_empty()).then_some(namespace)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        let mut v: HashMap<String, String> = [
            ("POD_NAMESPACE", "shop"),
            ("POD_NAME", "waypoint-0"),
            ("SERVICE_ACCOUNT", "waypoint"),
            ("LOCAL_XDS_PATH", "/mesh.yaml"),
            ("AMBIT_WAYPOINT_CONFIG", "/policies"),
            // No istiod pod info on this machine, whatever /etc/istio/pod holds.
            ("AMBIT_POD_INFO_DIR", "/nonexistent-pod-info"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        for (k, val) in pairs {
            if val.is_empty() {
                v.remove(*k);
            } else {
                v.insert(k.to_string(), val.to_string());
            }
        }
        v
    }

    #[test]
    fn defaults_follow_istio() {
        let c = Config::from_env(&vars(&[])).unwrap();
        assert_eq!(
            c.identity().to_string(),
            "spiffe://cluster.local/ns/shop/sa/waypoint"
        );
        assert_eq!(c.gateway, "waypoint");
        assert_eq!(c.hbone_addr.port(), 15008);
        assert_eq!(c.admin_addr.to_string(), "127.0.0.1:15000");
        assert_eq!(c.stats_addr.port(), 15020);
        assert_eq!(c.readiness_addr.port(), 15021);
        assert_eq!(c.drain_deadline, Duration::from_secs(25));
        assert!(matches!(c.ca, CaSource::Ephemeral));
        assert_eq!(c.upgrade_types.names(), ["websocket"]);
        assert!(!c.xfcc_client_identity);
        assert_eq!(c.resolv_conf.as_os_str(), "/etc/resolv.conf");
        assert!(matches!(&c.l7, L7Source::File(p) if p.as_os_str() == "/policies"));
    }

    /// The waypoint never runs with no L7 policy unless told so, and its L7 stream goes to
    /// ambit's control server, which must prove the chart's SPIFFE id.
    #[test]
    fn l7_source() {
        let e = Config::from_env(&vars(&[("AMBIT_WAYPOINT_CONFIG", "")]))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(
                "AMBIT_CONTROL_ADDRESS is required when AMBIT_WAYPOINT_CONFIG is not set"
            ),
            "{e}"
        );
        let c = Config::from_env(&vars(&[
            ("AMBIT_WAYPOINT_CONFIG", ""),
            ("AMBIT_WAYPOINT_NO_L7_POLICY", "true"),
        ]))
        .unwrap();
        assert!(matches!(c.l7, L7Source::Nothing));
        let control = |pairs: &[(&str, &str)]| {
            let mut all = vec![("AMBIT_WAYPOINT_CONFIG", "")];
            all.extend_from_slice(pairs);
            match Config::from_env(&vars(&all)).map(|c| c.l7) {
                Ok(L7Source::Control(x)) => Ok((
                    x.channel.address.clone(),
                    x.channel.server_identity.as_ref().map(ToString::to_string),
                )),
                Ok(other) => Err(format!("{other:?}")),
                Err(e) => Err(e.to_string()),
            }
        };
        assert_eq!(
            control(&[(
                "AMBIT_CONTROL_ADDRESS",
                "ambit-control.mesh-ops.svc.cluster.local:15012"
            )]),
            Ok((
                "https://ambit-control.mesh-ops.svc.cluster.local:15012".to_string(),
                Some("spiffe://cluster.local/ns/mesh-ops/sa/ambit-control".to_string())
            ))
        );
        assert_eq!(
            control(&[
                ("AMBIT_CONTROL_ADDRESS", "10.0.0.5:15012"),
                (
                    "AMBIT_CONTROL_IDENTITY",
                    "spiffe://cluster.local/ns/ops/sa/ctl"
                ),
                ("TRUST_DOMAIN", "td.example"),
            ]),
            Ok((
                "https://10.0.0.5:15012".to_string(),
                Some("spiffe://cluster.local/ns/ops/sa/ctl".to_string())
            ))
        );
        // In istiod's pod, the chart's Service by default; set empty, none.
        assert_eq!(
            control(&[("CA_ADDR", "istiod.istio-system.svc:15012")]),
            Ok((
                DEFAULT_CONTROL_ADDRESS.to_string(),
                Some("spiffe://cluster.local/ns/istio-system/sa/ambit-control".to_string())
            ))
        );
        // Set empty (the helper drops an empty value, so a blank one stands for it).
        let e = control(&[("CA_ADDR", "istiod:15012"), ("AMBIT_CONTROL_ADDRESS", " ")]);
        assert!(e
            .unwrap_err()
            .starts_with("AMBIT_CONTROL_ADDRESS is required"));
        let e = control(&[
            ("AMBIT_CONTROL_ADDRESS", "c:15012"),
            ("AMBIT_CONTROL_IDENTITY", "ambit-control"),
        ]);
        assert!(e
            .unwrap_err()
            .starts_with("AMBIT_CONTROL_IDENTITY=\"ambit-control\""));
    }

    /// Started as istiod starts its waypoint pod: its variables and its labels file.
    #[test]
    fn istiods_pod_as_it_is() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("labels"),
            "gateway.networking.k8s.io/gateway-class-name=\"istio-waypoint\"\n\
             gateway.networking.k8s.io/gateway-name=\"shop-waypoint\"\n",
        )
        .unwrap();
        let info = dir.path().display().to_string();
        let c = Config::from_env(&vars(&[
            ("LOCAL_XDS_PATH", ""),
            ("AMBIT_WAYPOINT_CONFIG", ""),
            ("AMBIT_POD_INFO_DIR", &info),
            ("SERVICE_ACCOUNT", "shop-waypoint"),
            ("CA_ADDR", "istiod.istio-system.svc:15012"),
            ("PROXY_CONFIG", "{}\n"),
            ("ISTIO_META_CLUSTER_ID", "Kubernetes"),
            ("ISTIO_META_NETWORK", "network-1"),
            ("TRUST_DOMAIN", "cluster.local"),
        ]))
        .unwrap();
        assert_eq!(c.gateway, "shop-waypoint");
        assert_eq!(c.gateway_class, "istio-waypoint");
        assert_eq!(c.cluster_id, "Kubernetes");
        assert_eq!(c.network, "network-1");
        match (&c.mesh, &c.ca) {
            (MeshSource::Xds(x), CaSource::Remote(ca)) => {
                assert_eq!(x.channel.address, "https://istiod.istio-system.svc:15012");
                assert_eq!(x.channel.server_identity, None, "istiod is checked by name");
                assert_eq!(ca.address, "https://istiod.istio-system.svc:15012");
            }
            other => panic!("{other:?}"),
        }
        assert!(
            matches!(&c.l7, L7Source::Control(x) if x.channel.address == DEFAULT_CONTROL_ADDRESS)
        );
        // A labels file that is not the kubelet's is refused by path and line.
        std::fs::write(dir.path().join("labels"), "gateway-name: x\n").unwrap();
        let e = Config::from_env(&vars(&[("AMBIT_POD_INFO_DIR", &info)]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("labels: line 1: expected key="), "{e}");
    }

    #[test]
    fn errors_name_the_variable() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (&[("POD_NAMESPACE", "")], "POD_NAMESPACE"),
            (&[("SERVICE_ACCOUNT", "")], "SERVICE_ACCOUNT"),
            (&[("LOCAL_XDS_PATH", "")], "XDS_ADDRESS"),
            (&[("AMBIT_ADMIN_ADDR", "0.0.0.0:15000")], "AMBIT_ADMIN_ADDR"),
            (
                &[("AMBIT_PATH_NORMALIZATION", "SOME")],
                "AMBIT_PATH_NORMALIZATION",
            ),
            (
                &[("TERMINATION_GRACE_PERIOD_SECONDS", "soon")],
                "TERMINATION_GRACE_PERIOD_SECONDS",
            ),
            (&[("TRUST_DOMAIN", "bad/domain")], "TRUST_DOMAIN"),
            (&[("AMBIT_UPGRADE_TYPES", "websocket,h2c")], "h2c"),
            (
                &[("AMBIT_UPGRADE_TYPES", "web socket")],
                "AMBIT_UPGRADE_TYPES",
            ),
            (
                &[("AMBIT_XFCC_INCLUDE_CLIENT_IDENTITY", "maybe")],
                "AMBIT_XFCC_INCLUDE_CLIENT_IDENTITY",
            ),
        ];
        for (pairs, var) in cases {
            let e = Config::from_env(&vars(pairs)).unwrap_err().to_string();
            assert!(e.contains(var), "{pairs:?}: {e}");
        }
    }

    /// A variable the waypoint reads whose value is not UTF-8 is refused by name: left out,
    /// an unreadable `AMBIT_WAYPOINT_CONFIG` would have started a waypoint with no policy.
    #[test]
    fn a_value_not_utf8_is_refused_by_name() {
        use std::ffi::OsString;
        use std::os::unix::ffi::OsStringExt;
        let mut pairs: Vec<(OsString, OsString)> = vars(&[])
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .collect();
        pairs.push((
            "AMBIT_WAYPOINT_CONFIG".into(),
            OsString::from_vec(b"/etc/ambit/\xffpolicies".to_vec()),
        ));
        let env = ProcessEnv::from_os(pairs.clone());
        let e = Config::from_process(&env).unwrap_err().to_string();
        assert!(
            e.starts_with("AMBIT_WAYPOINT_CONFIG=\"(not UTF-8)\" is not valid"),
            "{e}"
        );
        // A variable the waypoint does not read is none of its business.
        pairs.pop();
        pairs.push(("SOMETHING_ELSE".into(), OsString::from_vec(vec![0xff])));
        assert!(Config::from_process(&ProcessEnv::from_os(pairs)).is_ok());
    }

    #[test]
    fn xds_when_no_local_file() {
        let c = Config::from_env(&vars(&[
            ("LOCAL_XDS_PATH", ""),
            ("XDS_ADDRESS", "istiod.istio-system.svc:15012"),
        ]))
        .unwrap();
        match c.mesh {
            MeshSource::Xds(x) => {
                assert_eq!(x.channel.address, "https://istiod.istio-system.svc:15012")
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(c.ca, CaSource::Remote(_)));
    }
}
