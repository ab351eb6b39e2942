//! A tiny HTTP/1.1 server for the admin, metrics and readiness endpoints. Handlers are
//! synchronous: every answer is computed from in-memory state.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Response, StatusCode, Uri};
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use ambit_proxy::drain::DrainWatcher;

pub type Handler = Arc<dyn Fn(&Method, &Uri, &HeaderMap) -> Response<Full<Bytes>> + Send + Sync>;

pub fn text(status: StatusCode, body: impl Into<String>) -> Response<Full<Bytes>> {
    with_type(status, "text/plain; charset=utf-8", body.into())
}

pub fn with_type(status: StatusCode, content_type: &str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    if let Ok(v) = http::HeaderValue::from_str(content_type) {
        r.headers_mut().insert(http::header::CONTENT_TYPE, v);
    }
    r
}

/// Serves `handler` on `listener` until draining starts.
pub async fn serve(listener: TcpListener, handler: Handler, drain: DrainWatcher) {
    loop {
        let (stream, _) = tokio::select! {
            biased;
            _ = drain.draining() => return,
            r = listener.accept() => match r {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!("admin accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            }
        };
        let handler = handler.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                let resp = handler(req.method(), req.uri(), req.headers());
                async move { Ok::<_, Infallible>(resp) }
            });
            let conn = http1::Builder::new()
                .half_close(true)
                .header_read_timeout(Duration::from_secs(2))
                .max_buf_size(8192)
                .timer(hyper_util::rt::TokioTimer::new())
                .serve_connection(TokioIo::new(stream), service);
            let _ = tokio::time::timeout(Duration::from_secs(60), conn).await;
        });
    }
}
