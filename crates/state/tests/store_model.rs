//! The store against a plain model: random sequences of workload and service adds,
//! changes and removals (services before and after their workloads, workloads moving
//! between services and addresses, host-network ones), after each of which every index
//! answers what a scan of the model answers. A snapshot taken along the way must keep
//! answering as the model did when it was taken (copy-on-write).

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};

use ambit_state::{NetworkMode, PortMap, ProxyState, Service, Workload};
use proptest::prelude::*;

const WORKLOADS: u8 = 12;
const SERVICES: u8 = 5;
const NETWORKS: [&str; 2] = ["", "net2"];

#[derive(Debug, Clone)]
enum Op {
    /// Workload `id`, in services (bit set), with a second address or not, on a network,
    /// host network or not, port offset for its port maps.
    PutWorkload {
        id: u8,
        services: u8,
        second_ip: bool,
        network: usize,
        host_network: bool,
        port: u16,
    },
    RemoveWorkload(u8),
    /// Service `id` with a VIP (shared by the pair 2k, 2k+1 to exercise shared VIPs) in a
    /// network, and a hostname shared by ids of the same parity.
    PutService {
        id: u8,
        network: usize,
        target: u16,
    },
    RemoveService(u8),
    /// Keep a snapshot of the store and of the model now.
    Snapshot,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..WORKLOADS, any::<u8>(), any::<bool>(), 0..NETWORKS.len(), prop::bool::weighted(0.15), 1..4u16)
            .prop_map(|(id, services, second_ip, network, host_network, port)| Op::PutWorkload {
                id, services, second_ip, network, host_network, port,
            }),
        2 => (0..WORKLOADS).prop_map(Op::RemoveWorkload),
        2 => (0..SERVICES, 0..NETWORKS.len(), 1..3u16)
            .prop_map(|(id, network, target)| Op::PutService { id, network, target }),
        1 => (0..SERVICES).prop_map(Op::RemoveService),
        1 => Just(Op::Snapshot),
    ]
}

fn service_key(id: u8) -> String {
    format!("ns{}/svc{id}.example", id % 2)
}

fn uid(id: u8) -> String {
    format!("c//v1/Pod/ns/w{id}")
}

/// A workload's own addresses: unique to it, so "which workload has this address" has one
/// answer in the model.
fn ips(id: u8, second: bool) -> Vec<IpAddr> {
    let mut v = vec![IpAddr::V4(Ipv4Addr::new(10, 0, 0, id))];
    if second {
        v.push(IpAddr::V4(Ipv4Addr::new(10, 1, 0, id)));
    }
    v
}

fn vip(id: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 96, 0, id / 2))
}

fn workload(
    id: u8,
    services: u8,
    second_ip: bool,
    network: usize,
    host: bool,
    port: u16,
) -> Workload {
    let mut w = Workload::new(format!("w{id}"), "ns");
    w.uid = uid(id).into();
    w.network = NETWORKS[network].into();
    w.workload_ips = ips(id, second_ip);
    if host {
        w.network_mode = NetworkMode::HostNetwork;
    }
    for s in 0..SERVICES {
        if services & (1 << s) != 0 {
            let ports: PortMap = [(80, 8000 + port), (443, 8443)].into();
            w.services.insert(service_key(s).into(), ports);
        }
    }
    w
}

fn service(id: u8, network: usize, target: u16) -> Service {
    let mut s = Service::new(
        format!("svc{id}"),
        format!("ns{}", id % 2),
        format!("svc{id}.example"),
    );
    s.vips = vec![format!("{}/{}", NETWORKS[network], vip(id))
        .parse()
        .unwrap()];
    s.ports = [(80, 8000 + target)].into();
    s
}

#[derive(Debug, Clone, Default)]
struct Model {
    workloads: BTreeMap<String, Workload>,
    services: BTreeMap<String, Service>,
}

/// What an operation changes, built once for both the store and the model.
enum Change {
    Workload(Workload),
    RemoveWorkload(String),
    Service(Service),
    RemoveService(String),
    Nothing,
}

fn change(op: &Op) -> Change {
    match *op {
        Op::PutWorkload {
            id,
            services,
            second_ip,
            network,
            host_network,
            port,
        } => Change::Workload(workload(
            id,
            services,
            second_ip,
            network,
            host_network,
            port,
        )),
        Op::RemoveWorkload(id) => Change::RemoveWorkload(uid(id)),
        Op::PutService {
            id,
            network,
            target,
        } => Change::Service(service(id, network, target)),
        Op::RemoveService(id) => Change::RemoveService(service_key(id)),
        Op::Snapshot => Change::Nothing,
    }
}

