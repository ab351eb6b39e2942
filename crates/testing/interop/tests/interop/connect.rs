//! The CONNECT request each client proxy sends, recorded by an HBONE server that stands
//! where the server node's proxy would be.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::time::Duration;

use ambit_identity::{CertificateAuthority, SpiffeId};
use ambit_interop::compare::{forwarded_masked, is_traceparent};
use ambit_interop::hbone_probe::{Recorded, RecordingServer};
use ambit_interop::{both, NodeProxy};
use ambit_netns_lab::mesh::{
    TwoNodes, TwoNodesSpec, APP_PORT, SERVER_IP, SERVICE_PORT, SERVICE_VIP,
};

pub fn record(proxy: &NodeProxy) -> Vec<Recorded> {
    let tag = format!("io-rec-{}", proxy.label());
    let nodes = TwoNodes::launch(TwoNodesSpec {
        mesh: Some(crate::differential::MESH),
        ..TwoNodesSpec::pair(&tag, proxy)
    })
    .unwrap();
    nodes
        .lab
        .signal_and_wait(
            nodes.server_proxy.pid,
            nix::sys::signal::Signal::SIGKILL,
            Duration::from_secs(5),
        )
        .unwrap();
    let ca = CertificateAuthority::from_plugin_dir(&nodes.ca_dir).unwrap();
    let cert = ca
        .issue(
            &SpiffeId::parse("spiffe://cluster.local/ns/default/sa/server").unwrap(),
            Duration::from_secs(3600),
        )
        .unwrap();
    let server = RecordingServer::start(
        &nodes.server_ns,
        SocketAddr::from((SERVER_IP, 15008)),
        &cert,
    )
    .unwrap();
    let mut out = Vec::new();
    for dst in [
        SocketAddr::from((SERVER_IP, APP_PORT)),
        SocketAddr::from((SERVICE_VIP, SERVICE_PORT)),
    ] {
        let mut conn = nodes.connect_from_client(dst).unwrap();
        conn.write_all(b"hi").unwrap();
        conn.shutdown(Shutdown::Write).unwrap();
        let mut back = Vec::new();
        let _ = conn.read_to_end(&mut back);
        let rec = server.next(Duration::from_secs(10)).unwrap_or_else(|e| {
            panic!(
                "{tag} {dst}: {e}\n{}",
                std::fs::read_to_string(&nodes.client_proxy.log).unwrap_or_default()
            )
        });
        out.push(rec);
    }
    out
}

#[test]
fn the_connect_requests_of_both_clients_match() {
    let [ambit, istio] = both().unwrap();
    let a = record(&ambit);
    let i = record(&istio);
    for ((what, x), y) in ["pod-addressed", "VIP-addressed"]
        .into_iter()
        .zip(&a)
        .zip(&i)
    {
        // The TLS a client offers and ends up with.
        assert_eq!(x.offered_suites, y.offered_suites, "{what}: offered suites");
        assert_eq!(x.offered_alpn, y.offered_alpn, "{what}: offered ALPN");
        assert_eq!(x.offered_alpn, ["h2"], "{what}");
        assert_eq!(x.sni, y.sni, "{what}: SNI");
        assert_eq!(x.sni, None, "{what}: HBONE sends no SNI");
        assert_eq!(
            (&x.tls_version, &x.cipher_suite, &x.alpn),
            (&y.tls_version, &y.cipher_suite, &y.alpn),
            "{what}"
        );
        assert_eq!(x.tls_version, "TLSv1_3");
        assert_eq!(x.client_ids, y.client_ids, "{what}: client certificate");
        assert_eq!(
            x.client_ids,
            ["spiffe://cluster.local/ns/default/sa/client"]
        );
        // The request itself.
        assert_eq!(
            (&x.method, &x.scheme, &x.path),
            (&y.method, &y.scheme, &y.path),
            "{what}"
        );
        assert_eq!(
            (x.method.as_str(), &x.scheme, &x.path),
            ("CONNECT", &None, &None)
        );
        assert_eq!(x.authority, y.authority, "{what}: :authority");
        assert_eq!(
            x.authority, "10.78.0.2:8080",
            "{what}: the pod and target port"
        );
        let names = |r: &Recorded| r.headers.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
        assert_eq!(names(x), names(y), "{what}: header names and order");
        assert_eq!(x.header("baggage"), y.header("baggage"), "{what}: baggage");
        assert_eq!(
            x.header("baggage"),
            Some("k8s.cluster.name=cluster1,k8s.namespace.name=default,k8s.deployment.name=client-app,service.name=client,service.version=v1,cloud.region=eu-west,cloud.availability_zone=eu-west-1a")
        );
        let (fx, fy) = (
            x.header("forwarded").unwrap(),
            y.header("forwarded").unwrap(),
        );
        assert_eq!(
            forwarded_masked(fx),
            forwarded_masked(fy),
            "{what}: forwarded"
        );
        for t in [x.header("traceparent"), y.header("traceparent")] {
            assert!(t.is_some_and(is_traceparent), "{what}: traceparent {t:?}");
        }
    }
    assert_eq!(
        forwarded_masked(a[0].header("forwarded").unwrap()),
        "for=\"10.78.0.1:*\""
    );
    assert_eq!(
        forwarded_masked(a[1].header("forwarded").unwrap()),
        "for=\"10.78.0.1:*\";host=echo.default.svc.cluster.local"
    );
    assert_ne!(
        a[0].header("traceparent"),
        a[1].header("traceparent"),
        "a trace per connection"
    );
}
