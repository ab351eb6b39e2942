//! Table tests of the waypoint policy type: every policy a file says goes over the wire
//! and back unchanged; every body a file could not say is refused with its field; the
//! shape limits on the bytes; the store; and the type through the delta client beside
//! the Address type, with garbage and mutated bodies decoded without a panic.

use std::sync::Arc;

use ambit_manifests::{ParseOptions, WaypointPolicy};
use ambit_proto::ambit::waypoint::v1 as wp;
use ambit_proto::{DeltaDiscoveryResponse, Resource, ADDRESS_TYPE, WAYPOINT_POLICY_TYPE};
use ambit_state::ProxyState;
use prost::Message;

use super::measure::{
    self, MAX_CLAUSES_PER_RULE, MAX_JSON_DEPTH, MAX_MATCHES_PER_POLICY, MAX_RULES_JSON_BYTES,
    MAX_RULES_PER_POLICY, MAX_TARGETS,
};
use super::*;
use crate::delta::{DeltaClient, Limits};
use crate::node::NodeConfig;
use crate::reject::Rejection;
use crate::resource::{Readiness, ResourceType};
use crate::shape::{Limit, ShapeError, MAX_STRING_BYTES};
use crate::Addresses;

/// Policies as files say them: every field of a source and an operation with its
/// not-form, conditions of every kind of key, every action and target kind, dry run,
/// a rule without clauses, a policy without rules.
const POLICIES: &str = r#"
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: reviews, namespace: shop}
spec:
  targetRefs:
  - {kind: Service, group: "", name: reviews}
  - {kind: Gateway, group: gateway.networking.k8s.io, name: waypoint}
  action: ALLOW
  rules:
  - from:
    - source:
        principals: ["cluster.local/ns/shop/sa/frontend", "*/sa/admin"]
        notPrincipals: ["*"]
        requestPrincipals: ["issuer/sub"]
        notRequestPrincipals: ["issuer/*"]
        namespaces: [shop]
        notNamespaces: ["test-*"]
        ipBlocks: [10.0.0.0/8, "fd00::1"]
        notIpBlocks: [10.1.0.1]
        remoteIpBlocks: [203.0.113.0/24, "FD00::7"]
        notRemoteIpBlocks: [203.0.113.7]
    - source: {serviceAccounts: [web, other/api], notServiceAccounts: [default]}
    to:
    - operation:
        hosts: [reviews.shop.svc.cluster.local, "*.example.com"]
        notHosts: ["api.*"]
        ports: ["9080"]
        notPorts: ["15021"]
        methods: [GET, "P*"]
        notMethods: [DELETE]
        paths: ["/reviews/*", "/users/{*}/info"]
        notPaths: ["/admin/{**}"]
    when:
    - {key: "request.headers[x-user]", values: [alice], notValues: ["*bot"]}
    - {key: source.ip, values: [10.0.0.0/8]}
    - {key: destination.port, notValues: ["81"]}
    - {key: "request.auth.claims[groups][admin]", values: ["true"]}
  - to: [{operation: {methods: [POST]}}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-admin, namespace: shop, annotations: {istio.io/dry-run: "true"}}
spec:
  targetRef: {kind: Service, name: reviews}
  action: DENY
  rules: [{to: [{operation: {paths: [/admin]}}]}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: ext, namespace: shop}
spec:
  targetRefs: [{kind: ServiceEntry, group: networking.istio.io, name: egress}]
  action: CUSTOM
  provider: {name: ext-authz}
  rules: [{to: [{operation: {methods: [POST]}}], when: [{key: connection.sni, values: [a.example]}]}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: audit-all, namespace: istio-system}
spec:
  targetRefs: [{kind: GatewayClass, group: gateway.networking.k8s.io, name: istio-waypoint}]
  action: AUDIT
  rules: [{}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: allow-nothing, namespace: shop}
spec:
  targetRefs: [{kind: Gateway, group: gateway.networking.k8s.io, name: waypoint}]
"#;

fn policies() -> Vec<WaypointPolicy> {
    let parsed = ambit_manifests::parse_documents("t.yaml", POLICIES, &ParseOptions::default());
    assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
    assert_eq!(parsed.policies.len(), 5);
    parsed.policies.into_iter().map(|p| p.value).collect()
}

