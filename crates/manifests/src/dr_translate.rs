//! A DestinationRule, as read ([`crate::dr_schema`]), checked as Istio checks it and
//! translated into the waypoint's model ([`WaypointDestinationRule`], its traffic policy
//! the `ambit_traffic_policy` model).
//!
//! What the waypoint does not apply is either skipped, when it only tunes what the
//! waypoint already does well enough (keepalives, idle timeouts, HTTP/2 upgrade, warmup,
//! locality settings: WDS ranks localities), or refused by name, when ignoring it would
//! change what is sent or where: `PASSTHROUGH`, `tunnel`, `proxyProtocol`, TLS origination
//! (`SIMPLE`, `MUTUAL`: not yet), a cookie's `attributes`. One with a `workloadSelector` is
//! for the selected sidecars: skipped. Sans-IO.

use std::collections::HashSet;
use std::time::Duration;

use std::path::PathBuf;

use ambit_traffic_policy::{
    hash::is_prime, ClientIdentity, ClientTls, ConnectionPool, ConsistentHash, CookieKey,
    HashAlgorithm, HashKey, LoadBalancer, OutlierDetection, PortPolicy, TrafficPolicy,
    DEFAULT_MAGLEV_TABLE, DEFAULT_RING_SIZE, MAX_MAGLEV_TABLE,
};
use http::header::HeaderName;

use crate::dr_schema::{
    ConnectionPoolFields, ConsistentHashFields, DestinationRuleObject, LoadBalancerFields,
    OutlierFields, PortLevelFields, TlsFields, TrafficPolicyFields,
};
use crate::go_duration::parse_go_duration;
use crate::locate::{field, FieldPath};
use crate::model::{PolicyTarget, SkipReason, WaypointDestinationRule};
use crate::translate::{check_dns, namespace_and_name, targets, Invalid};
use crate::ParseOptions;

/// The versions of DestinationRule read (of `networking.istio.io`).
pub const DESTINATION_RULE_VERSIONS: &[&str] = &["v1", "v1beta1", "v1alpha3"];
/// Istio's group for DestinationRule and ServiceEntry.
pub const NETWORKING_GROUP: &str = "networking.istio.io";

/// The CRD's bound on `portLevelSettings`.
const MAX_PORT_SETTINGS: usize = 4096;

fn invalid(path: FieldPath, message: impl Into<String>) -> Invalid {
    Invalid {
        path,
        message: message.into(),
    }
}

/// What a DestinationRule came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RuleOutcome {
    Rule(Box<WaypointDestinationRule>),
    Skipped(SkipReason),
}

pub(crate) struct RuleTranslation {
    pub namespace: String,
    pub name: String,
    pub outcome: RuleOutcome,
}

pub(crate) fn translate_destination_rule(
    object: DestinationRuleObject,
    options: &ParseOptions,
) -> Result<RuleTranslation, Invalid> {
    let (namespace, name) = namespace_and_name(&object.metadata, options)?;
    let spec = object.spec.unwrap_or_default();
    let host = match spec.host {
        Some(h) if !h.0.is_empty() => h.0,
        _ => {
            return Err(invalid(
                field!["spec", "host"],
                "missing: a DestinationRule names the host its policy applies to",
            ))
        }
    };
    check_host(&host).map_err(|m| invalid(field!["spec", "host"], m))?;
    let targets = targets(
        false,
        None,
        spec.target_refs.as_deref(),
        &namespace,
        options,
    )?;
    for (i, t) in targets.iter().enumerate() {
        if !matches!(
            t,
            PolicyTarget::Service { .. } | PolicyTarget::ServiceEntry { .. }
        ) {
            return Err(invalid(
                field!["spec", "targetRefs", i, "kind"],
                "a DestinationRule targets a Service or a ServiceEntry",
            ));
        }
    }
    let mut export_to = Vec::new();
    for (i, e) in spec.export_to.into_iter().flatten().enumerate() {
        let e = e.0;
        if e != "*" && e != "." && e != "~" {
            check_dns(&e, 63, false).map_err(|m| {
                invalid(
                    field!["spec", "exportTo", i],
                    format!("{m}; or \".\" or \"*\""),
                )
            })?;
        }
        export_to.push(e);
    }
    let policy = traffic_policy(spec.traffic_policy.unwrap_or_default())?;
    let outcome = match spec.workload_selector {
        Some(_) => RuleOutcome::Skipped(SkipReason::RuleWorkloadSelector),
        None => RuleOutcome::Rule(Box::new(WaypointDestinationRule {
            namespace: namespace.clone(),
            name: name.clone(),
            host,
            targets,
            export_to,
            policy,
        })),
    };
    Ok(RuleTranslation {
        namespace,
        name,
        outcome,
    })
}

