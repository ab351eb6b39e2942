//! The plain accept stream for test servers: TLS connections as tonic's
//! `serve_with_incoming` takes them. Every accepted socket gets `TCP_NODELAY` and its
//! handshake runs in a task of its own; a failed or timed-out handshake is skipped; with
//! a connection cap, one over it is closed at once. Production servers use
//! [`super::serve`], which also bounds what unauthenticated peers hold.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tonic::transport::server::{Connected, TcpConnectInfo};

/// Handshaken connections waiting for tonic to take them.
const QUEUE: usize = 64;
/// The pause after a failed `accept`.
const ACCEPT_RETRY: Duration = Duration::from_millis(50);
/// The least time between two "too many connections" warnings.
const SHED_REPORT_EVERY: Duration = Duration::from_secs(10);

/// An accepted TLS connection, as tonic serves it. Its [`Connected`] info is a
/// [`TcpConnectInfo`], so `request.remote_addr()` gives the client's address.
pub struct TlsConnection {
    stream: TlsStream<TcpStream>,
    info: TcpConnectInfo,
    _slot: Option<OwnedSemaphorePermit>,
}

impl TlsConnection {
    /// The client's address.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.info.remote_addr
    }

    /// The address the client connected to.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.info.local_addr
    }
}

impl std::fmt::Debug for TlsConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsConnection")
            .field("peer", &self.info.remote_addr)
            .field("local", &self.info.local_addr)
            .finish_non_exhaustive()
    }
}

impl Connected for TlsConnection {
    type ConnectInfo = TcpConnectInfo;
    fn connect_info(&self) -> TcpConnectInfo {
        self.info.clone()
    }
}

impl AsyncRead for TlsConnection {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsConnection {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// Limits on what [`incoming`] accepts. The default has none.
#[derive(Debug, Clone, Copy, Default)]
pub struct AcceptOptions {
    /// Time a client has to finish the TLS handshake.
    pub handshake_timeout: Option<Duration>,
    /// Connections open at once, handshakes included.
    pub max_connections: Option<usize>,
}

/// The accepted connections, for `serve_with_incoming`. It never yields an error.
/// Dropping it closes the listener.
pub struct Incoming {
    rx: mpsc::Receiver<TlsConnection>,
    task: JoinHandle<()>,
}

impl futures_util::Stream for Incoming {
    type Item = Result<TlsConnection, Infallible>;
    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().rx.poll_recv(cx).map(|c| c.map(Ok))
    }
}

impl Drop for Incoming {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Accepts TLS connections on `listener` until the stream is dropped. Must be called
/// within a tokio runtime.
pub fn incoming(listener: TcpListener, tls: TlsAcceptor, options: AcceptOptions) -> Incoming {
    incoming_until(listener, tls, options, std::future::pending())
}

/// [`incoming`], closing the listener once `stop` resolves (the stream then ends).
pub fn incoming_until(
    listener: TcpListener,
    tls: TlsAcceptor,
    options: AcceptOptions,
    stop: impl Future<Output = ()> + Send + 'static,
) -> Incoming {
    let (tx, rx) = mpsc::channel(QUEUE);
    let slots = options.max_connections.map(|n| Arc::new(Semaphore::new(n)));
    let task = tokio::spawn(async move {
        tokio::select! {
            _ = stop => {}
            _ = accept_loop(listener, tls, options.handshake_timeout, slots, tx) => {}
        }
    });
    Incoming { rx, task }
}

async fn accept_loop(
    listener: TcpListener,
    tls: TlsAcceptor,
    handshake_timeout: Option<Duration>,
    slots: Option<Arc<Semaphore>>,
    tx: mpsc::Sender<TlsConnection>,
) {
    let mut last_shed_report: Option<Instant> = None;
    loop {
        let (stream, peer) = tokio::select! {
            _ = tx.closed() => return,
            r = listener.accept() => match r {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(ACCEPT_RETRY).await;
                    continue;
                }
            }
        };
        let slot = match &slots {
            None => None,
            Some(slots) => match slots.clone().try_acquire_owned() {
                Ok(slot) => Some(slot),
                Err(_) => {
                    let now = Instant::now();
                    if last_shed_report.is_none_or(|t| now.duration_since(t) > SHED_REPORT_EVERY) {
                        tracing::warn!("too many connections; closing the one from {peer} (more are closed quietly for 10 s)");
                        last_shed_report = Some(now);
                    }
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let info = TcpConnectInfo {
            local_addr: stream.local_addr().ok(),
            remote_addr: Some(peer),
        };
        let tls = tls.clone();
        let tx = tx.clone();
        tokio::spawn(async move {
            let handshake = async {
                match handshake_timeout {
                    Some(limit) => tokio::time::timeout(limit, tls.accept(stream)).await,
                    None => Ok(tls.accept(stream).await),
                }
            };
            let done = tokio::select! {
                _ = tx.closed() => return,
                done = handshake => done,
            };
            match done {
                Ok(Ok(stream)) => {
                    let _ = tx
                        .send(TlsConnection {
                            stream,
                            info,
                            _slot: slot,
                        })
                        .await;
                }
                Ok(Err(e)) => tracing::debug!("TLS handshake from {peer} failed: {e}"),
                Err(_) => tracing::debug!("TLS handshake from {peer} timed out"),
            }
        });
    }
}
