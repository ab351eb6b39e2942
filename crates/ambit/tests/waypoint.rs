//! Waypoints end to end, as root: two nodes (dedicated mode) and a test waypoint pod in
//! the server node (`ambit_lab::waypoint::observe_waypoint`). A client's connection to a
//! service with a waypoint goes to the waypoint first, with the service's VIP as the
//! authority and the client's identity; the waypoint's onward connection reaches the pod
//! with the waypoint's identity. A request a waypoint misdirects (an authority for an IP
//! the node does not serve, and whose waypoint it is not) is refused with 400.

use std::path::Path;

use ambit_lab::mesh::{metric_sum, SERVICE_HOST, SERVICE_PORT, SERVICE_VIP};
use ambit_lab::peer::NodeProxy;
use ambit_lab::waypoint::{observe_waypoint, WAYPOINT_ID};

fn ambit() -> NodeProxy {
    NodeProxy::Ambit(Path::new(env!("CARGO_BIN_EXE_ambit")).to_path_buf())
}

const CLIENT_ID: &str = "spiffe://cluster.local/ns/default/sa/client";
const SERVER_ID: &str = "spiffe://cluster.local/ns/default/sa/server";

#[test]
fn a_service_with_a_waypoint_is_reached_through_it() {
    let seen = observe_waypoint("e2e-waypoint", &ambit(), &ambit()).unwrap();
    assert_eq!(seen.echo, b"through the waypoint");
    assert_eq!(seen.records.len(), 2, "{:?}", seen.records);
    let r = &seen.records[0];
    assert_eq!(
        r.authority,
        format!("{SERVICE_VIP}:{SERVICE_PORT}"),
        "the original VIP:port, untranslated"
    );
    assert_eq!(r.peer_identity.as_deref(), Some(CLIENT_ID));
    assert_eq!(r.onward, Ok(()));
    assert!(
        r.headers
            .iter()
            .any(|(k, v)| k == "forwarded" && v.contains(&format!("host={SERVICE_HOST}"))),
        "{:?}",
        r.headers
    );
    // The destination node saw the waypoint, not the client, over mTLS.
    let server = [
        ("reporter", "destination"),
        ("source_principal", WAYPOINT_ID),
        ("source_workload", "waypoint"),
        ("destination_principal", SERVER_ID),
        ("destination_workload", "server"),
        ("connection_security_policy", "mutual_tls"),
    ];
    assert_eq!(
        metric_sum(
            &seen.server_metrics,
            "istio_tcp_connections_closed_total",
            &server
        ),
        1,
        "{}",
        seen.server_metrics
    );
    // The client's node accounts it to the waypoint workload and the original service.
    let client = [
        ("reporter", "source"),
        ("source_principal", CLIENT_ID),
        ("destination_principal", WAYPOINT_ID),
        ("destination_workload", "waypoint"),
        ("destination_service", SERVICE_HOST),
    ];
    assert!(
        metric_sum(
            &seen.client_metrics,
            "istio_tcp_connections_closed_total",
            &client
        ) >= 1,
        "{}",
        seen.client_metrics
    );
    // The misdirected request: refused by the server's node with 400.
    let refused = seen.records[1].onward.clone().unwrap_err();
    assert!(refused.contains("400"), "{refused}");
}
