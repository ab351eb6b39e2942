//! Dedicated mode: one workload, served by listeners in the proxy's own network
//! namespace, with the DNS proxy on its address when enabled.

use std::sync::Arc;

use anyhow::Context;

use ambit_nodeproxy::admission::HandshakeGate;
use ambit_nodeproxy::socket::DefaultSocketFactory;
use ambit_nodeproxy::{BoundProxy, ProxyInputs};

use super::{wait_for_sync, DataPlane, Wiring};

/// Binds the workload's listeners (and DNS proxy) now, so a conflict stops start-up; they
/// serve once the first mesh state is in.
pub(super) fn start(wiring: Wiring) -> anyhow::Result<DataPlane> {
    let Wiring {
        cfg,
        state,
        certs,
        metrics,
        node_handshakes,
        dns,
        dns_metrics,
        dns_ready,
        mut xds_synced,
        watcher,
        on_demand,
        ..
    } = wiring;
    let identity = cfg.workload.clone().context("PROXY_WORKLOAD_INFO")?;
    let dns_server = match (&dns, &cfg.dns, dns_metrics) {
        (Some(dns), Some(dns_cfg), Some(metrics)) => {
            let sockets = Arc::new(ambit_dns::LocalSockets {
                mark: cfg.proxy.packet_mark,
                reuse_port: false,
            });
            let source = state.clone();
            let resolver = Arc::new(ambit_dns::Resolver::new(
                dns,
                Arc::new(move || source.get()),
                ambit_dns::ClientIdentity {
                    namespace: identity.namespace.clone(),
                    name: identity.name.clone(),
                    service_account: identity.service_account.clone(),
                    node: cfg.node_name.clone(),
                },
                sockets.clone(),
                metrics,
            ));
            let server = ambit_dns::DnsServer::bind(
                resolver.clone(),
                sockets.as_ref(),
                dns_cfg.listen,
                cfg.proxy.ipv6_enabled,
            )
            .context(
                "ISTIO_META_DNS_PROXY_ADDR (ISTIO_META_DNS_CAPTURE=false turns the DNS proxy off)",
            )?;
            tracing::info!(addresses = ?server.local_addrs(), "DNS proxy bound");
            Some((server, resolver))
        }
        _ => None,
    };
    let pi = Arc::new(ProxyInputs {
        cfg: Arc::new(cfg.proxy.clone()),
        state: state.clone(),
        certs: certs.clone(),
        metrics,
        sockets: Arc::new(DefaultSocketFactory {
            mark: cfg.proxy.packet_mark,
            reuse_port: false,
        }),
        local: identity,
        node: cfg.node_name.clone(),
        pool: ambit_hbone::Pool::new(cfg.proxy.pool.clone()),
        spoof_by_default: false,
        connections: Default::default(),
        handshakes: HandshakeGate::new(node_handshakes, cfg.proxy.handshakes),
        // SOCKS5 names resolve as the DNS proxy answers this workload.
        names: dns_server
            .as_ref()
            .map(|(_, r)| r.clone() as Arc<dyn ambit_nodeproxy::socks5::NameLookup>),
        on_demand: on_demand.clone(),
    });
    if let Some(od) = on_demand {
        // On demand the store starts empty: ask for our own workload at once (pinned).
        let uid = ambit_nodeproxy::on_demand::local_uid(
            &cfg.proxy.cluster_id,
            &identity_of(&pi).namespace,
            &identity_of(&pi).name,
        );
        tokio::spawn(async move {
            if let Err(e) = od.fetch(&uid, true).await {
                tracing::warn!(%uid, "xDS on-demand: this proxy's workload: {e}");
            }
        });
    }
    let dns_server = dns_server.map(|(server, _)| server);
    let proxy = BoundProxy::bind(pi)?;
    let addrs = proxy.addresses()?;
    tracing::info!(
        outbound = %addrs.outbound,
        inbound = %addrs.inbound_hbone,
        inbound_plaintext = %addrs.inbound_plaintext,
        "dedicated-mode listeners bound"
    );
    let watcher = watcher.clone();
    Ok(DataPlane {
        task: Box::pin(async move {
            // Bound now (bind errors stop start-up), serving once the mesh is known.
            if !wait_for_sync(&mut xds_synced, &watcher).await {
                return Ok(());
            }
            if let Some(server) = dns_server {
                let w = watcher.clone();
                tokio::spawn(server.run(async move { w.draining().await }));
            }
            drop(dns_ready);
            proxy.run(watcher).await;
            Ok(())
        }),
        workload_state: None,
    })
}

fn identity_of(pi: &ProxyInputs) -> &ambit_nodeproxy::LocalIdentity {
    &pi.local
}
