//! `ambit control` in a lab: the mesh in a watched directory, a CA directory, one bearer
//! token per node, and the environment that points a node proxy (ambit's or Istio's) at it
//! for both xDS and certificates, as istiod would be reached.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};

use super::{http_get, wait_until, Lab, Process};

/// The port istiod serves xDS and the CA on.
pub const CONTROL_PORT: u16 = 15012;
/// Where the control server's operator endpoints listen, inside its namespace.
pub const CONTROL_ADMIN: &str = "127.0.0.1:15014";
/// The mesh file the lab writes in the watched directory.
pub const MESH_FILE: &str = "mesh.yaml";

/// A control server of the lab (running or stopped) and what its clients need.
pub struct ControlPlane {
    pub ns: String,
    pub listen: SocketAddr,
    pub mesh_dir: PathBuf,
    pub ca_dir: PathBuf,
    pub tokens_path: PathBuf,
    ambit: PathBuf,
    /// (node, token file).
    tokens: Vec<(String, PathBuf)>,
    pub process: Option<Process>,
    starts: u32,
    /// More arguments for `ambit control` (limits, say).
    pub extra_args: Vec<String>,
}

impl ControlPlane {
    /// Writes the mesh directory (with `mesh`), and a token per node (bound to that node);
    /// `ca_dir` must already hold a plug-in CA, or be empty for an ephemeral root.
    pub fn prepare(
        lab: &Lab,
        ns: &str,
        listen: SocketAddr,
        ambit: &Path,
        ca_dir: &Path,
        nodes: &[&str],
        mesh: &str,
    ) -> anyhow::Result<ControlPlane> {
        // Named after its namespace: a lab may run two (istiod's stand-in and the L7 one).
        let mesh_dir = lab.dir.path().join(format!("control-mesh-{ns}"));
        std::fs::create_dir_all(&mesh_dir)?;
        std::fs::write(mesh_dir.join(MESH_FILE), mesh)?;
        let mut yaml = String::new();
        let mut tokens = Vec::new();
        for node in nodes {
            let token = format!("lab-{node}-{:016x}", rand::random::<u64>());
            yaml.push_str(&format!("- token: {token}\n  node: {node}\n"));
            let file = lab.dir.path().join(format!("token-{ns}-{node}"));
            std::fs::write(&file, &token)?;
            tokens.push((node.to_string(), file));
        }
        let tokens_path = lab.dir.path().join(format!("tokens-{ns}.yaml"));
        std::fs::write(&tokens_path, yaml)?;
        Ok(ControlPlane {
            ns: ns.to_string(),
            listen,
            mesh_dir,
            ca_dir: ca_dir.to_path_buf(),
            tokens_path,
            ambit: ambit.to_path_buf(),
            tokens,
            process: None,
            starts: 0,
            extra_args: Vec::new(),
        })
    }

    /// Starts the server and waits until it reports ready.
    pub fn start(&mut self, lab: &Lab) -> anyhow::Result<()> {
        if self.process.is_some() {
            bail!("the control server is already running");
        }
        self.starts += 1;
        let mesh = self.mesh_dir.display().to_string();
        let ca = self.ca_dir.display().to_string();
        let tokens = self.tokens_path.display().to_string();
        let listen = self.listen.to_string();
        let mut args = vec![
            "control",
            "--mesh",
            &mesh,
            "--ca",
            &ca,
            "--tokens",
            &tokens,
            "--listen",
            &listen,
            "--admin",
            CONTROL_ADMIN,
        ];
        args.extend(self.extra_args.iter().map(String::as_str));
        let process = lab.spawn(
            &self.ns,
            &format!("control-{}", self.starts),
            &self.ambit,
            &args,
            &[("RUST_LOG", "info".to_string())],
        )?;
        let admin: SocketAddr = CONTROL_ADMIN.parse()?;
        let ns = self.ns.clone();
        let ready = wait_until(
            "the control server to be ready",
            Duration::from_secs(20),
            || {
                !lab.is_running(process.pid)
                    || matches!(http_get(&ns, admin, "/ready"), Ok((200, _)))
            },
        );
        if ready.is_err() || !lab.is_running(process.pid) {
            let log = std::fs::read_to_string(&process.log).unwrap_or_default();
            bail!("ambit control did not become ready; its log:\n{log}");
        }
        self.process = Some(process);
        Ok(())
    }

