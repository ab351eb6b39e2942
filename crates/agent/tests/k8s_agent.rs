//! The agent in Kubernetes mode against the test API server (root only), in the setting of
//! [`common::k8s`].

mod common;

use ambit_fake_apiserver::{namespace, pod, Resource, ServerOptions, User};
use common::k8s::{get_body, http, until, Env, FakeProxy, AMBIENT, NODE};
use common::{assert_rules_kept, ip, packets, require_root, TestNetns};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn informer_path_label_watch_faults_restart_and_delete() {
    require_root("informer_path_label_watch_faults_restart_and_delete");
    let env = Env::new(ServerOptions::default(), None).await;
    let pod_ns = TestNetns::new();
    ip(&[
        "-n",
        &pod_ns.name,
        "addr",
        "add",
        "10.55.0.5/32",
        "dev",
        "lo",
    ]);
    env.api.create(namespace("shop", &[])).unwrap();
    let uid = env.kubelet_pod("shop", "web", &pod_ns, "10.55.0.5", 4242);

    let agent = env.start().await;
    let mut proxy = FakeProxy::connect(&env.cfg.zds_socket).await;
    assert!(proxy.snapshot().await.is_empty());
    env.wait_ready().await;
    assert_eq!(env.annotation("shop", "web"), None, "not selected yet");

    // Namespace labelled later: the running pod is enrolled.
    env.label_namespace("shop", true);
    assert_eq!(proxy.next().await, (uid.clone(), "add".into()));
    until("annotation enabled", || {
        env.annotation("shop", "web").as_deref() == Some("enabled")
    })
    .await;
    let rules = pod_ns.saved(false);
    assert!(rules.contains("--to-ports 15001"), "{rules}");
    assert!(
        env.probes()
            .contains(&format!("10.55.0.5 comment \"{uid}\"")),
        "{}",
        env.probes()
    );
    let patches = env.patches();
    assert_eq!(patches.len(), 1, "{patches:?}");
    assert_eq!(patches[0].path, "/api/v1/namespaces/shop/pods/web/status");
    assert_eq!(
        patches[0].content_type.as_deref(),
        Some("application/merge-patch+json")
    );
    assert_eq!(
        patches[0].body.as_deref(),
        Some(r#"{"metadata":{"annotations":{"ambient.istio.io/redirection":"enabled"}}}"#)
    );
    let metrics = get_body(env.cfg.metrics_addr, "/metrics").await;
    assert!(
        metrics.contains("nodeagent_reconcile_events_total{type=\"namespace\"}"),
        "{metrics}"
    );

    // Watches cut and the history compacted (410 on resume): the label removal made
    // meanwhile is not lost.
    env.api.faults().compact();
    env.api.faults().drop_watches();
    env.label_namespace("shop", false);
    assert_eq!(proxy.next().await, (uid.clone(), "del".into()));
    until("annotation removed", || {
        env.annotation("shop", "web").is_none()
    })
    .await;
    until("probe entry removed", || env.probes().is_empty()).await;
    let rules = pod_ns.saved(false);
    assert!(!rules.contains("ISTIO"), "{rules}");

    // Labelled again, then the agent restarts: nothing is disturbed.
    env.label_namespace("shop", true);
    assert_eq!(proxy.next().await, (uid.clone(), "add".into()));
    until("annotation enabled again", || {
        env.annotation("shop", "web").as_deref() == Some("enabled")
    })
    .await;
    let rules = counted_rules(&pod_ns, "10.55.0.5:9", false);
    let probes = env.probes();
    drop(proxy);
    agent.stop().await;
    env.api.clear_requests();

    let agent = env.start().await;
    let mut proxy = FakeProxy::connect(&env.cfg.zds_socket).await;
    assert_eq!(
        proxy.snapshot().await,
        vec![uid.clone()],
        "the snapshot carries the pod"
    );
    env.wait_ready().await;
    // Synced: every pod listed is queued; once none is pending, each was reconciled.
    env.settled("update", 0).await;
    assert_rules_kept(&rules, &pod_ns.saved_counted(false), "after the restart");
    assert_eq!(env.probes(), probes);

    // The pod is deleted: it leaves the mesh.
    env.api.delete(Resource::Pods, Some("shop"), "web").unwrap();
    assert_eq!(proxy.next().await, (uid.clone(), "del".into()));
    until("probe entry removed", || env.probes().is_empty()).await;
    assert!(
        env.patches().is_empty(),
        "no annotation churn after the restart: {:?}",
        env.patches()
    );
    agent.stop().await;
    drop(env.dir);
}

const ROLE_WITHOUT_STATUS: &str = "\
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: istio-cni}
rules:
- apiGroups: ['']
  resources: [pods, nodes, namespaces]
  verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: istio-cni}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: istio-cni}
