//! The HBONE server's answers to the same raw requests, from ambit's and from Istio's,
//! and the access log lines each writes for them.

use std::net::SocketAddr;
use std::time::Duration;

use ambit_identity::{CertificateAuthority, SpiffeId, WorkloadCertificate};
use ambit_interop::compare::{access_lines, mask_port, LogLine};
use ambit_interop::hbone_probe::{probe, Outcome, ProbeRequest};
use ambit_interop::{both, NodeProxy};
use ambit_netns_lab::mesh::{EchoMode, TwoNodes, TwoNodesSpec, SERVER_IP, SERVER_IP6};

use crate::differential::{documented, MESH, POLICIES};

pub struct Case {
    pub name: String,
    /// Which client certificate: `client`, `nobody` (denied by policy), `foreign` (another
    /// trust domain, same root), `stranger` (another root) or `none`.
    pub cert: &'static str,
    pub request: ProbeRequest,
    /// The status both must answer; `None`: the TLS handshake is refused.
    pub status: Option<u16>,
}

fn case(name: &str, cert: &'static str, request: ProbeRequest, status: Option<u16>) -> Case {
    Case {
        name: name.to_string(),
        cert,
        request,
        status,
    }
}

pub fn cases() -> Vec<Case> {
    let connect = ProbeRequest::connect;
    let mut get = connect("10.78.0.2:8080");
    get.method = http::Method::GET;
    let mut v = vec![
        case("good", "client", connect("10.78.0.2:8080"), Some(200)),
        case(
            "good over IPv6",
            "client",
            connect("[fd00:78::2]:8080"),
            Some(200),
        ),
        case(
            "service hostname",
            "client",
            connect("echo.default.svc.cluster.local:80"),
            Some(200),
        ),
        case(
            "unknown hostname",
            "client",
            connect("nope.default.svc.cluster.local:80"),
            Some(503),
        ),
        case(
            "hostname without port",
            "client",
            connect("echo.default.svc.cluster.local"),
            Some(400),
        ),
        case("non-CONNECT", "client", get, Some(400)),
        case(
            "authority without port",
            "client",
            connect("10.78.0.2"),
            Some(400),
        ),
        case(
            "refused upstream",
            "client",
            connect("10.78.0.2:9998"),
            Some(503),
        ),
        case("wrong ip", "client", connect("10.78.0.9:8080"), Some(400)),
        case(
            "another family's ip",
            "client",
            connect("[fd00:78::2]:8080"),
            Some(400),
        ),
        case(
            "policy deny (port)",
            "client",
            connect("10.78.0.2:9999"),
            Some(401),
        ),
        case(
            "policy deny (principal)",
            "nobody",
            connect("10.78.0.2:8080"),
            Some(401),
        ),
        case(
            "foreign trust domain",
            "foreign",
            connect("10.78.0.2:8080"),
            None,
        ),
        case("unknown CA", "stranger", connect("10.78.0.2:8080"), None),
        case(
            "no client certificate",
            "none",
            connect("10.78.0.2:8080"),
            None,
        ),
    ];
    // The loop guard and the admin port (loopback only).
    for port in [15001u16, 15006, 15008, 15000] {
        v.push(port_case(port, 503));
    }
    v
}

fn port_case(port: u16, status: u16) -> Case {
    case(
        &format!("port {port}"),
        "client",
        ProbeRequest::connect(format!("10.78.0.2:{port}")),
        Some(status),
    )
}

pub struct Answers {
    pub outcomes: Vec<(String, Outcome)>,
    pub log: String,
}

pub fn answers(proxy: &NodeProxy) -> Answers {
    answers_to(proxy, "io-ans", cases())
}

