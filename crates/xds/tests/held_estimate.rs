//! The delta client's estimate of what its resources hold ([`ambit_xds::held`]) against
//! what they do hold: each response below is handled and applied to a store while an
//! allocator counts the live bytes of this thread (each block rounded up to jemalloc's
//! size class, as the node proxy's allocator hands it out), the store's lazily built
//! endpoint indexes included. The estimate must never be below what is held (the budget
//! is a bound only then), and for real-shaped resources within a small factor of it (so
//! that a real mesh fits its budget). Then issue 23's target mesh against the default
//! budgets.

// A counting allocator implements `GlobalAlloc`, which is `unsafe` by its nature; it only
// forwards to the system allocator.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use ambit_proto::istio::security as psec;
use ambit_proto::istio::workload as pw;
use ambit_proto::{DeltaDiscoveryResponse, Resource, ADDRESS_TYPE, AUTHORIZATION_TYPE};
use ambit_state::{pick_endpoint, PickMode, ProxyState, Service};
use ambit_xds::{DeltaClient, NodeConfig};
use prost::Message;

// ----- a counting allocator ---------------------------------------------------------------

struct Counting;

thread_local! {
    /// Bytes live on this thread, each block at its jemalloc size class.
    static LIVE: Cell<i64> = const { Cell::new(0) };
}

/// jemalloc's size class for `n` bytes: multiples of 16 up to 128, then four classes per
/// doubling.
fn class(n: usize) -> i64 {
    let c = if n <= 8 {
        8
    } else if n <= 128 {
        n.div_ceil(16) * 16
    } else {
        let spacing = (n - 1).ilog2() - 2;
        (n - 1) / (1 << spacing) * (1 << spacing) + (1 << spacing)
    };
    c as i64
}

fn note(d: i64) {
    let _ = LIVE.try_with(|c| c.set(c.get() + d));
}

// SAFETY: every call is passed to `System` as is; the counter is a const-initialized
// thread local without a destructor, which never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(l) };
        if !p.is_null() {
            note(class(l.size()));
        }
        p
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(l) };
        if !p.is_null() {
            note(class(l.size()));
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) };
        note(-class(l.size()));
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        let q = unsafe { System.realloc(p, l, new) };
        if !q.is_null() {
            note(class(new) - class(l.size()));
        }
        q
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn live() -> i64 {
    LIVE.with(Cell::get)
}

#[test]
fn size_classes() {
    let got: Vec<i64> = [1, 8, 9, 17, 128, 129, 160, 161, 256, 257, 4097, 100_000]
        .map(class)
        .to_vec();
    assert_eq!(
        got,
        [8, 8, 16, 32, 128, 160, 160, 192, 256, 320, 5120, 114_688]
    );
}

// ----- resources ------------------------------------------------------------------------

fn resource(type_url: &str, name: String, value: Vec<u8>) -> Resource {
    Resource {
        name,
        version: "2024-06-11T10:00:00Z/42".into(),
        resource: Some(prost_types::Any {
            type_url: type_url.into(),
            value,
        }),
        ..Default::default()
    }
}

fn workload_resource(w: pw::Workload) -> Resource {
    let name = w.uid.clone();
    let value = pw::Address {
        r#type: Some(pw::address::Type::Workload(w)),
    }
    .encode_to_vec();
    resource(ADDRESS_TYPE, name, value)
}

fn service_resource(s: pw::Service) -> Resource {
    let name = format!("{}/{}", s.namespace, s.hostname);
    let value = pw::Address {
        r#type: Some(pw::address::Type::Service(s)),
    }
    .encode_to_vec();
    resource(ADDRESS_TYPE, name, value)
}

fn policy_resource(p: psec::Authorization) -> Resource {
    let name = format!("{}/{}", p.namespace, p.name);
    resource(AUTHORIZATION_TYPE, name, p.encode_to_vec())
}

fn hostname_gateway(ns: &str) -> pw::GatewayAddress {
    pw::GatewayAddress {
        destination: Some(pw::gateway_address::Destination::Hostname(
            pw::NamespacedHostname {
                namespace: ns.into(),
                hostname: format!("waypoint.{ns}.svc.cluster.local"),
            },
        )),
        hbone_mtls_port: 15008,
    }
}

fn ports(n: u32, from: u32) -> Vec<pw::Port> {
    (0..n)
        .map(|p| pw::Port {
            service_port: from + p,
            target_port: from + 1000 + p,
            ..Default::default()
        })
        .collect()
}

