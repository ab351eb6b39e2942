//! Waypoints across implementations: the lab's test waypoint between a client node and a
//! server node (`ambit_netns_lab::waypoint::observe_waypoint`), with ambit or Istio's ztunnel
//! as the client's node proxy (same authority, identity and accepted waypoint SAN at the
//! waypoint; same client-side metric labels), and with Istio's ztunnel as the server's
//! node proxy (it accepts what the test waypoint sends, and refuses the misdirected
//! request with 400 as ambit does).

use ambit_interop::both;
use ambit_interop::compare::{family, json_diff, parse_prometheus};
use ambit_netns_lab::mesh::SERVICE_HOST;
use ambit_netns_lab::waypoint::{observe_waypoint, ConnectRecord, WaypointObserved, WAYPOINT_ID};
use serde_json::Value;

/// A record without what differs by nature (the client's port, header values such as
/// trace ids): authority, identity, header names, onward outcome.
fn essence(r: &ConnectRecord) -> String {
    let mut names: Vec<&str> = r.headers.iter().map(|(k, _)| k.as_str()).collect();
    names.sort();
    format!(
        "authority={} peer={:?} headers={names:?} onward={}",
        r.authority,
        r.peer_identity,
        match &r.onward {
            Ok(()) => "ok".to_string(),
            Err(e) if e.contains("400") => "400".to_string(),
            Err(e) => format!("error {e}"),
        }
    )
}

/// The source reporter's TCP families, labels and values.
fn client_side(o: &WaypointObserved) -> Vec<(&'static str, Value)> {
    let samples = parse_prometheus(&o.client_metrics).unwrap();
    [
        "istio_tcp_connections_opened_total",
        "istio_tcp_connections_closed_total",
    ]
    .into_iter()
    .map(|name| (name, family(&samples, name)))
    .collect()
}

#[test]
fn waypoint_traffic_looks_the_same_from_both_client_proxies() {
    let [ambit, istio] = both().unwrap();
    let a = observe_waypoint("io-wp-aa", &ambit, &ambit).unwrap();
    let i = observe_waypoint("io-wp-ia", &istio, &ambit).unwrap();
    assert_eq!(a.echo, b"through the waypoint");
    assert_eq!(i.echo, b"through the waypoint");
    let ea: Vec<String> = a.records.iter().map(essence).collect();
    let ei: Vec<String> = i.records.iter().map(essence).collect();
    assert_eq!(ea, ei, "what the waypoint saw: ambit (left), Istio (right)");
    assert!(
        ea[0].starts_with(
            "authority=10.96.0.10:80 peer=Some(\"spiffe://cluster.local/ns/default/sa/client\")"
        ),
        "{ea:?}"
    );
    assert!(
        ea[0].ends_with("onward=ok") && ea[1].ends_with("onward=400"),
        "{ea:?}"
    );
    let mut diffs = Vec::new();
    for ((name, fa), (_, fi)) in client_side(&a).into_iter().zip(client_side(&i)) {
        // Istio's ztunnel counts the connection to the waypoint's workload, for the
        // original service: the comparison is of something.
        let rows = fi.as_array().cloned().unwrap_or_default();
        assert!(
            rows.iter().any(|r| r["destination_workload"] == "waypoint"
                && r["destination_service"] == SERVICE_HOST
                && r["destination_principal"] == WAYPOINT_ID),
            "{name} from Istio's ztunnel: {fi}"
        );
        for d in json_diff(&fa, &fi) {
            diffs.push(format!("{name}: {d:?}"));
        }
    }
    assert!(
        diffs.is_empty(),
        "client-side metrics, ambit vs Istio:\n{}",
        diffs.join("\n")
    );
    // The access logs name the same destination: the waypoint's workload and identity,
    // the original service, the VIP as the HBONE address.
    let dst = |log: &str| -> Vec<Vec<(String, String)>> {
        ambit_interop::compare::access_lines(log)
            .into_iter()
            .map(|l| {
                l.fields
                    .into_iter()
                    .filter(|(k, _)| k.starts_with("dst.") || k == "src.identity")
                    .collect()
            })
            .collect()
    };
    let (da, di) = (dst(&a.client_log), dst(&i.client_log));
    assert_eq!(da.len(), 2, "two access lines expected:\n{}", a.client_log);
    assert_eq!(
        da, di,
        "client access logs' destinations: ambit (left), Istio (right)"
    );
}

#[test]
fn istio_ztunnel_accepts_what_the_test_waypoint_sends() {
    let [ambit, istio] = both().unwrap();
    let seen = observe_waypoint("io-wp-ai", &ambit, &istio).unwrap();
    assert_eq!(seen.echo, b"through the waypoint");
    assert_eq!(seen.records.len(), 2, "{:?}", seen.records);
    assert_eq!(seen.records[0].onward, Ok(()));
    let refused = seen.records[1].onward.clone().unwrap_err();
    assert!(refused.contains("400"), "{refused}");
}

/// The PROXY v2 header both servers write to a PROXY application tunnel, byte for byte
/// but for the client's port.
#[test]
fn both_servers_write_the_same_proxy_header() {
    let [ambit, istio] = both().unwrap();
    let mask = |mut b: Vec<u8>| {
        // IPv4: signature 12, version/family/length 4, addresses 8, then the source port.
        if b.len() >= 26 {
            b[24] = 0;
            b[25] = 0;
        }
        b
    };
    let a = mask(
        ambit_netns_lab::waypoint::observe_app_tunnel("io-at-a", &ambit, &ambit, b"payload")
            .unwrap(),
    );
    let i = mask(
        ambit_netns_lab::waypoint::observe_app_tunnel("io-at-i", &ambit, &istio, b"payload")
            .unwrap(),
    );
    assert_eq!(a, i, "ambit (left), Istio (right)");
}
