//! ambit's node agent, with `ambit-cni` in a real CNI chain (bridge + host-local +
//! ambit-cni), driving Istio's ztunnel in shared mode; in-pod HBONE between Istio's and
//! ambit's node proxies on two nodes; fail-closed with Istio's ztunnel stopped; and the
//! in-pod observables of both compared.

use std::io::{Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, SocketAddrV4, TcpListener};
use std::time::Duration;

use ambit_interop::apps::{exchange_half_close, serve_half_close, MIB};
use ambit_interop::compare::{family, json_diff, mask_port, parse_prometheus};
use ambit_interop::{ambit_bin, both, peer, NodeProxy};
use ambit_netns_lab::cluster::{Cluster, ClusterSpec, PodSpec};
use ambit_netns_lab::mesh::{metric_sum, EchoMode};
use ambit_netns_lab::{http_get, wait_until, Lab};
use serde_json::Value;

const T: Duration = Duration::from_secs(10);

fn config_dump(cluster: &Cluster, node: usize) -> Value {
    let (status, body) = http_get(
        &cluster.nodes[node].ns,
        "127.0.0.1:15000".parse().unwrap(),
        "/config_dump",
    )
    .unwrap();
    assert_eq!(status, 200);
    serde_json::from_str(&body).unwrap()
}

fn proxy_log(cluster: &Cluster, node: usize) -> String {
    cluster.nodes[node]
        .ztunnel
        .as_ref()
        .map(|p| std::fs::read_to_string(&p.log).unwrap_or_default())
        .unwrap_or_default()
}

/// 1 MiB from `from`'s app to `to`'s, half-close, 1 MiB back; `to`'s app must see
/// `from`'s own address.
fn exchange(cluster: &Cluster, from: &str, to: &str, port: u16) {
    let listener = Lab::in_netns(&cluster.pod(to).ns, move || {
        TcpListener::bind(SocketAddrV4::new([0, 0, 0, 0].into(), port))
    })
    .unwrap();
    let seed = rand::random();
    let served = serve_half_close(listener, seed, MIB);
    let conn = cluster
        .connect_from(from, SocketAddr::from((cluster.pod(to).ip, port)))
        .unwrap();
    exchange_half_close(conn, seed, MIB).unwrap_or_else(|e| {
        panic!(
            "{from} to {to}: {e:#}\nnode1:\n{}\nnode2:\n{}",
            proxy_log(cluster, 0),
            proxy_log(cluster, 1)
        )
    });
    let s = served.recv_timeout(T).unwrap();
    assert!(
        s.request_ok,
        "{from} to {to}: {} bytes arrived",
        s.request_len
    );
    assert_eq!(
        s.peer.ip(),
        IpAddr::from(cluster.pod(from).ip),
        "{from} to {to}: the source address"
    );
}

#[test]
fn ambit_agent_and_cni_drive_istio_ztunnel_and_pods_talk_across_both_proxies() {
    let ambit = ambit_bin().unwrap();
    let pods = [
        PodSpec::new("a", 0),
        PodSpec::new("b", 0),
        PodSpec::new("c", 1),
    ];
    let cluster = Cluster::launch(ClusterSpec {
        ambit: &ambit,
        tag: "io-agent",
        node_proxies: vec![
            NodeProxy::Istio(peer().unwrap()),
            NodeProxy::Ambit(ambit.clone()),
        ],
        pods: &pods,
        create: 3,
        extra_yaml: "",
        proxy_env: &[],
        control: None,
    })
    .unwrap();
    // On Istio's node; Istio's client to ambit's server; ambit's client to Istio's server.
    exchange(&cluster, "a", "b", 8080);
    exchange(&cluster, "a", "c", 8081);
    exchange(&cluster, "c", "a", 8082);

    let metrics = cluster.metrics(0).unwrap();
    assert_eq!(
        metric_sum_plain(&metrics, "workload_manager_active_proxy_count"),
        2.0,
        "{metrics}"
    );
    let dump = config_dump(&cluster, 0);
    let state = dump["workloadState"]
        .as_object()
        .expect("Istio's workloadState");
    for name in ["a", "b"] {
        let uid = &cluster.pod(name).uid;
        assert_eq!(state[uid]["state"], "Up", "{name}: {state:?}");
        assert_eq!(state[uid]["info"]["name"], name);
    }

    // CNI DEL: the agent tells Istio's ztunnel, which stops b's proxy.
    let b = cluster.pods.iter().position(|p| p.name == "b").unwrap();
    cluster.del_pod(b).unwrap();
    wait_until("Istio to stop b's proxy", T, || {
        cluster
            .metrics(0)
            .is_ok_and(|m| metric_sum_plain(&m, "workload_manager_active_proxy_count") == 1.0)
    })
    .unwrap();
    let b_ns = &cluster.pod("b").ns;
    wait_until("b's HBONE listener to close", T, || {
        cluster
            .lab
            .exec(b_ns, &["ss", "-Hltn", "sport = :15008"])
            .is_ok_and(|o| o.trim().is_empty())
    })
    .unwrap();
}

