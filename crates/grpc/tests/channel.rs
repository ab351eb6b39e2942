//! A GrpcChannel against a real tonic server over TLS on loopback: server-name checks with
//! the alternative name, the request metadata, and a root file swapped under a channel.

use std::net::SocketAddr;

use ambit_grpc::server::{incoming, test_pki, AcceptOptions, TestPki};
use ambit_grpc::{ChannelConfig, GrpcChannel, RootCa, Token};
use ambit_proto::istio::v1::auth::istio_certificate_service_client::IstioCertificateServiceClient;
use ambit_proto::istio::v1::auth::istio_certificate_service_server::{
    IstioCertificateService, IstioCertificateServiceServer,
};
use ambit_proto::{IstioCertificateRequest, IstioCertificateResponse};
use tokio::net::TcpListener;

/// Answers with the request metadata it saw, one "key=value" per chain element.
struct Echo;

#[tonic::async_trait]
impl IstioCertificateService for Echo {
    async fn create_certificate(
        &self,
        request: tonic::Request<IstioCertificateRequest>,
    ) -> Result<tonic::Response<IstioCertificateResponse>, tonic::Status> {
        let mut seen: Vec<String> = request
            .metadata()
            .iter()
            .filter_map(|kv| match kv {
                tonic::metadata::KeyAndValueRef::Ascii(k, v) => {
                    Some(format!("{}={}", k, v.to_str().unwrap_or("?")))
                }
                _ => None,
            })
            .collect();
        seen.sort();
        Ok(tonic::Response::new(IstioCertificateResponse {
            cert_chain: seen,
        }))
    }
}

async fn serve(pki: &TestPki) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // A failed handshake (the client refused our name) is that client's problem.
    let incoming = incoming(listener, pki.acceptor(), AcceptOptions::default());
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(IstioCertificateServiceServer::new(Echo))
            .serve_with_incoming(incoming),
    );
    addr
}

fn config(addr: SocketAddr, root: RootCa, alt: Option<&str>) -> ChannelConfig {
    ChannelConfig {
        server_identity: None,
        address: format!("{addr}"),
        root,
        alt_hostname: alt.map(str::to_string),
        token: Token::Literal("tok-123".into()),
        cluster_id: "cluster-a".into(),
        headers: vec![("X-Extra".into(), "yes".into())],
    }
}

async fn call(channel: &GrpcChannel) -> Result<Vec<String>, tonic::Status> {
    let mut client = IstioCertificateServiceClient::new(channel.channel().unwrap());
    let request = channel.request(IstioCertificateRequest::default()).unwrap();
    Ok(client
        .create_certificate(request)
        .await?
        .into_inner()
        .cert_chain)
}

#[tokio::test]
async fn the_alternative_name_is_accepted_and_metadata_is_sent() {
    let pki = test_pki(&["istiod.istio-system.svc"]);
    let addr = serve(&pki).await;
    let root = pki.root_pem;

    // By IP the certificate does not match: refused, and the error says so.
    let by_ip = GrpcChannel::new(config(addr, RootCa::Inline(root.clone()), None)).unwrap();
    let err = call(&by_ip).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err}");

    let alt = GrpcChannel::new(config(
        addr,
        RootCa::Inline(root),
        Some("istiod.istio-system.svc"),
    ))
    .unwrap();
    let seen = call(&alt).await.unwrap();
    for want in [
        "authorization=Bearer tok-123",
        "clusterid=cluster-a",
        "x-extra=yes",
    ] {
        assert!(
            seen.iter().any(|s| s == want),
            "{want} missing from {seen:?}"
        );
    }
}

#[tokio::test]
async fn a_server_signed_by_another_root_is_refused() {
    let pki = test_pki(&["localhost"]);
    let other_root = test_pki(&["localhost"]).root_pem;
    let addr = serve(&pki).await;
    let channel =
        GrpcChannel::new(config(addr, RootCa::Inline(other_root), Some("localhost"))).unwrap();
    let err = call(&channel).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err}");
    // The same server, trusted by its own root, answers: the refusal was the root's.
    let trusting = GrpcChannel::new(config(
        addr,
        RootCa::Inline(pki.root_pem.clone()),
        Some("localhost"),
    ))
    .unwrap();
    call(&trusting).await.unwrap();
}

