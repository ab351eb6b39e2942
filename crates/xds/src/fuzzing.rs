//! The bodies of the `xds_delta`, `xds_resource` and `xds_waypoint_policy` fuzz targets,
//! here so that they are built and tested with the crate (the fuzz crate only calls
//! them).

use ambit_proto::istio::security as psec;
use ambit_proto::istio::workload as pw;
use ambit_proto::{DeltaDiscoveryResponse, Resource, ADDRESS_TYPE, AUTHORIZATION_TYPE};
use ambit_state::ProxyState;
use prost::Message;

use crate::delta::{DeltaClient, Limits, NodeConfig};
use crate::reject::Rejection;
use crate::shape::{self, ShapeError, *};
use crate::wire::WireError;

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
const FUZZ_LIMITS: Limits = Limits {
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

// ----- xds_resource ----------------------------------------------------------------------

/// Byte 0: bit 0 picks the type (0 = `istio.workload.Address`, 1 =
/// `istio.security.Authorization`), bit 1 names the resource after its body (else a fixed
/// name); the rest is the body.
///
/// Checks, against `prost`: a body the shape walk accepts and `prost` decodes holds no
/// more entries and no longer strings than the limits allow (so the walk follows
/// `prost`'s merge rules); a body the walk finds malformed (other than a group) does not
/// decode; and through the delta client: a body is accepted only if the walk accepted it
/// and its name is the resource name, and an accepted one is held by the store under it.
pub fn resource_body(data: &[u8]) {
    let Some((&selector, body)) = data.split_first() else {
        return;
    };
    let policy = selector & 1 == 1;
    let (walked, decoded_name) = if policy {
        let walked = shape::check_authorization(body);
        let decoded = psec::Authorization::decode(body);
        check_against_prost(&walked, decoded.is_ok());
        if let (Ok(()), Ok(a)) = (&walked, &decoded) {
            policy_within_limits(a);
        }
        (
            walked,
            decoded.ok().map(|a| format!("{}/{}", a.namespace, a.name)),
        )
    } else {
        let walked = shape::check_address(body);
        let decoded = pw::Address::decode(body);
        check_against_prost(&walked, decoded.is_ok());
        if let (Ok(()), Ok(a)) = (&walked, &decoded) {
            address_within_limits(a);
        }
        let name = decoded.ok().and_then(|a| match a.r#type? {
            pw::address::Type::Workload(w) => Some(w.uid),
            pw::address::Type::Service(s) => Some(format!("{}/{}", s.namespace, s.hostname)),
        });
        (walked, name)
    };
    let type_url = if policy {
        AUTHORIZATION_TYPE
    } else {
        ADDRESS_TYPE
    };
    let name = match decoded_name {
        Some(n) if selector & 2 == 2 => n,
        _ => "ns/fixed".to_string(),
    };
    let mut client = DeltaClient::new(NodeConfig::default().to_node());
    let h = client.handle(DeltaDiscoveryResponse {
        type_url: type_url.into(),
        nonce: "n".into(),
        resources: vec![Resource {
            name: name.clone(),
            version: "1".into(),
            resource: Some(prost_types::Any {
                type_url: type_url.into(),
                value: body.to_vec(),
            }),
            ..Default::default()
        }],
        ..Default::default()
    });
    if let Err(e) = &walked {
        assert_eq!(h.rejected.len(), 1, "{e}: accepted");
    }
    match h.rejected.first() {
        None => {
            let mut state = ProxyState::new();
            h.batch.apply(&mut state);
            let held = if policy {
                state.policies().any(|p| p.key() == name)
            } else {
                state.workload_by_uid(&name).is_some() || state.service_by_key(&name).is_some()
            };
            assert!(held, "{name} accepted but not held under its name");
        }
        Some((n, reason)) => {
            assert_eq!(*n, name);
            assert!(h.batch.is_empty());
            assert!(h.reply.error_detail.unwrap().message.starts_with(&name));
            if let Rejection::Shape(e) = reason {
                assert_eq!(walked.as_ref(), Err(e));
            }
        }
    }
}