/// ambit's agent in Kubernetes mode (watching the test API server, pods through the
/// `istio-cni` plugin in Kubernetes mode) drives Istio's ztunnel: the pods are annotated,
/// Istio's ztunnel proxies them under their API UIDs, traffic flows across both node
/// proxies, and unlabelling the namespace makes Istio's ztunnel stop the pods' proxies.
#[test]
fn ambit_agent_in_kubernetes_mode_drives_istio_ztunnel() {
    let ambit = ambit_bin().unwrap();
    let pods = [
        PodSpec::new("a", 0),
        PodSpec::new("b", 0),
        PodSpec::new("c", 1),
    ];
    let cluster = Cluster::launch_kubernetes(ClusterSpec {
        ambit: &ambit,
        tag: "io-k8s",
        node_proxies: vec![
            NodeProxy::Istio(peer().unwrap()),
            NodeProxy::Ambit(ambit.clone()),
        ],
        pods: &pods,
        create: 3,
        extra_yaml: "",
        proxy_env: &[],
        control: None,
    })
    .unwrap();
    let kube = cluster.kube();
    for name in ["a", "b", "c"] {
        wait_until(&format!("{name} annotated enabled"), T, || {
            kube.redirection(name).as_deref() == Some("enabled")
        })
        .unwrap();
    }
    exchange(&cluster, "a", "b", 8080);
    exchange(&cluster, "a", "c", 8081);
    exchange(&cluster, "c", "a", 8082);
    let dump = config_dump(&cluster, 0);
    let state = dump["workloadState"]
        .as_object()
        .expect("Istio's workloadState");
    for name in ["a", "b"] {
        let uid = &cluster.pod(name).uid;
        let api_uid = kube.pod(name).unwrap()["metadata"]["uid"].clone();
        assert_eq!(
            uid.as_str(),
            api_uid,
            "{name}: the lab pod's uid is the API's"
        );
        assert_eq!(state[uid]["state"], "Up", "{name}: {state:?}");
        assert_eq!(state[uid]["info"]["name"], name);
        assert_eq!(state[uid]["info"]["namespace"], "default");
    }

    kube.label_namespace("default", None).unwrap();
    wait_until("Istio to stop the pods' proxies", T, || {
        cluster
            .metrics(0)
            .is_ok_and(|m| metric_sum_plain(&m, "workload_manager_active_proxy_count") == 0.0)
    })
    .unwrap();
    for name in ["a", "b", "c"] {
        wait_until(&format!("{name}'s annotation removed"), T, || {
            kube.redirection(name).is_none()
        })
        .unwrap();
    }
}

/// A sample without labels.
fn metric_sum_plain(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or(f64::NAN)
}

#[test]
fn pods_fail_closed_while_istio_ztunnel_is_down() {
    let ambit = ambit_bin().unwrap();
    // Node 1 runs ambit's node proxy (pod a), node 2 Istio's (pod c); ambit's agent on both.
    let pods = [PodSpec::new("a", 0), PodSpec::new("c", 1)];
    let mut cluster = Cluster::launch(ClusterSpec {
        ambit: &ambit,
        tag: "io-closed",
        node_proxies: vec![
            NodeProxy::Ambit(ambit.clone()),
            NodeProxy::Istio(peer().unwrap()),
        ],
        pods: &pods,
        create: 2,
        extra_yaml: "",
        proxy_env: &[],
        control: None,
    })
    .unwrap();
    let accepted = cluster.serve_app("c", 8080, EchoMode::Mirror).unwrap();
    let _a_app = cluster.serve_app("a", 8080, EchoMode::Mirror).unwrap();
    let c_app = SocketAddr::from((cluster.pod("c").ip, 8080));
    let a_app = SocketAddr::from((cluster.pod("a").ip, 8080));
    let ping = |s: anyhow::Result<std::net::TcpStream>| -> anyhow::Result<Vec<u8>> {
        let mut s = s?;
        s.write_all(b"ping")?;
        s.shutdown(Shutdown::Write)?;
        let mut back = Vec::new();
        s.read_to_end(&mut back)?;
        Ok(back)
    };
    assert_eq!(
        ping(cluster.connect_from("a", c_app)).unwrap(),
        b"ping",
        "through both proxies"
    );
    accepted.recv_timeout(T).unwrap();

    cluster.kill_ztunnel(1).unwrap();
    // Inbound to c over HBONE: nothing serves c's 15008 any more.
    let inbound = ping(cluster.connect_from("a", c_app));
    assert!(
        !matches!(&inbound, Ok(b) if !b.is_empty()),
        "inbound reached c without its proxy: {inbound:?}"
    );
    // Plain TCP from outside the mesh is captured to c's 15006: refused, never bypassed.
    let plain = ping(cluster.connect_from_node(0, c_app));
    assert!(
        !matches!(&plain, Ok(b) if !b.is_empty()),
        "plaintext reached c without its proxy: {plain:?}"
    );
    // Outbound from c is captured to its 15001: refused.
    let outbound = ping(cluster.connect_from("c", a_app));
    assert!(
        !matches!(&outbound, Ok(b) if !b.is_empty()),
        "c went out without its proxy: {outbound:?}"
    );
    assert!(
        accepted.recv_timeout(Duration::from_millis(500)).is_err(),
        "c's app accepted a connection while its node proxy was down"
    );

    // Back up: it reconnects, ambit's agent replays its pod, traffic flows again.
    cluster.start_ztunnel(1).unwrap();
    let metrics = cluster.metrics(1).unwrap();
    assert_eq!(
        metric_sum_plain(&metrics, "workload_manager_proxies_started_total"),
        1.0,
        "{metrics}"
    );
    assert_eq!(
        ping(cluster.connect_from("a", c_app)).unwrap(),
        b"ping",
        "after the restart"
    );
    assert_eq!(
        ping(cluster.connect_from("c", a_app)).unwrap(),
        b"ping",
        "out of c again"
    );
}

