//! `/config_dump`'s `config` section in ztunnel's shape: the same keys and value forms
//! (`{"secs", "nanos"}` durations, `{"Localhost": [ipv6, port]}` or `{"SocketAddr": …}`
//! addresses, `Shared`/`Dedicated`) for every setting ambit has. Keys for what ambit does
//! not have carry the value that says so (`caAddress: null`); ztunnel's DNS resolver
//! settings (hickory's) are left out. ambit's own settings come last, under names
//! ztunnel does not use (README: differences).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use serde_json::{json, Value};

use crate::config::{Config, LocalConfigSource, ProxyMode};
use ambit_nodeproxy::settings::OriginalSource;

/// The keys of ztunnel's `config` section that ambit leaves out: hickory-resolver's
/// settings, which ambit's forwarder (nameservers of resolv.conf) does not have.
pub const OMITTED_ZTUNNEL_KEYS: &[&str] = &["dnsResolverCfg", "dnsResolverOpts"];

/// The keys only ambit's `config` section has.
pub const AMBIT_KEYS: &[&str] = &["localCaDir", "localXdsConfig", "trustDomain"];

fn duration(d: Duration) -> Value {
    json!({"secs": d.as_secs(), "nanos": d.subsec_nanos()})
}

fn wildcard(ipv6: bool, port: u16) -> SocketAddr {
    if ipv6 {
        SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), port)
    } else {
        SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port)
    }
}

/// ztunnel's address forms: its own loopback pair on a port, or one socket address.
fn admin_like(addr: SocketAddr, ipv6: bool) -> Value {
    if addr.ip() == IpAddr::V4(Ipv4Addr::LOCALHOST) {
        json!({"Localhost": [ipv6, addr.port()]})
    } else {
        json!({"SocketAddr": addr.to_string()})
    }
}