    /// Stops the server (SIGTERM) and waits for it to exit.
    pub fn stop(&mut self, lab: &Lab) -> anyhow::Result<()> {
        let process = self
            .process
            .take()
            .context("the control server is not running")?;
        lab.signal_and_wait(
            process.pid,
            nix::sys::signal::Signal::SIGTERM,
            Duration::from_secs(10),
        )?;
        Ok(())
    }

    /// Replaces the mesh file the way an editor or a config tool would: a new file renamed
    /// over the old one.
    pub fn write_mesh(&self, yaml: &str) -> anyhow::Result<()> {
        let tmp = self.mesh_dir.join(".mesh.yaml.tmp");
        std::fs::write(&tmp, yaml)?;
        std::fs::rename(&tmp, self.mesh_dir.join(MESH_FILE))?;
        Ok(())
    }

    /// The bearer token of `node`.
    pub fn token(&self, node: &str) -> anyhow::Result<String> {
        let (_, file) = self
            .tokens
            .iter()
            .find(|(n, _)| n == node)
            .with_context(|| format!("no token for node {node}"))?;
        Ok(std::fs::read_to_string(file)?)
    }

    /// The server's `/debug` view of its clients.
    pub fn debug(&self) -> anyhow::Result<serde_json::Value> {
        admin_debug(&self.ns)
    }

    /// Its Prometheus text.
    pub fn metrics(&self) -> anyhow::Result<String> {
        admin_get(&self.ns, "/metrics")
    }

    /// The log of the current (or last) run.
    pub fn log(&self) -> String {
        self.process
            .as_ref()
            .and_then(|p| std::fs::read_to_string(&p.log).ok())
            .unwrap_or_default()
    }

    /// What points a node proxy on `node` at this server, for xDS and certificates, as a
    /// ztunnel on Kubernetes points at istiod (verified by the IP in the serving cert).
    pub fn proxy_env(&self, node: &str) -> anyhow::Result<Vec<(&'static str, String)>> {
        let token = self
            .tokens
            .iter()
            .find(|(n, _)| n == node)
            .map(|(_, f)| f.display().to_string())
            .with_context(|| format!("no token for node {node}"))?;
        let address = format!("https://{}", self.listen);
        let root = self
            .ca_dir
            .join(ambit_identity::ca::ROOT_CERT_FILE)
            .display()
            .to_string();
        Ok(vec![
            ("XDS_ADDRESS", address.clone()),
            ("CA_ADDRESS", address),
            ("XDS_ROOT_CA", root.clone()),
            ("CA_ROOT_CA", root),
            ("AUTH_TOKEN", token),
            ("CLUSTER_ID", "cluster1".to_string()),
            ("POD_NAME", format!("ztunnel-{node}")),
            ("POD_NAMESPACE", "istio-system".to_string()),
            ("RUST_LOG", "info".to_string()),
            ("ISTIO_META_DNS_CAPTURE", "false".to_string()),
        ])
    }
}

/// `path` of a control server's operator port in `ns`, which must answer 200.
pub(crate) fn admin_get(ns: &str, path: &str) -> anyhow::Result<String> {
    let (status, body) = http_get(ns, CONTROL_ADMIN.parse()?, path)?;
    if status != 200 {
        bail!("{path} answered {status}: {body}");
    }
    Ok(body)
}

/// A control server's `/debug` JSON.
pub(crate) fn admin_debug(ns: &str) -> anyhow::Result<serde_json::Value> {
    serde_json::from_str(&admin_get(ns, "/debug")?).context("/debug is not JSON")
}