/// One node, pods a and b, one exchange from a to b: what the node proxy shows.
fn inpod_observed(proxy: &NodeProxy) -> (String, Value, Value) {
    let ambit = ambit_bin().unwrap();
    let pods = [PodSpec::new("a", 0), PodSpec::new("b", 0)];
    let cluster = Cluster::launch(ClusterSpec {
        ambit: &ambit,
        tag: &format!("io-inpod-{}", proxy.label()),
        node_proxies: vec![proxy.clone()],
        pods: &pods,
        create: 2,
        extra_yaml: "",
        proxy_env: &[],
        control: None,
    })
    .unwrap();
    let _app = cluster.serve_app("b", 8080, EchoMode::Double).unwrap();
    let dst = SocketAddr::from((cluster.pod("b").ip, 8080));
    let mut s = cluster.connect_from("a", dst).unwrap();
    s.write_all(b"hello world").unwrap();
    let mut back = [0u8; 22];
    s.read_exact(&mut back).unwrap();
    // While the connection is open, both pods list it.
    let open = config_dump(&cluster, 0)["workloadState"].clone();
    s.shutdown(Shutdown::Write).unwrap();
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).unwrap();
    wait_until("both reporters to count the close", T, || {
        cluster
            .metrics(0)
            .is_ok_and(|m| metric_sum(&m, "istio_tcp_connections_closed_total", &[]) == 2)
    })
    .unwrap();
    let closed = config_dump(&cluster, 0)["workloadState"].clone();
    // Pod uids are random per run: key the pods by name.
    let by_name = |ws: Value| -> Value {
        let mut out = serde_json::Map::new();
        for (_, pod) in ws.as_object().cloned().unwrap_or_default() {
            let name = pod["info"]["name"].as_str().unwrap_or_default().to_string();
            out.insert(name, pod);
        }
        Value::Object(out)
    };
    (cluster.metrics(0).unwrap(), by_name(open), by_name(closed))
}

/// Connection entries with the client's ephemeral ports masked.
fn masked(mut v: Value) -> Value {
    for pod in v.as_object_mut().into_iter().flat_map(|m| m.values_mut()) {
        for dir in ["inbound", "outbound"] {
            for c in pod["connections"][dir].as_array_mut().into_iter().flatten() {
                if let Some(src) = c["src"].as_str() {
                    c["src"] = mask_port(src).into();
                }
            }
        }
    }
    v
}

#[test]
fn inpod_metrics_and_workload_state_match() {
    let [ambit, istio] = both().unwrap();
    let (ma, open_a, closed_a) = inpod_observed(&ambit);
    let (mi, open_i, closed_i) = inpod_observed(&istio);
    let (sa, si) = (
        parse_prometheus(&ma).unwrap(),
        parse_prometheus(&mi).unwrap(),
    );
    for name in [
        "workload_manager_active_proxy_count",
        "workload_manager_pending_proxy_count",
        "workload_manager_proxies_started_total",
        "workload_manager_proxies_stopped_total",
        "istio_tcp_connections_opened_total",
        "istio_tcp_connections_closed_total",
        "istio_tcp_received_bytes_total",
        "istio_tcp_sent_bytes_total",
        "istio_tcp_sockets_open",
        "istio_build",
    ] {
        let d = json_diff(&family(&sa, name), &family(&si, name));
        assert!(
            d.is_empty(),
            "{name}:\n{}",
            d.iter().map(|d| format!("  {d}\n")).collect::<String>()
        );
    }
    let headers = |t: &str| -> Vec<String> {
        let mut h: Vec<String> = t
            .lines()
            .filter(|l| {
                l.starts_with("# HELP workload_manager") || l.starts_with("# TYPE workload_manager")
            })
            .map(str::to_string)
            .collect();
        h.sort();
        h
    };
    assert_eq!(headers(&ma), headers(&mi), "workload_manager HELP and TYPE");
    for (what, a, i) in [("open", open_a, open_i), ("closed", closed_a, closed_i)] {
        let d = json_diff(&masked(a), &masked(i));
        assert!(
            d.is_empty(),
            "workloadState with the connection {what}:\n{}",
            d.iter().map(|d| format!("  {d}\n")).collect::<String>()
        );
    }
}
