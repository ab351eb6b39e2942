//! The same scenario run once with two ambit proxies and once with two Istio proxies, and
//! what each shows compared field by field.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::time::Duration;

use ambit_netns_lab::mesh::{
    metric_sum, EchoMode, TwoNodes, TwoNodesSpec, APP_PORT, SERVER_IP, SERVICE_PORT, SERVICE_VIP,
};
use ambit_netns_lab::{http_get, wait_until, Lab};
use std::collections::BTreeSet;

use ambit_interop::compare::{
    family, json_diff, mask_port, parse_prometheus, shape, Difference, LogLine,
};
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
        env: &[("ENABLE_ORIG_SRC", "false".to_string())],
        extra_yaml: POLICIES,
        mesh: Some(MESH),
        ..TwoNodesSpec::pair(&tag, proxy)
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
    use serde_json::{json, Value};

    /// ztunnel's `config` keys ambit has no counterpart for (no DNS proxy yet).
    pub const ISTIO_ONLY_CONFIG_KEYS: &[&str] = &["dnsResolverCfg", "dnsResolverOpts"];
    /// ambit's own `config` keys.
    pub const AMBIT_ONLY_CONFIG_KEYS: &[&str] = &["localCaDir", "localXdsConfig", "trustDomain"];

    /// `config` values that differ for the same environment, as (key, ambit's, Istio's).
    pub fn config_values() -> Vec<(&'static str, Value, Value)> {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let quarter = cpus.div_ceil(4);
        vec![
            // A quarter of the CPUs, at least one; ztunnel keeps at least two.
            (
                "numWorkerThreads",
                json!(quarter.max(1)),
                json!(quarter.max(2)),
            ),
            // ambit mints from LOCAL_CA_DIR; the lab runs Istio's ztunnel with its fake CA.
            ("fakeCa", json!(false), json!(true)),
            // The command lines the lab starts them with.
            ("proxyArgs", json!("ztunnel"), json!("proxy ztunnel")),
        ]
    }

    /// On the inbound side of IP-addressed traffic, ambit names the service the client
    /// meant (from `forwarded: host=` or the target port), as ztunnel does with xDS; with a
    /// local config ztunnel's workloads do not list their services and it reports none.
    pub const INBOUND_SERVICE: &str = "echo.default.svc.cluster.local";

    /// In dedicated mode the stats and readiness ports share the workload's addresses:
    /// ambit's loop guard refuses tunnelled traffic to them (503), ztunnel forwards it to
    /// its own operator endpoints (200).
    pub const GUARDED_OPERATOR_PORTS: &[u16] = &[15020, 15021];

    /// Metric families only ambit exposes (its own limits).
    pub const AMBIT_ONLY_FAMILY_PREFIX: &str = "ambit_";
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
    let without = |v: &Value, drop: &[&str]| -> BTreeSet<String> {
        keys(v)
            .into_iter()
            .filter(|k| !drop.contains(&k.as_str()))
            .collect()
    };
    let a = without(ambit, documented::AMBIT_ONLY_CONFIG_KEYS);
    let i = without(istio, documented::ISTIO_ONLY_CONFIG_KEYS);
    assert_eq!(a, i, "config keys differ");
    for key in documented::AMBIT_ONLY_CONFIG_KEYS {
        assert!(
            ambit.get(key).is_some() && istio.get(key).is_none(),
            "config.{key}"
        );
    }
    for key in documented::ISTIO_ONLY_CONFIG_KEYS {
        assert!(
            istio.get(key).is_some() && ambit.get(key).is_none(),
            "config.{key}"
        );
    }
    let documented = documented::config_values();
    for k in &a {
        if let Some((_, want_a, want_i)) = documented.iter().find(|(d, _, _)| d == k) {
            assert_eq!(
                (&ambit[k], &istio[k]),
                (want_a, want_i),
                "config.{k}: the documented difference"
            );
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
        match k.as_str() {
            "src.addr" => *v = mask_port(v),
            "duration" => *v = "*".into(),
            _ => {}
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
        // Every family either exposes, with the same HELP and TYPE, but for ambit's own.
        let ours = |h: &String| {
            h.strip_prefix("# HELP ")
                .or_else(|| h.strip_prefix("# TYPE "))
                .is_some_and(|rest| rest.starts_with(documented::AMBIT_ONLY_FAMILY_PREFIX))
        };
        let mut ha = headers(am);
        let only_ambit: Vec<String> = ha.iter().filter(|h| ours(h)).cloned().collect();
        ha.retain(|h| !ours(h));
        // ambit's own families, each documented in the README ("Metrics of ambit's own"):
        // the handshake sheds always, the certificate families once a certificate exists.
        let families: std::collections::BTreeSet<&str> = only_ambit
            .iter()
            .filter_map(|h| h.split(' ').nth(2))
            .collect();
        let documented_families = [
            "ambit_hbone_handshakes_shed",
            "ambit_certificate_expiration_timestamp_seconds",
            "ambit_certificate_fetch_failures",
        ];
        assert!(
            families.contains("ambit_hbone_handshakes_shed")
                && families.iter().all(|f| documented_families.contains(f)),
            "{side}: ambit's own families: {only_ambit:?}"
        );
        assert!(
            only_ambit.contains(&"# TYPE ambit_hbone_handshakes_shed counter".to_string()),
            "{side}: {only_ambit:?}"
        );
        assert_eq!(
            ha,
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

/// One exchange through a dedicated-mode pair with `ENABLE_ORIG_SRC` unset: what the app
/// saw (None: no connection reached it) and whether the client got its answer.
fn orig_src_unset(proxy: &NodeProxy) -> (Option<std::net::IpAddr>, bool) {
    let tag = format!("io-origsrc-{}", proxy.label());
    let nodes = TwoNodes::launch(TwoNodesSpec {
        orig_src_unset: true,
        ..TwoNodesSpec::pair(&tag, proxy)
    })
    .unwrap();
    let accepted = nodes.start_app_server(EchoMode::Mirror).unwrap();
    let mut conn = nodes
        .connect_from_client(SocketAddr::from((SERVER_IP, APP_PORT)))
        .unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let _ = conn.write_all(b"hello");
    let _ = conn.shutdown(Shutdown::Write);
    let mut back = Vec::new();
    let _ = conn.read_to_end(&mut back);
    let peer = accepted
        .recv_timeout(Duration::from_secs(1))
        .ok()
        .map(|a| a.ip().to_canonical());
    (peer, back == b"hello")
}

#[test]
fn dedicated_mode_without_enable_orig_src_as_documented() {
    let [ambit, istio] = both().unwrap();
    // ambit connects to the app from its own address, and the exchange works.
    let (peer, answered) = orig_src_unset(&ambit);
    assert!(answered, "ambit's exchange failed");
    assert_eq!(
        peer,
        Some(std::net::IpAddr::from(SERVER_IP)),
        "ambit's source towards the app"
    );
    // Istio's ztunnel binds the client's address, the app's replies leave the node, the
    // app never sees the connection, and the client gets no answer.
    let (peer, answered) = orig_src_unset(&istio);
    assert!(
        !answered,
        "Istio's ztunnel answered: the documented difference is gone"
    );
    assert_eq!(
        peer, None,
        "the app saw a connection through Istio's ztunnel"
    );
}

/// A workload as both read it, the start of the local configs below.
const WORKLOAD: &str = r#"workloads:
- uid: cluster1//v1/Pod/default/w
  name: w
  namespace: default
  serviceAccount: w
  workloadIps: ["10.1.0.5"]
  node: node1
"#;

/// Local configs only ambit reads, each with what ztunnel says of it: no `services` on a
/// workload; no `dryRun` on a policy; a string match written as a map.
fn lenient() -> Vec<(String, &'static str)> {
    let policy = |dry_run: &str, principal: &str| {
        format!("policies:\n- name: p\n  namespace: default\n  scope: Namespace\n  action: Allow\n{dry_run}  rules:\n  - - - principals: [{principal}]\n")
    };
    let services = "  services: {}\n";
    vec![
        (WORKLOAD.to_string(), "missing field `services`"),
        (
            format!(
                "{WORKLOAD}{services}{}",
                policy("", "!Exact \"cluster.local/ns/default/sa/w\"")
            ),
            "missing field `dryRun`",
        ),
        (
            format!(
                "{WORKLOAD}{services}{}",
                policy(
                    "  dryRun: false\n",
                    "{exact: \"cluster.local/ns/default/sa/w\"}"
                )
            ),
            "principals",
        ),
    ]
}

/// Valid for both: a workload without a uid.
const NO_UID: &str = r#"workloads:
- name: w
  namespace: default
  serviceAccount: w
  workloadIps: ["10.1.0.5"]
  node: node1
  services: {}
"#;

#[test]
fn local_configs_as_documented() {
    let [ambit, istio] = both().unwrap();
    // What ztunnel refuses, ambit loads.
    for (n, (yaml, istio_says)) in lenient().into_iter().enumerate() {
        let a = Single::start(
            &ambit,
            &format!("io-lenient-a{n}"),
            &yaml,
            "default/w/w",
            &[],
        )
        .config_dump();
        assert_eq!(a["workloads"][0]["name"], "w", "{yaml}");
        let lab = Lab::new(&format!("io-lenient-i{n}")).unwrap();
        let ns = lab.netns("node").unwrap();
        let config = lab.dir.path().join("mesh.yaml");
        std::fs::write(&config, &yaml).unwrap();
        let mut env = istio.env(&config, &lab.dir.path().join("ca"));
        env.extend([
            ("PROXY_MODE", "dedicated".to_string()),
            ("PROXY_WORKLOAD_INFO", "default/w/w".to_string()),
        ]);
        let (program, args) = istio.command();
        let p = lab.spawn(&ns, "istio", program, args, &env).unwrap();
        let status = lab.wait_exit(p.pid, Duration::from_secs(10)).unwrap();
        let log = std::fs::read_to_string(&p.log).unwrap();
        let refusal = log
            .lines()
            .find(|l| l.starts_with("Error: "))
            .unwrap_or_default();
        assert!(
            !status.success() && refusal.contains(istio_says),
            "Istio's ztunnel on\n{yaml}\nexpected a refusal naming {istio_says:?}; its log:\n{log}"
        );
    }
    // A workload without a uid: ambit makes one, ztunnel leaves it out.
    let a = Single::start(&ambit, "io-nouid-a", NO_UID, "default/w/w", &[]).config_dump();
    let i = Single::start(&istio, "io-nouid-i", NO_UID, "default/w/w", &[]).config_dump();
    assert_eq!(a["workloads"][0]["uid"], "Kubernetes//v1/Pod/default/w");
    assert!(
        i["workloads"][0].get("uid").is_none(),
        "{}",
        i["workloads"][0]
    );
    let mut x = a["workloads"][0].clone();
    x.as_object_mut().unwrap().remove("uid");
    let d = json_diff(&x, &i["workloads"][0]);
    assert!(d.is_empty(), "but for the uid:\n{}", lines(&d));
}
