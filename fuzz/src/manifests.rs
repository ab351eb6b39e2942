//! The `manifests` target: Kubernetes-shaped YAML manifests (Istio AuthorizationPolicy and
//! RequestAuthentication, Gateway API HTTPRoute and GRPCRoute among other kinds, many
//! documents per file) read into the waypoint's model.

use std::sync::Arc;

use ambit_gateway_routes::{Frontend, Request, RouteTable, Selection};
use ambit_manifests::{parse_bytes, JwksSource, ParseOptions, MAX_INLINE_JWKS_BYTES};
use ambit_state::Authorization;

/// What the bytes came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// `namespace/name` of each policy read.
    pub policies: Vec<String>,
    /// `namespace/name` of each RequestAuthentication read.
    pub authns: Vec<String>,
    /// `kind namespace/name` of each route read.
    pub routes: Vec<String>,
    /// `namespace/name` of each DestinationRule read.
    pub destination_rules: Vec<String>,
    pub skipped: usize,
    /// Each refusal as it reads.
    pub errors: Vec<String>,
}

/// Input: any bytes (the file's contents).
///
/// Checks: reading is deterministic; each document comes to at most one policy, skipped
/// document or refusal; every refusal of the text has a position within it; every policy
/// has targets, a unique `namespace/name` and passes the state's own check; its
/// Authorization, written in the state's JSON form, reads back the same (so a policy read
/// from a manifest is one the state's local configuration can hold); every
/// RequestAuthentication has targets, a unique `namespace/name`, and rules within the
/// reader's checks (an issuer, an inline key set within its bound, a timeout of at least
/// 1ms, each claim header once); every route has a
/// parent, a unique `kind namespace/name`, rules and matches, and the routes, put in a
/// table, answer a request to each frontend they attach to.
pub fn run(data: &[u8]) -> Outcome {
    let options = ParseOptions::default();
    let parsed = parse_bytes("fuzz", data, &options);
    assert_eq!(
        parsed,
        parse_bytes("fuzz", data, &options),
        "not deterministic"
    );

    // An upper bound on the documents: the text before the first marker, and one per
    // marker line.
    let documents = 1 + data
        .split(|b| *b == b'\n')
        .skip(1)
        .filter(|l| l.starts_with(b"---"))
        .count();
    let outcomes = parsed.policies.len()
        + parsed.authns.len()
        + parsed.routes.len()
        + parsed.destination_rules.len()
        + parsed.skipped.len()
        + parsed.errors.len();
    assert!(
        outcomes <= documents,
        "{outcomes} outcomes of {documents} documents"
    );

    let lines = data.split(|b| *b == b'\n').count();
    for e in &parsed.errors {
        if let Some(p) = e.position {
            assert!(p.line >= 1 && p.line <= lines && p.column >= 1, "{e}");
        }
    }

    let mut keys = std::collections::BTreeSet::new();
    for p in &parsed.policies {
        let a = &p.value.authorization;
        assert!(!p.value.targets.is_empty(), "{}: no targets", a.key());
        assert!(keys.insert(a.key()), "{} read twice", a.key());
        a.clone()
            .normalize()
            .unwrap_or_else(|e| panic!("{}: {e}", a.key()));
        let json = serde_json::to_string(a).expect("an Authorization serializes");
        let back: Authorization = serde_json::from_str(&json)
            .unwrap_or_else(|e| panic!("{}: the state refuses its own form: {e}\n{json}", a.key()));
        assert_eq!(&back, a, "round trip via {json}");
    }
    let mut authn_keys = std::collections::BTreeSet::new();
    for a in &parsed.authns {
        let a = &a.value;
        let key = a.key();
        assert!(!a.targets.is_empty(), "{key}: no targets");
        assert!(authn_keys.insert(key.clone()), "{key} read twice");
        for r in &a.rules {
            assert!(!r.issuer.is_empty(), "{key}: a rule without an issuer");
            if let JwksSource::Inline(jwks) = &r.jwks {
                assert!(
                    !jwks.is_empty() && jwks.len() <= MAX_INLINE_JWKS_BYTES,
                    "{key}: an inline key set of {} bytes",
                    jwks.len()
                );
            }
            assert!(
                r.timeout >= std::time::Duration::from_millis(1),
                "{key}: timeout {:?}",
                r.timeout
            );
            let headers: std::collections::HashSet<_> = r
                .output_claim_to_headers
                .iter()
                .map(|c| &c.header)
                .collect();
            assert_eq!(
                headers.len(),
                r.output_claim_to_headers.len(),
                "{key}: a claim header twice"
            );
        }
    }
    let mut route_keys = std::collections::BTreeSet::new();
    for r in &parsed.routes {
        let r = &r.value;
        let key = format!("{} {}", r.kind, r.key());
        assert!(!r.parents.is_empty(), "{key}: no parents");
        assert!(!r.rules.is_empty(), "{key}: no rules");
        assert!(
            r.rules.iter().all(|rule| !rule.matches.is_empty()),
            "{key}: a rule without matches"
        );
        assert!(route_keys.insert(key.clone()), "{key} read twice");
    }
    let mut rule_keys = std::collections::BTreeSet::new();
    for r in &parsed.destination_rules {
        let r = &r.value;
        assert!(!r.host.is_empty(), "{}: no host", r.key());
        assert!(rule_keys.insert(r.key()), "{} read twice", r.key());
        let policies =
            std::iter::once(&r.policy.default).chain(r.policy.ports.iter().map(|(_, p)| p));
        for p in policies {
            if let ambit_traffic_policy::LoadBalancer::ConsistentHash(ch) = &p.load_balancer {
                if let ambit_traffic_policy::HashAlgorithm::Maglev { table_size } = ch.algorithm {
                    assert!(
                        ambit_traffic_policy::hash::is_prime(table_size)
                            && table_size < ambit_traffic_policy::MAX_MAGLEV_TABLE,
                        "{}: Maglev table of {table_size}",
                        r.key()
                    );
                }
            }
            let pool = &p.connection_pool;
            assert!(pool.max_in_flight() >= 1 && pool.connect_timeout.as_millis() >= 1);
            if let Some(o) = &p.outlier {
                assert!(o.max_ejection_percent <= 100 && o.min_health_percent <= 100);
                assert!(o.interval.as_millis() >= 1 && o.base_ejection_time.as_millis() >= 1);
            }
        }
    }
    let table = RouteTable::new(parsed.routes.iter().map(|r| Arc::new(r.value.clone())));
    let headers = http::HeaderMap::new();
    for r in &parsed.routes {
        for parent in &r.value.parents {
            // A Gateway's routes serve a frontend of its waypoint without its own.
            let frontend = match parent.kind {
                ambit_gateway_routes::ParentKind::Service => Frontend {
                    service: parent.service.clone(),
                    port: parent.port.unwrap_or(80),
                    gateway: None,
                },
                ambit_gateway_routes::ParentKind::Gateway => Frontend {
                    service: ambit_gateway_routes::ServiceKey::new("no-routes", "nowhere"),
                    port: 80,
                    gateway: Some(Arc::new(parent.service.clone())),
                },
            };
            let request = Request {
                method: "GET",
                path: "/",
                query: None,
                headers: &headers,
            };
            // A route is attached here, so never the default route.
            assert_ne!(
                table.select(&frontend, &request),
                Selection::NoRoutes,
                "{frontend:?}"
            );
        }
    }
    Outcome {
        policies: keys.into_iter().collect(),
        authns: authn_keys.into_iter().collect(),
        routes: route_keys.into_iter().collect(),
        destination_rules: rule_keys.into_iter().collect(),
        skipped: parsed.skipped.len(),
        errors: parsed.errors.iter().map(ToString::to_string).collect(),
    }
}
