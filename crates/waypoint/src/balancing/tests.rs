use std::time::Duration;

use super::*;
use ambit_manifests::{parse_documents, ParseOptions};
use ambit_state::ProxyState;
use ambit_traffic_policy::outlier::Ejection;
use http::header::HeaderName;
use rand::SeedableRng;

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.append(
            HeaderName::from_bytes(k.as_bytes()).unwrap(),
            HeaderValue::from_str(v).unwrap(),
        );
    }
    h
}

#[test]
fn what_a_request_hashes_on() {
    let src: IpAddr = "10.0.0.7".parse().unwrap();
    let user = HashKey::Header(HeaderName::from_static("x-user"));
    let cookie = |ttl: Option<Duration>, path: Option<&str>| {
        HashKey::Cookie(CookieKey {
            name: "sticky".into(),
            path: path.map(str::to_string),
            ttl,
        })
    };
    let h = |s: &str| Some(hash_of(s.as_bytes()));
    /// (key, headers, query, expected hash, expected Set-Cookie)
    type Case<'a> = (
        HashKey,
        HeaderMap,
        Option<&'a str>,
        Option<u64>,
        Option<&'a str>,
    );
    let table: Vec<Case> = vec![
        (
            user.clone(),
            headers(&[("x-user", "ann")]),
            None,
            h("ann"),
            None,
        ),
        (
            user.clone(),
            headers(&[("x-user", "a"), ("x-user", "b")]),
            None,
            h("a,b"),
            None,
        ),
        (
            user.clone(),
            headers(&[("x-other", "ann")]),
            None,
            None,
            None,
        ),
        (HashKey::SourceIp, headers(&[]), None, h("10.0.0.7"), None),
        (
            HashKey::QueryParameter("u".into()),
            headers(&[]),
            Some("a=1&u=bob&u=eve"),
            h("bob"),
            None,
        ),
        (
            HashKey::QueryParameter("u".into()),
            headers(&[]),
            Some("uu=1&x"),
            None,
            None,
        ),
        (
            HashKey::QueryParameter("u".into()),
            headers(&[]),
            None,
            None,
            None,
        ),
        (
            cookie(None, None),
            headers(&[("cookie", "a=1; sticky=abc")]),
            None,
            h("abc"),
            None,
        ),
        (
            cookie(None, None),
            headers(&[("cookie", "a=1"), ("cookie", "sticky=\"q\"")]),
            None,
            h("q"),
            None,
        ),
        (
            cookie(None, None),
            headers(&[("cookie", "notsticky=1")]),
            None,
            None,
            None,
        ),
        // Absent with a TTL: made, hashed like the cookie it sets.
        (
            cookie(Some(Duration::from_secs(3600)), Some("/shop")),
            headers(&[]),
            None,
            h("00000000000000ff"),
            Some("sticky=00000000000000ff; Max-Age=3600; Path=/shop; HttpOnly"),
        ),
        (
            cookie(Some(Duration::ZERO), None),
            headers(&[("cookie", "other=1")]),
            None,
            h("00000000000000ff"),
            Some("sticky=00000000000000ff; HttpOnly"),
        ),
    ];
    for (i, (key, hs, query, hash, set)) in table.into_iter().enumerate() {
        let got = request_hash(&key, &hs, query, src, || 0xff);
        assert_eq!(got.hash, hash, "case {i}");
        assert_eq!(
            got.set_cookie.as_ref().map(|v| v.to_str().unwrap()),
            set,
            "case {i}"
        );
    }
}

const MESH: &str = r#"
workloads:
- {uid: a, name: a, namespace: shop, serviceAccount: r, workloadIps: ["10.0.1.1"], services: {"shop/reviews.shop.svc.cluster.local": {80: 8080}}}
- {uid: b, name: b, namespace: shop, serviceAccount: r, workloadIps: ["10.0.1.2"], services: {"shop/reviews.shop.svc.cluster.local": {80: 8080}}}
- {uid: c, name: c, namespace: shop, serviceAccount: r, workloadIps: ["10.0.1.3"], services: {"shop/reviews.shop.svc.cluster.local": {80: 8080}}}
services:
- {name: reviews, namespace: shop, hostname: reviews.shop.svc.cluster.local, vips: ["/10.96.0.1"], ports: {80: 8080}}
"#;

