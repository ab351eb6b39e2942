//! `ambit waypoint` end to end, as root: the lab's two nodes with ambit's node proxies,
//! the waypoint pod in the server node and the `echo` service behind it with two
//! endpoints, one in the mesh (HBONE through the server's node proxy) and one outside it
//! (plaintext). Real HTTP/1.1 and HTTP/2 clients in the client node dial the service's
//! VIP as unmodified apps do (`ambit_netns_lab::l7`).

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use ambit_netns_lab::l7::{L7Lab, PLAIN_POD, SERVER_POD, TCP_PORT, WAYPOINT_ID};
use ambit_netns_lab::mesh::{metric_sum, SERVICE_HOST};

const CLIENT_ID: &str = "spiffe://cluster.local/ns/default/sa/client";

/// DELETE is refused on the `echo` service's HTTP port (a DENY rule with only HTTP fields
/// would refuse every opaque TCP tunnel too, as Istio ignores the HTTP fields there: hence
/// the port); only the client may use the waypoint at all.
const POLICIES: &str = r#"
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: no-delete, namespace: default}
spec:
  targetRefs: [{kind: Service, group: "", name: echo}]
  action: DENY
  rules: [{to: [{operation: {methods: ["DELETE"], ports: ["80"]}}]}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: only-the-client, namespace: default}
spec:
  targetRefs: [{kind: Gateway, group: gateway.networking.k8s.io, name: waypoint}]
  action: ALLOW
  rules: [{from: [{source: {principals: ["cluster.local/ns/default/sa/client"]}}]}]
"#;

fn launch(tag: &str) -> L7Lab {
    L7Lab::launch(tag, Path::new(env!("CARGO_BIN_EXE_ambit")), POLICIES).unwrap()
}

