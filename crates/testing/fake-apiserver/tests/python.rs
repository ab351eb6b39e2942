//! Python's `kubernetes` client (Debian package python3-kubernetes) against the server.

mod common;

use ambit_fake_apiserver::{namespace, pod, ApiServer, Resource, ServerOptions, User};
use serde_json::{json, Value};

/// The Debian python (this machine's `python3` may be a pyenv shim without the package).
const PYTHON: &str = "/usr/bin/python3";

const SCRIPT: &str = r#"
import json, os, sys
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

out = {}
config.load_kube_config(config_file=os.environ["KUBECONFIG"])
v1 = client.CoreV1Api()
out["selected"] = sorted(p.metadata.name for p in v1.list_namespaced_pod("default", label_selector="app=x").items)

events = []
w = watch.Watch()
for ev in w.stream(v1.list_namespaced_pod, "default", timeout_seconds=5):
    events.append([ev["type"], ev["object"].metadata.name])
    if ev["type"] == "ADDED" and ev["object"].metadata.name == "a":
        v1.patch_namespaced_pod("a", "default", {"metadata": {"labels": {"py": "1"}}})
    if ev["type"] == "MODIFIED":
        w.stop()
out["events"] = events

p = v1.patch_namespaced_pod_status("a", "default", {"metadata": {"annotations": {"ambit/seen": "yes"}}, "status": {"phase": "Running"}})
out["status_patch"] = [p.metadata.annotations.get("ambit/seen"), p.status.phase]

limited = config.new_client_from_config(config_file=os.environ["LIMITED_KUBECONFIG"])
try:
    client.CoreV1Api(limited).list_node()
    out["denied"] = None
except ApiException as e:
    out["denied"] = [e.status, json.loads(e.body)["message"]]
print(json.dumps(out))
"#;

fn require_client() {
    assert!(
        std::path::Path::new("/usr/lib/python3/dist-packages/kubernetes/__init__.py").exists(),
        "Python's kubernetes client is not installed: install the Debian package python3-kubernetes (scripts/test does)"
    );
}