/// A host as Istio admits one: a DNS name, a short name, or `*.` and a suffix.
fn check_host(host: &str) -> Result<(), String> {
    let name = host.strip_prefix("*.").unwrap_or(host);
    if host == "*" {
        return Err("\"*\" alone is not a host; name one, or \"*.\" and a domain".into());
    }
    let ok = !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        });
    if ok {
        Ok(())
    } else {
        Err(format!("{host:?} is not a host name (DNS labels of letters, digits and '-', or \"*.\" and a domain)"))
    }
}

fn traffic_policy(f: TrafficPolicyFields) -> Result<TrafficPolicy, Invalid> {
    let top = field!["spec", "trafficPolicy"];
    if f.tunnel.is_some() {
        return Err(invalid(
            top.at(field!["tunnel"]),
            "not applied by the waypoint: tunnelling TCP onward over CONNECT or POST is not supported",
        ));
    }
    if f.proxy_protocol.is_some() {
        return Err(invalid(
            top.at(field!["proxyProtocol"]),
            "not applied by the waypoint: it would change the bytes sent to the backend",
        ));
    }
    let default = port_policy(
        &top,
        f.load_balancer,
        f.connection_pool,
        f.outlier_detection,
        f.tls,
    )?;
    let mut ports = Vec::new();
    let mut seen = HashSet::new();
    let settings = f.port_level_settings.unwrap_or_default();
    if settings.len() > MAX_PORT_SETTINGS {
        return Err(invalid(
            top.at(field!["portLevelSettings"]),
            format!("at most {MAX_PORT_SETTINGS} entries"),
        ));
    }
    for (i, s) in settings.into_iter().enumerate() {
        let at = top.at(field!["portLevelSettings", i]);
        let PortLevelFields {
            port,
            load_balancer,
            connection_pool,
            outlier_detection,
            tls,
        } = s;
        let number = port.and_then(|p| p.number);
        let port = match number.map(u16::try_from) {
            Some(Ok(n)) if n > 0 => n,
            Some(_) => {
                return Err(invalid(
                    at.at(field!["port", "number"]),
                    "a port number is 1 to 65535",
                ))
            }
            None => {
                return Err(invalid(
                    at.at(field!["port"]),
                    "missing: port-level settings name their port (port.number)",
                ))
            }
        };
        if !seen.insert(port) {
            return Err(invalid(
                at.at(field!["port", "number"]),
                format!("port {port} has settings already"),
            ));
        }
        let policy = port_policy(&at, load_balancer, connection_pool, outlier_detection, tls)?;
        ports.push((port, policy));
    }
    Ok(TrafficPolicy { default, ports })
}