fn reviews() -> wp::AuthorizationPolicy {
    to_proto_waypoint_policy(&policies()[0]).unwrap()
}

fn ty() -> WaypointPolicies {
    WaypointPolicies::default()
}

/// The body decoded, or the NACK text of its refusal (measure, then decode, as the
/// client does).
fn decode(body: &[u8]) -> Result<WaypointPolicy, String> {
    let t = ty();
    t.measure("shop/reviews", body)
        .and_then(|_| t.decode(body))
        .map(|d| match d.op {
            WaypointPolicyOp::Put(p) => (*p).clone(),
            other => panic!("{other:?}"),
        })
        .map_err(|e| e.to_string())
}

#[test]
fn every_policy_a_file_says_goes_over_the_wire_unchanged() {
    for p in policies() {
        let message = to_proto_waypoint_policy(&p).unwrap();
        let body = message.encode_to_vec();
        let got = decode(&body).unwrap_or_else(|e| panic!("{}: {e}", p.authorization.key()));
        assert_eq!(got, p);
        let d = ty().decode(&body).unwrap();
        assert_eq!(d.key, p.authorization.key());
        // The same policy, the same bytes (its version is a hash of them).
        assert_eq!(
            to_proto_waypoint_policy(&got).unwrap().encode_to_vec(),
            body
        );
    }
}

#[test]
fn what_the_message_says_of_each_field() {
    let p = policies();
    let m = to_proto_waypoint_policy(&p[2]).unwrap();
    assert_eq!((m.name.as_str(), m.namespace.as_str()), ("ext", "shop"));
    assert_eq!(m.action, wp::Action::Custom as i32);
    assert_eq!(m.provider, "ext-authz");
    assert!(!m.dry_run);
    assert_eq!(
        m.targets,
        [wp::Target {
            kind: wp::target::Kind::ServiceEntry as i32,
            name: "egress".into()
        }]
    );
    assert_eq!(
        String::from_utf8(m.rules_json).unwrap(),
        r#"[[[{"methods":["POST"]}],[{"when":[{"key":"connection.sni","values":["a.example"]}]}]]]"#
    );
    let m = to_proto_waypoint_policy(&p[1]).unwrap();
    assert!(m.dry_run);
    assert_eq!(m.action, wp::Action::Deny as i32);
    let m = to_proto_waypoint_policy(&p[3]).unwrap();
    assert_eq!(m.action, wp::Action::Audit as i32);
    assert_eq!(m.targets[0].kind, wp::target::Kind::GatewayClass as i32);
    assert_eq!(m.rules_json, b"[[]]");
    let m = to_proto_waypoint_policy(&p[4]).unwrap();
    assert_eq!(m.action, wp::Action::Allow as i32);
    assert_eq!(m.rules_json, b"[]");
}

