//! The in-pod workload manager against a scripted node agent, as root: a real network
//! namespace handed over ZDS, listeners created inside it, and bad messages NACKed (then
//! the stream starts over) without disturbing the pods already served.

use std::os::fd::AsFd;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ambit_identity::{CertManager, CertificateAuthority};
use ambit_nodeproxy::metrics::Metrics;
use ambit_nodeproxy::pods::{InpodMetrics, PodProxyFactory, WorkloadManager};
use ambit_nodeproxy::settings::ProxyConfig;
use ambit_nodeproxy::SharedState;
use ambit_zds::proto::WorkloadInfo;
use ambit_zds::protocol::{
    decode_hello, decode_response, encode_add, encode_del, encode_snapshot_sent,
};
use ambit_zds::{Netns, ZdsListener, ZdsSocket};
use prometheus_client::registry::Registry;

struct TempNetns(String);

impl TempNetns {
    fn new() -> TempNetns {
        assert!(
            nix::unistd::geteuid().is_root(),
            "this test needs root: it creates a network namespace"
        );
        let name = format!(
            "ambit-mgr-{}-{:04x}",
            std::process::id(),
            rand::random::<u16>()
        );
        let ok = Command::new("ip")
            .args(["netns", "add", &name])
            .status()
            .unwrap()
            .success();
        assert!(ok, "ip netns add {name} failed");
        let ns = TempNetns(name);
        let ok = Command::new("ip")
            .args(["-n", &ns.0, "link", "set", "lo", "up"])
            .status()
            .unwrap()
            .success();
        assert!(ok);
        ns
    }

    fn netns(&self) -> Netns {
        Netns::open(format!("/var/run/netns/{}", self.0)).unwrap()
    }
}

impl Drop for TempNetns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

const CONFIG: &str = r#"
workloads:
- uid: cluster1//v1/Pod/default/web
  name: web
  namespace: default
  serviceAccount: web
  workloadIps: ["10.99.0.5"]
  protocol: HBONE
  node: n1
"#;

async fn ack(agent: &ZdsSocket) -> Result<(), String> {
    let (bytes, _) = tokio::time::timeout(Duration::from_secs(5), agent.recv())
        .await
        .expect("an answer within 5 s")
        .expect("a datagram");
    decode_response(&bytes).expect("a WorkloadResponse")
}

fn hbone_listener_up(ns: &Netns) -> bool {
    ns.run_in(|| {
        Ok(std::net::TcpStream::connect_timeout(
            &"127.0.0.1:15008".parse().unwrap(),
            Duration::from_secs(1),
        )
        .is_ok())
    })
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_datagram_is_nacked_then_the_stream_restarts_and_served_pods_keep_their_proxy() {
    let pod_ns = TempNetns::new();
    let dir = tempfile::tempdir().unwrap();
    let uds = dir.path().join("ztunnel.sock");
    let listener = ZdsListener::bind(&uds).unwrap();

    let state = ambit_state::parse_local_config("test", CONFIG).unwrap();
    let state = SharedState::new(ambit_state::ProxyState::from_config(state).unwrap());
    let ca = Arc::new(CertificateAuthority::ephemeral("cluster.local").unwrap());
    let mut registry = Registry::default();
    let factory = PodProxyFactory {
        cfg: Arc::new(ProxyConfig::default()),
        state,
        certs: CertManager::new(ca, Duration::from_secs(3600)),
        metrics: Metrics::register(&mut registry, "test"),
        node: Some("n1".into()),
        mark: 0x539,
        reuse_port: true,
        handshakes: ambit_nodeproxy::admission::NodeHandshakes::new(64),
        dns: None,
        on_demand: None,
    };
    let ready = Arc::new(AtomicBool::new(false));
    let ready_flag = ready.clone();
    let manager = WorkloadManager::new(
        uds,
        factory,
        InpodMetrics::register(&mut registry),
        Box::new(move |r| ready_flag.store(r, Ordering::SeqCst)),
        Duration::from_secs(1),
    );
    let (trigger, watcher) = ambit_runtime::drain::new();
    let run = tokio::spawn(manager.run(watcher));

    let agent = listener.accept().await.unwrap();
    let (hello, _) = agent.recv().await.unwrap();
    assert!(decode_hello(&hello).is_ok());

    let info = WorkloadInfo {
        name: "web".into(),
        namespace: "default".into(),
        service_account: "web".into(),
    };
    let netns = pod_ns.netns();
    agent
        .send(&encode_add("uid-web", &info), Some(netns.as_fd()))
        .await
        .unwrap();
    assert_eq!(ack(&agent).await, Ok(()));
    agent.send(&encode_snapshot_sent(), None).await.unwrap();
    assert_eq!(ack(&agent).await, Ok(()));
    assert!(
        ready.load(Ordering::SeqCst),
        "ready after the snapshot with every pod up"
    );
    assert!(
        hbone_listener_up(&netns),
        "the pod's HBONE listener lives in its namespace"
    );

    // A datagram that is not a WorkloadRequest: NACKed, then the stream starts over (as
    // ztunnel does), and the pod is still served.
    agent.send(&[0xff, 0xff, 0xff, 0x01], None).await.unwrap();
    let nack = ack(&agent).await.unwrap_err();
    assert!(nack.contains("decode"), "{nack}");
    assert!(hbone_listener_up(&netns));
    let agent = listener.accept().await.unwrap();
    let (hello, _) = agent.recv().await.unwrap();
    assert!(
        decode_hello(&hello).is_ok(),
        "a fresh hello after the reconnect"
    );
    agent
        .send(&encode_add("uid-web", &info), Some(netns.as_fd()))
        .await
        .unwrap();
    assert_eq!(ack(&agent).await, Ok(()));
    agent.send(&encode_snapshot_sent(), None).await.unwrap();
    assert_eq!(ack(&agent).await, Ok(()));
    assert!(hbone_listener_up(&netns), "the replayed pod kept its proxy");

    // An unknown workload cannot start: NACKed with the reason, and it stays pending.
    let ghost = WorkloadInfo {
        name: "ghost".into(),
        namespace: "default".into(),
        service_account: "ghost".into(),
    };
    agent
        .send(&encode_add("uid-ghost", &ghost), Some(netns.as_fd()))
        .await
        .unwrap();
    let nack = ack(&agent).await.unwrap_err();
    assert!(nack.starts_with("failure to start proxy : "), "{nack}");
    assert!(
        !ready.load(Ordering::SeqCst),
        "not ready while a pod is pending"
    );
    agent.send(&encode_del("uid-ghost"), None).await.unwrap();
    assert_eq!(ack(&agent).await, Ok(()));

    // The pod is gone: its listeners close at once.
    agent.send(&encode_del("uid-web"), None).await.unwrap();
    assert_eq!(ack(&agent).await, Ok(()));
    let mut closed = false;
    for _ in 0..50 {
        if !hbone_listener_up(&netns) {
            closed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(closed, "the pod's listeners outlived DelWorkload");

    trigger.drain(Duration::from_secs(1)).await;
    run.await.unwrap().unwrap();
}
