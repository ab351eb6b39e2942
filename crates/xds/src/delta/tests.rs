use super::*;
use ambit_proto::istio::security as psec;
use ambit_proto::istio::workload as pw;
use ambit_proto::{Resource, ADDRESS_TYPE, AUTHORIZATION_TYPE};
use ambit_state::ProxyState;
use prost::Message;
use prost_types::Any;

use crate::resource::Readiness;
use crate::shape::{Limit, ShapeError};
use crate::test_type::{
    widget, widget_estimate, Widget, WidgetOp, WidgetStore, Widgets, WIDGET_TYPE,
};
use crate::ConvertError;

fn node() -> Node {
    NodeConfig {
        pod_name: "ztunnel-x".into(),
        pod_namespace: "istio-system".into(),
        ..Default::default()
    }
    .to_node()
}

fn workload_any(uid: &str, ip: [u8; 4]) -> Any {
    let w = pw::Workload {
        uid: uid.into(),
        name: uid.rsplit('/').next().unwrap().into(),
        namespace: "ns1".into(),
        addresses: vec![ip.to_vec().into()],
        ..Default::default()
    };
    Any {
        type_url: ADDRESS_TYPE.into(),
        value: pw::Address {
            r#type: Some(pw::address::Type::Workload(w)),
        }
        .encode_to_vec(),
    }
}

fn service_any(host: &str) -> Any {
    let s = pw::Service {
        name: "s".into(),
        namespace: "ns1".into(),
        hostname: host.into(),
        addresses: vec![pw::NetworkAddress {
            network: String::new(),
            address: vec![10, 96, 0, 1].into(),
            length: None,
        }],
        ..Default::default()
    };
    Any {
        type_url: ADDRESS_TYPE.into(),
        value: pw::Address {
            r#type: Some(pw::address::Type::Service(s)),
        }
        .encode_to_vec(),
    }
}

fn policy_any(name: &str) -> Any {
    Any {
        type_url: AUTHORIZATION_TYPE.into(),
        value: psec::Authorization {
            name: name.into(),
            namespace: "ns1".into(),
            scope: psec::Scope::Namespace as i32,
            ..Default::default()
        }
        .encode_to_vec(),
    }
}

fn res(name: &str, version: &str, any: Option<Any>) -> Resource {
    Resource {
        name: name.into(),
        version: version.into(),
        resource: any,
        ..Default::default()
    }
}

