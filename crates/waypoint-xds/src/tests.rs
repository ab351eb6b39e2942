//! Table tests of the document types: every document a file says goes over the wire and
//! back unchanged, whatever its kind; what the message and the document must agree on,
//! and every refusal, naming its field; the root namespace; the estimate; the store; and
//! the types through the delta client beside the Address type, with garbage and mutated
//! bodies decoded without a panic.

use std::sync::Arc;

use ambit_manifests::{ParseOptions, WaypointPolicy};
use ambit_proto::{DeltaDiscoveryResponse, Resource, ADDRESS_TYPE};
use ambit_state::ProxyState;
use ambit_xds::{Addresses, DeltaClient, Limits, NodeConfig, Readiness};

use super::*;

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

const ROUTE: &str = "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: r, namespace: shop}\nspec:\n  parentRefs: [{group: \"\", kind: Service, name: reviews}]\n  rules:\n  - backendRefs: [{name: reviews-v2, port: 9080}]\n";

const AUTHN: &str = "apiVersion: security.istio.io/v1\nkind: RequestAuthentication\nmetadata: {name: jwt, namespace: shop}\nspec:\n  targetRefs: [{kind: Service, group: \"\", name: reviews}]\n  jwtRules: [{issuer: https://idp.example.com, jwksUri: https://idp.example.com/jwks}]\n";

/// Each document of `text` with its own text, as `ambit control` sends them.
fn documents(text: &str) -> Vec<(Parsed, String)> {
    ambit_manifests::each_document("t.yaml", text, &ParseOptions::default())
        .into_iter()
        .collect()
}

fn policies() -> Vec<(WaypointPolicy, String)> {
    documents(POLICIES)
        .into_iter()
        .map(|(mut p, text)| {
            assert!(p.errors.is_empty(), "{:?}", p.errors);
            (p.policies.remove(0).value, text)
        })
        .collect()
}

fn route_message(kind: &str, ns: &str, name: &str, manifest: &str) -> wp::Route {
    wp::Route {
        kind: kind.into(),
        namespace: ns.into(),
        name: name.into(),
        manifest: manifest.into(),
    }
}

/// The body measured then decoded, as the client does: the value, or the NACK text.
fn decode<K: DocumentKind>(ty: &Documents<K>, body: &[u8]) -> Result<K::Value, String> {
    ty.measure("n", body)
        .and_then(|_| ty.decode(body))
        .map(|d| match d.op {
            DocumentOp::Put(v) => (*v).clone(),
            other => panic!("{other:?}"),
        })
        .map_err(|e| e.to_string())
}

#[test]
fn every_document_a_file_says_goes_over_the_wire_and_reads_the_same() {
    let all = policies();
    assert_eq!(all.len(), 5);
    for (p, text) in &all {
        let body = to_proto::<PolicyDocuments>(p, text).encode_to_vec();
        assert_eq!(decode(&WaypointPolicies::default(), &body).as_ref(), Ok(p));
        let d = WaypointPolicies::default().decode(&body).unwrap();
        assert_eq!(
            d.key,
            format!("AuthorizationPolicy/{}", p.authorization.key())
        );
    }
    let (mut file, text) = documents(ROUTE).remove(0);
    let route = file.routes.remove(0).value;
    let body = to_proto::<RouteDocuments>(&route, &text).encode_to_vec();
    assert_eq!(decode(&WaypointRoutes::default(), &body), Ok(route));
    assert_eq!(
        WaypointRoutes::default().decode(&body).unwrap().key,
        "HTTPRoute/shop/r"
    );
    let (mut file, text) = documents(AUTHN).remove(0);
    let authn = file.authns.remove(0).value;
    let body = to_proto::<AuthnDocuments>(&authn, &text).encode_to_vec();
    assert_eq!(decode(&WaypointAuthns::default(), &body), Ok(authn));
    // A document without a namespace takes the message's, as a file takes its default.
    let bare = ROUTE.replace(", namespace: shop", "");
    let m = route_message("HTTPRoute", "shop", "r", &bare).encode_to_vec();
    assert!(decode(&WaypointRoutes::default(), &m).is_ok());
}

