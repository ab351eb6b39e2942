//! Fetching key sets from real servers on loopback (127.0.0.1, port 0): HTTPS with a test
//! CA made here (rcgen), and servers that are down, slow, answer garbage, too much, or
//! another status. Outcomes are asserted; the only times are generous deadlines against
//! hangs and the (short) fetch timeout under test.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::RootCertStore;
use serde_json::json;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;

use super::*;
use crate::jwks::Alg;
use crate::keys::{JwksCache, KeySource};
use crate::rule::{JwtRule, JwtSpec};
use crate::testkeys::{jwks, TestKey};
use crate::{authenticate, Outcome, Reason};

/// Against hangs only.
const DEADLINE: Duration = Duration::from_secs(60);

/// What a test server answers to each request.
#[derive(Clone)]
enum Answer {
    /// 200 with this body.
    Body(String),
    /// 200 announcing a body of this many bytes, then nothing.
    Announce(usize),
    /// 200, chunked, 16 KiB chunks until the client goes away (at most 64 MiB).
    Endless,
    /// Reads the request and never answers.
    Silent,
    /// This status, empty body.
    Status(u16),
}

/// A test CA and a server certificate for 127.0.0.1 it signed.
struct Pki {
    roots: RootCertStore,
    chain: Vec<CertificateDer<'static>>,
    key: Vec<u8>,
}

fn pki() -> Pki {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca.self_signed(&ca_key).unwrap();
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&leaf_key, &ca, &ca_key)
        .unwrap();
    let mut roots = RootCertStore::empty();
    roots.add(ca.der().clone()).unwrap();
    Pki {
        roots,
        chain: vec![leaf.der().clone()],
        key: leaf_key.serialize_der(),
    }
}

/// Serves `answers` in turn (the last one again once they run out), over TLS when `pki`
/// is given. Returns the address and the server task (aborted when dropped).
async fn serve(pki: Option<&Pki>, answers: Vec<Answer>) -> (SocketAddr, AbortOnDrop) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let acceptor = pki.map(|p| {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                p.chain.clone(),
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(p.key.clone())),
            )
            .unwrap();
        tokio_rustls::TlsAcceptor::from(Arc::new(config))
    });
    let answers = Arc::new(Mutex::new(answers));
    let task = tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let answer = {
                let mut a = answers.lock().unwrap();
                if a.len() > 1 {
                    a.remove(0)
                } else {
                    a[0].clone()
                }
            };
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                match acceptor {
                    Some(acceptor) => {
                        if let Ok(tls) = acceptor.accept(tcp).await {
                            respond(tls, answer).await;
                        }
                    }
                    None => respond(tcp, answer).await,
                }
            });
        }
    });
    (addr, AbortOnDrop(task))
}

async fn respond<S: AsyncRead + AsyncWrite + Unpin>(mut io: S, answer: Answer) {
    // The request head.
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match io.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let _ = match answer {
        Answer::Body(body) => {
            let r = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            io.write_all(r.as_bytes()).await
        }
        Answer::Announce(n) => {
            let r = format!("HTTP/1.1 200 OK\r\ncontent-length: {n}\r\n\r\n");
            io.write_all(r.as_bytes()).await
        }
        Answer::Endless => {
            let _ = io
                .write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
                .await;
            let chunk = format!("4000\r\n{}\r\n", "a".repeat(0x4000));
            for _ in 0..4096 {
                if io.write_all(chunk.as_bytes()).await.is_err() {
                    return;
                }
            }
            Ok(())
        }
        Answer::Silent => {
            tokio::time::sleep(DEADLINE).await;
            Ok(())
        }
        Answer::Status(code) => {
            let r = format!("HTTP/1.1 {code} Nope\r\ncontent-length: 0\r\n\r\n");
            io.write_all(r.as_bytes()).await
        }
    };
    let _ = io.shutdown().await;
}

fn config(roots: RootCertStore) -> FetchConfig {
    FetchConfig {
        // Short, so the slow server's case ends soon; nothing asserts how long it took.
        timeout: Duration::from_millis(500),
        refresh: Duration::from_millis(50),
        retry: Duration::from_millis(10),
        ..FetchConfig::new(roots).unwrap()
    }
}

fn key() -> TestKey {
    TestKey::new(Alg::ES256, "fetched")
}

fn good_jwks() -> String {
    jwks(&[key().jwk()])
}

/// A token of issuer `iss` signed by [`key`], checked against a rule whose keys are
/// `source`.
fn check(source: KeySource) -> Outcome {
    let rule = JwtRule::new(
        JwtSpec {
            issuer: "iss".into(),
            ..JwtSpec::default()
        },
        source,
    )
    .unwrap();
    let token = key().token(&json!({"iss": "iss", "sub": "s"}));
    let mut headers = http::HeaderMap::new();
    headers.insert(
        http::header::AUTHORIZATION,
        format!("Bearer {token}").parse().unwrap(),
    );
    authenticate(&[rule], &headers, None, SystemTime::now())
}

