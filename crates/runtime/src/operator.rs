//! The operator endpoints every ambit process serves the same way: readiness
//! (`/healthz/ready`, naming what is still pending) and Prometheus metrics (`/metrics` and
//! Istio's `/stats/prometheus`, families without samples left out as ztunnel does); the
//! admin port's guard against browsers, and its `/logging`.

use std::sync::Arc;

use http::{HeaderMap, Method, StatusCode, Uri};
use prometheus_client::registry::Registry;
use tokio::sync::mpsc;

use crate::http::{text, with_type, Handler};
use crate::logging::LogHandle;
use crate::readiness::Ready;

/// `/healthz/ready`: 200 once every registered task is ready, else 500 naming them.
pub fn readiness_handler(ready: Ready) -> Handler {
    Arc::new(move |method, uri, _| {
        if uri.path() != "/healthz/ready" {
            return text(StatusCode::NOT_FOUND, "not found\n");
        }
        if method != Method::GET {
            return text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
        }
        let pending = ready.pending();
        if pending.is_empty() {
            text(StatusCode::OK, "ready\n")
        } else {
            text(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("not ready, pending: {}\n", pending.join(", ")),
            )
        }
    })
}

/// `/metrics` and `/stats/prometheus`: the registry, in the text format or OpenMetrics
/// as the `Accept` header asks.
pub fn metrics_handler(registry: Arc<Registry>) -> Handler {
    Arc::new(move |_, uri, headers| {
        if uri.path() != "/metrics" && uri.path() != "/stats/prometheus" {
            return text(StatusCode::NOT_FOUND, "not found\n");
        }
        let mut body = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut body, &registry) {
            return text(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("encoding metrics: {e}\n"),
            );
        }
        let body = without_empty_families(&body);
        let openmetrics = headers
            .get_all(http::header::ACCEPT)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|v| v.trim().starts_with("application/openmetrics-text"));
        let content_type = if openmetrics {
            "application/openmetrics-text;charset=utf-8;version=1.0.0"
        } else {
            "text/plain; charset=utf-8"
        };
        with_type(StatusCode::OK, content_type, body)
    })
}