#[tokio::test]
async fn a_swapped_root_file_rebuilds_the_channel() {
    let old_root = test_pki(&["localhost"]).root_pem;
    let pki = test_pki(&["localhost"]);
    let addr = serve(&pki).await;
    let new_root = &pki.root_pem;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("root-cert.pem");
    std::fs::write(&path, &old_root).unwrap();
    let channel =
        GrpcChannel::new(config(addr, RootCa::File(path.clone()), Some("localhost"))).unwrap();
    assert!(
        call(&channel).await.is_err(),
        "the old root must not verify the server"
    );
    // As Kubernetes updates a mounted secret: a new file renamed over the old name.
    let tmp = dir.path().join("..new");
    std::fs::write(&tmp, new_root).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    call(&channel).await.unwrap();
}

#[test]
fn bad_configuration_is_refused_with_the_reason() {
    let addr: SocketAddr = "127.0.0.1:1".parse().unwrap();
    let err = GrpcChannel::new(config(addr, RootCa::Inline("not pem".into()), None)).unwrap_err();
    assert!(err.to_string().contains("root certificate"), "{err}");
    let mut plain = config(addr, RootCa::Inline(test_pki(&["x"]).root_pem), None);
    plain.address = "http://127.0.0.1:1".into();
    let err = GrpcChannel::new(plain).unwrap_err();
    assert!(err.to_string().contains("plaintext"), "{err}");
    let mut header = config(addr, RootCa::Inline(test_pki(&["x"]).root_pem), None);
    header.headers = vec![("bad header".into(), "v".into())];
    assert!(GrpcChannel::new(header)
        .unwrap_err()
        .to_string()
        .contains("bad header"));
    assert_eq!(RootCa::from_env_value(Some("SYSTEM")), RootCa::System);
    assert!(matches!(
        RootCa::from_env_value(Some("-----BEGIN")),
        RootCa::Inline(_)
    ));
}

/// A server whose certificate the mesh CA issued with a SPIFFE id (and no name the client
/// dials): accepted only by a channel expecting exactly that id, host names not looked at.
#[tokio::test]
async fn a_server_identity_is_checked_byte_for_byte_instead_of_its_name() {
    use ambit_identity::{CertificateAuthority, SpiffeId};
    let ca = CertificateAuthority::ephemeral("cluster.local").unwrap();
    let id = SpiffeId::parse("spiffe://cluster.local/ns/istio-system/sa/ambit-control").unwrap();
    let (chain, key, _) = ca
        .issue_server_cert(
            &["not-what-is-dialled.example".to_string()],
            &[],
            Some(&id),
            std::time::Duration::from_secs(3600),
            std::time::SystemTime::now(),
        )
        .unwrap();
    let pki = TestPki {
        root_pem: ca.root_pem(),
        chain,
        key: rustls::pki_types::PrivateKeyDer::Pkcs8(key),
    };
    let addr = serve(&pki).await;
    let expecting = |expected: &str, root: String| {
        let mut cfg = config(addr, RootCa::Inline(root), None);
        cfg.server_identity = Some(SpiffeId::parse(expected).unwrap());
        GrpcChannel::new(cfg).unwrap()
    };
    // By name alone (127.0.0.1 is not in the certificate): refused.
    let by_name = GrpcChannel::new(config(addr, RootCa::Inline(ca.root_pem()), None)).unwrap();
    assert!(call(&by_name).await.is_err());
    // The id it proves: accepted, though the dialled IP is nowhere in the certificate.
    let seen = call(&expecting(&id.to_string(), ca.root_pem()))
        .await
        .unwrap();
    assert!(
        seen.iter().any(|s| s == "authorization=Bearer tok-123"),
        "{seen:?}"
    );
    // Another id, one that differs only in case, or the right id from another root:
    // refused.
    for other in [
        "spiffe://cluster.local/ns/istio-system/sa/istiod",
        "spiffe://cluster.local/ns/istio-system/sa/Ambit-control",
    ] {
        let err = call(&expecting(other, ca.root_pem())).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unavailable, "{other}: {err}");
    }
    let stranger = CertificateAuthority::ephemeral("cluster.local").unwrap();
    assert!(call(&expecting(&id.to_string(), stranger.root_pem()))
        .await
        .is_err());
}
