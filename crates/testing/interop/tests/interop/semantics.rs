//! Mesh semantics side by side: the same services and policies, once with two ambit
//! proxies and once with two Istio proxies. What the client app sees and what both
//! reporters count must be the same for a VIP with target-port translation, a known
//! service without endpoints (no healthy upstream), a DENY of the client on one port and
//! the ALLOW that admits it on another.

use std::io::{Read, Write};
use std::net::{Ipv6Addr, Shutdown, SocketAddr, SocketAddrV6, TcpListener};
use std::time::Duration;

use ambit_interop::compare::{family, json_diff, parse_prometheus};
use ambit_interop::{both, NodeProxy};
use ambit_netns_lab::mesh::{metric_sum, serve_echo, EchoMode, TwoNodes, TwoNodesSpec, SERVER_IP};
use ambit_netns_lab::{wait_until, Lab};
use serde_json::Value;

use crate::differential::{documented, MESH};

/// The port the DENY covers; the app listens there too, so only policy keeps it out.
const DENIED_PORT: u16 = 8081;
const EMPTY_VIP: [u8; 4] = [10, 96, 0, 13];

fn extra_yaml() -> String {
    format!(
        r#"- name: empty
  namespace: default
  hostname: empty.default.svc.cluster.local
  vips: ["/10.96.0.13"]
  ports:
    80: 8080
policies:
- name: deny-client-{DENIED_PORT}
  namespace: default
  scope: Namespace
  action: Deny
  dryRun: false
  rules:
  - - - principals: [!Exact "cluster.local/ns/default/sa/client"]
        destinationPorts: [{DENIED_PORT}]
- name: allow-default
  namespace: default
  scope: Namespace
  action: Allow
  dryRun: false
  rules:
  - - - namespaces: [!Exact "default"]
"#
    )
}

struct Observed {
    /// What the client app got back from each exchange, in order.
    answers: Vec<Vec<u8>>,
    client_metrics: String,
    server_metrics: String,
    client_log: String,
}

fn exchange(nodes: &TwoNodes, dst: SocketAddr) -> Vec<u8> {
    let mut conn = nodes.connect_from_client(dst).unwrap();
    let _ = conn.write_all(b"hello world");
    let _ = conn.shutdown(Shutdown::Write);
    let mut back = Vec::new();
    // A refused connection may end in a reset: what matters is that nothing came back.
    let _ = conn.read_to_end(&mut back);
    back
}

