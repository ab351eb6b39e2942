//! `ambit control --kubernetes` against the test API server, on loopback: its serving
//! certificate from a mesh CA (a local one standing in for istiod's), streams admitted by
//! TokenReview, objects applied, updated, refused and deleted through the API reaching a
//! waypoint's open stream, and a dropped watch re-listed with no change.

use std::time::Duration;

use ambit_control::{Control, ControlConfig};
use ambit_fake_apiserver::{namespace, ApiServer, Resource, ServerOptions, User};
use ambit_grpc::{ChannelConfig, GrpcChannel, RootCa, Token};
use ambit_identity::{CertificateAuthority, SpiffeId};
use ambit_proto::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use ambit_proto::{DeltaDiscoveryRequest, DeltaDiscoveryResponse, Node, WAYPOINT_POLICY_TYPE};
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Streaming};

const WAIT: Duration = Duration::from_secs(20);
const CONTROL_ID: &str = "spiffe://cluster.local/ns/istio-system/sa/ambit-control";

fn policy(name: &str, methods: &[&str]) -> Value {
    json!({
        "apiVersion": "security.istio.io/v1",
        "kind": "AuthorizationPolicy",
        "metadata": {"name": name, "namespace": "shop"},
        "spec": {
            "targetRefs": [{"kind": "Gateway", "group": "gateway.networking.k8s.io", "name": "waypoint"}],
            "action": "ALLOW",
            "rules": [{"to": [{"operation": {"methods": methods}}]}],
        },
    })
}

struct Fixture {
    api: ApiServer,
    client: kube::Client,
    control: Control,
    ca_root: String,
    _dir: tempfile::TempDir,
}

async fn start() -> Fixture {
    let api = ApiServer::start(ServerOptions::default()).await.unwrap();
    api.create(namespace("shop", &[])).unwrap();
    api.create(json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "metadata": {"name": "waypoint", "namespace": "shop"},
        "spec": {"gatewayClassName": "istio-waypoint",
                 "listeners": [{"name": "mesh", "port": 15008, "protocol": "HBONE"}]},
    }))
    .unwrap();
    api.create(policy("read-only", &["GET"])).unwrap();
    // Projected tokens for istio-ca: the waypoint's, another workload's; and one for the
    // API server only.
    api.add_token_with_audiences(
        "wp",
        User::service_account("shop", "waypoint"),
        &["istio-ca"],
    );
    api.add_token_with_audiences("web", User::service_account("shop", "web"), &["istio-ca"]);
    api.add_token("api-only", User::service_account("shop", "waypoint"));

    let kubeconfig =
        kube::config::Kubeconfig::from_yaml(&api.kubeconfig(&api.admin_token())).unwrap();
    let client = kube::Client::try_from(
        kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .unwrap(),
    )
    .unwrap();
    // The mesh CA (istiod's, in a cluster).
    let dir = tempfile::tempdir().unwrap();
    let ca = CertificateAuthority::ephemeral("cluster.local").unwrap();
    ca.write_plugin_dir(dir.path()).unwrap();
    let certs = ambit_process::certs::cert_manager(&ambit_process::certs::CertSettings {
        source: &ambit_process::ca::CaSource::LocalDir(dir.path().to_path_buf()),
        trust_domain: "cluster.local",
        cluster_id: "Kubernetes",
        secret_ttl: Duration::from_secs(3600),
        impersonate: false,
    })
    .unwrap();
    let mut cfg = ControlConfig::new(Default::default(), Default::default(), Default::default());
    cfg.listen = "127.0.0.1:0".parse().unwrap();
    let control = Control::start_kubernetes(cfg, client.clone(), certs)
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    while !control.is_ready() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not ready: the watches never listed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Fixture {
        api,
        client,
        control,
        ca_root: ca.root_pem(),
        _dir: dir,
    }
}

