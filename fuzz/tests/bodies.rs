//! The targets' bodies beyond their seeds: edge inputs, and mutations of seeds that must
//! never panic a body or break its agreement checks; the xDS seeds checked for what they
//! say (valid responses accepted whole, refusals refused where they should be).

use ambit_fuzz::xds_delta::{delta_response, FUZZ_LIMITS};
use ambit_fuzz::xds_resource::resource_body;
use ambit_fuzz::{dns_query, jwt};
use ambit_proto::{DeltaDiscoveryResponse, Resource, ADDRESS_TYPE};
use ambit_state::ProxyState;
use ambit_xds::delta::{DeltaClient, NodeConfig};
use ambit_xds::reject::Rejection;
use ambit_xds::shape::{self, Limit, ShapeError};
use prost::Message;
use serde_json::json;

/// Mutated valid responses through the target body: it must never panic.
#[test]
fn mutations_never_panic() {
    let w = ambit_proto::istio::workload::Address {
        r#type: Some(ambit_proto::istio::workload::address::Type::Workload(
            ambit_proto::istio::workload::Workload {
                uid: "c//v1/Pod/ns/a".into(),
                name: "a".into(),
                namespace: "ns".into(),
                addresses: vec![vec![10, 0, 0, 1].into()],
                services: [("ns/h".to_string(), Default::default())].into(),
                ..Default::default()
            },
        )),
    };
    let resp = DeltaDiscoveryResponse {
        type_url: ADDRESS_TYPE.into(),
        nonce: "n".into(),
        resources: vec![Resource {
            name: "c//v1/Pod/ns/a".into(),
            version: "1".into(),
            resource: Some(prost_types::Any {
                type_url: ADDRESS_TYPE.into(),
                value: w.encode_to_vec(),
            }),
            ..Default::default()
        }],
        removed_resources: vec!["ns/h".into(), "c//v1/Pod/ns/a".into()],
        ..Default::default()
    };
    let base = resp.encode_to_vec();
    // A small xorshift: deterministic, no dependency.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for sel in 0..3u8 {
        let mut input = vec![sel];
        input.extend_from_slice(&base);
        delta_response(&input);
        for _ in 0..2000 {
            let mut m = input.clone();
            for _ in 0..(next() % 4 + 1) {
                let i = 1 + (next() as usize) % (m.len() - 1);
                m[i] = next() as u8;
            }
            delta_response(&m);
        }
    }
}

