//! The operator endpoints every ambit process serves the same way: readiness
//! (`/healthz/ready`, naming what is still pending) and Prometheus metrics (`/metrics` and
//! Istio's `/stats/prometheus`, families without samples left out as ztunnel does).

use std::sync::Arc;

use http::{Method, StatusCode};
use prometheus_client::registry::Registry;

use crate::http::{text, with_type, Handler};
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
