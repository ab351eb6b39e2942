//! DestinationRules applied by `ambit waypoint` end to end, as root: the L7 lab (two nodes
//! with ambit's node proxies, the waypoint pod, `echo` with two endpoints: the server pod
//! in the mesh and a plain pod outside it), real HTTP/1.1 clients in the client node
//! dialling the Service's VIP, rules from the waypoint's config file as users write them
//! (Istio's circuit-breaking task verbatim).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use ambit_netns_lab::l7::{request, L7Lab, Reply, PLAIN_POD, SERVER_POD};
use ambit_netns_lab::mesh::{metric_sum, SERVICE_HOST};
use ambit_netns_lab::wait_until;

fn launch(tag: &str, config: &str) -> L7Lab {
    L7Lab::launch(tag, Path::new(env!("CARGO_BIN_EXE_ambit")), config).unwrap()
}

fn get(lab: &L7Lab, path: &str, headers: &[(&str, &str)]) -> Reply {
    let mut req = request("GET", path).unwrap();
    for (k, v) in headers {
        req.headers_mut().insert(
            http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            v.parse().unwrap(),
        );
    }
    lab.send_http1(vec![req])
        .unwrap_or_else(|e| panic!("{e:#}\n{}", lab.waypoint_log()))
        .remove(0)
}

fn header<'r>(r: &'r Reply, name: &str) -> Option<&'r str> {
    r.headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

fn rule(spec: &str) -> String {
    format!("apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {{name: echo, namespace: default}}\nspec:\n  host: echo\n{spec}")
}

/// Which pod answers each of `users`, asking each three times (always the same one, or
/// the test fails).
fn owners(lab: &L7Lab, users: &[String], ask: impl Fn(&str) -> Reply) -> BTreeMap<String, String> {
    let mut owners = BTreeMap::new();
    for user in users {
        let pods: Vec<String> = (0..3)
            .map(|_| {
                let r = ask(user);
                assert_eq!(r.status, 200, "{r:?}\n{}", lab.waypoint_log());
                r.pod().unwrap().to_string()
            })
            .collect();
        assert!(pods.iter().all(|p| *p == pods[0]), "{user}: {pods:?}");
        owners.insert(user.clone(), pods[0].clone());
    }
    owners
}

/// Replaces `path` whole, by a rename: a reader never sees it half written.
fn write_whole(path: &Path, text: &str) {
    let fresh = path.with_extension("new");
    std::fs::write(&fresh, text).unwrap();
    std::fs::rename(&fresh, path).unwrap();
}

/// Replaces the waypoint's config and waits until `/config_dump` shows `expected` among the rules in force.
fn reconfigure(lab: &L7Lab, config: &str, expected: serde_json::Value) {
    write_whole(&lab.policies, config);
    wait_until("the new rule in force", Duration::from_secs(10), || {
        let dump = lab.waypoint_config_dump().unwrap();
        dump["waypointDestinationRules"]["rules"][0]["trafficPolicy"]["loadBalancer"]
            ["consistentHash"]["key"]
            == expected
    })
    .unwrap_or_else(|e| panic!("{e:#}\n{}", lab.waypoint_log()));
}