fn resp(
    type_url: &str,
    nonce: &str,
    resources: Vec<Resource>,
    removed: &[&str],
) -> DeltaDiscoveryResponse {
    DeltaDiscoveryResponse {
        type_url: type_url.into(),
        nonce: nonce.into(),
        resources,
        removed_resources: removed.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

const W1: &str = "c//v1/Pod/ns1/a";
const W2: &str = "c//v1/Pod/ns1/b";

#[test]
fn initial_requests_are_wildcard_with_node() {
    let c = DeltaClient::new(node());
    let reqs = c.initial_requests();
    assert_eq!(reqs.len(), 2);
    assert_eq!(reqs[0].type_url, ADDRESS_TYPE);
    assert_eq!(reqs[1].type_url, AUTHORIZATION_TYPE);
    for r in &reqs {
        assert_eq!(r.node.as_ref().unwrap().id, node().id);
        assert!(r.resource_names_subscribe.is_empty());
        assert!(r.resource_names_unsubscribe.is_empty());
        assert!(r.initial_resource_versions.is_empty());
        assert!(r.response_nonce.is_empty());
    }
    assert!(!c.is_ready());
}

#[test]
fn ack_applies_and_versions_resent() {
    let mut c = DeltaClient::new(node());
    let h = c.handle(resp(
        ADDRESS_TYPE,
        "n1",
        vec![
            res(W1, "v1", Some(workload_any(W1, [10, 0, 0, 1]))),
            res("ns1/svc.ns1", "v1", Some(service_any("svc.ns1"))),
        ],
        &[],
    ));
    assert!(h.known_type);
    assert!(h.rejected.is_empty());
    assert_eq!(h.reply.type_url, ADDRESS_TYPE);
    assert_eq!(h.reply.response_nonce, "n1");
    assert_eq!(h.reply.error_detail, None);
    assert!(h.reply.node.is_none());
    assert!(h.payload_bytes > 0);
    let mut state = ProxyState::new();
    h.batch.apply(&mut state);
    assert!(state.workload_by_uid(W1).is_some());
    assert!(state.service_by_key("ns1/svc.ns1").is_some());

    assert!(!c.answered(ADDRESS_TYPE), "one type is not enough");
    let h = c.handle(resp(
        AUTHORIZATION_TYPE,
        "p1",
        vec![res("ns1/p", "7", Some(policy_any("p")))],
        &[],
    ));
    h.batch.apply(&mut state);
    assert_eq!(state.policies().count(), 1);
    assert!(c.answered(AUTHORIZATION_TYPE), "ready now");
    assert!(!c.answered(AUTHORIZATION_TYPE), "only once");
    assert!(c.is_ready());

    let reqs = c.initial_requests();
    assert_eq!(reqs[0].initial_resource_versions.len(), 2);
    assert_eq!(reqs[0].initial_resource_versions[W1], "v1");
    assert_eq!(reqs[1].initial_resource_versions["ns1/p"], "7");
}

#[test]
fn nack_rejects_one_and_applies_the_rest() {
    let mut c = DeltaClient::new(node());
    let mut bad_w = workload_any(W2, [10, 0, 0, 2]);
    // A 3-byte address.
    let mut a = pw::Address::decode(bad_w.value.as_slice()).unwrap();
    if let Some(pw::address::Type::Workload(w)) = &mut a.r#type {
        w.addresses = vec![vec![1, 2, 3].into()];
    }
    bad_w.value = a.encode_to_vec();
    let h = c.handle(resp(
        ADDRESS_TYPE,
        "n2",
        vec![
            res(W1, "v1", Some(workload_any(W1, [10, 0, 0, 1]))),
            res(W2, "v1", Some(bad_w)),
            res("missing", "v1", None),
            res("wrongtype", "v1", Some(policy_any("p"))),
            res(
                "garbage",
                "v1",
                Some(Any {
                    type_url: ADDRESS_TYPE.into(),
                    value: vec![0xff, 0xff],
                }),
            ),
        ],
        &[],
    ));
    let msg = &h.reply.error_detail.as_ref().unwrap().message;
    assert_eq!(h.reply.error_detail.as_ref().unwrap().code, 0);
    assert_eq!(h.reply.response_nonce, "n2");
    let parts: Vec<&str> = msg.split("; ").collect();
    assert_eq!(parts.len(), 4, "{msg}");
    assert_eq!(
        parts[0],
        format!("{W2}: addresses[0]: address must be 4 or 16 bytes, got 3")
    );
    assert_eq!(parts[1], "missing: XDS payload without resource");
    assert!(
        parts[2].starts_with(
            "wrongtype: payload of type \"type.googleapis.com/istio.security.Authorization\""
        ),
        "{}",
        parts[2]
    );
    assert!(
        parts[3].starts_with("garbage: cannot decode istio.workload.Address"),
        "{}",
        parts[3]
    );
    assert_eq!(h.batch.len(), 1);
    let versions = c.versions(ADDRESS_TYPE).unwrap();
    assert_eq!(
        versions.len(),
        1,
        "rejected ones are left out so they are resent"
    );
    assert!(versions.contains_key(W1));

    // A rejected update drops the old version too, so the next stream asks again.
    let h2 = c.handle(resp(ADDRESS_TYPE, "n3", vec![res(W1, "v2", None)], &[]));
    assert!(h2.reply.error_detail.is_some());
    assert!(c.versions(ADDRESS_TYPE).unwrap().is_empty());
}

#[test]
fn removals_follow_ztunnel() {
    let mut c = DeltaClient::new(node());
    let mut state = ProxyState::new();
    c.handle(resp(
        ADDRESS_TYPE,
        "1",
        vec![
            res(W1, "v1", Some(workload_any(W1, [10, 0, 0, 1]))),
            res("ns1/svc.ns1", "v1", Some(service_any("svc.ns1"))),
        ],
        &[],
    ))
    .batch
    .apply(&mut state);
    // A uid that is unknown and has '/' after the namespace: not a service.
    let h = c.handle(resp(ADDRESS_TYPE, "2", vec![], &["ns1/svc.ns1/x"]));
    h.batch.apply(&mut state);
    assert!(state.service_by_key("ns1/svc.ns1").is_some());
    // Workload uid first.
    c.handle(resp(ADDRESS_TYPE, "3", vec![], &[W1]))
        .batch
        .apply(&mut state);
    assert!(state.workload_by_uid(W1).is_none());
    assert!(state.service_by_key("ns1/svc.ns1").is_some());
    // Then namespace/hostname.
    c.handle(resp(ADDRESS_TYPE, "4", vec![], &["ns1/svc.ns1"]))
        .batch
        .apply(&mut state);
    assert!(state.service_by_key("ns1/svc.ns1").is_none());
    assert!(c.versions(ADDRESS_TYPE).unwrap().is_empty());
    // Policies by namespace/name.
    c.handle(resp(
        AUTHORIZATION_TYPE,
        "5",
        vec![res("ns1/p", "1", Some(policy_any("p")))],
        &[],
    ))
    .batch
    .apply(&mut state);
    assert_eq!(state.policies().count(), 1);
    c.handle(resp(AUTHORIZATION_TYPE, "6", vec![], &["ns1/p"]))
        .batch
        .apply(&mut state);
    assert_eq!(state.policies().count(), 0);
}

#[test]
fn unknown_type_is_acked_and_ignored() {
    let mut c = DeltaClient::new(node());
    let h = c.handle(resp(
        "type.googleapis.com/other.Thing",
        "x",
        vec![res("a", "1", None)],
        &["b"],
    ));
    assert!(!h.known_type);
    assert!(h.batch.is_empty());
    assert_eq!(h.reply.type_url, "type.googleapis.com/other.Thing");
    assert_eq!(h.reply.response_nonce, "x");
    assert!(h.reply.error_detail.is_none());
    assert!(!c.answered("type.googleapis.com/other.Thing"));
    assert!(!c.is_ready());
}

#[test]
fn limits() {
    let limits = Limits {
        max_per_response: 3,
        max_name_len: 20,
        max_version_len: 4,
        max_tracked_per_type: 2,
        max_errors_listed: 2,
        max_error_len: 100,
        ..Limits::default()
    };
    let mut c = DeltaClient::with_limits(node(), limits);
    let h = c.handle(resp(ADDRESS_TYPE, "1", vec![], &["a", "b", "c", "d"]));
    assert!(
        h.batch.is_empty(),
        "a response over the limit applies nothing"
    );
    assert!(h
        .reply
        .error_detail
        .unwrap()
        .message
        .starts_with("response: 4 entries (resources, removed names and aliases) in one response"));

    let long = "n".repeat(21);
    let h = c.handle(resp(
        AUTHORIZATION_TYPE,
        "2",
        vec![
            res("ns1/a", "1", Some(policy_any("a"))),
            res(&long, "1", Some(policy_any("b"))),
            res("ns1/c", "12345", Some(policy_any("c"))),
        ],
        &[],
    ));
    let msg = h.reply.error_detail.unwrap().message;
    assert_eq!(
        msg,
        format!("{long}: resource name is 21 bytes, more than the limit of 20; ns1/c: resource version is 5 bytes, more than the limit of 4")
    );
    let h = c.handle(resp(
        AUTHORIZATION_TYPE,
        "3",
        vec![
            res("ns1/d", "1", Some(policy_any("d"))),
            res("ns1/e", "1", Some(policy_any("e"))),
        ],
        &[],
    ));
    let msg = h.reply.error_detail.unwrap().message;
    assert_eq!(
        msg,
        "ns1/e: 2 resources of this type already held, the limit"
    );
    // Replacing a tracked one is fine at the limit.
    let h = c.handle(resp(
        AUTHORIZATION_TYPE,
        "4",
        vec![res("ns1/d", "2", Some(policy_any("d")))],
        &[],
    ));
    assert!(h.reply.error_detail.is_none());
    // Message: at most 2 listed, each cut.
    let many: Vec<Resource> = (0..3).map(|i| res(&format!("x{i}"), "1", None)).collect();
    let h = c.handle(resp(AUTHORIZATION_TYPE, "5", many, &[]));
    assert_eq!(
        h.reply.error_detail.unwrap().message,
        "x0: XDS payload without resource; x1: XDS payload without resource; and 1 more"
    );
}

#[test]
fn bytes_never_panic() {
    let mut c = DeltaClient::new(node());
    assert!(c.handle_bytes(&[0xff, 0x01]).is_err());
    let bytes = resp(
        ADDRESS_TYPE,
        "1",
        vec![res(W1, "v", Some(workload_any(W1, [1, 2, 3, 4])))],
        &[],
    )
    .encode_to_vec();
    let mut state = ProxyState::new();
    c.handle_bytes(&bytes).unwrap().batch.apply(&mut state);
    assert_eq!(state.workloads().count(), 1);
}

/// A response over the entry limit is answered from its type and nonce alone: its entries
/// are counted on the bytes and never decoded (here the last one would not even decode,
/// its name not being UTF-8). Aliases count as entries, as they are decoded too.
#[test]
fn too_many_entries_refused_from_the_bytes() {
    let limits = Limits {
        max_per_response: 3,
        ..Limits::default()
    };
    let mut c = DeltaClient::with_limits(node(), limits);
    let mut bytes = resp(ADDRESS_TYPE, "n1", vec![res("a", "1", None); 3], &[]).encode_to_vec();
    // resources[3] = Resource { name: b"\xff" }.
    bytes.extend([0x12, 3, 0x1a, 1, 0xff]);
    assert!(DeltaDiscoveryResponse::decode(bytes.as_slice()).is_err());
    let h = c
        .handle_bytes(&bytes)
        .expect("answered without decoding the entries");
    let refused = vec![(
        "response".to_string(),
        Rejection::ResponseTooLarge { count: 4, limit: 3 },
    )];
    assert!(h.known_type);
    assert!(h.batch.is_empty());
    assert_eq!(h.rejected, refused);
    assert_eq!(h.reply.type_url, ADDRESS_TYPE);
    assert_eq!(h.reply.response_nonce, "n1");
    assert_eq!(
        h.reply.error_detail.unwrap().message,
        "response: 4 entries (resources, removed names and aliases) in one response, more than the limit of 3; nothing applied"
    );

    // One resource with three aliases is four entries, on the bytes and decoded alike.
    let mut r = res(W1, "v1", Some(workload_any(W1, [10, 0, 0, 1])));
    r.aliases = vec!["/10.0.0.1".into(), "a".into(), "b".into()];
    let over = resp(ADDRESS_TYPE, "n2", vec![r.clone()], &[]);
    assert_eq!(
        c.handle_bytes(&over.encode_to_vec()).unwrap().rejected,
        refused
    );
    assert_eq!(c.handle(over).rejected, refused);
    r.aliases.pop();
    let at = resp(ADDRESS_TYPE, "n3", vec![r], &[]);
    let h = c.handle_bytes(&at.encode_to_vec()).unwrap();
    assert!(h.rejected.is_empty(), "{:?}", h.rejected);
    assert_eq!(h.batch.len(), 1);

    // Over the limit with a head that does not decode: a decode error, as before.
    let mut bad = resp(ADDRESS_TYPE, "n4", vec![res("a", "1", None); 4], &[]).encode_to_vec();
    bad.extend([0x22, 1, 0xff]); // type_url = b"\xff"
    assert!(c.handle_bytes(&bad).is_err());
}

// ----- the budget -----------------------------------------------------------------------

/// What an empty client holds once it accepted `resources` (its estimate).
fn estimate_of(type_url: &str, resources: Vec<Resource>) -> u64 {
    let mut c = DeltaClient::new(node());
    let h = c.handle(resp(type_url, "e", resources, &[]));
    assert!(h.rejected.is_empty(), "{:?}", h.rejected);
    c.held(type_url).unwrap()
}

/// A policy named `ns1/<name>` whose body is that of `body` (another name makes a body
/// the delta client refuses once decoded), with `matches` match objects of one port.
fn policy_res(name: &str, version: &str, body: &str, matches: usize) -> Resource {
    let p = psec::Authorization {
        name: body.into(),
        namespace: "ns1".into(),
        scope: psec::Scope::Namespace as i32,
        rules: vec![psec::Rule {
            clauses: vec![psec::Clause {
                matches: vec![
                    psec::Match {
                        destination_ports: vec![80],
                        ..Default::default()
                    };
                    matches
                ],
            }],
        }],
        ..Default::default()
    };
    res(
        &format!("ns1/{name}"),
        version,
        Some(Any {
            type_url: AUTHORIZATION_TYPE.into(),
            value: p.encode_to_vec(),
        }),
    )
}

/// One step of a budget table: a response (removed names, added policies), then what
/// must follow: the NACK message (None: an ACK), the changes to the store, the versions
/// held, the estimate held.
struct Step {
    what: &'static str,
    removed: &'static [&'static str],
    added: Vec<Resource>,
    nack: Option<String>,
    ops: usize,
    versions: &'static [(&'static str, &'static str)],
    held: u64,
}