fn observe(proxy: &NodeProxy) -> Observed {
    let tag = format!("io-sem-{}", proxy.label());
    let mesh = format!("{MESH}{}", extra_yaml());
    let nodes = TwoNodes::launch(TwoNodesSpec {
        env: &[("ENABLE_ORIG_SRC", "false".to_string())],
        mesh: Some(&mesh),
        ..TwoNodesSpec::pair(&tag, proxy)
    })
    .unwrap();
    let _app = nodes.start_app_server(EchoMode::Double).unwrap();
    let denied_app = Lab::in_netns(&nodes.server_ns, || {
        TcpListener::bind(SocketAddrV6::new(Ipv6Addr::UNSPECIFIED, DENIED_PORT, 0, 0))
    })
    .unwrap();
    let seen_denied = serve_echo(denied_app, EchoMode::Double);
    let answers = vec![
        exchange(&nodes, SocketAddr::from(([10, 96, 0, 10], 80))),
        exchange(&nodes, SocketAddr::from((EMPTY_VIP, 80))),
        exchange(&nodes, SocketAddr::from((SERVER_IP, DENIED_PORT))),
    ];
    assert!(
        seen_denied.try_recv().is_err(),
        "{tag}: the app behind the DENY saw a connection"
    );
    wait_until(
        "the server to count the VIP close and the denial",
        Duration::from_secs(10),
        || {
            nodes.metrics(&nodes.server_ns).is_ok_and(|m| {
                metric_sum(
                    &m,
                    "istio_tcp_connections_closed_total",
                    &[("reporter", "destination")],
                ) >= 2
            })
        },
    )
    .unwrap();
    wait_until(
        "the client to count its closes",
        Duration::from_secs(10),
        || {
            nodes.metrics(&nodes.client_ns).is_ok_and(|m| {
                metric_sum(
                    &m,
                    "istio_tcp_connections_closed_total",
                    &[("reporter", "source")],
                ) >= 2
            })
        },
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    Observed {
        answers,
        client_metrics: nodes.metrics(&nodes.client_ns).unwrap(),
        server_metrics: nodes.metrics(&nodes.server_ns).unwrap(),
        client_log: std::fs::read_to_string(&nodes.client_proxy.log).unwrap(),
    }
}

const FAMILIES: &[&str] = &[
    "istio_tcp_connections_opened_total",
    "istio_tcp_connections_closed_total",
    "istio_tcp_connections_failed_total",
    "istio_tcp_received_bytes_total",
    "istio_tcp_sent_bytes_total",
];

/// The documented inbound difference (ambit names the service of IP-addressed traffic
/// with a local config; Istio's ztunnel reports none) taken out of ambit's rows; rows
/// that then carry the same labels are summed, as one series would be.
fn without_inbound_service(rows: &mut Value) {
    let mut merged: std::collections::BTreeMap<String, (Value, f64)> = Default::default();
    for mut row in rows.as_array().cloned().unwrap_or_default() {
        if row["reporter"] == "destination"
            && row["destination_service"] == documented::INBOUND_SERVICE
        {
            for k in [
                "destination_service",
                "destination_service_name",
                "destination_service_namespace",
            ] {
                row[k] = "unknown".into();
            }
        }
        let value = row["value"].as_f64().unwrap_or(0.0);
        row["value"] = Value::Null;
        let entry = merged.entry(row.to_string()).or_insert((row, 0.0));
        entry.1 += value;
    }
    let mut out: Vec<Value> = merged
        .into_values()
        .map(|(mut row, value)| {
            row["value"] = serde_json::json!(value);
            row
        })
        .collect();
    out.sort_by_key(|r| r.to_string());
    *rows = Value::Array(out);
}

#[test]
fn vip_no_healthy_upstream_and_policies_give_the_same_outcomes_and_metrics() {
    let [ambit, istio] = both().unwrap();
    let a = observe(&ambit);
    let i = observe(&istio);
    assert_eq!(a.answers[0], b"hello worldhello world", "ambit: the VIP");
    for (what, n) in [("no healthy upstream", 1), ("DENY", 2)] {
        assert!(a.answers[n].is_empty(), "ambit, {what}: {:?}", a.answers[n]);
    }
    assert_eq!(a.answers, i.answers, "what the client app saw");
    // No healthy upstream: refused before any connection is counted, with the same
    // access log line (fields and level; the error text is each proxy's own).
    for (who, log) in [("ambit", &a.client_log), ("Istio", &i.client_log)] {
        let lines: Vec<_> = ambit_interop::compare::access_lines(log)
            .into_iter()
            .filter(|l| l.field("dst.addr") == Some("10.96.0.13:80"))
            .collect();
        assert_eq!(lines.len(), 1, "{who}:\n{log}");
        let l = &lines[0];
        assert_eq!(
            (l.level.as_str(), l.message.as_str()),
            ("warn", "connection failed"),
            "{who}: {l:?}"
        );
        assert_eq!(
            l.names(),
            ["src.addr", "dst.addr", "direction", "error"],
            "{who}: {l:?}"
        );
        assert!(
            l.field("error")
                .is_some_and(|e| e.contains("no healthy upstream")),
            "{who}: {l:?}"
        );
    }
    // Both denied at the server and counted with the DENY flag.
    for (who, text) in [("ambit", &a.server_metrics), ("Istio", &i.server_metrics)] {
        assert_eq!(
            metric_sum(
                text,
                "istio_tcp_connections_failed_total",
                &[("reporter", "destination"), ("response_flags", "DENY")]
            ),
            1,
            "{who}:\n{text}"
        );
    }
    let mut differences = Vec::new();
    for (side, am, im) in [
        ("client", &a.client_metrics, &i.client_metrics),
        ("server", &a.server_metrics, &i.server_metrics),
    ] {
        let (sa, si) = (parse_prometheus(am).unwrap(), parse_prometheus(im).unwrap());
        for name in FAMILIES {
            let mut fa = family(&sa, name);
            if side == "server" {
                without_inbound_service(&mut fa);
            }
            let d = json_diff(&fa, &family(&si, name));
            if !d.is_empty() {
                let d: Vec<String> = d.iter().map(|d| format!("    {d}")).collect();
                differences.push(format!("  {side} {name}:\n{}", d.join("\n")));
            }
        }
    }
    assert!(differences.is_empty(), "\n{}", differences.join("\n"));
}
