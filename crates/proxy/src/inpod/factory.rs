//! Starts and stops the proxy of one pod.

use std::sync::Arc;

use ambit_identity::{CertManager, SpiffeId};
use ambit_inpod::proto::WorkloadInfo;
use ambit_inpod::Netns;

use crate::admission::{HandshakeGate, NodeHandshakes};
use crate::config::ProxyConfig;
use crate::connections::OpenConnections;
use crate::drain::{self, DrainTrigger};
use crate::inputs::{LocalIdentity, ProxyInputs, SharedState};
use crate::metrics::Metrics;
use crate::proxy::BoundProxy;

use super::sockets::InPodSocketFactory;

/// What every pod's proxy shares: configuration, mesh state, certificates, metrics.
#[derive(Clone)]
pub struct PodProxyFactory {
    pub cfg: Arc<ProxyConfig>,
    pub state: SharedState,
    pub certs: Arc<CertManager>,
    pub metrics: Metrics,
    pub node: Option<String>,
    pub mark: u32,
    pub reuse_port: bool,
    /// The node-wide count of HBONE handshakes every pod's share draws on.
    pub handshakes: Arc<NodeHandshakes>,
}

pub struct RunningPod {
    pub info: WorkloadInfo,
    /// The identity its certificate was minted for.
    pub identity: SpiffeId,
    /// Its open connections, for `/config_dump`.
    pub connections: Arc<OpenConnections>,
    drain: DrainTrigger,
}

impl RunningPod {
    /// The pod is gone: close its listeners and connections at once.
    pub async fn stop_now(self) {
        self.drain.drain_now().await;
    }

    /// Node shutdown: let its connections finish until `deadline`.
    pub async fn stop_gracefully(self, deadline: std::time::Duration) {
        self.drain.drain(deadline).await;
    }
}

impl PodProxyFactory {
    /// Binds the pod's listeners in its namespace and starts serving. The pod's identity
    /// comes from the workload configured with this name, namespace and service account on
    /// this node, never from an IP address.
    pub fn start(&self, info: &WorkloadInfo, netns: Arc<Netns>) -> Result<RunningPod, String> {
        let local = LocalIdentity {
            namespace: info.namespace.clone(),
            name: info.name.clone(),
            service_account: info.service_account.clone(),
        };
        let state = self.state.get();
        let Some(workload) = state.find_local_workload(
            &local.namespace,
            &local.name,
            &local.service_account,
            self.node.as_deref(),
        ) else {
            return Err(format!(
                "workload {}/{} (service account {}) is not in the configuration{}",
                local.namespace,
                local.name,
                local.service_account,
                self.node
                    .as_deref()
                    .map(|n| format!(" of node {n}"))
                    .unwrap_or_default()
            ));
        };
        let pi = Arc::new(ProxyInputs {
            cfg: self.cfg.clone(),
            state: self.state.clone(),
            certs: self.certs.clone(),
            metrics: self.metrics.clone(),
            sockets: Arc::new(InPodSocketFactory {
                netns,
                mark: self.mark,
                reuse_port: self.reuse_port,
            }),
            local,
            node: self.node.clone(),
            pool: ambit_hbone::Pool::new(self.cfg.pool.clone()),
            spoof_by_default: true,
            connections: Arc::new(OpenConnections::default()),
            handshakes: HandshakeGate::new(self.handshakes.clone(), self.cfg.handshakes),
            names: None,
        });
        let connections = pi.connections.clone();
        let bound = BoundProxy::bind(pi).map_err(|e| e.to_string())?;
        let (trigger, watcher) = drain::new();
        tokio::spawn(bound.run(watcher));
        Ok(RunningPod {
            info: info.clone(),
            identity: workload.identity(),
            connections,
            drain: trigger,
        })
    }
}
