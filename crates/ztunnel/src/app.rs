//! `ambit ztunnel`: wires configuration, state, certificates, listeners and the operator
//! endpoints together, then runs until SIGTERM/SIGINT or `/quitquitquit`.

use std::sync::{Arc, Mutex};

use anyhow::{bail, Context};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use ambit_caclient::{NodePrefetch, RemoteIssuer};
use ambit_grpc::{ChannelConfig, GrpcChannel, RootCa, Token};
use ambit_identity::{CertManager, CertificateAuthority};
use ambit_nodeproxy::admission::{HandshakeGate, NodeHandshakes};
use ambit_nodeproxy::pods::{PodProxyFactory, WorkloadManager};
use ambit_nodeproxy::socket::DefaultSocketFactory;
use ambit_nodeproxy::{BoundProxy, ProxyInputs, SharedState};
use ambit_state::ProxyState;

use crate::admin::{admin_handler, metrics_handler, readiness_handler, AdminContext};
use crate::config::{CaSource, Config, LocalConfigSource, ProxyMode};
use crate::logging::LogHandle;
use crate::readiness::Ready;

/// Reads and checks the local config: a bad file names the file, the position and field
/// (a bad policy is refused alone, see [`crate::local_config`]). Also returns the load
/// and its store, which a file watch starts from.
pub fn load_state(
    source: &LocalConfigSource,
) -> anyhow::Result<(
    ProxyState,
    serde_json::Value,
    (ambit_state::LocalLoad, ProxyState),
)> {
    let (name, yaml) = crate::local_config::read(source)?;
    let (load, state) = crate::local_config::load(&name, &yaml, None)?;
    let mut static_config = serde_json::to_value(&load.config).unwrap_or_default();
    // ztunnel's `staticConfig` shows each service with an (always empty) `endpoints`.
    if let Some(services) = static_config
        .get_mut("services")
        .and_then(|s| s.as_array_mut())
    {
        for service in services {
            if let Some(m) = service.as_object_mut() {
                m.insert("endpoints".into(), serde_json::json!({}));
            }
        }
    }
    Ok((state.clone(), static_config, (load, state)))
}

