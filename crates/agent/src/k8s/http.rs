//! A small HTTP/1 server (hyper) for the health, metrics and plugin endpoints, over TCP or a
//! Unix socket. Request bodies are capped; handlers get the method, path and whole body.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};

/// A handler's answer: status, content type, body.
pub type Answer = (StatusCode, &'static str, String);
pub type Handler = Arc<
    dyn Fn(Method, String, Bytes) -> Pin<Box<dyn Future<Output = Answer> + Send>> + Send + Sync,
>;

/// How long a client has for its request head (slow clients must not pile up).
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves one connection.
pub async fn serve_connection<IO>(io: IO, handler: Handler, max_body: usize)
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    serve_admitted(io, handler, max_body, None).await
}

/// Connections one TCP listener serves at once: probes and scrapes need a handful, and
/// these ports listen on every address of the node.
pub const MAX_TCP_CONNECTIONS: usize = 64;
/// The longest a TCP connection is kept, however busy.
const MAX_CONNECTION_LIFETIME: Duration = Duration::from_secs(60);

/// Serves one connection; with a ticket of an admission gate, marks it busy while a
/// request is answered (idle connections are the ones closed for newcomers).
async fn serve_admitted<IO>(
    io: IO,
    handler: Handler,
    max_body: usize,
    ticket: Option<Arc<ambit_admission::Ticket>>,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
        let handler = handler.clone();
        let busy = ticket.clone().map(Busy::new);
        async move {
            let _busy = busy;
            let method = req.method().clone();
            let path = req.uri().path().to_owned();
            let answer = match Limited::new(req.into_body(), max_body).collect().await {
                Ok(body) => handler(method, path, body.to_bytes()).await,
                Err(e) => (
                    StatusCode::BAD_REQUEST,
                    "text/plain",
                    format!("cannot read the request body (at most {max_body} bytes): {e}"),
                ),
            };
            let (status, content_type, body) = answer;
            let mut resp = Response::new(Full::new(Bytes::from(body)));
            *resp.status_mut() = status;
            if let Ok(v) = hyper::header::HeaderValue::from_str(content_type) {
                resp.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
            }
            Ok::<_, std::convert::Infallible>(resp)
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT);
    if let Err(e) = builder.serve_connection(TokioIo::new(io), service).await {
        tracing::debug!(error = %e, "HTTP connection ended with an error");
    }
}

/// Marks a connection busy until dropped, then idle again.
struct Busy(Arc<ambit_admission::Ticket>);

impl Busy {
    fn new(ticket: Arc<ambit_admission::Ticket>) -> Busy {
        ticket.prove();
        Busy(ticket)
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.unprove();
    }
}

/// Accepts on `listener` until the task is dropped, at most [`MAX_TCP_CONNECTIONS`] at
/// once and a quarter of them per source address: when a share is spent, the connection
/// idle longest is closed for the newcomer (a peer holding keep-alive connections cannot
/// starve the kubelet's probes), and a newcomer is reset only when every one is busy.
pub async fn serve_tcp(listener: tokio::net::TcpListener, handler: Handler, max_body: usize) {
    let gate = ambit_admission::Gate::new(ambit_admission::Limits::quarter_per_source(
        MAX_TCP_CONNECTIONS,
    ));
    let reports = ambit_admission::ReportThrottle::default();
    let what = match listener.local_addr() {
        Ok(a) => format!("port {}", a.port()),
        Err(_) => "an HTTP port".to_string(),
    };
    loop {
        let accepted = ambit_admission::accept(&listener, &gate, &reports, &what).await;
        let ticket = Arc::new(accepted.ticket);
        let handler = handler.clone();
        tokio::spawn(async move {
            let served = serve_admitted(accepted.stream, handler, max_body, Some(ticket.clone()));
            tokio::select! {
                _ = tokio::time::timeout(MAX_CONNECTION_LIFETIME, served) => {}
                _ = ticket.evicted() => {}
            }
        });
    }
}

/// Accepts on `listener` until the task is dropped.
pub async fn serve_unix(listener: tokio::net::UnixListener, handler: Handler, max_body: usize) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                tokio::spawn(serve_connection(stream, handler.clone(), max_body));
            }
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Wraps an async closure as a [`Handler`].
pub fn handler<F, Fut>(f: F) -> Handler
where
    F: Fn(Method, String, Bytes) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Answer> + Send + 'static,
{
    Arc::new(move |m, p, b| Box::pin(f(m, p, b)))
}