fn run(c: &mut DeltaClient, type_url: &str, state: &mut ProxyState, steps: Vec<Step>) {
    for (i, s) in steps.into_iter().enumerate() {
        let h = c.handle(resp(type_url, &i.to_string(), s.added, s.removed));
        let message = h.reply.error_detail.as_ref().map(|e| e.message.clone());
        assert_eq!(message, s.nack, "{}", s.what);
        assert_eq!(h.batch.len(), s.ops, "{}", s.what);
        h.batch.apply(state);
        let versions: Vec<(&str, &str)> = c.versions(type_url).unwrap().into_iter().collect();
        assert_eq!(versions, s.versions, "{}", s.what);
        assert_eq!(c.held(type_url), Some(s.held), "{}", s.what);
    }
}

fn over(message: &str, estimate: u64, budget: u64, held: u64) -> Option<String> {
    Some(format!(
        "response: the {message} resources held would come to an estimated {estimate} bytes once decoded, over their budget of {budget} bytes (held before this response: {held}); nothing applied"
    ))
}

/// At the budget a response applies; one byte over, nothing of it does; what a response
/// removes or replaces is freed before what it adds is counted.
#[test]
fn policy_budget_table() {
    const P: &str = "istio.security.Authorization";
    // Every policy below has a name of one letter and one match: the same estimate.
    let e = estimate_of(AUTHORIZATION_TYPE, vec![policy_res("a", "1", "a", 1)]);
    let budget = 3 * e;
    let mut c = DeltaClient::with_limits(
        node(),
        Limits {
            max_held_policies: budget,
            ..Limits::default()
        },
    );
    let p = |n: &'static str, v: &str| policy_res(n, v, n, 1);
    let mut state = ProxyState::new();
    run(
        &mut c,
        AUTHORIZATION_TYPE,
        &mut state,
        vec![
            Step {
                what: "over the budget from empty: nothing applied",
                removed: &[],
                added: vec![p("a", "1"), p("b", "1"), p("c", "1"), p("d", "1")],
                nack: over(P, 4 * e, budget, 0),
                ops: 0,
                versions: &[],
                held: 0,
            },
            Step {
                what: "at the budget: applied",
                removed: &[],
                added: vec![p("a", "1"), p("b", "1"), p("c", "1")],
                nack: None,
                ops: 3,
                versions: &[("ns1/a", "1"), ("ns1/b", "1"), ("ns1/c", "1")],
                held: 3 * e,
            },
            Step {
                what: "one more at the budget: nothing applied",
                removed: &[],
                added: vec![p("d", "1")],
                nack: over(P, 4 * e, budget, 3 * e),
                ops: 0,
                versions: &[("ns1/a", "1"), ("ns1/b", "1"), ("ns1/c", "1")],
                held: 3 * e,
            },
            Step {
                what: "a removal in the same response frees its share",
                removed: &["ns1/a"],
                added: vec![p("d", "1")],
                nack: None,
                ops: 2,
                versions: &[("ns1/b", "1"), ("ns1/c", "1"), ("ns1/d", "1")],
                held: 3 * e,
            },
            Step {
                what: "a replacement frees what it replaces",
                removed: &[],
                added: vec![p("b", "2"), p("c", "2")],
                nack: None,
                ops: 2,
                versions: &[("ns1/b", "2"), ("ns1/c", "2"), ("ns1/d", "1")],
                held: 3 * e,
            },
            Step {
                what: "a refused response's removals are not applied either",
                removed: &["ns1/b"],
                added: vec![p("e", "1"), p("f", "1")],
                nack: over(P, 4 * e, budget, 3 * e),
                ops: 0,
                versions: &[("ns1/b", "2"), ("ns1/c", "2"), ("ns1/d", "1")],
                held: 3 * e,
            },
            Step {
                what: "a removal alone frees",
                removed: &["ns1/b", "ns1/c"],
                added: vec![],
                nack: None,
                ops: 2,
                versions: &[("ns1/d", "1")],
                held: e,
            },
            Step {
                what: "removing and adding the same name counts it once",
                removed: &["ns1/d"],
                added: vec![p("d", "2"), p("e", "1"), p("f", "1")],
                nack: None,
                ops: 4,
                versions: &[("ns1/d", "2"), ("ns1/e", "1"), ("ns1/f", "1")],
                held: 3 * e,
            },
        ],
    );
    let keys: Vec<String> = state.policies().map(|p| p.key()).collect();
    assert_eq!(keys, ["ns1/d", "ns1/e", "ns1/f"]);

    // One byte less of budget, and the response that fit it does not.
    let mut c = DeltaClient::with_limits(
        node(),
        Limits {
            max_held_policies: budget - 1,
            ..Limits::default()
        },
    );
    let h = c.handle(resp(
        AUTHORIZATION_TYPE,
        "1",
        vec![p("a", "1"), p("b", "1"), p("c", "1")],
        &[],
    ));
    assert_eq!(
        h.reply.error_detail.map(|e| e.message),
        over(P, budget, budget - 1, 0)
    );
    assert!(h.batch.is_empty());
}