/// The certificate manager for the configured issuer (see [`CaSource`]).
fn cert_manager(cfg: &Config) -> anyhow::Result<Arc<CertManager>> {
    let CaSource::Remote(remote) = &cfg.ca else {
        let ca = Arc::new(certificate_authority(cfg)?);
        return Ok(CertManager::new(ca, cfg.secret_ttl));
    };
    let channel = GrpcChannel::new(ChannelConfig {
        address: remote.address.clone(),
        root: RootCa::from_env_value(remote.root.as_deref()),
        alt_hostname: remote.alt_hostname.clone(),
        token: Token::from_env_value(remote.token.as_deref()),
        cluster_id: cfg.proxy.cluster_id.clone(),
        headers: remote.headers.clone(),
    })
    .with_context(|| {
        format!(
            "the CA channel to {} (CA_ADDRESS, CA_ROOT_CA, AUTH_TOKEN, CA_HEADER_*)",
            remote.address
        )
    })?;
    // In shared mode the node proxy asks for pods' certificates on their behalf.
    let impersonate = cfg.proxy_mode == ProxyMode::Shared;
    tracing::info!(address = %remote.address, impersonate, "workload certificates from the CA");
    let issuer = RemoteIssuer::new(channel, remote.address.clone(), impersonate);
    Ok(CertManager::with_issuer(
        Arc::new(issuer),
        cfg.secret_ttl,
        Arc::new(std::time::SystemTime::now),
    ))
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

fn has_local_workload(
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
fn start_xds(
    cfg: &Arc<Config>,
    state: &SharedState,
    metrics: ambit_xds::XdsMetrics,
    state_ready: crate::readiness::BlockReady,
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
    let client = ambit_xds::XdsClient::new(channel, ambit_xds::DeltaClient::new(xds.node.to_node()))
        .with_metrics(metrics)
        .on_ready(move || {
            if let (ProxyMode::Dedicated, Some(w)) = (check_cfg.proxy_mode, &check_cfg.workload) {
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
        });
    let sink_state = state.clone();
    tokio::spawn(client.run(move |batch| sink_state.update(|s| batch.apply(s))));
    Ok(synced)
}

fn certificate_authority(cfg: &Config) -> anyhow::Result<CertificateAuthority> {
    match &cfg.ca {
        CaSource::LocalDir(dir) => CertificateAuthority::from_plugin_dir(dir)
            .with_context(|| format!("LOCAL_CA_DIR={}", dir.display())),
        CaSource::Ephemeral | CaSource::Remote(_) => {
            tracing::warn!(
                "LOCAL_CA_DIR is not set: created an ephemeral root CA for trust domain {}; \
                 only peers that share this root can talk to this proxy (set LOCAL_CA_DIR to \
                 a directory with ca-cert.pem, ca-key.pem, root-cert.pem, cert-chain.pem)",
                cfg.trust_domain
            );
            Ok(CertificateAuthority::ephemeral(&cfg.trust_domain)?)
        }
    }
}

async fn bind(addr: std::net::SocketAddr, what: &str) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot bind the {what} endpoint on {addr}"))
}

/// ztunnel serves admin on `::1` as well as `127.0.0.1`: with IPv6 enabled and the default
/// IPv4 loopback address, bind the IPv6 loopback on the same port too. A node without
/// IPv6 (no `::1`, or IPv6 disabled in the kernel) keeps the IPv4 endpoint alone, and so
/// does a port the kernel picked (configured 0) that is taken on `::1`; any other failure
/// stops start-up.
async fn bind_admin_ipv6(cfg: &Config, port: u16) -> anyhow::Result<Option<TcpListener>> {
    if !cfg.proxy.ipv6_enabled || cfg.admin_addr.ip() != std::net::Ipv4Addr::LOCALHOST {
        return Ok(None);
    }
    let addr = std::net::SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, port));
    match TcpListener::bind(addr).await {
        Ok(l) => Ok(Some(l)),
        Err(e) if ipv6_admin_optional(&e, cfg.admin_addr.port()) => {
            tracing::debug!(error = %e, "admin on {} only", cfg.admin_addr);
            Ok(None)
        }
        Err(e) => Err(e).with_context(|| format!("cannot bind the admin endpoint on {addr}")),
    }
}

fn ipv6_admin_optional(e: &std::io::Error, configured_port: u16) -> bool {
    use std::io::ErrorKind;
    e.kind() == ErrorKind::AddrNotAvailable
        || e.raw_os_error() == Some(nix::libc::EAFNOSUPPORT)
        || (configured_port == 0 && e.kind() == ErrorKind::AddrInUse)
}

