//! HBONE between the two implementations, dedicated mode: ambit's client proxy to Istio's
//! server proxy and back, IPv4 and IPv6, 1 MiB each way with a half-close in between.

use std::net::{Ipv6Addr, SocketAddr, SocketAddrV6, TcpListener};
use std::time::Duration;

use ambit_interop::apps::{exchange_half_close, serve_half_close, MIB};
use ambit_interop::{ambit_bin, peer, NodeProxy};
use ambit_netns_lab::mesh::{
    TwoNodes, TwoNodesSpec, APP_PORT, CLIENT_IP, CLIENT_IP6, SERVER_IP, SERVER_IP6,
};
use ambit_netns_lab::Lab;

fn run(client: NodeProxy, server: NodeProxy, tag: &str) {
    let nodes = TwoNodes::launch(TwoNodesSpec::of(tag, client, server)).unwrap();
    let listener = Lab::in_netns(&nodes.server_ns, || {
        TcpListener::bind(SocketAddrV6::new(Ipv6Addr::UNSPECIFIED, APP_PORT, 0, 0))
    })
    .unwrap();
    let seed = rand::random::<u64>();
    let served = serve_half_close(listener, seed, MIB);
    for (dst, client_ip) in [
        (
            SocketAddr::from((SERVER_IP, APP_PORT)),
            std::net::IpAddr::from(CLIENT_IP),
        ),
        (SocketAddr::from((SERVER_IP6, APP_PORT)), CLIENT_IP6.into()),
    ] {
        let conn = nodes.connect_from_client(dst).unwrap();
        exchange_half_close(conn, seed, MIB)
            .unwrap_or_else(|e| panic!("{tag}, to {dst}: {e:#}\n{}", logs(&nodes)));
        let s = served.recv_timeout(Duration::from_secs(5)).unwrap();
        assert!(
            s.request_ok,
            "{tag}: the server app got {} bytes",
            s.request_len
        );
        println!(
            "{tag}: {dst} ok, the app saw the connection from {} (client {client_ip})",
            s.peer
        );
    }
}

fn logs(nodes: &TwoNodes) -> String {
    format!(
        "client proxy log:\n{}\nserver proxy log:\n{}",
        std::fs::read_to_string(&nodes.client_proxy.log).unwrap_or_default(),
        std::fs::read_to_string(&nodes.server_proxy.log).unwrap_or_default()
    )
}

#[test]
fn ambit_client_to_istio_server() {
    run(
        NodeProxy::Ambit(ambit_bin().unwrap()),
        NodeProxy::Istio(peer().unwrap()),
        "io-a2i",
    );
}

#[test]
fn istio_client_to_ambit_server() {
    run(
        NodeProxy::Istio(peer().unwrap()),
        NodeProxy::Ambit(ambit_bin().unwrap()),
        "io-i2a",
    );
}
