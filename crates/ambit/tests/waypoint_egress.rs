//! The waypoint as ambient mode's egress gateway, end to end, as root: ServiceEntries with
//! `resolution: DNS` (in the mesh state as istiod sends them: a Service and a workload
//! known by hostname only, both behind the waypoint), resolved by the waypoint through an
//! independent DNS server (dnsmasq), reached in plaintext or with TLS originated to an
//! independent TLS server (Python's `ssl`, OpenSSL underneath), as Istio's egress tasks
//! write the DestinationRule. The origins listen on addresses of the waypoint's node that
//! only it is sent to; clients in the other node call plain `http://<host>/`.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use ambit_netns_lab::l7::{l7_mesh, L7Lab, Reply};
use ambit_netns_lab::mesh::metric_sum;
use ambit_netns_lab::wait_until;
use ambit_netns_lab::waypoint::{WAYPOINT_IP, WAYPOINT_PORT};

/// The DNS server, and the origins' addresses, on the waypoint's node.
const DNS_IP: Ipv4Addr = Ipv4Addr::new(10, 79, 0, 53);
const TLS_ORIGIN: Ipv4Addr = Ipv4Addr::new(10, 79, 0, 1);
const MTLS_ORIGIN: Ipv4Addr = Ipv4Addr::new(10, 79, 0, 2);
const MOVED_ORIGIN: Ipv4Addr = Ipv4Addr::new(10, 79, 0, 3);
const PLAIN_ORIGIN: Ipv4Addr = Ipv4Addr::new(10, 79, 0, 4);

/// (host, VIP, target port): each a ServiceEntry's host with `resolution: DNS`, port 80
/// sent to the target port, as Istio's egress TLS origination task writes it.
const ENTRIES: [(&str, &str, u16); 4] = [
    ("api.example.test", "240.240.0.10", 443),
    ("mtls.example.test", "240.240.0.11", 443),
    ("plain.example.test", "240.240.0.12", 80),
    ("nowhere.example.test", "240.240.0.13", 80),
];

