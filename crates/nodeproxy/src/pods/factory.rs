//! Starts and stops the proxy of one pod.

use std::sync::Arc;

use ambit_identity::{CertManager, SpiffeId};
use ambit_zds::proto::WorkloadInfo;
use ambit_zds::Netns;

use crate::admission::{HandshakeGate, NodeHandshakes};
use crate::connections::OpenConnections;
use crate::inputs::{LocalIdentity, ProxyInputs, SharedState};
use crate::metrics::Metrics;
use crate::proxy::BoundProxy;
use crate::settings::ProxyConfig;
use ambit_runtime::drain::{self, DrainTrigger};

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
    /// The DNS proxy every pod gets on 15053, unless `ISTIO_META_DNS_CAPTURE` turned it off.
    pub dns: Option<PodDns>,
    /// On-demand xDS (`XDS_ON_DEMAND=true`), for every pod's decisions.
    pub on_demand: Option<Arc<dyn crate::lookups::OnDemandLookups>>,
}

/// What each pod's DNS server is made from.
#[derive(Clone)]
pub struct PodDns {
    pub cfg: Arc<ambit_dns::DnsConfig>,
    pub metrics: ambit_dns::DnsMetrics,
    /// `ISTIO_META_DNS_PROXY_ADDR`, in the pod's namespace (default `localhost:15053`).
    pub listen: ambit_dns::ListenAddr,
}

pub struct RunningPod {
    pub info: WorkloadInfo,
    /// The identity its certificate was minted for.
    pub identity: SpiffeId,
    /// Its open connections, for `/config_dump`.
    pub connections: Arc<OpenConnections>,
    /// The pod's DNS resolver (mesh names from the state, others forwarded from the pod's
    /// namespace), when the DNS proxy is on.
    pub resolver: Option<Arc<ambit_dns::Resolver>>,
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
        let sockets = Arc::new(InPodSocketFactory {
            netns,
            mark: self.mark,
            reuse_port: self.reuse_port,
        });
        // Bound before anything serves: a port taken in the pod leaves it pending.
        let dns = match &self.dns {
            Some(dns) => Some(self.bind_dns(dns, &local, sockets.clone())?),
            None => None,
        };
        let pi = Arc::new(ProxyInputs {
            cfg: self.cfg.clone(),
            state: self.state.clone(),
            certs: self.certs.clone(),
            metrics: self.metrics.clone(),
            sockets: sockets.clone(),
            local,
            node: self.node.clone(),
            pool: ambit_hbone::Pool::new(self.cfg.pool.clone()),
            spoof_by_default: true,
            connections: Arc::new(OpenConnections::default()),
            handshakes: HandshakeGate::new(self.handshakes.clone(), self.cfg.handshakes),
            names: dns
                .as_ref()
                .map(|(_, r)| r.clone() as Arc<dyn crate::socks5::NameLookup>),
            on_demand: self.on_demand.clone(),
        });
        let connections = pi.connections.clone();
        let bound = BoundProxy::bind(pi).map_err(|e| e.to_string())?;
        let (trigger, watcher) = drain::new();
        let resolver = dns.map(|(server, resolver)| {
            let watcher = watcher.clone();
            tokio::spawn(server.run(async move { watcher.draining().await }));
            resolver
        });
        tokio::spawn(bound.run(watcher));
        Ok(RunningPod {
            info: info.clone(),
            identity: workload.identity(),
            connections,
            resolver,
            drain: trigger,
        })
    }

    /// The pod's DNS server in its namespace, by default on 127.0.0.1:15053 and
    /// [::1]:15053 (when the pod's loopback has IPv6), answering for the pod's workload.
    fn bind_dns(
        &self,
        dns: &PodDns,
        local: &LocalIdentity,
        sockets: Arc<InPodSocketFactory>,
    ) -> Result<(ambit_dns::DnsServer, Arc<ambit_dns::Resolver>), String> {
        let state = self.state.clone();
        let resolver = Arc::new(ambit_dns::Resolver::new(
            &dns.cfg,
            Arc::new(move || state.get()),
            ambit_dns::ClientIdentity {
                namespace: local.namespace.clone(),
                name: local.name.clone(),
                service_account: local.service_account.clone(),
                node: self.node.clone(),
            },
            sockets.clone(),
            dns.metrics.clone(),
        ));
        let server = ambit_dns::DnsServer::bind(
            resolver.clone(),
            sockets.as_ref(),
            dns.listen,
            self.cfg.ipv6_enabled,
        )
        .map_err(|e| e.to_string())?;
        Ok((server, resolver))
    }
}
