//! The `xds_delta` target: delta xDS responses through the node proxy's client.

use ambit_proto::{DeltaDiscoveryResponse, ADDRESS_TYPE, AUTHORIZATION_TYPE};
use ambit_state::ProxyState;
use prost::Message;

use ambit_xds::delta::{DeltaClient, Limits, NodeConfig};
use ambit_xds::reject::Rejection;

/// Byte 0 picks the type: 0 = as decoded, 1 = Address, 2 = Authorization (for 1 and 2
/// every resource's payload is labelled with that type too, so decoding goes deep); the
/// rest is a `DeltaDiscoveryResponse`, handled twice (a second response of the same shape
/// exercises replacement and removal of what the first applied) into one `ProxyState`.
///
/// Checks: the reply echoes the type and nonce; a NACK iff something was rejected; an
/// accepted resource is tracked with its version, a rejected one is not; a response
/// refused whole changes nothing; what is held stays within the type's budget; the
/// store's lookups agree with what it holds.
pub fn delta_response(data: &[u8]) {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    // The bytes path first (entries counted before decoding), then the decoded one.
    let from_bytes =
        DeltaClient::with_limits(NodeConfig::default().to_node(), FUZZ_LIMITS).handle_bytes(rest);
    let Ok(mut resp) = DeltaDiscoveryResponse::decode(rest) else {
        return;
    };
    // What decodes is answered on the bytes path the same way (the payload bytes aside:
    // a response refused whole counts all its bytes).
    let mut from_bytes = from_bytes.expect("decodes, so its head decodes");
    let mut reference =
        DeltaClient::with_limits(NodeConfig::default().to_node(), FUZZ_LIMITS).handle(resp.clone());
    from_bytes.payload_bytes = 0;
    reference.payload_bytes = 0;
    assert_eq!(from_bytes, reference);
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
    let limits = FUZZ_LIMITS;
    let mut client = DeltaClient::with_limits(NodeConfig::default().to_node(), limits);
    let mut state = ProxyState::new();
    let budget = if resp.type_url == ADDRESS_TYPE {
        limits.max_held_addresses
    } else {
        limits.max_held_policies
    };
    for _ in 0..2 {
        let versions_before = owned_versions(&client, &resp.type_url);
        let held_before = client.held(&resp.type_url);
        let handled = client.handle(resp.clone());
        if let [(_, Rejection::ResponseTooLarge { .. })
        | (_, Rejection::ResponseOverBudget { .. })
        | (_, Rejection::OverBudget { .. })] = handled.rejected.as_slice()
        {
            assert!(handled.batch.is_empty());
            assert_eq!(owned_versions(&client, &resp.type_url), versions_before);
            assert_eq!(client.held(&resp.type_url), held_before);
        }
        if let Some(held) = client.held(&resp.type_url) {
            assert!(held <= budget, "{held} held, over the budget of {budget}");
        }
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
                assert!(
                    !versions.contains_key(name.as_str()),
                    "rejected {name:?} tracked"
                );
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

fn owned_versions(client: &DeltaClient, type_url: &str) -> Option<Vec<(String, String)>> {
    client.versions(type_url).map(|v| {
        v.into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    })
}

/// Small limits, so that the limit paths run.
pub const FUZZ_LIMITS: Limits = Limits {
    max_per_response: 64,
    max_name_len: 64,
    max_version_len: 16,
    max_tracked_per_type: 8,
    max_errors_listed: 4,
    max_error_len: 128,
    max_held_addresses: 64 << 10,
    max_held_policies: 64 << 10,
    max_held_per_response: 96 << 10,
};