fn port_policy(
    at: &FieldPath,
    load_balancer: Option<LoadBalancerFields>,
    pool: Option<ConnectionPoolFields>,
    outlier: Option<OutlierFields>,
    tls: Option<TlsFields>,
) -> Result<PortPolicy, Invalid> {
    let tls = match tls {
        Some(tls) => client_tls(&at.at(field!["tls"]), tls)?,
        None => None,
    };
    Ok(PortPolicy {
        tls,
        load_balancer: match load_balancer {
            Some(lb) => self::load_balancer(&at.at(field!["loadBalancer"]), lb)?,
            None => LoadBalancer::default(),
        },
        connection_pool: match pool {
            Some(p) => connection_pool(&at.at(field!["connectionPool"]), p)?,
            None => ConnectionPool::default(),
        },
        outlier: outlier
            .map(|o| outlier_detection(&at.at(field!["outlierDetection"]), o))
            .transpose()?,
    })
}

fn load_balancer(at: &FieldPath, f: LoadBalancerFields) -> Result<LoadBalancer, Invalid> {
    match (f.simple, f.consistent_hash) {
        (Some(_), Some(_)) => Err(invalid(
            at.at(field!["consistentHash"]),
            "set either simple or consistentHash, not both",
        )),
        (Some(simple), None) => match simple.0.as_str() {
            "UNSPECIFIED" | "LEAST_REQUEST" | "LEAST_CONN" => Ok(LoadBalancer::LeastRequest),
            "ROUND_ROBIN" => Ok(LoadBalancer::RoundRobin),
            "RANDOM" => Ok(LoadBalancer::Random),
            "PASSTHROUGH" => Err(invalid(
                at.at(field!["simple"]),
                "PASSTHROUGH is not applied by the waypoint: it balances over the Service's endpoints, never to the address dialled",
            )),
            other => Err(invalid(
                at.at(field!["simple"]),
                format!("{other:?} is not a load balancer; the values are UNSPECIFIED, LEAST_REQUEST, ROUND_ROBIN, RANDOM (and the deprecated LEAST_CONN)"),
            )),
        },
        (None, Some(hash)) => consistent_hash(&at.at(field!["consistentHash"]), hash)
            .map(LoadBalancer::ConsistentHash),
        (None, None) => Ok(LoadBalancer::default()),
    }
}

