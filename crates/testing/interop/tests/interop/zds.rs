//! ZDS with an agent peer that is not ambit's own code: the sender in
//! `ambit_interop::zds_peer`, written from the reference, drives ambit's node proxy and
//! Istio's ztunnel through the same sequence, and what each answers is compared step by
//! step, with real traffic through the pods it announced.

use std::net::{SocketAddr, TcpListener};
use std::os::fd::AsRawFd;
use std::time::Duration;

use ambit_interop::apps::{exchange_half_close, serve_half_close, MIB};
use ambit_interop::zds_peer::{Answer, Request, WorkloadInfo, ZdsConn, ZdsListener};
use ambit_interop::{both, NodeProxy};
use ambit_netns_lab::{http_get, wait_until, Lab};

use crate::pods::PodNode;

const T: Duration = Duration::from_secs(10);

fn info(name: &str) -> Option<WorkloadInfo> {
    Some(WorkloadInfo {
        name: name.into(),
        namespace: "default".into(),
        service_account: name.into(),
    })
}

/// What the agent saw in answer to one step.
fn seen(answer: anyhow::Result<Answer>) -> String {
    match answer {
        Ok(Answer::Ack) => "ack".into(),
        Ok(Answer::Nack(_)) => "nack".into(),
        Err(e) => format!("no answer ({e:#})"),
    }
}

fn ready(node: &PodNode) -> u16 {
    http_get(
        &node.node_ns,
        "127.0.0.1:15021".parse().unwrap(),
        "/healthz/ready",
    )
    .map(|(s, _)| s)
    .unwrap_or(0)
}

fn listeners(node: &PodNode, pod: &str) -> [bool; 3] {
    [15001, 15006, 15008].map(|p| node.listening(pod, p))
}

fn accept_with_hello(listener: &ZdsListener) -> (ZdsConn, u64) {
    let conn = listener.accept(T).unwrap();
    let version = conn.hello(T).unwrap();
    (conn, version)
}