#[test]
fn requests_through_the_waypoint() {
    let lab = launch("wp-l7");

    // HTTP/1.1, keep-alive: allowed, refused by the L7 policy, allowed again on the same
    // connection.
    let replies = lab
        .http1(&[
            ("GET", "/a/../items?x=1"),
            ("DELETE", "/items"),
            ("POST", "/items"),
        ])
        .unwrap_or_else(|e| panic!("{e:#}\n{}", lab.waypoint_log()));
    assert_eq!(replies[0].status, 200, "{replies:?}");
    let words: Vec<&str> = replies[0].body.split(' ').collect();
    assert_eq!(
        words[1..4],
        ["GET", "/items?x=1", "4"],
        "the app gets the normalised path, the query and the body: {replies:?}"
    );
    assert!(
        words[4].len() == 36,
        "the waypoint set an x-request-id: {replies:?}"
    );
    assert_eq!(
        replies[1].status,
        403,
        "{replies:?}\n{}\n{}",
        lab.waypoint_log(),
        lab.waypoint_config_dump().unwrap()
    );
    assert_eq!(replies[1].body, "RBAC: access denied");
    assert_eq!(replies[2].status, 200, "{replies:?}");

    // HTTP/2: forty requests on ONE client connection spread over both endpoints.
    let replies = lab
        .h2("GET", "/spread", 40)
        .unwrap_or_else(|e| panic!("{e:#}\n{}", lab.waypoint_log()));
    assert!(replies.iter().all(|r| r.status == 200), "{replies:?}");
    let pods: BTreeSet<&str> = replies.iter().filter_map(|r| r.pod()).collect();
    assert_eq!(
        pods,
        BTreeSet::from([PLAIN_POD, SERVER_POD]),
        "each request is balanced on its own"
    );
    let refused = lab.h2("DELETE", "/x", 1).unwrap();
    assert_eq!(refused[0].status, 403);

    // The declared-TCP port is carried opaque: a server-first protocol works.
    let banner = {
        use tokio::io::AsyncReadExt;
        let mut conn = lab.connect(TCP_PORT).unwrap();
        lab.rt.block_on(async move {
            let mut buf = vec![0u8; 64];
            let n = tokio::time::timeout(Duration::from_secs(10), conn.read(&mut buf))
                .await
                .expect("the banner within 10 s")
                .unwrap();
            String::from_utf8_lossy(&buf[..n]).into_owned()
        })
    };
    assert!(
        banner.ends_with(" banner\n"),
        "{banner:?}\n{}",
        lab.waypoint_log()
    );

    // The waypoint's own counts: reporter="waypoint", the client as source.
    let mut text = String::new();
    let source = [
        ("reporter", "waypoint"),
        ("source_principal", CLIENT_ID),
        ("source_workload", "client"),
        ("destination_service", SERVICE_HOST),
        ("destination_service_name", "echo"),
    ];
    ambit_netns_lab::wait_until("the waypoint to count", Duration::from_secs(10), || {
        text = lab.waypoint_metrics().unwrap_or_default();
        let ok = [source.as_slice(), &[("response_code", "200")]].concat();
        let denied = [source.as_slice(), &[("response_code", "403")]].concat();
        metric_sum(&text, "istio_requests_total", &ok) == 42
            && metric_sum(&text, "istio_requests_total", &denied) == 2
    })
    .unwrap_or_else(|e| panic!("{e}\n{text}"));
    for pod in [SERVER_POD, PLAIN_POD] {
        let to_pod = [source.as_slice(), &[("destination_workload", pod)]].concat();
        assert!(
            metric_sum(&text, "istio_requests_total", &to_pod) > 0,
            "{pod}: {text}"
        );
    }
    // Only the endpoint reached over HBONE proved an identity.
    let principal = |pod: &str, principal: &str| {
        let l = [
            source.as_slice(),
            &[
                ("destination_workload", pod),
                ("destination_principal", principal),
            ],
        ]
        .concat();
        metric_sum(&text, "istio_requests_total", &l)
    };
    assert!(
        principal(SERVER_POD, "spiffe://cluster.local/ns/default/sa/server") > 0,
        "{text}"
    );
    assert!(principal(PLAIN_POD, "unknown") > 0, "{text}");
    assert!(
        metric_sum(&text, "istio_tcp_connections_opened_total", &source) >= 1,
        "{text}"
    );

    // The server's node proxy saw the waypoint's identity, not the client's.
    let server = [
        ("reporter", "destination"),
        ("source_principal", WAYPOINT_ID),
        ("source_workload", "waypoint"),
        ("destination_workload", "server"),
    ];
    let server_metrics = lab.nodes.metrics(&lab.nodes.server_ns).unwrap();
    assert!(
        metric_sum(
            &server_metrics,
            "istio_tcp_connections_opened_total",
            &server
        ) >= 1,
        "{server_metrics}"
    );

    // What the waypoint holds is shown.
    let dump = lab.waypoint_config_dump().unwrap();
    let names: Vec<&str> = dump["waypointPolicies"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["name"].as_str())
        .collect();
    assert_eq!(names, ["no-delete", "only-the-client"], "{dump}");
    assert_eq!(dump["waypoint"]["identity"], WAYPOINT_ID);
}

/// A CONNECT is taken only for what this waypoint fronts: the service's VIP and hostname;
/// a pod without a waypoint, an unknown address or another port's service are refused
/// with 400, and counted.
#[test]
fn an_authority_the_waypoint_does_not_front_is_refused() {
    use ambit_netns_lab::mesh::{CLIENT_IP, SERVICE_PORT, SERVICE_VIP};
    let lab = launch("wp-front");
    let cases = [
        (format!("{SERVICE_VIP}:{SERVICE_PORT}"), 200),
        (format!("{SERVICE_HOST}:{SERVICE_PORT}"), 200),
        (format!("{CLIENT_IP}:8080"), 400),
        ("10.99.9.9:80".to_string(), 400),
        ("nowhere.default.svc.cluster.local:80".to_string(), 400),
    ];
    for (authority, want) in &cases {
        let got = lab
            .hbone_connect(CLIENT_ID, authority)
            .unwrap_or_else(|e| panic!("{authority}: {e:#}\n{}", lab.waypoint_log()));
        assert_eq!(got, *want, "{authority}");
    }
    let text = lab.waypoint_metrics().unwrap();
    assert!(
        text.lines()
            .any(|l| l == "ambit_waypoint_refused_authorities_total 3"),
        "{text}"
    );
    assert!(
        lab.waypoint_log().contains("does not use this waypoint"),
        "{}",
        lab.waypoint_log()
    );
}

