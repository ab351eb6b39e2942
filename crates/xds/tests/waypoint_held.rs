//! The delta client's estimate of what waypoint policies hold
//! (`ambit_xds::waypoint::measure`) against what they do hold: each response below is
//! handled and applied to a waypoint's store while an allocator counts the live bytes of
//! this thread (each block rounded up to jemalloc's size class). The estimate must never
//! be below what is held (the budget is a bound only then), and for real-shaped policies
//! within a small factor of it.

// A counting allocator implements `GlobalAlloc`, which is `unsafe` by its nature; it only
// forwards to the system allocator.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::fmt::Write as _;

use ambit_manifests::ParseOptions;
use ambit_proto::{DeltaDiscoveryResponse, Resource, WAYPOINT_POLICY_TYPE};
use ambit_xds::{
    to_proto_waypoint_policy, DeltaClient, Limits, NodeConfig, WaypointPolicies,
    WaypointPolicyStore,
};
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

// ----- policies ---------------------------------------------------------------------------

/// The resources of the AuthorizationPolicies `yaml` holds, as `ambit control` serves
/// them.
fn resources(yaml: &str) -> Vec<Resource> {
    let parsed = ambit_manifests::parse_documents("t.yaml", yaml, &ParseOptions::default());
    assert!(parsed.errors.is_empty(), "{:?}", parsed.errors.first());
    parsed
        .policies
        .iter()
        .map(|p| Resource {
            name: p.value.authorization.key(),
            version: "0123456789abcdef".into(),
            resource: Some(prost_types::Any {
                type_url: WAYPOINT_POLICY_TYPE.into(),
                value: to_proto_waypoint_policy(&p.value).unwrap().encode_to_vec(),
            }),
            ..Default::default()
        })
        .collect()
}

fn head(out: &mut String, name: &str, action: &str) {
    write!(
        out,
        "---\napiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {{name: {name}, namespace: shop}}\nspec:\n  targetRefs: [{{kind: Service, name: reviews}}, {{kind: Gateway, group: gateway.networking.k8s.io, name: waypoint}}]\n  action: {action}\n  rules:\n"
    )
    .unwrap();
}

/// Policies as people write them: a few rules of sources, operations and conditions.
fn real(n: usize) -> String {
    let mut out = String::new();
    for k in 0..n {
        head(&mut out, &format!("policy-{k}"), "ALLOW");
        out.push_str(
            "  - from: [{source: {principals: [\"cluster.local/ns/shop/sa/frontend\", \"cluster.local/ns/shop/sa/admin\"]}}]\n    to: [{operation: {methods: [GET, HEAD], paths: [\"/api/v1/*\", \"/users/{*}/info\"]}}]\n  - from: [{source: {namespaces: [shop, \"prod-*\"]}}, {source: {ipBlocks: [10.0.0.0/8]}}]\n    to: [{operation: {ports: [\"8080\"], hosts: [reviews.shop.svc.cluster.local]}}]\n    when: [{key: \"request.headers[x-tenant]\", values: [acme]}, {key: \"request.auth.claims[groups]\", values: [dev]}]\n",
        );
    }
    out
}

/// The most match objects a policy may have (16,384), each as small as a file allows.
fn many_matches(n: usize) -> String {
    let mut out = String::new();
    for k in 0..n {
        head(&mut out, &format!("wide-{k}"), "DENY");
        for _ in 0..32 {
            out.push_str("  - from:\n");
            for _ in 0..512 {
                out.push_str("    - source: {namespaces: [a]}\n");
            }
        }
    }
    out
}

/// Values that each become more than their text: path templates of one-letter
/// segments, nested claims, long value lists of short values.
fn dense_values(n: usize) -> String {
    let template = format!("/{}{{**}}", "a/{*}/".repeat(300));
    let claims = "[a]".repeat(400);
    let ports: Vec<String> = (1..4000).map(|p| format!("\"{p}\"")).collect();
    let mut out = String::new();
    for k in 0..n {
        head(&mut out, &format!("dense-{k}"), "ALLOW");
        writeln!(
            out,
            "  - to: [{{operation: {{paths: [\"{template}\"], ports: [{}]}}}}]\n    when: [{{key: \"request.auth.claims{claims}\", values: [x, y, z]}}, {{key: \"request.headers[x-a]\", notValues: [\"*b\"]}}]",
            ports.join(", ")
        )
        .unwrap();
    }
    out
}

/// Handles `resources` as one response and applies it to a waypoint's store. Returns
/// (the client's estimate, the live bytes the client and the store gained).
fn held(resources: Vec<Resource>) -> (u64, i64) {
    let bytes = DeltaDiscoveryResponse {
        type_url: WAYPOINT_POLICY_TYPE.into(),
        nonce: "1".into(),
        resources,
        ..Default::default()
    }
    .encode_to_vec();
    let limits = Limits::default();
    let mut client = DeltaClient::subscribing(NodeConfig::default().to_node(), limits)
        .subscribe(WaypointPolicies::default());
    let mut store = WaypointPolicyStore::default();
    let before = live();
    let handled = client.handle_bytes(&bytes).unwrap();
    assert!(handled.rejected.is_empty(), "{:?}", handled.rejected);
    if handled.batch.try_apply(&mut store).is_err() {
        panic!("a batch of another type");
    }
    // What the waypoint keeps of them: the store's pointers, shared.
    let shared = store.to_vec();
    let gained = live() - before;
    drop(shared);
    (client.held(WAYPOINT_POLICY_TYPE).unwrap(), gained)
}

/// Each case: (what, the policies, the most the estimate may be over what is held).
#[test]
fn the_estimate_bounds_what_is_held() {
    let cases: Vec<(&str, String, f64)> = vec![
        ("real policies", real(1_000), 4.0),
        ("policies of 16,384 match objects", many_matches(3), 4.0),
        ("policies of dense values", dense_values(20), 4.0),
    ];
    for (what, yaml, most) in cases {
        let (estimate, gained) = held(resources(&yaml));
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

/// 10,000 real policies (one per service of issue 23's mesh, every waypoint getting
/// all of them) fit the default budget two and a half times over.
#[test]
fn a_real_mesh_fits_the_default_budget() {
    let one = held(resources(&real(1))).0;
    assert!(
        10_000 * one * 5 / 2 <= ambit_xds::MAX_HELD_WAYPOINT_POLICIES,
        "10,000 policies: {} bytes",
        10_000 * one
    );
}