/// A channel as a waypoint opens it: the server's SPIFFE id checked against the mesh root.
fn channel(fx: &Fixture, token: &str) -> GrpcChannel {
    GrpcChannel::new(ChannelConfig {
        server_identity: Some(SpiffeId::parse(CONTROL_ID).unwrap()),
        address: format!("https://{}", fx.control.local_addr()),
        root: RootCa::Inline(fx.ca_root.clone()),
        alt_hostname: None,
        token: Token::Literal(token.into()),
        cluster_id: "Kubernetes".into(),
        headers: Vec::new(),
    })
    .unwrap()
}

struct Stream {
    tx: mpsc::Sender<DeltaDiscoveryRequest>,
    rx: Streaming<DeltaDiscoveryResponse>,
}

async fn open(fx: &Fixture, token: &str) -> Result<Stream, tonic::Status> {
    let ch = channel(fx, token);
    let (tx, rx) = mpsc::channel(8);
    tx.send(DeltaDiscoveryRequest {
        node: Some(Node {
            id: "waypoint~10.0.0.9~waypoint-0.shop~shop.svc.cluster.local".into(),
            ..Default::default()
        }),
        type_url: WAYPOINT_POLICY_TYPE.into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let mut client = AggregatedDiscoveryServiceClient::new(ch.channel().unwrap());
    let request = ch.request(ReceiverStream::new(rx)).unwrap();
    let rx = tokio::time::timeout(WAIT, client.delta_aggregated_resources(request))
        .await
        .expect("no answer in time")?
        .into_inner();
    Ok(Stream { tx, rx })
}

impl Stream {
    /// The next response, ACKed.
    async fn next(&mut self) -> DeltaDiscoveryResponse {
        let r = tokio::time::timeout(WAIT, self.rx.message())
            .await
            .expect("no response in time")
            .unwrap()
            .expect("the stream ended");
        self.tx
            .send(DeltaDiscoveryRequest {
                type_url: r.type_url.clone(),
                response_nonce: r.nonce.clone(),
                ..Default::default()
            })
            .await
            .unwrap();
        r
    }

    /// Nothing more within `d`.
    async fn quiet_for(&mut self, d: Duration) -> bool {
        tokio::time::timeout(d, self.rx.message()).await.is_err()
    }
}

/// The documents a response carries, as text.
fn documents(r: &DeltaDiscoveryResponse) -> Vec<(String, String)> {
    r.resources
        .iter()
        .map(|res| {
            let value = res
                .resource
                .as_ref()
                .map(|a| a.value.clone())
                .unwrap_or_default();
            (
                res.name.clone(),
                String::from_utf8_lossy(&value).into_owned(),
            )
        })
        .collect()
}

fn metric(fx: &Fixture, name: &str) -> f64 {
    fx.control
        .metrics_text()
        .lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waypoint_follows_the_api_servers_policies() {
    let fx = start().await;
    let mut wp = open(&fx, "wp").await.unwrap();
    let first = wp.next().await;
    let docs = documents(&first);
    assert_eq!(docs.len(), 1, "{docs:?}");
    assert_eq!(docs[0].0, "AuthorizationPolicy/shop/read-only");
    assert!(docs[0].1.contains("GET"), "{docs:?}");

    // An update applied through the API reaches the open stream.
    fx.api
        .update(
            Resource::AuthorizationPolicies,
            Some("shop"),
            "read-only",
            |p| {
                p["spec"]["rules"][0]["to"][0]["operation"]["methods"] = json!(["GET", "HEAD"]);
            },
        )
        .unwrap();
    let docs = documents(&wp.next().await);
    assert!(docs[0].1.contains("HEAD"), "{docs:?}");

    // A version the readers refuse: counted, and the last accepted one stays (no push).
    fx.api
        .update(
            Resource::AuthorizationPolicies,
            Some("shop"),
            "read-only",
            |p| {
                p["spec"]["rules"][0]["to"][0]["operation"]["methods"] = json!(["get"]);
            },
        )
        .unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    while metric(&fx, "ambit_control_kubernetes_objects_refused_total") < 1.0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{}",
            fx.control.metrics_text()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        wp.quiet_for(Duration::from_millis(300)).await,
        "a refused version was pushed"
    );
    // ... and a Warning Event says so on the object, with the field at fault.
    let events: kube::Api<k8s_openapi::api::core::v1::Event> =
        kube::Api::namespaced(fx.client.clone(), "shop");
    let deadline = tokio::time::Instant::now() + WAIT;
    let event = loop {
        let list = events.list(&Default::default()).await.unwrap();
        if let Some(e) = list.items.into_iter().find(|e| {
            e.involved_object.name.as_deref() == Some("read-only")
                && e.involved_object.kind.as_deref() == Some("AuthorizationPolicy")
        }) {
            break e;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no Event for the refused policy"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    let message = event.message.unwrap_or_default();
    assert!(
        message.contains("still served")
            && message.contains("spec.rules[0].to[0].operation.methods[0]"),
        "{message}"
    );

    // A dropped watch re-lists: nothing changes, nothing is pushed.
    let generation = fx.control.mesh_generation();
    fx.api.faults().drop_watches();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(wp.quiet_for(Duration::from_millis(300)).await);
    assert_eq!(fx.control.mesh_generation(), generation);
    // A watch resumed from a version the server no longer holds gets 410 (an ERROR event on
    // the watch) and lists again: still no change.
    let lists = |api: &ApiServer| {
        api.requests()
            .iter()
            .filter(|r| {
                r.method == "GET"
                    && r.path.contains("/authorizationpolicies")
                    && !r.path.contains("watch=")
            })
            .count()
    };
    let listed_before = lists(&fx.api);
    fx.api.faults().compact();
    fx.api
        .create(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "bump", "namespace": "shop"}, "data": {}}))
        .unwrap();
    fx.api.faults().drop_watches();
    let deadline = tokio::time::Instant::now() + WAIT;
    while lists(&fx.api) == listed_before {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no re-list after a 410: {:?}",
            fx.api
                .requests()
                .iter()
                .filter(|r| r.path.contains("authorizationpolicies"))
                .map(|r| (r.path.clone(), r.status))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(wp.quiet_for(Duration::from_millis(300)).await);
    assert_eq!(fx.control.mesh_generation(), generation);

    // A new policy written as v1beta1 is served too; a deleted one is removed.
    let mut beta = policy("no-delete", &["DELETE"]);
    beta["apiVersion"] = json!("security.istio.io/v1beta1");
    beta["spec"]["action"] = json!("DENY");
    fx.api.create(beta).unwrap();
    let docs = documents(&wp.next().await);
    assert_eq!(
        docs.iter().map(|d| d.0.as_str()).collect::<Vec<_>>(),
        ["AuthorizationPolicy/shop/no-delete"]
    );
    fx.api
        .delete(Resource::AuthorizationPolicies, Some("shop"), "no-delete")
        .unwrap();
    let gone = wp.next().await;
    assert_eq!(
        gone.removed_resources,
        ["AuthorizationPolicy/shop/no-delete"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_waypoints_service_account_is_served() {
    let fx = start().await;
    let cases: &[(&str, Code, &str)] = &[
        // Another workload of the namespace: authenticated, but it runs no waypoint.
        ("web", Code::PermissionDenied, "shop/web runs no waypoint"),
        // A token the API server does not know.
        ("forged", Code::Unauthenticated, "does not accept the token"),
        // The waypoint's account, but a token for the API server, not for istio-ca.
        (
            "api-only",
            Code::Unauthenticated,
            "does not accept the token",
        ),
    ];
    for (token, code, says) in cases {
        let status = match open(&fx, token).await {
            Ok(mut s) => match tokio::time::timeout(WAIT, s.rx.message()).await.unwrap() {
                Err(status) => status,
                Ok(r) => panic!("{token}: served {r:?}"),
            },
            Err(status) => status,
        };
        assert_eq!(status.code(), *code, "{token}: {status:?}");
        assert!(status.message().contains(says), "{token}: {status:?}");
    }
    assert_eq!(metric(&fx, "ambit_control_xds_not_a_waypoint_total"), 1.0);
    assert!(metric(&fx, "ambit_control_unauthenticated_requests_total") >= 2.0);
    // The Gateway deleted: its account is no longer served (once the cached review ends,
    // the decision itself is made per stream against the Gateways known now).
    fx.api
        .delete(Resource::Gateways, Some("shop"), "waypoint")
        .unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let refused = match open(&fx, "wp").await {
            Err(s) => s.code() == Code::PermissionDenied,
            Ok(mut s) => matches!(
                tokio::time::timeout(WAIT, s.rx.message()).await.unwrap(),
                Err(s) if s.code() == Code::PermissionDenied
            ),
        };
        if refused {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "still served without its Gateway"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// istiod is the CA: a certificate request is refused, whoever asks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn it_is_not_a_ca() {
    use ambit_proto::istio::v1::auth::istio_certificate_service_client::IstioCertificateServiceClient;
    let fx = start().await;
    let ch = channel(&fx, "wp");
    let mut client = IstioCertificateServiceClient::new(ch.channel().unwrap());
    let request = ch
        .request(ambit_proto::IstioCertificateRequest::default())
        .unwrap();
    let status = client.create_certificate(request).await.unwrap_err();
    assert_eq!(status.code(), Code::Unimplemented, "{status:?}");
    assert!(status.message().contains("not a CA"), "{status:?}");
}

/// A waypoint is served what targets it: its Gateway, and the Services it fronts as their
/// and their namespaces' `istio.io/use-waypoint` labels say, as the labels change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waypoint_is_served_only_what_targets_it() {
    let fx = start().await;
    fx.api.create(namespace("bank", &[])).unwrap();
    fx.api
        .create(json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
            "metadata": {"name": "waypoint", "namespace": "bank"},
            "spec": {"gatewayClassName": "istio-waypoint", "listeners": []},
        }))
        .unwrap();
    let mut bank = policy("bank-only", &["GET"]);
    bank["metadata"]["namespace"] = json!("bank");
    fx.api.create(bank).unwrap();
    let mut on_cart = policy("on-cart", &["GET"]);
    on_cart["spec"]["targetRefs"] = json!([{"kind": "Service", "group": "", "name": "cart"}]);
    fx.api.create(on_cart).unwrap();
    fx.api
        .create(json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "cart", "namespace": "shop"},
            "spec": {"ports": [{"port": 80}]}}))
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;

    let mut wp = open(&fx, "wp").await.unwrap();
    let first = documents(&wp.next().await);
    let names: Vec<&str> = first.iter().map(|d| d.0.as_str()).collect();
    assert_eq!(names, ["AuthorizationPolicy/shop/read-only"], "{first:?}");

    // The namespace now uses shop's waypoint: cart's policy follows.
    fx.api
        .update(Resource::Namespaces, None, "shop", |ns| {
            ns["metadata"]["labels"] = json!({"istio.io/use-waypoint": "waypoint"});
        })
        .unwrap();
    let docs = documents(&wp.next().await);
    assert_eq!(
        docs.iter().map(|d| d.0.as_str()).collect::<Vec<_>>(),
        ["AuthorizationPolicy/shop/on-cart"]
    );
    // cart opts out on its own: the policy is taken back.
    fx.api
        .update(Resource::Services, Some("shop"), "cart", |s| {
            s["metadata"]["labels"] = json!({"istio.io/use-waypoint": "none"});
        })
        .unwrap();
    let gone = wp.next().await;
    assert_eq!(gone.removed_resources, ["AuthorizationPolicy/shop/on-cart"]);
    assert!(gone.resources.is_empty());
}