/// One pass through the protocol's steady-state paths; returns each step with what was
/// observed, for both implementations to produce the same list.
fn steady_state(proxy: &NodeProxy) -> Vec<(&'static str, String)> {
    let node = PodNode::build(&format!("io-zds-{}", proxy.label()), &["a", "b"], &[proxy]).unwrap();
    let listener = ZdsListener::bind(&node.zds_socket).unwrap();
    let p = node.start_proxy(proxy).unwrap();
    let (a, b) = (node.pod("a"), node.pod("b"));
    let fa = std::fs::File::open(a.netns_path()).unwrap();
    let fb = std::fs::File::open(b.netns_path()).unwrap();
    let mut log: Vec<(&'static str, String)> = Vec::new();

    let (conn, version) = accept_with_hello(&listener);
    log.push(("hello version", version.to_string()));
    log.push(("readiness before the snapshot", ready(&node).to_string()));
    let add = |uid: &str, name: &str| Request::Add {
        uid: uid.into(),
        info: info(name),
    };
    log.push((
        "add a",
        seen(conn.request(&add(&a.uid, "a"), Some(fa.as_raw_fd()), T)),
    ));
    log.push((
        "add b",
        seen(conn.request(&add(&b.uid, "b"), Some(fb.as_raw_fd()), T)),
    ));
    log.push((
        "add a again, same netns",
        seen(conn.request(&add(&a.uid, "a"), Some(fa.as_raw_fd()), T)),
    ));
    log.push((
        "keep an unknown uid",
        seen(conn.request(&Request::Keep { uid: "gone".into() }, None, T)),
    ));
    log.push((
        "snapshot sent",
        seen(conn.request(&Request::SnapshotSent, None, T)),
    ));
    wait_until("readiness after the snapshot", T, || ready(&node) == 200).unwrap_or_else(|e| {
        panic!(
            "{}: {e}\n{}",
            proxy.label(),
            std::fs::read_to_string(&p.log).unwrap_or_default()
        )
    });
    log.push(("readiness after the snapshot", ready(&node).to_string()));
    log.push(("listeners in a", format!("{:?}", listeners(&node, "a"))));
    log.push(("listeners in b", format!("{:?}", listeners(&node, "b"))));

    // Real traffic: a's app to b's, captured by a's rules, HBONE between the two pods'
    // listeners, delivered to b's app from a's own address.
    let app = Lab::in_netns(&b.ns, || TcpListener::bind("0.0.0.0:8080")).unwrap();
    let seed = rand::random();
    let served = serve_half_close(app, seed, MIB);
    let conn_ab = Lab::in_netns(&a.ns, || {
        std::net::TcpStream::connect_timeout(&SocketAddr::from((b.ip, 8080)), T)
    })
    .unwrap();
    exchange_half_close(conn_ab, seed, MIB).unwrap_or_else(|e| {
        panic!(
            "{}: a to b: {e:#}\n{}",
            proxy.label(),
            std::fs::read_to_string(&p.log).unwrap_or_default()
        )
    });
    let s = served.recv_timeout(T).unwrap();
    log.push(("1 MiB each way a to b", s.request_ok.to_string()));
    log.push((
        "b's app saw a's address",
        (s.peer.ip() == std::net::IpAddr::from(a.ip)).to_string(),
    ));

    log.push((
        "del b",
        seen(conn.request(&Request::Del { uid: b.uid.clone() }, None, T)),
    ));
    let gone = wait_until("b's listeners to close", T, || {
        listeners(&node, "b") == [false; 3]
    })
    .is_ok();
    log.push(("b's listeners closed", gone.to_string()));
    log.push((
        "del an unknown uid",
        seen(conn.request(&Request::Del { uid: "nope".into() }, None, T)),
    ));

    // Unreadable messages: a NACK, then the proxy starts over on a new connection, and
    // the pods it runs keep running.
    log.push((
        "add without an fd",
        seen(conn.request(&add("c", "c"), None, T)),
    ));
    log.push((
        "then it closes the stream",
        conn.closed_within(T).to_string(),
    ));
    let (conn, version) = accept_with_hello(&listener);
    log.push(("reconnects with a hello", version.to_string()));
    log.push(("a still served", format!("{:?}", listeners(&node, "a"))));
    log.push((
        "replayed add a",
        seen(conn.request(&add(&a.uid, "a"), Some(fa.as_raw_fd()), T)),
    ));
    log.push((
        "replayed snapshot",
        seen(conn.request(&Request::SnapshotSent, None, T)),
    ));
    log.push((
        "del with an fd",
        seen(conn.request(
            &Request::Del { uid: a.uid.clone() },
            Some(fa.as_raw_fd()),
            T,
        )),
    ));
    log.push((
        "then it closes the stream again",
        conn.closed_within(T).to_string(),
    ));
    // A snapshot without a: reconciled away.
    let (conn, _) = accept_with_hello(&listener);
    log.push((
        "empty snapshot",
        seen(conn.request(&Request::SnapshotSent, None, T)),
    ));
    let gone = wait_until("a's listeners to close", T, || {
        listeners(&node, "a") == [false; 3]
    })
    .is_ok();
    log.push(("a's proxy reconciled away", gone.to_string()));
    log.push(("still running", node.lab.is_running(p.pid).to_string()));
    drop(fa);
    drop(fb);
    log
}

#[test]
fn an_independent_agent_drives_both_proxies_alike() {
    let [ambit, istio] = both().unwrap();
    let a = steady_state(&ambit);
    let i = steady_state(&istio);
    for (x, y) in a.iter().zip(&i) {
        println!("{:40} ambit {:8} Istio {}", x.0, x.1, y.1);
    }
    assert_eq!(a, i, "the two proxies answered the same agent differently");
    // And what that sequence must show, spelled out.
    let expect: &[(&str, &str)] = &[
        ("hello version", "1"),
        ("readiness before the snapshot", "500"),
        ("add a", "ack"),
        ("add b", "ack"),
        ("add a again, same netns", "ack"),
        ("keep an unknown uid", "ack"),
        ("snapshot sent", "ack"),
        ("readiness after the snapshot", "200"),
        ("listeners in a", "[true, true, true]"),
        ("listeners in b", "[true, true, true]"),
        ("1 MiB each way a to b", "true"),
        ("b's app saw a's address", "true"),
        ("del b", "ack"),
        ("b's listeners closed", "true"),
        ("del an unknown uid", "ack"),
        ("add without an fd", "nack"),
        ("then it closes the stream", "true"),
        ("reconnects with a hello", "1"),
        ("a still served", "[true, true, true]"),
        ("replayed add a", "ack"),
        ("replayed snapshot", "ack"),
        ("del with an fd", "nack"),
        ("then it closes the stream again", "true"),
        ("empty snapshot", "ack"),
        ("a's proxy reconciled away", "true"),
        ("still running", "true"),
    ];
    let got: Vec<(&str, &str)> = a.iter().map(|(k, v)| (*k, v.as_str())).collect();
    assert_eq!(got, expect);
}

/// Broken protocol: the proxy NACKs, closes the stream and exits non-zero, so its
/// supervisor restarts it with a clean slate. Every step but the last must be ACKed; an
/// Add carries the pod's netns (the fd rules are not what is tested here). Returns
/// (the last answer, stream closed, exited non-zero).
fn fatal(proxy: &NodeProxy, steps: &[Request]) -> (String, bool, bool) {
    let node = PodNode::build(&format!("io-zdsf-{}", proxy.label()), &["a"], &[proxy]).unwrap();
    let listener = ZdsListener::bind(&node.zds_socket).unwrap();
    let p = node.start_proxy(proxy).unwrap();
    let (conn, _) = accept_with_hello(&listener);
    let fa = std::fs::File::open(node.pod("a").netns_path()).unwrap();
    let send = |step: &Request| {
        let fd = matches!(step, Request::Add { .. }).then(|| fa.as_raw_fd());
        seen(conn.request(step, fd, T))
    };
    let (last, before) = steps.split_last().unwrap();
    for step in before {
        assert_eq!(send(step), "ack", "{}: {step:?}", proxy.label());
    }
    let answer = send(last);
    let closed = conn.closed_within(T);
    let status = node
        .lab
        .wait_exit(p.pid, T)
        .unwrap_or_else(|e| panic!("{}: {e}", proxy.label()));
    (answer, closed, !status.success())
}

#[test]
fn protocol_errors_are_fatal_in_both() {
    let [ambit, istio] = both().unwrap();
    let cases: [(&str, Vec<Request>); 3] = [
        (
            "add without workload_info",
            vec![Request::Add {
                uid: "d".into(),
                info: None,
            }],
        ),
        (
            "keep after the snapshot",
            vec![Request::SnapshotSent, Request::Keep { uid: "x".into() }],
        ),
        (
            "a second snapshot",
            vec![Request::SnapshotSent, Request::SnapshotSent],
        ),
    ];
    for (name, steps) in cases {
        let a = fatal(&ambit, &steps);
        let i = fatal(&istio, &steps);
        assert_eq!(a, i, "{name}: ambit and Istio differ");
        assert_eq!(a, ("nack".to_string(), true, true), "{name}");
    }
}
