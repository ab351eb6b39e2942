//! The demo's waypoint on Kubernetes: a second waypoint, started as istiod starts its pod
//! (istiod's variables, token, root and labels; `ambit control` standing in for istiod for
//! the workloads and the CA), fronting `ratings`, its L7 policy applied with kubectl to a
//! test API server and served by `ambit control --kubernetes`. A DELETE refused by the
//! first policy is let through once kubectl applies the second. Each is checked; a miss
//! stops the demo.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};

use ambit_netns_lab::cluster::istiod_pod::{pod_name, IstiodPod, L7Control};
use ambit_netns_lab::cluster::Cluster;
use ambit_netns_lab::control::CONTROL_PORT;
use ambit_netns_lab::kube::KubeLab;
use ambit_netns_lab::kube_control::KubeControl;

pub(crate) const RATINGS_HOST: &str = "ratings.default.svc.cluster.local";
pub(crate) const RATINGS_VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 30);
pub(crate) const RATINGS_PORT: u16 = 80;
/// The second waypoint's pod address (node2's link) and Gateway.
pub(crate) const K8S_WAYPOINT_IP: Ipv4Addr = Ipv4Addr::new(10, 78, 0, 5);
pub(crate) const K8S_GATEWAY: &str = "ratings-waypoint";
/// Its operator ports on node2's loopback (the first waypoint holds the defaults).
const PORTS: (u16, u16, u16) = (25100, 25120, 25121);
const PATH: &str = "/ratings/1";

/// The mesh's part: the waypoint's pod (named as a Deployment's pod is), and `ratings`
/// behind it on the apps' `app_port`.
pub(crate) fn mesh_parts(app_port: u16) -> (String, String) {
    let pod = pod_name(K8S_GATEWAY);
    let workload = format!(
        r#"- uid: cluster1//v1/Pod/default/{pod}
  name: {pod}
  namespace: default
  serviceAccount: {K8S_GATEWAY}
  trustDomain: cluster.local
  workloadIps: ["{K8S_WAYPOINT_IP}"]
  protocol: HBONE
  node: node2
  canonicalName: {K8S_GATEWAY}
  workloadName: {K8S_GATEWAY}
"#
    );
    let service = format!(
        r#"- name: ratings
  namespace: default
  hostname: {RATINGS_HOST}
  vips: ["/{RATINGS_VIP}"]
  ports: {{{RATINGS_PORT}: {app_port}}}
  waypoint: {{destination: "/{K8S_WAYPOINT_IP}", hboneMtlsPort: 15008}}
"#
    );
    (workload, service)
}

fn policy(methods: &str) -> String {
    format!(
        "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {{name: ratings-policy, namespace: default}}\nspec:\n  targetRefs: [{{kind: Service, group: \"\", name: ratings}}]\n  action: ALLOW\n  rules:\n  - from: [{{source: {{principals: [\"cluster.local/ns/default/sa/client\"]}}}}]\n    to: [{{operation: {{methods: {methods}}}}}]\n"
    )
}

/// What the second waypoint did.
pub(crate) struct OnKubernetes {
    before: (u16, u16),
    after: (u16, u16),
    applied_in: Duration,
}

/// `kubectl` in node1's namespace (where the API server listens).
fn kubectl(cluster: &Cluster, kubeconfig: &Path, yaml: &str, file: &str) -> anyhow::Result<()> {
    let path: PathBuf = cluster.lab.dir.path().join(file);
    std::fs::write(&path, yaml)?;
    cluster.lab.exec(
        &cluster.nodes[0].ns,
        &[
            "kubectl",
            &format!("--kubeconfig={}", kubeconfig.display()),
            "apply",
            "--validate=false",
            "-f",
            &path.display().to_string(),
        ],
    )?;
    Ok(())
}

fn get_and_delete(cluster: &Cluster) -> anyhow::Result<(u16, u16)> {
    let replies = cluster.http1_from(
        "client",
        SocketAddr::from((RATINGS_VIP, RATINGS_PORT)),
        RATINGS_HOST,
        &[("GET", PATH), ("DELETE", PATH)],
    )?;
    match replies.as_slice() {
        [get, delete] => Ok((get.status, delete.status)),
        other => bail!(
            "client -> {RATINGS_HOST}: {} answers to two requests",
            other.len()
        ),
    }
}

