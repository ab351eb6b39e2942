//! Where the node proxy's mesh and certificates come from: the local config file, the
//! xDS client, the CA (remote, a local directory, or an ephemeral root), and the DNS
//! proxy's upstream.

use std::sync::Arc;

use anyhow::Context;

use ambit_identity::CertManager;
use ambit_nodeproxy::SharedState;
use ambit_state::ProxyState;

use crate::config::{Config, ProxyMode};

/// The certificate manager for the configured issuer (`CA_ADDRESS`, ...): in shared mode
/// the node proxy asks for pods' certificates on their behalf.
pub(super) fn cert_manager(cfg: &Config) -> anyhow::Result<Arc<CertManager>> {
    ambit_process::certs::cert_manager(&ambit_process::certs::CertSettings {
        source: &cfg.ca,
        trust_domain: &cfg.trust_domain,
        cluster_id: &cfg.proxy.cluster_id,
        secret_ttl: cfg.secret_ttl,
        impersonate: cfg.proxy_mode == ProxyMode::Shared,
    })
}

pub(super) fn has_local_workload(
    state: &ProxyState,
    cfg: &Config,
    w: &ambit_nodeproxy::LocalIdentity,
) -> bool {
    state
        .find_local_workload(
            &w.namespace,
            &w.name,
            &w.service_account,
            cfg.node_name.as_deref(),
        )
        .is_some()
}

/// Starts the xDS client (when configured): batches go to `state`; the returned receiver
/// turns true once a response of each type was applied and answered, which releases the
/// `state manager` readiness task and the data plane.
pub(super) fn start_xds(
    cfg: &Arc<Config>,
    state: &SharedState,
    metrics: ambit_xds::XdsMetrics,
    state_ready: ambit_runtime::readiness::BlockReady,
    on_demand: Option<ambit_xds::OnDemand>,
) -> anyhow::Result<tokio::sync::watch::Receiver<bool>> {
    let (synced_tx, synced) = tokio::sync::watch::channel(false);
    let Some(xds) = &cfg.xds else {
        drop(state_ready);
        let _ = synced_tx.send(true);
        return Ok(synced);
    };
    let channel = ambit_grpc::GrpcChannel::new(xds.channel.clone())
        .with_context(|| format!("XDS_ADDRESS={}", xds.channel.address))?;
    tracing::info!(address = %xds.channel.address, root = %xds.channel.root, token = %xds.channel.token, node = %xds.node.node_id(), "xDS: connecting to the control plane");
    let check_state = state.clone();
    let check_cfg = cfg.clone();
    let mut client =
        ambit_xds::XdsClient::new(channel, ambit_xds::DeltaClient::new(xds.node.to_node()));
    if let Some(od) = on_demand {
        tracing::info!(timeout = ?od.config().timeout, idle = ?od.config().idle, "xDS: addresses on demand (XDS_ON_DEMAND=true)");
        client = client.with_on_demand(od);
    }
    let client = client
        .with_metrics(metrics)
        .on_ready(move || {
            if let (ProxyMode::Dedicated, Some(w), None) =
                (check_cfg.proxy_mode, &check_cfg.workload, &check_cfg.on_demand)
            {
                if !has_local_workload(&check_state.get(), &check_cfg, w) {
                    tracing::warn!(
                        "PROXY_WORKLOAD_INFO={}/{}/{} matches no workload the control plane sent (yet): \
                         traffic of this workload has no identity until it does",
                        w.namespace, w.name, w.service_account
                    );
                }
            }
            drop(state_ready);
            let _ = synced_tx.send(true);
            // What decoding the initial sync used goes back to the system.
            ambit_runtime::memory::release_freed();
        });
    let sink_state = state.clone();
    tokio::spawn(client.run(move |batch| sink_state.update(|s| batch.apply(s))));
    Ok(synced)
}

/// The DNS proxy's configuration: the settings, and the upstream nameservers (and, for
/// dedicated mode, the search list) of resolv.conf.
pub(super) fn dns_config(cfg: &Config) -> anyhow::Result<Option<Arc<ambit_dns::DnsConfig>>> {
    let Some(dns) = &cfg.dns else {
        return Ok(None);
    };
    let upstream = ambit_dns::ResolvConf::read(&dns.resolv_conf)
        .context("the DNS proxy forwards to its nameservers (AMBIT_DNS_RESOLV_CONF)")?;
    if upstream.nameservers.is_empty() {
        tracing::warn!(
            path = %dns.resolv_conf.display(),
            "no nameserver in resolv.conf: names outside the mesh get SERVFAIL"
        );
    }
    let search = match cfg.proxy_mode {
        ProxyMode::Shared => ambit_dns::SearchList::Kubernetes,
        ProxyMode::Dedicated => ambit_dns::SearchList::Fixed(upstream.search.clone()),
    };
    Ok(Some(Arc::new(ambit_dns::DnsConfig {
        settings: ambit_dns::Settings {
            cluster_domain: dns.cluster_domain.clone(),
            search,
            ipv6_enabled: cfg.proxy.ipv6_enabled,
            preferred_namespace: dns.preferred_namespace.clone(),
        },
        upstream,
    })))
}

/// The on-demand handle, as the data path asks through it.
pub(super) struct XdsLookups(pub ambit_xds::OnDemand);

impl ambit_nodeproxy::on_demand::OnDemandLookups for XdsLookups {
    fn fetch<'a>(
        &'a self,
        name: &'a str,
        pin: bool,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send + 'a>> {
        Box::pin(async move {
            self.0
                .fetch_pinned(name, pin)
                .await
                .map_err(|e| e.to_string())
        })
    }

    fn touch(&self, name: &str) {
        self.0.touch(name)
    }
}

/// The on-demand handle, when `XDS_ON_DEMAND=true`.
pub(super) fn on_demand(cfg: &Config) -> Option<ambit_xds::OnDemand> {
    let s = cfg.on_demand?;
    Some(ambit_xds::OnDemand::new(ambit_xds::OnDemandConfig {
        timeout: s.timeout,
        idle: s.idle,
        ..Default::default()
    }))
}
