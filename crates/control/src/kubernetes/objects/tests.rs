use super::*;

fn key(kind: Kind, name: &str) -> ObjectKey {
    ObjectKey {
        kind,
        namespace: "shop".into(),
        name: name.into(),
    }
}

/// An AuthorizationPolicy as the API server returns it (server-side fields included).
fn policy(name: &str, method: &str) -> Value {
    json!({
        "apiVersion": "security.istio.io/v1",
        "kind": "AuthorizationPolicy",
        "metadata": {
            "name": name, "namespace": "shop", "uid": "5f1c", "resourceVersion": "42",
            "generation": 3, "creationTimestamp": "2026-12-07T10:00:00Z",
            "managedFields": [{"manager": "kubectl", "operation": "Apply"}],
            "annotations": {"team": "payments"},
        },
        "spec": {
            "targetRefs": [{"kind": "Service", "group": "", "name": "cart"}],
            "action": "ALLOW",
            "rules": [{"to": [{"operation": {"methods": [method]}}]}],
        },
        "status": {"conditions": [{"type": "WaypointAccepted", "status": "True"}]},
    })
}

fn route(name: &str, port: Value) -> Value {
    json!({
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": name, "namespace": "shop"},
        "spec": {
            "parentRefs": [{"group": "", "kind": "Service", "name": "cart", "port": 80}],
            "rules": [{"backendRefs": [{"name": "cart-v2", "port": port}]}],
        },
    })
}

/// The mesh assembled from what is held.
fn served(objects: &Objects) -> crate::mesh::Mesh {
    objects.mesh()
}

/// Each resource served: its name and its wire body as text (the document is in it).
pub(crate) fn documents(objects: &Objects) -> Vec<(String, String)> {
    let mesh = objects.mesh();
    mesh.waypoint_resources
        .iter()
        .chain(&mesh.route_resources)
        .chain(&mesh.authn_resources)
        .map(|r| {
            let body = r
                .resource
                .as_ref()
                .map(|a| a.value.clone())
                .unwrap_or_default();
            (r.name.clone(), String::from_utf8_lossy(&body).into_owned())
        })
        .collect()
}

#[test]
fn an_object_is_served_as_written_and_read_by_the_file_readers() {
    let mut objects = Objects::default();
    let o = ParseOptions::default();
    let k = key(Kind::AuthorizationPolicy, "cart-read");
    assert_eq!(
        objects.apply(k.clone(), &policy("cart-read", "GET"), &o),
        Outcome::Accepted
    );
    let docs = documents(&objects);
    assert_eq!(docs.len(), 1);
    let (name, text) = &docs[0];
    assert_eq!(name, "AuthorizationPolicy/shop/cart-read");
    assert_eq!(
        objects.mesh().files[0].display().to_string(),
        "kubernetes/security.istio.io/authorizationpolicies/shop/cart-read"
    );
    for gone in [
        "managedFields",
        "resourceVersion",
        "uid",
        "status",
        "WaypointAccepted",
    ] {
        assert!(!text.contains(gone), "{gone} in {text}");
    }
    assert!(text.contains("team: payments"), "{text}");
    // Its wire form, read back as a waypoint reads it, is the policy.
    let parsed = served(&objects);
    assert_eq!(parsed.waypoint_resources.len(), 1);
    let body = parsed.waypoint_resources[0]
        .resource
        .as_ref()
        .unwrap()
        .value
        .clone();
    use ambit_waypoint_xds::{DocumentKind, PolicyDocuments};
    use prost::Message;
    let message = <PolicyDocuments as DocumentKind>::Message::decode(&body[..]).unwrap();
    let policy =
        ambit_waypoint_xds::from_proto::<PolicyDocuments>(message, "istio-system").unwrap();
    assert_eq!(policy.authorization.key(), "shop/cart-read");
    // Routes too.
    let r = key(Kind::HttpRoute, "cart-canary");
    assert_eq!(
        objects.apply(r, &route("cart-canary", json!(80)), &o),
        Outcome::Accepted
    );
    assert_eq!(served(&objects).route_resources.len(), 1);
}

