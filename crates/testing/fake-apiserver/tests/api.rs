//! The Rust API tests drive the server with: applying YAML, the kubelet-style update, a
//! server on a listener the test made, streamed initial lists, and the served versions of
//! custom resources.

mod common;

use ambit_fake_apiserver::{node, pod, ApiServer, Resource, ServerOptions};
use common::raw;
use serde_json::json;

const CHART: &str = r#"
apiVersion: v1
kind: ServiceAccount
metadata:
  name: ztunnel
  namespace: istio-system
---
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: ztunnel
  namespace: istio-system
spec:
  selector:
    matchLabels: {app: ztunnel}
  template:
    metadata:
      labels: {app: ztunnel}
    spec:
      containers: [{name: istio-proxy, image: "ambit:1"}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: ztunnel
rules: []
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_yaml_creates_then_replaces_and_skips_other_kinds() {
    let api = ApiServer::start(ServerOptions::default()).await.unwrap();
    let err = api.apply_yaml(CHART).unwrap_err();
    assert!(
        err.to_string()
            .contains("namespaces \"istio-system\" not found"),
        "{err}"
    );
    api.create(ambit_fake_apiserver::namespace("istio-system", &[]))
        .unwrap();
    let applied = api.apply_yaml(CHART).unwrap();
    assert_eq!(
        applied,
        ["DaemonSet/istio-system/ztunnel", "ClusterRole/ztunnel"]
    );
    let ds = api
        .get(Resource::DaemonSets, Some("istio-system"), "ztunnel")
        .unwrap();
    assert_eq!(ds["metadata"]["generation"], 1);
    let uid = ds["metadata"]["uid"].clone();
    let rv = api.resource_version();
    // The same again changes nothing; a changed spec bumps the generation, keeps the uid.
    api.apply_yaml(CHART).unwrap();
    assert_eq!(api.resource_version(), rv);
    api.apply_yaml(&CHART.replace("ambit:1", "ambit:2"))
        .unwrap();
    let ds = api
        .get(Resource::DaemonSets, Some("istio-system"), "ztunnel")
        .unwrap();
    assert_eq!(
        (
            ds["metadata"]["generation"].clone(),
            ds["metadata"]["uid"].clone()
        ),
        (json!(2), uid)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubelet_updates_status_and_no_ops_do_not_bump() {
    let api = ApiServer::start(ServerOptions::default()).await.unwrap();
    api.create(node("n1")).unwrap();
    let mut p = pod("default", "a", "n1");
    p["status"] = json!({"phase": "Running", "podIPs": [{"ip": "10.0.0.1"}]});
    assert_eq!(
        api.create(p).unwrap()["status"]["phase"],
        "Running",
        "the Rust API keeps a given status"
    );
    let updated = api
        .update(Resource::Pods, Some("default"), "a", |p| {
            p["status"]["podIPs"] = json!([{"ip": "10.0.0.2"}])
        })
        .unwrap();
    assert_eq!(updated["status"]["podIPs"][0]["ip"], "10.0.0.2");
    let rv = api.resource_version();
    api.update(Resource::Pods, Some("default"), "a", |p| {
        p["status"]["podIPs"] = json!([{"ip": "10.0.0.2"}])
    })
    .unwrap();
    assert_eq!(api.resource_version(), rv);
    api.delete(Resource::Pods, Some("default"), "a").unwrap();
    assert!(api.get(Resource::Pods, Some("default"), "a").is_none());
    assert!(api.delete(Resource::Pods, Some("default"), "a").is_err());
    assert!(api
        .create(json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}}))
        .is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_on_a_given_listener_with_its_address_in_the_certificate() {
    let listener = std::net::TcpListener::bind("127.0.0.2:0").unwrap();
    let api = ApiServer::start_on(listener, ServerOptions::default())
        .await
        .unwrap();
    assert!(api.url().starts_with("https://127.0.0.2:"), "{}", api.url());
    let admin = api.admin_token();
    let r = raw(&api, "GET", "/api/v1/namespaces", Some(&admin), None, b"").await;
    assert_eq!(r.status, 200);
    let list = r.json();
    let names: Vec<&str> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["default", "kube-node-lease", "kube-public", "kube-system"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_initial_lists_end_with_a_marked_bookmark() {
    let api = ApiServer::start(ServerOptions::default()).await.unwrap();
    api.create(pod("default", "a", "n1")).unwrap();
    let admin = api.admin_token();
    let r = raw(
        &api,
        "GET",
        "/api/v1/pods?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=1",
        Some(&admin),
        None,
        b"",
    )
    .await;
    let ev = r.lines();
    assert_eq!(ev[0]["type"], "ADDED");
    assert_eq!(ev[1]["type"], "BOOKMARK");
    assert_eq!(
        ev[1]["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rust_api_takes_any_served_version_and_stores_one() {
    let api = ApiServer::start(ServerOptions::default()).await.unwrap();
    let applied = api
        .apply_yaml(
            "apiVersion: security.istio.io/v1beta1\nkind: AuthorizationPolicy\nmetadata: {name: p}\nspec: {action: DENY}\n---\n\
             apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: r, namespace: default}\nspec: {}\n---\n\
             apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata: {k: v}\n---\n\
             apiVersion: authentication.k8s.io/v1\nkind: TokenReview\nspec: {token: t}\n",
        )
        .unwrap();
    assert_eq!(
        applied,
        [
            "AuthorizationPolicy/default/p",
            "HTTPRoute/default/r",
            "ConfigMap/default/c"
        ],
        "TokenReviews are never stored"
    );
    let p = api
        .get(Resource::AuthorizationPolicies, Some("default"), "p")
        .unwrap();
    assert_eq!(p["apiVersion"], "security.istio.io/v1");
    assert_eq!(p["metadata"]["generation"], 1);
    // Applied again through v1beta1 with a change: the same object, a new generation.
    api.apply_yaml("apiVersion: security.istio.io/v1beta1\nkind: AuthorizationPolicy\nmetadata: {name: p}\nspec: {action: ALLOW}\n")
        .unwrap();
    let p2 = api
        .get(Resource::AuthorizationPolicies, Some("default"), "p")
        .unwrap();
    assert_eq!(
        (
            p2["metadata"]["generation"].clone(),
            p2["metadata"]["uid"].clone()
        ),
        (json!(2), p["metadata"]["uid"].clone())
    );
    let created = api
        .create(
            json!({"apiVersion": "security.istio.io/v1beta1", "kind": "RequestAuthentication",
                       "metadata": {"name": "jwt", "namespace": "default"}, "spec": {},
                       "status": {"validationMessages": []}}),
        )
        .unwrap();
    assert_eq!(created["apiVersion"], "security.istio.io/v1beta1");
    assert_eq!(
        created["status"],
        json!({"validationMessages": []}),
        "kept, as a controller wrote it"
    );
    assert!(api
        .create(json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": "t"}}))
        .is_err());
    assert!(api
        .create(json!({"apiVersion": "security.istio.io/v1alpha1", "kind": "AuthorizationPolicy", "metadata": {"name": "x"}}))
        .is_err());
}
