//! kube-rs (rustls with aws-lc-rs, k8s-openapi types) against the server: the watcher the
//! agent will use survives cut watches and compaction, and status patches work.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use ambit_fake_apiserver::{pod, ApiServer, Resource, ServerOptions};
use common::eventually;
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::{reflector, watcher, WatchStreamExt};
use serde_json::json;

async fn client(api: &ApiServer, token: &str) -> kube::Client {
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&api.kubeconfig(token)).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    kube::Client::try_from(config).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watcher_survives_dropped_watches_and_compaction() {
    // No bookmarks, so a watcher that was away really is behind the compaction.
    let opts = ServerOptions {
        bookmark_interval: Duration::from_secs(3600),
        ..Default::default()
    };
    let api = ApiServer::start(opts).await.unwrap();
    for n in ["a", "b"] {
        api.create(pod("default", n, "n1")).unwrap();
    }
    let pods: Api<Pod> = Api::namespaced(client(&api, &api.admin_token()).await, "default");
    let (reader, writer) = reflector::store();
    let stream = reflector(
        writer,
        watcher(pods, watcher::Config::default()).default_backoff(),
    )
    .applied_objects();
    let task = tokio::spawn(stream.for_each(|_| async {}));
    let names = || -> BTreeSet<String> {
        reader
            .state()
            .iter()
            .map(|p| p.metadata.name.clone().unwrap_or_default())
            .collect()
    };
    let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    eventually("the initial list", || names() == set(&["a", "b"])).await;
    eventually("the watch", || api.open_watches() == 1).await;

    // A cut watch: the watcher resumes from its version and sees what happened meanwhile.
    api.faults().drop_watches();
    api.create(pod("default", "c", "n2")).unwrap();
    eventually("c after a dropped watch", || {
        names() == set(&["a", "b", "c"])
    })
    .await;

    // Away while changes happen and the history is compacted: the re-watch gets 410 and
    // the watcher lists again.
    eventually("the watch to reopen", || api.open_watches() == 1).await;
    api.faults()
        .fail_next(usize::MAX, 500, Some("GET"), Some("watch=true"));
    api.faults().drop_watches();
    eventually("the watch to close", || api.open_watches() == 0).await;
    api.delete(Resource::Pods, Some("default"), "a").unwrap();
    api.create(pod("default", "d", "n2")).unwrap();
    api.faults().compact();
    api.clear_requests();
    api.faults().clear();
    eventually("the set after relisting", || {
        names() == set(&["b", "c", "d"])
    })
    .await;
    let log = api.requests();
    let relist = log.iter().position(|r| {
        r.method == "GET"
            && !r.path.contains("watch=")
            && r.path.starts_with("/api/v1/namespaces/default/pods")
    });
    let rewatch = log.iter().position(|r| r.path.contains("watch=true"));
    assert!(
        rewatch.is_some() && relist.is_some(),
        "a relist after 410: {log:?}"
    );
    // The first request after the faults cleared is the re-watch (which gets the 410).
    assert!(rewatch < relist, "{log:?}");
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn patch_status_with_a_merge_patch() {
    let api = ApiServer::start(ServerOptions::default()).await.unwrap();
    api.create(pod("default", "a", "n1")).unwrap();
    let pods: Api<Pod> = Api::namespaced(client(&api, &api.admin_token()).await, "default");
    let patch = json!({"metadata": {"annotations": {"ambient.istio.io/redirection": "enabled"}},
                       "status": {"phase": "Running", "podIP": "10.0.0.5"}});
    let p = pods
        .patch_status("a", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    assert_eq!(p.status.unwrap().pod_ip.as_deref(), Some("10.0.0.5"));
    let stored = api.get(Resource::Pods, Some("default"), "a").unwrap();
    assert_eq!(
        stored["metadata"]["annotations"]["ambient.istio.io/redirection"],
        "enabled"
    );
    let req = api
        .requests()
        .into_iter()
        .find(|r| r.method == "PATCH")
        .unwrap();
    assert!(
        req.path
            .starts_with("/api/v1/namespaces/default/pods/a/status"),
        "{}",
        req.path
    );
    assert_eq!(
        req.content_type.as_deref(),
        Some("application/merge-patch+json")
    );
    // Errors come back as kube's typed Status.
    let err = pods.get("nope").await.unwrap_err();
    match err {
        kube::Error::Api(s) => {
            assert_eq!(s.code, 404);
            assert_eq!(s.message, "pods \"nope\" not found");
        }
        other => panic!("{other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streaming_list_watcher_with_a_field_selector() {
    let api = ApiServer::start(ServerOptions::default()).await.unwrap();
    for (n, node) in [("a", "n1"), ("b", "n2"), ("c", "n1")] {
        api.create(pod("default", n, node)).unwrap();
    }
    let pods: Api<Pod> = Api::all(client(&api, &api.admin_token()).await);
    let (reader, writer) = reflector::store();
    let config = watcher::Config::default()
        .fields("spec.nodeName=n1")
        .streaming_lists();
    let stream = reflector(writer, watcher(pods, config).default_backoff()).applied_objects();
    let task = tokio::spawn(stream.for_each(|_| async {}));
    let names = || -> BTreeSet<String> {
        reader
            .state()
            .iter()
            .map(|p| p.metadata.name.clone().unwrap_or_default())
            .collect()
    };
    let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    eventually("the initial events", || names() == set(&["a", "c"])).await;
    // Moving a pod off the node is a DELETED for this watcher.
    api.update(Resource::Pods, Some("default"), "a", |p| {
        p["spec"]["nodeName"] = "n2".into()
    })
    .unwrap();
    eventually("a to leave", || names() == set(&["c"])).await;
    let watch = api
        .requests()
        .into_iter()
        .find(|r| r.path.contains("sendInitialEvents=true"))
        .expect("a streaming list");
    assert!(watch.path.starts_with("/api/v1/pods?"), "{}", watch.path);
    task.abort();
}
