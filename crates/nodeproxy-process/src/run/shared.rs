//! Shared (in-pod) mode: one proxy per pod, each with its listeners inside the pod's
//! network namespace, pods announced by the node agent over ZDS; the certificates of the
//! node's workloads fetched ahead of their connections.

use std::sync::{Arc, Mutex};

use anyhow::Context;

use ambit_caclient::NodePrefetch;
use ambit_identity::CertManager;
use ambit_nodeproxy::pods::{PodProxyFactory, WorkloadManager};
use ambit_nodeproxy::SharedState;

use super::{wait_for_sync, DataPlane, Wiring};

/// Checks the privileges pod namespaces need, and starts the workload manager once the
/// first mesh state is in.
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
        pods_metrics,
        ready,
        mut xds_synced,
        watcher,
        on_demand,
    } = wiring;
    if let Some(node) = &cfg.node_name {
        spawn_prefetch(state.clone(), certs.clone(), node.clone());
    }
    let mark = cfg
        .proxy
        .packet_mark
        .context("PACKET_MARK is required in shared mode")?;
    check_inpod_privileges(mark)?;
    let factory = PodProxyFactory {
        cfg: Arc::new(cfg.proxy.clone()),
        state: state.clone(),
        certs: certs.clone(),
        metrics,
        node: cfg.node_name.clone(),
        mark,
        reuse_port: cfg.inpod_port_reuse,
        handshakes: node_handshakes,
        dns: match (dns, &cfg.dns, dns_metrics) {
            (Some(dns), Some(dns_cfg), Some(metrics)) => Some(ambit_nodeproxy::pods::PodDns {
                cfg: dns,
                metrics,
                listen: dns_cfg.listen,
            }),
            _ => None,
        },
        on_demand,
    };
    // Each pod's DNS server is bound with its other listeners.
    drop(dns_ready);
    let pending = Mutex::new(Some(ready.register("workload proxy manager")));
    let ready_for_manager = ready.clone();
    let on_ready = Box::new(move |is_ready: bool| {
        let mut guard = pending.lock().unwrap_or_else(|p| p.into_inner());
        if is_ready {
            *guard = None;
        } else if guard.is_none() {
            *guard = Some(ready_for_manager.register("workload proxy manager"));
        }
    });
    let manager = WorkloadManager::new(
        cfg.inpod_uds.clone(),
        factory,
        pods_metrics.context("in-pod metrics")?,
        on_ready,
        cfg.termination_deadline,
    )
    .with_peer_policy(ambit_zds::PeerPolicy::new(cfg.inpod_agent_uid));
    let workload_state = Some(manager.dump_handle());
    tracing::info!(uds = %cfg.inpod_uds.display(), "in-pod mode: waiting for the node agent");
    let watcher = watcher.clone();
    Ok(DataPlane {
        task: Box::pin(async move {
            if !wait_for_sync(&mut xds_synced, &watcher).await {
                return Ok(());
            }
            Ok(manager.run(watcher).await?)
        }),
        workload_state,
    })
}

/// Keeps the certificates of this node's HBONE workloads fetched ahead of connections
/// (shared mode): after every state update, prefetches identities that arrived and
/// forgets those whose last workload left.
fn spawn_prefetch(state: SharedState, certs: Arc<CertManager>, node: String) {
    let mut updates = state.subscribe();
    let mut prefetch = NodePrefetch::new(node);
    tokio::spawn(async move {
        loop {
            let snapshot = state.get();
            prefetch.apply(&snapshot, &certs);
            drop(snapshot);
            if updates.changed().await.is_err() {
                return;
            }
        }
    });
}

/// In-pod mode enters pod namespaces and marks sockets: check both work before announcing
/// ourselves to the agent, so a missing capability is one clear error at start-up.
fn check_inpod_privileges(mark: u32) -> anyhow::Result<()> {
    let here = ambit_zds::Netns::current()
        .context("in-pod mode: cannot open our own network namespace")?;
    here.enter(|| ())
        .context("in-pod mode needs CAP_SYS_ADMIN to enter pod network namespaces (setns)")?;
    ambit_nodeproxy::socket::new_tcp_socket("127.0.0.1:0".parse()?, Some(mark))
        .context("in-pod mode needs CAP_NET_ADMIN to mark sockets (SO_MARK)")?;
    Ok(())
}