fn check_against_prost(walked: &Result<(), ShapeError>, decodes: bool) {
    if let Err(ShapeError::Malformed { error, .. }) = walked {
        // prost skips a group in a field it does not know; the walk refuses every group.
        if !matches!(error, WireError::BadWireType(3 | 4)) {
            assert!(!decodes, "the walk found {error} where prost decodes");
        }
    }
}

fn short(s: &str) {
    assert!(s.len() <= MAX_STRING_BYTES, "a string of {} bytes", s.len());
}

fn string_matches(v: &[psec::StringMatch]) {
    use psec::string_match::MatchType;
    for m in v {
        if let Some(MatchType::Exact(s) | MatchType::Prefix(s) | MatchType::Suffix(s)) =
            &m.match_type
        {
            short(s);
        }
    }
}

fn policy_within_limits(a: &psec::Authorization) {
    short(&a.name);
    short(&a.namespace);
    assert!(a.rules.len() <= MAX_RULES_PER_POLICY);
    assert!(a.extensions.len() <= MAX_EXTENSIONS);
    let (mut matches, mut values) = (0, 0);
    for r in &a.rules {
        assert!(r.clauses.len() <= MAX_CLAUSES_PER_RULE);
        let in_rule: usize = r.clauses.iter().map(|c| c.matches.len()).sum();
        assert!(in_rule <= MAX_MATCHES_PER_RULE);
        matches += in_rule;
        for m in r.clauses.iter().flat_map(|c| &c.matches) {
            let lens = [
                m.namespaces.len(),
                m.not_namespaces.len(),
                m.principals.len(),
                m.not_principals.len(),
                m.source_ips.len(),
                m.not_source_ips.len(),
                m.destination_ips.len(),
                m.not_destination_ips.len(),
                m.destination_ports.len(),
                m.not_destination_ports.len(),
                m.service_accounts.len(),
                m.not_service_accounts.len(),
            ];
            assert!(lens.iter().all(|&n| n <= MAX_VALUES_PER_FIELD), "{lens:?}");
            assert!(m.extensions.len() <= MAX_EXTENSIONS);
            values += lens.iter().sum::<usize>();
            for v in [
                &m.namespaces,
                &m.not_namespaces,
                &m.principals,
                &m.not_principals,
            ] {
                string_matches(v);
            }
            for sa in m.service_accounts.iter().chain(&m.not_service_accounts) {
                short(&sa.namespace);
                short(&sa.service_account);
            }
        }
    }
    assert!(matches <= MAX_MATCHES_PER_POLICY);
    assert!(values <= MAX_VALUES_PER_POLICY);
}

fn address_within_limits(a: &pw::Address) {
    match &a.r#type {
        Some(pw::address::Type::Workload(w)) => {
            for s in [
                &w.uid,
                &w.name,
                &w.namespace,
                &w.hostname,
                &w.node,
                &w.cluster_id,
            ] {
                short(s);
            }
            assert!(w.addresses.len() <= MAX_WORKLOAD_ADDRESSES);
            assert!(w.services.len() <= MAX_WORKLOAD_SERVICES);
            assert!(w
                .services
                .values()
                .all(|l| l.ports.len() <= MAX_PORTS_PER_LIST));
            let ports: usize = w.services.values().map(|l| l.ports.len()).sum();
            assert!(ports <= MAX_PORTS_PER_WORKLOAD);
            assert!(w.authorization_policies.len() <= MAX_WORKLOAD_POLICIES);
            w.authorization_policies.iter().for_each(|p| short(p));
            w.services.keys().for_each(|k| short(k));
            assert!(w.extensions.len() <= MAX_EXTENSIONS);
        }
        Some(pw::address::Type::Service(s)) => {
            for x in [&s.name, &s.namespace, &s.hostname] {
                short(x);
            }
            assert!(s.addresses.len() <= MAX_SERVICE_ADDRESSES);
            assert!(s.ports.len() <= MAX_PORTS_PER_LIST);
            assert!(s.subject_alt_names.len() <= MAX_SUBJECT_ALT_NAMES);
            s.subject_alt_names.iter().for_each(|n| short(n));
            assert!(s.weighted_waypoints.len() <= MAX_WEIGHTED_WAYPOINTS);
            assert!(s.extensions.len() <= MAX_EXTENSIONS);
            if let Some(lb) = &s.load_balancing {
                assert!(lb.routing_preference.len() <= MAX_ROUTING_PREFERENCES);
            }
        }
        None => {}
    }
}

