//! A waypoint pod in a cluster: `ambit waypoint` at an extra address of a node's link (a
//! pod outside the CNI chain, as a waypoint's is never captured), configured as Istio
//! configures one: from the control server when the cluster has one (delta xDS and its CA,
//! with a token bound to the waypoint's identity, as a pod's service-account token is),
//! else from the cluster's mesh file and CA directory. Its policies come from a file, or
//! from the control server on a second stream, which serves the AuthorizationPolicy
//! manifests of its mesh directory ([`Cluster::serve_manifests`]).

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};

use super::Cluster;
use crate::control::ControlPlane;
use crate::l7::{WAYPOINT_ADMIN, WAYPOINT_READY, WAYPOINT_STATS};
use crate::{http_get, wait_until, Lab, Process};

/// A running waypoint pod.
pub struct WaypointPod {
    pub process: Process,
    /// The node whose namespace it runs in.
    pub node: usize,
    /// Its address; HBONE on port 15008.
    pub ip: Ipv4Addr,
    pub identity: String,
    /// Its readiness and stats ports, on the node's loopback.
    pub ready_port: u16,
    pub stats_port: u16,
}

impl WaypointPod {
    pub fn hbone_addr(&self) -> SocketAddr {
        SocketAddr::from((self.ip, 15008))
    }
}

impl Cluster {
    /// Starts `ambit waypoint` as pod `name` (service account `name`, namespace `default`;
    /// the mesh must hold a workload of that name at `ip`) at `ip` on node `node`'s link,
    /// and waits until it is ready. It enforces the AuthorizationPolicy documents of the
    /// file `policies`, or without one those the control server serves. Its operator ports
    /// are on the node's loopback: admin [`WAYPOINT_ADMIN`], stats [`WAYPOINT_STATS`],
    /// readiness [`WAYPOINT_READY`].
    pub fn start_waypoint(
        &self,
        node: usize,
        name: &str,
        ip: Ipv4Addr,
        policies: Option<&Path>,
    ) -> anyhow::Result<WaypointPod> {
        let ns = &self.nodes[node].ns;
        self.lab.exec(
            ns,
            &["ip", "addr", "add", &format!("{ip}/24"), "dev", "eth0"],
        )?;
        let identity = format!("spiffe://cluster.local/ns/default/sa/{name}");
        let mut env: Vec<(&str, String)> = match &self.control {
            Some(plane) => {
                let token = grant_identity_token(plane, &self.lab, &identity)?;
                let address = format!("https://{}", plane.listen);
                let root = plane
                    .ca_dir
                    .join(ambit_identity::ca::ROOT_CERT_FILE)
                    .display()
                    .to_string();
                vec![
                    ("XDS_ADDRESS", address.clone()),
                    // Its L7 configuration on a stream of its own, to the same server.
                    ("AMBIT_CONTROL_ADDRESS", address.clone()),
                    ("CA_ADDRESS", address),
                    ("XDS_ROOT_CA", root.clone()),
                    ("CA_ROOT_CA", root),
                    ("AUTH_TOKEN", token.display().to_string()),
                ]
            }
            None => vec![
                ("LOCAL_XDS_PATH", self.config_path.display().to_string()),
                ("LOCAL_CA_DIR", self.ca_dir.display().to_string()),
            ],
        };
        env.extend([
            ("POD_NAME", name.to_string()),
            ("POD_NAMESPACE", "default".to_string()),
            ("SERVICE_ACCOUNT", name.to_string()),
            ("CLUSTER_ID", "cluster1".to_string()),
            ("INSTANCE_IP", ip.to_string()),
            (
                "AMBIT_HBONE_ADDR",
                SocketAddr::from((ip, 15008)).to_string(),
            ),
            ("AMBIT_ADMIN_ADDR", format!("127.0.0.1:{WAYPOINT_ADMIN}")),
            ("AMBIT_STATS_ADDR", format!("127.0.0.1:{WAYPOINT_STATS}")),
            (
                "AMBIT_READINESS_ADDR",
                format!("127.0.0.1:{WAYPOINT_READY}"),
            ),
            ("TERMINATION_GRACE_PERIOD_SECONDS", "15".to_string()),
            ("RUST_LOG", "info".to_string()),
        ]);
        match (policies, &self.control) {
            (Some(p), _) => env.push(("AMBIT_WAYPOINT_CONFIG", p.display().to_string())),
            (None, Some(_)) => {}
            (None, None) => env.push(("AMBIT_WAYPOINT_NO_L7_POLICY", "true".to_string())),
        }
        let process = self.lab.spawn(
            ns,
            &format!("waypoint-{name}"),
            &self.ambit,
            &["waypoint"],
            &env,
        )?;
        let ready: SocketAddr = ([127, 0, 0, 1], WAYPOINT_READY).into();
        let up = wait_until(
            "the waypoint to report ready",
            Duration::from_secs(30),
            || {
                !self.lab.is_running(process.pid)
                    || matches!(http_get(ns, ready, "/healthz/ready"), Ok((200, _)))
            },
        );
        if up.is_err() || !self.lab.is_running(process.pid) {
            bail!(
                "the waypoint {name} did not become ready; its log:\n{}",
                std::fs::read_to_string(&process.log).unwrap_or_default()
            );
        }
        Ok(WaypointPod {
            process,
            node,
            ip,
            identity,
            ready_port: WAYPOINT_READY,
            stats_port: WAYPOINT_STATS,
        })
    }

