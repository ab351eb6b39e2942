//! The three operator endpoints: admin (`/config_dump`, `/logging`, `/quitquitquit`) on
//! localhost, metrics (`/metrics`, `/stats/prometheus`) and readiness (`/healthz/ready`).

use std::sync::Arc;

use http::{Method, StatusCode};
use prometheus_client::registry::Registry;
use tokio::sync::mpsc;

use ambit_identity::CertManager;
use ambit_proxy::SharedState;

use crate::config::Config;
use crate::http::{text, with_type, Handler};
use crate::logging::LogHandle;
use crate::readiness::Ready;

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

pub struct AdminContext {
    pub config: Arc<Config>,
    pub state: SharedState,
    pub certs: Arc<CertManager>,
    pub logs: Option<LogHandle>,
    pub shutdown: mpsc::Sender<()>,
    pub static_config: serde_json::Value,
    /// In-pod mode: the pods this proxy serves.
    pub workload_state: Option<ambit_proxy::inpod::WorkloadStateDump>,
}

pub fn admin_handler(ctx: AdminContext) -> Handler {
    let ctx = Arc::new(ctx);
    Arc::new(move |method, uri, _| {
        match uri.path() {
        "/" => text(
            StatusCode::OK,
            "ambit admin\n  /config_dump\n  /logging (POST, ?level=<filter> or ?reset)\n  /quitquitquit (POST)\n",
        ),
        "/config_dump" => {
            let body = serde_json::to_string_pretty(&config_dump(&ctx))
                .unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
            with_type(StatusCode::OK, "application/json", body)
        }
        "/quitquitquit" => {
            if method != Method::POST {
                return text(StatusCode::METHOD_NOT_ALLOWED, "use POST\n");
            }
            let _ = ctx.shutdown.try_send(());
            text(StatusCode::OK, "shutdown now\n")
        }
        "/logging" => {
            if method != Method::POST {
                return text(StatusCode::METHOD_NOT_ALLOWED, "use POST\n");
            }
            let Some(logs) = &ctx.logs else {
                return text(StatusCode::INTERNAL_SERVER_ERROR, "logging is not configurable here\n");
            };
            logging(logs, uri.query())
        }
        _ => text(StatusCode::NOT_FOUND, "not found\n"),
    }
    })
}

fn logging(
    logs: &LogHandle,
    query: Option<&str>,
) -> http::Response<http_body_util::Full<bytes::Bytes>> {
    let query = query.unwrap_or("");
    let result = if query.is_empty() {
        Ok(())
    } else if query == "reset" {
        logs.reset()
    } else if let Some(level) = query.strip_prefix("level=") {
        let level = level.replace("%3D", "=").replace("%2C", ",");
        logs.set(&level)
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

fn config_dump(ctx: &AdminContext) -> serde_json::Value {
    let mut dump = ctx.state.get().dump();
    if let Some(obj) = dump.as_object_mut() {
        obj.insert(
            "certificates".into(),
            serde_json::to_value(ctx.certs.dump()).unwrap_or_default(),
        );
        obj.insert("staticConfig".into(), ctx.static_config.clone());
        obj.insert(
            "config".into(),
            serde_json::to_value(&*ctx.config).unwrap_or_default(),
        );
        obj.insert("version".into(), crate::version::info());
        if let Some(pods) = &ctx.workload_state {
            let pods = pods.lock().unwrap_or_else(|p| p.into_inner()).clone();
            obj.insert(
                "workloadState".into(),
                serde_json::to_value(pods).unwrap_or_default(),
            );
        }
    }
    dump
}
