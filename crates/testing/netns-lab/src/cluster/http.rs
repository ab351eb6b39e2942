//! HTTP in a cluster's pods: an app that says which pod answered (HTTP/1.1 and h2c on one
//! port), and clients that are unmodified apps of a pod (their connections captured by the
//! pod's rules): requests in turn on one HTTP/1.1 connection, or many at once on one HTTP/2
//! connection. They run on the cluster's own tokio runtime, made on first use.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};

use anyhow::Context;
use bytes::Bytes;
use http_body_util::Full;
use hyper_util::rt::{TokioExecutor, TokioIo};

use super::Cluster;
use crate::l7::{reply, serve_app, Reply};
use crate::Lab;

impl Cluster {
    fn runtime(&self) -> anyhow::Result<&tokio::runtime::Runtime> {
        if let Some(rt) = self.rt.get() {
            return Ok(rt);
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .context("the cluster's tokio runtime")?;
        Ok(self.rt.get_or_init(|| rt))
    }

    /// An HTTP app in `pod` on `port` (HTTP/1.1, or h2c with prior knowledge), answering
    /// every request with `<pod> <method> <path>`.
    pub fn serve_http(&self, pod: &str, port: u16) -> anyhow::Result<()> {
        let listener = Lab::in_netns(&self.pod(pod).ns, move || {
            let l = std::net::TcpListener::bind(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, port))?;
            l.set_nonblocking(true)?;
            Ok(l)
        })
        .with_context(|| format!("binding port {port} in pod {pod}"))?;
        let rt = self.runtime()?;
        let _guard = rt.enter();
        let listener = tokio::net::TcpListener::from_std(listener)?;
        rt.spawn(serve_app(listener, pod.into(), Default::default()));
        Ok(())
    }

    /// Requests one after the other on one HTTP/1.1 connection (keep-alive) from `pod` to
    /// `dst`, with `host` as the Host header.
    pub fn http1_from(
        &self,
        pod: &str,
        dst: SocketAddr,
        host: &str,
        requests: &[(&str, &str)],
    ) -> anyhow::Result<Vec<Reply>> {
        let requests: Vec<http::Request<Full<Bytes>>> = requests
            .iter()
            .map(|(m, p)| request(m, host, p))
            .collect::<anyhow::Result<_>>()?;
        self.send_http1_from(pod, dst, requests)
    }

    /// Requests built by the caller ([`request`] makes one; add headers to it), one after
    /// the other on one HTTP/1.1 connection from `pod` to `dst`.
    pub fn send_http1_from(
        &self,
        pod: &str,
        dst: SocketAddr,
        requests: Vec<http::Request<Full<Bytes>>>,
    ) -> anyhow::Result<Vec<Reply>> {
        let stream = self.tokio_connect_from(pod, dst)?;
        self.runtime()?.block_on(async move {
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .context("HTTP/1.1 handshake")?;
            tokio::spawn(conn);
            let mut replies = Vec::new();
            for req in requests {
                sender.ready().await.context("HTTP/1.1 connection")?;
                let resp = sender.send_request(req).await.context("HTTP/1.1 request")?;
                replies.push(reply(resp).await?);
            }
            Ok(replies)
        })
    }

    /// `n` requests at once on ONE HTTP/2 connection (prior knowledge) from `pod` to `dst`.
    pub fn h2_from(
        &self,
        pod: &str,
        dst: SocketAddr,
        host: &str,
        (method, path): (&str, &str),
        n: usize,
    ) -> anyhow::Result<Vec<Reply>> {
        let stream = self.tokio_connect_from(pod, dst)?;
        let requests: Vec<http::Request<Full<Bytes>>> = (0..n)
            .map(|_| request(method, host, path))
            .collect::<anyhow::Result<_>>()?;
        self.runtime()?.block_on(async move {
            let (sender, conn) =
                hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                    .await
                    .context("HTTP/2 handshake")?;
            tokio::spawn(conn);
            let tasks: Vec<_> = requests
                .into_iter()
                .map(|req| {
                    let mut sender = sender.clone();
                    tokio::spawn(async move {
                        let resp = sender.send_request(req).await.context("HTTP/2 request")?;
                        reply(resp).await
                    })
                })
                .collect();
            let mut replies = Vec::new();
            for t in tasks {
                replies.push(t.await??);
            }
            Ok(replies)
        })
    }

    /// [`Cluster::connect_from`], as a tokio stream of the cluster's runtime.
    fn tokio_connect_from(
        &self,
        pod: &str,
        dst: SocketAddr,
    ) -> anyhow::Result<tokio::net::TcpStream> {
        let s = self.connect_from(pod, dst)?;
        s.set_nonblocking(true)?;
        let _guard = self.runtime()?.enter();
        Ok(tokio::net::TcpStream::from_std(s)?)
    }
}

/// A request to `host` (its `Host` header and authority), without a body.
pub fn request(method: &str, host: &str, path: &str) -> anyhow::Result<http::Request<Full<Bytes>>> {
    Ok(http::Request::builder()
        .method(method)
        .uri(format!("http://{host}{path}"))
        .header("host", host)
        .body(Full::new(Bytes::new()))?)
}
