//! The body of the `xds_delta` fuzz target, here so that it is built and tested with the
//! crate (the fuzz crate only calls it).

use ambit_proto::{DeltaDiscoveryResponse, ADDRESS_TYPE, AUTHORIZATION_TYPE};
use ambit_state::ProxyState;
use prost::Message;

use crate::delta::{DeltaClient, Limits, NodeConfig};

/// Byte 0 picks the type: 0 = as decoded, 1 = Address, 2 = Authorization (for 1 and 2
/// every resource's payload is labelled with that type too, so decoding goes deep); the
/// rest is a `DeltaDiscoveryResponse`, handled twice (a second response of the same shape
/// exercises replacement and removal of what the first applied) into one `ProxyState`.
///
/// Checks: the reply echoes the type and nonce; a NACK iff something was rejected; an
/// accepted resource is tracked with its version, a rejected one is not; the store's
/// lookups agree with what it holds.
pub fn delta_response(data: &[u8]) {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let Ok(mut resp) = DeltaDiscoveryResponse::decode(rest) else {
        return;
    };
    let forced = match selector % 3 {
        1 => Some(ADDRESS_TYPE),
        2 => Some(AUTHORIZATION_TYPE),
        _ => None,
    };
    if let Some(t) = forced {
        resp.type_url = t.to_string();
        for r in &mut resp.resources {
            if let Some(any) = &mut r.resource {
                any.type_url = t.to_string();
            }
        }
    }
    let limits = Limits {
        max_per_response: 64,
        max_name_len: 64,
        max_version_len: 16,
        max_tracked_per_type: 8,
        max_errors_listed: 4,
        max_error_len: 128,
    };
    let mut client = DeltaClient::with_limits(NodeConfig::default().to_node(), limits);
    let mut state = ProxyState::new();
    for _ in 0..2 {
        let handled = client.handle(resp.clone());
        assert_eq!(handled.reply.type_url, resp.type_url);
        assert_eq!(handled.reply.response_nonce, resp.nonce);
        assert_eq!(
            handled.reply.error_detail.is_some(),
            !handled.rejected.is_empty()
        );
        if let Some(status) = &handled.reply.error_detail {
            assert_eq!(status.code, 0);
            assert!(status.message.len() <= 5 * (limits.max_error_len + 2) + 32);
        }
        if let Some(versions) = client.versions(&resp.type_url) {
            assert!(versions.len() <= limits.max_tracked_per_type);
            for (name, _) in &handled.rejected {
                assert!(!versions.contains_key(name), "rejected {name:?} tracked");
            }
        }
        handled.batch.apply(&mut state);
        for w in state.workloads() {
            assert!(state.workload_by_uid(&w.uid).is_some());
            let _ = state.policies_for(w);
        }
        for s in state.services() {
            assert!(state.service_by_key(&s.key()).is_some());
        }
        let _ = state.dump();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ambit_proto::Resource;

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
}

#[cfg(test)]
mod seeds {
    use super::*;

    fn seed(name: &str) -> Vec<u8> {
        let path = format!(
            "{}/../../fuzz/corpus/xds_delta/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    /// The hand-written seeds of the fuzz target are valid responses, accepted whole.
    #[test]
    fn fuzz_seeds_are_accepted() {
        for (name, resources, ops) in [("address_workload_service", 2, 3), ("authorization", 1, 1)]
        {
            let data = seed(name);
            let mut client = DeltaClient::new(NodeConfig::default().to_node());
            let handled = client.handle_bytes(&data[1..]).expect(name);
            assert!(handled.known_type, "{name}");
            assert!(
                handled.rejected.is_empty(),
                "{name}: {:?}",
                handled.rejected
            );
            assert_eq!(handled.batch.ops.len(), ops, "{name}");
            let mut state = ProxyState::new();
            handled.batch.apply(&mut state);
            let held =
                state.workloads().count() + state.services().count() + state.policies().count();
            assert_eq!(held, resources, "{name}");
            delta_response(&data);
        }
    }
}
