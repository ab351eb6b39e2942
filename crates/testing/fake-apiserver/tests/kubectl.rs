//! kubectl (Debian package kubernetes-client) against the server, through a kubeconfig
//! the server wrote.

mod common;

use std::path::PathBuf;
use std::process::Stdio;

use ambit_fake_apiserver::{namespace, pod, ApiServer, Resource, ServerOptions, User};
use common::require_tool;
use serde_json::json;
use serde_json::Value;
use tokio::io::AsyncReadExt;

struct Kubectl {
    dir: tempfile::TempDir,
    config: PathBuf,
}

impl Kubectl {
    fn new(api: &ApiServer, token: &str) -> Kubectl {
        require_tool("kubectl", "kubernetes-client");
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("kubeconfig");
        api.write_kubeconfig(&config, token).unwrap();
        Kubectl { dir, config }
    }

    fn command(&self, args: &[&str]) -> tokio::process::Command {
        let mut c = tokio::process::Command::new("kubectl");
        c.args(args)
            .env("KUBECONFIG", &self.config)
            .env("HOME", self.dir.path())
            .stdin(Stdio::null())
            .kill_on_drop(true);
        c
    }

    /// Runs kubectl; returns (success, stdout, stderr).
    async fn run(&self, args: &[&str]) -> (bool, String, String) {
        let out = self.command(args).output().await.expect("running kubectl");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    async fn ok(&self, args: &[&str]) -> String {
        let (ok, out, err) = self.run(args).await;
        assert!(ok, "kubectl {args:?} failed: {err}");
        out
    }

    async fn json(&self, args: &[&str]) -> Value {
        let out = self.ok(args).await;
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("kubectl {args:?}: {e}: {out}"))
    }
}

fn names(list: &Value) -> Vec<String> {
    let mut n: Vec<String> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    n.sort();
    n
}

fn label(api: &ApiServer, r: Resource, ns: Option<&str>, name: &str, key: &str) -> Option<String> {
    api.get(r, ns, name)?
        .pointer(&format!("/metadata/labels/{key}"))
        .and_then(Value::as_str)
        .map(str::to_string)
}

