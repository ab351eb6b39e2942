//! `ambit ztunnel` with `CA_ADDRESS`: the proxy's certificate comes from a small Istio CA
//! on 127.0.0.1 (tonic over TLS, signing with `CertificateAuthority::sign_request`), with
//! the configured token, cluster id and headers; the certificate shows in `/config_dump`
//! and its expiry on `/metrics`. No root needed: dedicated mode on loopback.

#[path = "../../caclient/tests/support/mod.rs"]
mod support;

use ambit_netns_lab::free_port;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const SERVER_ID: &str = "spiffe://cluster.local/ns/default/sa/server";

fn get(addr: SocketAddr, path: &str) -> Option<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

/// The `certificates` of a `/config_dump` answer (its body is one JSON document).
fn certificates(response: &str) -> Option<Vec<serde_json::Value>> {
    let body = &response[response.find("\r\n\r\n")? + 4..];
    let start = body.find('{')?;
    let end = body.rfind('}')?;
    let v: serde_json::Value = serde_json::from_str(&body[start..=end]).ok()?;
    v["certificates"].as_array().cloned()
}

struct Kill(Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_fetches_its_certificate_from_the_ca() {
    let ca = support::start_ca().await;
    let (hbone, admin, stats) = (free_port(), free_port(), free_port());
    let yaml = "workloads:\n- {uid: s, name: server, namespace: default, serviceAccount: server, protocol: HBONE, workloadIps: [\"127.0.0.1\"]}\n";
    let child = Command::new(env!("CARGO_BIN_EXE_ambit"))
        .arg("ztunnel")
        .env_clear()
        .envs([
            ("PROXY_MODE", "dedicated"),
            ("PROXY_WORKLOAD_INFO", "default/server/server"),
            ("LOCAL_XDS", yaml),
            ("CA_ADDRESS", &format!("127.0.0.1:{}", ca.addr.port())),
            ("CA_ROOT_CA", &ca.root_pem),
            ("ALT_CA_HOSTNAME", support::CA_NAME),
            ("AUTH_TOKEN", "jwt-e2e"),
            ("CLUSTER_ID", "cluster-e2e"),
            ("CA_HEADER_x-extra", "yes"),
            ("SECRET_TTL", "2h"),
            ("IPV6_ENABLED", "false"),
            ("AMBIT_HBONE_PORT", &hbone.to_string()),
            ("AMBIT_OUTBOUND_PORT", &free_port().to_string()),
            ("AMBIT_INBOUND_PLAINTEXT_PORT", &free_port().to_string()),
            ("AMBIT_ADMIN_ADDR", &format!("127.0.0.1:{admin}")),
            ("AMBIT_STATS_ADDR", &format!("127.0.0.1:{stats}")),
            (
                "AMBIT_READINESS_ADDR",
                &format!("127.0.0.1:{}", free_port()),
            ),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("run ambit");
    let _child = Kill(child);
    let admin = SocketAddr::from(([127, 0, 0, 1], admin));
    let stats = SocketAddr::from(([127, 0, 0, 1], stats));
    let hbone = SocketAddr::from(([127, 0, 0, 1], hbone));
    // A TLS client on the HBONE port makes the proxy fetch its certificate (the first
    // attempts may come before the listeners are up).
    let deadline = Instant::now() + Duration::from_secs(30);
    let dump = loop {
        assert!(Instant::now() < deadline, "no certificate in /config_dump");
        let _ = ambit_netns_lab::send_client_hello(hbone);
        if let Some(dump) = get(admin, "/config_dump").and_then(|r| certificates(&r)) {
            if dump
                .iter()
                .any(|c| c["identity"] == SERVER_ID && c["state"] == "Available")
            {
                break dump;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let cert = dump.iter().find(|c| c["identity"] == SERVER_ID).unwrap();
    // The chain's last entries are the CA's roots: our test CA's.
    let want = ambit_identity::CertInfo::of(&ca.ca.ca.roots()[0]).pem;
    assert_eq!(cert["rootCerts"][0]["pem"], want.as_str(), "{cert}");
    let seen = ca.ca.seen.lock().unwrap().clone();
    assert!(!seen.is_empty());
    let s = &seen[0];
    assert_eq!(s.authorization.as_deref(), Some("Bearer jwt-e2e"));
    assert_eq!(s.clusterid.as_deref(), Some("cluster-e2e"));
    assert_eq!(s.extra.as_deref(), Some("yes"));
    // Dedicated mode asks for its own identity: no impersonation.
    assert_eq!(s.impersonated, None);
    assert_eq!(s.metadata_fields, 0);
    assert_eq!(s.validity, 7200);
    let metrics = get(stats, "/metrics").unwrap();
    assert!(
        metrics.contains(&format!(
            "ambit_certificate_expiration_timestamp_seconds{{identity=\"{SERVER_ID}\"}}"
        )),
        "{metrics}"
    );
}