fn balancer(policy: &str) -> Arc<Balancer> {
    let text = format!("apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {{name: r, namespace: shop}}\nspec: {{host: reviews, trafficPolicy: {policy}}}\n");
    let parsed = parse_documents("dr.yaml", &text, &ParseOptions::default());
    assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
    let rule = parsed.destination_rules.into_iter().next().unwrap().value;
    Arc::new(Balancer::new(Arc::new(rule), 80, "reviews".into()))
}

fn endpoints(state: &ProxyState, uids: &[&str]) -> Vec<Picked> {
    uids.iter()
        .map(|u| {
            let w = state.workload_by_uid(u).unwrap();
            Picked {
                ip: w.workload_ips[0],
                port: 8080,
                workload: w,
            }
        })
        .collect()
}

fn ip(p: &Picked) -> String {
    p.ip.to_string()
}

#[test]
fn consistent_hash_keeps_a_key_on_its_endpoint_and_skips_the_ejected() {
    let state = ProxyState::from_yaml("mesh", MESH).unwrap();
    let b = balancer("{loadBalancer: {consistentHash: {httpHeaderName: x-user}}, outlierDetection: {consecutive5xxErrors: 1, maxEjectionPercent: 50}}");
    let all = endpoints(&state, &["a", "b", "c"]);
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let now = Instant::now();
    let owner = |key: &str, rng: &mut rand::rngs::StdRng| {
        ip(&b
            .pick(all.clone(), &[], Some(hash_of(key.as_bytes())), now, rng)
            .unwrap())
    };
    let first: Vec<String> = (0..50).map(|i| owner(&format!("u{i}"), &mut rng)).collect();
    // Every key again, and again with a retry's `tried`: the same endpoint.
    for (i, was) in first.iter().enumerate() {
        assert_eq!(&owner(&format!("u{i}"), &mut rng), was);
        let tried: Vec<SocketAddr> = vec![format!("{was}:8080").parse().unwrap()];
        let again = b
            .pick(
                all.clone(),
                &tried,
                Some(hash_of(format!("u{i}").as_bytes())),
                now,
                &mut rng,
            )
            .unwrap();
        assert_eq!(&ip(&again), was);
    }
    assert!(first.iter().any(|o| o == "10.0.1.1") && first.iter().any(|o| o == "10.0.1.2"));
    // Eject 10.0.1.2: its keys go elsewhere, the others' stay.
    let ejected: SocketAddr = "10.0.1.2:8080".parse().unwrap();
    assert!(matches!(
        b.record(ejected, Outcome::Status(503), now),
        Recorded::Ejected(Ejection { .. })
    ));
    assert_eq!(b.ejected(now), 1);
    for (i, was) in first.iter().enumerate() {
        let now_owner = owner(&format!("u{i}"), &mut rng);
        if was == "10.0.1.2" {
            assert_ne!(now_owner, "10.0.1.2");
        } else {
            assert_eq!(&now_owner, was);
        }
    }
    // Thirty seconds later it is back with its keys.
    let later = now + Duration::from_secs(30);
    for (i, was) in first.iter().enumerate() {
        let o = b
            .pick(
                all.clone(),
                &[],
                Some(hash_of(format!("u{i}").as_bytes())),
                later,
                &mut rng,
            )
            .unwrap();
        assert_eq!(&ip(&o), was);
    }
}

#[test]
fn least_request_and_round_robin() {
    let state = ProxyState::from_yaml("mesh", MESH).unwrap();
    let all = endpoints(&state, &["a", "b"]);
    let mut rng = rand::rngs::StdRng::seed_from_u64(2);
    let now = Instant::now();
    let rr = balancer("{loadBalancer: {simple: ROUND_ROBIN}}");
    let got: Vec<String> = (0..4)
        .map(|_| ip(&rr.pick(all.clone(), &[], None, now, &mut rng).unwrap()))
        .collect();
    assert_eq!(got, ["10.0.1.1", "10.0.1.2", "10.0.1.1", "10.0.1.2"]);
    // Least request: with a request in flight on a, every new one goes to b while the
    // draws differ, and none to a (a tie never favours the busy one).
    let lr = balancer("{}");
    let busy = lr.start("10.0.1.1:8080".parse().unwrap());
    for _ in 0..50 {
        assert_eq!(
            ip(&lr.pick(all.clone(), &[], None, now, &mut rng).unwrap()),
            "10.0.1.2"
        );
    }
    drop(busy);
    let spread: std::collections::HashSet<String> = (0..50)
        .map(|_| ip(&lr.pick(all.clone(), &[], None, now, &mut rng).unwrap()))
        .collect();
    assert_eq!(spread.len(), 2, "both again once a is idle");
    // A retry avoids the endpoint tried.
    let tried: Vec<SocketAddr> = vec!["10.0.1.1:8080".parse().unwrap()];
    for _ in 0..20 {
        assert_eq!(
            ip(&lr.pick(all.clone(), &tried, None, now, &mut rng).unwrap()),
            "10.0.1.2"
        );
    }
}

