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

pub type Answer = Response<Full<Bytes>>;
pub type Handler = Arc<dyn Fn(&Method, &Uri, &HeaderMap) -> Answer + Send + Sync>;

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

/// Connections one listener serves at once. Scrapers, probes and an operator's curl need a
/// handful; the metrics and readiness ports listen on every address, so whoever can reach
/// the node must not be able to make the proxy hold more than this.
pub const MAX_CONNECTIONS: usize = 64;

/// Serves `handler` on `listener` until draining starts, at most `MAX_CONNECTIONS` at a
/// time: one more is closed at once (the client sees a reset), never queued.
pub async fn serve(listener: TcpListener, handler: Handler, drain: DrainWatcher) {
    serve_limited(listener, handler, drain, MAX_CONNECTIONS).await
}

async fn serve_limited(listener: TcpListener, handler: Handler, drain: DrainWatcher, limit: usize) {
    let slots = Arc::new(tokio::sync::Semaphore::new(limit));
    let shed_reports = ambit_proxy::admission::ReportThrottle::default();
    loop {
        let (stream, peer) = tokio::select! {
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
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            ambit_proxy::socket::reset_on_close(&stream);
            drop(stream);
            if shed_reports.due(std::time::Instant::now(), Duration::from_secs(10)) {
                let port = listener.local_addr().map(|a| a.port()).unwrap_or_default();
                tracing::warn!(
                    "port {port} already serves {limit} connections; closing the one from {peer} (more are closed quietly for 10 s)"
                );
            }
            continue;
        };
        let handler = handler.clone();
        tokio::spawn(async move {
            let _slot = slot;
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    fn hello() -> Handler {
        Arc::new(|_, _, _| text(StatusCode::OK, "hello\n"))
    }

    fn get(addr: std::net::SocketAddr) -> std::io::Result<String> {
        let mut s = std::net::TcpStream::connect(addr)?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        s.write_all(b"GET / HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n")?;
        let mut out = String::new();
        s.read_to_string(&mut out)?;
        Ok(out)
    }

    #[test]
    fn connections_beyond_the_limit_are_closed_and_the_rest_served() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let listener = rt.block_on(TcpListener::bind("127.0.0.1:0")).unwrap();
        let addr = listener.local_addr().unwrap();
        let (_trigger, watcher) = ambit_proxy::drain::new();
        rt.spawn(serve_limited(listener, hello(), watcher, 4));

        // Four idle clients hold every slot (each sends half a request and waits).
        let held: Vec<_> = (0..4)
            .map(|_| {
                let mut s = std::net::TcpStream::connect(addr).unwrap();
                s.write_all(b"GET / HTTP/1.1\r\n").unwrap();
                s
            })
            .collect();
        // The listener accepts in order, so the four took the slots before this one.
        let shed = get(addr);
        assert!(
            !matches!(&shed, Ok(answer) if answer.contains("hello")),
            "a fifth connection was served while four held the slots: {shed:?}"
        );

        // A slot freed is a slot served.
        drop(held);
        let mut answer = Err(std::io::Error::other("not tried"));
        for _ in 0..50 {
            answer = get(addr);
            if matches!(&answer, Ok(a) if a.contains("hello")) {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(
            answer.unwrap().starts_with("HTTP/1.1 200"),
            "not served after the slots freed"
        );
    }
}
