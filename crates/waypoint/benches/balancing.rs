//! What a DestinationRule costs per request at the waypoint: choosing an endpoint of a
//! Service of 3 and of 50 endpoints with today's pick (capacity-weighted at random, no
//! rule), with each of the rule's balancers, with consistent hashing on ring hash and
//! Maglev (the table built once, as between endpoint changes), and with outlier
//! detection recording each outcome. One request per iteration: the key hashed, the
//! endpoint chosen, the request counted in flight and its outcome recorded. Figures in
//! BENCHMARKS.md ("cargo bench -p ambit-waypoint --bench balancing").

use std::hint::black_box;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use ambit_manifests::{parse_documents, ParseOptions};
use ambit_state::ProxyState;
use ambit_traffic_policy::outlier::Outcome;
use ambit_traffic_policy::LoadBalancer;
use ambit_waypoint::balance::{choose_among, choose_endpoint};
use ambit_waypoint::balancing::{request_hash, Balancer, Balancers};
use ambit_waypoint::destination_rules::{DestinationRules, Viewer};
use ambit_waypoint::front::Fronted;
use criterion::{criterion_group, criterion_main, Criterion};
use http::HeaderMap;
use rand::rngs::StdRng;
use rand::SeedableRng;

fn mesh(endpoints: usize) -> String {
    let mut y = String::from("workloads:\n- {uid: wp, name: waypoint, namespace: shop, serviceAccount: waypoint, workloadIps: [\"10.0.0.9\"], protocol: HBONE}\n");
    for i in 0..endpoints {
        y.push_str(&format!(
            "- {{uid: r{i}, name: r{i}, namespace: shop, serviceAccount: r, workloadIps: [\"10.1.{}.{}\"], protocol: HBONE, services: {{\"shop/reviews.shop.svc.cluster.local\": {{80: 8080}}}}}}\n",
            i / 250,
            i % 250 + 1
        ));
    }
    y.push_str("services:\n- {name: reviews, namespace: shop, hostname: reviews.shop.svc.cluster.local, vips: [\"/10.96.0.1\"], ports: {80: 8080}}\n");
    y
}

fn balancer(policy: &str, fronted: &Fronted) -> Arc<Balancer> {
    let text = format!("apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {{name: r, namespace: shop}}\nspec: {{host: reviews, trafficPolicy: {policy}}}\n");
    let parsed = parse_documents("dr.yaml", &text, &ParseOptions::default());
    assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
    let rules = DestinationRules::new(
        parsed
            .destination_rules
            .into_iter()
            .map(|r| r.value)
            .collect(),
    );
    let viewer = Viewer {
        namespace: "shop",
        root_namespace: "istio-system",
        cluster_domain: "cluster.local",
    };
    Balancers::default()
        .for_target(&rules, viewer, fronted)
        .expect("the rule applies")
}

fn bench(c: &mut Criterion) {
    let policies = [
        ("least_request", "{}"),
        ("round_robin", "{loadBalancer: {simple: ROUND_ROBIN}}"),
        ("random", "{loadBalancer: {simple: RANDOM}}"),
        ("ring_hash", "{loadBalancer: {consistentHash: {httpHeaderName: x-user}}}"),
        ("maglev", "{loadBalancer: {consistentHash: {httpHeaderName: x-user, maglev: {}}}}"),
        ("least_request+outlier", "{outlierDetection: {consecutive5xxErrors: 5}}"),
        ("ring_hash+outlier", "{loadBalancer: {consistentHash: {httpHeaderName: x-user}}, outlierDetection: {consecutive5xxErrors: 5}}"),
    ];
    let mut headers = HeaderMap::new();
    headers.insert("x-user", "user-12345".parse().unwrap());
    let source = "10.0.0.7".parse().unwrap();
    for endpoints in [3usize, 50] {
        let state = ProxyState::from_yaml("mesh", &mesh(endpoints)).unwrap();
        let me = state.workload_by_uid("wp");
        let fronted = Fronted::Service {
            service: state
                .service_by_key("shop/reviews.shop.svc.cluster.local")
                .unwrap(),
            port: 80,
            vip: Some("10.96.0.1".parse().unwrap()),
        };
        let mut group = c.benchmark_group(format!("pick/{endpoints}_endpoints"));
        let mut rng = StdRng::seed_from_u64(1);
        group.bench_function("no_rule", |b| {
            b.iter(|| {
                black_box(
                    choose_endpoint(&state, me.as_deref(), &fronted, 15008, &mut rng).unwrap(),
                )
            })
        });
        for (name, policy) in policies {
            let bal = balancer(policy, &fronted);
            let hashing = matches!(bal.policy.load_balancer, LoadBalancer::ConsistentHash(_));
            let records = bal.policy.outlier.is_some();
            group.bench_function(name, |b| {
                b.iter(|| {
                    let hash = match &bal.policy.load_balancer {
                        LoadBalancer::ConsistentHash(ch) if hashing => {
                            request_hash(&ch.key, &headers, None, source, rand::random).hash
                        }
                        _ => None,
                    };
                    let choice = choose_among(
                        &state,
                        me.as_deref(),
                        &fronted,
                        15008,
                        &[],
                        Some((&bal, hash)),
                        &[],
                        &mut rng,
                    )
                    .unwrap();
                    let target: SocketAddr = choice.endpoint.target;
                    let held = bal.start(target);
                    if records {
                        bal.record(target, Outcome::Status(200), Instant::now());
                    }
                    drop(held);
                    black_box(choice)
                })
            });
        }
        group.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