#[tokio::test]
async fn the_pool_admits_queues_and_overflows() {
    let b = balancer("{connectionPool: {tcp: {maxConnections: 1}, http: {http1MaxPendingRequests: 1, maxRetries: 1}}}");
    let first = b.admit().await.unwrap().expect("a place");
    // The second waits for the first's place; the third overflows at once.
    let b2 = b.clone();
    let second = tokio::spawn(async move { b2.admit().await.map(|p| p.is_some()) });
    tokio::task::yield_now().await;
    while b.pool.as_ref().unwrap().waiting.load(Ordering::Acquire) == 0 {
        tokio::task::yield_now().await;
    }
    assert_eq!(b.admit().await.err(), Some(Overflow));
    drop(first);
    assert_eq!(second.await.unwrap(), Ok(true));
    // maxRetries: one retry in flight at a time.
    let r = b.retry_place().expect("first retry");
    assert!(b.retry_place().is_none());
    drop(r);
    assert!(b.retry_place().is_some());
    // No limits: no pool at all.
    assert_eq!(balancer("{}").admit().await.map(|p| p.is_none()), Ok(true));
}

#[test]
fn a_destinations_rule_is_looked_up_once_per_set_and_kept_while_it_reads_the_same() {
    use crate::destination_rules::{DestinationRules, Viewer};
    use crate::front::Fronted;
    let state = ProxyState::from_yaml("mesh", MESH).unwrap();
    let fronted = Fronted::Service {
        service: state
            .service_by_key("shop/reviews.shop.svc.cluster.local")
            .unwrap(),
        port: 80,
        vip: None,
    };
    let viewer = Viewer {
        namespace: "shop",
        root_namespace: "istio-system",
        cluster_domain: "cluster.local",
    };
    let load = |policy: &str| {
        let text = format!("apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {{name: r, namespace: shop}}\nspec: {{host: reviews, trafficPolicy: {policy}}}\n");
        let parsed = parse_documents("dr.yaml", &text, &ParseOptions::default());
        DestinationRules::new(
            parsed
                .destination_rules
                .into_iter()
                .map(|r| r.value)
                .collect(),
        )
    };
    let balancers = Balancers::default();
    let first = load("{outlierDetection: {consecutive5xxErrors: 1}}");
    let b = balancers.for_target(&first, viewer, &fronted).unwrap();
    assert!(Arc::ptr_eq(
        &b,
        &balancers.for_target(&first, viewer, &fronted).unwrap()
    ));
    // An ejection, then the same rule read again (a file reload): the same balancer, the
    // endpoint still out.
    let now = Instant::now();
    b.record("10.0.1.1:8080".parse().unwrap(), Outcome::Status(503), now);
    let again = load("{outlierDetection: {consecutive5xxErrors: 1}}");
    assert_ne!(again.generation(), first.generation());
    balancers.retain_rules(&again);
    let same = balancers.for_target(&again, viewer, &fronted).unwrap();
    assert!(Arc::ptr_eq(&b, &same));
    assert_eq!(same.ejected(now), 1);
    // A changed rule: a new balancer, nothing ejected.
    let changed = load("{outlierDetection: {consecutive5xxErrors: 2}}");
    let fresh = balancers.for_target(&changed, viewer, &fronted).unwrap();
    assert!(!Arc::ptr_eq(&b, &fresh));
    assert_eq!(fresh.ejected(now), 0);
    // No rule for the Service: none, and none again from the held answer.
    let other = {
        let text = "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: r, namespace: shop}\nspec: {host: ratings}\n";
        let parsed = parse_documents("dr.yaml", text, &ParseOptions::default());
        DestinationRules::new(
            parsed
                .destination_rules
                .into_iter()
                .map(|r| r.value)
                .collect(),
        )
    };
    assert!(balancers.for_target(&other, viewer, &fronted).is_none());
    assert!(balancers.for_target(&other, viewer, &fronted).is_none());
}