#[test]
fn sticky_sessions_by_header_cookie_and_query_across_a_restart() {
    let by_header = rule("  trafficPolicy:\n    loadBalancer:\n      consistentHash:\n        httpHeaderName: x-user\n");
    let mut lab = launch("wp-dr-hash", &by_header);
    let users: Vec<String> = (0..16).map(|i| format!("user-{i}")).collect();
    let ask = |lab: &L7Lab, u: &str| get(lab, "/", &[("x-user", u)]);
    let first = owners(&lab, &users, |u| ask(&lab, u));
    let on_plain = first.values().filter(|p| *p == PLAIN_POD).count();
    assert!(
        on_plain > 0 && on_plain < users.len(),
        "16 users spread over both endpoints: {first:?}"
    );

    // A new waypoint process: the same users on the same endpoints (the hash is a
    // function of the user and the endpoints' addresses, nothing random or remembered).
    lab.restart_waypoint().unwrap();
    assert_eq!(
        owners(&lab, &users, |u| ask(&lab, u)),
        first,
        "after a restart"
    );

    // The plain pod leaves (unhealthy): its users move to the server, the others stay;
    // when it is back, every user is where it was.
    let mesh = std::fs::read_to_string(&lab.nodes.config_path).unwrap();
    let unhealthy = mesh.replacen("  name: plain\n", "  name: plain\n  status: Unhealthy\n", 1);
    assert_ne!(mesh, unhealthy);
    write_whole(&lab.nodes.config_path, &unhealthy);
    let plain_user = first
        .iter()
        .find(|(_, p)| *p == PLAIN_POD)
        .unwrap()
        .0
        .clone();
    wait_until("the plain pod to leave", Duration::from_secs(10), || {
        ask(&lab, &plain_user).pod() == Some(SERVER_POD)
    })
    .unwrap();
    let without = owners(&lab, &users, |u| ask(&lab, u));
    assert!(without.values().all(|p| p == SERVER_POD), "{without:?}");
    write_whole(&lab.nodes.config_path, &mesh);
    wait_until(
        "the plain pod to come back",
        Duration::from_secs(10),
        || ask(&lab, &plain_user).pod() == Some(PLAIN_POD),
    )
    .unwrap();
    assert_eq!(
        owners(&lab, &users, |u| ask(&lab, u)),
        first,
        "back as before"
    );

    // A cookie with a TTL: made by the waypoint for a client without one, then kept to.
    let by_cookie = rule("  trafficPolicy:\n    loadBalancer:\n      consistentHash:\n        httpCookie: {name: session, path: /, ttl: 3600s}\n");
    reconfigure(
        &lab,
        &by_cookie,
        serde_json::json!({"httpCookie": {"name": "session", "path": "/", "ttl": "3600s"}}),
    );
    let mut pods_seen = std::collections::BTreeSet::new();
    for _ in 0..16 {
        let r = get(&lab, "/", &[]);
        let set = header(&r, "set-cookie").unwrap().to_string();
        assert!(
            set.starts_with("session=") && set.ends_with("; Max-Age=3600; Path=/; HttpOnly"),
            "{set}"
        );
        let cookie = set.split(';').next().unwrap().to_string();
        let pod = r.pod().unwrap().to_string();
        for _ in 0..3 {
            let again = get(&lab, "/", &[("cookie", &cookie)]);
            assert_eq!(again.pod(), Some(pod.as_str()), "{cookie}");
            assert_eq!(
                header(&again, "set-cookie"),
                None,
                "a cookie sent is not set again"
            );
        }
        pods_seen.insert(pod);
    }
    assert_eq!(
        pods_seen.len(),
        2,
        "generated cookies spread over both endpoints"
    );

    // A query parameter with Maglev: stable per user, and again after a restart.
    let by_query = rule("  trafficPolicy:\n    loadBalancer:\n      consistentHash:\n        httpQueryParameterName: user\n        maglev: {tableSize: 65537}\n");
    reconfigure(
        &lab,
        &by_query,
        serde_json::json!({"httpQueryParameterName": "user"}),
    );
    let by_user = |lab: &L7Lab, u: &str| get(lab, &format!("/items?user={u}&page=2"), &[]);
    let maglev = owners(&lab, &users, |u| by_user(&lab, u));
    assert!(maglev.values().any(|p| p == PLAIN_POD) && maglev.values().any(|p| p == SERVER_POD));
    lab.restart_waypoint().unwrap();
    assert_eq!(owners(&lab, &users, |u| by_user(&lab, u)), maglev);
}