pub fn config_section(cfg: &Config) -> Value {
    let p = &cfg.proxy;
    let v6 = p.ipv6_enabled;
    let mut illegal: Vec<u16> = p.listener_ports().to_vec();
    illegal.sort_unstable();
    let workload = cfg.workload.as_ref().map(
        |w| json!({"name": w.name, "namespace": w.namespace, "serviceAccount": w.service_account}),
    );
    let remote_ca = match &cfg.ca {
        crate::config::CaSource::Remote(r) => Some(r),
        _ => None,
    };
    let require_original_source = match p.original_source {
        OriginalSource::Auto => Value::Null,
        OriginalSource::Required => Value::Bool(true),
        OriginalSource::Off => Value::Bool(false),
    };
    let mut v = json!({
        "proxy": true,
        "dnsProxy": cfg.dns.is_some(),
        "windowSize": p.h2.stream_window,
        "connectionWindowSize": p.h2.connection_window,
        "frameSize": p.h2.frame_size,
        "poolMaxStreamsPerConn": p.pool.max_streams_per_connection,
        "poolUnusedReleaseTimeout": duration(p.pool.idle_timeout),
        "socks5Addr": null,
        "adminAddr": admin_like(cfg.admin_addr, v6),
        "statsAddr": admin_like(cfg.stats_addr, v6),
        "readinessAddr": admin_like(cfg.readiness_addr, v6),
        "inboundAddr": wildcard(v6, p.ports.inbound_hbone).to_string(),
        "inboundPlaintextAddr": wildcard(v6, p.ports.inbound_plaintext).to_string(),
        "outboundAddr": wildcard(v6, p.ports.outbound).to_string(),
        "dnsProxyAddr": match cfg.dns.as_ref().map(|d| d.listen).unwrap_or_default() {
            ambit_dns::ListenAddr::Localhost(port) => json!({"Localhost": [v6, port]}),
            ambit_dns::ListenAddr::Exact(a) => json!({"SocketAddr": a.to_string()}),
        },
        "illegalPorts": illegal,
        "network": p.network,
        "localNode": cfg.node_name,
        "proxyMode": match cfg.proxy_mode {
            ProxyMode::Shared => "Shared",
            ProxyMode::Dedicated => "Dedicated",
        },
        "proxyWorkloadInformation": workload,
        "clusterId": p.cluster_id,
        "clusterDomain": cfg.dns.as_ref().map_or("cluster.local", |d| d.cluster_domain.as_str()),
        "caAddress": remote_ca.map(|r| r.address.clone()),
        "caRootCert": "Static",
        "altCaHostname": remote_ca.and_then(|r| r.alt_hostname.clone()),
        "xdsAddress": cfg.xds_address,
        "xdsRootCert": "Static",
        "altXdsHostname": cfg.xds.as_ref().and_then(|x| x.channel.alt_hostname.clone()),
        "preferedServiceNamespace": cfg.dns.as_ref().and_then(|d| d.preferred_namespace.clone()),
        "secretTtl": duration(cfg.secret_ttl),
        "xdsOnDemand": cfg.on_demand.is_some(),
        "fakeCa": false,
        "fakeSelfInbound": false,
        "selfTerminationDeadline": duration(cfg.termination_deadline),
        "proxyMetadata": cfg.proxy_metadata,
        "numWorkerThreads": cfg.worker_threads,
        "requireOriginalSource": require_original_source,
        "proxyArgs": std::env::args().skip(1).collect::<Vec<_>>().join(" "),
        "inpodUds": cfg.inpod_uds,
        "inpodPortReuse": cfg.inpod_port_reuse,
        "packetMark": p.packet_mark,
        "socketConfig": {
            "keepaliveTime": duration(p.keepalive.time),
            "keepaliveInterval": duration(p.keepalive.interval),
            "keepaliveRetries": p.keepalive.retries,
            "keepaliveEnabled": p.keepalive.enabled,
            "userTimeoutEnabled": p.keepalive.user_timeout,
        },
        "xdsHeaders": [],
        "caHeaders": [],
        "localhostAppTunnel": p.localhost_app_tunnel,
        "ztunnelIdentity": null,
        "ztunnelWorkload": null,
        "ipv6Enabled": v6,
        "crlPath": null,
        "enableEnhancedBaggage": p.response_baggage,
    });
    if let Value::Object(m) = &mut v {
        // ambit's additions.
        let local_ca_dir = match &cfg.ca {
            crate::config::CaSource::LocalDir(dir) => Some(dir),
            _ => None,
        };
        m.insert("localCaDir".into(), json!(local_ca_dir));
        m.insert(
            "localXdsConfig".into(),
            match &cfg.local_config {
                Some(LocalConfigSource::File(path)) => json!({"file": path}),
                Some(LocalConfigSource::Inline(_)) => json!("inline"),
                None => Value::Null,
            },
        );
        m.insert("trustDomain".into(), json!(cfg.trust_domain));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn config(vars: &[(&str, &str)]) -> Config {
        let mut env: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        env.entry("LOCAL_XDS".into()).or_default();
        Config::from_env(&env).unwrap()
    }

    #[test]
    fn defaults_in_ztunnels_forms() {
        let c = config(&[
            ("PROXY_MODE", "dedicated"),
            ("PROXY_WORKLOAD_INFO", "default/client/client-sa"),
            ("NODE_NAME", "node1"),
            ("ISTIO_META_DNS_CAPTURE", "false"),
        ]);
        let v = config_section(&c);
        assert_eq!(v["adminAddr"], json!({"Localhost": [true, 15000]}));
        assert_eq!(v["statsAddr"], json!({"SocketAddr": "[::]:15020"}));
        assert_eq!(v["inboundAddr"], "[::]:15008");
        assert_eq!(v["illegalPorts"], json!([15001, 15006, 15008]));
        assert_eq!(v["proxyMode"], "Dedicated");
        assert_eq!(
            v["proxyWorkloadInformation"],
            json!({"name": "client", "namespace": "default", "serviceAccount": "client-sa"})
        );
        assert_eq!(v["secretTtl"], json!({"secs": 86400, "nanos": 0}));
        assert_eq!(
            v["poolUnusedReleaseTimeout"],
            json!({"secs": 300, "nanos": 0})
        );
        assert_eq!(v["selfTerminationDeadline"], json!({"secs": 5, "nanos": 0}));
        assert_eq!(v["requireOriginalSource"], Value::Null);
        assert_eq!(v["packetMark"], Value::Null);
        assert_eq!(
            v["socketConfig"]["keepaliveTime"],
            json!({"secs": 180, "nanos": 0})
        );
        assert_eq!(v["windowSize"], 4194304);
        assert_eq!(v["localNode"], "node1");
        assert_eq!(v["dnsProxy"], false, "DNS_CAPTURE=false");
        let on = config_section(&config(&[
            ("NODE_NAME", "node1"),
            ("ISTIO_META_DNS_PROXY_ADDR", "10.0.0.5:53"),
            ("CLUSTER_DOMAIN", "corp.example"),
        ]));
        assert_eq!(on["dnsProxy"], true);
        assert_eq!(on["dnsProxyAddr"], json!({"SocketAddr": "10.0.0.5:53"}));
        assert_eq!(on["clusterDomain"], "corp.example");
        assert_eq!(v["proxyMetadata"], json!({"DNS_CAPTURE": "false"}));
        for key in OMITTED_ZTUNNEL_KEYS {
            assert!(v.get(key).is_none(), "{key}");
        }
        for key in AMBIT_KEYS {
            assert!(v.get(key).is_some(), "{key}");
        }
    }

    #[test]
    fn shared_mode_without_ipv6() {
        let c = config(&[
            ("IPV6_ENABLED", "false"),
            ("NODE_NAME", "n"),
            ("ENABLE_ORIG_SRC", "true"),
        ]);
        let v = config_section(&c);
        assert_eq!(v["proxyMode"], "Shared");
        assert_eq!(v["proxyWorkloadInformation"], Value::Null);
        assert_eq!(v["inboundAddr"], "0.0.0.0:15008");
        assert_eq!(v["adminAddr"], json!({"Localhost": [false, 15000]}));
        assert_eq!(v["readinessAddr"], json!({"SocketAddr": "0.0.0.0:15021"}));
        assert_eq!(v["packetMark"], 1337);
        assert_eq!(v["requireOriginalSource"], true);
    }

    #[test]
    fn on_demand_is_ztunnels_flag() {
        for (on, want) in [("false", false), ("true", true)] {
            let c = config(&[
                ("XDS_ON_DEMAND", on),
                ("NODE_NAME", "n"),
                ("XDS_ADDRESS", "https://istiod.istio-system.svc:15012"),
                ("ISTIO_META_DNS_CAPTURE", "false"),
            ]);
            assert_eq!(
                config_section(&c)["xdsOnDemand"],
                want,
                "XDS_ON_DEMAND={on}"
            );
        }
    }
}