// ----- xds_waypoint_policy -----------------------------------------------------------------

/// Input: any bytes, the body of an `ambit.waypoint.v1.AuthorizationPolicy` resource.
///
/// Checks: the shape walk and the decoding never panic; a body decoded is one the walk
/// accepted, named by its `namespace/name`, and its policy encodes to a body that
/// decodes to it again (what the wire form accepts, it carries exactly); through the
/// delta client, the body is accepted only if the walk and the decoding accepted it,
/// and is then held in a waypoint's store under its name; a refusal is a NACK that
/// names it. Returns `namespace/name`, or the NACK's text after the name.
pub fn waypoint_policy_body(body: &[u8]) -> Result<String, String> {
    use std::sync::Arc;

    use crate::resource::ResourceType;
    use crate::waypoint::{
        to_proto_waypoint_policy, WaypointPolicies, WaypointPolicyOp, WaypointPolicyStore,
    };

    let ty = WaypointPolicies::default();
    let measured = ty.measure("ns/fixed", body);
    let decoded = measured.as_ref().ok().map(|_| ty.decode(body));
    let name = match &decoded {
        Some(Ok(d)) => {
            let WaypointPolicyOp::Put(p) = &d.op else {
                panic!("a decoded body is a put")
            };
            assert_eq!(d.key, p.authorization.key());
            let again = to_proto_waypoint_policy(p)
                .expect("a decoded policy encodes")
                .encode_to_vec();
            let back = ty.decode(&again).expect("its own encoding decodes");
            assert_eq!(back.op, WaypointPolicyOp::Put(Arc::clone(p)));
            d.key.clone()
        }
        _ => "ns/fixed".to_string(),
    };
    let held = |store: &WaypointPolicyStore| store.get(&name).is_some();
    through_client(
        WaypointPolicies::default(),
        &name,
        body,
        matches!(decoded, Some(Ok(_))),
        measured.as_ref().err(),
        held,
    )
}

/// A body named `name` of type `T` through a waypoint's delta client, with what the type
/// said of it: accepted only if the type decoded it (`decoded`), and then held as `held`
/// says; refused with a NACK naming it, and with the measure's reason when it was the
/// measure that refused. Returns `name`, or the NACK's reason.
fn through_client<T: crate::resource::ResourceType>(
    ty: T,
    name: &str,
    body: &[u8],
    decoded: bool,
    measured: Option<&crate::reject::Rejection>,
    held: impl FnOnce(&T::Store) -> bool,
) -> Result<String, String>
where
    T::Store: Default,
{
    let mut client =
        DeltaClient::subscribing(NodeConfig::default().to_node(), Limits::default()).subscribe(ty);
    let h = client.handle(DeltaDiscoveryResponse {
        type_url: T::TYPE_URL.into(),
        nonce: "n".into(),
        resources: vec![Resource {
            name: name.to_string(),
            version: "1".into(),
            resource: Some(prost_types::Any {
                type_url: T::TYPE_URL.into(),
                value: body.to_vec(),
            }),
            ..Default::default()
        }],
        ..Default::default()
    });
    match h.rejected.first() {
        None => {
            assert!(decoded, "accepted what the type refuses");
            let mut store = T::Store::default();
            assert!(h.batch.try_apply(&mut store).is_ok());
            assert!(held(&store), "{name} accepted but not held");
            Ok(name.to_string())
        }
        Some((n, reason)) => {
            assert_eq!(n, name);
            assert!(h.batch.is_empty());
            let message = h.reply.error_detail.expect("a NACK").message;
            assert!(message.starts_with(name));
            if let Some(e) = measured {
                assert_eq!(e, reason);
            }
            Err(reason.to_string())
        }
    }
}

