//! The waypoint in the pod istiod renders, as root in network namespaces: started as
//! `proxy waypoint --domain … --serviceCluster …` with istiod's environment (`CA_ADDR`
//! without a scheme, `PROXY_CONFIG`'s `discoveryAddress`, `ISTIO_META_*`), its token and
//! root at the pod's paths and its labels file. The cluster's `ambit control` stands in for
//! istiod (workloads and certificates); a second `ambit control` serves the L7
//! configuration on a stream of its own. Checked: the workloads stream carries nothing of
//! ambit's; the policy is enforced (GET 200, DELETE 403); with the L7 server gone the
//! waypoint keeps enforcing; a fresh waypoint that cannot reach it stays not ready and
//! refuses HBONE; without any L7 source the waypoint refuses to start and says why.

use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::Path;
use std::time::Duration;

use ambit_netns_lab::cluster::istiod_pod::{pod_name, IstiodPod, L7Control};
use ambit_netns_lab::cluster::{Cluster, ClusterSpec, PodSpec};
use ambit_netns_lab::control::{ControlPlane, CONTROL_PORT};
use ambit_netns_lab::peer::NodeProxy;
use ambit_netns_lab::{wait_until, Lab};
use ambit_proto::{
    ADDRESS_TYPE, WAYPOINT_AUTHN_TYPE, WAYPOINT_DESTINATION_RULE_TYPE, WAYPOINT_POLICY_TYPE,
    WAYPOINT_ROUTE_TYPE,
};

const HOST: &str = "reviews.default.svc.cluster.local";
const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 20);
const PORT: u16 = 80;
const APP_PORT: u16 = 9080;
const WAYPOINT_IP: Ipv4Addr = Ipv4Addr::new(10, 78, 0, 3);
const LATE_WAYPOINT_IP: Ipv4Addr = Ipv4Addr::new(10, 78, 0, 4);

/// The waypoint pod and `reviews` behind it.
fn mesh_yaml() -> String {
    let pod = pod_name("waypoint");
    format!(
        r#"- uid: cluster1//v1/Pod/default/{pod}
  name: {pod}
  namespace: default
  serviceAccount: waypoint
  trustDomain: cluster.local
  workloadIps: ["{WAYPOINT_IP}"]
  protocol: HBONE
  node: node2
  canonicalName: waypoint
  workloadName: waypoint
services:
- name: reviews
  namespace: default
  hostname: {HOST}
  vips: ["/{VIP}"]
  ports: {{{PORT}: {APP_PORT}}}
  waypoint: {{destination: "/{WAYPOINT_IP}", hboneMtlsPort: 15008}}
"#
    )
}

/// [`mesh_yaml`] with `reviews-v1` (neighbour) and `reviews-v2` (server), for a route
/// to split `reviews` between.
fn mesh_with_versions() -> String {
    let mut mesh = mesh_yaml();
    for (name, vip) in [("reviews-v1", "10.96.0.21"), ("reviews-v2", "10.96.0.22")] {
        mesh.push_str(&format!(
            "- name: {name}\n  namespace: default\n  hostname: {name}.default.svc.cluster.local\n  vips: [\"/{vip}\"]\n  ports: {{{PORT}: {APP_PORT}}}\n"
        ));
    }
    mesh
}

/// Served by the L7 control server only: on `reviews`, the client may GET.
const POLICY: &str = r#"apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: reviews-read-only, namespace: default}
spec:
  targetRefs: [{kind: Service, group: "", name: reviews}]
  action: ALLOW
  rules:
  - from: [{source: {principals: ["cluster.local/ns/default/sa/client"]}}]
    to: [{operation: {methods: ["GET"]}}]
"#;

/// GET and DELETE from the client, through the waypoint: their statuses.
fn get_and_delete(cluster: &Cluster) -> (u16, u16) {
    let replies = cluster
        .http1_from(
            "client",
            SocketAddr::from((VIP, PORT)),
            HOST,
            &[("GET", "/reviews/1"), ("DELETE", "/reviews/1")],
        )
        .unwrap();
    assert_eq!(replies.len(), 2, "{replies:?}");
    (replies[0].status, replies[1].status)
}

/// The types a control server's client subscribed to, for the client whose node id
/// names `pod`.
fn subscribed_types(plane: &ControlPlane, pod: &str) -> Vec<String> {
    let debug = plane.debug().unwrap();
    let clients = debug["clients"].as_array().cloned().unwrap_or_default();
    let client = clients
        .iter()
        .find(|c| c["node_id"].as_str().is_some_and(|n| n.contains(pod)))
        .unwrap_or_else(|| panic!("no client of {pod} in {debug:#}"));
    let mut types: Vec<String> = client["types"]
        .as_object()
        .unwrap_or_else(|| panic!("no types in {client:#}"))
        .keys()
        .cloned()
        .collect();
    types.sort();
    types
}

