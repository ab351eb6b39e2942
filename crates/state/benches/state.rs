//! The data-path decisions of the state store, at mesh scale: L4 authorization, endpoint
//! selection and VIP lookup. One decision per iteration, on a store built beforehand.
//! Figures in BENCHMARKS.md ("cargo bench -p ambit-state").

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use ambit_identity::SpiffeId;
use ambit_state::{
    pick_endpoint, route, Authorization, PickMode, PolicyAction, PolicyScope, ProxyState,
    RbacContext, RbacMatch, RouteInput, Service, StringMatch, Workload,
};
use criterion::{criterion_group, criterion_main, Criterion};
use rand::rngs::StdRng;
use rand::SeedableRng;

fn ip(n: u32) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + n))
}

fn workload(name: &str, namespace: &str, n: u32) -> Workload {
    let mut w = Workload::new(name, namespace);
    w.workload_ips = vec![ip(n)];
    w.protocol = ambit_state::TunnelProtocol::Hbone;
    w
}

fn policy(
    name: String,
    namespace: &str,
    scope: PolicyScope,
    action: PolicyAction,
    rules: usize,
) -> Authorization {
    // Each rule: a namespace and a port, neither of which the benchmark client has, so
    // every rule is evaluated (the worst case).
    let rule = || {
        vec![vec![RbacMatch {
            namespaces: vec![StringMatch::Exact("nobody".into())],
            destination_ports: vec![9999],
            ..RbacMatch::default()
        }]]
    };
    Authorization {
        name,
        namespace: namespace.into(),
        scope,
        action,
        rules: (0..rules).map(|_| rule()).collect(),
        dry_run: false,
    }
}

fn ctx() -> RbacContext {
    RbacContext {
        source_identity: Some(
            SpiffeId::parse("spiffe://cluster.local/ns/client/sa/client").unwrap(),
        ),
        source_ip: ip(1),
        destination: SocketAddr::new(ip(2), 8080),
    }
}

fn rbac(c: &mut Criterion) {
    let mut g = c.benchmark_group("rbac");
    // 10,000 namespace-scoped ALLOW policies over 1,000 namespaces: 10 apply.
    let mut s = ProxyState::new();
    let dst = workload("server", "ns-0", 2);
    s.insert_workload(dst.clone()).unwrap();
    for i in 0..10_000 {
        let ns = format!("ns-{}", i % 1000);
        s.insert_policy(policy(
            format!("p{i}"),
            &ns,
            PolicyScope::Namespace,
            PolicyAction::Allow,
            1,
        ))
        .unwrap();
    }
    let ctx = ctx();
    g.bench_function("namespace_10k_policies_10_apply", |b| {
        b.iter(|| black_box(s.authorize(black_box(&ctx), &dst, &ambit_state::Unobserved)))
    });
    // 10,000 global DENY policies of 10 rules each: all apply, none matches.
    let mut s = ProxyState::new();
    s.insert_workload(dst.clone()).unwrap();
    for i in 0..10_000 {
        s.insert_policy(policy(
            format!("d{i}"),
            "istio-system",
            PolicyScope::Global,
            PolicyAction::Deny,
            10,
        ))
        .unwrap();
    }
    g.bench_function("global_deny_10k_policies_10_rules", |b| {
        b.iter(|| black_box(s.authorize(black_box(&ctx), &dst, &ambit_state::Unobserved)))
    });
    g.finish();
}

