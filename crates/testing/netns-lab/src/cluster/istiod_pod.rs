//! A waypoint started as istiod starts its pod: `proxy waypoint --domain … --serviceCluster
//! …` and istiod's environment (`CA_ADDR` with no scheme, `PROXY_CONFIG` naming the
//! discovery address, `ISTIO_META_*`), its token and root at the pod's paths
//! (`var/run/secrets/...` under the pod's directory, the process's working directory, so the
//! defaults are the ones read) and its labels file. The cluster's control server stands in
//! for istiod (workloads and the CA); the L7 configuration comes from a second `ambit
//! control`. Only the operator ports are ambit's own settings: the pod shares its node's
//! network namespace with the node's proxies.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;

use anyhow::Context;

use super::waypoint::{grant_token, WaypointPod};
use super::Cluster;
use crate::control::ControlPlane;
use crate::http_get;
use crate::kube::KubeLab;

/// The server of the L7 configuration, and how it learns the pod's token.
pub enum L7Control<'a> {
    /// `ambit control` with files: its tokens file gets the token (when it runs).
    File(&'a ControlPlane),
    /// `ambit control --kubernetes` at this address: the lab's API server gets the token,
    /// projected for the audience `istio-ca`, as the kubelet would mount it.
    Kubernetes {
        address: SocketAddr,
        api: &'a KubeLab,
    },
    /// None: `AMBIT_CONTROL_ADDRESS` set empty.
    None,
}

/// How to start one.
pub struct IstiodPod<'a> {
    pub node: usize,
    /// The Gateway's name, its service account's and the pod's.
    pub name: &'a str,
    pub ip: Ipv4Addr,
    /// Where the L7 configuration comes from (`AMBIT_CONTROL_ADDRESS`).
    pub l7_control: L7Control<'a>,
    /// The admin, stats and readiness ports on the node's loopback.
    pub ports: (u16, u16, u16),
}

/// The pod's name, as a Deployment's pods are named: the mesh must hold a workload of
/// that name for the waypoint to find itself.
pub fn pod_name(gateway: &str) -> String {
    format!("{gateway}-5d9c8b7f6-x2x4q")
}