#[test]
fn a_waypoint_in_istiods_pod_takes_l7_from_its_own_stream_and_fails_closed() {
    let ambit = Path::new(env!("CARGO_BIN_EXE_ambit"));
    let pods = [
        PodSpec::new("client", 0),
        PodSpec::new("server", 1).endpoint_of(&format!("default/{HOST}"), &[]),
    ];
    let mesh = mesh_yaml();
    let cluster = Cluster::launch(ClusterSpec {
        ambit,
        tag: "wp-istiod",
        node_proxies: vec![NodeProxy::Ambit(ambit.to_path_buf()); 2],
        pods: &pods,
        create: pods.len(),
        extra_yaml: &mesh,
        proxy_env: &[],
        control: Some(ambit),
    })
    .unwrap();
    cluster.serve_http("server", APP_PORT).unwrap();
    let istiod = cluster.control.as_ref().unwrap();

    // The L7 control server, on node1, with the mesh's CA (its serving certificate chains
    // to the root the pod trusts) and only the policy.
    let mut l7 = ControlPlane::prepare(
        &cluster.lab,
        &cluster.nodes[0].ns,
        SocketAddr::from((cluster.nodes[0].ip, CONTROL_PORT)),
        ambit,
        &istiod.ca_dir,
        &[],
        POLICY,
    )
    .unwrap();
    l7.start(&cluster.lab).unwrap();

    let waypoint = cluster
        .spawn_istiod_waypoint(&IstiodPod {
            node: 1,
            name: "waypoint",
            ip: WAYPOINT_IP,
            l7_control: L7Control::File(&l7),
            ports: (25100, 25120, 25121),
        })
        .unwrap();
    let log = |pod: &ambit_netns_lab::cluster::waypoint::WaypointPod| {
        std::fs::read_to_string(&pod.process.log).unwrap_or_default()
    };
    wait_until(
        "the waypoint started from istiod's pod to be ready",
        Duration::from_secs(30),
        || matches!(cluster.waypoint_readiness(&waypoint), Ok((200, _))),
    )
    .unwrap_or_else(|e| panic!("{e}; its log:\n{}", log(&waypoint)));

    // Its Gateway's name and class came from the labels file, the rest from istiod's
    // variables (the dump shows what it runs with).
    let admin = SocketAddr::from(([127, 0, 0, 1], 25100));
    let (status, dump) =
        ambit_netns_lab::http_get(&cluster.nodes[1].ns, admin, "/config_dump").unwrap();
    assert_eq!(status, 200, "{dump}");
    let dump: serde_json::Value = serde_json::from_str(&dump).unwrap();
    assert_eq!(dump["waypoint"]["gateway"], "waypoint", "{dump:#}");
    assert_eq!(
        dump["waypoint"]["gatewayClass"], "istio-waypoint",
        "{dump:#}"
    );

    // Two streams: istiod's carries workloads only; ambit's, the L7 types only.
    assert_eq!(
        subscribed_types(istiod, &pod_name("waypoint")),
        [ADDRESS_TYPE]
    );
    let mut l7_types = [
        WAYPOINT_POLICY_TYPE,
        WAYPOINT_ROUTE_TYPE,
        WAYPOINT_AUTHN_TYPE,
        WAYPOINT_DESTINATION_RULE_TYPE,
    ];
    l7_types.sort();
    assert_eq!(subscribed_types(&l7, &pod_name("waypoint")), l7_types);

    assert_eq!(get_and_delete(&cluster), (200, 403), "{}", log(&waypoint));

    // The L7 server goes away: the last snapshot stays in force.
    l7.stop(&cluster.lab).unwrap();
    assert_eq!(get_and_delete(&cluster), (200, 403), "{}", log(&waypoint));
    assert!(matches!(
        cluster.waypoint_readiness(&waypoint),
        Ok((200, _))
    ));

    // A fresh waypoint that cannot reach it holds its workloads and certificate but no L7
    // snapshot: not ready, and its HBONE port refuses connections.
    let late = cluster
        .spawn_istiod_waypoint(&IstiodPod {
            node: 0,
            name: "late-waypoint",
            ip: LATE_WAYPOINT_IP,
            l7_control: L7Control::File(&l7),
            ports: (25200, 25220, 25221),
        })
        .unwrap();
    wait_until(
        "the late waypoint to wait for its L7 configuration only",
        Duration::from_secs(30),
        || {
            matches!(cluster.waypoint_readiness(&late),
                Ok((500, body)) if body.trim() == "not ready, pending: L7 configuration, proxy")
        },
    )
    .unwrap_or_else(|e| {
        panic!(
            "{e}: {:?}; its log:\n{}",
            cluster.waypoint_readiness(&late),
            log(&late)
        )
    });
    let refused = Lab::in_netns(&cluster.nodes[0].ns, || {
        Ok(TcpStream::connect_timeout(
            &SocketAddr::from((LATE_WAYPOINT_IP, 15008)),
            Duration::from_secs(2),
        )
        .map(|_| ())
        .map_err(|e| e.kind()))
    })
    .unwrap();
    assert_eq!(
        refused,
        Err(std::io::ErrorKind::ConnectionRefused),
        "a waypoint without its policies must not take HBONE connections"
    );
    assert!(cluster.lab.is_running(late.process.pid));

    // No L7 source at all (the control address set empty): it refuses to start and says
    // why.
    let none = cluster
        .spawn_istiod_waypoint(&IstiodPod {
            node: 0,
            name: "no-l7-waypoint",
            ip: Ipv4Addr::new(10, 78, 0, 5),
            l7_control: L7Control::None,
            ports: (25300, 25320, 25321),
        })
        .unwrap();
    wait_until(
        "the waypoint without an L7 source to exit",
        Duration::from_secs(20),
        || !cluster.lab.is_running(none.process.pid),
    )
    .unwrap();
    let said = log(&none);
    assert!(
        said.contains("AMBIT_CONTROL_ADDRESS is required when AMBIT_WAYPOINT_CONFIG is not set"),
        "{said}"
    );
}

