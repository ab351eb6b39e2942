//! The `xds_resource` target: one resource body through the shape walk, `prost` and the
//! delta client.

use ambit_proto::istio::security as psec;
use ambit_proto::istio::workload as pw;
use ambit_proto::{DeltaDiscoveryResponse, Resource, ADDRESS_TYPE, AUTHORIZATION_TYPE};
use ambit_state::ProxyState;
use ambit_xds::delta::{DeltaClient, NodeConfig};
use ambit_xds::reject::Rejection;
use ambit_xds::shape::{self, ShapeError, *};
use ambit_xds::wire::WireError;
use prost::Message;

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