/// The lab's mesh with the ServiceEntries as WDS carries them.
fn mesh() -> String {
    let mut workloads = String::new();
    let mut services = String::new();
    for (host, vip, target) in ENTRIES {
        let name = host.split('.').next().unwrap();
        workloads.push_str(&format!(
            "- uid: cluster1/networking.istio.io/ServiceEntry/default/{name}/{host}
  name: {name}
  namespace: default
  hostname: {host}
  protocol: NONE
  serviceAccount: default
  trustDomain: cluster.local
  canonicalName: {name}
  workloadName: {name}
  services:
    default/{host}:
      80: {target}
"
        ));
        services.push_str(&format!(
            "- name: {name}
  namespace: default
  hostname: {host}
  vips: [\"/{vip}\"]
  ports:
    80: {target}
  waypoint: {{destination: \"/{WAYPOINT_IP}\", hboneMtlsPort: {WAYPOINT_PORT}}}
"
        ));
    }
    let base = l7_mesh();
    let at = base.find("\nservices:\n").unwrap() + 1;
    format!("{}{workloads}{}{services}", &base[..at], &base[at..])
}

struct Pki {
    dir: PathBuf,
}

impl Pki {
    /// A CA, and certificates it signs: `api.example.test`'s, `mtls.example.test`'s, a
    /// client's; a second CA for clients, the one the mTLS origin trusts.
    fn new(dir: &Path) -> Pki {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
        let write = |name: &str, text: String| std::fs::write(dir.join(name), text).unwrap();
        let ca = |cn: &str| {
            let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
            p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            p.distinguished_name.push(DnType::CommonName, cn);
            let key = KeyPair::generate().unwrap();
            let cert = p.self_signed(&key).unwrap();
            (cert, key)
        };
        let (server_ca, server_ca_key) = ca("egress test server CA");
        let (client_ca, client_ca_key) = ca("egress test client CA");
        write("server-ca.pem", server_ca.pem());
        write("client-ca.pem", client_ca.pem());
        let leaf =
            |names: &[&str], cn: &str, issuer: &rcgen::Certificate, key: &KeyPair, file: &str| {
                let mut p =
                    CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                        .unwrap();
                p.distinguished_name.push(DnType::CommonName, cn);
                let k = KeyPair::generate().unwrap();
                let cert = p.signed_by(&k, issuer, key).unwrap();
                write(&format!("{file}.pem"), cert.pem());
                write(&format!("{file}-key.pem"), k.serialize_pem());
            };
        leaf(
            &["api.example.test"],
            "api",
            &server_ca,
            &server_ca_key,
            "api",
        );
        leaf(
            &["mtls.example.test"],
            "mtls",
            &server_ca,
            &server_ca_key,
            "mtls",
        );
        leaf(
            &[],
            "waypoint-egress-client",
            &client_ca,
            &client_ca_key,
            "client",
        );
        Pki {
            dir: dir.to_path_buf(),
        }
    }

    fn path(&self, file: &str) -> String {
        self.dir.join(file).display().to_string()
    }
}

/// An HTTP origin (Python's http.server, wrapped in Python's ssl when given a
/// certificate) that answers with what it saw: path, Host, peer, SNI, client certificate.
const ORIGIN: &str = r#"
import http.server, json, ssl, sys
name, addr, port, cert, key, client_ca = sys.argv[1:7]
class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        conn = self.connection
        peer_cert = conn.getpeercert() if hasattr(conn, "getpeercert") else None
        subject = None
        if peer_cert:
            subject = dict(x[0] for x in peer_cert["subject"]).get("commonName")
        body = json.dumps({
            "origin": name,
            "path": self.path,
            "host": self.headers.get("Host"),
            "peer": self.client_address[0],
            "sni": getattr(conn, "sni", None),
            "tls": hasattr(conn, "version") and conn.version(),
            "client": subject,
            "x-egress": self.headers.get("x-egress"),
        }).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        sys.stderr.write("%s %s\n" % (self.client_address[0], args[1] if len(args) > 1 else ""))
server = http.server.ThreadingHTTPServer((addr, int(port)), Handler)
if cert != "-":
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    def remember_sni(sock, server_name, _ctx):
        sock.sni = server_name
    ctx.sni_callback = remember_sni
    if client_ca != "-":
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(client_ca)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
print("listening", flush=True)
server.serve_forever()
"#;

fn start_origin(
    lab: &L7Lab,
    name: &str,
    addr: Ipv4Addr,
    port: u16,
    tls: Option<(&str, &str, Option<&str>)>,
) -> ambit_netns_lab::Process {
    let script = lab.nodes.lab.dir.path().join("origin.py");
    std::fs::write(&script, ORIGIN).unwrap();
    let (cert, key, ca) = match tls {
        Some((c, k, ca)) => (c.to_string(), k.to_string(), ca.unwrap_or("-").to_string()),
        None => ("-".into(), "-".into(), "-".into()),
    };
    let port_s = port.to_string();
    let addr_s = addr.to_string();
    let args = [
        script.to_str().unwrap(),
        name,
        addr_s.as_str(),
        port_s.as_str(),
        cert.as_str(),
        key.as_str(),
        ca.as_str(),
    ];
    let p = lab
        .nodes
        .lab
        .spawn(
            &lab.nodes.server_ns,
            &format!("origin-{name}"),
            Path::new("python3"),
            &args,
            &[],
        )
        .unwrap();
    wait_until("the origin to listen", Duration::from_secs(10), || {
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
    p
}

/// dnsmasq answering for the ServiceEntries' hosts (not `nowhere.example.test`), TTL 1 s.
fn start_dns(lab: &L7Lab, api_at: Ipv4Addr) -> ambit_netns_lab::Process {
    let records = [
        format!("--host-record=api.example.test,{api_at}"),
        format!("--host-record=mtls.example.test,{MTLS_ORIGIN}"),
        format!("--host-record=plain.example.test,{PLAIN_ORIGIN}"),
    ];
    let mut args = vec![
        "--keep-in-foreground".to_string(),
        "--conf-file=/dev/null".into(),
        "--no-resolv".into(),
        "--no-hosts".into(),
        "--no-poll".into(),
        "--bind-interfaces".into(),
        format!("--listen-address={DNS_IP}"),
        "--port=53".into(),
        "--local-ttl=1".into(),
        "--pid-file=".into(),
        "--user=root".into(),
        "--log-queries".into(),
        "--log-facility=-".into(),
    ];
    args.extend(records);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let p = lab
        .nodes
        .lab
        .spawn(
            &lab.nodes.server_ns,
            "dnsmasq",
            Path::new("dnsmasq"),
            &args,
            &[],
        )
        .unwrap();
    wait_until("dnsmasq to start", Duration::from_secs(10), || {
        std::fs::read_to_string(&p.log)
            .unwrap_or_default()
            .contains("started")
    })
    .unwrap_or_else(|e| {
        panic!(
            "{e}: {}",
            std::fs::read_to_string(&p.log).unwrap_or_default()
        )
    });
    p
}

fn get(lab: &L7Lab, host: &str, path: &str) -> Reply {
    let vip: Ipv4Addr = ENTRIES
        .iter()
        .find(|e| e.0 == host)
        .unwrap()
        .1
        .parse()
        .unwrap();
    let req = http::Request::builder()
        .uri(format!("http://{host}{path}"))
        .header("host", host)
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    lab.send_http1_to(SocketAddr::from((vip, 80)), vec![req])
        .unwrap_or_else(|e| panic!("{e:#}\n{}", lab.waypoint_log()))
        .remove(0)
}

fn json(r: &Reply) -> serde_json::Value {
    serde_json::from_str(&r.body).unwrap_or_else(|e| panic!("{e}: {r:?}"))
}

fn config(pki: &Pki, api_tls_extra: &str) -> String {
    format!(
        "apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {{name: api-tls, namespace: default}}
spec:
  host: api.example.test
  trafficPolicy:
    tls:
      mode: SIMPLE
      caCertificates: {ca}
{api_tls_extra}---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {{name: mtls, namespace: default}}
spec:
  host: mtls.example.test
  trafficPolicy:
    tls:
      mode: MUTUAL
      caCertificates: {ca}
      clientCertificate: {cert}
      privateKey: {key}
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {{name: no-admin, namespace: default}}
spec:
  targetRefs: [{{kind: ServiceEntry, group: networking.istio.io, name: api}}]
  action: DENY
  rules: [{{to: [{{operation: {{paths: [\"/admin*\"]}}}}]}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: api-egress, namespace: default}}
spec:
  parentRefs: [{{kind: ServiceEntry, group: networking.istio.io, name: api}}]
  rules:
  - filters:
    - type: RequestHeaderModifier
      requestHeaderModifier: {{set: [{{name: x-egress, value: via-route}}]}}
    backendRefs: [{{kind: ServiceEntry, group: networking.istio.io, name: api, port: 80}}]
",
        ca = pki.path("server-ca.pem"),
        cert = pki.path("client.pem"),
        key = pki.path("client-key.pem"),
    )
}

#[test]
fn egress_with_dns_resolution_and_tls_origination() {
    let scratch = ambit_netns_lab::tempfile_dir::TempDir::new(&format!(
        "ambit-egress-{}",
        std::process::id()
    ))
    .unwrap();
    let pki = Pki::new(scratch.path());
    let resolv = scratch.path().join("resolv.conf");
    std::fs::write(&resolv, format!("nameserver {DNS_IP}\n")).unwrap();
    let ambit = Path::new(env!("CARGO_BIN_EXE_ambit"));
    let env = [("AMBIT_RESOLV_CONF", resolv.display().to_string())];
    let lab =
        L7Lab::launch_with_mesh("wp-egress", ambit, &config(&pki, ""), &env, &mesh()).unwrap();
    for ip in [DNS_IP, TLS_ORIGIN, MTLS_ORIGIN, MOVED_ORIGIN, PLAIN_ORIGIN] {
        lab.nodes
            .lab
            .exec(
                &lab.nodes.server_ns,
                &["ip", "addr", "add", &format!("{ip}/32"), "dev", "lo"],
            )
            .unwrap();
    }
    let mut dns = start_dns(&lab, TLS_ORIGIN);
    start_origin(
        &lab,
        "api",
        TLS_ORIGIN,
        443,
        Some((&pki.path("api.pem"), &pki.path("api-key.pem"), None)),
    );
    start_origin(
        &lab,
        "moved",
        MOVED_ORIGIN,
        443,
        Some((&pki.path("api.pem"), &pki.path("api-key.pem"), None)),
    );
    start_origin(
        &lab,
        "mtls",
        MTLS_ORIGIN,
        443,
        Some((
            &pki.path("mtls.pem"),
            &pki.path("mtls-key.pem"),
            Some(&pki.path("client-ca.pem")),
        )),
    );
    start_origin(&lab, "plain", PLAIN_ORIGIN, 80, None);

    // Plain HTTP from the client, TLS from the waypoint: the origin saw TLS with the
    // ServiceEntry's host as SNI and Host, from the waypoint's address.
    let r = get(&lab, "api.example.test", "/get?x=1");
    assert_eq!(r.status, 200, "{r:?}\n{}", lab.waypoint_log());
    let seen = json(&r);
    assert_eq!(seen["origin"], "api");
    assert_eq!(seen["path"], "/get?x=1");
    assert_eq!(seen["host"], "api.example.test");
    assert_eq!(seen["sni"], "api.example.test");
    assert_eq!(seen["peer"], WAYPOINT_IP.to_string());
    assert!(
        seen["tls"].as_str().unwrap().starts_with("TLSv1."),
        "{seen}"
    );
    // The HTTPRoute attached to the ServiceEntry applied.
    assert_eq!(seen["x-egress"], "via-route");

    // MUTUAL: the waypoint presents the rule's client certificate.
    let r = get(&lab, "mtls.example.test", "/");
    assert_eq!(r.status, 200, "{r:?}\n{}", lab.waypoint_log());
    assert_eq!(json(&r)["client"], "waypoint-egress-client");

    // No rule: plaintext to the resolved address.
    let r = get(&lab, "plain.example.test", "/p");
    assert_eq!(
        (r.status, json(&r)["tls"].clone()),
        (200, serde_json::json!(false)),
        "{r:?}"
    );

    // An AuthorizationPolicy on the ServiceEntry: denied at the waypoint, never sent.
    let r = get(&lab, "api.example.test", "/admin/users");
    assert_eq!((r.status, r.body.as_str()), (403, "RBAC: access denied"));

    // A name the DNS server does not know: no endpoint (503 UH), the failure counted.
    let r = get(&lab, "nowhere.example.test", "/");
    assert_eq!(
        (r.status, r.body.as_str()),
        (503, "no healthy upstream"),
        "{r:?}"
    );

    let m = lab.waypoint_metrics().unwrap();
    assert!(
        metric_sum(&m, "ambit_waypoint_dns_lookups_total", &[("result", "ok")]) >= 3,
        "{m}"
    );
    assert!(
        metric_sum(
            &m,
            "ambit_waypoint_dns_lookups_total",
            &[("result", "error")]
        ) >= 1,
        "{m}"
    );
    // The request metrics name the ServiceEntry's host.
    let api = [
        ("reporter", "waypoint"),
        ("destination_service", "api.example.test"),
        ("response_code", "200"),
    ];
    assert_eq!(metric_sum(&m, "istio_requests_total", &api), 1, "{m}");

    // The name moves (TTL 1 s): after the TTL the waypoint asks again and follows it.
    lab.nodes
        .lab
        .signal_and_wait(
            dns.pid,
            nix::sys::signal::Signal::SIGTERM,
            Duration::from_secs(5),
        )
        .unwrap();
    dns = start_dns(&lab, MOVED_ORIGIN);
    wait_until(
        "the new address to be used",
        Duration::from_secs(10),
        || json(&get(&lab, "api.example.test", "/"))["origin"] == "moved",
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", lab.waypoint_log()));
    drop(dns);

    // subjectAltNames the certificate does not carry: the handshake is refused (503 UF),
    // nothing reaches the origin in plaintext.
    let wrong_san = "      subjectAltNames: [other.example.test]\n";
    let path = lab.policies.clone();
    let fresh = path.with_extension("new");
    std::fs::write(&fresh, config(&pki, wrong_san)).unwrap();
    std::fs::rename(&fresh, &path).unwrap();
    wait_until(
        "the SAN check to refuse the origin",
        Duration::from_secs(10),
        || get(&lab, "api.example.test", "/").status == 503,
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", lab.waypoint_log()));
    let m = lab.waypoint_metrics().unwrap();
    let refused = [
        ("destination_service", "api.example.test"),
        ("response_code", "503"),
        ("response_flags", "UF"),
    ];
    assert!(metric_sum(&m, "istio_requests_total", &refused) >= 1, "{m}");
}