subjects:
- {kind: ServiceAccount, name: istio-cni, namespace: istio-system}
";

const STATUS_RULE: &str = "\
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: istio-cni-status}
rules:
- apiGroups: ['']
  resources: [pods/status]
  verbs: [patch, update]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: istio-cni-status}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: istio-cni-status}
subjects:
- {kind: ServiceAccount, name: istio-cni, namespace: istio-system}
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cmdadd_enrolls_and_a_missing_permission_is_named() {
    require_root("cmdadd_enrolls_and_a_missing_permission_is_named");
    let opts = ServerOptions {
        rbac: true,
        ..Default::default()
    };
    let env = Env::new(opts, Some("cni-token")).await;
    env.api.add_token(
        "cni-token",
        User::service_account("istio-system", "istio-cni"),
    );
    env.api.apply_yaml(ROLE_WITHOUT_STATUS).unwrap();
    env.api.create(namespace("shop", &[AMBIENT])).unwrap();
    let pod_ns = TestNetns::new();
    ip(&[
        "-n",
        &pod_ns.name,
        "addr",
        "add",
        "10.55.1.5/32",
        "dev",
        "lo",
    ]);
    // At CNI ADD time the pod exists but its status has no IP yet.
    let created = env.api.create(pod("shop", "web", NODE)).unwrap();
    let uid = created["metadata"]["uid"].as_str().unwrap().to_owned();

    let agent = env.start().await;
    let mut proxy = FakeProxy::connect(&env.cfg.zds_socket).await;
    assert!(proxy.snapshot().await.is_empty());
    env.wait_ready().await;
    let socket = env.cfg.plugin_socket();

    let call = |body: String| {
        let socket = socket.clone();
        async move {
            let s = tokio::net::UnixStream::connect(&socket).await.unwrap();
            http(s, "POST", "/cmdadd", &body).await
        }
    };
    let (code, body) = call("{".into()).await;
    assert_eq!(code, 400, "{body}");
    let (code, body) = call(r#"{"PodNamespace":"shop"}"#.into()).await;
    assert_eq!(code, 400);
    assert!(body.contains("PodName"), "{body}");

    let request = ambit_cni::istio_api::CmdAddRequest {
        netns: pod_ns.path().display().to_string(),
        pod_name: "web".into(),
        pod_namespace: "shop".into(),
        ips: vec![ambit_cni::istio_api::IpConfig::new(
            "10.55.1.5".parse().unwrap(),
            24,
        )],
    };
    let body = String::from_utf8(request.encode()).unwrap();
    let (code, text) = call(body.clone()).await;
    assert_eq!(code, 500, "{text}");
    assert!(
        text.contains("pods/status") && text.contains("patch") && text.contains("shop/web"),
        "{text}"
    );
    assert_eq!(
        proxy.next().await,
        (uid.clone(), "add".into()),
        "captured before the patch"
    );

    // With the permission granted the same call succeeds.
    env.api.apply_yaml(STATUS_RULE).unwrap();
    let (code, text) = call(body).await;
    assert_eq!(code, 200, "{text}");
    assert_eq!(env.annotation("shop", "web").as_deref(), Some("enabled"));
    assert!(pod_ns.saved(false).contains("--to-ports 15001"));
    let metrics = get_body(env.cfg.metrics_addr, "/metrics").await;
    for line in [
        "istio_cni_plugin_requests_total{response_code=\"400\"} 2",
        "istio_cni_plugin_requests_total{response_code=\"200\"} 1",
    ] {
        assert!(metrics.contains(line), "{line} in {metrics}");
    }
    agent.stop().await;
}

/// Taking over from Istio's agent: a pod already captured (the in-pod rule set, which
/// ambit's rules reproduce byte for byte, is installed before ambit's agent starts) and
/// annotated `enabled`. The agent adopts it: the node proxy gets it in the snapshot, the
/// rules are not touched and the API sees no write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_already_captured_annotated_pod_is_adopted_without_changes() {
    require_root("an_already_captured_annotated_pod_is_adopted_without_changes");
    let env = Env::new(ServerOptions::default(), None).await;
    let pod_ns = TestNetns::new();
    ip(&[
        "-n",
        &pod_ns.name,
        "addr",
        "add",
        "10.55.2.5/32",
        "dev",
        "lo",
    ]);
    env.api.create(namespace("shop", &[AMBIENT])).unwrap();
    let uid = env.kubelet_pod("shop", "web", &pod_ns, "10.55.2.5", 777);
    env.api
        .update(Resource::Pods, Some("shop"), "web", |p| {
            p["metadata"]["annotations"] = json!({"ambient.istio.io/redirection": "enabled"});
        })
        .unwrap();
    // The previous agent's work.
    let opts = ambit_agent::PodRuleOptions {
        dns_capture: true,
        ipv6: true,
        bypass_inbound: false,
    };
    ambit_agent::iptables::apply_inpod(&pod_ns.path(), &opts).unwrap();
    let v4 = counted_rules(&pod_ns, "10.55.2.5:9", false);
    let v6 = counted_rules(&pod_ns, "[::1]:9", true);
    env.api.clear_requests();

    let agent = env.start().await;
    let mut proxy = FakeProxy::connect(&env.cfg.zds_socket).await;
    assert_eq!(proxy.snapshot().await, vec![uid.clone()]);
    env.wait_ready().await;
    assert!(
        env.probes()
            .contains(&format!("10.55.2.5 comment \"{uid}\"")),
        "{}",
        env.probes()
    );

    // A later change to the pod makes the agent reconcile it again, to the end: still
    // nothing to do.
    env.settled("update", 0).await;
    env.api
        .update(Resource::Pods, Some("shop"), "web", |p| {
            p["metadata"]["labels"]["touched"] = json!("yes");
        })
        .unwrap();
    env.settled("update", 1).await;
    assert_rules_kept(&v4, &pod_ns.saved_counted(false), "v4, after the update");
    assert_rules_kept(&v6, &pod_ns.saved_counted(true), "v6, after the update");
    assert!(env.patches().is_empty(), "{:?}", env.patches());
    assert!(
        !env.api.requests().iter().any(|r| r.method != "GET"),
        "only reads"
    );
    agent.stop().await;
}

