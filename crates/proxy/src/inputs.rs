//! What one proxy instance (the node, in dedicated mode; one pod, in-pod) works with.

use std::sync::{Arc, RwLock};

use ambit_hbone::pool::Pool;
use ambit_identity::CertManager;
use ambit_state::{ProxyState, Workload};

use crate::config::ProxyConfig;
use crate::connections::OpenConnections;
use crate::metrics::Metrics;
use crate::socket::SocketFactory;

/// The mesh state, replaced whole when configuration changes.
#[derive(Clone)]
pub struct SharedState(Arc<RwLock<Arc<ProxyState>>>);

impl SharedState {
    pub fn new(state: ProxyState) -> SharedState {
        SharedState(Arc::new(RwLock::new(Arc::new(state))))
    }

    pub fn get(&self) -> Arc<ProxyState> {
        match self.0.read() {
            Ok(guard) => guard.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    pub fn replace(&self, state: ProxyState) {
        let mut guard = match self.0.write() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        *guard = Arc::new(state);
    }
}

/// Who this proxy acts for: `PROXY_WORKLOAD_INFO` in dedicated mode, the ZDS
/// `WorkloadInfo` in-pod. Resolved against the configured workloads, never from an IP.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct LocalIdentity {
    pub namespace: String,
    pub name: String,
    pub service_account: String,
}

pub struct ProxyInputs {
    pub cfg: Arc<ProxyConfig>,
    pub state: SharedState,
    pub certs: Arc<CertManager>,
    pub metrics: Metrics,
    pub sockets: Arc<dyn SocketFactory>,
    pub local: LocalIdentity,
    /// This node's name, to prefer the local copy when a workload name is ambiguous.
    pub node: Option<String>,
    pub pool: Pool,
    /// With `ENABLE_ORIG_SRC` unset, whether to connect to the app from the client's IP.
    /// In-pod the agent's connmark routing returns the replies to us; in dedicated mode
    /// nothing does, so there it stays off unless asked for.
    pub spoof_by_default: bool,
    /// The connections open right now (`/config_dump`'s `workloadState`).
    pub connections: Arc<OpenConnections>,
}

impl ProxyInputs {
    /// The workload an inbound connection to `local_ip` reaches: this proxy's own workload,
    /// and only if `local_ip` is one of its addresses. Never another workload that happens
    /// to own the address in the configuration.
    pub fn serving_workload(
        &self,
        state: &ProxyState,
        local_ip: std::net::IpAddr,
    ) -> Result<Arc<Workload>, String> {
        let local = self.require_local_workload(state)?;
        if !local.workload_ips.contains(&local_ip) {
            return Err(format!(
                "{local_ip} is not an address of workload {}/{}",
                local.namespace, local.name
            ));
        }
        Ok(local)
    }

    /// [`ProxyInputs::local_workload`], or the error that says which workload is missing.
    pub fn require_local_workload(&self, state: &ProxyState) -> Result<Arc<Workload>, String> {
        self.local_workload(state).ok_or_else(|| {
            format!(
                "this proxy's workload {}/{} (service account {}) is not in the configuration",
                self.local.namespace, self.local.name, self.local.service_account
            )
        })
    }

    /// The workload this proxy serves, as currently configured.
    pub fn local_workload(&self, state: &ProxyState) -> Option<Arc<Workload>> {
        state.find_local_workload(
            &self.local.namespace,
            &self.local.name,
            &self.local.service_account,
            self.node.as_deref(),
        )
    }
}