/// The DNS proxy's configuration: the settings, and the upstream nameservers (and, for
/// dedicated mode, the search list) of resolv.conf.
fn dns_config(cfg: &Config) -> anyhow::Result<Option<Arc<ambit_dns::DnsConfig>>> {
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

pub async fn run(cfg: Config, logs: Option<LogHandle>) -> anyhow::Result<()> {
    let cfg = Arc::new(cfg);
    let ready = Ready::default();
    let proxy_ready = ready.register("proxy");
    let state_ready = ready.register("state manager");

    let (state, static_config, local_load) = match &cfg.local_config {
        Some(source) => {
            let (state, static_config, load) = load_state(source)?;
            (state, static_config, Some(load))
        }
        // xDS only: the mesh arrives from the control plane.
        None => (
            ProxyState::new(),
            serde_json::to_value(ambit_state::LocalConfig::default()).unwrap_or_default(),
            None,
        ),
    };
    if let (ProxyMode::Dedicated, Some(w)) = (cfg.proxy_mode, &cfg.workload) {
        // With xDS the workload may not have arrived yet: checked once it has (below).
        if cfg.xds.is_none() && !has_local_workload(&state, &cfg, w) {
            bail!(
                "PROXY_WORKLOAD_INFO={}/{}/{} matches no workload in the local config: add a \
                 workload with that namespace, name and serviceAccount",
                w.namespace,
                w.name,
                w.service_account
            );
        }
    }
    let state = SharedState::new(state);

    let certs = cert_manager(&cfg)?;

    let mut registry = Registry::default();
    registry.register_collector(Box::new(crate::process_metrics::ProcessAndRuntime {
        runtime: tokio::runtime::Handle::current(),
    }));
    let metrics = ambit_nodeproxy::metrics::Metrics::register(&mut registry, &cfg.istio_version);
    certs.register_metrics(&mut registry);
    // One node-wide handshake count, whichever mode; its sheds are ambit's own metric.
    let node_handshakes = NodeHandshakes::new(cfg.proxy.handshakes.node);
    registry.register(
        "ambit_hbone_handshakes_shed",
        "Connections to the HBONE port reset before their handshake because a source, pod or node limit was reached",
        node_handshakes.shed_counter(),
    );
    let policy_report = crate::local_config::PolicyReport::default();
    if let Some(load) = &local_load {
        policy_report.set_rejected(&load.0);
    }
    crate::local_config::register_metrics(&mut registry, state.clone(), policy_report.clone());
    if let (Some(LocalConfigSource::File(path)), Some(load)) = (&cfg.local_config, local_load) {
        crate::local_config::spawn_watch(path.clone(), state.clone(), load, policy_report);
    }
    let xds_metrics = ambit_xds::XdsMetrics::register(&mut registry);
    let dns = dns_config(&cfg)?;
    let dns_metrics = dns
        .as_ref()
        .map(|_| ambit_dns::DnsMetrics::register(&mut registry));
    let dns_ready = dns.as_ref().map(|_| ready.register("dns proxy"));
    let inpod_metrics = (cfg.proxy_mode == ProxyMode::Shared)
        .then(|| ambit_nodeproxy::pods::InpodMetrics::register(&mut registry));
    let registry = Arc::new(registry);
    let mut xds_synced = start_xds(&cfg, &state, xds_metrics, state_ready)?;

    let (shutdown_tx, mut shutdown_rx) = mpsc::channel::<()>(1);
    let (trigger, watcher) = ambit_nodeproxy::drain::new();

    // Bind everything before serving anything, so a conflict fails start-up cleanly.
    let admin = bind(cfg.admin_addr, "admin").await?;
    let admin_v6 = bind_admin_ipv6(&cfg, admin.local_addr()?.port()).await?;
    let stats = bind(cfg.stats_addr, "metrics").await?;
    let readiness = bind(cfg.readiness_addr, "readiness").await?;

    let mut workload_state = None;
    let data_plane: std::pin::Pin<
        Box<dyn std::future::Future<Output = anyhow::Result<()>> + Send>,
    > = match cfg.proxy_mode {
        ProxyMode::Dedicated => {
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
                    .context("ISTIO_META_DNS_PROXY_ADDR (ISTIO_META_DNS_CAPTURE=false turns the DNS proxy off)")?;
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
            });
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
            Box::pin(async move {
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
            })
        }
        ProxyMode::Shared => {
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
                    (Some(dns), Some(dns_cfg), Some(metrics)) => {
                        Some(ambit_nodeproxy::pods::PodDns {
                            cfg: dns,
                            metrics,
                            listen: dns_cfg.listen,
                        })
                    }
                    _ => None,
                },
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
                inpod_metrics.context("in-pod metrics")?,
                on_ready,
                cfg.termination_deadline,
            )
            .with_peer_policy(ambit_zds::PeerPolicy::new(cfg.inpod_agent_uid));
            workload_state = Some(manager.dump_handle());
            tracing::info!(uds = %cfg.inpod_uds.display(), "in-pod mode: waiting for the node agent");
            let watcher = watcher.clone();
            Box::pin(async move {
                if !wait_for_sync(&mut xds_synced, &watcher).await {
                    return Ok(());
                }
                Ok(manager.run(watcher).await?)
            })
        }
    };
    tracing::info!(
        admin = %cfg.admin_addr,
        stats = %cfg.stats_addr,
        readiness = %cfg.readiness_addr,
        "operator endpoints bound"
    );

    let renewal = certs.spawn_renewal();
    if let (ProxyMode::Shared, Some(node)) = (cfg.proxy_mode, &cfg.node_name) {
        spawn_prefetch(state.clone(), certs.clone(), node.clone());
    }
    let admin_ctx = AdminContext {
        config: cfg.clone(),
        state,
        certs,
        logs,
        shutdown: shutdown_tx,
        static_config,
        workload_state,
    };
    let admin_handler = admin_handler(admin_ctx);
    if let Some(admin_v6) = admin_v6 {
        tokio::spawn(crate::http::serve(
            admin_v6,
            admin_handler.clone(),
            watcher.clone(),
        ));
    }
    tokio::spawn(crate::http::serve(admin, admin_handler, watcher.clone()));
    tokio::spawn(crate::http::serve(
        stats,
        metrics_handler(registry),
        watcher.clone(),
    ));
    // Readiness keeps answering during the drain, so it gets no watcher of its own.
    let (_readiness_trigger, readiness_watcher) = ambit_nodeproxy::drain::new();
    tokio::spawn(crate::http::serve(
        readiness,
        readiness_handler(ready.clone()),
        readiness_watcher,
    ));
    let mut data_plane = tokio::spawn(data_plane);
    drop(watcher);
    drop(proxy_ready);

    tokio::select! {
        _ = wait_for_shutdown(&mut shutdown_rx) => {}
        finished = &mut data_plane => {
            // Only a broken agent protocol ends the data plane on its own: exit non-zero,
            // like ztunnel, so the supervisor restarts us with a clean slate.
            renewal.abort();
            return match finished {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(e),
                Err(e) => Err(anyhow::anyhow!("data plane task failed: {e}")),
            };
        }
    }
    tracing::info!(deadline = ?cfg.termination_deadline, "draining: no new connections, open ones may finish");
    let clean = trigger.drain(cfg.termination_deadline).await;
    if !clean {
        tracing::warn!("drain deadline passed: closed the remaining connections");
    }
    renewal.abort();
    let _ = data_plane.await;
    tracing::info!("shutdown complete");
    Ok(())
}

