//! `ambit control --kubernetes` in a lab node, as the control chart runs it beside istiod:
//! the lab's API server read with a service account's token (`istio-system/ambit-control`),
//! its serving certificate from the cluster's control server standing in for istiod's CA
//! (a token bound to its SPIFFE id), its operator port on the node's loopback.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context};

use crate::cluster::waypoint::grant_token;
use crate::control::{ControlPlane, CONTROL_ADMIN};
use crate::kube::KubeLab;
use crate::{http_get, wait_until, Lab, Process};

/// Its identity, as the chart installs it.
pub const IDENTITY: &str = "spiffe://cluster.local/ns/istio-system/sa/ambit-control";

pub struct KubeControl {
    pub ns: String,
    pub listen: SocketAddr,
    pub process: Option<Process>,
}

impl KubeControl {
    /// Starts it on `ns` at `listen` and waits until every watch has listed.
    pub fn start(
        lab: &Lab,
        ns: &str,
        listen: SocketAddr,
        ambit: &Path,
        kube: &KubeLab,
        istiod: &ControlPlane,
    ) -> anyhow::Result<KubeControl> {
        let api_token = format!("lab-ambit-control-{:016x}", rand::random::<u64>());
        kube.api.add_token(
            &api_token,
            ambit_fake_apiserver::User::service_account("istio-system", "ambit-control"),
        );
        let kubeconfig = lab.dir.path().join("ambit-control.kubeconfig");
        std::fs::write(&kubeconfig, kube.kubeconfig_for(&api_token))?;
        // Its projected token for istio-ca, which the CA accepts for its identity.
        let ca_token = format!("lab-ambit-control-ca-{:016x}", rand::random::<u64>());
        grant_token(istiod, &ca_token, IDENTITY)?;
        let ca_token_file = lab.dir.path().join("ambit-control.ca-token");
        std::fs::write(&ca_token_file, &ca_token)?;
        let root = istiod.ca_dir.join(ambit_identity::ca::ROOT_CERT_FILE);
        let listen_text = listen.to_string();
        let kubeconfig_text = kubeconfig.display().to_string();
        let process = lab.spawn(
            ns,
            "control-kubernetes",
            ambit,
            &[
                "control",
                "--kubernetes",
                "--kubeconfig",
                &kubeconfig_text,
                "--listen",
                &listen_text,
                "--admin",
                CONTROL_ADMIN,
            ],
            &[
                ("CA_ADDRESS", format!("https://{}", istiod.listen)),
                ("CA_ROOT_CA", root.display().to_string()),
                ("AUTH_TOKEN", ca_token_file.display().to_string()),
                ("CLUSTER_ID", "cluster1".to_string()),
                ("RUST_LOG", "info".to_string()),
            ],
        )?;
        let admin: SocketAddr = CONTROL_ADMIN.parse()?;
        let up = wait_until(
            "ambit control --kubernetes to be ready",
            Duration::from_secs(30),
            || {
                !lab.is_running(process.pid)
                    || matches!(http_get(ns, admin, "/ready"), Ok((200, _)))
            },
        );
        if up.is_err() || !lab.is_running(process.pid) {
            bail!(
                "ambit control --kubernetes did not become ready; its log:\n{}",
                std::fs::read_to_string(&process.log).unwrap_or_default()
            );
        }
        Ok(KubeControl {
            ns: ns.to_string(),
            listen,
            process: Some(process),
        })
    }

    /// Stops it (SIGTERM) and waits for it to exit.
    pub fn stop(&mut self, lab: &Lab) -> anyhow::Result<()> {
        let process = self.process.take().context("it is not running")?;
        lab.signal_and_wait(
            process.pid,
            nix::sys::signal::Signal::SIGTERM,
            Duration::from_secs(10),
        )?;
        Ok(())
    }

    /// Its `/debug` JSON.
    pub fn debug(&self) -> anyhow::Result<serde_json::Value> {
        crate::control::admin_debug(&self.ns)
    }

    /// Its Prometheus text.
    pub fn metrics(&self) -> anyhow::Result<String> {
        crate::control::admin_get(&self.ns, "/metrics")
    }

    /// Its log.
    pub fn log(&self) -> String {
        self.process
            .as_ref()
            .and_then(|p| std::fs::read_to_string(&p.log).ok())
            .unwrap_or_default()
    }
}