#[test]
fn refusals_name_the_field() {
    let routes = WaypointRoutes::default();
    let cases = [
        (
            route_message("TCPRoute", "shop", "r", ROUTE),
            "kind: \"TCPRoute\" is not HTTPRoute or GRPCRoute",
        ),
        (
            route_message("HTTPRoute", "", "r", ROUTE),
            "namespace: must be set",
        ),
        (
            route_message("HTTPRoute", "shop", "other", ROUTE),
            "not the HTTPRoute shop/other the message names",
        ),
        (
            route_message("GRPCRoute", "shop", "r", ROUTE),
            "not the GRPCRoute shop/r",
        ),
        (
            route_message(
                "HTTPRoute",
                "shop",
                "r",
                &ROUTE.replace("port: 9080", "port: 0"),
            ),
            "manifest: HTTPRoute/shop/r:7:44: spec.rules[0].backendRefs[0].port: 0 is not a port",
        ),
        (
            route_message(
                "HTTPRoute",
                "shop",
                "r",
                &format!("{ROUTE}---\n{}", ROUTE.replace("name: r,", "name: s,")),
            ),
            "holds 2 objects of its kind",
        ),
        (
            route_message(
                "HTTPRoute",
                "shop",
                "r",
                // An ingress Gateway of another namespace: not a waypoint's.
                &ROUTE.replace(
                    "group: \"\", kind: Service, ",
                    "group: gateway.networking.k8s.io, kind: Gateway, namespace: ingress, ",
                ),
            ),
            "not an object a waypoint serves",
        ),
    ];
    for (m, want) in cases {
        let err = decode(&routes, &m.encode_to_vec()).unwrap_err();
        assert!(err.contains(want), "{err}\nwanted: {want}");
    }
    let huge = route_message(
        "HTTPRoute",
        "shop",
        "r",
        &"#".repeat(MAX_DOCUMENT_BYTES + 1),
    );
    let err = from_proto::<RouteDocuments>(huge, "istio-system")
        .unwrap_err()
        .to_string();
    assert!(err.contains("more than the limit"), "{err}");

    // A policy is read with every check of a file: a value a file may not say, a route
    // sent as a policy, a message that is not the document's.
    let (p, text) = policies().remove(1);
    let policy_message = |kind: &str, name: &str, manifest: &str| wp::AuthorizationPolicy {
        kind: kind.into(),
        namespace: "shop".into(),
        name: name.into(),
        manifest: manifest.into(),
    };
    let ty = WaypointPolicies::default();
    let cases = [
        (policy_message("AuthorizationPolicy", "deny-admin", &text.replace("[/admin]", "[admin]")), "spec.rules[0].to[0].operation.paths[0]: path \"admin\" does not start with \"/\""),
        (policy_message("AuthorizationPolicy", "r", ROUTE), "holds 0 objects of its kind and 1 others"),
        (policy_message("AuthorizationPolicy", "other", &text), "the document is AuthorizationPolicy shop/deny-admin, not the AuthorizationPolicy shop/other"),
        (policy_message("RequestAuthentication", "deny-admin", &text), "kind: \"RequestAuthentication\" is not AuthorizationPolicy"),
        (policy_message("AuthorizationPolicy", "deny-admin", ""), "holds 0 objects of its kind and 0 others"),
    ];
    for (m, want) in cases {
        let err = decode(&ty, &m.encode_to_vec()).unwrap_err();
        assert!(err.contains(want), "{err}\nwanted: {want}");
    }
    assert_eq!(
        decode(
            &ty,
            &policy_message("AuthorizationPolicy", "deny-admin", &text).encode_to_vec()
        ),
        Ok(p)
    );
    // A route is not taken for a RequestAuthentication either.
    let route_as_authn = wp::RequestAuthentication {
        kind: "RequestAuthentication".into(),
        namespace: "shop".into(),
        name: "r".into(),
        manifest: ROUTE.into(),
    };
    let err = decode(&WaypointAuthns::default(), &route_as_authn.encode_to_vec()).unwrap_err();
    assert!(
        err.contains("holds 0 objects of its kind and 1 others"),
        "{err}"
    );
}

#[test]
fn a_gateway_class_is_honoured_from_the_waypoints_root_namespace() {
    let (audit, text) = policies().remove(3);
    let body = to_proto::<PolicyDocuments>(&audit, &text).encode_to_vec();
    assert!(decode(&WaypointPolicies::default(), &body).is_ok());
    let other = WaypointPolicies::with_root_namespace("mesh-root");
    let err = decode(&other, &body).unwrap_err();
    assert!(
        err.contains("spec.targetRefs[0].kind: a GatewayClass target is honoured only in the root namespace (\"mesh-root\")"),
        "{err}"
    );
}

#[test]
fn the_estimate_charges_the_document_and_its_patterns() {
    let ty = WaypointRoutes::default();
    let plain = ty.measure("n", ROUTE.as_bytes()).unwrap().estimate;
    assert_eq!(plain, 1 + ROUTE.len() as u64 * BYTES_PER_DOCUMENT_BYTE);
    let with_regex = format!("{ROUTE}# RegularExpression\n");
    let e = ty.measure("n", with_regex.as_bytes()).unwrap().estimate;
    assert!(e >= ambit_gateway_routes::MAX_COMPILED_BYTES as u64, "{e}");
    assert!(ty
        .measure("n", &vec![b'a'; MAX_DOCUMENT_BYTES + 5000])
        .is_err());
}

#[test]
fn the_store_puts_and_removes_by_name() {
    let (mut file, _) = documents(ROUTE).remove(0);
    let route = Arc::new(file.routes.remove(0).value);
    let mut store = DocumentStore::default();
    WaypointRoutes::apply(vec![DocumentOp::Put(route.clone())], &mut store);
    assert_eq!(store.to_vec(), vec![route]);
    WaypointRoutes::apply(
        vec![DocumentOp::Remove("HTTPRoute/shop/r".into())],
        &mut store,
    );
    assert!(store.is_empty());
}