/// `kubectl apply` in node1's namespace (where the lab's API server listens) of `yaml`.
fn kubectl(cluster: &Cluster, kubeconfig: &Path, args: &[&str], yaml: Option<&str>) -> String {
    let ns = &cluster.nodes[0].ns;
    let file = cluster
        .lab
        .dir
        .path()
        .join(format!("kubectl-{}.yaml", rand_suffix()));
    let mut argv = vec![
        "kubectl".to_string(),
        format!("--kubeconfig={}", kubeconfig.display()),
    ];
    argv.extend(args.iter().map(|a| a.to_string()));
    if let Some(yaml) = yaml {
        std::fs::write(&file, yaml).unwrap();
        argv.extend([
            "--validate=false".into(),
            "-f".into(),
            file.display().to_string(),
        ]);
    }
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    cluster
        .lab
        .exec(ns, &argv)
        .unwrap_or_else(|e| panic!("{argv:?}: {e:#}"))
}

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

const REVIEWS_SERVICE: &str = r#"apiVersion: v1
kind: Service
metadata:
  name: reviews
  namespace: default
  labels: {istio.io/use-waypoint: waypoint}
spec:
  ports: [{name: http, port: 80, targetPort: 9080}]
"#;

const SPLIT_ROUTE: &str = r#"apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: reviews-split, namespace: default}
spec:
  parentRefs: [{group: "", kind: Service, name: reviews, port: 80}]
  rules:
  - backendRefs: [{name: reviews-v1, port: 80, weight: 90}, {name: reviews-v2, port: 80, weight: 10}]
"#;

const GATEWAY: &str = r#"apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: waypoint, namespace: default}
spec:
  gatewayClassName: istio-waypoint
  listeners: [{name: mesh, port: 15008, protocol: HBONE}]
"#;

/// The policy with `methods` allowed to the client.
fn policy(methods: &str) -> String {
    format!(
        r#"apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {{name: reviews-read-only, namespace: default}}
spec:
  targetRefs: [{{kind: Service, group: "", name: reviews}}]
  action: ALLOW
  rules:
  - from: [{{source: {{principals: ["cluster.local/ns/default/sa/client"]}}}}]
    to: [{{operation: {{methods: {methods}}}}}]
"#
    )
}