/// Each body a file could not say, and the start of its NACK text: the field at fault.
#[test]
fn a_body_no_file_says_is_refused_naming_its_field() {
    type Edit = Box<dyn Fn(&mut wp::AuthorizationPolicy)>;
    let rules = |json: &'static str| -> Edit { Box::new(move |m| m.rules_json = json.into()) };
    let table: Vec<(&str, Edit, &str)> = vec![
        ("no name", Box::new(|m| m.name.clear()), "name: must be set"),
        ("no namespace", Box::new(|m| m.namespace.clear()), "namespace: must be set"),
        (
            "a name Kubernetes refuses",
            Box::new(|m| m.name = "Reviews_1".into()),
            "metadata.name: \"Reviews_1\" is not a Kubernetes name",
        ),
        (
            "a namespace with a dot",
            Box::new(|m| m.namespace = "a.b".into()),
            "metadata.namespace: \"a.b\" is not a Kubernetes name",
        ),
        (
            "no action",
            Box::new(|m| m.action = 0),
            "action: 0 is not ALLOW, DENY, AUDIT or CUSTOM (a missing action is refused",
        ),
        ("an unknown action", Box::new(|m| m.action = 9), "action: 9 is not"),
        (
            "CUSTOM without a provider",
            Box::new(|m| m.action = wp::Action::Custom as i32),
            "provider: a CUSTOM policy names its provider",
        ),
        (
            "ALLOW with a provider",
            Box::new(|m| m.provider = "ext".into()),
            "provider: only a CUSTOM policy names a provider",
        ),
        (
            "CUSTOM with principals",
            Box::new(|m| {
                m.action = wp::Action::Custom as i32;
                m.provider = "ext".into();
            }),
            "spec.rules[0].from[0].source.principals: is not supported with action CUSTOM",
        ),
        ("no targets", Box::new(|m| m.targets.clear()), "targets: at least one"),
        (
            "a target of no kind",
            Box::new(|m| m.targets[1].kind = 0),
            "targets[1].kind: 0 is not GATEWAY",
        ),
        (
            "a target without a name",
            Box::new(|m| m.targets[0].name.clear()),
            "targets[0].name: must be set",
        ),
        (
            "a GatewayClass outside the root namespace",
            Box::new(|m| m.targets[0].kind = wp::target::Kind::GatewayClass as i32),
            "spec.targetRefs[0].kind: a GatewayClass target is honoured only in the root namespace",
        ),
        ("no rules JSON", rules(""), "rulesJson: must be set"),
        ("rules that are not JSON", rules("[[[{]"), "rulesJson: not JSON"),
        (
            "rules of the wrong form",
            rules(r#"{"rules": 1}"#),
            "rulesJson: invalid type: map, expected a sequence",
        ),
        (
            "a value the state's parser refuses",
            rules(r#"[[[{"paths":["admin"]}]]]"#),
            "rulesJson[0][0][0].paths[0]: path \"admin\" does not start with \"/\", so it can never match; write \"/admin\"",
        ),
        (
            "a principal with its scheme",
            rules(r#"[[[{"principals":[{"Exact":"spiffe://td/ns/a/sa/b"}]}]]]"#),
            "rulesJson[0][0][0].principals[0]: principal \"spiffe://td/ns/a/sa/b\" starts with",
        ),
        (
            "an unknown field",
            rules(r#"[[[{"sourceIp":["10.0.0.1"]}]]]"#),
            "rulesJson[0][0][0].sourceIp: unknown field `sourceIp`",
        ),
        (
            "a destination IP outside a condition",
            rules(r#"[[[{"destinationIps":["10.0.0.1"]}]]]"#),
            "rulesJson[0][0][0].destinationIps: no AuthorizationPolicy field says this",
        ),
        (
            "a header match outside a condition",
            rules(r#"[[[{"headers":{"x-a":"b"}}]]]"#),
            "rulesJson[0][0][0].headers: no AuthorizationPolicy field says this",
        ),
        (
            "a source and an operation field in one match object",
            rules(r#"[[[{"principals":[{"Exact":"a"}],"paths":["/a"]}]]]"#),
            "rulesJson[0][0][0].paths: a to field beside a from field (principals)",
        ),
        (
            "match objects of two sections in one clause",
            rules(r#"[[[{"principals":[{"Exact":"a"}]},{"paths":["/a"]}]]]"#),
            "rulesJson[0][0][1]: to fields in a clause whose match object 0 sets from fields",
        ),
        (
            "an operation before a source",
            rules(r#"[[[{"paths":["/a"]}],[{"principals":[{"Exact":"a"}]}]]]"#),
            "rulesJson[0][1]: a from clause after a to clause",
        ),
        (
            "two source clauses",
            rules(r#"[[[{"namespaces":[{"Exact":"a"}]}],[{"principals":[{"Exact":"a"}]}]]]"#),
            "rulesJson[0][1]: a from clause after a from clause",
        ),
        (
            "an empty clause",
            rules("[[[]]]"),
            "rulesJson[0][0]: an empty clause",
        ),
        (
            "a clause of empty match objects",
            rules("[[[{}]]]"),
            "rulesJson[0][0]: its match objects set no field",
        ),
        (
            "an empty match object beside a source",
            rules(r#"[[[{"principals":[{"Exact":"a"}]},{}]]]"#),
            "spec.rules[0].from[1].source: sets no field",
        ),
        (
            "a when clause of two match objects",
            rules(r#"[[[{"when":[{"key":"connection.sni","values":["a"]}]},{"when":[{"key":"connection.sni","values":["b"]}]}]]]"#),
            "rulesJson[0][0]: a when clause is one match object",
        ),
        (
            "a namespace pattern with a star inside",
            rules(r#"[[[{"namespaces":[{"Exact":"a*b"}]}]]]"#),
            "spec.rules[0].from[0].source.namespaces[0]: \"a*b\" has a '*' inside",
        ),
        (
            "service accounts beside principals",
            rules(r#"[[[{"principals":[{"Exact":"a"}],"serviceAccounts":[{"namespace":"a","serviceAccount":"b"}]}]]]"#),
            "spec.rules[0].from[0].source.serviceAccounts: cannot be set with principals",
        ),
        (
            "a service account with a star",
            rules(r#"[[[{"serviceAccounts":[{"namespace":"a","serviceAccount":"b*"}]}]]]"#),
            "spec.rules[0].from[0].source.serviceAccounts[0]: service account \"a/b*\" has a '*'",
        ),
        (
            "an empty list of paths",
            rules(r#"[[[{"paths":[]}]]]"#),
            "spec.rules[0].to[0].operation: sets no field",
        ),
        (
            "a DENY policy without rules",
            Box::new(|m| {
                m.action = wp::Action::Deny as i32;
                m.rules_json = b"[]".to_vec();
            }),
            "spec.action: a DENY policy without rules never matches",
        ),
        (
            "an empty list beside a set one",
            rules(r#"[[[{"paths":["/a"],"notPaths":[]}]]]"#),
            "rulesJson[0][0][0]: reads back otherwise from the AuthorizationPolicy that would say it",
        ),
    ];
    let mut failures = Vec::new();
    for (what, edit, want) in table {
        let mut m = reviews();
        edit(&mut m);
        match decode(&m.encode_to_vec()) {
            Ok(p) => failures.push(format!("{what}: accepted as {p:?}")),
            Err(got) if !got.starts_with(want) => {
                failures.push(format!("{what}:\n  got  {got}\n  want {want}..."))
            }
            Err(_) => {}
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn a_gateway_class_is_honoured_from_the_waypoints_root_namespace() {
    let audit = to_proto_waypoint_policy(&policies()[3])
        .unwrap()
        .encode_to_vec();
    assert!(ty().decode(&audit).is_ok());
    let other = WaypointPolicies {
        root_namespace: "mesh-root".into(),
        ..ty()
    };
    let err = other.decode(&audit).unwrap_err().to_string();
    assert!(
        err.starts_with("spec.targetRefs[0].kind: a GatewayClass target is honoured only in the root namespace (\"mesh-root\")"),
        "{err}"
    );
}

/// Each body and the shape error the walk refuses it with, before anything is decoded.
#[test]
fn the_shape_is_bounded_on_the_bytes() {
    let long = "a".repeat(MAX_STRING_BYTES + 1);
    let nested = format!(
        "{}{}",
        "[".repeat(MAX_JSON_DEPTH + 1),
        "]".repeat(MAX_JSON_DEPTH + 1)
    );
    let many_rules = format!("[{}[]]", "[],".repeat(MAX_RULES_PER_POLICY));
    let many_matches = format!("[[[{}{{}}]]]", "{},".repeat(MAX_MATCHES_PER_POLICY));
    let many_values = format!(
        "[[[{{\"ports\":[{}1]}}]]]",
        "1,".repeat(measure::MAX_VALUES_PER_FIELD)
    );
    let many_clauses = format!("[[{}[]]]", "[],".repeat(MAX_CLAUSES_PER_RULE));
    let long_value = format!("[[[{{\"paths\":[\"/{long}\"]}}]]]");
    type Edit = Box<dyn Fn(&mut wp::AuthorizationPolicy)>;
    let json = |s: String| -> Edit { Box::new(move |m| m.rules_json = s.clone().into_bytes()) };
    let l = long.clone();
    let table: Vec<(&str, Edit, ShapeError)> = vec![
        (
            "a long name",
            Box::new(move |m| m.name = l.clone()),
            ShapeError::TooLong {
                field: "name".into(),
                len: MAX_STRING_BYTES + 1,
            },
        ),
        (
            "a long target name",
            Box::new({
                let l = long.clone();
                move |m| m.targets[1].name = l.clone()
            }),
            ShapeError::TooLong {
                field: "targets[1].name".into(),
                len: MAX_STRING_BYTES + 1,
            },
        ),
        (
            "too many targets",
            Box::new(|m| m.targets = vec![m.targets[0].clone(); MAX_TARGETS + 1]),
            ShapeError::TooMany {
                field: "targets".into(),
                limit: Limit::Other {
                    max: MAX_TARGETS,
                    what: "targets of one policy",
                },
            },
        ),
        (
            "rules' JSON too large",
            json(" ".repeat(MAX_RULES_JSON_BYTES + 1)),
            ShapeError::TooMany {
                field: "rulesJson".into(),
                limit: Limit::Other {
                    max: MAX_RULES_JSON_BYTES,
                    what: "bytes of the rules' JSON",
                },
            },
        ),
        (
            "nested too deep",
            json(nested),
            ShapeError::TooMany {
                field: "rulesJson".into(),
                limit: Limit::Other {
                    max: MAX_JSON_DEPTH,
                    what: "levels of nesting in the rules' JSON",
                },
            },
        ),
        (
            "too many rules",
            json(many_rules),
            ShapeError::TooMany {
                field: "rulesJson".into(),
                limit: Limit::RulesPerPolicy,
            },
        ),
        (
            "too many clauses in a rule",
            json(many_clauses),
            ShapeError::TooMany {
                field: "rulesJson".into(),
                limit: Limit::ClausesPerRule,
            },
        ),
        (
            "too many match objects",
            json(many_matches),
            ShapeError::TooMany {
                field: "rulesJson".into(),
                limit: Limit::MatchesPerPolicy,
            },
        ),
        (
            "too many values in a list",
            json(many_values),
            ShapeError::TooMany {
                field: "rulesJson".into(),
                limit: Limit::ValuesPerField,
            },
        ),
        (
            "a long value",
            json(long_value),
            ShapeError::TooLong {
                field: "rulesJson".into(),
                len: MAX_STRING_BYTES + 2,
            },
        ),
    ];
    for (what, edit, want) in table {
        let mut m = reviews();
        edit(&mut m);
        let got = ty().measure("shop/reviews", &m.encode_to_vec());
        assert_eq!(got, Err(Rejection::Shape(want)), "{what}");
    }
    // Bytes that are not a message at all.
    let got = ty()
        .measure("shop/reviews", &[0x0a, 0x05, b'a'])
        .unwrap_err();
    assert_eq!(
        got.to_string(),
        "cannot decode ambit.waypoint.v1.AuthorizationPolicy: a field runs past the end of its message"
    );
}

/// The estimate grows with what a body holds, and counts the rules' JSON by its parts.
#[test]
fn the_estimate_grows_with_the_policy() {
    let small = reviews();
    let estimate = |m: &wp::AuthorizationPolicy| {
        ty().measure("shop/reviews", &m.encode_to_vec())
            .unwrap()
            .estimate
    };
    let base = estimate(&small);
    let mut more = small.clone();
    more.rules_json = b"[[[{\"paths\":[\"/a\"]}]],[[{\"paths\":[\"/b\"]}]]]".to_vec();
    let mut fewer = small.clone();
    fewer.rules_json = b"[[[{\"paths\":[\"/a\"]}]]]".to_vec();
    assert!(estimate(&more) > estimate(&fewer));
    assert!(base > estimate(&fewer));
    let mut targets = small.clone();
    targets.targets.push(targets.targets[0].clone());
    assert!(estimate(&targets) > base);
    // The counts the estimate comes from.
    let c = measure::walk(
        br#"[[[{"paths":["/a","/b"]},{"hosts":["h"]}],[{"when":[{"key":"k","values":["v"]}]}]]]"#,
    )
    .unwrap();
    assert_eq!((c.rules, c.clauses, c.matches, c.l7_matches), (1, 2, 3, 3));
    // paths, hosts, when and its values: four lists of five values.
    assert_eq!((c.value_lists, c.values), (4, 5));
    // An L4 match object holds no box of L7 attributes.
    let c = measure::walk(br#"[[[{"principals":[{"Exact":"a"}]}]]]"#).unwrap();
    assert_eq!((c.matches, c.l7_matches, c.values), (1, 0, 1));
}

#[test]
fn the_store_holds_what_batches_put_and_forgets_what_they_remove() {
    let p = policies();
    let mut store = WaypointPolicyStore::default();
    let put = |i: usize| WaypointPolicyOp::Put(Arc::new(p[i].clone()));
    WaypointPolicies::apply(vec![put(0), put(1), put(2)], &mut store);
    assert_eq!(store.len(), 3);
    let keys: Vec<String> = store.iter().map(|p| p.authorization.key()).collect();
    assert_eq!(keys, ["shop/deny-admin", "shop/ext", "shop/reviews"]);
    WaypointPolicies::apply(
        vec![
            WaypointPolicyOp::Remove("shop/ext".into()),
            WaypointPolicyOp::Remove("shop/never".into()),
        ],
        &mut store,
    );
    assert_eq!(store.len(), 2);
    assert!(store.get("shop/ext").is_none());
    assert_eq!(**store.get("shop/reviews").unwrap(), p[0]);
    // A new version replaces the old under its name.
    let mut changed = p[0].clone();
    changed.authorization.dry_run = true;
    WaypointPolicies::apply(
        vec![WaypointPolicyOp::Put(Arc::new(changed.clone()))],
        &mut store,
    );
    assert_eq!(store.to_vec().len(), 2);
    assert_eq!(**store.get("shop/reviews").unwrap(), changed);
}

fn resource(name: &str, body: Vec<u8>) -> Resource {
    Resource {
        name: name.into(),
        version: body.len().to_string(),
        resource: Some(prost_types::Any {
            type_url: WAYPOINT_POLICY_TYPE.into(),
            value: body,
        }),
        ..Default::default()
    }
}

/// A waypoint's client: addresses into its `ProxyState`, policies into its own store,
/// each batch routed by its type; a bad policy NACKed alone, naming its field, while
/// the good ones apply; readiness waits for both types.
#[test]
fn a_waypoints_client_gets_policies_beside_addresses() {
    let mut client = DeltaClient::subscribing(NodeConfig::default().to_node(), Limits::default())
        .subscribe(Addresses::default())
        .subscribe(WaypointPolicies::default());
    let initial: Vec<String> = client
        .initial_requests()
        .into_iter()
        .map(|r| r.type_url)
        .collect();
    assert_eq!(initial, [ADDRESS_TYPE, WAYPOINT_POLICY_TYPE]);
    let mut state = ProxyState::new();
    let mut store = WaypointPolicyStore::default();
    let route = |batch: crate::Batch, state: &mut ProxyState, store: &mut WaypointPolicyStore| {
        if let Err(b) = batch.try_apply(store) {
            b.apply(state);
        }
    };

    let p = policies();
    let mut bad = to_proto_waypoint_policy(&p[1]).unwrap();
    bad.rules_json = br#"[[[{"paths":["admin"]}]]]"#.to_vec();
    let h = client.handle(DeltaDiscoveryResponse {
        type_url: WAYPOINT_POLICY_TYPE.into(),
        nonce: "1".into(),
        resources: vec![
            resource(
                "shop/reviews",
                to_proto_waypoint_policy(&p[0]).unwrap().encode_to_vec(),
            ),
            resource("shop/deny-admin", bad.encode_to_vec()),
            // Named otherwise than its body: refused, so a removal by name removes it.
            resource(
                "shop/other",
                to_proto_waypoint_policy(&p[2]).unwrap().encode_to_vec(),
            ),
        ],
        ..Default::default()
    });
    assert!(h.known_type);
    assert_eq!(h.batch.type_url(), Some(WAYPOINT_POLICY_TYPE));
    let nack = h.reply.error_detail.as_ref().unwrap().message.clone();
    assert!(
        nack.starts_with("shop/deny-admin: rulesJson[0][0][0].paths[0]: path \"admin\" does not start with \"/\""),
        "{nack}"
    );
    assert!(
        nack.contains("shop/other: the body's policy namespace/name is \"shop/ext\""),
        "{nack}"
    );
    // The typed batch is the waypoint's store's.
    assert_eq!(
        h.batch.ops::<WaypointPolicies>().unwrap(),
        [WaypointPolicyOp::Put(Arc::new(p[0].clone()))]
    );
    route(h.batch, &mut state, &mut store);
    assert_eq!(store.len(), 1);
    assert!(!client.is_ready());
    client.answered(WAYPOINT_POLICY_TYPE);
    assert!(!client.is_ready(), "addresses not answered yet");
    let versions = client.versions(WAYPOINT_POLICY_TYPE).unwrap();
    assert_eq!(
        versions.keys().copied().collect::<Vec<_>>(),
        ["shop/reviews"]
    );

    // Addresses go to the ProxyState, untouched by the policy store.
    let w = crate::to_proto_address_workload(&ambit_state::Workload::new("w", "shop"));
    let h = client.handle(DeltaDiscoveryResponse {
        type_url: ADDRESS_TYPE.into(),
        nonce: "2".into(),
        resources: vec![Resource {
            name: "Kubernetes//v1/Pod/shop/w".into(),
            version: "1".into(),
            resource: Some(prost_types::Any {
                type_url: ADDRESS_TYPE.into(),
                value: w.encode_to_vec(),
            }),
            ..Default::default()
        }],
        ..Default::default()
    });
    assert!(h.rejected.is_empty(), "{:?}", h.rejected);
    route(h.batch, &mut state, &mut store);
    assert!(state.workload_by_uid("Kubernetes//v1/Pod/shop/w").is_some());
    assert!(
        client.answered(ADDRESS_TYPE),
        "ready once both were answered"
    );

    // A removal.
    let h = client.handle(DeltaDiscoveryResponse {
        type_url: WAYPOINT_POLICY_TYPE.into(),
        nonce: "3".into(),
        removed_resources: vec!["shop/reviews".into()],
        ..Default::default()
    });
    route(h.batch, &mut state, &mut store);
    assert!(store.is_empty());
    assert_eq!(ty().readiness(), Readiness::FirstResponse);
}

/// xorshift64*: deterministic bytes for the garbage below.
fn next(seed: &mut u64) -> u64 {
    *seed ^= *seed >> 12;
    *seed ^= *seed << 25;
    *seed ^= *seed >> 27;
    seed.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

/// Garbage, and valid bodies with bytes flipped, cut or spliced, never panic the
/// measure or the decode; what both accept encodes to a body that decodes the same.
#[test]
fn garbage_and_mutated_bodies_never_panic() {
    let bodies: Vec<Vec<u8>> = policies()
        .iter()
        .map(|p| to_proto_waypoint_policy(p).unwrap().encode_to_vec())
        .collect();
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut accepted = 0;
    for round in 0..4_000 {
        let mut body = if round % 4 == 0 {
            let len = (next(&mut seed) % 200) as usize;
            (0..len).map(|_| next(&mut seed) as u8).collect()
        } else {
            bodies[round % bodies.len()].clone()
        };
        let edits = 1 + next(&mut seed) % 4;
        for _ in 0..edits {
            if body.is_empty() {
                break;
            }
            let at = (next(&mut seed) % body.len() as u64) as usize;
            match next(&mut seed) % 4 {
                0 => body[at] = next(&mut seed) as u8,
                1 => body.truncate(at),
                2 => body.insert(at, next(&mut seed) as u8),
                _ => {
                    let other = &bodies[(next(&mut seed) % bodies.len() as u64) as usize];
                    let from = (next(&mut seed) % other.len() as u64) as usize;
                    body.splice(at..at, other[from..].iter().copied().take(16));
                }
            }
        }
        let t = ty();
        if t.measure("x/y", &body).is_err() {
            continue;
        }
        if let Ok(d) = t.decode(&body) {
            accepted += 1;
            let WaypointPolicyOp::Put(p) = d.op else {
                panic!("a decode is a put")
            };
            let again = to_proto_waypoint_policy(&p).unwrap().encode_to_vec();
            let back = t.decode(&again).unwrap();
            assert_eq!(back.op, WaypointPolicyOp::Put(p));
        }
    }
    // Some mutations keep a policy valid (a flipped letter in a name): the accepting
    // path ran too.
    assert!(accepted > 0);
}
