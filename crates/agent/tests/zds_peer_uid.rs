//! The agent's check of the node proxy that connects to its ZDS socket, against a proxy
//! really run by another uid (root only: the proxy is a child process started as `nobody`).
//!
//! The socket's 0600 mode already keeps `nobody` out; the test loosens it (0666, a
//! directory anyone may traverse), as a misconfiguration would, to reach the second fence:
//! `SO_PEERCRED`. The child is this test binary run again with `CHILD_ENV` set, as uid/gid
//! 65534: it connects, says hello, and prints what it got back.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use ambit_agent::zds::{ZdsOptions, ZdsServer};
use ambit_cni::api::PodInfo;
use ambit_inpod::protocol::{decode_request, encode_ack, encode_hello};
use ambit_inpod::{PeerPolicy, WireError, ZdsSocket};
use common::require_root;

const CHILD_ENV: &str = "AMBIT_AGENT_PEER_CHILD_CONNECT";
const NOBODY: u32 = 65534;

/// The child's role; a no-op in a normal test run. Prints one `AMBIT-CHILD ...` line.
#[test]
fn child_process_role() {
    let Ok(path) = std::env::var(CHILD_ENV) else {
        return;
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let outcome = rt.block_on(async {
        let sock = match ZdsSocket::connect(&path).await {
            Ok(s) => s,
            Err(e) => return format!("CONNECT-FAILED {e}"),
        };
        if let Err(e) = sock.send(&encode_hello(), None).await {
            return format!("HELLO-FAILED {e}");
        }
        let mut kinds = Vec::new();
        loop {
            match tokio::time::timeout(Duration::from_secs(5), sock.recv()).await {
                Err(_) => return format!("SILENT after {kinds:?}"),
                Ok(Err(WireError::PeerClosed)) => return format!("CLOSED after {kinds:?}"),
                Ok(Err(e)) => return format!("ERROR {e}"),
                Ok(Ok((bytes, fds))) => {
                    let kind = decode_request(&bytes, fds)
                        .map(|m| m.kind())
                        .unwrap_or("garbage");
                    kinds.push(kind);
                    let _ = sock.send(&encode_ack(None), None).await;
                    if kind == "SnapshotSent" {
                        return format!("SNAPSHOT {kinds:?}");
                    }
                }
            }
        }
    });
    println!("\nAMBIT-CHILD {outcome}");
}

/// Runs the child proxy as `nobody` against `path`; returns its outcome line.
async fn proxy_as_nobody(path: &Path) -> String {
    let exe = std::env::current_exe().unwrap();
    let path = path.to_owned();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(&exe)
            .args(["--exact", "child_process_role", "--nocapture"])
            .args(["--test-threads", "1"])
            .env(CHILD_ENV, &path)
            .uid(NOBODY)
            .gid(NOBODY)
            .output()
            .unwrap_or_else(|e| panic!("start {} as uid 65534: {e}", exe.display()))
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("AMBIT-CHILD "))
        .unwrap_or_else(|| {
            panic!(
                "the child proxy (uid 65534) reported nothing; stdout: {stdout} stderr: {}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
        .to_owned()
}

fn pod(uid: &str) -> PodInfo {
    PodInfo {
        uid: uid.into(),
        name: uid.into(),
        namespace: "ns".into(),
        service_account: "sa".into(),
        netns: "/proc/self/ns/net".into(),
        ips: vec!["10.0.0.1".parse().unwrap()],
        container_id: String::new(),
    }
}

/// A server whose socket `nobody` can reach (the misconfiguration the peer check is for).
fn loosened_server(dir: &Path, peers: PeerPolicy) -> ZdsServer {
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711)).unwrap();
    let path = dir.join("ztunnel/ztunnel.sock");
    let server = ZdsServer::bind_with(&path, [pod("p1")], ZdsOptions::default(), peers).unwrap();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&path), 0o600, "as bound");
    assert_eq!(mode(&dir.join("ztunnel")), 0o700, "as created");
    std::fs::set_permissions(dir.join("ztunnel"), std::fs::Permissions::from_mode(0o711)).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
    server
}

#[tokio::test]
async fn a_proxy_run_by_another_uid_is_refused() {
    require_root("a_proxy_run_by_another_uid_is_refused");
    let dir = tempfile::tempdir().unwrap();

    // The mode alone keeps nobody out.
    let path = dir.path().join("strict/ztunnel.sock");
    let _strict = ZdsServer::bind(&path, []).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let outcome = proxy_as_nobody(&path).await;
    assert!(outcome.starts_with("CONNECT-FAILED"), "{outcome}");

    // Past a loosened mode, the peer check refuses it before it hears of any pod.
    let server = loosened_server(dir.path(), PeerPolicy::new(None));
    let outcome = proxy_as_nobody(server.path()).await;
    // Closed at accept: the hello may not even get out, and a hello the agent never read
    // turns the close into a reset.
    assert!(
        outcome == "CLOSED after []"
            || outcome.starts_with("HELLO-FAILED")
            || (outcome.starts_with("ERROR") && outcome.contains("reset by peer")),
        "{outcome}"
    );
    assert_eq!(server.connected_proxies(), 0);
}

#[tokio::test]
async fn a_proxy_run_by_the_configured_uid_is_served() {
    require_root("a_proxy_run_by_the_configured_uid_is_served");
    let dir = tempfile::tempdir().unwrap();
    let server = loosened_server(dir.path(), PeerPolicy::new(Some(NOBODY)));
    let outcome = proxy_as_nobody(server.path()).await;
    assert_eq!(outcome, r#"SNAPSHOT ["AddWorkload", "SnapshotSent"]"#);
}