fn consistent_hash(at: &FieldPath, f: ConsistentHashFields) -> Result<ConsistentHash, Invalid> {
    let mut keys = Vec::new();
    if let Some(h) = f.http_header_name {
        let name = HeaderName::from_bytes(h.0.as_bytes()).map_err(|_| {
            invalid(
                at.at(field!["httpHeaderName"]),
                format!("{:?} is not a header name", h.0),
            )
        })?;
        keys.push(("httpHeaderName", HashKey::Header(name)));
    }
    if let Some(c) = f.http_cookie {
        let cat = at.at(field!["httpCookie"]);
        if c.attributes.is_some() {
            return Err(invalid(
                cat.at(field!["attributes"]),
                "not applied by the waypoint: a generated cookie carries Path, Max-Age and HttpOnly only",
            ));
        }
        let name = c.name.0;
        let token = |b: u8| b.is_ascii_graphic() && !b"()<>@,;:\\\"/[]?={}".contains(&b);
        if name.is_empty() || !name.bytes().all(token) {
            return Err(invalid(
                cat.at(field!["name"]),
                format!("{name:?} is not a cookie name"),
            ));
        }
        let path = match c.path {
            Some(p) if !p.0.is_empty() => {
                if !p.0.starts_with('/') || p.0.bytes().any(|b| b == b';' || b.is_ascii_control()) {
                    return Err(invalid(
                        cat.at(field!["path"]),
                        "a cookie's path starts with / and holds no ';' or control character",
                    ));
                }
                Some(p.0)
            }
            _ => None,
        };
        let ttl = c
            .ttl
            .map(|t| parse_go_duration(&t.0).map_err(|m| invalid(cat.at(field!["ttl"]), m)))
            .transpose()?;
        keys.push(("httpCookie", HashKey::Cookie(CookieKey { name, path, ttl })));
    }
    if f.use_source_ip == Some(true) {
        keys.push(("useSourceIp", HashKey::SourceIp));
    }
    if let Some(q) = f.http_query_parameter_name {
        if q.0.is_empty() {
            return Err(invalid(
                at.at(field!["httpQueryParameterName"]),
                "must not be empty",
            ));
        }
        keys.push(("httpQueryParameterName", HashKey::QueryParameter(q.0)));
    }
    let key = match keys.len() {
        1 => keys.pop().map(|(_, k)| k).expect("one"),
        0 => {
            return Err(invalid(
                at.clone(),
                "names no hash key: set one of httpHeaderName, httpCookie, useSourceIp, httpQueryParameterName",
            ))
        }
        _ => {
            return Err(invalid(
                at.at(field![keys[1].0]),
                format!("set one hash key, not both {} and {}", keys[0].0, keys[1].0),
            ))
        }
    };
    let non_negative = |v: i64, path: FieldPath| {
        u64::try_from(v).map_err(|_| invalid(path, "must not be negative"))
    };
    let algorithm = match (f.ring_hash, f.maglev, f.minimum_ring_size) {
        (Some(_), Some(_), _) => {
            return Err(invalid(
                at.at(field!["maglev"]),
                "set either ringHash or maglev, not both",
            ))
        }
        (Some(_), None, Some(_)) | (None, Some(_), Some(_)) => {
            return Err(invalid(
                at.at(field!["minimumRingSize"]),
                "the deprecated minimumRingSize cannot be set beside ringHash or maglev",
            ))
        }
        (None, Some(m), None) => {
            let size = match m.table_size {
                Some(v) => non_negative(v, at.at(field!["maglev", "tableSize"]))?,
                None => 0,
            };
            let size = if size == 0 {
                DEFAULT_MAGLEV_TABLE
            } else {
                size
            };
            if size >= MAX_MAGLEV_TABLE || !is_prime(size) {
                return Err(invalid(
                    at.at(field!["maglev", "tableSize"]),
                    format!(
                        "{size} is not a prime below {MAX_MAGLEV_TABLE} (65537 is the default)"
                    ),
                ));
            }
            HashAlgorithm::Maglev { table_size: size }
        }
        (ring, None, deprecated) => {
            let (value, path) = match (ring.and_then(|r| r.minimum_ring_size), deprecated) {
                (Some(v), _) => (v, at.at(field!["ringHash", "minimumRingSize"])),
                (None, Some(v)) => (v, at.at(field!["minimumRingSize"])),
                (None, None) => (0, at.clone()),
            };
            let size = non_negative(value, path)?;
            HashAlgorithm::RingHash {
                minimum_ring_size: if size == 0 { DEFAULT_RING_SIZE } else { size },
            }
        }
    };
    Ok(ConsistentHash { key, algorithm })
}

/// An Istio `int32` limit: 0 (or not written) keeps the default, negative is refused.
fn limit(v: Option<i64>, path: FieldPath, default: u32) -> Result<u32, Invalid> {
    match v {
        None | Some(0) => Ok(default),
        Some(v) if (1..=i64::from(i32::MAX)).contains(&v) => Ok(v as u32),
        Some(_) => Err(invalid(path, "must be 0 (the default) to 2147483647")),
    }
}

fn at_least_a_millisecond(text: &str, path: FieldPath) -> Result<Duration, Invalid> {
    let d = parse_go_duration(text).map_err(|m| invalid(path.clone(), m))?;
    if d < Duration::from_millis(1) {
        return Err(invalid(path, "must be at least 1ms"));
    }
    Ok(d)
}

