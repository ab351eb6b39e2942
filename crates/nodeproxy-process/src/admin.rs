//! The three operator endpoints: admin (`/config_dump`, `/logging`, `/quitquitquit`, and
//! ambit's `/xds_on_demand`) on localhost, metrics (`/metrics`, `/stats/prometheus`) and readiness (`/healthz/ready`).

use std::sync::Arc;

use http::StatusCode;
use tokio::sync::mpsc;

use ambit_identity::CertManager;
use ambit_nodeproxy::SharedState;

use crate::config::Config;
use ambit_runtime::http::{text, with_type, Handler};
use ambit_runtime::logging::LogHandle;
use ambit_runtime::operator::process_control;
pub use ambit_runtime::operator::{metrics_handler, readiness_handler, without_empty_families};

pub struct AdminContext {
    pub config: Arc<Config>,
    pub state: SharedState,
    pub certs: Arc<CertManager>,
    pub logs: Option<LogHandle>,
    pub shutdown: mpsc::Sender<()>,
    /// What the local configuration file put in the store at start-up (`staticConfig`).
    pub static_config: Arc<ambit_state::LocalFile>,
    /// In-pod mode: the pods this proxy serves.
    pub workload_state: Option<ambit_nodeproxy::pods::WorkloadStateDump>,
    /// On-demand xDS (`XDS_ON_DEMAND=true`).
    pub on_demand: Option<ambit_xds::OnDemand>,
}

pub fn admin_handler(ctx: AdminContext) -> Handler {
    let ctx = Arc::new(ctx);
    Arc::new(move |method, uri, headers| {
        if let Some(answer) =
            process_control(method, uri, headers, ctx.logs.as_ref(), &ctx.shutdown)
        {
            return answer;
        }
        match uri.path() {
        "/" => text(
            StatusCode::OK,
            "ambit admin\n  /config_dump\n  /xds_on_demand\n  /logging (POST, ?level=<filter> or ?reset)\n  /quitquitquit (POST)\n",
        ),
        // ambit's addition, its own path so that `/config_dump` keeps ztunnel's sections.
        "/xds_on_demand" => {
            let status = serde_json::json!({
                "enabled": ctx.on_demand.is_some(),
                "names": ctx.on_demand.as_ref().map(|od| od.status()),
            });
            with_type(StatusCode::OK, "application/json", status.to_string())
        }
        "/config_dump" => {
            let body = serde_json::to_string_pretty(&config_dump(&ctx))
                .unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
            with_type(StatusCode::OK, "application/json", body)
        }
        _ => text(StatusCode::NOT_FOUND, "not found\n"),
    }
    })
}

/// ztunnel's `staticConfig`: the local file as parsed, each service with an (always empty)
/// `endpoints`. Rendered per request from the items the store shares with the file.
fn static_config(file: &ambit_state::LocalFile) -> serde_json::Value {
    let mut v = file.to_json();
    if let Some(services) = v.get_mut("services").and_then(|s| s.as_array_mut()) {
        for service in services {
            if let Some(m) = service.as_object_mut() {
                m.insert("endpoints".into(), serde_json::json!({}));
            }
        }
    }
    v
}