impl Cluster {
    /// Starts the waypoint and returns at once (it may never become ready: see
    /// [`Cluster::waypoint_readiness`]).
    pub fn spawn_istiod_waypoint(&self, pod: &IstiodPod<'_>) -> anyhow::Result<WaypointPod> {
        let plane = self
            .control
            .as_ref()
            .context("istiod's stand-in is the cluster's control server")?;
        let ns = &self.nodes[pod.node].ns;
        let name = pod.name;
        self.lab.exec(
            ns,
            &[
                "ip",
                "addr",
                "add",
                &format!("{}/24", pod.ip),
                "dev",
                "eth0",
            ],
        )?;
        let identity = format!("spiffe://cluster.local/ns/default/sa/{name}");
        let token = format!("lab-istio-pod-{:016x}", rand::random::<u64>());
        grant_token(plane, &token, &identity)?;
        let l7_address = match &pod.l7_control {
            L7Control::File(l7) => {
                // A stopped server learns nothing (its address is what the pod is given).
                if l7.process.is_some() {
                    grant_token(l7, &token, &identity)?;
                }
                l7.listen.to_string()
            }
            L7Control::Kubernetes { address, api } => {
                api.api.add_token_with_audiences(
                    &token,
                    ambit_fake_apiserver::User::service_account("default", name),
                    &["istio-ca"],
                );
                address.to_string()
            }
            L7Control::None => String::new(),
        };
        // The pod's mounts, under its own root.
        let root: PathBuf = self.lab.dir.path().join(format!("pod-{name}"));
        let secrets = root.join("var/run/secrets");
        std::fs::create_dir_all(secrets.join("tokens"))?;
        std::fs::create_dir_all(secrets.join("istio"))?;
        std::fs::create_dir_all(root.join("etc/istio/pod"))?;
        std::fs::write(secrets.join("tokens/istio-token"), &token)?;
        std::fs::copy(
            plane.ca_dir.join(ambit_identity::ca::ROOT_CERT_FILE),
            secrets.join("istio/root-cert.pem"),
        )?;
        std::fs::write(
            root.join("etc/istio/pod/labels"),
            format!(
                "gateway.istio.io/managed=\"istio.io-mesh-controller\"\n\
                 gateway.networking.k8s.io/gateway-class-name=\"istio-waypoint\"\n\
                 gateway.networking.k8s.io/gateway-name=\"{name}\"\n\
                 istio.io/dataplane-mode=\"none\"\n"
            ),
        )?;
        let istiod = plane.listen.to_string();
        let (admin, stats, ready) = pod.ports;
        let mut env: Vec<(&str, String)> = vec![
            // istiod's template, in its order.
            ("ISTIO_META_SERVICE_ACCOUNT", name.to_string()),
            ("ISTIO_META_NODE_NAME", self.nodes[pod.node].name.clone()),
            ("PILOT_CERT_PROVIDER", "istiod".to_string()),
            ("CA_ADDR", istiod.clone()),
            ("POD_NAME", pod_name(name)),
            ("POD_NAMESPACE", "default".to_string()),
            ("INSTANCE_IP", pod.ip.to_string()),
            ("SERVICE_ACCOUNT", name.to_string()),
            ("HOST_IP", self.nodes[pod.node].ip.to_string()),
            ("ISTIO_CPU_LIMIT", "0".to_string()),
            (
                "PROXY_CONFIG",
                format!("{{\"discoveryAddress\":\"{istiod}\"}}\n"),
            ),
            ("GOMEMLIMIT", "1073741824".to_string()),
            ("ISTIO_META_CLUSTER_ID", "cluster1".to_string()),
            ("ISTIO_META_INTERCEPTION_MODE", "REDIRECT".to_string()),
            ("ISTIO_META_WORKLOAD_NAME", name.to_string()),
            (
                "ISTIO_META_OWNER",
                format!("kubernetes://apis/apps/v1/namespaces/default/deployments/{name}"),
            ),
            ("ISTIO_META_MESH_ID", "cluster.local".to_string()),
            ("TRUST_DOMAIN", "cluster.local".to_string()),
            // The lab's own: where the labels are, the ports, the log.
            (
                "AMBIT_POD_INFO_DIR",
                root.join("etc/istio/pod").display().to_string(),
            ),
            (
                "AMBIT_HBONE_ADDR",
                SocketAddr::from((pod.ip, 15008)).to_string(),
            ),
            ("AMBIT_ADMIN_ADDR", format!("127.0.0.1:{admin}")),
            ("AMBIT_STATS_ADDR", format!("127.0.0.1:{stats}")),
            ("AMBIT_READINESS_ADDR", format!("127.0.0.1:{ready}")),
            ("RUST_LOG", "info".to_string()),
        ];
        env.push(("AMBIT_CONTROL_ADDRESS", l7_address));
        let domain = "default.svc.cluster.local".to_string();
        let cluster_name = format!("{name}.default");
        let args = [
            "proxy",
            "waypoint",
            "--domain",
            &domain,
            "--serviceCluster",
            &cluster_name,
            "--proxyLogLevel",
            "warning",
            "--proxyComponentLogLevel",
            "misc:error",
            "--log_output_level",
            "default:info",
        ];
        let process = self.lab.spawn_at(
            ns,
            &format!("waypoint-{name}"),
            &self.ambit,
            &args,
            &env,
            Some(&root),
        )?;
        Ok(WaypointPod {
            process,
            node: pod.node,
            ip: pod.ip,
            identity,
            ready_port: ready,
            stats_port: stats,
        })
    }

    /// The waypoint's `/healthz/ready` answer: its status and body.
    pub fn waypoint_readiness(&self, waypoint: &WaypointPod) -> anyhow::Result<(u16, String)> {
        http_get(
            &self.nodes[waypoint.node].ns,
            ([127, 0, 0, 1], waypoint.ready_port).into(),
            "/healthz/ready",
        )
    }
}
