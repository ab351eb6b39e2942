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
    let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
        let handler = handler.clone();
        async move {
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

/// Accepts on `listener` until the task is dropped.
pub async fn serve_tcp(listener: tokio::net::TcpListener, handler: Handler, max_body: usize) {
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
