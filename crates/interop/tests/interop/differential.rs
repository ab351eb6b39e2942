//! The same scenario run once with two ambit proxies and once with two Istio proxies, and
//! what each shows compared field by field.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::time::Duration;

use ambit::lab::mesh::{
    metric_sum, EchoMode, TwoNodes, TwoNodesSpec, APP_PORT, SERVER_IP, SERVICE_PORT, SERVICE_VIP,
};
use ambit::lab::{http_get, wait_until};
use std::collections::BTreeSet;

use ambit_interop::compare::{family, json_diff, parse_prometheus, shape, Difference, LogLine};
use ambit_interop::{both, NodeProxy};
use serde_json::Value;

use crate::single::Single;

pub const POLICIES: &str = r#"policies:
- name: deny-nobody
  namespace: default
  scope: Namespace
  action: Deny
  dryRun: false
  rules:
  - - - principals: [!Exact "cluster.local/ns/default/sa/nobody"]
- name: allow-client
  namespace: default
  scope: Global
  action: Allow
  dryRun: false
  rules:
  - - - namespaces: [!Exact "default"]
        notDestinationPorts: [9999]
"#;

/// The lab's two workloads and service, with every field telemetry reads set: workload
/// names and types, cluster ids, localities.
pub const MESH: &str = r#"workloads:
- uid: cluster1//v1/Pod/default/client
  name: client
  namespace: default
  serviceAccount: client
  trustDomain: cluster.local
  workloadIps: ["10.78.0.1", "fd00:78::1"]
  protocol: HBONE
  node: node1
  clusterId: cluster1
  canonicalName: client
  canonicalRevision: v1
  workloadName: client-app
  workloadType: deployment
  locality: {region: eu-west, zone: eu-west-1a, subzone: ""}
  services: {}
- uid: cluster1//v1/Pod/default/server
  name: server
  namespace: default
  serviceAccount: server
  trustDomain: cluster.local
  workloadIps: ["10.78.0.2", "fd00:78::2"]
  protocol: HBONE
  node: node2
  clusterId: cluster1
  canonicalName: server
  canonicalRevision: v2
  workloadName: server-app
  workloadType: pod
  locality: {region: eu-west, zone: eu-west-1b, subzone: ""}
  services:
    default/echo.default.svc.cluster.local:
      80: 8080
services:
- name: echo
  namespace: default
  hostname: echo.default.svc.cluster.local
  vips: ["/10.96.0.10"]
  ports:
    80: 8080
"#;

/// What one pair of proxies showed for the fixed exchanges.
pub struct Observed {
    pub client_dump: serde_json::Value,
    pub server_dump: serde_json::Value,
    pub client_metrics: String,
    pub server_metrics: String,
    pub client_log: String,
    pub server_log: String,
}

/// Two exchanges through the pair: 11 bytes to the pod (22 back), then 11 bytes to the
/// service VIP; waits until both reporters counted both closes.
pub fn observe(proxy: &NodeProxy) -> Observed {
    let tag = format!("io-diff-{}", proxy.label());
    let nodes = TwoNodes::launch(TwoNodesSpec {
        tag: &tag,
        client: proxy.clone(),
        server: proxy.clone(),
        env: &[],
        extra_yaml: POLICIES,
        mesh: Some(MESH),
    })
    .unwrap();
    let _app = nodes.start_app_server(EchoMode::Double).unwrap();
    for dst in [
        SocketAddr::from((SERVER_IP, APP_PORT)),
        SocketAddr::from((SERVICE_VIP, SERVICE_PORT)),
    ] {
        let mut conn = nodes.connect_from_client(dst).unwrap();
        conn.write_all(b"hello world").unwrap();
        conn.shutdown(Shutdown::Write).unwrap();
        let mut back = Vec::new();
        conn.read_to_end(&mut back).unwrap();
        assert_eq!(back, b"hello worldhello world", "{tag}: through {dst}");
    }
    for ns in [&nodes.client_ns, &nodes.server_ns] {
        wait_until("both closes counted", Duration::from_secs(10), || {
            nodes
                .metrics(ns)
                .is_ok_and(|m| metric_sum(&m, "istio_tcp_connections_closed_total", &[]) >= 2)
        })
        .unwrap();
    }
    // Let the access logs reach the files.
    std::thread::sleep(Duration::from_millis(300));
    let dump = |ns: &str| {
        let (status, body) =
            http_get(ns, "127.0.0.1:15000".parse().unwrap(), "/config_dump").unwrap();
        assert_eq!(status, 200);
        serde_json::from_str(&body).unwrap()
    };
    Observed {
        client_dump: dump(&nodes.client_ns),
        server_dump: dump(&nodes.server_ns),
        client_metrics: nodes.metrics(&nodes.client_ns).unwrap(),
        server_metrics: nodes.metrics(&nodes.server_ns).unwrap(),
        client_log: std::fs::read_to_string(&nodes.client_proxy.log).unwrap(),
        server_log: std::fs::read_to_string(&nodes.server_proxy.log).unwrap(),
    }
}

