//! kube-rs (rustls with aws-lc-rs, k8s-openapi types) against the server: the watcher the
//! agent will use survives cut watches and compaction, status patches work, Istio's
//! custom resources are one set of objects through both versions, and TokenReviews
//! answer for the audiences asked.

mod common;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ambit_fake_apiserver::{pod, ApiServer, Resource, ServerOptions, User, API_AUDIENCE};
use common::eventually;
use futures_util::StreamExt;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
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

fn authorization_policies(version: &str) -> ApiResource {
    let gvk = GroupVersionKind::gvk("security.istio.io", version, "AuthorizationPolicy");
    ApiResource::from_gvk_with_plural(&gvk, "authorizationpolicies")
}

/// What a watcher saw of one object: event, name, apiVersion, generation.
type Seen = Arc<Mutex<Vec<(String, String, String, i64)>>>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_resources_are_one_set_of_objects_through_both_versions() {
    let api = ApiServer::start(ServerOptions::default()).await.unwrap();
    let client = client(&api, &api.admin_token()).await;
    let (v1, beta) = (
        authorization_policies("v1"),
        authorization_policies("v1beta1"),
    );
    let v1_api: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &v1);
    let beta_api: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &beta);

    // A watcher over v1, as a control plane reading the storage version.
    let seen: Seen = Arc::default();
    let sink = seen.clone();
    let stream = watcher(
        Api::<DynamicObject>::all_with(client.clone(), &v1),
        watcher::Config::default(),
    );
    let task = tokio::spawn(stream.for_each(move |ev| {
        let sink = sink.clone();
        async move {
            let (what, obj) = match ev {
                Ok(watcher::Event::Apply(o)) => ("apply", o),
                Ok(watcher::Event::InitApply(o)) => ("init", o),
                Ok(watcher::Event::Delete(o)) => ("delete", o),
                _ => return,
            };
            let api_version = obj.types.map(|t| t.api_version).unwrap_or_default();
            sink.lock().unwrap().push((
                what.to_string(),
                obj.metadata.name.unwrap_or_default(),
                api_version,
                obj.metadata.generation.unwrap_or_default(),
            ));
        }
    }));
    eventually("the v1 watch", || api.open_watches() == 1).await;

    // Written as v1beta1 (an older chart's document).
    let policy = DynamicObject::new("deny-all", &beta)
        .within("default")
        .data(json!({"spec": {"action": "DENY", "rules": [{}]}}));
    let created = beta_api
        .create(&PostParams::default(), &policy)
        .await
        .unwrap();
    assert_eq!(
        created.types.unwrap().api_version,
        "security.istio.io/v1beta1"
    );
    let saw = |what: &str, generation: i64| {
        seen.lock().unwrap().iter().any(|(w, n, v, g)| {
            w == what && n == "deny-all" && v == "security.istio.io/v1" && *g == generation
        })
    };
    eventually("the v1 watch to see the v1beta1 write as v1", || {
        saw("apply", 1)
    })
    .await;

    // Listed through either version, the object shows that version.
    for (api, want) in [
        (&v1_api, "security.istio.io/v1"),
        (&beta_api, "security.istio.io/v1beta1"),
    ] {
        let list = api.list(&Default::default()).await.unwrap();
        let names: Vec<_> = list
            .items
            .iter()
            .map(|o| o.metadata.name.clone().unwrap_or_default())
            .collect();
        assert_eq!(names, ["deny-all"]);
        assert_eq!(list.items[0].types.as_ref().unwrap().api_version, want);
        assert_eq!(
            api.get("deny-all")
                .await
                .unwrap()
                .types
                .unwrap()
                .api_version,
            want
        );
    }

    // A spec change through v1beta1 bumps the generation the v1 watcher sees; a status
    // write does not.
    let patch = json!({"spec": {"action": "ALLOW"}});
    beta_api
        .patch("deny-all", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    eventually("generation 2 on the v1 watch", || saw("apply", 2)).await;
    let status = json!({"status": {"validationMessages": [{"type": {"code": "IST0001"}}]}});
    let patched = v1_api
        .patch_status("deny-all", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    assert_eq!(patched.metadata.generation, Some(2));
    assert_eq!(patched.data["status"], status["status"]);
    let stored = api
        .get(Resource::AuthorizationPolicies, Some("default"), "deny-all")
        .unwrap();
    assert_eq!(stored["apiVersion"], "security.istio.io/v1");
    assert_eq!(stored["spec"]["action"], "ALLOW");

    // The other version's body through a version's URL is refused, in kube-apiserver's words.
    let mut wrong = DynamicObject::new("other", &beta).within("default");
    wrong.data = json!({"spec": {}});
    let err = v1_api
        .create(&PostParams::default(), &wrong)
        .await
        .unwrap_err();
    match err {
        kube::Error::Api(s) => assert_eq!(
            (s.code, s.reason.as_str(), s.message.as_str()),
            (400, "BadRequest", "the API version in the data (security.istio.io/v1beta1) does not match the expected API version (security.istio.io/v1)")
        ),
        other => panic!("{other}"),
    }
    beta_api
        .delete("deny-all", &Default::default())
        .await
        .unwrap();
    eventually("the deletion on the v1 watch", || saw("delete", 2)).await;
    let paths: Vec<String> = api.requests().into_iter().map(|r| r.path).collect();
    assert!(
        paths.iter().any(
            |p| p.starts_with("/apis/security.istio.io/v1/authorizationpolicies?")
                && p.contains("watch=true")
        ),
        "{paths:?}"
    );
    assert!(
        paths.iter().any(|p| p.starts_with(
            "/apis/security.istio.io/v1beta1/namespaces/default/authorizationpolicies"
        )),
        "{paths:?}"
    );
    task.abort();
}

fn review(token: &str, audiences: &[&str]) -> TokenReview {
    TokenReview {
        spec: TokenReviewSpec {
            token: Some(token.to_string()),
            audiences: (!audiences.is_empty())
                .then(|| audiences.iter().map(|a| a.to_string()).collect()),
        },
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_reviews_for_the_istio_ca_audience() {
    let api = ApiServer::start(ServerOptions {
        rbac: true,
        ..Default::default()
    })
    .await
    .unwrap();
    // istiod may create TokenReviews (the rule of system:auth-delegator); a pod's token
    // is projected for istio-ca.
    api.apply_yaml(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: reviewer}\n\
         rules: [{apiGroups: [authentication.k8s.io], resources: [tokenreviews], verbs: [create]}]\n\
         ---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {name: reviewer}\n\
         roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: reviewer}\n\
         subjects: [{kind: ServiceAccount, name: istiod, namespace: istio-system}]\n",
    )
    .unwrap();
    api.add_token(
        "istiod-token",
        User::service_account("istio-system", "istiod"),
    );
    let web = User::service_account("default", "web");
    api.add_token_with_audiences("pod-token", web.clone(), &["istio-ca"]);
    let reviews: Api<TokenReview> = Api::all(client(&api, "istiod-token").await);

    let answer = reviews
        .create(&PostParams::default(), &review("pod-token", &["istio-ca"]))
        .await
        .unwrap();
    let status = answer.status.unwrap();
    assert_eq!(status.authenticated, Some(true));
    assert_eq!(status.audiences, Some(vec!["istio-ca".to_string()]));
    assert_eq!(status.error, None);
    let user = status.user.unwrap();
    assert_eq!(
        user.username.as_deref(),
        Some("system:serviceaccount:default:web")
    );
    assert_eq!(user.uid.as_deref(), Some(web.uid.as_str()));
    assert_eq!(user.groups, Some(web.groups.clone()));
    assert_eq!(
        answer.spec.token.as_deref(),
        Some("pod-token"),
        "the request echoed"
    );

    // No audience asked: the API server's own is implied, and istio-ca's token fails.
    let status = reviews
        .create(&PostParams::default(), &review("pod-token", &[]))
        .await
        .unwrap()
        .status
        .unwrap();
    assert_ne!(status.authenticated, Some(true));
    assert_eq!(status.audiences, None);
    assert_eq!(
        status.error.as_deref(),
        Some(format!("token audiences [\"istio-ca\"] is invalid for the target audiences [\"{API_AUDIENCE}\"]").as_str())
    );
    assert_eq!(status.user.unwrap_or_default().username, None);
    // An unknown token: an answer, not a failed request.
    let status = reviews
        .create(&PostParams::default(), &review("forged", &["istio-ca"]))
        .await
        .unwrap()
        .status
        .unwrap();
    assert_ne!(status.authenticated, Some(true));
    assert_eq!(status.error.as_deref(), Some("invalid bearer token"));
    // The reviewer's own token is bound to the API server: good for no other audience.
    let status = reviews
        .create(
            &PostParams::default(),
            &review("istiod-token", &[API_AUDIENCE, "istio-ca"]),
        )
        .await
        .unwrap()
        .status
        .unwrap();
    assert_eq!(status.audiences, Some(vec![API_AUDIENCE.to_string()]));

    // Only create is served; and the pod's istio-ca token is no credential for the API.
    match reviews.list(&Default::default()).await.unwrap_err() {
        kube::Error::Api(s) => assert_eq!(
            (s.code, s.reason.as_str()),
            (403, "Forbidden"),
            "RBAC first"
        ),
        other => panic!("{other}"),
    }
    let admin_reviews: Api<TokenReview> = Api::all(client(&api, &api.admin_token()).await);
    match admin_reviews.list(&Default::default()).await.unwrap_err() {
        kube::Error::Api(s) => assert_eq!(
            (s.code, s.reason.as_str(), s.message.as_str()),
            (
                405,
                "MethodNotAllowed",
                "the server does not allow this method on the requested resource"
            )
        ),
        other => panic!("{other}"),
    }
    let pods: Api<Pod> = Api::namespaced(client(&api, "pod-token").await, "default");
    match pods.list(&Default::default()).await.unwrap_err() {
        kube::Error::Api(s) => assert_eq!(s.code, 401),
        other => panic!("{other}"),
    }
    let denied: Api<TokenReview> = Api::all(client(&api, "pod-token").await);
    assert!(denied
        .create(&PostParams::default(), &review("pod-token", &["istio-ca"]))
        .await
        .is_err());
    let posts: Vec<_> = api
        .requests()
        .into_iter()
        .filter(|r| {
            r.method == "POST"
                && r.path
                    .starts_with("/apis/authentication.k8s.io/v1/tokenreviews")
        })
        .map(|r| (r.user, r.status))
        .collect();
    let istiod = Some("system:serviceaccount:istio-system:istiod".to_string());
    assert_eq!(
        posts,
        [
            (istiod.clone(), 201),
            (istiod.clone(), 201),
            (istiod.clone(), 201),
            (istiod, 201),
            (None, 401)
        ]
    );
}