/// Runs `script` with `KUBECONFIG` set to an admin kubeconfig; its stdout as JSON.
async fn run(api: &ApiServer, script: &str) -> Value {
    let dir = tempfile::tempdir().unwrap();
    let admin = dir.path().join("admin");
    api.write_kubeconfig(&admin, &api.admin_token()).unwrap();
    let out = tokio::process::Command::new(PYTHON)
        .args(["-c", script])
        .env("KUBECONFIG", &admin)
        .env("HOME", dir.path())
        .output()
        .await
        .expect("running /usr/bin/python3");
    assert!(
        out.status.success(),
        "python failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the script's JSON")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_lists_watches_patches_and_is_denied() {
    require_client();
    let api = ApiServer::start(ServerOptions {
        rbac: true,
        ..Default::default()
    })
    .await
    .unwrap();
    api.create(pod("default", "a", "n1")).unwrap();
    let mut b = pod("default", "b", "n1");
    b["metadata"]["labels"]["app"] = "x".into();
    api.create(b).unwrap();
    api.add_token(
        "limited",
        User::service_account("istio-system", "istio-cni"),
    );
    let dir = tempfile::tempdir().unwrap();
    let admin = dir.path().join("admin");
    let limited = dir.path().join("limited");
    api.write_kubeconfig(&admin, &api.admin_token()).unwrap();
    api.write_kubeconfig(&limited, "limited").unwrap();
    let out = tokio::process::Command::new(PYTHON)
        .args(["-c", SCRIPT])
        .env("KUBECONFIG", &admin)
        .env("LIMITED_KUBECONFIG", &limited)
        .env("HOME", dir.path())
        .output()
        .await
        .expect("running /usr/bin/python3");
    assert!(
        out.status.success(),
        "python failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("the script's JSON");
    assert_eq!(v["selected"], serde_json::json!(["b"]));
    let events = v["events"].as_array().unwrap();
    assert!(
        events.contains(&serde_json::json!(["ADDED", "a"])),
        "{events:?}"
    );
    assert!(
        events.contains(&serde_json::json!(["ADDED", "b"])),
        "{events:?}"
    );
    assert_eq!(
        events.last().unwrap(),
        &serde_json::json!(["MODIFIED", "a"])
    );
    assert_eq!(v["status_patch"], serde_json::json!(["yes", "Running"]));
    let stored = api.get(Resource::Pods, Some("default"), "a").unwrap();
    assert_eq!(stored["metadata"]["labels"]["py"], "1");
    assert_eq!(stored["status"]["phase"], "Running");
    assert_eq!(v["denied"][0], 403);
    assert_eq!(
        v["denied"][1],
        "nodes is forbidden: User \"system:serviceaccount:istio-system:istio-cni\" cannot list resource \"nodes\" in API group \"\" at the cluster scope"
    );
    // A dict body goes out as a strategic merge patch, which the server applies as a merge.
    let status_patch = api
        .requests()
        .into_iter()
        .find(|r| r.method == "PATCH" && r.path.ends_with("/a/status"))
        .unwrap();
    assert_eq!(
        status_patch.content_type.as_deref(),
        Some("application/strategic-merge-patch+json")
    );
}

const CUSTOM_SCRIPT: &str = r#"
import json, os
from kubernetes import client, config
from kubernetes.client.rest import ApiException

out = {}
config.load_kube_config(config_file=os.environ["KUBECONFIG"])
co = client.CustomObjectsApi()
gw = ("gateway.networking.k8s.io", "v1")
routes = co.list_namespaced_custom_object(*gw, "default", "httproutes")
out["routes"] = [routes["apiVersion"], routes["kind"]] + [
    [r["apiVersion"], r["kind"], r["metadata"]["name"]] for r in routes["items"]]
picked = co.list_cluster_custom_object(*gw, "httproutes", field_selector="metadata.namespace=shop")
out["picked"] = [r["metadata"]["name"] for r in picked["items"]]
out["class"] = co.get_cluster_custom_object(*gw, "gatewayclasses", "istio")["spec"]["controllerName"]

sec = "security.istio.io"
body = {"apiVersion": "security.istio.io/v1beta1", "kind": "RequestAuthentication",
        "metadata": {"name": "jwt"}, "spec": {"jwtRules": [{"issuer": "https://issuer.example"}]}}
out["created"] = co.create_namespaced_custom_object(sec, "v1beta1", "default", "requestauthentications", body)["apiVersion"]
out["read"] = co.get_namespaced_custom_object(sec, "v1", "default", "requestauthentications", "jwt")["apiVersion"]
try:
    co.create_namespaced_custom_object(sec, "v1", "default", "requestauthentications", dict(body, metadata={"name": "jwt2"}))
    out["mismatch"] = None
except ApiException as e:
    out["mismatch"] = [e.status, json.loads(e.body)["message"]]

spec = client.V1TokenReviewSpec(token="pod-token", audiences=["istio-ca"])
review = client.AuthenticationV1Api().create_token_review(client.V1TokenReview(spec=spec))
out["review"] = [review.status.authenticated, review.status.user.username, review.status.audiences]
cm = client.V1ConfigMap(metadata=client.V1ObjectMeta(name="py"), data={"k": "v"})
out["configmap"] = client.CoreV1Api().create_namespaced_config_map("default", cm).data
print(json.dumps(out))
"#;

fn route(ns: &str, name: &str) -> Value {
    json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
           "metadata": {"name": name, "namespace": ns},
           "spec": {"parentRefs": [{"name": "waypoint"}], "rules": [{}]}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_custom_objects_token_reviews_and_config_maps() {
    require_client();
    let api = ApiServer::start(ServerOptions::default()).await.unwrap();
    api.create(namespace("shop", &[])).unwrap();
    for (ns, name) in [("default", "a"), ("default", "b"), ("shop", "c")] {
        api.create(route(ns, name)).unwrap();
    }
    api.create(
        json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass",
        "metadata": {"name": "istio"}, "spec": {"controllerName": "istio.io/gateway-controller"}}),
    )
    .unwrap();
    api.add_token_with_audiences(
        "pod-token",
        User::service_account("shop", "web"),
        &["istio-ca"],
    );
    let v = run(&api, CUSTOM_SCRIPT).await;
    let gv = "gateway.networking.k8s.io/v1";
    assert_eq!(
        v["routes"],
        json!([
            gv,
            "HTTPRouteList",
            [gv, "HTTPRoute", "a"],
            [gv, "HTTPRoute", "b"]
        ])
    );
    assert_eq!(v["picked"], json!(["c"]));
    assert_eq!(v["class"], "istio.io/gateway-controller");
    assert_eq!(v["created"], "security.istio.io/v1beta1");
    assert_eq!(v["read"], "security.istio.io/v1");
    assert_eq!(
        v["mismatch"],
        json!([400, "the API version in the data (security.istio.io/v1beta1) does not match the expected API version (security.istio.io/v1)"])
    );
    assert!(api
        .get(Resource::RequestAuthentications, Some("default"), "jwt2")
        .is_none());
    assert_eq!(
        v["review"],
        json!([true, "system:serviceaccount:shop:web", ["istio-ca"]])
    );
    assert_eq!(v["configmap"], json!({"k": "v"}));
    assert_eq!(
        api.get(Resource::ConfigMaps, Some("default"), "py")
            .unwrap()["data"],
        json!({"k": "v"})
    );
}