fn seed(name: &str) -> Vec<u8> {
    let path = format!("{}/corpus/xds_delta/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The hand-written seeds of the fuzz target are valid responses, accepted whole.
#[test]
fn fuzz_seeds_are_accepted() {
    for (name, resources, ops) in [("address_workload_service", 2, 3), ("authorization", 1, 1)] {
        let data = seed(name);
        let mut client = DeltaClient::new(NodeConfig::default().to_node());
        let handled = client.handle_bytes(&data[1..]).expect(name);
        assert!(handled.known_type, "{name}");
        assert!(
            handled.rejected.is_empty(),
            "{name}: {:?}",
            handled.rejected
        );
        assert_eq!(handled.batch.len(), ops, "{name}");
        let mut state = ProxyState::new();
        handled.batch.apply(&mut state);
        let held = state.workloads().count() + state.services().count() + state.policies().count();
        assert_eq!(held, resources, "{name}");
        delta_response(&data);
    }
}

fn one(data: &[u8]) -> Vec<(String, Rejection)> {
    let mut client = DeltaClient::new(NodeConfig::default().to_node());
    client.handle_bytes(&data[1..]).unwrap().rejected
}

/// The seeds of refusals are refused as they should be, and the good resource beside
/// each is not.
#[test]
fn fuzz_seeds_of_refusals_are_refused() {
    let data = seed("authorization_many_matches");
    assert_eq!(
        one(&data),
        vec![(
            "bookinfo/many".to_string(),
            Rejection::Shape(ShapeError::TooMany {
                field: "rules[0].clauses[0].matches".into(),
                limit: Limit::MatchesPerRule
            })
        )]
    );
    delta_response(&data);
    let data = seed("address_misnamed");
    assert_eq!(
        one(&data),
        vec![(
            "bookinfo/announced.bookinfo.svc.cluster.local".to_string(),
            Rejection::NameMismatch {
                what: "service namespace/hostname",
                body: "bookinfo/hidden.bookinfo.svc.cluster.local".into()
            }
        )]
    );
    delta_response(&data);
    let data = seed("too_many_entries");
    let mut client = DeltaClient::with_limits(NodeConfig::default().to_node(), FUZZ_LIMITS);
    assert_eq!(
        client.handle_bytes(&data[1..]).unwrap().rejected,
        vec![(
            "response".to_string(),
            Rejection::ResponseTooLarge {
                count: 65,
                limit: 64
            }
        )]
    );
    delta_response(&data);
}

/// The split seed (three policies of 64 empty match objects): accepted under the
/// default budget, refused whole for the fuzz target's small one, so that the
/// budget's paths run from the first input.
#[test]
fn fuzz_seed_over_the_budget() {
    let data = seed("authorization_split");
    let mut client = DeltaClient::new(NodeConfig::default().to_node());
    let h = client.handle_bytes(&data[1..]).unwrap();
    assert!(h.rejected.is_empty(), "{:?}", h.rejected);
    assert_eq!(h.batch.len(), 3);
    let mut client = DeltaClient::with_limits(NodeConfig::default().to_node(), FUZZ_LIMITS);
    let h = client.handle_bytes(&data[1..]).unwrap();
    match h.rejected.as_slice() {
        [(
            name,
            Rejection::OverBudget {
                budget, held: 0, ..
            },
        )] => {
            assert_eq!(name, "response");
            assert_eq!(*budget, FUZZ_LIMITS.max_held_policies);
        }
        other => panic!("{other:?}"),
    }
    assert!(h.batch.is_empty());
    delta_response(&data);
}

fn resource_seed(name: &str) -> Vec<u8> {
    let path = format!("{}/corpus/xds_resource/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The `xds_resource` seeds: the good bodies pass the walk, the bad ones are stopped
/// where they should be.
#[test]
fn xds_resource_seeds() {
    for name in ["policy", "workload", "service", "service_misnamed"] {
        let data = resource_seed(name);
        let walked = if data[0] & 1 == 1 {
            shape::check_authorization(&data[1..])
        } else {
            shape::check_address(&data[1..])
        };
        assert_eq!(walked, Ok(()), "{name}");
        resource_body(&data);
    }
    let data = resource_seed("policy_many_matches");
    assert_eq!(
        shape::check_authorization(&data[1..]),
        Err(ShapeError::TooMany {
            field: "rules[0].clauses[0].matches".into(),
            limit: Limit::MatchesPerRule
        })
    );
    resource_body(&data);
    let data = resource_seed("workload_twice");
    assert_eq!(
        shape::check_address(&data[1..]),
        Err(ShapeError::TooMany {
            field: "addresses".into(),
            limit: Limit::WorkloadAddresses
        })
    );
    resource_body(&data);
}

/// Mutated seeds through the `xds_resource` body: it must never panic, and its
/// agreement checks with `prost` hold.
#[test]
fn resource_mutations_hold() {
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for name in ["policy", "workload", "service", "workload_twice"] {
        let base = resource_seed(name);
        for sel in 0..4u8 {
            let mut input = base.clone();
            input[0] = sel;
            resource_body(&input);
            for _ in 0..1000 {
                let mut m = input.clone();
                for _ in 0..(next() % 4 + 1) {
                    let i = 1 + (next() as usize) % (m.len() - 1);
                    m[i] = next() as u8;
                }
                resource_body(&m);
            }
        }
    }
}

#[test]
fn dns_query_edge_inputs() {
    for input in [
        &b""[..],
        &[0],
        &[1, 0x12],
        &[0, 0x12, 0x34, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0],
        &[
            2, 0x12, 0x34, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 4, b'e', b'c', b'h', b'o', 0, 0, 1, 0, 1,
        ],
    ] {
        dns_query::query_path(input);
    }
}

#[test]
fn jwt_edge_inputs() {
    use jwt::{jwks_document, run, token_in_request};
    assert_eq!(
        token_in_request(b"", 2),
        "refused: Jwt is not in the form of Header.Payload.Signature with two dots and 3 sections"
    );
    assert_eq!(token_in_request(b"\n", 2), "no token");
    assert_eq!(run(&[1, b'[']), "jwks error: NotJson");
    assert_eq!(
        jwks_document(json!({"keys": []}).to_string().as_bytes()),
        "jwks error: NoUsableKey"
    );
}
