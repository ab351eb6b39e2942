//! The design's ceiling for the waypoint: a bare reverse proxy on the same HBONE stack,
//! with nothing of a waypoint's own (no fronting check, no policy, no normalisation, no
//! metrics, no access log). HBONE in (`ambit_hbone`, the waypoint's identity), every
//! CONNECT answered 200 and read as HTTP/1.1 or h2c (hyper), each request sent on a pooled
//! inner connection to the next of the given endpoints in turn: over HBONE with the
//! waypoint's identity, or plaintext. Run as its own process (`bench_waypoint --bare-proxy`)
//! so that its CPU is its own.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use ambit_hbone::{Authority, ConnectRequest, H2Settings, Pool, PoolKey};
use ambit_identity::{SpiffeId, WorkloadCertificate};
use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::BodyExt;
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};

type Body = UnsyncBoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

/// An endpoint: its address, and the identity its node proxy presents (`None`: plaintext).
#[derive(Clone, Debug)]
pub struct Endpoint {
    pub target: SocketAddr,
    pub identity: Option<SpiffeId>,
}

struct Bare {
    cert: WorkloadCertificate,
    endpoints: Vec<Endpoint>,
    next: AtomicUsize,
    pool: Pool,
    h1: Mutex<Vec<Vec<http1::SendRequest<Body>>>>,
    h2: Mutex<Vec<Option<http2::SendRequest<Body>>>>,
}

/// Serves on `listen` until killed.
pub async fn run(
    listen: SocketAddr,
    cert: WorkloadCertificate,
    endpoints: Vec<Endpoint>,
) -> anyhow::Result<()> {
    let tls = ambit_identity::tls::server_config(&cert)?;
    let n = endpoints.len();
    let bare = Arc::new(Bare {
        cert,
        endpoints,
        next: AtomicUsize::new(0),
        pool: Pool::new(ambit_hbone::ClientSettings::default()),
        h1: Mutex::new((0..n).map(|_| Vec::new()).collect()),
        h2: Mutex::new(vec![None; n]),
    });
    let listener = tokio::net::TcpListener::bind(listen).await?;
    let (_keep, shutdown) = tokio::sync::watch::channel(false);
    loop {
        let (tcp, _) = listener.accept().await?;
        let (tls, bare, shutdown) = (tls.clone(), bare.clone(), shutdown.clone());
        tokio::spawn(async move {
            let handler = move |incoming: ambit_hbone::IncomingConnect| {
                let bare = bare.clone();
                async move { bare.tunnel(incoming).await }
            };
            if let Err(e) =
                ambit_hbone::serve_connection(tcp, tls, H2Settings::default(), shutdown, handler)
                    .await
            {
                eprintln!("bare proxy: connection: {e}");
            }
        });
    }
}

impl Bare {
    async fn tunnel(self: Arc<Self>, incoming: ambit_hbone::IncomingConnect) {
        let mut stream = match incoming.accept(http::HeaderMap::new()) {
            Ok(s) => s,
            Err(e) => return eprintln!("bare proxy: accept: {e}"),
        };
        // "PRI" starts HTTP/2's preface; "POST", "PUT", "PATCH" are HTTP/1.1.
        let mut first = [0u8; 3];
        let mut got = 0;
        while got < first.len() {
            match stream.read(&mut first[got..]).await {
                Ok(0) => return,
                Ok(n) => got += n,
                Err(e) => return eprintln!("bare proxy: first bytes: {e}"),
            }
        }
        let h2 = &first == b"PRI";
        let io = TokioIo::new(Prefixed {
            first: first.to_vec(),
            inner: stream,
        });
        let service = hyper::service::service_fn(move |req| {
            let bare = self.clone();
            async move { Ok::<_, std::convert::Infallible>(bare.forward(req, h2).await) }
        });
        let served = if h2 {
            hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .timer(TokioTimer::new())
                .serve_connection(io, service)
                .await
        } else {
            hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .serve_connection(io, service)
                .await
        };
        if let Err(e) = served {
            eprintln!("bare proxy: HTTP: {e}");
        }
    }