async fn setup() -> ApiServer {
    let api = ApiServer::start(ServerOptions {
        rbac: true,
        ..Default::default()
    })
    .await
    .unwrap();
    api.create(namespace("team", &[("tier", "web")])).unwrap();
    for (ns, name, node, app) in [
        ("default", "a", "n1", "x"),
        ("default", "b", "n2", "x"),
        ("team", "c", "n1", "x"),
        ("default", "d", "n1", "y"),
    ] {
        let mut p = pod(ns, name, node);
        p["metadata"]["labels"]["app"] = app.into();
        api.create(p).unwrap();
    }
    api
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_reads_lists_and_selects() {
    let api = setup().await;
    let k = Kubectl::new(&api, &api.admin_token());
    let all = k.json(&["get", "pods", "-A", "-o", "json"]).await;
    assert_eq!(names(&all), ["a", "b", "c", "d"]);
    let ns = k.ok(&["get", "ns"]).await;
    // Human output comes from the server's Tables, with Kubernetes' columns.
    let first = |out: &str, n: usize| -> Vec<Vec<String>> {
        out.lines()
            .take(n)
            .map(|l| l.split_whitespace().map(str::to_string).collect())
            .collect()
    };
    let ns_rows = first(&ns, 2);
    assert_eq!(ns_rows[0], ["NAME", "STATUS", "AGE"]);
    assert_eq!(ns_rows[1][..2], ["default", "Active"]);
    let pods = k.ok(&["get", "pods", "-o", "wide"]).await;
    let rows = first(&pods, 2);
    assert_eq!(
        rows[0],
        [
            "NAME",
            "READY",
            "STATUS",
            "RESTARTS",
            "AGE",
            "IP",
            "NODE",
            "NOMINATED",
            "NODE",
            "READINESS",
            "GATES"
        ]
    );
    assert_eq!(rows[1][..4], ["a", "0/1", "Pending", "0"]);
    assert_eq!(rows[1][5..], ["<none>", "n1", "<none>", "<none>"]);
    for n in ["default", "kube-system", "team"] {
        assert!(ns.contains(n), "{ns}");
    }
    let ns = k
        .ok(&["get", "namespaces", "-l", "tier=web", "-o", "name"])
        .await;
    assert_eq!(ns.trim(), "namespace/team");
    let sel = k
        .json(&[
            "get",
            "pods",
            "-l",
            "app=x",
            "--field-selector",
            "spec.nodeName=n1",
            "-o",
            "json",
        ])
        .await;
    assert_eq!(names(&sel), ["a"]);
    let sel = k
        .json(&[
            "get",
            "po",
            "-A",
            "-l",
            "app in (x),app!=y",
            "--field-selector",
            "spec.nodeName=n1",
            "-o",
            "json",
        ])
        .await;
    assert_eq!(names(&sel), ["a", "c"]);
    let (ok, _, err) = k
        .run(&["get", "pods", "--field-selector", "spec.bogus=1"])
        .await;
    assert!(!ok);
    assert!(
        err.contains("field label not supported: spec.bogus"),
        "{err}"
    );
    let (ok, _, err) = k.run(&["get", "pod", "nope"]).await;
    assert!(!ok);
    assert!(err.contains("pods \"nope\" not found"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_pages_with_chunk_size() {
    let api = setup().await;
    api.create(pod("default", "e", "n2")).unwrap();
    api.create(pod("default", "f", "n2")).unwrap();
    let k = Kubectl::new(&api, &api.admin_token());
    api.clear_requests();
    let list = k
        .json(&["get", "pods", "--chunk-size=2", "-o", "json"])
        .await;
    assert_eq!(names(&list), ["a", "b", "d", "e", "f"]);
    let pages: Vec<String> = api
        .requests()
        .into_iter()
        .filter(|r| r.path.starts_with("/api/v1/namespaces/default/pods?"))
        .map(|r| r.path)
        .collect();
    assert_eq!(pages.len(), 3, "{pages:?}");
    assert!(pages.iter().all(|p| p.contains("limit=2")), "{pages:?}");
    assert!(
        pages[1..].iter().all(|p| p.contains("continue=")),
        "{pages:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_writes() {
    let api = setup().await;
    let k = Kubectl::new(&api, &api.admin_token());
    k.ok(&["label", "ns", "team", "istio.io/dataplane-mode=ambient"])
        .await;
    assert_eq!(
        label(
            &api,
            Resource::Namespaces,
            None,
            "team",
            "istio.io~1dataplane-mode"
        )
        .as_deref(),
        Some("ambient")
    );
    k.ok(&["annotate", "pod", "a", "note=hi"]).await;
    let a = api.get(Resource::Pods, Some("default"), "a").unwrap();
    assert_eq!(a["metadata"]["annotations"]["note"], "hi");
    k.ok(&[
        "patch",
        "pod",
        "a",
        "--type",
        "merge",
        "-p",
        r#"{"metadata":{"labels":{"m":"1"}}}"#,
    ])
    .await;
    assert_eq!(
        label(&api, Resource::Pods, Some("default"), "a", "m").as_deref(),
        Some("1")
    );
    k.ok(&[
        "patch",
        "pod",
        "a",
        "--type",
        "json",
        "-p",
        r#"[{"op":"add","path":"/metadata/labels/j","value":"2"}]"#,
    ])
    .await;
    assert_eq!(
        label(&api, Resource::Pods, Some("default"), "a", "j").as_deref(),
        Some("2")
    );
    // kubectl's default patch type is strategic merge.
    k.ok(&[
        "patch",
        "pod",
        "a",
        "-p",
        r#"{"metadata":{"labels":{"s":"3"}}}"#,
    ])
    .await;
    assert_eq!(
        label(&api, Resource::Pods, Some("default"), "a", "s").as_deref(),
        Some("3")
    );
    let types: Vec<Option<String>> = api
        .requests()
        .into_iter()
        .filter(|r| r.method == "PATCH")
        .map(|r| r.content_type)
        .collect();
    assert!(
        types.contains(&Some("application/merge-patch+json".into())),
        "{types:?}"
    );
    assert!(
        types.contains(&Some("application/json-patch+json".into())),
        "{types:?}"
    );
    assert!(
        types.contains(&Some("application/strategic-merge-patch+json".into())),
        "{types:?}"
    );
    // A status change through the main resource is dropped, as Kubernetes does.
    k.ok(&[
        "patch",
        "pod",
        "a",
        "--type",
        "merge",
        "-p",
        r#"{"status":{"phase":"Failed"}}"#,
    ])
    .await;
    assert_eq!(
        api.get(Resource::Pods, Some("default"), "a").unwrap()["status"]["phase"],
        "Pending"
    );
    // create and (client-side) apply of files; no OpenAPI, so no client-side validation.
    let file = k.dir.path().join("objects.yaml");
    std::fs::write(&file, "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: applied\n---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  namespace: applied\n  labels: {app: web}\nspec:\n  containers: [{name: c, image: img}]\n").unwrap();
    let file = file.to_str().unwrap();
    k.ok(&["create", "--validate=false", "-f", file]).await;
    let (ok, _, err) = k.run(&["create", "--validate=false", "-f", file]).await;
    assert!(!ok && err.contains("already exists"), "{err}");
    k.ok(&["apply", "--validate=false", "-f", file]).await;
    std::fs::write(
        file,
        std::fs::read_to_string(file)
            .unwrap()
            .replace("app: web", "app: web2"),
    )
    .unwrap();
    k.ok(&["apply", "--validate=false", "-f", file]).await;
    assert_eq!(
        label(&api, Resource::Pods, Some("applied"), "web", "app").as_deref(),
        Some("web2")
    );
    k.ok(&["delete", "pod", "a"]).await;
    assert!(api.get(Resource::Pods, Some("default"), "a").is_none());
    let (ok, _, err) = k.run(&["delete", "pod", "a"]).await;
    assert!(!ok && err.contains("pods \"a\" not found"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_watch_sees_a_change() {
    let api = setup().await;
    let k = Kubectl::new(&api, &api.admin_token());
    let mut child = k
        .command(&["get", "pods", "--watch", "-o", "json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut buf = Vec::new();
    let mut changed = false;
    let seen = tokio::time::timeout(std::time::Duration::from_secs(30), async {
        loop {
            let mut chunk = [0u8; 8192];
            let n = stdout.read(&mut chunk).await.unwrap();
            assert!(n > 0, "kubectl exited: {}", String::from_utf8_lossy(&buf));
            buf.extend_from_slice(&chunk[..n]);
            let objects: Vec<Value> = serde_json::Deserializer::from_slice(&buf)
                .into_iter::<Value>()
                .filter_map(Result::ok)
                .collect();
            if objects.len() >= 3 && !changed {
                // The listed pods are out: once the watch is open, change one.
                common::eventually("kubectl's watch", || api.open_watches() == 1).await;
                api.update(Resource::Pods, Some("default"), "b", |p| {
                    p["metadata"]["labels"]["seen"] = "yes".into()
                })
                .unwrap();
                changed = true;
            }
            if objects
                .iter()
                .any(|o| o["metadata"]["labels"]["seen"] == "yes")
            {
                return objects;
            }
        }
    })
    .await;
    let Ok(seen) = seen else {
        child.kill().await.ok();
        let mut err = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .await
            .ok();
        panic!(
            "kubectl --watch did not print the change: {err}; requests: {:#?}",
            api.requests()
        );
    };
    let listed: Vec<&str> = seen[..3]
        .iter()
        .map(|o| o["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(listed, ["a", "b", "d"]);
    assert_eq!(seen.last().unwrap()["metadata"]["name"], "b");
    child.kill().await.ok();
    let watches = api
        .requests()
        .into_iter()
        .filter(|r| r.path.contains("watch=true"))
        .count();
    assert!(watches >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_shows_rbac_denials() {
    let api = setup().await;
    api.add_token(
        "limited",
        User::service_account("istio-system", "istio-cni"),
    );
    let k = Kubectl::new(&api, "limited");
    let (ok, _, err) = k.run(&["get", "pods"]).await;
    assert!(!ok);
    assert!(
        err.contains("pods is forbidden: User \"system:serviceaccount:istio-system:istio-cni\" cannot list resource \"pods\" in API group \"\" in the namespace \"default\""),
        "{err}"
    );
    let (ok, _, err) = k.run(&["get", "nodes"]).await;
    assert!(!ok);
    assert!(
        err.contains("cannot list resource \"nodes\" in API group \"\" at the cluster scope"),
        "{err}"
    );
    let k = Kubectl::new(&api, "wrong-token");
    let (ok, _, err) = k.run(&["get", "pods"]).await;
    assert!(!ok);
    assert!(err.contains("You must be logged in to the server"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_human_watch_prints_table_rows() {
    let api = setup().await;
    let k = Kubectl::new(&api, &api.admin_token());
    let mut child = k
        .command(&["get", "pods", "--watch"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut text = String::new();
    let mut changed = false;
    let done = tokio::time::timeout(std::time::Duration::from_secs(30), async {
        loop {
            let mut chunk = [0u8; 8192];
            let n = stdout.read(&mut chunk).await.unwrap();
            assert!(n > 0, "kubectl exited: {text}");
            text.push_str(&String::from_utf8_lossy(&chunk[..n]));
            let rows: Vec<Vec<&str>> = text
                .lines()
                .map(|l| l.split_whitespace().collect())
                .collect();
            if rows.len() >= 4 && !changed {
                common::eventually("kubectl's watch", || api.open_watches() == 1).await;
                api.update(Resource::Pods, Some("default"), "b", |p| {
                    p["status"]["phase"] = "Running".into()
                })
                .unwrap();
                changed = true;
            }
            if rows
                .iter()
                .any(|r| r.len() > 2 && r[0] == "b" && r[2] == "Running")
            {
                return rows
                    .iter()
                    .map(|r| r.iter().map(|c| c.to_string()).collect::<Vec<_>>())
                    .collect::<Vec<_>>();
            }
        }
    })
    .await;
    child.kill().await.ok();
    let rows = done.unwrap_or_else(|_| panic!("kubectl --watch printed no update: {text}"));
    assert_eq!(rows[0], ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]);
    assert_eq!(rows[1][..3], ["a", "0/1", "Pending"]);
}

/// The first `n` lines of kubectl's human output, split into cells.
fn rows(out: &str, n: usize) -> Vec<Vec<String>> {
    out.lines()
        .take(n)
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect()
}

const POLICY_V1BETA1: &str = "apiVersion: security.istio.io/v1beta1
kind: AuthorizationPolicy
metadata:
  name: deny-all
  namespace: default
spec:
  action: DENY
  rules: [{}]
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_applies_a_v1beta1_policy_and_reads_it_as_v1() {
    let api = setup().await;
    let k = Kubectl::new(&api, &api.admin_token());
    let file = k.dir.path().join("policy.yaml");
    std::fs::write(&file, POLICY_V1BETA1).unwrap();
    let file = file.to_str().unwrap();
    let out = k.ok(&["apply", "--validate=false", "-f", file]).await;
    assert_eq!(
        out.trim(),
        "authorizationpolicy.security.istio.io/deny-all created"
    );
    let create = api
        .requests()
        .into_iter()
        .find(|r| r.method == "POST" && r.path.contains("authorizationpolicies"))
        .unwrap();
    assert!(
        create.path.starts_with(
            "/apis/security.istio.io/v1beta1/namespaces/default/authorizationpolicies"
        ),
        "{}",
        create.path
    );
    let yaml = k
        .ok(&[
            "get",
            "authorizationpolicies.v1.security.istio.io",
            "deny-all",
            "-o",
            "yaml",
        ])
        .await;
    let v1: serde_json::Value = yaml_serde::from_str(&yaml).unwrap();
    assert_eq!(v1["apiVersion"], "security.istio.io/v1", "{yaml}");
    assert_eq!(v1["kind"], "AuthorizationPolicy");
    assert_eq!(v1["spec"], json!({"action": "DENY", "rules": [{}]}));
    assert_eq!(v1["metadata"]["generation"], 1);
    let beta = k
        .json(&[
            "get",
            "authorizationpolicies.v1beta1.security.istio.io",
            "deny-all",
            "-o",
            "json",
        ])
        .await;
    assert_eq!(beta["apiVersion"], "security.istio.io/v1beta1");
    assert_eq!(beta["metadata"]["uid"], v1["metadata"]["uid"], "one object");
    // Applying a change: kubectl patches the v1beta1 object; the generation counts it.
    std::fs::write(file, POLICY_V1BETA1.replace("DENY", "ALLOW")).unwrap();
    let out = k.ok(&["apply", "--validate=false", "-f", file]).await;
    assert_eq!(
        out.trim(),
        "authorizationpolicy.security.istio.io/deny-all configured"
    );
    let stored = api
        .get(Resource::AuthorizationPolicies, Some("default"), "deny-all")
        .unwrap();
    assert_eq!(stored["apiVersion"], "security.istio.io/v1");
    assert_eq!(stored["spec"]["action"], "ALLOW");
    assert_eq!(stored["metadata"]["generation"], 2);
    // The short name, the preferred version, and a CRD's default columns.
    let out = k.ok(&["get", "ap"]).await;
    let r = rows(&out, 2);
    assert_eq!(r[0], ["NAME", "AGE"]);
    assert_eq!(r[1][0], "deny-all");
    let out = k.ok(&["get", "ap", "deny-all", "-o", "name"]).await;
    assert_eq!(out.trim(), "authorizationpolicy.security.istio.io/deny-all");
    k.ok(&["delete", "-f", file]).await;
    assert!(api
        .get(Resource::AuthorizationPolicies, Some("default"), "deny-all")
        .is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_gateways_config_maps_events_and_token_reviews() {
    let api = setup().await;
    api.create(json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass",
        "metadata": {"name": "istio-waypoint"}, "spec": {"controllerName": "istio.io/mesh-controller"}}))
        .unwrap();
    for (ns, name) in [("default", "waypoint"), ("team", "ingress")] {
        api.create(
            json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"gatewayClassName": "istio-waypoint",
                     "listeners": [{"name": "mesh", "port": 15008, "protocol": "HBONE"}]}}),
        )
        .unwrap();
    }
    let k = Kubectl::new(&api, &api.admin_token());
    let out = k.ok(&["get", "gtw"]).await;
    let r = rows(&out, 3);
    assert_eq!(r[0], ["NAME", "AGE"]);
    assert_eq!(r[1][0], "waypoint");
    assert_eq!(r.len(), 2, "one namespace: {out}");
    let out = k.ok(&["get", "gtw", "-A"]).await;
    assert_eq!(rows(&out, 1)[0], ["NAMESPACE", "NAME", "AGE"]);
    assert!(out.contains("ingress"), "{out}");
    let out = k.ok(&["get", "gc"]).await;
    assert_eq!(rows(&out, 2)[1][0], "istio-waypoint");
    let gw = k
        .json(&[
            "get",
            "gateways.gateway.networking.k8s.io",
            "-A",
            "--field-selector",
            "metadata.name=ingress",
            "-o",
            "json",
        ])
        .await;
    assert_eq!(names(&gw), ["ingress"]);
    assert_eq!(gw["items"][0]["apiVersion"], "gateway.networking.k8s.io/v1");

    // Config maps: kubectl's own create, and its columns.
    let out = k
        .ok(&[
            "create",
            "configmap",
            "settings",
            "--from-literal=mode=ambient",
            "--from-literal=log=info",
        ])
        .await;
    assert_eq!(out.trim(), "configmap/settings created");
    // kubectl's generators send protobuf.
    let create = api
        .requests()
        .into_iter()
        .find(|r| r.method == "POST" && r.path.starts_with("/api/v1/namespaces/default/configmaps"))
        .unwrap();
    assert_eq!(
        create.content_type.as_deref(),
        Some("application/vnd.kubernetes.protobuf")
    );
    let out = k.ok(&["create", "namespace", "made-by-kubectl"]).await;
    assert_eq!(out.trim(), "namespace/made-by-kubectl created");
    let ns = api
        .get(Resource::Namespaces, None, "made-by-kubectl")
        .unwrap();
    assert_eq!(ns["status"]["phase"], "Active");
    let cm = api
        .get(Resource::ConfigMaps, Some("default"), "settings")
        .unwrap();
    assert_eq!(cm["data"], json!({"mode": "ambient", "log": "info"}));
    let out = k.ok(&["get", "cm", "settings"]).await;
    let r = rows(&out, 2);
    assert_eq!(r[0], ["NAME", "DATA", "AGE"]);
    assert_eq!(r[1][..2], ["settings", "2"]);

    // Events about a pod, selected by their fields, with kubectl's columns.
    for (name, pod_name, reason) in [("a.1", "a", "Scheduled"), ("b.1", "b", "Pulled")] {
        api.create(json!({"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": name, "namespace": "default"},
            "involvedObject": {"kind": "Pod", "name": pod_name, "namespace": "default"},
            "reason": reason, "type": "Normal", "message": format!("{reason} {pod_name}"),
            "source": {"component": "kubelet"}}))
            .unwrap();
    }
    let out = k
        .ok(&["get", "ev", "--field-selector", "involvedObject.name=b"])
        .await;
    let r = rows(&out, 3);
    assert_eq!(
        r[0],
        ["LAST", "SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]
    );
    assert_eq!(r[1][1..], ["Normal", "Pulled", "pod/b", "Pulled", "b"]);
    assert_eq!(r.len(), 2, "{out}");

    // TokenReviews can only be created.
    let (ok, _, err) = k.run(&["get", "tokenreviews"]).await;
    assert!(!ok);
    assert!(
        err.contains(
            "(MethodNotAllowed): the server does not allow this method on the requested resource"
        ),
        "{err}"
    );
}