/// SIGTERM while requests are in flight: each finishes with its answer (no 5xx), and the
/// waypoint exits cleanly within its drain deadline.
#[test]
fn sigterm_under_load_finishes_in_flight_requests() {
    use std::sync::atomic::Ordering;
    let lab = std::sync::Arc::new(launch("wp-drain"));
    let h2 = {
        let lab = lab.clone();
        std::thread::spawn(move || lab.h2("GET", "/slow", 20))
    };
    let h1 = {
        let lab = lab.clone();
        std::thread::spawn(move || lab.http1(&[("GET", "/slow"), ("GET", "/slow")]))
    };
    ambit_netns_lab::wait_until(
        "the requests to reach the apps",
        Duration::from_secs(10),
        || lab.app.slow_started.load(Ordering::SeqCst) >= 21,
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", lab.waypoint_log()));
    let status = lab
        .nodes
        .lab
        .signal_and_wait(
            lab.waypoint.pid,
            nix::sys::signal::Signal::SIGTERM,
            Duration::from_secs(20),
        )
        .unwrap_or_else(|e| panic!("{e}\n{}", lab.waypoint_log()));
    let h2 = h2
        .join()
        .unwrap()
        .unwrap_or_else(|e| panic!("{e:#}\n{}", lab.waypoint_log()));
    assert_eq!(h2.len(), 20);
    assert!(h2.iter().all(|r| r.status == 200), "{h2:?}");
    // The second HTTP/1.1 request was sent after the drain began, on a connection the
    // waypoint then closes: answered, or refused by a closed connection, never a 5xx.
    match h1.join().unwrap() {
        Ok(replies) => assert!(replies.iter().all(|r| r.status == 200), "{replies:?}"),
        Err(e) => assert!(
            !format!("{e:#}").contains(" 50"),
            "{e:#}\n{}",
            lab.waypoint_log()
        ),
    }
    assert!(status.success(), "{status:?}\n{}", lab.waypoint_log());
    assert!(
        lab.waypoint_log().contains("shutdown complete"),
        "{}",
        lab.waypoint_log()
    );
}

/// A WebSocket upgrade passes through: the app's 101, then bytes both ways on the same
/// connection; and each request leaves an access log line with Istio's fields.
#[test]
fn upgrades_pass_through_and_requests_are_logged() {
    use ambit_netns_lab::mesh::{SERVICE_PORT, SERVICE_VIP};
    use std::io::{BufRead, BufReader, Write};
    let lab = launch("wp-upgrade");
    let mut s = lab
        .nodes
        .connect_from_client(std::net::SocketAddr::from((SERVICE_VIP, SERVICE_PORT)))
        .unwrap();
    s.write_all(
        format!(
            "GET /ws HTTP/1.1\r\nHost: {SERVICE_HOST}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nUser-Agent: lab-test\r\n\r\n"
        )
        .as_bytes(),
    )
    .unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut status = String::new();
    r.read_line(&mut status).unwrap();
    assert!(
        status.starts_with("HTTP/1.1 101"),
        "{status:?}\n{}",
        lab.waypoint_log()
    );
    // The rest of the head, then the upgraded stream.
    loop {
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        if line == "\r\n" {
            break;
        }
    }
    let mut hello = String::new();
    r.read_line(&mut hello).unwrap();
    assert!(hello.ends_with(" upgraded\n"), "{hello:?}");
    s.write_all(b"over the upgrade\n").unwrap();
    let mut echoed = String::new();
    r.read_line(&mut echoed).unwrap();
    assert_eq!(echoed, "over the upgrade\n");
    drop((r, s));

    let replies = lab.http1(&[("GET", "/logged")]).unwrap();
    assert_eq!(replies[0].status, 200);
    let mut log = String::new();
    ambit_netns_lab::wait_until("the access line", Duration::from_secs(10), || {
        log = lab.waypoint_log();
        log.lines()
            .any(|l| l.contains("\taccess\t") && l.contains("path=/logged"))
    })
    .unwrap_or_else(|e| panic!("{e}\n{log}"));
    let line = log
        .lines()
        .find(|l| l.contains("\taccess\t") && l.contains("path=/logged"))
        .unwrap();
    for field in [
        "method=GET",
        "protocol=\"HTTP/1.1\"",
        "response_code=200",
        "response_flags=\"-\"",
        &format!("authority={SERVICE_HOST}:{SERVICE_PORT}"),
        &format!("src.identity={CLIENT_ID}"),
        &format!("upstream_cluster=inbound-vip|{SERVICE_PORT}|http|{SERVICE_HOST}"),
    ] {
        assert!(line.contains(field), "{field}: {line}");
    }
    assert!(
        log.lines().any(|l| l.contains("\taccess\t")
            && l.contains("path=/ws")
            && l.contains("response_code=101")),
        "{log}"
    );
}

/// Policy decisions through the real process: paths matched after normalisation, a
/// header condition, hosts, the ALLOW-none-matched and DENY details, a dry-run policy
/// counted and never enforced.
#[test]
fn policy_decisions_through_the_process() {
    const TABLE_POLICIES: &str = r#"
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: no-admin, namespace: default}
spec:
  targetRefs: [{kind: Service, group: "", name: echo}]
  action: DENY
  rules:
  - to: [{operation: {paths: ["/admin/*"], ports: ["80"]}}]
  - to: [{operation: {hosts: ["forbidden.example"], ports: ["80"]}}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: public-or-blue, namespace: default}
spec:
  targetRefs: [{kind: Gateway, group: gateway.networking.k8s.io, name: waypoint}]
  action: ALLOW
  rules:
  - to: [{operation: {paths: ["/public/*", "/admin/*"]}}]
  - when: [{key: "request.headers[x-team]", values: ["blue"]}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata:
  name: would-deny-all
  namespace: default
  annotations: {istio.io/dry-run: "true"}
spec:
  targetRefs: [{kind: Service, group: "", name: echo}]
  action: DENY
  rules: [{}]
"#;
    let lab = L7Lab::launch(
        "wp-table",
        Path::new(env!("CARGO_BIN_EXE_ambit")),
        TABLE_POLICIES,
    )
    .unwrap();
    let req = |method: &str, path: &str, headers: &[(&str, &str)]| {
        let mut r = ambit_netns_lab::l7::request(method, path).unwrap();
        for (k, v) in headers {
            if *k == "host" {
                // Origin form, so that the Host header is the request's host (an
                // absolute-form target's authority would win over it, RFC 9112 §3.2.2).
                *r.uri_mut() = path.parse().unwrap();
            }
            let name = http::HeaderName::from_bytes(k.as_bytes()).unwrap();
            r.headers_mut()
                .insert(name, http::HeaderValue::from_str(v).unwrap());
        }
        r
    };
    let cases: Vec<(&str, http::Request<_>, u16)> = vec![
        ("an allowed path", req("GET", "/public/a", &[]), 200),
        ("a denied path", req("GET", "/admin/x", &[]), 403),
        (
            "denied after dot segments",
            req("GET", "/public/../admin/x", &[]),
            403,
        ),
        (
            "denied after an unreserved escape",
            req("GET", "/%61dmin/x", &[]),
            403,
        ),
        ("no ALLOW rule matches", req("GET", "/private", &[]), 403),
        (
            "the header condition",
            req("GET", "/private", &[("x-team", "blue")]),
            200,
        ),
        (
            "another header value",
            req("GET", "/private", &[("x-team", "red")]),
            403,
        ),
        (
            "a denied host",
            req("GET", "/public/a", &[("host", "Forbidden.Example:80")]),
            403,
        ),
    ];
    let (names, requests): (Vec<&str>, Vec<_>) =
        cases.iter().map(|(n, r, _)| (*n, r.clone())).unzip();
    let replies = lab
        .send_http1(requests)
        .unwrap_or_else(|e| panic!("{e:#}\n{}", lab.waypoint_log()));
    for ((name, (_, _, want)), reply) in names.iter().zip(&cases).zip(&replies) {
        assert_eq!(reply.status, *want, "{name}: {reply:?}");
    }
    let text = lab.waypoint_metrics().unwrap();
    let dry_run = [("policy", "default/would-deny-all"), ("action", "DENY")];
    assert_eq!(
        metric_sum(&text, "ambit_rbac_dry_run_matches_total", &dry_run),
        cases.len() as u64,
        "every request matched the dry-run policy, none was refused by it: {text}"
    );
}

/// A policy document refused with no good version to stand in for it leaves the waypoint
/// denying everything (a DENY with a typo must never become an allow); fixed, it opens;
/// broken again, its last good version stays.
#[test]
fn a_refused_policy_fails_closed_and_its_last_good_version_stays() {
    let bad = POLICIES.replace("[\"DELETE\"]", "[\"delete\"]");
    let lab = L7Lab::launch("wp-refused", Path::new(env!("CARGO_BIN_EXE_ambit")), &bad).unwrap();
    let status = |method: &str| lab.http1(&[(method, "/x")]).unwrap()[0].status;
    assert_eq!(status("GET"), 403, "{}", lab.waypoint_log());
    assert!(
        lab.waypoint_log()
            .contains("spec.rules[0].to[0].operation.methods[0]"),
        "{}",
        lab.waypoint_log()
    );
    std::fs::write(&lab.policies, POLICIES).unwrap();
    ambit_netns_lab::wait_until(
        "the fixed policies to load",
        Duration::from_secs(10),
        || status("GET") == 200,
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", lab.waypoint_log()));
    assert_eq!(status("DELETE"), 403);
    std::fs::write(&lab.policies, &bad).unwrap();
    ambit_netns_lab::wait_until(
        "the broken version to be refused",
        Duration::from_secs(10),
        || {
            lab.waypoint_log()
                .matches("a refused version: the last good one stays")
                .count()
                >= 1
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", lab.waypoint_log()));
    assert_eq!(status("GET"), 200);
    assert_eq!(status("DELETE"), 403, "the last good DENY still applies");
}

/// A connect failure is retried on an endpoint not yet tried, so a service with one dead
/// endpoint of two still answers every request; a service with no endpoint gets Envoy's
/// 503 `no healthy upstream`, counted with the flag `UH`.
#[test]
fn failed_connects_are_retried_elsewhere_and_no_endpoint_is_503() {
    use ambit_netns_lab::l7::{EMPTY_HOST, EMPTY_VIP, FLAKY_HOST, FLAKY_VIP};
    use ambit_netns_lab::mesh::SERVICE_PORT;
    let lab = launch("wp-retry");
    let to = |host: &str| {
        let mut r = ambit_netns_lab::l7::request("GET", "/").unwrap();
        *r.uri_mut() = format!("http://{host}:{SERVICE_PORT}/").parse().unwrap();
        r.headers_mut()
            .insert("host", http::HeaderValue::from_str(host).unwrap());
        r
    };
    let replies = lab
        .send_http1_to(
            std::net::SocketAddr::from((FLAKY_VIP, SERVICE_PORT)),
            (0..30).map(|_| to(FLAKY_HOST)).collect(),
        )
        .unwrap_or_else(|e| panic!("{e:#}\n{}", lab.waypoint_log()));
    assert!(
        replies
            .iter()
            .all(|r| r.status == 200 && r.pod() == Some(PLAIN_POD)),
        "{replies:?}"
    );
    let empty = lab
        .send_http1_to(
            std::net::SocketAddr::from((EMPTY_VIP, SERVICE_PORT)),
            vec![to(EMPTY_HOST)],
        )
        .unwrap();
    assert_eq!(empty[0].status, 503, "{empty:?}");
    assert_eq!(empty[0].body, "no healthy upstream");
    let text = lab.waypoint_metrics().unwrap();
    let flagged = |service: &str, code: &str, flags: &str| {
        let l = [
            ("reporter", "waypoint"),
            ("destination_service_name", service),
            ("response_code", code),
            ("response_flags", flags),
        ];
        metric_sum(&text, "istio_requests_total", &l)
    };
    assert_eq!(flagged("flaky", "200", "-"), 30, "{text}");
    assert_eq!(flagged("flaky", "503", "UF"), 0, "{text}");
    assert_eq!(flagged("empty", "503", "UH"), 1, "{text}");
}