/// A pod as istiod describes it in a large mesh, with long names: two addresses (dual
/// stack), three services of four ports, three selecting policies, a waypoint, locality.
fn real_workload(i: usize) -> pw::Workload {
    let ns = format!("team-{:04}", i % 1000);
    let name = format!("checkout-service-7d9f8b6c5d-{i:06}");
    let [a, b, c] = [(i >> 16) as u8, (i >> 8) as u8, i as u8];
    pw::Workload {
        uid: format!("cluster-east-1//v1/Pod/{ns}/{name}"),
        name,
        namespace: ns.clone(),
        addresses: vec![
            vec![10, a, b, c].into(),
            [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, a, b, c]
                .to_vec()
                .into(),
        ],
        network: "network-east".into(),
        tunnel_protocol: pw::TunnelProtocol::Hbone as i32,
        trust_domain: "cluster.local".into(),
        service_account: "checkout-service-account".into(),
        waypoint: Some(hostname_gateway(&ns)),
        node: format!("gke-prod-east-pool-2-{:08x}-{:04}", i / 50, i % 97),
        canonical_name: "checkout-service".into(),
        canonical_revision: "v2-20240611".into(),
        workload_type: pw::WorkloadType::Deployment as i32,
        workload_name: "checkout-service".into(),
        cluster_id: "cluster-east-1".into(),
        authorization_policies: (0..3).map(|k| format!("{ns}/allow-frontend-{k}")).collect(),
        // Ten services per namespace, each pod in three of them.
        services: (0..3)
            .map(|k| {
                let svc = (i / 1000 + k) % 10;
                (
                    format!("{ns}/checkout-{svc}.{ns}.svc.cluster.local"),
                    pw::PortList {
                        ports: ports(4, 8080),
                    },
                )
            })
            .collect(),
        locality: Some(pw::Locality {
            region: "us-east1".into(),
            zone: "us-east1-b".into(),
            subzone: String::new(),
        }),
        ..Default::default()
    }
}

/// A service of that mesh: two VIPs, eight ports, two subject alt names, a waypoint.
fn real_service(j: usize) -> pw::Service {
    let ns = format!("team-{:04}", j % 1000);
    let [a, b] = [(j >> 8) as u8, j as u8];
    let vip = |address: Vec<u8>| pw::NetworkAddress {
        network: "network-east".into(),
        address: address.into(),
        length: None,
    };
    pw::Service {
        name: format!("checkout-{}", j / 1000),
        namespace: ns.clone(),
        hostname: format!("checkout-{}.{ns}.svc.cluster.local", j / 1000),
        addresses: vec![
            vip(vec![10, 96, a, b]),
            vip(vec![0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x96, a, b]),
        ],
        ports: ports(8, 80),
        subject_alt_names: vec![
            format!("spiffe://cluster.local/ns/{ns}/sa/checkout"),
            format!("spiffe://cluster.local/ns/{ns}/sa/checkout-canary"),
        ],
        waypoint: Some(hostname_gateway(&ns)),
        ..Default::default()
    }
}

fn exact(s: String) -> psec::StringMatch {
    psec::StringMatch {
        match_type: Some(psec::string_match::MatchType::Exact(s)),
    }
}

/// A policy of that mesh: three rules, each `from` principals or namespaces, `to` four
/// ports, `when` a source range.
fn real_policy(k: usize) -> psec::Authorization {
    let ns = format!("team-{:04}", k % 1000);
    let rule = |r: usize| psec::Rule {
        clauses: vec![
            psec::Clause {
                matches: vec![
                    psec::Match {
                        principals: (0..3)
                            .map(|p| exact(format!("cluster.local/ns/{ns}/sa/frontend-{r}-{p}")))
                            .collect(),
                        ..Default::default()
                    },
                    psec::Match {
                        namespaces: vec![exact(format!("gateway-{r}")), exact(ns.clone())],
                        ..Default::default()
                    },
                ],
            },
            psec::Clause {
                matches: vec![psec::Match {
                    destination_ports: vec![8080, 8081, 8443, 9090],
                    ..Default::default()
                }],
            },
            psec::Clause {
                matches: vec![psec::Match {
                    source_ips: vec![psec::Address {
                        address: vec![10, r as u8, 0, 0].into(),
                        length: 16,
                    }],
                    ..Default::default()
                }],
            },
        ],
    };
    let rules = (0..3).map(rule).collect();
    psec::Authorization {
        name: format!("allow-frontend-{}", k / 1000),
        namespace: ns.clone(),
        scope: psec::Scope::WorkloadSelector as i32,
        action: psec::Action::Allow as i32,
        rules,
        ..Default::default()
    }
}

