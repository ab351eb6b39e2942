//! Istio's ztunnel as a client of `ambit control`, without `FAKE_CA`: it reads its mesh
//! over delta xDS and gets its certificates from ambit's CA, then carries traffic to and
//! from an ambit node proxy configured by the same server.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::time::Duration;

use ambit_interop::{ambit_bin, peer, NodeProxy};
use ambit_netns_lab::mesh::{
    mesh_yaml, metric_sum, EchoMode, TwoNodes, TwoNodesSpec, APP_PORT, SERVER_IP, SERVICE_HOST,
};
use ambit_netns_lab::{http_get, wait_until};

/// An ALLOW policy that admits the client, so the policies section is not empty.
const ALLOW_CLIENT: &str = r#"policies:
- name: allow-client
  namespace: default
  scope: Namespace
  action: Allow
  rules:
  - - - principals: [!Exact "cluster.local/ns/default/sa/client"]
"#;

fn config_dump(ns: &str) -> serde_json::Value {
    let (status, body) = http_get(ns, "127.0.0.1:15000".parse().unwrap(), "/config_dump").unwrap();
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

fn run(client: NodeProxy, server: NodeProxy, tag: &str) {
    let ambit = ambit_bin().unwrap();
    let mesh = mesh_yaml() + ALLOW_CLIENT;
    let nodes = TwoNodes::launch(TwoNodesSpec {
        mesh: Some(&mesh),
        control: Some(ambit),
        ..TwoNodesSpec::of(tag, client, server)
    })
    .unwrap();
    let _accepted = nodes.start_app_server(EchoMode::Mirror).unwrap();
    let dst = SocketAddr::from((SERVER_IP, APP_PORT));
    let mut conn = nodes.connect_from_client(dst).unwrap();
    conn.write_all(b"through both").unwrap();
    conn.shutdown(Shutdown::Write).unwrap();
    let mut back = Vec::new();
    conn.read_to_end(&mut back)
        .unwrap_or_else(|e| panic!("{tag}: {e}\n{}", logs(&nodes)));
    assert_eq!(back, b"through both", "{tag}\n{}", logs(&nodes));
    // It crossed in HBONE: the server node's proxy took it over mutual TLS from the
    // client's identity, as its metrics say.
    let mut text = String::new();
    wait_until(
        "the server proxy to count the connection",
        Duration::from_secs(10),
        || {
            text = nodes.metrics(&nodes.server_ns).unwrap_or_default();
            metric_sum(
                &text,
                "istio_tcp_connections_opened_total",
                &[
                    ("reporter", "destination"),
                    ("connection_security_policy", "mutual_tls"),
                    (
                        "source_principal",
                        "spiffe://cluster.local/ns/default/sa/client",
                    ),
                ],
            ) >= 1
        },
    )
    .unwrap_or_else(|e| panic!("{tag}: {e}\n{text}"));

    let plane = nodes.control.as_ref().unwrap();
    let root = std::fs::read_to_string(plane.ca_dir.join("root-cert.pem")).unwrap();
    for (ns, who) in [(&nodes.client_ns, "client"), (&nodes.server_ns, "server")] {
        let dump = config_dump(ns);
        let workloads = dump["workloads"].as_array().unwrap();
        assert!(
            workloads.iter().any(|w| w["name"] == "client")
                && workloads.iter().any(|w| w["name"] == "server"),
            "{tag} {who}: {dump}"
        );
        let services = dump["services"].as_array().unwrap();
        assert!(
            services.iter().any(|s| s["hostname"] == SERVICE_HOST),
            "{tag} {who}: {dump}"
        );
        let policies = dump["policies"].as_array().unwrap();
        assert!(
            policies.iter().any(|p| p["name"] == "allow-client"),
            "{tag} {who}: {dump}"
        );
        // Its certificate chains to ambit control's root.
        let mut certs = Vec::new();
        wait_until(
            "a certificate in /config_dump",
            Duration::from_secs(10),
            || {
                certs = config_dump(ns)["certificates"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                !certs.is_empty()
            },
        )
        .unwrap_or_else(|e| panic!("{tag} {who}: {e}"));
        let root_b64 = certs[0]["rootCerts"][0]["pem"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        use base64::Engine;
        let shown = base64::engine::general_purpose::STANDARD
            .decode(root_b64)
            .unwrap_or_default();
        // The same certificate, whatever the PEM line length each side writes.
        let squash = |pem: &str| pem.split_whitespace().collect::<String>();
        assert_eq!(
            squash(&String::from_utf8_lossy(&shown)),
            squash(&root),
            "{tag} {who}: the root in /config_dump is not ambit control's"
        );
    }
    let debug = plane.debug().unwrap().to_string();
    assert!(
        debug.contains("ztunnel-node1") && debug.contains("ztunnel-node2"),
        "{debug}"
    );
}

fn logs(nodes: &TwoNodes) -> String {
    format!(
        "client proxy log:\n{}\nserver proxy log:\n{}\ncontrol log:\n{}",
        std::fs::read_to_string(&nodes.client_proxy.log).unwrap_or_default(),
        std::fs::read_to_string(&nodes.server_proxy.log).unwrap_or_default(),
        nodes.control.as_ref().map(|c| c.log()).unwrap_or_default()
    )
}

#[test]
fn istio_ztunnel_client_to_ambit_server_both_under_ambit_control() {
    run(
        NodeProxy::Istio(peer().unwrap()),
        NodeProxy::Ambit(ambit_bin().unwrap()),
        "io-cp-istio-ambit",
    );
}

#[test]
fn ambit_client_to_istio_ztunnel_server_both_under_ambit_control() {
    run(
        NodeProxy::Ambit(ambit_bin().unwrap()),
        NodeProxy::Istio(peer().unwrap()),
        "io-cp-ambit-istio",
    );
}