fn connection_pool(at: &FieldPath, f: ConnectionPoolFields) -> Result<ConnectionPool, Invalid> {
    let mut pool = ConnectionPool::default();
    if let Some(tcp) = f.tcp {
        let t = at.at(field!["tcp"]);
        pool.max_connections = limit(
            tcp.max_connections,
            t.at(field!["maxConnections"]),
            pool.max_connections,
        )?;
        if let Some(c) = tcp.connect_timeout {
            pool.connect_timeout = at_least_a_millisecond(&c.0, t.at(field!["connectTimeout"]))?;
        }
    }
    if let Some(http) = f.http {
        let h = at.at(field!["http"]);
        pool.max_pending_requests = limit(
            http.http1_max_pending_requests,
            h.at(field!["http1MaxPendingRequests"]),
            pool.max_pending_requests,
        )?;
        pool.max_requests = limit(
            http.http2_max_requests,
            h.at(field!["http2MaxRequests"]),
            pool.max_requests,
        )?;
        pool.max_retries = limit(
            http.max_retries,
            h.at(field!["maxRetries"]),
            pool.max_retries,
        )?;
        // Checked, not applied: onward connections are pooled HBONE streams.
        limit(
            http.max_requests_per_connection,
            h.at(field!["maxRequestsPerConnection"]),
            0,
        )?;
    }
    Ok(pool)
}

fn outlier_detection(at: &FieldPath, f: OutlierFields) -> Result<OutlierDetection, Invalid> {
    let mut o = OutlierDetection::default();
    let count = |v: Option<i64>, name: &'static str, default: u32| -> Result<u32, Invalid> {
        match v {
            None => Ok(default),
            Some(v) => u32::try_from(v)
                .ok()
                .filter(|v| *v <= i32::MAX as u32)
                .ok_or_else(|| invalid(at.at(field![name]), "must be 0 to 2147483647")),
        }
    };
    // The deprecated `consecutiveErrors` counts gateway errors, as Istio maps it.
    let deprecated = count(f.consecutive_errors, "consecutiveErrors", 0)?;
    o.consecutive_gateway = count(
        f.consecutive_gateway_errors,
        "consecutiveGatewayErrors",
        deprecated,
    )?;
    o.consecutive_5xx = count(
        f.consecutive_5xx_errors,
        "consecutive5xxErrors",
        o.consecutive_5xx,
    )?;
    o.split_local_origin = f.split_external_local_origin_errors.unwrap_or(false);
    o.consecutive_local_origin = count(
        f.consecutive_local_origin_failures,
        "consecutiveLocalOriginFailures",
        o.consecutive_local_origin,
    )?;
    if let Some(i) = f.interval {
        o.interval = at_least_a_millisecond(&i.0, at.at(field!["interval"]))?;
    }
    if let Some(b) = f.base_ejection_time {
        o.base_ejection_time = at_least_a_millisecond(&b.0, at.at(field!["baseEjectionTime"]))?;
    }
    let percent = |v: Option<i64>, name: &'static str, default: u32| match v {
        None => Ok(default),
        Some(v @ 0..=100) => Ok(v as u32),
        Some(_) => Err(invalid(at.at(field![name]), "a percentage is 0 to 100")),
    };
    o.max_ejection_percent = percent(
        f.max_ejection_percent,
        "maxEjectionPercent",
        o.max_ejection_percent,
    )?;
    o.min_health_percent = percent(
        f.min_health_percent,
        "minHealthPercent",
        o.min_health_percent,
    )?;
    Ok(o)
}

fn client_tls(at: &FieldPath, f: TlsFields) -> Result<Option<ClientTls>, Invalid> {
    let mode = f
        .mode
        .clone()
        .map_or_else(|| "DISABLE".to_string(), |m| m.0);
    match mode.as_str() {
        // Traffic to the mesh's endpoints is HBONE, mutual TLS already; DISABLE toward
        // them changes nothing either.
        "DISABLE" => Ok(None),
        "ISTIO_MUTUAL" => {
            let other = [
                ("clientCertificate", f.client_certificate.is_some()),
                ("privateKey", f.private_key.is_some()),
                ("caCertificates", f.ca_certificates.is_some()),
                ("credentialName", f.credential_name.is_some()),
                ("caCrl", f.ca_crl.is_some()),
            ];
            match other.iter().find(|(_, set)| *set) {
                Some((name, _)) => Err(invalid(
                    at.at(field![*name]),
                    "must be empty with mode ISTIO_MUTUAL (Istio's own certificates are used)",
                )),
                None => Ok(None),
            }
        }
        "SIMPLE" | "MUTUAL" => originated(at, mode == "MUTUAL", f).map(Some),
        other => Err(invalid(
            at.at(field!["mode"]),
            format!(
                "{other:?} is not a TLS mode; the modes are DISABLE, SIMPLE, MUTUAL, ISTIO_MUTUAL"
            ),
        )),
    }
}