/// How `proxy`'s HBONE server answers `cases`, in a lab tagged `prefix`.
pub fn answers_to(proxy: &NodeProxy, prefix: &str, cases: Vec<Case>) -> Answers {
    let tag = format!("{prefix}-{}", proxy.label());
    let nodes = TwoNodes::launch(TwoNodesSpec {
        extra_yaml: POLICIES,
        mesh: Some(MESH),
        ..TwoNodesSpec::pair(&tag, proxy)
    })
    .unwrap();
    let _app = nodes.start_app_server(EchoMode::Mirror).unwrap();
    // The probe runs in the client node: take the capture rule away.
    for iptables in ["iptables", "ip6tables"] {
        nodes
            .lab
            .exec(
                &nodes.client_ns,
                &[iptables, "-w", "-t", "nat", "-F", "OUTPUT"],
            )
            .unwrap();
    }
    let ca = CertificateAuthority::from_plugin_dir(&nodes.ca_dir).unwrap();
    let issue = |ca: &CertificateAuthority, id: &str| -> WorkloadCertificate {
        ca.issue(&SpiffeId::parse(id).unwrap(), Duration::from_secs(3600))
            .unwrap()
    };
    let stranger_ca = CertificateAuthority::ephemeral("cluster.local").unwrap();
    let certs = [
        (
            "client",
            Some(issue(&ca, "spiffe://cluster.local/ns/default/sa/client")),
        ),
        (
            "nobody",
            Some(issue(&ca, "spiffe://cluster.local/ns/default/sa/nobody")),
        ),
        (
            "foreign",
            Some(issue(&ca, "spiffe://other.domain/ns/default/sa/client")),
        ),
        (
            "stranger",
            Some(issue(
                &stranger_ca,
                "spiffe://cluster.local/ns/default/sa/client",
            )),
        ),
        ("none", None),
    ];
    let mut outcomes = Vec::new();
    for case in cases {
        let cert = certs
            .iter()
            .find(|(n, _)| *n == case.cert)
            .unwrap()
            .1
            .as_ref();
        // "good over IPv6" asks over IPv6; every other case over IPv4 (so an IPv6
        // authority there is another address than the one the connection reached).
        let dst = if case.name == "good over IPv6" {
            SocketAddr::from((SERVER_IP6, 15008))
        } else {
            SocketAddr::from((SERVER_IP, 15008))
        };
        let o = probe(&nodes.client_ns, dst, cert, &case.request).unwrap();
        outcomes.push((case.name, o));
    }
    // Let the last access log lines reach the file.
    std::thread::sleep(Duration::from_millis(300));
    let log = std::fs::read_to_string(&nodes.server_proxy.log).unwrap();
    Answers { outcomes, log }
}

/// An access log line reduced to what both must agree on: level, message, field names,
/// and the values but for the client's port, the duration and the error's wording (each
/// proxy words its errors its own way; the README says so).
fn comparable(l: LogLine) -> (String, String, Vec<(String, String)>) {
    let fields = l
        .fields
        .into_iter()
        .map(|(k, v)| {
            let v = match k.as_str() {
                "src.addr" => mask_port(&v),
                "duration" | "error" => "*".into(),
                _ => v,
            };
            (k, v)
        })
        .collect();
    (l.level, l.message, fields)
}