fn resource(type_url: &str, name: &str, body: Vec<u8>) -> Resource {
    Resource {
        name: name.into(),
        version: body.len().to_string(),
        resource: Some(prost_types::Any {
            type_url: type_url.into(),
            value: body,
        }),
        ..Default::default()
    }
}

/// A waypoint's client: addresses into its `ProxyState`, policies into a store of its
/// own, each batch routed by its type; a bad policy NACKed alone, naming its field, while
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
    let mut store = DocumentStore::default();
    let route = |batch: ambit_xds::Batch,
                 state: &mut ProxyState,
                 store: &mut DocumentStore<WaypointPolicy>| {
        if let Err(b) = batch.try_apply(store) {
            b.apply(state);
        }
    };
    let p = policies();
    let body = |i: usize| to_proto::<PolicyDocuments>(&p[i].0, &p[i].1).encode_to_vec();
    let bad = to_proto::<PolicyDocuments>(&p[1].0, &p[1].1.replace("[/admin]", "[admin]"));
    let h = client.handle(DeltaDiscoveryResponse {
        type_url: WAYPOINT_POLICY_TYPE.into(),
        nonce: "1".into(),
        resources: vec![
            resource(
                WAYPOINT_POLICY_TYPE,
                "AuthorizationPolicy/shop/reviews",
                body(0),
            ),
            resource(
                WAYPOINT_POLICY_TYPE,
                "AuthorizationPolicy/shop/deny-admin",
                bad.encode_to_vec(),
            ),
            // Named otherwise than its body: refused, so a removal by name removes it.
            resource(
                WAYPOINT_POLICY_TYPE,
                "AuthorizationPolicy/shop/other",
                body(2),
            ),
        ],
        ..Default::default()
    });
    assert!(h.known_type);
    assert_eq!(h.batch.type_url(), Some(WAYPOINT_POLICY_TYPE));
    let nack = h.reply.error_detail.as_ref().unwrap().message.clone();
    assert!(
        nack.contains("AuthorizationPolicy/shop/deny-admin: manifest:")
            && nack.contains("path \"admin\" does not start with \"/\""),
        "{nack}"
    );
    assert!(
        nack.contains("AuthorizationPolicy/shop/other: the body's kind/namespace/name is \"AuthorizationPolicy/shop/ext\""),
        "{nack}"
    );
    assert_eq!(
        h.batch.ops::<WaypointPolicies>().unwrap(),
        [DocumentOp::Put(Arc::new(p[0].0.clone()))]
    );
    route(h.batch, &mut state, &mut store);
    assert_eq!(store.len(), 1);
    assert!(!client.is_ready());
    client.answered(WAYPOINT_POLICY_TYPE);
    assert!(!client.is_ready(), "addresses not answered yet");

    // Addresses go to the ProxyState, untouched by the policy store.
    let w = ambit_xds::to_proto_address_workload(&ambit_state::Workload::new("w", "shop"));
    let h = client.handle(DeltaDiscoveryResponse {
        type_url: ADDRESS_TYPE.into(),
        nonce: "2".into(),
        resources: vec![resource(
            ADDRESS_TYPE,
            "Kubernetes//v1/Pod/shop/w",
            w.encode_to_vec(),
        )],
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
        removed_resources: vec!["AuthorizationPolicy/shop/reviews".into()],
        ..Default::default()
    });
    route(h.batch, &mut state, &mut store);
    assert!(store.is_empty());
    assert_eq!(
        WaypointPolicies::default().readiness(),
        Readiness::FirstResponse
    );
}

/// xorshift64*: deterministic bytes for the garbage below.
fn next(seed: &mut u64) -> u64 {
    *seed ^= *seed >> 12;
    *seed ^= *seed << 25;
    *seed ^= *seed >> 27;
    seed.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

/// Garbage, and valid bodies with bytes flipped, cut or spliced, never panic the measure
/// or the decode; what both accept encodes to a body that decodes the same.
#[test]
fn garbage_and_mutated_bodies_never_panic() {
    let bodies: Vec<Vec<u8>> = policies()
        .iter()
        .map(|(p, text)| to_proto::<PolicyDocuments>(p, text).encode_to_vec())
        .collect();
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut accepted = 0;
    let ty = WaypointPolicies::default();
    for round in 0..2_000 {
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
        if ty.measure("x/y", &body).is_err() {
            continue;
        }
        if let Ok(d) = ty.decode(&body) {
            accepted += 1;
            let DocumentOp::Put(p) = d.op else {
                panic!("a decode is a put")
            };
            let m = wp::AuthorizationPolicy::decode(body.as_slice()).unwrap();
            let again = to_proto::<PolicyDocuments>(&p, &m.manifest).encode_to_vec();
            assert_eq!(ty.decode(&again).unwrap().op, DocumentOp::Put(p));
        }
    }
    // Some mutations keep a policy valid (a flipped letter in a comment): the accepting
    // path ran too.
    assert!(accepted > 0);
}
