//! Waypoints end to end, as root: two nodes (dedicated mode) and a test waypoint pod in
//! the server node (`ambit_netns_lab::waypoint::observe_waypoint`). A client's connection to a
//! service with a waypoint goes to the waypoint first, with the service's VIP as the
//! authority and the client's identity; the waypoint's onward connection reaches the pod
//! with the waypoint's identity. A request a waypoint misdirects (an authority for an IP
//! the node does not serve, and whose waypoint it is not) is refused with 400.

use std::path::Path;

use ambit_netns_lab::mesh::{metric_sum, SERVICE_HOST, SERVICE_PORT, SERVICE_VIP};
use ambit_netns_lab::peer::NodeProxy;
use ambit_netns_lab::waypoint::{observe_waypoint, WAYPOINT_ID};

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

/// The sandwich: when the client pod is itself the server's (workload) waypoint, its
/// connection to the server's pod goes straight there, never back to itself.
#[test]
fn traffic_from_the_waypoint_itself_goes_direct() {
    use ambit_netns_lab::mesh::{EchoMode, TwoNodes, TwoNodesSpec, APP_PORT, CLIENT_IP, SERVER_IP};
    use std::io::{Read, Write};
    use std::net::{Shutdown, SocketAddr};
    use std::time::Duration;

    let mesh = ambit_netns_lab::waypoint::waypoint_mesh().replace(
        "  workloadName: server\n",
        &format!(
            "  workloadName: server\n  waypoint: {{destination: \"/{CLIENT_IP}\", hboneMtlsPort: 15008}}\n"
        ),
    );
    assert!(mesh.contains(&format!("destination: \"/{CLIENT_IP}\"")));
    let nodes = TwoNodes::launch(TwoNodesSpec {
        mesh: Some(&mesh),
        ..TwoNodesSpec::pair("e2e-sandwich", &ambit())
    })
    .unwrap();
    let _app = nodes.start_app_server(EchoMode::Mirror).unwrap();
    let mut conn = nodes
        .connect_from_client(SocketAddr::from((SERVER_IP, APP_PORT)))
        .unwrap();
    conn.write_all(b"from the waypoint").unwrap();
    conn.shutdown(Shutdown::Write).unwrap();
    let mut back = Vec::new();
    conn.read_to_end(&mut back).unwrap();
    assert_eq!(back, b"from the waypoint");
    // The client node sent it to the server itself, not to the waypoint (its own pod).
    let labels = [
        ("reporter", "source"),
        ("source_principal", CLIENT_ID),
        ("destination_principal", SERVER_ID),
        ("destination_workload", "server"),
    ];
    let mut text = String::new();
    ambit_netns_lab::wait_until(
        "the client node to count it",
        Duration::from_secs(5),
        || {
            text = nodes.metrics(&nodes.client_ns).unwrap();
            metric_sum(&text, "istio_tcp_connections_closed_total", &labels) == 1
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{text}"));
    let server = [
        ("reporter", "destination"),
        ("source_principal", CLIENT_ID),
        ("destination_workload", "server"),
    ];
    ambit_netns_lab::wait_until(
        "the server node to count it",
        Duration::from_secs(5),
        || {
            text = nodes.metrics(&nodes.server_ns).unwrap();
            metric_sum(&text, "istio_tcp_connections_closed_total", &server) == 1
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{text}"));
}

/// An application tunnel with PROXY protocol: the app, on loopback at the tunnel's port,
/// reads a PROXY v2 header naming the client (address and SPIFFE id) and the target the
/// client asked for, then the payload.
#[test]
fn a_proxy_application_tunnel_gets_the_header_then_the_payload() {
    use ambit_netns_lab::mesh::{APP_PORT, CLIENT_IP, SERVER_IP};
    let got = ambit_netns_lab::waypoint::observe_app_tunnel(
        "e2e-apptunnel",
        &ambit(),
        &ambit(),
        b"payload",
    )
    .unwrap();
    // Signature, v2 PROXY, TCP over IPv4, 12 address bytes + TLV 0xD0 (3 + id).
    let mut want = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
    want.extend_from_slice(&[0x21, 0x11]);
    want.extend_from_slice(&((12 + 3 + CLIENT_ID.len()) as u16).to_be_bytes());
    want.extend_from_slice(&CLIENT_IP.octets());
    want.extend_from_slice(&SERVER_IP.octets());
    assert!(got.len() > 28, "{got:?}");
    assert_eq!(&got[..24], &want[..], "{got:?}");
    // The client's port varies; the target is the authority's port.
    assert_eq!(&got[26..28], &APP_PORT.to_be_bytes());
    let mut tlv = vec![0xD0];
    tlv.extend_from_slice(&(CLIENT_ID.len() as u16).to_be_bytes());
    tlv.extend_from_slice(CLIENT_ID.as_bytes());
    tlv.extend_from_slice(b"payload");
    assert_eq!(&got[28..], &tlv[..], "{:?}", String::from_utf8_lossy(&got));
}