impl Model {
    fn apply(&mut self, op: &Op) {
        match change(op) {
            Change::Workload(w) => {
                self.workloads.insert(w.uid.to_string(), w);
            }
            Change::RemoveWorkload(uid) => {
                self.workloads.remove(&uid);
            }
            Change::Service(s) => {
                self.services.insert(s.key(), s);
            }
            Change::RemoveService(key) => {
                self.services.remove(&key);
            }
            Change::Nothing => {}
        }
    }
}

fn apply(state: &mut ProxyState, op: &Op) {
    match change(op) {
        Change::Workload(w) => {
            state.insert_workload(w).unwrap();
        }
        Change::RemoveWorkload(uid) => {
            state.remove_workload(&uid);
        }
        Change::Service(s) => {
            state.insert_service(s).unwrap();
        }
        Change::RemoveService(key) => {
            state.remove_service(&key);
        }
        Change::Nothing => {}
    }
}

/// Every index of `state` answers as a scan of `model` does.
fn agrees(state: &ProxyState, model: &Model) -> Result<(), TestCaseError> {
    // Workloads, in uid order, whole.
    let held: Vec<&Workload> = state.workloads().map(|w| &**w).collect();
    let want: Vec<&Workload> = model.workloads.values().collect();
    prop_assert_eq!(held, want);
    for id in 0..WORKLOADS {
        prop_assert_eq!(
            state.workload_by_uid(&uid(id)).map(|w| (*w).clone()),
            model.workloads.get(&uid(id)).cloned()
        );
    }
    // Addresses: the workload that has it in that network, never a host-network one.
    for id in 0..WORKLOADS {
        for ip in ips(id, true) {
            for net in NETWORKS {
                let want = model
                    .workloads
                    .values()
                    .find(|w| {
                        w.network == net && !w.is_host_network() && w.workload_ips.contains(&ip)
                    })
                    .map(|w| w.uid.to_string());
                let held = state.workload_by_ip(net, ip).map(|w| w.uid.to_string());
                prop_assert_eq!(held, want, "address {}/{}", net, ip);
            }
        }
    }
    // Services, by key, VIP and hostname.
    let held: Vec<&Service> = state.services().map(|s| &**s).collect();
    let want: Vec<&Service> = model.services.values().collect();
    prop_assert_eq!(held, want);
    for id in 0..SERVICES {
        for net in NETWORKS {
            let held: Vec<String> = state
                .services_at_vip(net, vip(id))
                .map(|s| s.key())
                .collect();
            let want: Vec<String> = model
                .services
                .values()
                .filter(|s| {
                    s.vips
                        .iter()
                        .any(|v| v.network == net && v.address == vip(id))
                })
                .map(|s| s.key())
                .collect();
            prop_assert_eq!(held, want, "VIP {}/{}", net, vip(id));
        }
        let host = format!("svc{id}.example");
        let held: Vec<String> = state
            .services_with_hostname(&host)
            .map(|s| s.key())
            .collect();
        let want: Vec<String> = model
            .services
            .values()
            .filter(|s| s.hostname == host)
            .map(|s| s.key())
            .collect();
        prop_assert_eq!(held, want, "hostname {}", host);
    }
    // Endpoints of every key, known service or not, with the port maps the workloads
    // declare, in uid order; staged ones are those of keys with no service.
    let mut staged_want = BTreeSet::new();
    for id in 0..SERVICES {
        let key = service_key(id);
        let held: Vec<(String, PortMap)> = state
            .endpoints(&key)
            .map(|e| (e.workload.uid.to_string(), e.ports.clone()))
            .collect();
        let want: Vec<(String, PortMap)> = model
            .workloads
            .values()
            .filter_map(|w| Some((w.uid.to_string(), w.services.get(key.as_str())?.clone())))
            .collect();
        if !want.is_empty() && !model.services.contains_key(&key) {
            staged_want.insert(key.clone());
        }
        prop_assert_eq!(held, want, "endpoints of {}", key);
    }
    let staged_held: BTreeSet<String> = state
        .staged_services()
        .map(|(k, _)| k.to_string())
        .collect();
    prop_assert_eq!(staged_held, staged_want);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn the_store_answers_as_a_scan_of_the_model_does(ops in prop::collection::vec(op(), 1..60)) {
        let mut state = ProxyState::new();
        let mut model = Model::default();
        let mut snapshots: Vec<(std::sync::Arc<ProxyState>, Model)> = Vec::new();
        let mut shared = std::sync::Arc::new(ProxyState::new());
        for op in &ops {
            apply(&mut state, op);
            // The same change through copy-on-write, as the node proxy applies batches.
            apply(std::sync::Arc::make_mut(&mut shared), op);
            model.apply(op);
            if let Op::Snapshot = op {
                snapshots.push((shared.clone(), model.clone()));
            }
            agrees(&state, &model)?;
        }
        agrees(&shared, &model)?;
        for (snapshot, then) in &snapshots {
            agrees(snapshot, then)?;
        }
    }
}