/// The budget is checked again once the resources are converted: a replacement that is
/// rejected then frees nothing, so a response that only fit by freeing it is refused.
#[test]
fn a_rejected_replacement_frees_nothing() {
    let small = estimate_of(AUTHORIZATION_TYPE, vec![policy_res("a", "1", "a", 1)]);
    // A policy a little larger than two small ones.
    let (matches, big) = (2..)
        .map(|n| {
            let e = estimate_of(AUTHORIZATION_TYPE, vec![policy_res("a", "1", "a", n)]);
            (n, e)
        })
        .find(|(_, e)| *e > small)
        .unwrap();
    assert!(big <= 2 * small, "{big} {small}");
    let budget = 2 * small;
    let mut c = DeltaClient::with_limits(
        node(),
        Limits {
            max_held_policies: budget,
            ..Limits::default()
        },
    );
    let mut state = ProxyState::new();
    run(
        &mut c,
        AUTHORIZATION_TYPE,
        &mut state,
        vec![
            Step {
                what: "the big one",
                removed: &[],
                added: vec![policy_res("a", "1", "a", matches)],
                nack: None,
                ops: 1,
                versions: &[("ns1/a", "1")],
                held: big,
            },
            // Before decoding: `a` replaced by a small body, `b` small: 2 × small, at the
            // budget. Decoded, `a`'s body names `x`: rejected, `a` stays; with `b` that
            // is big + small, over.
            Step {
                what: "a replacement rejected once decoded",
                removed: &[],
                added: vec![
                    policy_res("a", "2", "x", 1),
                    policy_res("b", "1", "b", 1),
                ],
                nack: over(
                    "istio.security.Authorization",
                    big + small,
                    budget,
                    big,
                ),
                ops: 0,
                versions: &[("ns1/a", "1")],
                held: big,
            },
            Step {
                what: "the same rejection without the addition: a NACK that keeps `a`",
                removed: &[],
                added: vec![policy_res("a", "2", "x", 1)],
                nack: Some(
                    "ns1/a: the body's policy namespace/name is \"ns1/x\", not the resource name; refused so that a removal by name always removes what was announced".into(),
                ),
                ops: 0,
                versions: &[],
                held: big,
            },
            Step {
                what: "what the store keeps under a rejected name is freed by its removal",
                removed: &["ns1/a"],
                added: vec![policy_res("b", "1", "b", 1), policy_res("c", "1", "c", 1)],
                nack: None,
                ops: 3,
                versions: &[("ns1/b", "1"), ("ns1/c", "1")],
                held: 2 * small,
            },
        ],
    );
    assert_eq!(state.policies().count(), 2);
}

