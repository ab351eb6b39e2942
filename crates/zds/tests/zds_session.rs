//! A whole ZDS session through the public API: an agent replays a snapshot over a real
//! listener, the proxy side decodes, drives the state machine and ACKs/NACKs.

use std::os::fd::AsFd;

use ambit_zds::proto::WorkloadInfo;
use ambit_zds::protocol;
use ambit_zds::{Action, Netns, WorkloadStates, ZdsListener, ZdsSocket};

fn info(name: &str) -> WorkloadInfo {
    WorkloadInfo {
        name: name.into(),
        namespace: "default".into(),
        service_account: "sa".into(),
    }
}

/// The proxy side: hello, then handle `n` requests; starts of uid "bad" fail.
async fn proxy(path: std::path::PathBuf, n: usize) -> WorkloadStates {
    let sock = ZdsSocket::connect(&path).await.unwrap();
    let mut states = WorkloadStates::new();
    states.on_connect();
    sock.send(&protocol::encode_hello(), None).await.unwrap();
    for _ in 0..n {
        let (bytes, fds) = sock.recv().await.unwrap();
        let reply = match protocol::decode_request(&bytes, fds) {
            Err(e) => Some(e.to_string()),
            Ok(msg) => match states.on_message(msg) {
                Err(e) => Some(e.to_string()),
                Ok(actions) => {
                    let mut nack = None;
                    for action in actions {
                        if let Action::Start { uid, netns, .. } = action {
                            assert!(netns.is_net_namespace());
                            let ok = uid != "bad";
                            states.on_start_result(&uid, ok);
                            if !ok {
                                nack = Some(format!("failure to start proxy : {uid}"));
                            }
                        }
                    }
                    nack
                }
            },
        };
        sock.send(&protocol::encode_ack(reply.as_deref()), None)
            .await
            .unwrap();
    }
    states
}

#[tokio::test]
async fn snapshot_session() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ztunnel.sock");
    let listener = ZdsListener::bind(&path).unwrap();
    let proxy_task = tokio::spawn(proxy(path.clone(), 6));

    let agent = listener.accept().await.unwrap();
    let (hello, _) = agent.recv().await.unwrap();
    assert_eq!(
        protocol::decode_hello(&hello).unwrap().version(),
        ambit_zds::proto::Version::V1
    );
    let netns = Netns::current().unwrap();
    let mut replies = Vec::new();
    for (msg, fd) in [
        (
            protocol::encode_add("good", &info("good")),
            Some(netns.as_fd()),
        ),
        (
            protocol::encode_add("bad", &info("bad")),
            Some(netns.as_fd()),
        ),
        (protocol::encode_add("nofd", &info("nofd")), None),
        (protocol::encode_keep("kept"), None),
        (protocol::encode_snapshot_sent(), None),
        (protocol::encode_keep("late"), None),
    ] {
        agent.send(&msg, fd).await.unwrap();
        let (bytes, fds) = agent.recv().await.unwrap();
        assert!(fds.is_empty());
        replies.push(protocol::decode_response(&bytes).unwrap());
    }
    assert_eq!(replies[0], Ok(()));
    assert_eq!(replies[1], Err("failure to start proxy : bad".into()));
    assert!(replies[2]
        .as_ref()
        .unwrap_err()
        .starts_with("no control message"));
    assert_eq!(replies[3], Ok(()));
    assert_eq!(replies[4], Ok(()));
    assert!(replies[5]
        .as_ref()
        .unwrap_err()
        .contains("after SnapshotSent"));

    let states = proxy_task.await.unwrap();
    assert!(states.snapshot_received());
    assert_eq!(states.active_count(), 1);
    assert_eq!(states.pending_count(), 1);
    assert!(!states.is_ready());
}
