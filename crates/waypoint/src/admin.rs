//! The admin port (localhost 15000): `/config_dump` (the mesh as this waypoint holds it,
//! its policies with their targets, its certificate, its settings), `/logging` and
//! `/quitquitquit`, with the node proxy's guard against browser pages.

use std::sync::Arc;

use http::StatusCode;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use ambit_identity::CertManager;
use ambit_manifests::{PolicyTarget, WaypointAction};
use ambit_runtime::http::{text, with_type, Handler};
use ambit_runtime::logging::LogHandle;
use ambit_runtime::operator::process_control;

use crate::Waypoint;

pub fn admin_handler(
    wp: Arc<Waypoint>,
    certs: Arc<CertManager>,
    logs: Option<LogHandle>,
    shutdown: mpsc::Sender<()>,
) -> Handler {
    Arc::new(move |method, uri, headers| {
        if let Some(answer) = process_control(method, uri, headers, logs.as_ref(), &shutdown) {
            return answer;
        }
        match uri.path() {
        "/" => text(
            StatusCode::OK,
            "ambit waypoint admin\n  /config_dump\n  /logging (POST, ?level=<filter> or ?reset)\n  /quitquitquit (POST)\n",
        ),
        "/config_dump" => {
            let body = serde_json::to_string_pretty(&config_dump(&wp, &certs))
                .unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
            with_type(StatusCode::OK, "application/json", body)
        }
        _ => text(StatusCode::NOT_FOUND, "not found\n"),
    }
    })
}

fn target(t: &PolicyTarget) -> Value {
    match t {
        PolicyTarget::Gateway { namespace, name } => {
            json!({"kind": "Gateway", "namespace": namespace, "name": name})
        }
        PolicyTarget::Service { namespace, name } => {
            json!({"kind": "Service", "namespace": namespace, "name": name})
        }
        PolicyTarget::ServiceEntry { namespace, name } => {
            json!({"kind": "ServiceEntry", "namespace": namespace, "name": name})
        }
        PolicyTarget::GatewayClass { name } => json!({"kind": "GatewayClass", "name": name}),
    }
}

/// ztunnel's sections for what it shares with the node proxy (`workloads`, `services`,
/// `certificates`), and the waypoint's own: `waypointPolicies` and `waypoint`.
pub fn config_dump(wp: &Waypoint, certs: &CertManager) -> Value {
    let mut dump = wp.state.get().dump();
    let policies: Vec<Value> = wp
        .policies
        .get()
        .policies
        .iter()
        .map(|p| {
            let action = match &p.action {
                WaypointAction::Allow => json!("ALLOW"),
                WaypointAction::Deny => json!("DENY"),
                WaypointAction::Audit => json!("AUDIT"),
                WaypointAction::Custom { provider } => json!({"CUSTOM": provider}),
            };
            json!({
                "name": p.authorization.name,
                "namespace": p.authorization.namespace,
                "action": action,
                "dryRun": p.authorization.dry_run,
                "targets": p.targets.iter().map(target).collect::<Vec<_>>(),
                "rules": p.authorization.rules,
            })
        })
        .collect();
    if let Some(m) = dump.as_object_mut() {
        m.insert("waypointPolicies".into(), Value::Array(policies));
        let authns: Vec<Value> = wp
            .authns
            .get()
            .authns()
            .map(|a| {
                json!({
                    "name": a.name,
                    "namespace": a.namespace,
                    "targets": a.targets.iter().map(target).collect::<Vec<_>>(),
                    "jwtRules": a.rules.iter().map(|r| json!({
                        "issuer": r.issuer,
                        "audiences": r.audiences,
                        "jwks": match &r.jwks {
                            ambit_manifests::JwksSource::Inline(_) => "inline".to_string(),
                            ambit_manifests::JwksSource::Uri(u) => u.to_string(),
                            ambit_manifests::JwksSource::Discovery => "discovery (not done: tokens refused)".to_string(),
                        },
                        "forwardOriginalToken": r.forward_original_token,
                    })).collect::<Vec<_>>(),
                })
            })
            .collect();
        m.insert(
            "waypointRequestAuthentications".into(),
            Value::Array(authns),
        );
        m.insert(
            "waypointRoutes".into(),
            crate::route_status::dump(&wp.routes.get(), &wp.state.get(), &wp.cfg.cluster_domain),
        );
        m.insert(
            "waypointDestinationRules".into(),
            destination_rules(&wp.destination_rules.get()),
        );
        m.insert(
            "certificates".into(),
            serde_json::to_value(certs.dump()).unwrap_or_default(),
        );
        m.insert(
            "waypoint".into(),
            json!({
                "identity": wp.identity.to_string(),
                "namespace": wp.cfg.namespace,
                "pod": wp.cfg.pod_name,
                "gateway": wp.cfg.gateway,
                "gatewayClass": wp.cfg.gateway_class,
                "network": wp.cfg.network,
                "hboneAddress": wp.cfg.hbone_addr.to_string(),
                "pathNormalization": wp.cfg.path_normalization.as_str(),
                "workerThreads": wp.cfg.worker_threads,
            }),
        );
    }
    dump
}