async fn within<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(DEADLINE, f)
        .await
        .expect("the test hung")
}

#[tokio::test]
async fn a_good_set_over_https_verifies_tokens() {
    within(async {
        let pki = pki();
        let (addr, _server) = serve(Some(&pki), vec![Answer::Body(good_jwks())]).await;
        let remote =
            RemoteJwks::new(&format!("https://{addr}/jwks.json"), config(pki.roots)).unwrap();
        let source = KeySource::Remote(remote.clone());
        // Before any fetch: refused, never allowed.
        match check(source.clone()) {
            Outcome::Refused(r) => assert_eq!(r.reason, Reason::JwksFetchFailed),
            other => panic!("{other:?}"),
        }
        remote.refresh().await.unwrap();
        assert!(matches!(remote.state(), RemoteState::Ready(_)));
        assert!(matches!(check(source), Outcome::Authenticated { .. }));
    })
    .await;
}

#[tokio::test]
async fn plain_http_is_fetched_too() {
    within(async {
        let (addr, _server) = serve(None, vec![Answer::Body(good_jwks())]).await;
        let set = fetch_jwks(&format!("http://{addr}/"), &config(RootCertStore::empty()))
            .await
            .unwrap();
        assert_eq!(set.keys()[0].kid(), Some("fetched"));
    })
    .await;
}

/// What a failure must be.
type Expect = fn(&FetchError) -> bool;

/// Each failing server: its error, and a rule that never had keys refuses tokens.
#[tokio::test]
async fn failing_servers_leave_the_rule_refusing() {
    within(async {
        let pki = pki();
        // A port nothing listens on any more.
        let down = {
            let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
            l.local_addr().unwrap()
        };
        let cases: Vec<(&str, Option<Answer>, Expect)> = vec![
            ("down", None, |e| matches!(e, FetchError::Connect { .. })),
            ("slow", Some(Answer::Silent), |e| {
                matches!(e, FetchError::Timeout { .. })
            }),
            (
                "garbage",
                Some(Answer::Body("this is not json".into())),
                |e| {
                    matches!(
                        e,
                        FetchError::Jwks {
                            error: JwksError::NotJson(_),
                            ..
                        }
                    )
                },
            ),
            (
                "no usable key",
                Some(Answer::Body(jwks(&[json!({"kty": "oct"})]))),
                |e| {
                    matches!(
                        e,
                        FetchError::Jwks {
                            error: JwksError::NoUsableKey(_),
                            ..
                        }
                    )
                },
            ),
            ("too much, streamed", Some(Answer::Endless), |e| {
                matches!(
                    e,
                    FetchError::TooLarge {
                        limit: MAX_JWKS_BYTES,
                        ..
                    }
                )
            }),
            (
                "too much, announced",
                Some(Answer::Announce(MAX_JWKS_BYTES + 1)),
                |e| matches!(e, FetchError::TooLarge { .. }),
            ),
            (
                "not found",
                Some(Answer::Status(404)),
                |e| matches!(e, FetchError::Status { status, .. } if status.as_u16() == 404),
            ),
        ];
        for (name, answer, expected) in cases {
            let (addr, _server) = match answer {
                Some(a) => {
                    let (addr, s) = serve(Some(&pki), vec![a]).await;
                    (addr, Some(s))
                }
                None => (down, None),
            };
            let remote =
                RemoteJwks::new(&format!("https://{addr}/jwks"), config(pki.roots.clone()))
                    .unwrap();
            let err = remote.refresh().await.unwrap_err();
            assert!(expected(&err), "{name}: {err}");
            assert!(matches!(remote.state(), RemoteState::Failed(_)), "{name}");
            match check(KeySource::Remote(remote)) {
                Outcome::Refused(r) => assert_eq!(r.reason, Reason::JwksFetchFailed, "{name}"),
                other => panic!("{name}: {other:?}"),
            }
        }
    })
    .await;
}

#[tokio::test]
async fn an_untrusted_server_is_refused() {
    within(async {
        let pki = pki();
        let (addr, _server) = serve(Some(&pki), vec![Answer::Body(good_jwks())]).await;
        let other_ca = self::pki().roots;
        let err = fetch_jwks(&format!("https://{addr}/"), &config(other_ca))
            .await
            .unwrap_err();
        assert!(matches!(err, FetchError::Tls { .. }), "{err}");
    })
    .await;
}