#[test]
fn a_refused_version_keeps_the_last_accepted_one() {
    let mut objects = Objects::default();
    let o = ParseOptions::default();
    let k = key(Kind::AuthorizationPolicy, "cart-read");
    objects.apply(k.clone(), &policy("cart-read", "GET"), &o);
    let before = documents(&objects);
    let outcome = objects.apply(k.clone(), &policy("cart-read", "get"), &o);
    let Outcome::Refused { message, kept } = outcome else {
        panic!("{outcome:?}")
    };
    assert!(kept);
    // The file mode's message: where, which field, why.
    assert!(
        message.starts_with("AuthorizationPolicy shop/cart-read:")
            && message.contains("spec.rules[0].to[0].operation.methods[0]"),
        "{message}"
    );
    assert_eq!(
        documents(&objects),
        before,
        "the last accepted version stays"
    );
    assert_eq!(objects.refused().count(), 1);
    // Fixed: served, and no longer refused.
    assert_eq!(
        objects.apply(k, &policy("cart-read", "POST"), &o),
        Outcome::Accepted
    );
    assert_eq!(objects.refused().count(), 0);
    assert!(documents(&objects)[0].1.contains("POST"));
}

#[test]
fn a_policy_refused_from_its_first_version_denies_what_it_targets() {
    let mut objects = Objects::default();
    let o = ParseOptions::default();
    let k = key(Kind::AuthorizationPolicy, "cart-deny");
    let mut bad = policy("cart-deny", "DELETE");
    bad["spec"]["action"] = json!("DENY");
    bad["spec"]["rules"][0]["to"][0]["operation"]["metods"] = json!(["DELETE"]);
    let outcome = objects.apply(k.clone(), &bad, &o);
    assert!(
        matches!(outcome, Outcome::Refused { kept: false, .. }),
        "{outcome:?}"
    );
    let parsed = served(&objects);
    assert_eq!(parsed.waypoint_resources.len(), 1, "a stand-in is served");
    let text = &documents(&objects)[0].1;
    assert!(
        text.contains("action: DENY") && text.contains("name: cart"),
        "{text}"
    );
    assert!(text.contains("ambit.io/refused"), "{text}");
    // Its targets unreadable: no waypoint to close, nothing served.
    bad["spec"]["targetRefs"] = json!("cart");
    objects.apply(k, &bad, &o);
    assert!(documents(&objects).is_empty());
    // A refused route without an accepted version is not served at all.
    let r = key(Kind::HttpRoute, "cart-canary");
    let outcome = objects.apply(r, &route("cart-canary", json!("eighty")), &o);
    assert!(
        matches!(outcome, Outcome::Refused { kept: false, .. }),
        "{outcome:?}"
    );
    assert!(documents(&objects).is_empty());
}

#[test]
fn deletes_clears_and_limits() {
    let mut objects = Objects::default();
    let o = ParseOptions::default();
    let (a, b) = (
        key(Kind::AuthorizationPolicy, "a"),
        key(Kind::HttpRoute, "b"),
    );
    objects.apply(a.clone(), &policy("a", "GET"), &o);
    objects.apply(b.clone(), &route("b", json!(80)), &o);
    let bytes = objects.bytes;
    assert!(bytes > 0);
    objects.retain(|k| k.kind != Kind::HttpRoute);
    assert_eq!(objects.len(), 1);
    objects.delete(&a);
    assert!(objects.is_empty());
    assert_eq!(objects.bytes, 0, "bytes are given back");
    // An object larger than the API server would take is dropped, last version included.
    objects.apply(a.clone(), &policy("a", "GET"), &o);
    let mut huge = policy("a", "GET");
    huge["metadata"]["annotations"]["blob"] = json!("x".repeat(MAX_OBJECT_BYTES));
    assert!(matches!(
        objects.apply(a, &huge, &o),
        Outcome::OverLimit { .. }
    ));
    assert!(objects.is_empty());
}
