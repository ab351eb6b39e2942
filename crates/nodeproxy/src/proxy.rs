//! One proxy instance: its three listeners and their accept loops.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;

use crate::admission::{HandshakePermit, Shed};
use crate::inputs::ProxyInputs;
use crate::metrics::Reporter;
use crate::settings::OriginalSource;
use crate::{inbound, outbound, plaintext, socket};
use ambit_hbone::HboneError;
use ambit_runtime::drain::DrainWatcher;

/// Where the listeners ended up (ports may be 0 in tests, chosen by the kernel).
#[derive(Clone, Copy, Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ListenAddresses {
    pub outbound: SocketAddr,
    pub inbound_plaintext: SocketAddr,
    pub inbound_hbone: SocketAddr,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub socks5: Option<SocketAddr>,
}

struct Listener {
    listener: TcpListener,
    transparent: bool,
}

/// Listeners bound, not yet serving. Binding first lets start-up fail before anything
/// is served, with the port at fault named.
pub struct BoundProxy {
    pi: Arc<ProxyInputs>,
    outbound: Listener,
    plaintext: Listener,
    hbone: Listener,
    socks5: Option<Listener>,
}

impl BoundProxy {
    pub fn bind(pi: Arc<ProxyInputs>) -> io::Result<BoundProxy> {
        let ports = &pi.cfg.ports;
        let v6 = pi.cfg.ipv6_enabled;
        let bind = |port: u16, what: &str| -> io::Result<Listener> {
            let addr = socket::wildcard(v6, port);
            let sock = pi.sockets.listen(addr, true).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("cannot bind the {what} listener on {addr}: {e}"),
                )
            })?;
            let transparent = socket::is_transparent(&sock, v6);
            if !transparent && pi.cfg.original_source == OriginalSource::Required {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!(
                        "ENABLE_ORIG_SRC=true but the {what} listener on {addr} cannot be made \
                         transparent (IP_TRANSPARENT needs CAP_NET_ADMIN)"
                    ),
                ));
            }
            Ok(Listener {
                listener: socket::into_listener(sock)?,
                transparent,
            })
        };
        // Localhost only, IPv4 only, as ztunnel binds it: it is for the workload itself.
        let socks5 = match ports.socks5 {
            None => None,
            Some(port) => {
                let addr = SocketAddr::from(([127, 0, 0, 1], port));
                let sock = pi.sockets.listen(addr, false).map_err(|e| {
                    io::Error::new(
                        e.kind(),
                        format!("cannot bind the SOCKS5 listener on {addr}: {e}"),
                    )
                })?;
                Some(Listener {
                    listener: socket::into_listener(sock)?,
                    transparent: false,
                })
            }
        };
        Ok(BoundProxy {
            outbound: bind(ports.outbound, "outbound")?,
            plaintext: bind(ports.inbound_plaintext, "inbound plaintext")?,
            hbone: bind(ports.inbound_hbone, "HBONE inbound")?,
            socks5,
            pi: pi.clone(),
        })
    }

    pub fn addresses(&self) -> io::Result<ListenAddresses> {
        Ok(ListenAddresses {
            outbound: self.outbound.listener.local_addr()?,
            inbound_plaintext: self.plaintext.listener.local_addr()?,
            inbound_hbone: self.hbone.listener.local_addr()?,
            socks5: match &self.socks5 {
                Some(l) => Some(l.listener.local_addr()?),
                None => None,
            },
        })
    }

    /// Serves until draining starts; open connections then finish under the watcher.
    pub async fn run(self, drain: DrainWatcher) {
        let goaway = drain.draining_signal();
        let pi = self.pi;
        let out = accept_loop(self.outbound, Reporter::Source, &pi, drain.clone(), {
            let pi = pi.clone();
            move |stream, src, drain, _| outbound::handle(pi.clone(), stream, src, drain)
        });
        let plain = accept_loop(self.plaintext, Reporter::Destination, &pi, drain.clone(), {
            let pi = pi.clone();
            move |stream, src, drain, transparent| {
                plaintext::handle(pi.clone(), stream, src, drain, transparent)
            }
        });
        let hbone = accept_loop(self.hbone, Reporter::Destination, &pi, drain.clone(), {
            let pi = pi.clone();
            move |stream, src, drain, transparent| {
                // Admitted (or shed) at once, before a byte is read.
                let admitted = pi.handshakes.admit(socket::canonical_ip(src.ip()));
                serve_hbone(
                    pi.clone(),
                    stream,
                    admitted,
                    drain,
                    goaway.clone(),
                    transparent,
                )
            }
        });
        let socks5 = async {
            if let Some(listener) = self.socks5 {
                let pi2 = pi.clone();
                accept_loop(
                    listener,
                    Reporter::Source,
                    &pi,
                    drain.clone(),
                    move |stream, src, drain, _| {
                        crate::socks5::handle(pi2.clone(), stream, src, drain)
                    },
                )
                .await
            }
        };
        let recheck = recheck_on_change(pi.clone(), drain.clone());
        tokio::join!(out, plain, hbone, socks5, recheck);
    }
}

/// Re-checks the open inbound connections whenever the state changes, until draining.
async fn recheck_on_change(pi: Arc<ProxyInputs>, drain: DrainWatcher) {
    let mut generation = pi.state.subscribe();
    generation.mark_unchanged();
    loop {
        tokio::select! {
            changed = generation.changed() => if changed.is_err() { return },
            _ = drain.draining() => return,
        }
        let state = pi.state.get();
        for (c, denied) in pi.connections.recheck(&state, &*pi.metrics.rbac) {
            tracing::debug!(src = %c.src, dst = %c.actual_dst, reason = %denied, "policy change denies an open connection");
        }
    }
}