    /// The waypoint's Prometheus text (`/stats/prometheus`).
    pub fn waypoint_metrics(&self, waypoint: &WaypointPod) -> anyhow::Result<String> {
        let (status, body) = http_get(
            &self.nodes[waypoint.node].ns,
            ([127, 0, 0, 1], waypoint.stats_port).into(),
            "/stats/prometheus",
        )?;
        if status != 200 {
            bail!("the waypoint's /stats/prometheus answered {status}");
        }
        Ok(body)
    }
}

impl Cluster {
    /// Adds `yaml` (Kubernetes-shaped manifests: a waypoint's AuthorizationPolicies) to the
    /// control server's mesh directory as `file`, and waits until the server serves the
    /// mesh with it; its refusal is an error.
    pub fn serve_manifests(&self, file: &str, yaml: &str) -> anyhow::Result<()> {
        let plane = self
            .control
            .as_ref()
            .context("serving manifests needs the cluster's control server")?;
        let mesh = |debug: &serde_json::Value| {
            let generation = debug.pointer("/mesh/generation").and_then(|g| g.as_u64());
            let error = debug
                .pointer("/mesh/error")
                .and_then(|e| e.as_str().map(str::to_string));
            (generation, error)
        };
        let (before, _) = mesh(&plane.debug()?);
        let before = before.context("the control server's /debug has no mesh.generation")?;
        // Written aside and renamed, so the server never reads half a file.
        let tmp = plane.mesh_dir.join(format!(".{file}.tmp"));
        std::fs::write(&tmp, yaml)?;
        std::fs::rename(&tmp, plane.mesh_dir.join(file))?;
        let mut error = None;
        wait_until(
            "the control server to serve the new manifests",
            Duration::from_secs(20),
            || match plane.debug().map(|d| mesh(&d)) {
                Ok((_, Some(e))) => {
                    error = Some(e);
                    true
                }
                Ok((Some(g), None)) => g > before,
                _ => false,
            },
        )
        .with_context(|| format!("ambit control's log:\n{}", plane.log()))?;
        match error {
            Some(e) => bail!("ambit control refused {file}: {e}"),
            None => Ok(()),
        }
    }
}

/// Adds a token bound to `identity` to the control server's tokens file (replaced whole, as
/// an editor would), waits until the server has loaded it, and returns the token's file.
fn grant_identity_token(
    plane: &ControlPlane,
    lab: &Lab,
    identity: &str,
) -> anyhow::Result<PathBuf> {
    let token = format!("lab-wp-{:016x}", rand::random::<u64>());
    let file = lab.dir.path().join(format!(
        "token-{}",
        identity.rsplit('/').next().unwrap_or("waypoint")
    ));
    std::fs::write(&file, &token)?;
    grant_token(plane, &token, identity)?;
    Ok(file)
}

/// Adds `token`, bound to `identity`, to the server's tokens file and waits until it is
/// loaded.
pub fn grant_token(plane: &ControlPlane, token: &str, identity: &str) -> anyhow::Result<()> {
    let count = |debug: &serde_json::Value| debug.pointer("/tokens/count").and_then(|c| c.as_u64());
    let before =
        count(&plane.debug()?).context("the control server's /debug has no tokens.count")?;
    let mut tokens = std::fs::read_to_string(&plane.tokens_path)?;
    tokens.push_str(&format!("- token: {token}\n  identity: {identity}\n"));
    let tmp = plane.tokens_path.with_extension("tmp");
    std::fs::write(&tmp, tokens)?;
    std::fs::set_permissions(&tmp, std::fs::metadata(&plane.tokens_path)?.permissions())?;
    std::fs::rename(&tmp, &plane.tokens_path)?;
    wait_until(
        "the control server to load the waypoint's token",
        Duration::from_secs(20),
        || plane.debug().ok().and_then(|d| count(&d)) == Some(before + 1),
    )
    .with_context(|| format!("ambit control's log:\n{}", plane.log()))?;
    Ok(())
}
