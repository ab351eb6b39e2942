//! The whole agent, for real (root only): a "host" and pods as throwaway network namespaces,
//! the events socket driven with the CNI plugin's client, a node proxy played by the test.

mod common;

use std::path::Path;
use std::time::Duration;

use ambit_agent::iptables::ProbeSetNames;
use ambit_agent::zds::ZdsOptions;
use ambit_agent::{run_with, uninstall_host, AgentConfig, RunOptions};
use ambit_cni::api::{call, AgentCallError, AgentRequest, AgentResponse, PodInfo};
use ambit_zds::protocol::{decode_request, encode_ack, encode_hello};
use ambit_zds::{Incoming, Netns, ZdsSocket};
use common::{require_root, TestNetns};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

struct FakeProxy {
    sock: ZdsSocket,
}

impl FakeProxy {
    async fn connect(path: &Path) -> FakeProxy {
        let sock = ZdsSocket::connect(path).await.unwrap();
        sock.send(&encode_hello(), None).await.unwrap();
        FakeProxy { sock }
    }

    async fn recv(&self) -> Incoming {
        let (bytes, fds) = tokio::time::timeout(Duration::from_secs(10), self.sock.recv())
            .await
            .expect("nothing from the agent within 10 s")
            .unwrap();
        decode_request(&bytes, fds).unwrap()
    }

    async fn ack(&self) {
        self.sock.send(&encode_ack(None), None).await.unwrap();
    }

    /// Acks the snapshot; returns the Add'ed uids with the netns identity they came with.
    async fn take_snapshot(&self) -> Vec<(String, ambit_zds::NetnsId)> {
        let mut adds = Vec::new();
        loop {
            let msg = self.recv().await;
            self.ack().await;
            match msg {
                Incoming::Add { uid, netns, .. } => {
                    adds.push((uid, Netns::from_fd(netns).unwrap().id()))
                }
                Incoming::SnapshotSent => return adds,
                other => panic!("unexpected {other:?} in the snapshot"),
            }
        }
    }
}

struct Env {
    _dir: tempfile::TempDir,
    cfg: AgentConfig,
    opts: RunOptions,
}

impl Env {
    fn new(host: &TestNetns) -> Env {
        let dir = tempfile::tempdir().unwrap();
        let cfg = AgentConfig {
            zds_socket: dir.path().join("ztunnel/ztunnel.sock"),
            events_socket: dir.path().join("run/cni.sock"),
            state_dir: dir.path().join("state"),
            ipv6: true,
            dns_capture: true,
            zds_proxy_uid: None,
        };
        let opts = RunOptions {
            host_netns: Some(host.path()),
            probe_sets: ProbeSetNames::default(),
            zds: ZdsOptions {
                hello_timeout: Duration::from_secs(2),
                ack_timeout: Duration::from_secs(2),
            },
        };
        Env {
            _dir: dir,
            cfg,
            opts,
        }
    }

