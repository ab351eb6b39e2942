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

use crate::drain::DrainWatcher;

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

/// The limits of each listener: [`MAX_CONNECTIONS`] in all, a quarter of them per source
/// address, so one peer holding keep-alive connections cannot starve probes and scrapes.
pub fn limits() -> ambit_admission::Limits {
    ambit_admission::Limits::quarter_per_source(MAX_CONNECTIONS)
}

/// Serves `handler` on `listener` until draining starts, within [`limits`]: when a share
/// is spent, the connection idle longest (between requests, or slow to send its first)
/// is closed for the newcomer; only when every held connection is in a request is the
/// newcomer reset, never queued.
pub async fn serve(listener: TcpListener, handler: Handler, drain: DrainWatcher) {
    serve_limited(listener, handler, drain, limits()).await
}

async fn serve_limited(
    listener: TcpListener,
    handler: Handler,
    drain: DrainWatcher,
    limits: ambit_admission::Limits,
) {
    let gate = ambit_admission::Gate::new(limits);
    let reports = ambit_admission::ReportThrottle::default();
    let what = match listener.local_addr() {
        Ok(a) => format!("port {}", a.port()),
        Err(_) => "an operator port".to_string(),
    };
    loop {
        let accepted = tokio::select! {
            biased;
            _ = drain.draining() => return,
            a = ambit_admission::accept(&listener, &gate, &reports, &what) => a,
        };
        let handler = handler.clone();
        tokio::spawn(async move {
            let ambit_admission::Accepted { stream, ticket, .. } = accepted;
            let ticket = Arc::new(ticket);
            let in_request = ticket.clone();
            let service = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                // Busy while answering; idle (and the freshest of the idle) once answered.
                in_request.prove();
                let resp = handler(req.method(), req.uri(), req.headers());
                in_request.unprove();
                async move { Ok::<_, Infallible>(resp) }
            });
            let conn = http1::Builder::new()
                .half_close(true)
                .header_read_timeout(Duration::from_secs(2))
                .max_buf_size(8192)
                .timer(hyper_util::rt::TokioTimer::new())
                .serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                _ = tokio::time::timeout(Duration::from_secs(60), conn) => {}
                _ = ticket.evicted() => {}
            }
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

    /// A connection from `from` (an address of 127/8) that sends half a request and waits.
    fn idle_from(from: [u8; 4], addr: std::net::SocketAddr) -> std::net::TcpStream {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        s.bind(&std::net::SocketAddr::from((from, 0)).into())
            .unwrap();
        s.connect(&addr.into()).unwrap();
        let mut s = std::net::TcpStream::from(s);
        s.write_all(b"GET / HTTP/1.1\r\n").unwrap();
        s
    }

    fn get_from(from: [u8; 4], addr: std::net::SocketAddr) -> std::io::Result<String> {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
        s.bind(&std::net::SocketAddr::from((from, 0)).into())?;
        s.connect(&addr.into())?;
        let mut s = std::net::TcpStream::from(s);
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        s.write_all(b"GET / HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n")?;
        let mut out = String::new();
        s.read_to_string(&mut out)?;
        Ok(out)
    }

    /// Whether the server has closed `s` (a read sees the end or a reset, not a timeout).
    fn closed(s: &mut std::net::TcpStream) -> bool {
        s.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let mut b = [0u8; 64];
        match s.read(&mut b) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
        }
    }

    #[test]
    fn held_idle_connections_give_way_to_newcomers_from_any_source() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let listener = rt.block_on(TcpListener::bind("127.0.0.1:0")).unwrap();
        let addr = listener.local_addr().unwrap();
        let (_trigger, watcher) = crate::drain::new();
        let limits = ambit_admission::Limits {
            total: 4,
            per_source: 2,
        };
        rt.spawn(serve_limited(listener, hello(), watcher, limits));

        // One source holds its share with idle connections; a probe from it is served,
        // and the idle one held longest is what made room.
        let mut held: Vec<_> = (0..2).map(|_| idle_from([127, 0, 0, 1], addr)).collect();
        std::thread::sleep(Duration::from_millis(50));
        let answer = get_from([127, 0, 0, 1], addr).unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(closed(&mut held[0]), "the oldest idle connection was kept");
        assert!(
            !closed(&mut held[1]),
            "the newer idle connection was closed too"
        );

        // Every place held by idle connections of other sources: a newcomer still gets in.
        let _more: Vec<_> = [[127, 0, 0, 2], [127, 0, 0, 2], [127, 0, 0, 3]]
            .into_iter()
            .map(|from| idle_from(from, addr))
            .collect();
        let answer = get_from([127, 0, 0, 4], addr).unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }
}