/// No node proxy yet: the pod is captured (rules in place, traffic fails closed) and
/// annotated `pending`; once a proxy connects the retry takes it to `enabled`. Then the pod
/// completes (a Job) and its terminal status, without IPs, takes it out of the mesh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_without_a_proxy_then_enabled_then_a_completed_pod_is_cleaned_up() {
    require_root("pending_without_a_proxy_then_enabled_then_a_completed_pod_is_cleaned_up");
    let env = Env::new(ServerOptions::default(), None).await;
    let pod_ns = TestNetns::new();
    ip(&[
        "-n",
        &pod_ns.name,
        "addr",
        "add",
        "10.55.3.5/32",
        "dev",
        "lo",
    ]);
    env.api.create(namespace("jobs", &[AMBIENT])).unwrap();
    let uid = env.kubelet_pod("jobs", "task", &pod_ns, "10.55.3.5", 900);

    let agent = env.start().await;
    until("annotation pending", || {
        env.annotation("jobs", "task").as_deref() == Some("pending")
    })
    .await;
    assert!(
        pod_ns.saved(false).contains("--to-ports 15001"),
        "captured while pending"
    );

    let mut proxy = FakeProxy::connect(&env.cfg.zds_socket).await;
    let snapshot = proxy.snapshot().await;
    assert_eq!(snapshot, vec![uid.clone()]);
    until("annotation enabled", || {
        env.annotation("jobs", "task").as_deref() == Some("enabled")
    })
    .await;

    env.api
        .update(Resource::Pods, Some("jobs"), "task", |p| {
            p["status"] = json!({"phase": "Succeeded"});
        })
        .unwrap();
    loop {
        match proxy.next().await {
            (u, k) if u == uid && k == "del" => break,
            (u, k) if u == uid && k == "add" => continue,
            other => panic!("unexpected {other:?}"),
        }
    }
    until("probe entry removed", || env.probes().is_empty()).await;
    agent.stop().await;
}

/// The rules of `netns` (IPv6 ones with `v6`) with their counters, after a connection
/// attempt to `dst` (an address of that family in the pod) went through them: a rule
/// deleted and added again afterwards shows as counters gone back.
fn counted_rules(netns: &TestNetns, dst: &str, v6: bool) -> String {
    netns.poke(dst.parse().unwrap());
    let saved = netns.saved_counted(v6);
    assert!(
        packets(&saved, "-A OUTPUT -j ISTIO_OUTPUT") > 0,
        "no packet counted by the in-pod rules:\n{saved}"
    );
    saved
}