/// How often shed handshakes are reported, at most.
const SHED_REPORT_INTERVAL: Duration = Duration::from_secs(10);

async fn serve_hbone(
    pi: Arc<ProxyInputs>,
    stream: tokio::net::TcpStream,
    admitted: Result<HandshakePermit, Shed>,
    drain: DrainWatcher,
    goaway: tokio::sync::watch::Receiver<bool>,
    transparent: bool,
) {
    let peer = stream.peer_addr().ok();
    let local = stream.local_addr().ok();
    let permit = match admitted {
        Ok(permit) => permit,
        Err(shed) => return shed_connection(&pi, stream, peer, shed),
    };
    if let Err(e) = crate::socket::tune_stream(&stream, &pi.cfg.keepalive) {
        tracing::debug!(?peer, "socket options on an HBONE connection: {e}");
    }
    // The certificate is looked up once the ClientHello is in, so the handshake is seen to
    // progress (admission ranks it above a stalled one) even while it waits for the CA.
    let server_config = async {
        let identity = {
            let state = pi.state.get();
            match pi.local().workload(&state) {
                Ok(w) => w.identity(),
                Err(e) => {
                    tracing::warn!(?peer, "HBONE connection refused: {e}");
                    return None;
                }
            }
        };
        // May wait for the CA (RealTime priority) when no valid certificate is cached.
        match pi.certs.server_config(&identity).await {
            Ok(tls) => Some(tls),
            Err(e) => {
                let e = crate::error::Error::NoCertificate {
                    identity,
                    reason: e.to_string(),
                };
                tracing::warn!(?peer, "HBONE connection refused: {e}");
                None
            }
        }
    };
    let progress = |step| permit.progress(step);
    let handshake = ambit_hbone::accept_connection_reporting(
        stream,
        server_config,
        pi.cfg.h2.clone(),
        progress,
    );
    let accepted = tokio::select! {
        r = handshake => r,
        _ = permit.evicted() => return report_eviction(&pi, peer),
        _ = drain.forced() => return,
    };
    // Through TLS and the HTTP/2 preface: the client has proved itself.
    drop(permit);
    let accepted = match accepted {
        Ok(None) => return,
        // A client that never got through the handshake: an access log warning, as
        // ztunnel writes one.
        Err(
            e @ (HboneError::Tls(_)
            | HboneError::HandshakeTimeout(_)
            | HboneError::Alpn(_)
            | HboneError::NoClientCertificate),
        ) => {
            if let Some(src) = peer {
                crate::telemetry::early_failure(
                    Reporter::Destination,
                    socket::canonical(src),
                    local.map(socket::canonical),
                    &crate::error::Error::Tunnel(e),
                );
            }
            return;
        }
        Err(e) => return tracing::debug!(?peer, "HBONE connection ended: {e}"),
        Ok(Some(accepted)) => accepted,
    };
    // The client certificate is the same for every stream of the connection: parse its
    // identity once, on the first stream, not per CONNECT.
    let peer_identity = Arc::new(std::sync::OnceLock::new());
    let handler = {
        let pi = pi.clone();
        let drain = drain.clone();
        move |incoming| {
            inbound::handle_connect(
                pi.clone(),
                incoming,
                drain.clone(),
                transparent,
                peer_identity.clone(),
            )
        }
    };
    tokio::select! {
        r = accepted.serve(goaway, handler) => {
            if let Err(e) = r {
                tracing::debug!(?peer, "HBONE connection ended: {e}");
            }
        }
        _ = drain.forced() => {}
    }
}

/// Closes a handshake evicted for a newcomer (it was the stalest of its share) and says
/// so now and then; it counts as shed.
fn report_eviction(pi: &ProxyInputs, peer: Option<SocketAddr>) {
    let node = pi.handshakes.node();
    if let Some(total) = node.count_shed(std::time::Instant::now(), SHED_REPORT_INTERVAL) {
        tracing::warn!(
            ?peer,
            shed_total = total,
            "HBONE handshake closed for a newcomer: it was the stalest of its share; clients \
             that do not finish their handshake are filling this proxy's share \
             (AMBIT_MAX_HBONE_HANDSHAKES*)"
        );
    }
}

/// Closes a connection over the handshake limits at once, with a reset (no TIME_WAIT
/// kept for it), and says so now and then.
fn shed_connection(
    pi: &ProxyInputs,
    stream: tokio::net::TcpStream,
    peer: Option<SocketAddr>,
    shed: Shed,
) {
    socket::reset_on_close(&stream);
    drop(stream);
    let node = pi.handshakes.node();
    if let Some(total) = node.count_shed(std::time::Instant::now(), SHED_REPORT_INTERVAL) {
        tracing::warn!(
            ?peer,
            shed_total = total,
            "HBONE connection shed: {shed}; clients that do not finish their handshake \
             are holding this proxy's share (AMBIT_MAX_HBONE_HANDSHAKES*)"
        );
    }
}

async fn accept_loop<F, Fut>(
    listener: Listener,
    reporter: Reporter,
    pi: &ProxyInputs,
    drain: DrainWatcher,
    handle: F,
) where
    F: Fn(tokio::net::TcpStream, SocketAddr, DrainWatcher, bool) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    loop {
        tokio::select! {
            biased;
            _ = drain.draining() => return,
            accepted = listener.listener.accept() => match accepted {
                Ok((stream, src)) => {
                    let open = pi.metrics.socket_opened(reporter);
                    let served = handle(stream, src, drain.clone(), listener.transparent);
                    tokio::spawn(async move {
                        served.await;
                        drop(open);
                    });
                }
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            }
        }
    }
}