/// A policy of `matches` empty match objects in rules of 4,096 (the split attack's).
fn empty_policy(k: usize, matches: usize) -> psec::Authorization {
    psec::Authorization {
        name: format!("p{k}"),
        namespace: "ns".into(),
        rules: (0..matches.div_ceil(4096))
            .map(|r| psec::Rule {
                clauses: vec![psec::Clause {
                    matches: vec![psec::Match::default(); 4096.min(matches - r * 4096)],
                }],
            })
            .collect(),
        ..Default::default()
    }
}

/// A policy whose match objects set every kind of value, with long strings.
fn valued_policy(k: usize) -> psec::Authorization {
    let long = |i: usize| format!("{}-{i}", "x".repeat(200));
    let m = |i: usize| psec::Match {
        namespaces: (0..3).map(|v| exact(long(v + i))).collect(),
        not_principals: vec![psec::StringMatch {
            match_type: Some(psec::string_match::MatchType::Presence(())),
        }],
        service_accounts: (0..2)
            .map(|v| psec::ServiceAccountMatch {
                namespace: long(v),
                service_account: long(v + 1),
            })
            .collect(),
        destination_ips: (0..5)
            .map(|v| psec::Address {
                address: vec![10, 0, v, 0].into(),
                length: 24,
            })
            .collect(),
        not_source_ips: vec![psec::Address {
            address: vec![0xfd; 16].into(),
            length: 128,
        }],
        destination_ports: (1..=9).collect(),
        ..Default::default()
    };
    psec::Authorization {
        name: format!("valued-{k}"),
        namespace: "ns".into(),
        rules: (0..4)
            .map(|r| psec::Rule {
                clauses: (0..3)
                    .map(|c| psec::Clause {
                        matches: (0..5).map(|i| m(r * 100 + c * 10 + i)).collect(),
                    })
                    .collect(),
            })
            .collect(),
        ..Default::default()
    }
}

/// A workload at the shape limits' spirit: many addresses, many services of one port
/// each (every one a service of its own, so every endpoint map is new), many policies.
fn wide_workload(i: usize) -> pw::Workload {
    pw::Workload {
        uid: format!("c//v1/Pod/wide/w{i}"),
        name: format!("w{i}"),
        namespace: "wide".into(),
        network: "n".repeat(100),
        addresses: (0..64u8)
            .map(|a| vec![10, i as u8, (i >> 8) as u8, a].into())
            .collect(),
        services: (0..200)
            .map(|s| {
                (
                    format!("wide/s{i}-{s}.wide.svc.cluster.local"),
                    pw::PortList {
                        ports: ports(1, 80),
                    },
                )
            })
            .collect(),
        authorization_policies: (0..100).map(|p| format!("wide/policy-{p}")).collect(),
        ..Default::default()
    }
}

/// A service with many VIPs (half of them CIDRs), subject alt names and ports.
fn wide_service(j: usize) -> pw::Service {
    pw::Service {
        name: format!("s{j}"),
        namespace: "wide".into(),
        hostname: format!("s{j}.wide.svc.cluster.local"),
        addresses: (0..256u32)
            .map(|a| pw::NetworkAddress {
                network: "net".into(),
                address: vec![10, 100 + (a % 2) as u8, j as u8, (a / 2) as u8].into(),
                length: (a % 2 == 1).then_some(24),
            })
            .collect(),
        ports: ports(1024, 1),
        subject_alt_names: (0..1024)
            .map(|n| format!("spiffe://td/ns/wide/sa/{n}"))
            .collect(),
        load_balancing: Some(pw::LoadBalancing {
            routing_preference: vec![1, 2, 3, 4, 5, 6],
            ..Default::default()
        }),
        ..Default::default()
    }
}

// ----- measuring ------------------------------------------------------------------------