#[test]
fn outlier_detection_ejects_an_endpoint_and_takes_it_back() {
    let config = rule(
        "  trafficPolicy:\n    loadBalancer: {simple: ROUND_ROBIN}\n    outlierDetection:\n      consecutive5xxErrors: 2\n      interval: 1s\n      baseEjectionTime: 3s\n      maxEjectionPercent: 100\n",
    );
    let lab = launch("wp-dr-outlier", &config);
    // The plain pod fails every request on this path; round robin sends it every other
    // one, so within four it has failed twice in a row and is ejected.
    let mut failed = 0;
    for _ in 0..4 {
        let r = get(&lab, "/fail-on/plain/", &[]);
        if r.status == 503 {
            assert_eq!(r.pod(), Some(PLAIN_POD), "{r:?}");
            failed += 1;
        }
    }
    assert_eq!(failed, 2, "{}", lab.waypoint_log());
    // Ejected: every request is the server's, none fails.
    for _ in 0..20 {
        let r = get(&lab, "/fail-on/plain/", &[]);
        assert_eq!((r.status, r.pod()), (200, Some(SERVER_POD)), "{r:?}");
    }
    let m = lab.waypoint_metrics().unwrap();
    let labels = [
        ("destination_service", SERVICE_HOST),
        ("reason", "consecutive_5xx"),
    ];
    assert_eq!(
        metric_sum(&m, "ambit_waypoint_outlier_ejections_total", &labels),
        1,
        "{m}"
    );
    assert!(lab.waypoint_log().contains("endpoint ejected"));
    // After the ejection time it is back in turn.
    std::thread::sleep(Duration::from_millis(3200));
    let pods: Vec<Option<String>> = (0..4)
        .map(|_| get(&lab, "/", &[]).pod().map(str::to_string))
        .collect();
    assert!(
        pods.iter().any(|p| p.as_deref() == Some(PLAIN_POD)),
        "{pods:?}"
    );
}

/// Istio's "Circuit breaking" task: its DestinationRule as written there.
const CIRCUIT_BREAKER: &str = "\
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata:
  name: echo
spec:
  host: echo
  trafficPolicy:
    connectionPool:
      tcp:
        maxConnections: 1
      http:
        http1MaxPendingRequests: 1
        maxRequestsPerConnection: 1
    outlierDetection:
      consecutive5xxErrors: 1
      interval: 1s
      baseEjectionTime: 3m
      maxEjectionPercent: 100
";

#[test]
fn the_connection_pool_overflows_with_uo() {
    let lab = launch("wp-dr-pool", CIRCUIT_BREAKER);
    // Three slow requests at once on three connections: one in flight, one waiting for
    // its place, one answered 503 UO at once.
    let replies: Vec<Reply> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..3)
            .map(|i| {
                let lab = &lab;
                s.spawn(move || {
                    std::thread::sleep(Duration::from_millis(100 * i));
                    get(lab, "/delay/1500/", &[])
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut statuses: Vec<u16> = replies.iter().map(|r| r.status).collect();
    statuses.sort();
    assert_eq!(
        statuses,
        [200, 200, 503],
        "{replies:?}\n{}",
        lab.waypoint_log()
    );
    let overflowed = replies.iter().find(|r| r.status == 503).unwrap();
    assert_eq!(
        overflowed.body,
        "upstream connect error or disconnect/reset before headers. reset reason: overflow"
    );
    let m = lab.waypoint_metrics().unwrap();
    let dest = [("destination_service", SERVICE_HOST)];
    assert_eq!(
        metric_sum(
            &m,
            "ambit_waypoint_upstream_overflows_total",
            &[dest[0], ("limit", "pending")]
        ),
        1,
        "{m}"
    );
    assert_eq!(
        metric_sum(
            &m,
            "istio_requests_total",
            &[
                ("reporter", "waypoint"),
                ("response_code", "503"),
                ("response_flags", "UO")
            ]
        ),
        1,
        "{m}"
    );
    // A local overflow is not the endpoint's failure: nothing was ejected, and with the
    // requests done the pool has room again.
    assert_eq!(
        metric_sum(&m, "ambit_waypoint_outlier_ejections_total", &dest),
        0
    );
    assert_eq!(get(&lab, "/", &[]).status, 200);
}
