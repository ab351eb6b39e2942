//! A half-migrated namespace, end to end, as root: a Service whose endpoint is a pod still
//! on a sidecar (WDS `tunnelProtocol: LEGACY_ISTIO_MTLS`), behind the waypoint. The
//! waypoint reaches it as Istio's waypoints reach sidecars: mutual TLS to the pod's own
//! port with its own certificate, ALPN `istio`, the server's SPIFFE id checked. The pod's
//! inbound is played by Python's `ssl` (OpenSSL) with a certificate the mesh CA issued,
//! requiring and reporting the client's.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use ambit_identity::{CertificateAuthority, SpiffeId};
use ambit_netns_lab::l7::{l7_mesh, L7Lab, Reply};
use ambit_netns_lab::mesh::LINK_DEV;
use ambit_netns_lab::wait_until;
use ambit_netns_lab::waypoint::{WAYPOINT_IP, WAYPOINT_PORT};

const SIDECAR_IP: Ipv4Addr = Ipv4Addr::new(10, 78, 0, 7);
const IMPOSTER_IP: Ipv4Addr = Ipv4Addr::new(10, 78, 0, 8);
/// (service, VIP, pod, pod IP)
const LEGACY: [(&str, &str, &str, Ipv4Addr); 2] = [
    ("legacy", "10.96.0.30", "legacy", SIDECAR_IP),
    ("legacy-bad", "10.96.0.31", "imposter", IMPOSTER_IP),
];

fn mesh() -> String {
    let mut workloads = String::new();
    let mut services = String::new();
    for (svc, vip, pod, ip) in LEGACY {
        workloads.push_str(&format!(
            "- uid: cluster1//v1/Pod/default/{pod}
  name: {pod}
  namespace: default
  serviceAccount: legacy
  trustDomain: cluster.local
  workloadIps: [\"{ip}\"]
  protocol: LEGACY_ISTIO_MTLS
  node: node2
  canonicalName: {pod}
  workloadName: {pod}
  services:
    default/{svc}.default.svc.cluster.local:
      80: 8080
"
        ));
        services.push_str(&format!(
            "- name: {svc}
  namespace: default
  hostname: {svc}.default.svc.cluster.local
  vips: [\"/{vip}\"]
  ports:
    80: 8080
  waypoint: {{destination: \"/{WAYPOINT_IP}\", hboneMtlsPort: {WAYPOINT_PORT}}}
"
        ));
    }
    let base = l7_mesh();
    let at = base.find("\nservices:\n").unwrap() + 1;
    format!("{}{workloads}{}{services}", &base[..at], &base[at..])
}

/// A sidecar's inbound as far as the waypoint sees it: mTLS requiring a client
/// certificate of the mesh, ALPN `istio`, then HTTP/1.1, answering with what it saw.
const INBOUND: &str = r#"
import http.server, json, ssl, sys
addr, cert, key, roots = sys.argv[1:5]
class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        conn = self.connection
        peer = conn.getpeercert() or {}
        uris = [v for (k, v) in peer.get("subjectAltName", ()) if k == "URI"]
        body = json.dumps({"alpn": conn.selected_alpn_protocol(), "client": uris, "path": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(cert, key)
ctx.verify_mode = ssl.CERT_REQUIRED
ctx.load_verify_locations(roots)
ctx.set_alpn_protocols(["istio"])
server = http.server.ThreadingHTTPServer((addr, 8080), Handler)
server.socket = ctx.wrap_socket(server.socket, server_side=True)
print("listening", flush=True)
server.serve_forever()
"#;

fn get(lab: &L7Lab, svc: &str, path: &str) -> Reply {
    let (_, vip, _, _) = LEGACY.iter().find(|l| l.0 == svc).unwrap();
    let vip: Ipv4Addr = vip.parse().unwrap();
    let host = format!("{svc}.default.svc.cluster.local");
    let req = http::Request::builder()
        .uri(format!("http://{host}{path}"))
        .header("host", host)
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    lab.send_http1_to(SocketAddr::from((vip, 80)), vec![req])
        .unwrap_or_else(|e| panic!("{e:#}\n{}", lab.waypoint_log()))
        .remove(0)
}

#[test]
fn a_pod_on_a_sidecar_is_reached_with_istio_mtls() {
    let ambit = Path::new(env!("CARGO_BIN_EXE_ambit"));
    let lab = L7Lab::launch_with_mesh("wp-sidecar", ambit, "", &[], &mesh()).unwrap();
    let ca = CertificateAuthority::from_plugin_dir(&lab.nodes.ca_dir).unwrap();
    let dir = lab.nodes.lab.dir.path();
    std::fs::write(dir.join("roots.pem"), ca.root_pem()).unwrap();
    let script = dir.join("inbound.py");
    std::fs::write(&script, INBOUND).unwrap();
    // The sidecar's pod has its service account's certificate; the imposter, another's.
    for (pod, ip, account) in [
        ("legacy", SIDECAR_IP, "legacy"),
        ("imposter", IMPOSTER_IP, "other"),
    ] {
        lab.nodes
            .lab
            .exec(
                &lab.nodes.server_ns,
                &["ip", "addr", "add", &format!("{ip}/24"), "dev", LINK_DEV],
            )
            .unwrap();
        let id = SpiffeId::new("cluster.local", "default", account).unwrap();
        let cert = ca.issue(&id, Duration::from_secs(3600)).unwrap();
        let (cert_file, key_file) = (
            dir.join(format!("{pod}.pem")),
            dir.join(format!("{pod}-key.pem")),
        );
        std::fs::write(&cert_file, cert.chain_pem()).unwrap();
        std::fs::write(&key_file, cert.key_pem()).unwrap();
        let args = [
            script.to_str().unwrap().to_string(),
            ip.to_string(),
            cert_file.display().to_string(),
            key_file.display().to_string(),
            dir.join("roots.pem").display().to_string(),
        ];
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let p = lab
            .nodes
            .lab
            .spawn(
                &lab.nodes.server_ns,
                &format!("inbound-{pod}"),
                Path::new("python3"),
                &args,
                &[],
            )
            .unwrap();
        wait_until("the inbound to listen", Duration::from_secs(10), || {
            std::fs::read_to_string(&p.log)
                .unwrap_or_default()
                .contains("listening")
        })
        .unwrap_or_else(|e| {
            panic!(
                "{e}: {}",
                std::fs::read_to_string(&p.log).unwrap_or_default()
            )
        });
    }

    // Through the waypoint: Istio mTLS with the waypoint's identity, ALPN istio.
    let r = get(&lab, "legacy", "/orders/7");
    assert_eq!(r.status, 200, "{r:?}\n{}", lab.waypoint_log());
    let seen: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(seen["alpn"], "istio");
    assert_eq!(
        seen["client"],
        serde_json::json!(["spiffe://cluster.local/ns/default/sa/waypoint"])
    );
    assert_eq!(seen["path"], "/orders/7");

    // A pod that presents another identity than its workload's is not talked to.
    let r = get(&lab, "legacy-bad", "/");
    assert_eq!(r.status, 503, "{r:?}");
    assert!(
        r.body
            .starts_with("upstream connect error or disconnect/reset before headers"),
        "{r:?}"
    );
}
