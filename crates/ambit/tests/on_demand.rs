//! End to end, as root: on-demand xDS (`XDS_ON_DEMAND=true`, the DNS proxy off) under
//! `ambit control`, two nodes in network namespaces. A node proxy starts knowing only its
//! own workload; a connection to the other node's workload subscribes to its address once
//! (counted at the control server) and is tunnelled; a removal from the mesh files reaches
//! it; an address asked while no control plane answers is refused within the bound; a name
//! unused for the idle time is unsubscribed and its workload leaves the store.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use ambit_netns_lab::mesh::{
    mesh_yaml, metric_sum, EchoMode, TwoNodes, TwoNodesSpec, APP_PORT, LINK_DEV, SERVER_IP,
    SERVICE_HOST, SERVICE_PORT, SERVICE_VIP,
};
use ambit_netns_lab::peer::NodeProxy;
use ambit_netns_lab::{http_get, wait_until};

const ADDRESS_TYPE: &str = "type.googleapis.com/istio.workload.Address";
const CLIENT_UID: &str = "cluster1//v1/Pod/default/client";
const SERVER_UID: &str = "cluster1//v1/Pod/default/server";
/// Generous: only a hang fails on it.
const HANG: Duration = Duration::from_secs(30);

fn ambit() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_ambit"))
}

/// Both node proxies on demand under `ambit control`, with the idle time given.
fn launch(tag: &str, idle: &str) -> TwoNodes {
    let ambit = ambit();
    let env = [
        ("XDS_ON_DEMAND", "true".to_string()),
        ("AMBIT_XDS_ON_DEMAND_TIMEOUT", "1s".to_string()),
        ("AMBIT_XDS_ON_DEMAND_IDLE", idle.to_string()),
    ];
    TwoNodes::launch(TwoNodesSpec {
        env: &env,
        control: Some(ambit.clone()),
        ..TwoNodesSpec::pair(tag, &NodeProxy::Ambit(ambit))
    })
    .unwrap()
}