/// Where ambit is different on purpose (the README's differences section says why), as
/// the checks below expect it.
pub mod documented {
    /// `config` keys whose values differ for the same environment.
    pub const CONFIG_VALUES: &[(&str, &str)] = &[
        (
            "numWorkerThreads",
            "ambit's default is a quarter of the CPUs, at least one; ztunnel keeps at least two",
        ),
        (
            "fakeCa",
            "ambit mints from LOCAL_CA_DIR; the lab runs Istio's ztunnel with its test CA",
        ),
        ("proxyArgs", "the command line each was started with"),
    ];

    /// On the inbound side of IP-addressed traffic, ambit names the service the client
    /// meant (from `forwarded: host=` or the target port), as ztunnel does with xDS; with a
    /// local config ztunnel's workloads do not list their services and it reports none.
    pub const INBOUND_SERVICE: &str = "echo.default.svc.cluster.local";
}

fn lines(d: &[Difference]) -> String {
    d.iter().map(|d| format!("  {d}\n")).collect()
}

fn keys(v: &Value) -> BTreeSet<String> {
    v.as_object()
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default()
}

/// The sections that must be equal, key for key and value for value.
const EXACT_SECTIONS: &[&str] = &[
    "workloads",
    "services",
    "policies",
    "stagedServices",
    "staticConfig",
];

/// `config`: the same keys (less what one side alone has) and the same values, but for the
/// documented differences.
fn check_config(ambit: &Value, istio: &Value) {
    let only_ambit: BTreeSet<String> = ambit::config_dump::AMBIT_KEYS
        .iter()
        .map(|k| k.to_string())
        .collect();
    let only_istio: BTreeSet<String> = ambit::config_dump::OMITTED_ZTUNNEL_KEYS
        .iter()
        .map(|k| k.to_string())
        .collect();
    let a: BTreeSet<String> = keys(ambit).difference(&only_ambit).cloned().collect();
    let i: BTreeSet<String> = keys(istio).difference(&only_istio).cloned().collect();
    assert_eq!(a, i, "config keys differ");
    for k in &a {
        if documented::CONFIG_VALUES.iter().any(|(d, _)| d == k) {
            continue;
        }
        let (mut x, mut y) = (ambit[k].clone(), istio[k].clone());
        // A set in ztunnel (printed in hash order).
        if k == "illegalPorts" {
            for v in [&mut x, &mut y] {
                if let Some(a) = v.as_array_mut() {
                    a.sort_by_key(|p| p.as_u64());
                }
            }
        }
        assert!(x == y, "config.{k}: ambit {x}, Istio {y}");
    }
}

#[test]
fn config_dump_of_a_rich_local_config_matches() {
    let [ambit, istio] = both().unwrap();
    let mesh = include_str!("rich_mesh.yaml");
    let a = Single::start(&ambit, "io-dump-a", mesh, "ns1/full/sa1", &[]).config_dump();
    let i = Single::start(&istio, "io-dump-i", mesh, "ns1/full/sa1", &[]).config_dump();
    assert_eq!(keys(&a), keys(&i), "top-level sections");
    for section in EXACT_SECTIONS {
        let d = json_diff(&a[section], &i[section]);
        assert!(d.is_empty(), "{section} differs:\n{}", lines(&d));
    }
    assert_eq!(keys(&a["version"]), keys(&i["version"]), "version keys");
    assert_eq!(
        a["certificates"],
        serde_json::json!([]),
        "no certificate before traffic"
    );
    assert_eq!(a["certificates"], i["certificates"]);
    check_config(&a["config"], &i["config"]);
}