// ----- xds_waypoint_route ------------------------------------------------------------------

/// Input: any bytes, the body of an `ambit.waypoint.v1.Route` resource.
///
/// Checks: measuring and decoding never panic; a body decoded is named by its
/// `<kind>/<namespace>/<name>` and its route, sent again as its own document, decodes to
/// it again; through the delta client, the body is accepted only if the type accepted it,
/// and is then held under its name; a refusal is a NACK that names it. Returns the name,
/// or the NACK's text after the name.
pub fn waypoint_route_body(body: &[u8]) -> Result<String, String> {
    use crate::resource::ResourceType;
    use crate::waypoint_routes::{
        route_resource_name, WaypointRouteOp, WaypointRouteStore, WaypointRoutes,
    };

    let ty = WaypointRoutes::default();
    let measured = ty.measure("HTTPRoute/ns/fixed", body);
    let decoded = measured.as_ref().ok().map(|_| ty.decode(body));
    let name = match &decoded {
        Some(Ok(d)) => {
            let WaypointRouteOp::Put(r) = &d.op else {
                panic!("a decoded body is a put")
            };
            assert_eq!(d.key, route_resource_name(r));
            let wire = ambit_proto::ambit::waypoint::v1::Route::decode(body).expect("decoded once");
            let again = crate::waypoint_routes::to_proto_waypoint_route(r, &wire.manifest);
            let back = ty
                .decode(&again.encode_to_vec())
                .expect("its own document decodes");
            assert_eq!(back.op, d.op);
            d.key.clone()
        }
        _ => "HTTPRoute/ns/fixed".to_string(),
    };
    through_client(
        WaypointRoutes::default(),
        &name,
        body,
        matches!(decoded, Some(Ok(_))),
        measured.as_ref().err(),
        |store: &WaypointRouteStore| store.len() == 1,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use ambit_proto::Resource;

    /// The waypoint policy body on a policy a file says, on it with bytes changed, and
    /// on garbage: accepted, refused with its reason, never a panic.
    #[test]
    fn the_waypoint_policy_body_accepts_what_a_file_says() {
        let parsed = ambit_manifests::parse_documents(
            "t.yaml",
            "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: p, namespace: ns}\nspec:\n  targetRefs: [{kind: Service, name: s}]\n  action: DENY\n  rules: [{to: [{operation: {paths: [/admin]}}]}]\n",
            &ambit_manifests::ParseOptions::default(),
        );
        let body = crate::to_proto_waypoint_policy(&parsed.policies[0].value)
            .unwrap()
            .encode_to_vec();
        assert_eq!(waypoint_policy_body(&body), Ok("ns/p".into()));
        let mut bad = body.clone();
        let at = bad.windows(6).position(|w| w == b"/admin").unwrap();
        bad[at] = b'a';
        assert_eq!(
            waypoint_policy_body(&bad),
            Err("rulesJson[0][0][0].paths[0]: path \"aadmin\" does not start with \"/\", so it can never match; write \"/aadmin\"".into())
        );
        for i in 0..body.len() {
            let mut cut = body.clone();
            cut.truncate(i);
            let _ = waypoint_policy_body(&cut);
            let mut flipped = body.clone();
            flipped[i] ^= 0x55;
            let _ = waypoint_policy_body(&flipped);
        }
    }

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
            assert_eq!(handled.batch.len(), ops, "{name}");
            let mut state = ProxyState::new();
            handled.batch.apply(&mut state);
            let held =
                state.workloads().count() + state.services().count() + state.policies().count();
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
        let path = format!(
            "{}/../../fuzz/corpus/xds_resource/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
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
}