    /// Starts the agent and waits until its events socket answers.
    async fn start(&self) -> Running {
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(run_with(self.cfg.clone(), self.opts.clone(), async {
            let _ = stopped.await;
        }));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            if task.is_finished() {
                panic!("agent exited: {:?}", task.await);
            }
            if self.request(AgentRequest::List).await.is_ok() {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "agent did not start"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Running { stop, task }
    }

    async fn request(&self, req: AgentRequest) -> Result<AgentResponse, AgentCallError> {
        let socket = self.cfg.events_socket.clone();
        tokio::task::spawn_blocking(move || call(&socket, &req, Duration::from_secs(10)))
            .await
            .unwrap()
    }

    async fn list(&self) -> Vec<String> {
        let mut uids: Vec<String> = self
            .request(AgentRequest::List)
            .await
            .unwrap()
            .pods
            .into_iter()
            .map(|p| p.uid)
            .collect();
        uids.sort();
        uids
    }
}

struct Running {
    stop: oneshot::Sender<()>,
    task: JoinHandle<anyhow::Result<()>>,
}

impl Running {
    async fn stop(self) {
        let _ = self.stop.send(());
        tokio::time::timeout(Duration::from_secs(20), self.task)
            .await
            .expect("agent did not stop")
            .unwrap()
            .unwrap();
    }
}

fn pod(uid: &str, ns: &TestNetns, ip: &str) -> PodInfo {
    PodInfo {
        uid: uid.into(),
        name: format!("web-{uid}"),
        namespace: "shop".into(),
        service_account: "web".into(),
        netns: ns.path().display().to_string(),
        ips: vec![ip.parse().unwrap()],
        container_id: format!("sandbox-{uid}"),
    }
}

fn ipset_members(host: &TestNetns, name: &str) -> String {
    host.exec(&["ipset", "save", name])
        .lines()
        .filter(|l| l.starts_with("add "))
        .map(|l| format!("{l}\n"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enroll_restart_and_remove() {
    require_root("enroll_restart_and_remove");
    let host = TestNetns::new();
    let pod_a_ns = TestNetns::new();
    let pod_b_ns = TestNetns::new();
    let env = Env::new(&host);

    // ---- first run: enroll pod a with a proxy connected --------------------------------
    let agent = env.start().await;
    let events_mode = std::fs::metadata(&env.cfg.events_socket).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&events_mode.permissions()) & 0o777,
        0o600
    );
    let host_nat = host.saved(false);
    assert!(
        host_nat.contains("-A POSTROUTING -j ISTIO_POSTRT"),
        "{host_nat}"
    );
    assert!(host.saved(true).contains("istio-inpod-probes-v6"));

    let proxy = FakeProxy::connect(&env.cfg.zds_socket).await;
    assert!(proxy.take_snapshot().await.is_empty());

    let a = pod("uid-a", &pod_a_ns, "10.44.0.5");
    let (reply, msg) = tokio::join!(env.request(AgentRequest::Add(a.clone())), async {
        let msg = proxy.recv().await;
        proxy.ack().await;
        msg
    });
    reply.unwrap();
    match msg {
        Incoming::Add { uid, info, netns } => {
            assert_eq!(uid, "uid-a");
            assert_eq!(info.name, "web-uid-a");
            assert_eq!(info.namespace, "shop");
            assert_eq!(info.service_account, "web");
            assert_eq!(
                Netns::from_fd(netns).unwrap().id(),
                Netns::open(pod_a_ns.path()).unwrap().id()
            );
        }
        other => panic!("expected AddWorkload, got {other:?}"),
    }
    let rules_v4 = pod_a_ns.saved(false);
    let rules_v6 = pod_a_ns.saved(true);
    assert!(rules_v4.contains("--to-ports 15001"), "{rules_v4}");
    assert!(rules_v6.contains("--to-ports 15006"), "{rules_v6}");
    assert_eq!(
        ipset_members(&host, "istio-inpod-probes-v4"),
        "add istio-inpod-probes-v4 10.44.0.5 comment \"uid-a\"\n"
    );

    // Adding again (a runtime retry) is fine and changes nothing.
    let (reply, _) = tokio::join!(env.request(AgentRequest::Add(a.clone())), async {
        assert_eq!(proxy.recv().await.uid(), Some("uid-a"));
        proxy.ack().await;
    });
    reply.unwrap();
    assert_eq!(pod_a_ns.saved(false), rules_v4);

    // A NACK from the proxy is the caller's error (the runtime retries the sandbox).
    let (reply, _) = tokio::join!(env.request(AgentRequest::Add(a.clone())), async {
        assert_eq!(proxy.recv().await.uid(), Some("uid-a"));
        proxy
            .sock
            .send(&encode_ack(Some("proxy failed to start")), None)
            .await
            .unwrap();
    });
    let err = reply.unwrap_err();
    assert!(
        matches!(&err, AgentCallError::Rejected(m) if m.contains("proxy failed to start")),
        "{err}"
    );

    assert_eq!(
        env.request(AgentRequest::Check {
            uid: "uid-a".into()
        })
        .await
        .unwrap()
        .pods,
        vec![a.clone()]
    );
    let err = env
        .request(AgentRequest::Check { uid: "nope".into() })
        .await
        .unwrap_err();
    assert!(err.to_string().contains("not enrolled"), "{err}");

    // No proxy connected: pod b is still enrolled (captured, failing closed).
    drop(proxy);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let b = pod("uid-b", &pod_b_ns, "fd00:44::6");
    env.request(AgentRequest::Add(b.clone())).await.unwrap();
    assert!(pod_b_ns.saved(true).contains("ISTIO_OUTPUT"));
    assert!(ipset_members(&host, "istio-inpod-probes-v6").contains("fd00:44::6 comment \"uid-b\""));
    assert_eq!(env.list().await, ["uid-a", "uid-b"]);

    // A pod whose netns does not exist is refused.
    let mut ghost = a.clone();
    ghost.uid = "uid-ghost".into();
    ghost.netns = "/var/run/netns/ambit-agent-test-absent".into();
    let err = env.request(AgentRequest::Add(ghost)).await.unwrap_err();
    assert!(err.to_string().contains("ambit-agent-test-absent"), "{err}");

    agent.stop().await;
    assert!(!env.cfg.events_socket.exists(), "events socket left behind");

    // ---- restart: pod b's sandbox disappeared meanwhile --------------------------------
    drop(pod_b_ns);
    let agent = env.start().await;
    assert_eq!(env.list().await, ["uid-a"], "pod b's netns is gone");
    assert_eq!(
        pod_a_ns.saved(false),
        rules_v4,
        "restart changed pod a's rules"
    );
    assert_eq!(
        pod_a_ns.saved(true),
        rules_v6,
        "restart changed pod a's v6 rules"
    );
    assert_eq!(
        host.saved(false),
        host_nat,
        "restart changed the host rules"
    );
    assert_eq!(
        ipset_members(&host, "istio-inpod-probes-v4"),
        "add istio-inpod-probes-v4 10.44.0.5 comment \"uid-a\"\n"
    );
    assert_eq!(ipset_members(&host, "istio-inpod-probes-v6"), "");
    let rules = pod_a_ns.exec(&["ip", "rule"]);
    assert_eq!(rules.matches("fwmark 0x111/0xfff").count(), 1, "{rules}");

    // A new proxy gets pod a in its snapshot, with its netns fd.
    let proxy = FakeProxy::connect(&env.cfg.zds_socket).await;
    assert_eq!(
        proxy.take_snapshot().await,
        [(
            "uid-a".to_string(),
            Netns::open(pod_a_ns.path()).unwrap().id()
        )]
    );

    // ---- remove ---------------------------------------------------------------------
    let (reply, msg) = tokio::join!(
        env.request(AgentRequest::Remove {
            uid: "uid-a".into()
        }),
        async {
            let msg = proxy.recv().await;
            proxy.ack().await;
            msg
        }
    );
    reply.unwrap();
    assert!(
        matches!(msg, Incoming::Del { ref uid } if uid == "uid-a"),
        "{msg:?}"
    );
    assert!(!pod_a_ns.saved(false).contains("ISTIO_"));
    assert!(!pod_a_ns.saved(true).contains("ISTIO_"));
    assert!(!pod_a_ns.exec(&["ip", "rule"]).contains("fwmark"));
    assert_eq!(ipset_members(&host, "istio-inpod-probes-v4"), "");
    assert!(env.list().await.is_empty());
    // Unknown pods: fine.
    env.request(AgentRequest::Remove {
        uid: "uid-a".into(),
    })
    .await
    .unwrap();

    agent.stop().await;
    uninstall_host(true, &env.opts).await.unwrap();
    assert!(!host.saved(false).contains("ISTIO_"));
    assert!(host.exec(&["ipset", "list", "-n"]).trim().is_empty());
}