pub(crate) fn run(cluster: &Cluster, ambit: &Path) -> anyhow::Result<OnKubernetes> {
    ambit_netns_lab::require_tool("kubectl", "kubernetes-client")?;
    let istiod = cluster
        .control
        .as_ref()
        .context("the demo's control server")?;
    let names: Vec<String> = cluster.nodes.iter().map(|n| n.name.clone()).collect();
    let kube = KubeLab::start(&cluster.nodes[0].ns, cluster.nodes[0].ip, &names)?;
    let kubeconfig = cluster.lab.dir.path().join("demo-user.kubeconfig");
    std::fs::write(&kubeconfig, kube.kubeconfig_for(&kube.api.admin_token()))?;
    kubectl(
        cluster,
        &kubeconfig,
        &format!("apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: {K8S_GATEWAY}, namespace: default}}\nspec:\n  gatewayClassName: istio-waypoint\n  listeners: [{{name: mesh, port: 15008, protocol: HBONE}}]\n"),
        "demo-gateway.yaml",
    )?;
    // `ratings` uses that waypoint, as its label says.
    kubectl(
        cluster,
        &kubeconfig,
        &format!("apiVersion: v1\nkind: Service\nmetadata:\n  name: ratings\n  namespace: default\n  labels: {{istio.io/use-waypoint: {K8S_GATEWAY}}}\nspec:\n  ports: [{{name: http, port: {RATINGS_PORT}}}]\n"),
        "demo-service.yaml",
    )?;
    kubectl(cluster, &kubeconfig, &policy("[GET]"), "demo-policy.yaml")?;
    let l7 = KubeControl::start(
        &cluster.lab,
        &cluster.nodes[0].ns,
        SocketAddr::from((cluster.nodes[0].ip, CONTROL_PORT)),
        ambit,
        &kube,
        istiod,
    )?;
    let waypoint = cluster.spawn_istiod_waypoint(&IstiodPod {
        node: 1,
        name: K8S_GATEWAY,
        ip: K8S_WAYPOINT_IP,
        l7_control: L7Control::Kubernetes {
            address: l7.listen,
            api: &kube,
        },
        ports: PORTS,
    })?;
    let ready = ambit_netns_lab::wait_until(
        "the waypoint started from istiod's pod to be ready",
        Duration::from_secs(30),
        || matches!(cluster.waypoint_readiness(&waypoint), Ok((200, _))),
    );
    if ready.is_err() {
        bail!(
            "the waypoint started from istiod's pod did not become ready; its log:\n{}",
            std::fs::read_to_string(&waypoint.process.log).unwrap_or_default()
        );
    }
    let before = get_and_delete(cluster)?;
    if before != (200, 403) {
        bail!(
            "client -> ratings before the change: GET {}, DELETE {} (expected 200, 403)",
            before.0,
            before.1
        );
    }
    let started = std::time::Instant::now();
    kubectl(
        cluster,
        &kubeconfig,
        &policy("[GET, DELETE]"),
        "demo-policy-2.yaml",
    )?;
    let mut after = before;
    let changed = ambit_netns_lab::wait_until(
        "the policy applied with kubectl to reach the waypoint",
        Duration::from_secs(20),
        || {
            after = get_and_delete(cluster).unwrap_or(after);
            after == (200, 200)
        },
    );
    if changed.is_err() {
        bail!("the policy applied with kubectl did not reach the waypoint within 20 s; ambit control --kubernetes:\n{}", l7.log());
    }
    Ok(OnKubernetes {
        before,
        after,
        applied_in: started.elapsed(),
    })
}

impl OnKubernetes {
    pub(crate) fn print(&self) {
        println!(
            "  on Kubernetes: a waypoint started as istiod starts its pod ({K8S_GATEWAY}, {K8S_WAYPOINT_IP}:15008), its L7 policy from `ambit control --kubernetes`; client -> ratings: GET {}, DELETE {}; `kubectl apply` of a policy allowing DELETE: GET {}, DELETE {} (seen after {} ms)",
            self.before.0,
            self.before.1,
            self.after.0,
            self.after.1,
            self.applied_in.as_millis()
        );
    }
}