/// The exposition without the `# HELP`/`# TYPE`/`# UNIT` lines of families that have no
/// sample yet: ztunnel leaves such families out altogether.
pub fn without_empty_families(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut header: Vec<&str> = Vec::new();
    let mut family = "";
    for line in text.lines() {
        if let Some(rest) = line
            .strip_prefix("# HELP ")
            .or_else(|| line.strip_prefix("# TYPE "))
            .or_else(|| line.strip_prefix("# UNIT "))
        {
            let name = rest.split(' ').next().unwrap_or("");
            if name != family {
                header.clear();
                family = name;
            }
            header.push(line);
            continue;
        }
        if !line.starts_with('#') {
            for h in header.drain(..) {
                out.push_str(h);
                out.push('\n');
            }
        } else {
            header.clear();
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// The listener is on loopback, but a browser on the node can still reach it: a page
/// can POST to `http://127.0.0.1:15000/quitquitquit` without reading the answer, and DNS
/// rebinding can make a foreign name resolve to loopback. Either shows up in the headers:
/// browsers send `Origin` on every cross-origin POST, and a rebound name stays in `Host`.
/// So the endpoints that change the proxy take only requests addressed to a loopback
/// name and without `Origin`; curl, istioctl's port-forward and scripts send both right.
pub fn refused_unless_from_the_node(headers: &HeaderMap) -> Option<crate::http::Answer> {
    if headers.contains_key(http::header::ORIGIN) {
        return Some(text(
            StatusCode::FORBIDDEN,
            "refused: a request with an Origin header comes from a browser page; \
             send it without one (e.g. with curl) from the node\n",
        ));
    }
    let host = headers
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok());
    match host {
        Some(host) if is_loopback_host(host) => None,
        Some(host) => Some(text(
            StatusCode::FORBIDDEN,
            format!(
                "refused: Host {host:?} is not a loopback name; address the admin port as \
                 localhost, 127.0.0.1 or [::1]\n"
            ),
        )),
        None => Some(text(
            StatusCode::FORBIDDEN,
            "refused: no Host header; address the admin port as localhost, 127.0.0.1 or [::1]\n",
        )),
    }
}

/// `localhost`, `127.0.0.0/8` or `[::1]`, each with or without a port.
fn is_loopback_host(host: &str) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        match rest.split_once(']') {
            Some((inside, "")) => inside,
            Some((inside, port)) if port.strip_prefix(':').is_some_and(valid_port) => inside,
            _ => return false,
        }
    } else {
        match host.rsplit_once(':') {
            Some((name, port)) if valid_port(port) => name,
            Some(_) => return false,
            None => host,
        }
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

fn valid_port(port: &str) -> bool {
    port.parse::<u16>().is_ok()
}

/// `/logging`: `?level=<filter>` sets the log filter, `?reset` restores the one the
/// process started with, nothing shows it.
pub fn logging(
    logs: &LogHandle,
    query: Option<&str>,
) -> http::Response<http_body_util::Full<bytes::Bytes>> {
    let query = query.unwrap_or("");
    let result = if query.is_empty() {
        Ok(())
    } else if query == "reset" {
        logs.reset()
    } else if let Some(level) = query.strip_prefix("level=") {
        percent_decode(level)
            .ok_or_else(|| format!("level {level:?} is not valid percent-encoded UTF-8"))
            .and_then(|level| {
                if level.trim().is_empty() {
                    return Err("level is empty: use ?level=<filter>, such as ?level=info \
                                or ?level=warn,access=debug"
                        .into());
                }
                logs.set(&level)
            })
    } else {
        Err(format!(
            "unknown query {query:?}: use ?level=<filter> or ?reset"
        ))
    };
    match result {
        Ok(()) => text(
            StatusCode::OK,
            format!("current log level is {}\n", logs.current()),
        ),
        Err(e) => text(StatusCode::BAD_REQUEST, format!("{e}\n")),
    }
}

/// `%XX` escapes (and `+` as a space) decoded; `None` for a broken escape or bytes that are
/// not UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    let mut out = Vec::with_capacity(s.len());
    let mut bytes = s.bytes();
    while let Some(b) = bytes.next() {
        out.push(match b {
            b'%' => {
                // Two hex digits exactly: `from_str_radix` alone would also take "+f".
                let hex = [bytes.next()?, bytes.next()?];
                if !hex.iter().all(u8::is_ascii_hexdigit) {
                    return None;
                }
                u8::from_str_radix(std::str::from_utf8(&hex).ok()?, 16).ok()?
            }
            b'+' => b' ',
            b => b,
        });
    }
    String::from_utf8(out).ok()
}

/// The admin endpoints that change the process, as every ambit process serves them:
/// `/quitquitquit` (POST: a message on `shutdown`) and `/logging` (POST, see [`logging`]),
/// both behind [`refused_unless_from_the_node`]. `None` for any other path.
pub fn process_control(
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    logs: Option<&LogHandle>,
    shutdown: &mpsc::Sender<()>,
) -> Option<crate::http::Answer> {
    let path = uri.path();
    if path != "/quitquitquit" && path != "/logging" {
        return None;
    }
    if method != Method::POST {
        return Some(text(StatusCode::METHOD_NOT_ALLOWED, "use POST\n"));
    }
    if let Some(refused) = refused_unless_from_the_node(headers) {
        return Some(refused);
    }
    Some(if path == "/quitquitquit" {
        let _ = shutdown.try_send(());
        text(StatusCode::OK, "shutdown now\n")
    } else {
        match logs {
            Some(logs) => logging(logs, uri.query()),
            None => text(
                StatusCode::INTERNAL_SERVER_ERROR,
                "logging is not configurable here\n",
            ),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode("a%3Db%2cc+d").as_deref(), Some("a=b,c d"));
        assert_eq!(percent_decode("plain").as_deref(), Some("plain"));
        for bad in ["%", "%4", "%zz", "%ff", "%+f", "%-1"] {
            assert_eq!(percent_decode(bad), None, "{bad}");
        }
    }
}