/// Handles `resources` as one response and applies it to a store, then builds the
/// endpoint index of every service the workloads name. Returns (the client's estimate,
/// the live bytes the client and the store gained).
fn held(type_url: &str, resources: Vec<Resource>) -> (u64, i64) {
    let bytes = DeltaDiscoveryResponse {
        type_url: type_url.into(),
        nonce: "1".into(),
        resources,
        ..Default::default()
    }
    .encode_to_vec();
    let mut client = DeltaClient::new(NodeConfig::default().to_node());
    let mut state = ProxyState::new();
    let source = ambit_state::Workload::new("src", "ns");
    let mut rng = rand::rngs::mock::StepRng::new(0, 1);
    let before = live();
    let handled = client.handle_bytes(&bytes).unwrap();
    assert!(handled.rejected.is_empty(), "{:?}", handled.rejected);
    handled.batch.apply(&mut state);
    let keys: std::collections::BTreeSet<String> = state
        .workloads()
        .flat_map(|w| w.services.keys().map(|k| k.to_string()).collect::<Vec<_>>())
        .collect();
    for key in keys {
        let (ns, host) = key.split_once('/').unwrap();
        let svc = Service::new("s", ns, host);
        let ip = "10.0.0.1".parse().unwrap();
        let _ = pick_endpoint(&state, &svc, 1, ip, &source, PickMode::Waypoint, &mut rng);
    }
    let gained = live() - before;
    drop(state);
    (client.held(type_url).unwrap(), gained)
}

/// Each case: (what, type, resources, the most the estimate may be over what is held).
#[test]
fn the_estimate_bounds_what_is_held() {
    type Case = (&'static str, &'static str, Vec<Resource>, f64);
    let cases: Vec<Case> = vec![
        (
            "real workloads and services",
            ADDRESS_TYPE,
            (0..2_000)
                .map(|i| workload_resource(real_workload(i)))
                .chain((0..200).map(|j| service_resource(real_service(j))))
                .collect(),
            3.0,
        ),
        (
            "real policies",
            AUTHORIZATION_TYPE,
            (0..2_000)
                .map(|k| policy_resource(real_policy(k)))
                .collect(),
            3.0,
        ),
        (
            "policies of 4,096 empty matches",
            AUTHORIZATION_TYPE,
            (0..50)
                .map(|k| policy_resource(empty_policy(k, 4096)))
                .collect(),
            3.0,
        ),
        (
            "policies of 16,384 empty matches",
            AUTHORIZATION_TYPE,
            (0..10)
                .map(|k| policy_resource(empty_policy(k, 16_384)))
                .collect(),
            3.0,
        ),
        (
            "policies of every kind of value",
            AUTHORIZATION_TYPE,
            (0..50).map(|k| policy_resource(valued_policy(k))).collect(),
            4.0,
        ),
        (
            "wide workloads",
            ADDRESS_TYPE,
            (0..20)
                .map(|i| workload_resource(wide_workload(i)))
                .collect(),
            f64::INFINITY,
        ),
        (
            "wide services",
            ADDRESS_TYPE,
            (0..20).map(|j| service_resource(wide_service(j))).collect(),
            f64::INFINITY,
        ),
    ];
    for (what, type_url, resources, most) in cases {
        let (estimate, gained) = held(type_url, resources);
        assert!(gained > 0, "{what}: nothing held");
        assert!(
            estimate >= gained as u64,
            "{what}: estimated {estimate} bytes, {gained} held"
        );
        let ratio = estimate as f64 / gained as f64;
        assert!(
            ratio <= most,
            "{what}: estimated {estimate} bytes, {ratio:.2} times the {gained} held"
        );
    }
}

/// Issue 23's target: 100,000 workloads and 10,000 services shaped as above, and two
/// such policies per service, fit the default budgets two and a half times over.
#[test]
fn a_real_mesh_fits_the_default_budgets() {
    let one = |type_url: &str, r: Resource| held(type_url, vec![r]).0;
    let addresses = 100_000 * one(ADDRESS_TYPE, workload_resource(real_workload(123_456)))
        + 10_000 * one(ADDRESS_TYPE, service_resource(real_service(12_345)));
    let policies = 20_000 * one(AUTHORIZATION_TYPE, policy_resource(real_policy(12_345)));
    assert!(
        addresses * 5 / 2 <= ambit_xds::delta::MAX_HELD_ADDRESSES,
        "the mesh's addresses: {addresses} bytes"
    );
    assert!(
        policies * 5 / 2 <= ambit_xds::delta::MAX_HELD_POLICIES,
        "the mesh's policies: {policies} bytes"
    );
}
