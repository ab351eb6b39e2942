//! The wire as a raw client sees it: Status bodies, authentication, limits, faults and
//! watch streams (bookmarks, timeouts, 410 expiry, cut connections).

mod common;

use std::time::Duration;

use ambit_fake_apiserver::{pod, ApiServer, Resource, ServerOptions, User};
use common::{eventually, raw};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_kubernetes_status_objects() {
    let api = ApiServer::start(ServerOptions::default()).await.unwrap();
    let admin = api.admin_token();
    let t = Some(admin.as_str());
    let r = raw(
        &api,
        "GET",
        "/api/v1/namespaces/default/pods/x",
        t,
        None,
        b"",
    )
    .await;
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["message"], "pods \"x\" not found");
    assert_eq!(r.json()["kind"], "Status");
    let r = raw(&api, "GET", "/api/v1/pods", None, None, b"").await;
    assert_eq!(
        (r.status, r.json()["reason"].as_str().unwrap()),
        (401, "Unauthorized")
    );
    let r = raw(&api, "GET", "/api/v1/pods", Some("nope"), None, b"").await;
    assert_eq!(r.status, 401);
    assert_eq!(
        raw(&api, "GET", "/healthz", None, None, b"").await.status,
        200
    );
    assert_eq!(
        raw(&api, "GET", "/apis/batch/v1", t, None, b"")
            .await
            .status,
        404
    );
    let big = vec![b' '; 3 * 1024 * 1024 + 1];
    let r = raw(
        &api,
        "POST",
        "/api/v1/namespaces/default/pods",
        t,
        Some("application/json"),
        &big,
    )
    .await;
    assert_eq!(r.status, 413);
    let body = pod("default", "p", "n1").to_string();
    let r = raw(
        &api,
        "POST",
        "/api/v1/namespaces/default/pods",
        t,
        Some("application/json"),
        body.as_bytes(),
    )
    .await;
    assert_eq!(r.status, 201);
    assert_eq!(r.json()["status"]["phase"], "Pending");
    let r = raw(
        &api,
        "POST",
        "/api/v1/namespaces/default/pods",
        t,
        Some("application/json"),
        body.as_bytes(),
    )
    .await;
    assert_eq!(
        (r.status, r.json()["reason"].as_str().unwrap()),
        (409, "AlreadyExists")
    );
    let r = raw(
        &api,
        "PATCH",
        "/api/v1/namespaces/default/pods/p",
        t,
        Some("application/apply-patch+yaml"),
        b"{}",
    )
    .await;
    assert_eq!(
        (r.status, r.json()["reason"].as_str().unwrap()),
        (415, "UnsupportedMediaType")
    );
    // Injected faults, matched by method and path.
    api.faults().fail_next(1, 429, Some("GET"), Some("/pods"));
    api.faults().fail_next(1, 500, None, None);
    let r = raw(&api, "GET", "/api/v1/pods", t, None, b"").await;
    assert_eq!(
        (r.status, r.header("retry-after").as_deref()),
        (429, Some("1"))
    );
    assert_eq!(r.json()["reason"], "TooManyRequests");
    let r = raw(&api, "GET", "/api/v1/nodes", t, None, b"").await;
    assert_eq!(
        (r.status, r.json()["reason"].as_str().unwrap()),
        (500, "InternalError")
    );
    assert_eq!(
        raw(&api, "GET", "/api/v1/nodes", t, None, b"").await.status,
        200
    );
    // The request log.
    let log = api.requests();
    let patch = log.iter().find(|r| r.method == "PATCH").unwrap();
    assert_eq!(
        patch.content_type.as_deref(),
        Some("application/apply-patch+yaml")
    );
    assert_eq!((patch.status, patch.body.as_deref()), (415, Some("{}")));
    assert_eq!(patch.user.as_deref(), Some("admin"));
    api.clear_requests();
    assert!(api.requests().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rbac_forbids_in_kubernetes_words() {
    let api = ApiServer::start(ServerOptions {
        rbac: true,
        ..Default::default()
    })
    .await
    .unwrap();
    api.create(pod("default", "x", "n1")).unwrap();
    api.apply_yaml(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: cni\nrules:\n- apiGroups: [\"\"]\n  resources: [pods]\n  verbs: [get, list, watch]\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata:\n  name: cni\nroleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: ClusterRole\n  name: cni\nsubjects:\n- kind: ServiceAccount\n  name: istio-cni\n  namespace: istio-system\n---\n\
         apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: skipped\n",
    )
    .unwrap();
    api.add_token("cni", User::service_account("istio-system", "istio-cni"));
    let t = Some("cni");
    assert_eq!(
        raw(&api, "GET", "/api/v1/pods", t, None, b"").await.status,
        200
    );
    let r = raw(
        &api,
        "PATCH",
        "/api/v1/namespaces/default/pods/x/status",
        t,
        Some("application/merge-patch+json"),
        b"{}",
    )
    .await;
    assert_eq!(r.status, 403);
    assert_eq!(
        r.json()["message"],
        "pods \"x\" is forbidden: User \"system:serviceaccount:istio-system:istio-cni\" cannot patch resource \"pods/status\" in API group \"\" in the namespace \"default\""
    );
    let r = raw(&api, "GET", "/api/v1/nodes", t, None, b"").await;
    assert_eq!(
        r.json()["message"],
        "nodes is forbidden: User \"system:serviceaccount:istio-system:istio-cni\" cannot list resource \"nodes\" in API group \"\" at the cluster scope"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_stream_resume_expire_and_end() {
    let opts = ServerOptions {
        bookmark_interval: Duration::from_millis(50),
        history: 4,
        ..Default::default()
    };
    let api = ApiServer::start(opts).await.unwrap();
    let admin = api.admin_token();
    let t = Some(admin.as_str());
    api.create(pod("default", "a", "n1")).unwrap();
    let rv = api.resource_version();
    api.create(pod("default", "b", "n2")).unwrap();
    api.update(Resource::Pods, Some("default"), "a", |p| {
        p["status"]["phase"] = json!("Running")
    })
    .unwrap();
    // From a version: only later events, then a clean end at timeoutSeconds.
    let r = raw(
        &api,
        "GET",
        &format!("/api/v1/namespaces/default/pods?watch=1&resourceVersion={rv}&timeoutSeconds=1"),
        t,
        None,
        b"",
    )
    .await;
    assert_eq!(r.status, 200);
    assert!(r.complete, "a timed-out watch ends with the last chunk");
    let ev = r.lines();
    assert_eq!(ev.len(), 2);
    assert_eq!(
        (
            ev[0]["type"].as_str().unwrap(),
            ev[0]["object"]["metadata"]["name"].as_str().unwrap()
        ),
        ("ADDED", "b")
    );
    assert_eq!(ev[1]["type"], "MODIFIED");
    assert_eq!(ev[1]["object"]["kind"], "Pod");
    // Without a version: the current objects as ADDED; selectors apply; bookmarks come.
    let r = raw(
        &api,
        "GET",
        "/api/v1/pods?watch=true&labelSelector=app%3Da&allowWatchBookmarks=true&timeoutSeconds=1",
        t,
        None,
        b"",
    )
    .await;
    let ev = r.lines();
    assert_eq!(ev[0]["type"], "ADDED");
    assert_eq!(ev[0]["object"]["metadata"]["name"], "a");
    let bm = ev
        .iter()
        .find(|e| e["type"] == "BOOKMARK")
        .expect("a bookmark");
    assert_eq!(
        bm["object"],
        json!({"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": api.resource_version().to_string()}})
    );
    assert!(ev
        .iter()
        .all(|e| e["type"] != "ADDED" || e["object"]["metadata"]["name"] == "a"));
    // Older than the history: 200, one ERROR event with a 410 Status, and the end.
    for n in ["c", "d", "e"] {
        api.create(pod("default", n, "n1")).unwrap();
    }
    let r = raw(
        &api,
        "GET",
        &format!("/api/v1/pods?watch=1&resourceVersion={rv}"),
        t,
        None,
        b"",
    )
    .await;
    assert_eq!(r.status, 200);
    let ev = r.lines();
    assert_eq!(ev.len(), 1);
    assert_eq!(ev[0]["type"], "ERROR");
    assert_eq!(ev[0]["object"]["code"], 410);
    assert_eq!(ev[0]["object"]["reason"], "Expired");
    assert!(ev[0]["object"]["message"]
        .as_str()
        .unwrap()
        .starts_with(&format!("too old resource version: {rv} (")));
    let r = raw(
        &api,
        "GET",
        &format!("/api/v1/pods?resourceVersion={rv}&resourceVersionMatch=Exact"),
        t,
        None,
        b"",
    )
    .await;
    assert_eq!(r.status, 410);
    assert_eq!(
        raw(
            &api,
            "GET",
            &format!("/api/v1/pods?resourceVersion={rv}"),
            t,
            None,
            b""
        )
        .await
        .status,
        200
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_watches_are_cut_mid_stream() {
    let api = ApiServer::start(ServerOptions::default()).await.unwrap();
    api.create(pod("default", "a", "n1")).unwrap();
    let admin = api.admin_token();
    let watch = {
        let api_url = "/api/v1/pods?watch=1".to_string();
        let admin = admin.clone();
        let api = &api;
        async move { raw(api, "GET", &api_url, Some(&admin), None, b"").await }
    };
    let faults = api.faults();
    let (r, _) = tokio::join!(watch, async {
        eventually("the watch to open", || api.open_watches() == 1).await;
        faults.drop_watches();
    });
    assert_eq!(r.status, 200);
    assert!(!r.complete, "a dropped watch has no terminating chunk");
    eventually("the watch to close", || api.open_watches() == 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_v1beta1_watch_shows_v1beta1_objects_and_bookmarks() {
    let api = ApiServer::start(ServerOptions::default()).await.unwrap();
    let admin = api.admin_token();
    api.create(
        json!({"apiVersion": "security.istio.io/v1", "kind": "AuthorizationPolicy",
        "metadata": {"name": "first", "namespace": "default"}, "spec": {}}),
    )
    .unwrap();
    let beta = "/apis/security.istio.io/v1beta1/namespaces/default/authorizationpolicies";
    let watch = format!(
        "{beta}?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=2"
    );
    let stream = {
        let (api, admin) = (&api, admin.clone());
        async move { raw(api, "GET", &watch, Some(&admin), None, b"").await }
    };
    let write = async {
        eventually("the watch", || api.open_watches() == 1).await;
        // Written through v1 by HTTP, so the v1beta1 watcher sees it converted.
        let body = json!({"apiVersion": "security.istio.io/v1", "kind": "AuthorizationPolicy",
                          "metadata": {"name": "second"}, "spec": {"action": "DENY"}});
        let r = raw(
            &api,
            "POST",
            "/apis/security.istio.io/v1/namespaces/default/authorizationpolicies",
            Some(&admin),
            Some("application/json"),
            body.to_string().as_bytes(),
        )
        .await;
        assert_eq!(r.status, 201);
        assert_eq!(r.json()["apiVersion"], "security.istio.io/v1");
    };
    let (r, ()) = tokio::join!(stream, write);
    let events = r.lines();
    let seen: Vec<(&str, &str, &str)> = events
        .iter()
        .map(|e| {
            (
                e["type"].as_str().unwrap(),
                e["object"]["metadata"]["name"].as_str().unwrap_or(""),
                e["object"]["apiVersion"].as_str().unwrap(),
            )
        })
        .collect();
    let v1beta1 = "security.istio.io/v1beta1";
    assert_eq!(
        seen[..3],
        [
            ("ADDED", "first", v1beta1),
            ("BOOKMARK", "", v1beta1),
            ("ADDED", "second", v1beta1)
        ],
        "{events:?}"
    );
    assert_eq!(events[1]["object"]["kind"], "AuthorizationPolicy");
    // A cluster-scoped custom resource by HTTP, and its status subresource.
    let t = Some(admin.as_str());
    let classes = "/apis/gateway.networking.k8s.io/v1/gatewayclasses";
    let gc = json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass",
                    "metadata": {"name": "istio", "namespace": "ignored"},
                    "spec": {"controllerName": "istio.io/gateway-controller"},
                    "status": {"conditions": [{"type": "Accepted", "status": "True"}]}});
    let r = raw(
        &api,
        "POST",
        classes,
        t,
        Some("application/json"),
        gc.to_string().as_bytes(),
    )
    .await;
    assert_eq!(r.status, 201);
    let created = r.json();
    assert!(created["metadata"].get("namespace").is_none());
    assert!(created.get("status").is_none(), "create cannot set status");
    assert_eq!(created["metadata"]["generation"], 1);
    let status = json!({"status": {"conditions": [{"type": "Accepted", "status": "True"}]}});
    let r = raw(
        &api,
        "PATCH",
        &format!("{classes}/istio/status"),
        t,
        Some("application/merge-patch+json"),
        status.to_string().as_bytes(),
    )
    .await;
    assert_eq!(r.json()["status"], status["status"]);
    let r = raw(
        &api,
        "GET",
        "/apis/gateway.networking.k8s.io/v1beta1/gatewayclasses",
        t,
        None,
        b"",
    )
    .await;
    assert_eq!(r.status, 404, "only v1 of Gateway API is served");
}