#[test]
fn a_waypoint_in_istiods_pod_enforces_what_kubectl_applies_through_control_kubernetes() {
    use ambit_netns_lab::jwt::{now, Issuer};
    use ambit_netns_lab::kube::KubeLab;
    use ambit_netns_lab::kube_control::KubeControl;

    let ambit = Path::new(env!("CARGO_BIN_EXE_ambit"));
    let version = |v: &str| format!("default/reviews-{v}.default.svc.cluster.local");
    let pods = [
        PodSpec::new("client", 0),
        PodSpec::new("neighbour", 0)
            .endpoint_of(&format!("default/{HOST}"), &[])
            .endpoint_of(&version("v1"), &[]),
        PodSpec::new("server", 1)
            .endpoint_of(&format!("default/{HOST}"), &[])
            .endpoint_of(&version("v2"), &[]),
    ];
    let mesh = mesh_with_versions();
    let cluster = Cluster::launch(ClusterSpec {
        ambit,
        tag: "wp-kubectl",
        node_proxies: vec![NodeProxy::Ambit(ambit.to_path_buf()); 2],
        pods: &pods,
        create: pods.len(),
        extra_yaml: &mesh,
        proxy_env: &[],
        control: Some(ambit),
    })
    .unwrap();
    cluster.serve_http("server", APP_PORT).unwrap();
    cluster.serve_http("neighbour", APP_PORT).unwrap();
    let istiod = cluster.control.as_ref().unwrap();
    let names: Vec<String> = cluster.nodes.iter().map(|n| n.name.clone()).collect();
    let kube = KubeLab::start(&cluster.nodes[0].ns, cluster.nodes[0].ip, &names).unwrap();
    let kubeconfig = cluster.lab.dir.path().join("user.kubeconfig");
    std::fs::write(&kubeconfig, kube.kubeconfig_for(&kube.api.admin_token())).unwrap();
    kubectl(&cluster, &kubeconfig, &["apply"], Some(GATEWAY));
    // `reviews` uses the waypoint, as its label says (so the waypoint is served what
    // targets it).
    kubectl(&cluster, &kubeconfig, &["apply"], Some(REVIEWS_SERVICE));
    kubectl(
        &cluster,
        &kubeconfig,
        &["apply"],
        Some(&policy(r#"["GET"]"#)),
    );

    let mut l7 = KubeControl::start(
        &cluster.lab,
        &cluster.nodes[0].ns,
        SocketAddr::from((cluster.nodes[0].ip, CONTROL_PORT)),
        ambit,
        &kube,
        istiod,
    )
    .unwrap();
    let address = l7.listen;
    let waypoint = cluster
        .spawn_istiod_waypoint(&IstiodPod {
            node: 1,
            name: "waypoint",
            ip: WAYPOINT_IP,
            l7_control: L7Control::Kubernetes {
                address,
                api: &kube,
            },
            ports: (25100, 25120, 25121),
        })
        .unwrap();
    let log = |pod: &ambit_netns_lab::cluster::waypoint::WaypointPod| {
        std::fs::read_to_string(&pod.process.log).unwrap_or_default()
    };
    wait_until("the waypoint to be ready", Duration::from_secs(30), || {
        matches!(cluster.waypoint_readiness(&waypoint), Ok((200, _)))
    })
    .unwrap_or_else(|e| panic!("{e}; its log:\n{}\ncontrol:\n{}", log(&waypoint), l7.log()));
    assert_eq!(get_and_delete(&cluster), (200, 403), "{}", log(&waypoint));
    assert_eq!(
        subscribed_types(istiod, &pod_name("waypoint")),
        [ADDRESS_TYPE]
    );

    // kubectl apply: DELETE allowed too, within a second or so.
    kubectl(
        &cluster,
        &kubeconfig,
        &["apply"],
        Some(&policy(r#"["GET", "DELETE"]"#)),
    );
    wait_until(
        "the change to reach the waypoint",
        Duration::from_secs(10),
        || get_and_delete(&cluster) == (200, 200),
    )
    .unwrap();
    // A version the readers refuse: a Warning Event on it, and the last one stays.
    kubectl(
        &cluster,
        &kubeconfig,
        &["apply"],
        Some(&policy(r#"["get"]"#)),
    );
    wait_until("the Warning Event", Duration::from_secs(10), || {
        kubectl(
            &cluster,
            &kubeconfig,
            &["get", "events", "-n", "default"],
            None,
        )
        .contains("RefusedByWaypointReader")
    })
    .unwrap_or_else(|e| panic!("{e}; control:\n{}", l7.log()));
    assert_eq!(get_and_delete(&cluster), (200, 200));

    // An HTTPRoute splitting `reviews` 90/10 between v1 (neighbour) and v2 (server).
    kubectl(&cluster, &kubeconfig, &["apply"], Some(SPLIT_ROUTE));
    let admin = SocketAddr::from(([127, 0, 0, 1], 25100));
    wait_until(
        "the route to reach the waypoint",
        Duration::from_secs(10),
        || {
            ambit_netns_lab::http_get(&cluster.nodes[1].ns, admin, "/config_dump")
                .is_ok_and(|(_, dump)| dump.contains("reviews-split"))
        },
    )
    .unwrap();
    let requests: Vec<(&str, &str)> = vec![("GET", "/reviews/1"); 200];
    let replies = cluster
        .http1_from("client", SocketAddr::from((VIP, PORT)), HOST, &requests)
        .unwrap();
    let by = |pod: &str| replies.iter().filter(|r| r.body.starts_with(pod)).count();
    let (v1, v2) = (by("neighbour"), by("server"));
    // Binomial(200, 0.9): v1 below 150 or v2 at 0 is out by more than seven deviations.
    assert!(v1 >= 150 && v2 >= 1 && v1 + v2 == 200, "split {v1}/{v2}");

    // A RequestAuthentication: a forged token is refused 401.
    let idp = Issuer::new("https://idp.example", "k1").unwrap();
    kubectl(
        &cluster,
        &kubeconfig,
        &["apply"],
        Some(&format!(
            "apiVersion: security.istio.io/v1\nkind: RequestAuthentication\nmetadata: {{name: reviews-jwt, namespace: default}}\nspec:\n  targetRefs: [{{kind: Service, group: \"\", name: reviews}}]\n  jwtRules:\n  - issuer: https://idp.example\n    jwks: '{}'\n",
            idp.jwks()
        )),
    );
    let claims = serde_json::json!({"iss": "https://idp.example", "sub": "a", "exp": now() + 600});
    let with_token = |token: &str| {
        let mut req = ambit_netns_lab::cluster::http::request("GET", HOST, "/reviews/1").unwrap();
        req.headers_mut()
            .insert("authorization", format!("Bearer {token}").parse().unwrap());
        cluster
            .send_http1_from("client", SocketAddr::from((VIP, PORT)), vec![req])
            .unwrap()[0]
            .status
    };
    wait_until(
        "the RequestAuthentication to reach the waypoint",
        Duration::from_secs(10),
        || with_token(&idp.forged(&claims)) == 401,
    )
    .unwrap();
    assert_eq!(with_token(&idp.token(&claims)), 200);

    // A DestinationRule, as kubectl applies it: it reaches the waypoint, read as its file
    // reader reads it (the rule's defaults filled in).
    kubectl(
        &cluster,
        &kubeconfig,
        &["apply"],
        Some("apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: reviews-sticky, namespace: default}\nspec:\n  host: reviews\n  trafficPolicy:\n    loadBalancer:\n      consistentHash: {httpHeaderName: x-user}\n"),
    );
    wait_until(
        "the DestinationRule to reach the waypoint",
        Duration::from_secs(10),
        || {
            ambit_netns_lab::http_get(&cluster.nodes[1].ns, admin, "/config_dump").is_ok_and(
                |(_, dump)| {
                    let dump: serde_json::Value = serde_json::from_str(&dump).unwrap_or_default();
                    dump["waypointDestinationRules"]["rules"][0]["trafficPolicy"]
                        == serde_json::json!({
                            "loadBalancer": {"consistentHash": {
                                "key": {"httpHeaderName": "x-user"},
                                "algorithm": {"ringHash": {"minimumRingSize": 1024}},
                            }},
                            "connectionPool": {
                                "maxConnections": "unlimited",
                                "http2MaxRequests": "unlimited",
                                "http1MaxPendingRequests": "unlimited",
                                "maxRetries": "unlimited",
                                "connectTimeout": "10s",
                            },
                            "outlierDetection": null,
                        })
                },
            )
        },
    )
    .unwrap_or_else(|e| panic!("{e}; control:\n{}", l7.log()));

    // The control server goes away: the waypoint keeps enforcing what it holds.
    l7.stop(&cluster.lab).unwrap();
    assert_eq!(with_token(&idp.forged(&claims)), 401);
    assert_eq!(get_and_delete(&cluster), (200, 200));
    // A fresh waypoint without it is never ready.
    let late = cluster
        .spawn_istiod_waypoint(&IstiodPod {
            node: 0,
            name: "late-waypoint",
            ip: LATE_WAYPOINT_IP,
            l7_control: L7Control::Kubernetes {
                address,
                api: &kube,
            },
            ports: (25200, 25220, 25221),
        })
        .unwrap();
    wait_until(
        "the late waypoint to wait for its L7 configuration only",
        Duration::from_secs(30),
        || {
            matches!(cluster.waypoint_readiness(&late),
                Ok((500, body)) if body.trim() == "not ready, pending: L7 configuration, proxy")
        },
    )
    .unwrap_or_else(|e| {
        panic!(
            "{e}: {:?}\n{}",
            cluster.waypoint_readiness(&late),
            log(&late)
        )
    });
}
