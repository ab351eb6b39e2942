use super::*;
use ambit_proto::Resource;
use prost_types::Any;

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
fn node_id_and_metadata() {
    let cfg = NodeConfig::from_vars(
        [
            ("POD_NAME", "ztunnel-abc"),
            ("POD_NAMESPACE", "istio-system"),
            ("NODE_NAME", "node1"),
            ("ISTIO_META_DNS_CAPTURE", "true"),
            ("ISTIO_META_CLUSTER_ID", "c1"),
            (
                "ISTIO_METAJSON_LABELS",
                r#"{"app":"z","n":2,"l":[true,null]}"#,
            ),
            ("OTHER", "x"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string())),
    )
    .unwrap();
    let n = cfg.to_node();
    assert_eq!(
        n.id,
        "ztunnel~1.1.1.1~ztunnel-abc.istio-system~istio-system.svc.cluster.local"
    );
    assert_eq!(n.cluster, "");
    let f = &n.metadata.as_ref().unwrap().fields;
    let s = |k: &str| match &f[k].kind {
        Some(Kind::StringValue(s)) => s.clone(),
        other => panic!("{k}: {other:?}"),
    };
    assert_eq!(s("NAME"), "ztunnel-abc");
    assert_eq!(s("NAMESPACE"), "istio-system");
    assert_eq!(s("INSTANCE_IPS"), "1.1.1.1");
    assert_eq!(s("NODE_NAME"), "node1");
    assert_eq!(s("DNS_CAPTURE"), "true");
    assert_eq!(s("CLUSTER_ID"), "c1");
    let Some(Kind::StructValue(labels)) = &f["LABELS"].kind else {
        panic!("LABELS")
    };
    assert_eq!(
        labels.fields["app"].kind,
        Some(Kind::StringValue("z".into()))
    );
    assert_eq!(labels.fields["n"].kind, Some(Kind::NumberValue(2.0)));
    assert_eq!(f.len(), 7);

    let with_ip = NodeConfig {
        instance_ip: Some("10.0.0.5".into()),
        ..cfg
    };
    assert!(with_ip.to_node().id.starts_with("ztunnel~10.0.0.5~"));

    let bad = NodeConfig::from_vars([("ISTIO_METAJSON_X".to_string(), "{".to_string())]);
    assert!(bad
        .unwrap_err()
        .to_string()
        .starts_with("ISTIO_METAJSON_X: not valid JSON"));
}

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
    assert_eq!(h.batch.ops.len(), 1);
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
    assert_eq!(h.batch.ops.len(), 1);

    // Over the limit with a head that does not decode: a decode error, as before.
    let mut bad = resp(ADDRESS_TYPE, "n4", vec![res("a", "1", None); 4], &[]).encode_to_vec();
    bad.extend([0x22, 1, 0xff]); // type_url = b"\xff"
    assert!(c.handle_bytes(&bad).is_err());
}
