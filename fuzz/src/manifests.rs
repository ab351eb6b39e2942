//! The `manifests` target: Kubernetes-shaped YAML manifests (Istio AuthorizationPolicy,
//! Gateway API HTTPRoute and GRPCRoute among other kinds, many documents per file) read
//! into the waypoint's model.

use std::sync::Arc;

use ambit_manifests::{parse_bytes, ParseOptions};
use ambit_routes::{Frontend, Request, RouteTable, Selection};
use ambit_state::Authorization;

/// What the bytes came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// `namespace/name` of each policy read.
    pub policies: Vec<String>,
    /// `kind namespace/name` of each route read.
    pub routes: Vec<String>,
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
/// from a manifest is one the state's local configuration can hold); every route has a
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
    let outcomes =
        parsed.policies.len() + parsed.routes.len() + parsed.skipped.len() + parsed.errors.len();
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
    let table = RouteTable::new(parsed.routes.iter().map(|r| Arc::new(r.value.clone())));
    let headers = http::HeaderMap::new();
    for r in &parsed.routes {
        for parent in &r.value.parents {
            let frontend = Frontend {
                service: parent.service.clone(),
                port: parent.port.unwrap_or(80),
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
        routes: route_keys.into_iter().collect(),
        skipped: parsed.skipped.len(),
        errors: parsed.errors.iter().map(ToString::to_string).collect(),
    }
}