/// The DestinationRules in force, each with its traffic policy as applied (defaults
/// filled in), and those refused.
fn destination_rules(rules: &crate::destination_rules::DestinationRules) -> Value {
    use ambit_traffic_policy::{HashAlgorithm, HashKey, LoadBalancer, PortPolicy};
    fn limit(v: u32) -> Value {
        match v {
            ambit_traffic_policy::UNLIMITED => json!("unlimited"),
            v => json!(v),
        }
    }
    fn policy(p: &PortPolicy) -> Value {
        let lb = match &p.load_balancer {
            LoadBalancer::LeastRequest => json!({"simple": "LEAST_REQUEST"}),
            LoadBalancer::RoundRobin => json!({"simple": "ROUND_ROBIN"}),
            LoadBalancer::Random => json!({"simple": "RANDOM"}),
            LoadBalancer::ConsistentHash(ch) => {
                let key = match &ch.key {
                    HashKey::Header(h) => json!({"httpHeaderName": h.as_str()}),
                    HashKey::Cookie(c) => json!({"httpCookie": {
                        "name": c.name,
                        "path": c.path,
                        "ttl": c.ttl.map(|t| format!("{}s", t.as_secs_f64())),
                    }}),
                    HashKey::SourceIp => json!({"useSourceIp": true}),
                    HashKey::QueryParameter(q) => json!({"httpQueryParameterName": q}),
                };
                let algorithm = match ch.algorithm {
                    HashAlgorithm::RingHash { minimum_ring_size } => {
                        json!({"ringHash": {"minimumRingSize": minimum_ring_size}})
                    }
                    HashAlgorithm::Maglev { table_size } => {
                        json!({"maglev": {"tableSize": table_size}})
                    }
                };
                json!({"consistentHash": {"key": key, "algorithm": algorithm}})
            }
        };
        let pool = &p.connection_pool;
        json!({
            "loadBalancer": lb,
            "connectionPool": {
                "maxConnections": limit(pool.max_connections),
                "http2MaxRequests": limit(pool.max_requests),
                "http1MaxPendingRequests": limit(pool.max_pending_requests),
                "maxRetries": limit(pool.max_retries),
                "connectTimeout": format!("{}s", pool.connect_timeout.as_secs_f64()),
            },
            "outlierDetection": p.outlier.map(|o| json!({
                "consecutive5xxErrors": o.consecutive_5xx,
                "consecutiveGatewayErrors": o.consecutive_gateway,
                "splitExternalLocalOriginErrors": o.split_local_origin,
                "consecutiveLocalOriginFailures": o.consecutive_local_origin,
                "interval": format!("{}s", o.interval.as_secs_f64()),
                "baseEjectionTime": format!("{}s", o.base_ejection_time.as_secs_f64()),
                "maxEjectionPercent": o.max_ejection_percent,
                "minHealthPercent": o.min_health_percent,
            })),
        })
    }
    json!({
        "rules": rules.rules().iter().map(|r| json!({
            "namespace": r.namespace,
            "name": r.name,
            "host": r.host,
            "targetRefs": r.targets.iter().map(target).collect::<Vec<_>>(),
            "exportTo": r.export_to,
            "trafficPolicy": policy(&r.policy.default),
            "portLevelSettings": r.policy.ports.iter().map(|(port, p)| json!({
                "port": port,
                "trafficPolicy": policy(p),
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "refused": rules.refused.iter().map(|(key, why)| json!({"rule": key, "error": why})).collect::<Vec<_>>(),
        "kept": rules.kept,
    })
}