/// Waits for the first xDS sync; false if the drain began first (nothing to serve then).
async fn wait_for_sync(
    synced: &mut tokio::sync::watch::Receiver<bool>,
    watcher: &ambit_nodeproxy::drain::DrainWatcher,
) -> bool {
    tokio::select! {
        r = synced.wait_for(|s| *s) => r.is_ok(),
        _ = watcher.draining() => false,
    }
}

async fn wait_for_shutdown(quit: &mut mpsc::Receiver<()>) {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).ok();
    let mut int = signal(SignalKind::interrupt()).ok();
    let term_fut = async {
        match term.as_mut() {
            Some(s) => {
                s.recv().await;
            }
            None => std::future::pending::<()>().await,
        }
    };
    let int_fut = async {
        match int.as_mut() {
            Some(s) => {
                s.recv().await;
            }
            None => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = term_fut => tracing::info!("received SIGTERM"),
        _ = int_fut => tracing::info!("received SIGINT"),
        _ = quit.recv() => tracing::info!("shutdown requested through /quitquitquit"),
    }
    // A second Ctrl-C means "now": skip the rest of the drain.
    tokio::spawn(async {
        if let Ok(mut int) = signal(SignalKind::interrupt()) {
            int.recv().await;
            tracing::warn!("second SIGINT: exiting without waiting for open connections");
            std::process::exit(1);
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Error, ErrorKind};

    #[test]
    fn ipv6_admin_is_optional_only_where_the_node_lacks_it() {
        let no_v6 = Error::from_raw_os_error(libc::EAFNOSUPPORT);
        assert!(ipv6_admin_optional(&no_v6, 15000));
        let no_loopback = Error::from_raw_os_error(libc::EADDRNOTAVAIL);
        assert!(ipv6_admin_optional(&no_loopback, 15000));
        // A configured port taken on ::1 is a conflict to report; a picked one is not.
        let taken = Error::from(ErrorKind::AddrInUse);
        assert!(!ipv6_admin_optional(&taken, 15000));
        assert!(ipv6_admin_optional(&taken, 0));
        let denied = Error::from(ErrorKind::PermissionDenied);
        assert!(!ipv6_admin_optional(&denied, 15000));
    }
}