/// `SIMPLE` or `MUTUAL`: the files named (absolute paths, read by the waypoint when the rule
/// is applied), the server's names. A Kubernetes Secret (`credentialName`) and a revocation
/// list (`caCrl`) are refused by name: not read by the waypoint, and ignoring either would
/// connect with less checking than asked for.
fn originated(at: &FieldPath, mutual: bool, f: TlsFields) -> Result<ClientTls, Invalid> {
    if f.credential_name.is_some() {
        return Err(invalid(
            at.at(field!["credentialName"]),
            "not read by the waypoint: name the PEM files (clientCertificate, privateKey, caCertificates) mounted in its pod",
        ));
    }
    if f.ca_crl.is_some() {
        return Err(invalid(
            at.at(field!["caCrl"]),
            "not applied by the waypoint: a revocation list it ignored would accept revoked certificates",
        ));
    }
    let file = |v: Option<crate::values::Text>,
                name: &'static str|
     -> Result<Option<PathBuf>, Invalid> {
        match v {
            None => Ok(None),
            Some(t) if t.0.is_empty() => Ok(None),
            Some(t) if t.0.starts_with('/') && !t.0.contains('\0') => Ok(Some(PathBuf::from(t.0))),
            Some(t) => Err(invalid(
                at.at(field![name]),
                format!("{:?} is not an absolute path to a PEM file", t.0),
            )),
        }
    };
    let certificate = file(f.client_certificate, "clientCertificate")?;
    let private_key = file(f.private_key, "privateKey")?;
    let client_identity = match (mutual, certificate, private_key) {
        (true, Some(certificate), Some(private_key)) => Some(ClientIdentity {
            certificate,
            private_key,
        }),
        (true, None, _) => {
            return Err(invalid(
                at.at(field!["clientCertificate"]),
                "required with mode MUTUAL",
            ))
        }
        (true, _, None) => {
            return Err(invalid(at.at(field!["privateKey"]), "required with mode MUTUAL"))
        }
        (false, Some(_), _) | (false, _, Some(_)) => {
            return Err(invalid(
                at.at(field!["mode"]),
                "SIMPLE presents no client certificate: set mode MUTUAL, or leave clientCertificate and privateKey out",
            ))
        }
        (false, None, None) => None,
    };
    let sni = match f.sni {
        Some(s) if !s.0.is_empty() => {
            rustls_pki_types::ServerName::try_from(s.0.as_str()).map_err(|_| {
                invalid(
                    at.at(field!["sni"]),
                    format!("{:?} is not a server name", s.0),
                )
            })?;
            Some(s.0)
        }
        _ => None,
    };
    let mut subject_alt_names = Vec::new();
    for (i, san) in f.subject_alt_names.into_iter().flatten().enumerate() {
        if san.0.is_empty() {
            return Err(invalid(
                at.at(field!["subjectAltNames", i]),
                "must not be empty",
            ));
        }
        subject_alt_names.push(san.0);
    }
    Ok(ClientTls {
        client_identity,
        sni,
        subject_alt_names,
        ca_certificates: file(f.ca_certificates, "caCertificates")?,
        insecure_skip_verify: f.insecure_skip_verify.unwrap_or(false),
    })
}