/// What one response's resources take is bounded on its own, before what they replace
/// is freed.
#[test]
fn response_bound() {
    let e = estimate_of(AUTHORIZATION_TYPE, vec![policy_res("a", "1", "a", 1)]);
    let mut c = DeltaClient::with_limits(
        node(),
        Limits {
            max_held_per_response: 2 * e,
            ..Limits::default()
        },
    );
    let p = |n: &str| policy_res(n, "1", n, 1);
    let h = c.handle(resp(AUTHORIZATION_TYPE, "1", vec![p("a"), p("b")], &[]));
    assert!(h.rejected.is_empty());
    let h = c.handle(resp(
        AUTHORIZATION_TYPE,
        "2",
        vec![p("a"), p("b"), p("c")],
        &[],
    ));
    assert!(h.batch.is_empty());
    assert_eq!(
        h.rejected,
        vec![(
            "response".to_string(),
            Rejection::ResponseOverBudget {
                estimate: 3 * e,
                limit: 2 * e
            }
        )]
    );
    assert_eq!(
        h.reply.error_detail.unwrap().message,
        format!("response: its resources would take an estimated {} bytes once decoded, more than the limit of {} bytes for one response; nothing applied", 3 * e, 2 * e)
    );
    assert_eq!(c.held(AUTHORIZATION_TYPE), Some(2 * e));
}