fn config_dump(ns: &str) -> serde_json::Value {
    let (status, body) = http_get(ns, "127.0.0.1:15000".parse().unwrap(), "/config_dump").unwrap();
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// ambit's `/xds_on_demand`: whether on demand is on and what its book holds.
fn on_demand_status(ns: &str) -> serde_json::Value {
    let (status, body) =
        http_get(ns, "127.0.0.1:15000".parse().unwrap(), "/xds_on_demand").unwrap();
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

fn workload_uids(dump: &serde_json::Value) -> Vec<String> {
    let mut uids: Vec<String> = dump["workloads"]
        .as_array()
        .map(|ws| {
            ws.iter()
                .filter_map(|w| w["uid"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    uids.sort();
    uids
}

/// Names subscribed by name at the control server, Address type, all clients.
fn subscribed(nodes: &TwoNodes) -> u64 {
    let text = nodes.control.as_ref().unwrap().metrics().unwrap();
    metric_sum(
        &text,
        "ambit_control_xds_names_subscribed_total",
        &[("type_url", ADDRESS_TYPE)],
    )
}

/// The Address type of node1's proxy as the control server sees it (`/debug`).
fn node1_address_type(nodes: &TwoNodes) -> serde_json::Value {
    let debug = nodes.control.as_ref().unwrap().debug().unwrap();
    let clients = debug["clients"].as_array().cloned().unwrap_or_default();
    let node1: Vec<_> = clients
        .iter()
        .filter(|c| {
            c["node_id"]
                .as_str()
                .is_some_and(|n| n.contains("ztunnel-node1"))
        })
        .collect();
    assert_eq!(node1.len(), 1, "one stream from node1: {debug}");
    node1[0]["types"][ADDRESS_TYPE].clone()
}

/// Both proxies hold their own workload (asked for at start, pinned).
fn wait_for_local_workloads(nodes: &TwoNodes) {
    for (ns, uid) in [
        (&nodes.client_ns, CLIENT_UID),
        (&nodes.server_ns, SERVER_UID),
    ] {
        wait_until("the local workload on demand", HANG, || {
            workload_uids(&config_dump(ns)).contains(&uid.to_string())
        })
        .unwrap_or_else(|e| panic!("{ns}: {e}: {}", config_dump(ns)));
    }
}

/// One round trip on a new connection from the client node.
fn round_trip(nodes: &TwoNodes, dst: SocketAddr, payload: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut conn = nodes
        .connect_from_client(dst)
        .map_err(std::io::Error::other)?;
    conn.write_all(payload)?;
    conn.shutdown(Shutdown::Write)?;
    let mut back = Vec::new();
    conn.read_to_end(&mut back)?;
    Ok(back)
}

/// Outbound connections node1's proxy counted as tunnelled to the server workload.
fn tunnelled(nodes: &TwoNodes) -> u64 {
    let text = nodes.metrics(&nodes.client_ns).unwrap();
    metric_sum(
        &text,
        "istio_tcp_connections_opened_total",
        &[
            ("reporter", "source"),
            ("destination_workload", "server"),
            ("connection_security_policy", "mutual_tls"),
        ],
    )
}

#[test]
fn on_demand_subscribes_once_follows_removal_and_fails_closed() {
    let mut nodes = launch("od-main", "30m");
    let accepted = nodes.start_app_server(EchoMode::Mirror).unwrap();
    wait_for_local_workloads(&nodes);

    // Each proxy knows its own workload only.
    let dump = config_dump(&nodes.client_ns);
    assert_eq!(workload_uids(&dump), [CLIENT_UID], "{dump}");
    // ztunnel's own flag, and ambit's status beside it.
    assert_eq!(dump["config"]["xdsOnDemand"], true, "{dump}");
    assert!(dump.get("xdsOnDemand").is_none(), "only ztunnel's sections");
    assert_eq!(on_demand_status(&nodes.client_ns)["enabled"], true);
    assert_eq!(workload_uids(&config_dump(&nodes.server_ns)), [SERVER_UID]);
    let before = subscribed(&nodes);
    assert_eq!(
        before, 2,
        "each proxy subscribed to its own uid, and nothing else"
    );
    assert_eq!(node1_address_type(&nodes)["explicit_subscriptions"], 1);

    // A connection to the server's workload: asked for once, then tunnelled (HBONE).
    let dst = SocketAddr::from((SERVER_IP, APP_PORT));
    assert_eq!(round_trip(&nodes, dst, b"first").unwrap(), b"first");
    assert_eq!(subscribed(&nodes), before + 1, "one name subscribed");
    let od = node1_address_type(&nodes);
    assert_eq!(od["explicit_subscriptions"], 2, "{od}");
    assert!(
        od["versions"].get(SERVER_UID).is_some(),
        "the server's workload was sent to node1: {od}"
    );
    let dump = config_dump(&nodes.client_ns);
    assert_eq!(workload_uids(&dump), [CLIENT_UID, SERVER_UID], "{dump}");
    wait_until("the tunnelled connection counted", HANG, || {
        tunnelled(&nodes) == 1
    })
    .unwrap();

    // A second connection finds it in the store: no new subscription.
    assert_eq!(round_trip(&nodes, dst, b"second").unwrap(), b"second");
    wait_until("the second tunnelled connection counted", HANG, || {
        tunnelled(&nodes) == 2
    })
    .unwrap();
    assert_eq!(subscribed(&nodes), before + 1, "no second subscription");
    assert_eq!(node1_address_type(&nodes)["explicit_subscriptions"], 2);

    // The server's workload removed from the mesh files: node1's proxy drops it.
    let plane = nodes.control.as_ref().unwrap();
    let server_entry_start = mesh_yaml()
        .find("- uid: cluster1//v1/Pod/default/server")
        .unwrap();
    let services_start = mesh_yaml().find("services:\n- name").unwrap();
    let mut without_server = mesh_yaml();
    without_server.replace_range(server_entry_start..services_start, "");
    assert!(!without_server.contains(SERVER_UID));
    plane.write_mesh(&without_server).unwrap();
    wait_until("the removal to reach node1", HANG, || {
        workload_uids(&config_dump(&nodes.client_ns)) == [CLIENT_UID]
    })
    .unwrap_or_else(|e| panic!("{e}: {}", config_dump(&nodes.client_ns)));

    // No control plane to answer: an address not in the store is refused once the
    // bound (1s) passes, and nothing crosses. The address is the server node's too, where
    // the echo app listens: a proxy that let the connection through (as to an address
    // outside the mesh) would have it echoed back.
    let lab = &nodes.lab;
    let unknown = SocketAddr::from(([10, 78, 0, 99], APP_PORT));
    lab.exec(
        &nodes.server_ns,
        &["ip", "addr", "add", "10.78.0.99/24", "dev", LINK_DEV],
    )
    .unwrap();
    assert_eq!(
        direct_round_trip(&nodes, unknown, b"direct"),
        b"direct",
        "the app answers at {unknown} past the proxy"
    );
    nodes.control.as_mut().unwrap().stop(lab).unwrap();
    // Two tunnelled connections and the direct one: nothing else reached the app.
    assert_eq!(accepted.try_iter().count(), 3);
    match round_trip(&nodes, unknown, b"nobody") {
        Ok(back) => assert!(back.is_empty(), "bytes came back: {back:?}"),
        Err(e) => assert!(
            !matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
            "a hang, not a refusal: {e}"
        ),
    }
    let why = "on-demand lookup failed: no answer from the control plane for /10.78.0.99 within 1s";
    wait_until("the refusal logged", HANG, || {
        std::fs::read_to_string(&nodes.client_proxy.log).is_ok_and(|l| l.contains(why))
    })
    .unwrap_or_else(|e| {
        panic!(
            "{e}: {}",
            std::fs::read_to_string(&nodes.client_proxy.log).unwrap_or_default()
        )
    });
    let dump = config_dump(&nodes.client_ns);
    assert_eq!(workload_uids(&dump), [CLIENT_UID], "{dump}");
    let names = &on_demand_status(&nodes.client_ns)["names"];
    assert_eq!(names["pending"], 1, "{names}");
    // The refusal is logged after the connection was closed: had it crossed, the app
    // would have accepted it by now.
    let crossed: Vec<SocketAddr> = accepted.try_iter().collect();
    assert!(
        crossed.is_empty(),
        "the refused connection reached the app: {crossed:?}"
    );
}

/// One round trip from the client node on a socket the capture rule leaves alone (the
/// proxy's own mark), so that it goes straight to `dst`.
fn direct_round_trip(nodes: &TwoNodes, dst: SocketAddr, payload: &[u8]) -> Vec<u8> {
    let mut conn = ambit_netns_lab::Lab::in_netns(&nodes.client_ns, move || {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
        s.set_mark(ambit_wellknown::marks::PROXY)?;
        s.connect_timeout(&dst.into(), Duration::from_secs(10))?;
        Ok(std::net::TcpStream::from(s))
    })
    .unwrap();
    conn.set_read_timeout(Some(HANG)).unwrap();
    conn.write_all(payload).unwrap();
    conn.shutdown(Shutdown::Write).unwrap();
    let mut back = Vec::new();
    conn.read_to_end(&mut back).unwrap();
    back
}

#[test]
fn a_name_unused_for_the_idle_time_is_unsubscribed_and_removed() {
    let nodes = launch("od-idle", "2s");
    let _accepted = nodes.start_app_server(EchoMode::Mirror).unwrap();
    wait_for_local_workloads(&nodes);
    let before = subscribed(&nodes);

    let dst = SocketAddr::from((SERVER_IP, APP_PORT));
    assert_eq!(round_trip(&nodes, dst, b"once").unwrap(), b"once");
    assert_eq!(subscribed(&nodes), before + 1, "one name subscribed");

    // Unused: unsubscribed at the server, and the workload leaves node1's store; its own
    // workload (pinned) stays.
    wait_until("the idle name to be unsubscribed", HANG, || {
        node1_address_type(&nodes)["explicit_subscriptions"] == 1
    })
    .unwrap_or_else(|e| panic!("{e}: {}", node1_address_type(&nodes)));
    wait_until("the idle workload to leave the store", HANG, || {
        workload_uids(&config_dump(&nodes.client_ns)) == [CLIENT_UID]
    })
    .unwrap_or_else(|e| panic!("{e}: {}", config_dump(&nodes.client_ns)));
    let names = &on_demand_status(&nodes.client_ns)["names"];
    assert_eq!(names["answered"], 1, "{names}");
    assert_eq!(names["pending"], 0, "{names}");

    // Asked again later: a new subscription, and served.
    assert_eq!(round_trip(&nodes, dst, b"again").unwrap(), b"again");
    assert_eq!(subscribed(&nodes), before + 2);
}

/// After a reconnect the client reports what it holds under the resources' own names,
/// which the server takes as subscriptions too (as istiod does): an idle name must take
/// what it brought along when it goes, or the server keeps following those for good.
fn idle_after_a_reconnect(tag: &str, dst: SocketAddr) {
    // Long enough for the reconnect to come first (checked below, not assumed).
    let mut nodes = launch(tag, "20s");
    let _accepted = nodes.start_app_server(EchoMode::Mirror).unwrap();
    wait_for_local_workloads(&nodes);
    assert_eq!(round_trip(&nodes, dst, b"once").unwrap(), b"once");

    let lab = &nodes.lab;
    let plane = nodes.control.as_mut().unwrap();
    plane.stop(lab).unwrap();
    plane.start(lab).unwrap();

    let node1 = || {
        let debug = nodes.control.as_ref().unwrap().debug().unwrap();
        debug["clients"].as_array().and_then(|cs| {
            cs.iter()
                .find(|c| {
                    c["node_id"]
                        .as_str()
                        .is_some_and(|n| n.contains("ztunnel-node1"))
                })
                .map(|c| c["types"][ADDRESS_TYPE].clone())
        })
    };
    wait_until("node1 to reconnect", HANG, || node1().is_some()).unwrap();
    let t = node1().unwrap();
    assert!(
        t["explicit_subscriptions"].as_u64() >= Some(2),
        "the local uid and the name asked, reported before the idle time: {t}"
    );

    wait_until(
        "the idle name to be unsubscribed after the reconnect",
        Duration::from_secs(90),
        || {
            node1().is_some_and(|t| {
                t["explicit_subscriptions"] == 1
                    && t["versions"]
                        .as_object()
                        .is_some_and(|v| v.keys().collect::<Vec<_>>() == [CLIENT_UID])
            })
        },
    )
    .unwrap_or_else(|e| panic!("{e}: {:?}", node1()));
    wait_until("the idle workload to leave the store", HANG, || {
        let dump = config_dump(&nodes.client_ns);
        workload_uids(&dump) == [CLIENT_UID]
            && dump["services"].as_array().is_none_or(Vec::is_empty)
    })
    .unwrap_or_else(|e| panic!("{e}: {}", config_dump(&nodes.client_ns)));
}

#[test]
fn an_idle_address_is_unsubscribed_after_a_reconnect_too() {
    idle_after_a_reconnect("od-reconn", SocketAddr::from((SERVER_IP, APP_PORT)));
}

/// The service and the endpoint it brought leave with the VIP, after a reconnect too.
#[test]
fn an_idle_service_vip_takes_its_endpoints_along_after_a_reconnect() {
    idle_after_a_reconnect(
        "od-reconn-vip",
        SocketAddr::from((SERVICE_VIP, SERVICE_PORT)),
    );
}

/// A service VIP asked for on demand brings the service and its endpoint along (the
/// proxy cannot know an endpoint's uid): one subscription, and the connection reaches
/// the endpoint through its node's proxy.
#[test]
fn a_service_vip_on_demand_brings_its_endpoints() {
    let nodes = launch("od-vip", "30m");
    let _accepted = nodes.start_app_server(EchoMode::Mirror).unwrap();
    wait_for_local_workloads(&nodes);
    let before = subscribed(&nodes);

    let vip = SocketAddr::from((SERVICE_VIP, SERVICE_PORT));
    assert_eq!(round_trip(&nodes, vip, b"via vip").unwrap(), b"via vip");
    assert_eq!(subscribed(&nodes), before + 1, "one name subscribed");
    let dump = config_dump(&nodes.client_ns);
    assert_eq!(workload_uids(&dump), [CLIENT_UID, SERVER_UID], "{dump}");
    let services: Vec<&str> = dump["services"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s["hostname"].as_str())
        .collect();
    assert_eq!(services, [SERVICE_HOST], "{dump}");
    let names = &on_demand_status(&nodes.client_ns)["names"];
    assert_eq!(names["dependents"], 1, "{names}");
    wait_until("the tunnelled connection counted", HANG, || {
        tunnelled(&nodes) == 1
    })
    .unwrap();
}