#[test]
fn the_hbone_servers_answer_alike() {
    let [ambit, istio] = both().unwrap();
    let a = answers(&ambit);
    let i = answers(&istio);
    for (case, ((_, x), (_, y))) in cases().iter().zip(a.outcomes.iter().zip(&i.outcomes)) {
        let name = &case.name;
        match (x, y) {
            (Outcome::TlsRejected(_), Outcome::TlsRejected(_)) => {
                assert_eq!(case.status, None, "{name}: both refused the handshake")
            }
            (
                Outcome::Response {
                    status: sx,
                    headers: hx,
                    echoed: ex,
                },
                Outcome::Response {
                    status: sy,
                    headers: hy,
                    echoed: ey,
                },
            ) => {
                assert_eq!((sx, hx), (sy, hy), "{name}: status and headers");
                assert_eq!(Some(*sx), case.status, "{name}");
                // A 200 from the echo app brings the bytes back; from 15020/15021 the
                // operator endpoints answer with HTTP, not our bytes.
                assert_eq!(ex, ey, "{name}: through the tunnel");
            }
            _ => panic!("{name}: ambit {x:?}, Istio {y:?}"),
        }
    }
    assert_eq!(
        a.outcomes[0].1,
        Outcome::Response {
            status: 200,
            headers: vec![(
                "baggage".into(),
                "k8s.cluster.name=cluster1,k8s.namespace.name=default,k8s.pod.name=server-app,service.name=server,service.version=v2,cloud.region=eu-west,cloud.availability_zone=eu-west-1b".into()
            )],
            echoed: Some(true),
        }
    );
    // The server's access log, line by line, but for the documented difference: ambit
    // names the inbound service of IP-addressed traffic.
    let la: Vec<_> = access_lines(&a.log).into_iter().map(comparable).collect();
    let li: Vec<_> = access_lines(&i.log).into_iter().map(comparable).collect();
    assert_eq!(
        la.len(),
        li.len(),
        "access log lines:\nambit:\n{}\nIstio:\n{}",
        a.log,
        i.log
    );
    let inbound_service = format!("{:?}", documented::INBOUND_SERVICE);
    for (mut x, y) in la.into_iter().zip(li) {
        if !y.2.iter().any(|(k, _)| k == "dst.service") {
            x.2.retain(|(k, v)| !(k == "dst.service" && *v == inbound_service));
        }
        assert_eq!(x, y, "access log line");
    }
}

/// The documented difference of `documented::GUARDED_OPERATOR_PORTS`: in dedicated mode
/// ambit's loop guard refuses tunnelled traffic to its stats and readiness ports, which
/// share the workload's addresses; ztunnel forwards it to its operator endpoints.
#[test]
fn only_ambit_guards_its_operator_ports() {
    let [ambit, istio] = both().unwrap();
    let ports = documented::GUARDED_OPERATOR_PORTS;
    let a = answers_to(
        &ambit,
        "io-op",
        ports.iter().map(|p| port_case(*p, 503)).collect(),
    );
    let i = answers_to(
        &istio,
        "io-op",
        ports.iter().map(|p| port_case(*p, 200)).collect(),
    );
    for (port, ((_, x), (_, y))) in ports.iter().zip(a.outcomes.iter().zip(&i.outcomes)) {
        assert!(
            matches!(x, Outcome::Response { status: 503, .. }),
            "port {port}: ambit {x:?}"
        );
        assert!(
            matches!(y, Outcome::Response { status: 200, .. }),
            "port {port}: Istio {y:?}"
        );
    }
}

/// How each server answers a client certificate carrying two SPIFFE ids (the README's
/// "stricter identities": an SVID has exactly one).
fn two_ids(proxy: &NodeProxy) -> Outcome {
    let tag = format!("io-2id-{}", proxy.label());
    let nodes = TwoNodes::launch(TwoNodesSpec::pair(&tag, proxy)).unwrap();
    let _app = nodes.start_app_server(EchoMode::Mirror).unwrap();
    nodes
        .lab
        .exec(
            &nodes.client_ns,
            &["iptables", "-w", "-t", "nat", "-F", "OUTPUT"],
        )
        .unwrap();
    let cert = ambit_interop::certs::two_spiffe_ids(
        &nodes.ca_dir,
        [
            "spiffe://cluster.local/ns/default/sa/client",
            "spiffe://cluster.local/ns/default/sa/other",
        ],
    )
    .unwrap();
    probe(
        &nodes.client_ns,
        SocketAddr::from((SERVER_IP, 15008)),
        Some(&cert),
        &ProbeRequest::connect("10.78.0.2:8080"),
    )
    .unwrap()
}

#[test]
fn only_ambit_refuses_a_certificate_with_two_spiffe_ids() {
    let [ambit, istio] = both().unwrap();
    let a = two_ids(&ambit);
    let i = two_ids(&istio);
    assert!(matches!(a, Outcome::TlsRejected(_)), "ambit took it: {a:?}");
    assert_eq!(i.status(), Some(200), "Istio's ztunnel: {i:?}");
}
