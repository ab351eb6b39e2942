//! How much memory the store holds per workload, and what an update costs, at mesh scale.
//!
//! ```sh
//! cargo run --release -p ambit-state --example store_memory -- [WORKLOADS [SERVICES]]
//! ```
//!
//! The mesh has the shape of `bench_xds`'s: HBONE workloads over 100 nodes and 50
//! namespaces, each an endpoint of one or two services. jemalloc's statistics give the
//! bytes the store holds (what jemalloc counts as allocated, not RSS: the node proxy's RSS
//! is measured by `bench_xds`).

use std::time::Instant;

use ambit_state::{ProxyState, Service, Workload};

#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

const NODES: usize = 100;
const NAMESPACES: usize = 50;

fn ns_of(i: usize) -> String {
    format!("ns{}", i % NAMESPACES)
}

fn service_host(j: usize) -> String {
    format!("svc{j}.{}.svc.cluster.local", ns_of(j))
}

fn workload(i: usize, services: usize, revision: &str) -> Workload {
    let mut w = Workload::new(format!("w{i}"), ns_of(i));
    w.uid = format!("Kubernetes//v1/Pod/{}/w{i}", ns_of(i)).into();
    w.trust_domain = "cluster.local".into();
    w.service_account = "default".into();
    w.node = format!("node{}", i % NODES).into();
    w.canonical_name = format!("w{i}").into();
    w.canonical_revision = revision.into();
    w.workload_type = "pod".into();
    w.workload_name = format!("w{i}").into();
    w.cluster_id = "Kubernetes".into();
    w.protocol = ambit_state::TunnelProtocol::Hbone;
    let ip = std::net::Ipv4Addr::new(
        10,
        1 + (i / 62_500) as u8,
        (i / 250 % 250) as u8,
        (i % 250 + 1) as u8,
    );
    w.workload_ips = vec![ip.into()];
    let first = i % services;
    let mut of = vec![first];
    if i % 2 == 1 {
        of.push((first + services / 2 + 1) % services);
    }
    for j in of {
        w.services.insert(
            format!("{}/{}", ns_of(j), service_host(j)).into(),
            [(80u16, 8080u16)].into_iter().collect(),
        );
    }
    w
}

fn service(j: usize) -> Service {
    let mut s = Service::new(format!("svc{j}"), ns_of(j), service_host(j));
    let vip = std::net::Ipv4Addr::new(
        10,
        96 + (j / 62_500) as u8,
        (j / 250 % 250) as u8,
        (j % 250 + 1) as u8,
    );
    s.vips = vec![format!("/{vip}").parse().expect("a VIP")];
    s.ports = [(80u16, 8080u16)].into_iter().collect();
    s
}

/// Bytes allocated and not yet freed, as jemalloc counts them.
fn live() -> isize {
    tikv_jemalloc_ctl::epoch::advance().expect("jemalloc's epoch");
    tikv_jemalloc_ctl::stats::allocated::read().expect("jemalloc's stats") as isize
}

fn main() {
    sizes();
    let mut args = std::env::args()
        .skip(1)
        .map(|a| a.parse::<usize>().expect("a count"));
    let workloads = args.next().unwrap_or(10_000);
    let services = args.next().unwrap_or(workloads / 10).max(1);

    let before = live();
    let started = Instant::now();
    let mut state = ProxyState::new();
    for j in 0..services {
        state.insert_service(service(j)).expect("a valid service");
    }
    for i in 0..workloads {
        state
            .insert_workload(workload(i, services, "v1"))
            .expect("a valid workload");
    }
    let built = started.elapsed();
    let held = live() - before;
    println!(
        "{workloads} workloads, {services} services: store holds {:.1} MiB, {:.0} B per workload; built in {:.0} ms",
        held as f64 / 1_048_576.0,
        held as f64 / workloads as f64,
        built.as_secs_f64() * 1e3,
    );

    // One workload changed, as an xDS update does: alone, then with a reader holding the
    // previous snapshot (copy-on-write).
    let mut times = Vec::new();
    for k in 0..200 {
        let t = Instant::now();
        state
            .insert_workload(workload(k * 37 % workloads, services, "v2"))
            .expect("a valid workload");
        times.push(t.elapsed().as_secs_f64() * 1e6);
    }
    times.sort_by(f64::total_cmp);
    println!(
        "update of one workload: p50 {:.1} µs, p99 {:.1} µs",
        times[times.len() / 2],
        times[times.len() * 99 / 100]
    );
    let shared = std::sync::Arc::new(state);
    let reader = shared.clone();
    let mut shared = shared;
    let t = Instant::now();
    std::sync::Arc::make_mut(&mut shared)
        .insert_workload(workload(1, services, "v3"))
        .expect("a valid workload");
    println!(
        "update while a reader holds the snapshot: {:.2} ms",
        t.elapsed().as_secs_f64() * 1e3
    );
    drop(reader);
}
/// The sizes of what the store holds once per item.
fn sizes() {
    println!(
        "size_of Workload {} Service {} GatewayAddress {} Locality {}",
        std::mem::size_of::<Workload>(),
        std::mem::size_of::<Service>(),
        std::mem::size_of::<ambit_state::GatewayAddress>(),
        std::mem::size_of::<ambit_state::Locality>()
    );
}