fn config_dump(ctx: &AdminContext) -> serde_json::Value {
    let mut dump = ctx.state.get().dump();
    if let Some(obj) = dump.as_object_mut() {
        obj.insert(
            "certificates".into(),
            serde_json::to_value(ctx.certs.dump()).unwrap_or_default(),
        );
        obj.insert("staticConfig".into(), static_config(&ctx.static_config));
        obj.insert(
            "config".into(),
            crate::config_dump::config_section(&ctx.config),
        );
        obj.insert("version".into(), ambit_runtime::version::info());
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

#[cfg(test)]
mod tests {
    use super::*;
    use ambit_runtime::readiness::Ready;
    use http::Method;
    use http::{HeaderMap, HeaderValue, Uri};
    use prometheus_client::registry::Registry;

    fn call(
        handler: &Handler,
        method: Method,
        uri: &str,
        headers: HeaderMap,
    ) -> (StatusCode, String, String) {
        let response = handler(&method, &uri.parse::<Uri>().unwrap(), &headers);
        let content_type = response
            .headers()
            .get(http::header::CONTENT_TYPE)
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        let status = response.status();
        let body = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(http_body_util::BodyExt::collect(response.into_body()))
            .unwrap()
            .to_bytes();
        (
            status,
            content_type,
            String::from_utf8(body.to_vec()).unwrap(),
        )
    }

    fn get(handler: &Handler, uri: &str) -> (StatusCode, String) {
        let (status, _, body) = call(handler, Method::GET, uri, HeaderMap::new());
        (status, body)
    }

    fn post(handler: &Handler, uri: &str) -> (StatusCode, String) {
        post_with(handler, uri, &[("host", "127.0.0.1:15000")])
    }

    fn post_with(handler: &Handler, uri: &str, headers: &[(&str, &str)]) -> (StatusCode, String) {
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            map.append(
                http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                http::HeaderValue::from_str(value).unwrap(),
            );
        }
        let (status, _, body) = call(handler, Method::POST, uri, map);
        (status, body)
    }

    #[test]
    fn families_without_samples_are_left_out() {
        let text = "# HELP a A.\n# TYPE a counter\n# HELP b B.\n# TYPE b gauge\nb 1\n# HELP c C.\n# TYPE c counter\n# EOF\n";
        assert_eq!(
            without_empty_families(text),
            "# HELP b B.\n# TYPE b gauge\nb 1\n# EOF\n"
        );
        let labelled = "# HELP x X.\n# TYPE x counter\nx_total{k=\"v\"} 2\nx_total{k=\"w\"} 3\n";
        assert_eq!(without_empty_families(labelled), labelled);
    }

    #[test]
    fn readiness_names_what_is_pending_until_it_is_done() {
        let ready = Ready::default();
        let handler = readiness_handler(ready.clone());
        let proxy = ready.register("proxy");
        let state = ready.register("state manager");
        assert_eq!(
            get(&handler, "/healthz/ready"),
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "not ready, pending: proxy, state manager\n".to_string()
            )
        );
        drop(state);
        drop(proxy);
        assert_eq!(
            get(&handler, "/healthz/ready"),
            (StatusCode::OK, "ready\n".to_string())
        );
        assert_eq!(get(&handler, "/healthz/live").0, StatusCode::NOT_FOUND);
        assert_eq!(
            post(&handler, "/healthz/ready").0,
            StatusCode::METHOD_NOT_ALLOWED
        );
    }

    #[test]
    fn metrics_on_both_paths_in_the_format_asked_for() {
        let mut registry = Registry::default();
        let metrics = ambit_nodeproxy::metrics::Metrics::register(&mut registry, "1.24.0");
        metrics
            .connections_opened
            .get_or_create(&ambit_nodeproxy::metrics::TrafficLabels::new(
                ambit_nodeproxy::metrics::Reporter::Source,
            ))
            .inc();
        let handler = metrics_handler(Arc::new(registry));
        for path in ["/metrics", "/stats/prometheus"] {
            let (status, content_type, body) = call(&handler, Method::GET, path, HeaderMap::new());
            assert_eq!(status, StatusCode::OK, "{path}");
            assert_eq!(content_type, "text/plain; charset=utf-8");
            assert!(
                body.contains("istio_build{component=\"ztunnel\",tag=\"1.24.0\"} 1"),
                "{body}"
            );
            assert!(
                body.contains("istio_tcp_connections_opened_total{reporter=\"source\""),
                "{body}"
            );
        }
        let mut accept = HeaderMap::new();
        accept.insert(
            http::header::ACCEPT,
            HeaderValue::from_static(
                "text/plain;q=0.5, application/openmetrics-text;version=1.0.0",
            ),
        );
        let (_, content_type, body) = call(&handler, Method::GET, "/metrics", accept);
        assert!(
            content_type.starts_with("application/openmetrics-text"),
            "{content_type}"
        );
        assert!(
            body.contains("istio_tcp_connections_opened_total"),
            "{body}"
        );
        assert!(body.ends_with("# EOF\n"), "{body}");
        assert_eq!(get(&handler, "/stats").0, StatusCode::NOT_FOUND);
    }

    fn admin(logs: Option<LogHandle>) -> (Handler, mpsc::Receiver<()>) {
        let vars = std::collections::HashMap::from([
            ("PROXY_MODE".to_string(), "dedicated".to_string()),
            (
                "PROXY_WORKLOAD_INFO".to_string(),
                "shop/web/web".to_string(),
            ),
            ("LOCAL_XDS".to_string(), "{}".to_string()),
        ]);
        let config = Arc::new(Config::from_env(&vars).unwrap());
        let state = ambit_state::ProxyState::from_config(Default::default()).unwrap();
        let ca =
            Arc::new(ambit_identity::CertificateAuthority::ephemeral("cluster.local").unwrap());
        let (shutdown, shutdown_rx) = mpsc::channel(1);
        let ctx = AdminContext {
            config,
            state: SharedState::new(state),
            certs: CertManager::new(ca, std::time::Duration::from_secs(3600)),
            logs,
            shutdown,
            static_config: Arc::new(
                ambit_state::LocalFile::build(
                    ambit_state::load_local_config(
                        "test",
                        "workloads: [{name: web, namespace: shop}]\nservices: [{name: s, namespace: shop, hostname: s.shop}]\n",
                        None,
                    )
                    .unwrap(),
                )
                .unwrap()
                .0,
            ),
            workload_state: None,
            on_demand: None,
        };
        (admin_handler(ctx), shutdown_rx)
    }

    #[test]
    fn config_dump_has_ztunnels_sections() {
        let (handler, _) = admin(None);
        let (status, content_type, body) =
            call(&handler, Method::GET, "/config_dump", HeaderMap::new());
        assert_eq!(status, StatusCode::OK);
        assert_eq!(content_type, "application/json");
        let dump: serde_json::Value = serde_json::from_str(&body).unwrap();
        for key in [
            "workloads",
            "services",
            "policies",
            "certificates",
            "config",
            "version",
        ] {
            assert!(dump.get(key).is_some(), "no {key} in {dump}");
        }
        // ztunnel's flag in `config`; ambit's on-demand status on its own path.
        assert_eq!(dump["config"]["xdsOnDemand"], false);
        assert!(dump.get("xdsOnDemand").is_none(), "{dump}");
        let status: serde_json::Value =
            serde_json::from_str(&get(&handler, "/xds_on_demand").1).unwrap();
        assert_eq!(status, serde_json::json!({"enabled": false, "names": null}));
        // The file as written (no uid filled in), each service with empty endpoints.
        assert_eq!(
            dump["staticConfig"]["workloads"],
            serde_json::json!([{"name": "web", "namespace": "shop", "clusterId": "", "protocol": "TCP", "networkMode": "Standard", "status": "Healthy", "capacity": 1, "workloadIps": [], "services": {}}])
        );
        assert_eq!(
            dump["staticConfig"]["services"][0]["endpoints"],
            serde_json::json!({})
        );
        assert_eq!(get(&handler, "/nope").0, StatusCode::NOT_FOUND);
    }

    #[test]
    fn quitquitquit_takes_only_post_and_starts_the_shutdown() {
        let (handler, mut shutdown) = admin(None);
        assert_eq!(
            get(&handler, "/quitquitquit").0,
            StatusCode::METHOD_NOT_ALLOWED
        );
        assert!(shutdown.try_recv().is_err(), "a GET must not shut down");
        assert_eq!(
            post(&handler, "/quitquitquit"),
            (StatusCode::OK, "shutdown now\n".to_string())
        );
        assert!(shutdown.try_recv().is_ok());
    }

    #[test]
    fn logging_prints_sets_and_resets_the_level() {
        let (logs, _layer) = LogHandle::detached("info");
        let (handler, _) = admin(Some(logs));
        assert_eq!(get(&handler, "/logging").0, StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(
            post(&handler, "/logging"),
            (StatusCode::OK, "current log level is info\n".to_string())
        );
        let (status, body) = post(&handler, "/logging?level=warn,access%3Ddebug");
        assert_eq!(status, StatusCode::OK, "{body}");
        assert!(
            body.contains("access=debug") && body.contains("warn"),
            "{body}"
        );
        let (status, body) = post(&handler, "/logging?level=ambit=trace");
        assert_eq!(status, StatusCode::OK, "{body}");
        assert!(body.contains("ambit=trace"), "{body}");
        assert_eq!(
            post(&handler, "/logging?reset"),
            (StatusCode::OK, "current log level is info\n".to_string())
        );
        // Bad input is refused and changes nothing.
        for bad in [
            "/logging?level=%zz",
            "/logging?level=",
            "/logging?level=+",
            "/logging?level=%20",
            "/logging?level=a=b=c",
            "/logging?verbose",
        ] {
            let (status, body) = post(&handler, bad);
            assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {body}");
        }
        assert_eq!(post(&handler, "/logging").1, "current log level is info\n");
    }

    #[test]
    fn changes_refuse_browsers_and_foreign_hosts() {
        let (logs, _layer) = LogHandle::detached("info");
        let (handler, mut shutdown) = admin(Some(logs));
        for path in ["/quitquitquit", "/logging?level=trace"] {
            for headers in [
                vec![],
                vec![("host", "evil.example")],
                vec![("host", "evil.example:15000")],
                vec![("host", "10.0.0.1:15000")],
                vec![("host", "localhost.evil.example")],
                vec![("host", "127.0.0.1:notaport")],
                vec![("host", "[::1]junk")],
                vec![
                    ("host", "127.0.0.1:15000"),
                    ("origin", "http://127.0.0.1:15000"),
                ],
                vec![("host", "localhost"), ("origin", "null")],
            ] {
                let (status, body) = post_with(&handler, path, &headers);
                assert_eq!(status, StatusCode::FORBIDDEN, "{path} {headers:?}: {body}");
                assert!(body.starts_with("refused: "), "{body}");
            }
        }
        assert!(shutdown.try_recv().is_err(), "a refused request shut down");
        assert_eq!(post(&handler, "/logging").1, "current log level is info\n");
        for host in [
            "localhost:15000",
            "LOCALHOST",
            "127.0.0.1",
            "127.1.2.3:15000",
            "[::1]:15000",
            "[::1]",
        ] {
            let (status, body) = post_with(&handler, "/logging", &[("host", host)]);
            assert_eq!(status, StatusCode::OK, "{host}: {body}");
        }
        assert_eq!(
            post_with(&handler, "/quitquitquit", &[("host", "localhost:15000")]).0,
            StatusCode::OK
        );
        assert!(shutdown.try_recv().is_ok());
    }
}