#[tokio::test]
async fn a_failed_refresh_keeps_the_last_good_set_and_a_new_one_replaces_it() {
    within(async {
        let pki = pki();
        let rotated = TestKey::new(Alg::EdDSA, "rotated");
        let (addr, _server) = serve(
            Some(&pki),
            vec![
                Answer::Body(good_jwks()),
                Answer::Body("garbage".into()),
                Answer::Status(503),
                Answer::Body(jwks(&[rotated.jwk()])),
            ],
        )
        .await;
        let remote = RemoteJwks::new(&format!("https://{addr}/"), config(pki.roots)).unwrap();
        remote.refresh().await.unwrap();
        assert!(remote.refresh().await.is_err());
        assert!(remote.refresh().await.is_err());
        // Still the first set: the token verifies.
        assert!(matches!(
            check(KeySource::Remote(remote.clone())),
            Outcome::Authenticated { .. }
        ));
        remote.refresh().await.unwrap();
        let RemoteState::Ready(set) = remote.state() else {
            panic!("ready expected")
        };
        assert_eq!(set.keys()[0].kid(), Some("rotated"));
        match check(KeySource::Remote(remote)) {
            Outcome::Refused(r) => assert_eq!(r.reason, Reason::KidAlgMismatch),
            other => panic!("{other:?}"),
        }
    })
    .await;
}

#[tokio::test]
async fn the_cache_shares_one_set_per_uri_and_stops_when_unused() {
    within(async {
        let pki = pki();
        let (addr, _server) = serve(Some(&pki), vec![Answer::Body(good_jwks())]).await;
        let cache = JwksCache::new(config(pki.roots));
        let uri = format!("https://{addr}/jwks");
        let a = cache.source(&uri, DEFAULT_FETCH_TIMEOUT).unwrap();
        let b = cache.source(&uri, DEFAULT_FETCH_TIMEOUT).unwrap();
        let (KeySource::Remote(ra), KeySource::Remote(rb)) = (&a, &b) else {
            panic!("remote sources expected")
        };
        assert!(Arc::ptr_eq(ra, rb));
        let rule = JwtRule::new(
            JwtSpec {
                issuer: "iss".into(),
                ..JwtSpec::default()
            },
            a.clone(),
        )
        .unwrap();
        // The refresher spawned by the cache fetches; keys_ready waits for it.
        crate::keys_ready(std::slice::from_ref(&rule)).await;
        assert!(matches!(check(a.clone()), Outcome::Authenticated { .. }));
        assert!(matches!(
            cache.source("ftp://x/", DEFAULT_FETCH_TIMEOUT),
            Err(FetchError::BadUri { .. })
        ));

        // Every holder gone: the refresher ends.
        let handle = ra.spawn_refresher();
        drop((a, b, rule));
        handle.await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn an_issuer_without_jwks_is_found_through_its_discovery_document() {
    within(async {
        let pki = pki();
        let (keys, _k) = serve(Some(&pki), vec![Answer::Body(good_jwks())]).await;
        let doc = json!({"issuer": "x", "jwks_uri": format!("https://{keys}/keys")});
        let (idp, _d) = serve(Some(&pki), vec![Answer::Body(doc.to_string())]).await;
        let cache = JwksCache::new(config(pki.roots.clone()));
        let source = cache
            .discovered(&format!("https://{idp}/realm/"), DEFAULT_FETCH_TIMEOUT)
            .unwrap();
        let KeySource::Remote(remote) = &source else {
            panic!("remote expected")
        };
        remote.ready().await;
        assert!(matches!(
            check(source.clone()),
            Outcome::Authenticated { .. }
        ));
        assert_eq!(
            discovery_uri("https://idp/realm/"),
            "https://idp/realm/.well-known/openid-configuration"
        );

        // A discovery document that names no key set.
        let (bad, _b) = serve(Some(&pki), vec![Answer::Body("{}".into())]).await;
        let err = fetch_discovered(&format!("https://{bad}"), &config(pki.roots))
            .await
            .unwrap_err();
        assert!(matches!(err, FetchError::Discovery { .. }), "{err}");
    })
    .await;
}

#[test]
fn uris() {
    let t = target("https://idp.example.com/.well-known/jwks.json?x=1").unwrap();
    assert!(t.https);
    assert_eq!((t.host.as_str(), t.port), ("idp.example.com", 443));
    assert_eq!(t.path, "/.well-known/jwks.json?x=1");
    let t = target("http://[::1]:8080").unwrap();
    assert_eq!((t.host.as_str(), t.port, t.https), ("::1", 8080, false));
    assert_eq!((t.path.as_str(), t.authority.as_str()), ("/", "[::1]:8080"));
    for bad in ["ftp://x/", "/relative", "https://user@x/", "not a uri"] {
        assert!(
            matches!(target(bad), Err(FetchError::BadUri { .. })),
            "{bad}"
        );
    }
}