/// Address resources: workloads and services share the type's budget; a removal frees
/// the workload of that uid, else the service of that `namespace/hostname`, as the store
/// removes them; a name can hold both (they are counted apart).
#[test]
fn address_budget() {
    const A: &str = "istio.workload.Address";
    let w = estimate_of(
        ADDRESS_TYPE,
        vec![res(W1, "1", Some(workload_any(W1, [10, 0, 0, 1])))],
    );
    let s = estimate_of(
        ADDRESS_TYPE,
        vec![res("ns1/svc.ns1", "1", Some(service_any("svc.ns1")))],
    );
    // A workload whose uid is the service's key: the store holds both under one name.
    let twin = res(
        "ns1/svc.ns1",
        "1",
        Some(workload_any("ns1/svc.ns1", [10, 0, 0, 9])),
    );
    let t = estimate_of(ADDRESS_TYPE, vec![twin.clone()]);
    assert!(t <= w);
    let budget = 2 * w + s;
    let mut c = DeltaClient::with_limits(
        node(),
        Limits {
            max_held_addresses: budget,
            ..Limits::default()
        },
    );
    let wl = |uid: &'static str, ip| res(uid, "1", Some(workload_any(uid, ip)));
    let svc = res("ns1/svc.ns1", "1", Some(service_any("svc.ns1")));
    let mut state = ProxyState::new();
    run(
        &mut c,
        ADDRESS_TYPE,
        &mut state,
        vec![
            Step {
                what: "two workloads and a service: at the budget",
                removed: &[],
                added: vec![wl(W1, [10, 0, 0, 1]), wl(W2, [10, 0, 0, 2]), svc.clone()],
                nack: None,
                ops: 3,
                versions: &[
                    ("c//v1/Pod/ns1/a", "1"),
                    ("c//v1/Pod/ns1/b", "1"),
                    ("ns1/svc.ns1", "1"),
                ],
                held: budget,
            },
            Step {
                what: "the removal of a uid frees the workload",
                removed: &[W1],
                added: vec![],
                nack: None,
                ops: 1,
                versions: &[("c//v1/Pod/ns1/b", "1"), ("ns1/svc.ns1", "1")],
                held: w + s,
            },
            Step {
                what: "a workload named as the service is held beside it, over the budget",
                removed: &[],
                added: vec![twin.clone(), wl(W1, [10, 0, 0, 1])],
                nack: over(A, 2 * w + s + t, budget, w + s),
                ops: 0,
                versions: &[("c//v1/Pod/ns1/b", "1"), ("ns1/svc.ns1", "1")],
                held: w + s,
            },
            Step {
                what: "... within it",
                removed: &[],
                added: vec![twin],
                nack: None,
                ops: 1,
                versions: &[("c//v1/Pod/ns1/b", "1"), ("ns1/svc.ns1", "1")],
                held: w + s + t,
            },
            Step {
                what: "the removal of that name frees the workload first",
                removed: &["ns1/svc.ns1"],
                added: vec![],
                nack: None,
                ops: 1,
                versions: &[("c//v1/Pod/ns1/b", "1")],
                held: w + s,
            },
            Step {
                what: "then the service",
                removed: &["ns1/svc.ns1"],
                added: vec![],
                nack: None,
                ops: 1,
                versions: &[("c//v1/Pod/ns1/b", "1")],
                held: w,
            },
        ],
    );
    assert!(state.service_by_key("ns1/svc.ns1").is_none());
    assert_eq!(state.workloads().count(), 1);
}

/// A response refused for the budget from its bytes is answered as the decoded one, and
/// never reaches the store.
#[test]
fn budget_from_the_bytes() {
    let e = estimate_of(AUTHORIZATION_TYPE, vec![policy_res("a", "1", "a", 1)]);
    let limits = Limits {
        max_held_policies: e,
        ..Limits::default()
    };
    let over = resp(
        AUTHORIZATION_TYPE,
        "1",
        vec![policy_res("a", "1", "a", 1), policy_res("b", "1", "b", 1)],
        &[],
    );
    let mut c = DeltaClient::with_limits(node(), limits);
    let from_bytes = c.handle_bytes(&over.encode_to_vec()).unwrap();
    let decoded = DeltaClient::with_limits(node(), limits).handle(over);
    assert_eq!(from_bytes.rejected, decoded.rejected);
    assert_eq!(
        from_bytes.rejected,
        vec![(
            "response".to_string(),
            Rejection::OverBudget {
                message: "istio.security.Authorization",
                estimate: 2 * e,
                budget: e,
                held: 0
            }
        )]
    );
    assert!(from_bytes.batch.is_empty());
    assert_eq!(c.held(AUTHORIZATION_TYPE), Some(0));
}

// ----- a type of the process's own ------------------------------------------------------

fn widget_res(name: &str, version: &str, body: &Widget) -> Resource {
    res(
        name,
        version,
        Some(Any {
            type_url: WIDGET_TYPE.into(),
            value: body.encode_to_vec(),
        }),
    )
}