/// Access log lines with what varies from run to run masked: the client's ports and the
/// durations.
fn normalized(mut l: LogLine) -> LogLine {
    for (k, v) in &mut l.fields {
        if k == "src.addr" {
            if let Some((ip, _)) = v.rsplit_once(':') {
                *v = format!("{ip}:*");
            }
        }
        if k == "duration" {
            *v = "*".into();
        }
    }
    l
}

/// The documented inbound difference taken out of ambit's side, after checking it is there.
fn without_inbound_service_label(rows: &mut Value) {
    for row in rows.as_array_mut().into_iter().flatten() {
        if row["reporter"] == "destination" {
            assert_eq!(
                row["destination_service"],
                documented::INBOUND_SERVICE,
                "{row}"
            );
            assert_eq!(row["destination_service_name"], "echo", "{row}");
            assert_eq!(row["destination_service_namespace"], "default", "{row}");
            for k in [
                "destination_service",
                "destination_service_name",
                "destination_service_namespace",
            ] {
                row[k] = "unknown".into();
            }
        }
    }
}

/// `# HELP` and `# TYPE` lines by family name.
fn headers(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| l.starts_with("# HELP ") || l.starts_with("# TYPE "))
        .map(str::to_string)
        .collect()
}

const TCP_FAMILIES: &[&str] = &[
    "istio_build",
    "istio_tcp_connections_opened_total",
    "istio_tcp_connections_closed_total",
    "istio_tcp_received_bytes_total",
    "istio_tcp_sent_bytes_total",
    "istio_tcp_connections_failed_total",
    "istio_tcp_sockets_open",
];

#[test]
fn metrics_access_logs_and_dumps_match_for_the_same_exchanges() {
    let [ambit, istio] = both().unwrap();
    let a = observe(&ambit);
    let i = observe(&istio);
    for (side, am, im) in [
        ("client", &a.client_metrics, &i.client_metrics),
        ("server", &a.server_metrics, &i.server_metrics),
    ] {
        let sa = parse_prometheus(am).unwrap();
        let si = parse_prometheus(im).unwrap();
        for name in TCP_FAMILIES {
            let mut fa = family(&sa, name);
            let fi = family(&si, name);
            if side == "server"
                && name.starts_with("istio_tcp_")
                && *name != "istio_tcp_sockets_open"
            {
                without_inbound_service_label(&mut fa);
            }
            let d = json_diff(&fa, &fi);
            assert!(d.is_empty(), "{side} {name}:\n{}", lines(&d));
        }
        // Every family either exposes, with the same HELP and TYPE.
        assert_eq!(
            headers(am),
            headers(im),
            "{side}: metric families, HELP or TYPE differ"
        );
    }
    for (side, ad, id) in [
        ("client", &a.client_dump, &i.client_dump),
        ("server", &a.server_dump, &i.server_dump),
    ] {
        for section in EXACT_SECTIONS {
            let d = json_diff(&ad[section], &id[section]);
            assert!(d.is_empty(), "{side} {section}:\n{}", lines(&d));
        }
        check_config(&ad["config"], &id["config"]);
        // One certificate per identity used, in the same shape and state; the values are
        // each CA's own.
        let d = json_diff(&shape(&ad["certificates"]), &shape(&id["certificates"]));
        assert!(d.is_empty(), "{side} certificates:\n{}", lines(&d));
        for (ca, ci) in ad["certificates"]
            .as_array()
            .unwrap()
            .iter()
            .zip(id["certificates"].as_array().unwrap())
        {
            assert_eq!(ca["identity"], ci["identity"]);
            assert_eq!(ca["state"], ci["state"]);
        }
    }
    for (side, al, il) in [
        ("client", &a.client_log, &i.client_log),
        ("server", &a.server_log, &i.server_log),
    ] {
        let la: Vec<LogLine> = ambit_interop::compare::access_lines(al)
            .into_iter()
            .map(normalized)
            .collect();
        let li: Vec<LogLine> = ambit_interop::compare::access_lines(il)
            .into_iter()
            .map(normalized)
            .collect();
        assert_eq!(la.len(), 2, "{side}: two access log lines expected:\n{al}");
        assert_eq!(la.len(), li.len(), "{side}: access log lines");
        for (mut x, y) in la.into_iter().zip(li) {
            if side == "server" {
                let quoted = format!("{:?}", documented::INBOUND_SERVICE);
                assert_eq!(x.field("dst.service"), Some(quoted.as_str()), "{x:?}");
                x.fields.retain(|(k, _)| k != "dst.service");
            }
            assert_eq!(x, y, "{side} access log");
        }
    }
}