fn endpoints(c: &mut Criterion) {
    let mut g = c.benchmark_group("route");
    let mut s = ProxyState::new();
    let client = workload("client", "client", 1);
    s.insert_workload(client.clone()).unwrap();
    let key = "default/echo.default.svc.cluster.local";
    for i in 0..10_000u32 {
        let mut w = workload(&format!("echo-{i}"), "default", 100_000 + i);
        w.capacity = 1 + i % 4;
        w.services
            .insert(key.into(), [(80, 8080)].into_iter().collect());
        s.insert_workload(w).unwrap();
    }
    let mut svc = Service::new("echo", "default", "echo.default.svc.cluster.local");
    svc.vips = vec!["/10.96.0.10".parse().unwrap()];
    svc.ports.insert(80, 8080);
    s.insert_service(svc).unwrap();
    let input = RouteInput {
        source: &client,
        dst: "10.96.0.10:80".parse().unwrap(),
        src_ip: client.workload_ips[0],
        network: "",
        hbone_port: 15008,
    };
    let mut rng = StdRng::seed_from_u64(1);
    // Built on first use after a change: not part of the measured decision.
    route(&s, &input, &mut rng).unwrap();
    let svc = s
        .service_by_vip("", "10.96.0.10".parse().unwrap(), "client")
        .unwrap();
    let dialed: IpAddr = "10.96.0.10".parse().unwrap();
    g.bench_function("pick_endpoint_10k_endpoints", |b| {
        b.iter(|| {
            black_box(
                pick_endpoint(
                    &s,
                    &svc,
                    80,
                    black_box(dialed),
                    &client,
                    PickMode::Standard,
                    &mut rng,
                )
                .unwrap(),
            )
        })
    });
    // The whole outbound decision: VIP lookup, endpoint, HBONE route with its identities.
    g.bench_function("route_vip_10k_endpoints", |b| {
        b.iter(|| black_box(route(&s, black_box(&input), &mut rng).unwrap()))
    });
    g.finish();

    // VIP lookup among 100,000 workloads and 1,000 services.
    let mut g = c.benchmark_group("lookup");
    let mut s = ProxyState::new();
    for i in 0..100_000u32 {
        s.insert_workload(workload(
            &format!("w{i}"),
            &format!("ns-{}", i % 1000),
            200_000 + i,
        ))
        .unwrap();
    }
    for i in 0..1000u32 {
        let mut svc = Service::new(format!("s{i}"), format!("ns-{i}"), format!("s{i}.ns-{i}"));
        svc.vips = vec![format!("/10.96.{}.{}", i / 250, i % 250).parse().unwrap()];
        svc.ports.insert(80, 8080);
        s.insert_service(svc).unwrap();
    }
    let vip: IpAddr = "10.96.2.7".parse().unwrap();
    g.bench_function("vip_100k_workloads", |b| {
        b.iter(|| black_box(s.service_by_vip("", black_box(vip), "ns-507")))
    });
    let pod = ip(250_000);
    g.bench_function("workload_ip_100k_workloads", |b| {
        b.iter(|| black_box(s.workload_by_ip("", black_box(pod))))
    });
    g.finish();
}

/// Issue 23's scale: the decisions in a store of 100,000 workloads and 10,000 services
/// (ten endpoints each), with a namespace policy in each of its 1,000 namespaces.
fn scale(c: &mut Criterion) {
    let mut g = c.benchmark_group("scale");
    let mut s = ProxyState::new();
    let client = workload("client", "client", 1);
    s.insert_workload(client.clone()).unwrap();
    let key = |j: u32| format!("ns-{}/s{j}.ns-{}", j % 1000, j % 1000);
    for i in 0..100_000u32 {
        let mut w = workload(&format!("w{i}"), &format!("ns-{}", i % 1000), 200_000 + i);
        w.services
            .insert(key(i % 10_000).into(), [(80, 8080)].into_iter().collect());
        s.insert_workload(w).unwrap();
    }
    for j in 0..10_000u32 {
        let ns = format!("ns-{}", j % 1000);
        let mut svc = Service::new(format!("s{j}"), ns.clone(), format!("s{j}.{ns}"));
        svc.vips = vec![format!("/10.96.{}.{}", j / 250, j % 250).parse().unwrap()];
        svc.ports.insert(80, 8080);
        s.insert_service(svc).unwrap();
    }
    for n in 0..1000 {
        let ns = format!("ns-{n}");
        s.insert_policy(policy(
            format!("p{n}"),
            &ns,
            PolicyScope::Namespace,
            PolicyAction::Allow,
            1,
        ))
        .unwrap();
    }
    let input = RouteInput {
        source: &client,
        dst: "10.96.20.7:80".parse().unwrap(),
        src_ip: client.workload_ips[0],
        network: "",
        hbone_port: 15008,
    };
    let mut rng = StdRng::seed_from_u64(1);
    route(&s, &input, &mut rng).unwrap();
    g.bench_function("route_vip_100k_workloads", |b| {
        b.iter(|| black_box(route(&s, black_box(&input), &mut rng).unwrap()))
    });
    let dst = s.workload_by_ip("", ip(200_507)).unwrap();
    let ctx = ctx();
    g.bench_function("authorize_100k_workloads", |b| {
        b.iter(|| black_box(s.authorize(black_box(&ctx), &dst, &ambit_state::Unobserved)))
    });
    g.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(50)
}

criterion_group! { name = benches; config = config(); targets = rbac, endpoints, scale }
criterion_main!(benches);