/// A third type, the tests' own, subscribed beside Address with no change to the client:
/// its initial request, its shape check before decoding, its decoding and the check of
/// the name its body carries, its NACKs (typed, and as text), its store, its budget, its
/// removals, its versions on a new stream, and readiness waiting for it.
#[test]
fn a_third_type_beside_addresses() {
    const WT: &str = "ambit.test.Widget";
    // Names of two bytes and versions of one: every widget of two parts holds the same.
    let one = widget_estimate(2) + subscription::tracking("w1", "1");
    // Room for three: the first response below fits before it is decoded (w1, w3, w4).
    let budget = 3 * one;
    let mut c = DeltaClient::subscribing(node(), Limits::default())
        .subscribe(Addresses::default())
        .subscribe(Widgets {
            budget,
            max_parts: 2,
            readiness: Readiness::FirstResponse,
        });
    let types: Vec<String> = c
        .initial_requests()
        .into_iter()
        .map(|r| r.type_url)
        .collect();
    assert_eq!(types, [ADDRESS_TYPE, WIDGET_TYPE]);
    assert!(!c.is_ready());

    // Addresses as ever, into the node proxy's store.
    let mut state = ProxyState::new();
    let h = c.handle(resp(
        ADDRESS_TYPE,
        "a1",
        vec![res(W1, "v1", Some(workload_any(W1, [10, 0, 0, 1])))],
        &[],
    ));
    assert!(h.rejected.is_empty(), "{:?}", h.rejected);
    h.batch.apply(&mut state);
    assert!(state.workload_by_uid(W1).is_some());
    assert!(!c.answered(ADDRESS_TYPE), "the widgets are awaited too");

    // Widgets: each checked on its own, the good one into the widgets' own store.
    let h = c.handle(resp(
        WIDGET_TYPE,
        "w-1",
        vec![
            widget_res("w1", "1", &widget("w1", &["a", "b"])),
            widget_res("w2", "1", &widget("w2", &["a", "b", "c"])),
            widget_res("w3", "1", &widget("w3", &["a", ""])),
            widget_res("w4", "1", &widget("w5", &[])),
            res("w6", "1", Some(workload_any(W2, [10, 0, 0, 2]))),
            res(
                "w7",
                "1",
                Some(Any {
                    type_url: WIDGET_TYPE.into(),
                    value: vec![0x12, 5, b'a'],
                }),
            ),
        ],
        &[],
    ));
    assert_eq!(
        h.rejected[0],
        (
            "w2".to_string(),
            Rejection::Shape(ShapeError::TooMany {
                field: "parts".into(),
                limit: Limit::Other {
                    max: 2,
                    what: "parts of one widget"
                }
            })
        )
    );
    assert_eq!(
        h.rejected[1],
        (
            "w3".to_string(),
            Rejection::Invalid(ConvertError::new("parts[1]", "must be non-empty"))
        )
    );
    assert_eq!(
        h.reply.error_detail.as_ref().unwrap().message,
        [
            "w2: parts: more than 2 parts of one widget (the limit)",
            "w3: parts[1]: must be non-empty",
            "w4: the body's widget name is \"w5\", not the resource name; refused so that a removal by name always removes what was announced",
            "w6: payload of type \"type.googleapis.com/istio.workload.Address\" in a response of type type.googleapis.com/ambit.test.Widget",
            "w7: cannot decode ambit.test.Widget: a field runs past the end of its message",
        ]
        .join("; ")
    );
    assert_eq!(h.reply.type_url, WIDGET_TYPE);
    assert_eq!(h.reply.response_nonce, "w-1");
    let w1 = widget("w1", &["a", "b"]);
    assert_eq!(
        h.batch.ops::<Widgets>(),
        Some(&[WidgetOp::Put(w1.clone())][..])
    );
    assert_eq!(h.batch.ops::<Addresses>(), None);
    // Not a batch for the node proxy's store: it comes back, for the widgets' own.
    let batch = h.batch.try_apply(&mut state).unwrap_err();
    let mut widgets = WidgetStore::new();
    batch.downcast::<Widgets>().unwrap().apply(&mut widgets);
    let held = |names: &[&str]| -> WidgetStore {
        names
            .iter()
            .map(|n| (n.to_string(), vec!["a".to_string(), "b".to_string()]))
            .collect()
    };
    assert_eq!(widgets, held(&["w1"]));
    assert_eq!(c.versions(WIDGET_TYPE).unwrap(), [("w1", "1")].into());
    assert_eq!(c.held(WIDGET_TYPE), Some(one));
    assert!(c.answered(WIDGET_TYPE), "ready once each type was answered");

    // The widgets' budget: over it, nothing of the response applies.
    let three = || {
        ["w2", "w3", "w4"]
            .map(|n| widget_res(n, "1", &widget(n, &["a", "b"])))
            .to_vec()
    };
    let h = c.handle(resp(WIDGET_TYPE, "w-2", three(), &[]));
    assert_eq!(
        h.reply.error_detail.map(|e| e.message),
        over(WT, 4 * one, budget, one)
    );
    assert!(h.batch.is_empty());
    assert_eq!(c.versions(WIDGET_TYPE).unwrap(), [("w1", "1")].into());
    assert_eq!(c.held(WIDGET_TYPE), Some(one));
    // With a removal that frees its share, at the budget: applied in one batch.
    let h = c.handle(resp(WIDGET_TYPE, "w-3", three(), &["w1"]));
    assert!(h.rejected.is_empty(), "{:?}", h.rejected);
    assert_eq!(h.batch.len(), 4);
    h.batch.downcast::<Widgets>().unwrap().apply(&mut widgets);
    assert_eq!(widgets, held(&["w2", "w3", "w4"]));
    assert_eq!(c.held(WIDGET_TYPE), Some(budget));

    // A new stream asks each type again with what it accepted.
    let reqs = c.initial_requests();
    assert_eq!(
        reqs[0].initial_resource_versions,
        [(W1.to_string(), "v1".to_string())].into()
    );
    assert_eq!(
        reqs[1].initial_resource_versions,
        [
            ("w2".to_string(), "1".to_string()),
            ("w3".to_string(), "1".to_string()),
            ("w4".to_string(), "1".to_string())
        ]
        .into()
    );

    // Removals free the rest; the addresses are untouched.
    let h = c.handle(resp(WIDGET_TYPE, "w-4", vec![], &["w2", "w3", "w4"]));
    h.batch.downcast::<Widgets>().unwrap().apply(&mut widgets);
    assert!(widgets.is_empty());
    assert_eq!(c.held(WIDGET_TYPE), Some(0));
    assert!(c.versions(WIDGET_TYPE).unwrap().is_empty());
    assert_eq!(c.versions(ADDRESS_TYPE).unwrap().len(), 1);
}