    async fn forward(
        self: Arc<Self>,
        req: http::Request<hyper::body::Incoming>,
        h2: bool,
    ) -> http::Response<Body> {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.endpoints.len();
        let (mut parts, body) = req.into_parts();
        if !h2 {
            parts.uri = parts
                .uri
                .path_and_query()
                .map_or("/", |p| p.as_str())
                .parse()
                .unwrap_or_default();
        }
        let req = http::Request::from_parts(parts, body.map_err(Into::into).boxed_unsync());
        let resp = if h2 {
            match self.h2_sender(i).await {
                Ok(mut s) => s.send_request(req).await.map_err(anyhow::Error::from),
                Err(e) => Err(e),
            }
        } else {
            match self.h1_sender(i).await {
                Ok(mut s) => {
                    let r = s.send_request(req).await.map_err(anyhow::Error::from);
                    let this = self.clone();
                    tokio::spawn(async move {
                        if s.ready().await.is_ok() {
                            this.h1.lock().unwrap_or_else(|p| p.into_inner())[i].push(s);
                        }
                    });
                    r
                }
                Err(e) => Err(e),
            }
        };
        match resp {
            Ok(r) => r.map(|b| b.map_err(Into::into).boxed_unsync()),
            Err(e) => {
                eprintln!("bare proxy: onward: {e:#}");
                let mut r = http::Response::new(
                    http_body_util::Empty::new()
                        .map_err(|n| match n {})
                        .boxed_unsync(),
                );
                *r.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
                r
            }
        }
    }

    async fn open(&self, i: usize) -> anyhow::Result<Onward> {
        let ep = &self.endpoints[i];
        let Some(id) = &ep.identity else {
            let tcp = tokio::net::TcpStream::connect(ep.target).await?;
            // As the waypoint's: without it, HTTP/2's interleaved small writes wait on
            // delayed ACKs (16 streams at 40 ms each: the 400 requests/s seen before).
            tcp.set_nodelay(true)?;
            return Ok(Onward::Tcp(tcp));
        };
        let next_hop = SocketAddr::new(ep.target.ip(), 15008);
        let key = PoolKey {
            src_identity: self.cert.identity.to_string(),
            dst_identities: vec![id.to_string()],
            dst: next_hop,
            src_ip: next_hop.ip(),
        };
        let tls = ambit_identity::tls::client_config(&self.cert, std::slice::from_ref(id))?;
        let connect = move || async move {
            let tcp = tokio::net::TcpStream::connect(next_hop).await?;
            tcp.set_nodelay(true)?;
            ambit_hbone::tls::connect(ambit_hbone::ReadAhead::new(tcp), tls).await
        };
        let s = self
            .pool
            .connect(
                key,
                connect,
                &ConnectRequest::new(Authority::Addr(ep.target)),
            )
            .await?;
        Ok(Onward::Hbone(Box::new(s)))
    }

    async fn h2_sender(&self, i: usize) -> anyhow::Result<http2::SendRequest<Body>> {
        let held = self.h2.lock().unwrap_or_else(|p| p.into_inner())[i].clone();
        if let Some(s) = held.filter(|s| !s.is_closed()) {
            return Ok(s);
        }
        let io = TokioIo::new(self.open(i).await?);
        let (s, conn) = http2::handshake(TokioExecutor::new(), io).await?;
        tokio::spawn(conn);
        self.h2.lock().unwrap_or_else(|p| p.into_inner())[i] = Some(s.clone());
        Ok(s)
    }

    async fn h1_sender(&self, i: usize) -> anyhow::Result<http1::SendRequest<Body>> {
        loop {
            let idle = self.h1.lock().unwrap_or_else(|p| p.into_inner())[i].pop();
            match idle {
                Some(s) if s.is_ready() => return Ok(s),
                Some(_) => continue,
                None => break,
            }
        }
        let (s, conn) = http1::handshake(TokioIo::new(self.open(i).await?)).await?;
        tokio::spawn(conn);
        Ok(s)
    }
}

enum Onward {
    Hbone(Box<ambit_hbone::H2Stream>),
    Tcp(tokio::net::TcpStream),
}

impl AsyncRead for Onward {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Onward::Hbone(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            Onward::Tcp(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Onward {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Onward::Hbone(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            Onward::Tcp(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Onward::Hbone(s) => Pin::new(s.as_mut()).poll_flush(cx),
            Onward::Tcp(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Onward::Hbone(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            Onward::Tcp(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

/// A stream with its first bytes put back.
struct Prefixed<S> {
    first: Vec<u8>,
    inner: S,
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if !self.first.is_empty() {
            let n = self.first.len().min(buf.remaining());
            let head: Vec<u8> = self.first.drain(..n).collect();
            buf.put_slice(&head);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