/// A type that readiness does not wait for: the client is ready once the others are.
#[test]
fn a_type_not_awaited() {
    let mut c = DeltaClient::subscribing(node(), Limits::default())
        .subscribe(Addresses::default())
        .subscribe(Widgets {
            budget: 1 << 20,
            max_parts: 2,
            readiness: Readiness::NotAwaited,
        });
    assert!(!c.is_ready());
    c.handle(resp(ADDRESS_TYPE, "a1", vec![], &[]));
    assert!(c.answered(ADDRESS_TYPE), "ready without a widget");
    assert!(c.is_ready());
}

/// Two stores for one type URL is a mistake of the process, refused at once.
#[test]
#[should_panic(expected = "type.googleapis.com/istio.workload.Address subscribed twice")]
fn a_type_subscribed_twice() {
    let _ = DeltaClient::subscribing(node(), Limits::default())
        .subscribe(Addresses::default())
        .subscribe(Addresses::default());
}

#[test]
fn on_demand_subscribes_to_nothing_but_what_is_asked_and_bounds_what_is_not() {
    use crate::on_demand::{Ask, Book, BookLimits};
    use std::sync::{Arc, Mutex};
    let book = Arc::new(Mutex::new(Book::new(BookLimits {
        dependents_per_name: 2,
        ..BookLimits::default()
    })));
    let mut c = DeltaClient::new(node()).with_on_demand(ADDRESS_TYPE, book.clone());
    let now = std::time::Instant::now();
    assert_eq!(book.lock().unwrap().ask("/10.0.0.5", now), Ask::Send);
    let init = c.initial_requests();
    assert_eq!(init[0].type_url, ADDRESS_TYPE);
    assert_eq!(init[0].resource_names_subscribe, ["*"]);
    assert_eq!(init[0].resource_names_unsubscribe, ["*"]);
    assert_eq!(
        init[0]
            .initial_resource_versions
            .get("/10.0.0.5")
            .map(String::as_str),
        Some("")
    );
    assert!(
        init[1].resource_names_subscribe.is_empty(),
        "Authorization stays wildcard"
    );
    assert!(!c.is_ready());
    // The asked workload (by its alias) and 10 more it never asked for.
    let mut resources = vec![Resource {
        name: "c//v1/Pod/ns1/a".into(),
        version: "1".into(),
        aliases: vec!["/10.0.0.5".into()],
        resource: Some(workload_any("c//v1/Pod/ns1/a", [10, 0, 0, 5])),
        ..Default::default()
    }];
    for i in 0..10u8 {
        let uid = format!("c//v1/Pod/ns1/x{i}");
        resources.push(Resource {
            name: uid.clone(),
            version: "1".into(),
            resource: Some(workload_any(&uid, [10, 1, 0, i])),
            ..Default::default()
        });
    }
    let h = c.handle(DeltaDiscoveryResponse {
        type_url: ADDRESS_TYPE.into(),
        nonce: "n1".into(),
        resources,
        ..Default::default()
    });
    assert_eq!(
        h.answers,
        [("/10.0.0.5".to_string(), Some("c//v1/Pod/ns1/a".to_string()))]
    );
    assert!(h.rejected.is_empty(), "ignored, not NACKed");
    assert_eq!(h.batch.len(), 3, "the asked one and 2 dependents");
    assert_eq!(book.lock().unwrap().status().ignored_total, 8);
    // Readiness waits only on the type not on demand.
    c.answered(ADDRESS_TYPE);
    assert!(!c.is_ready());
    c.answered(AUTHORIZATION_TYPE);
    assert!(c.is_ready());
    // A new stream: what is held is reported (so the server subscribes to it), and a
    // last request unsubscribes what was not asked for by that name, so that it stays
    // only while an asked name brings it.
    let init = c.initial_requests();
    assert_eq!(init.len(), 3);
    let mut versions: Vec<&str> = init[0]
        .initial_resource_versions
        .keys()
        .map(String::as_str)
        .collect();
    versions.sort_unstable();
    assert_eq!(
        versions,
        [
            "/10.0.0.5",
            "c//v1/Pod/ns1/a",
            "c//v1/Pod/ns1/x0",
            "c//v1/Pod/ns1/x1"
        ]
    );
    assert_eq!(init[2].type_url, ADDRESS_TYPE);
    assert_eq!(
        init[2].resource_names_unsubscribe,
        ["c//v1/Pod/ns1/a", "c//v1/Pod/ns1/x0", "c//v1/Pod/ns1/x1"]
    );
    assert!(init[2].resource_names_subscribe.is_empty());
}
