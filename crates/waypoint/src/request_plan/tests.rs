//! Table tests of what routes make of a request, without sockets: the default route, 404,
//! 500 for a backend the mesh lacks, redirects with the dialled port, backends by weight,
//! filters in order, rewrites, mirrors, timeouts and retry policies; and merging a load
//! with a refused route.

use std::time::Duration;

use ambit_manifests::{parse_documents, ParseOptions};
use ambit_state::ProxyState;
use http::HeaderMap;

use super::*;

const MESH: &str = r#"
services:
- name: reviews
  namespace: shop
  hostname: reviews.shop.svc.cluster.local
  vips: ["/10.96.0.1"]
  ports: {9080: 9080, 8080: 8080}
- name: reviews-v2
  namespace: shop
  hostname: reviews-v2.shop.svc.cluster.local
  vips: ["/10.96.0.2"]
  ports: {9080: 9080}
- name: ratings
  namespace: shop
  hostname: ratings.shop.svc.cluster.local
  vips: ["/10.96.0.3"]
  ports: {9080: 9080}
- name: ext
  namespace: shop
  hostname: ext.example.com
  vips: ["/10.96.0.4"]
  ports: {443: 443}
"#;

fn state() -> ProxyState {
    ProxyState::from_yaml("mesh.yaml", MESH).unwrap()
}

fn routes(text: &str) -> Routes {
    let parsed = parse_documents("r.yaml", text, &ParseOptions::default());
    assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
    merge_routes(
        parsed.routes.into_iter().map(|r| r.value).collect(),
        &parsed.errors,
        None,
    )
}

fn fronted(state: &ProxyState, name: &str, port: u16) -> Fronted {
    Fronted::Service {
        service: state
            .service_by_key(&format!("shop/{name}.shop.svc.cluster.local"))
            .unwrap(),
        port,
        vip: None,
    }
}

struct Ask<'a> {
    line: &'a str,
    headers: HeaderMap,
    host: &'a str,
}

fn ask(line: &str) -> Ask<'_> {
    Ask {
        line,
        headers: HeaderMap::new(),
        host: "reviews:9080",
    }
}

/// The plan for `a` dialled to `reviews:port`, with `random`, as one line.
fn plan_line(routes: &Routes, port: u16, a: &Ask<'_>, random: u64) -> String {
    let st = state();
    let (method, target) = a.line.split_once(' ').unwrap();
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (target, None),
    };
    let req = RouteRequest {
        method,
        path,
        query,
        headers: &a.headers,
        host: a.host,
    };
    match plan(
        &routes.table,
        &st,
        &fronted(&st, "reviews", port),
        &req,
        random,
        "cluster.local",
        &gateway(),
    ) {
        Plan::NotFound => "404".into(),
        Plan::Fail(why) => format!("500 {why}"),
        Plan::Redirect { status, location } => format!("{status} {location}"),
        Plan::Preflight(headers) => format!("200 preflight {}", headers.len()),
        Plan::Forward(f) => {
            let mut line = format!(
                "-> {}:{}",
                f.target.service().unwrap().name,
                f.target.port()
            );
            if let Some(h) = f.host {
                line += &format!(" host={h}");
            }
            if let Some(p) = &f.path {
                line += &format!(" path={p}");
            }
            if !f.request_headers.is_empty() || !f.response_headers.is_empty() {
                line += &format!(
                    " mods={}/{}",
                    f.request_headers.len(),
                    f.response_headers.len()
                );
            }
            for m in &f.mirrors {
                line += &format!(" mirror={}", m.service().unwrap().name);
            }
            line
        }
    }
}

/// What `GET /` dialled to `reviews:9080` is forwarded with.
fn forward_of(routes: &Routes) -> Box<Forward<'_>> {
    let st = state();
    let req = RouteRequest {
        method: "GET",
        path: "/",
        query: None,
        headers: &HeaderMap::new(),
        host: "reviews",
    };
    match plan(
        &routes.table,
        &st,
        &fronted(&st, "reviews", 9080),
        &req,
        0,
        "cluster.local",
        &gateway(),
    ) {
        Plan::Forward(f) => f,
        other => panic!("not forwarded: {other:?}"),
    }
}

const HEAD: &str = "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: r, namespace: shop}\nspec:\n";

#[test]
fn no_route_is_the_dialled_service_with_the_mesh_default_retry() {
    let none = Routes::default();
    assert_eq!(plan_line(&none, 9080, &ask("GET /"), 0), "-> reviews:9080");
    let f = forward_of(&none);
    assert_eq!(f.retry, RetryPolicy::MESH_DEFAULT);
    assert_eq!(f.retry.retries, 2);
    assert!(f.retry.codes.is_empty());
    assert_eq!(f.timeouts, Timeouts::default());
}

#[test]
fn routes_scope_by_port_404_when_none_match_and_500_for_a_missing_backend() {
    let r = routes(&format!(
        "{HEAD}  parentRefs: [{{group: \"\", kind: Service, name: reviews, port: 9080}}]
  rules:
  - matches: [{{path: {{type: PathPrefix, value: /v2}}}}]
    backendRefs: [{{name: reviews-v2, port: 9080}}]
  - matches: [{{path: {{type: Exact, value: /gone}}}}]
    backendRefs: [{{name: nowhere, port: 9080}}]
  - matches: [{{path: {{type: Exact, value: /noport}}}}]
    backendRefs: [{{name: ratings, port: 1}}]
"
    ));
    assert_eq!(
        plan_line(&r, 9080, &ask("GET /v2/x"), 0),
        "-> reviews-v2:9080"
    );
    assert_eq!(plan_line(&r, 9080, &ask("GET /v1"), 0), "404");
    assert!(plan_line(&r, 9080, &ask("GET /gone"), 0).starts_with("500 "));
    assert!(plan_line(&r, 9080, &ask("GET /noport"), 0).starts_with("500 "));
    // Port 8080 of the same Service has no route: the default route.
    assert_eq!(plan_line(&r, 8080, &ask("GET /v1"), 0), "-> reviews:8080");
}

#[test]
fn weights_split_by_the_draw() {
    let r = routes(&format!(
        "{HEAD}  parentRefs: [{{group: \"\", kind: Service, name: reviews}}]
  rules:
  - backendRefs: [{{name: reviews, port: 9080, weight: 90}}, {{name: reviews-v2, port: 9080, weight: 10}}, {{name: ratings, port: 9080, weight: 0}}]
"
    ));
    let mut counts = std::collections::BTreeMap::new();
    for n in 0..100 {
        *counts
            .entry(plan_line(&r, 9080, &ask("GET /"), n))
            .or_insert(0) += 1;
    }
    assert_eq!(
        counts.into_iter().collect::<Vec<_>>(),
        [
            ("-> reviews-v2:9080".to_string(), 10),
            ("-> reviews:9080".to_string(), 90)
        ]
    );
}

#[test]
fn redirects_keep_what_they_do_not_change() {
    let r = routes(&format!(
        "{HEAD}  parentRefs: [{{group: \"\", kind: Service, name: reviews}}]
  rules:
  - matches: [{{path: {{type: PathPrefix, value: /old}}}}]
    filters:
    - type: RequestRedirect
      requestRedirect: {{path: {{type: ReplacePrefixMatch, replacePrefixMatch: /new}}, statusCode: 301}}
  - matches: [{{path: {{type: PathPrefix, value: /secure}}}}]
    filters:
    - type: RequestRedirect
      requestRedirect: {{scheme: https, hostname: example.com}}
"
    ));
    assert_eq!(
        plan_line(&r, 9080, &ask("GET /old/page?q=1"), 0),
        "301 http://reviews:9080/new/page?q=1"
    );
    assert_eq!(
        plan_line(&r, 9080, &ask("GET /secure/a"), 0),
        "302 https://example.com/secure/a"
    );
    let mut v6 = ask("GET /old");
    v6.host = "[fd00::1]:9080";
    assert_eq!(plan_line(&r, 9080, &v6, 0), "301 http://[fd00::1]:9080/new");
}

#[test]
fn filters_rewrites_and_mirrors() {
    let r = routes(&format!(
        "{HEAD}  parentRefs: [{{group: \"\", kind: Service, name: reviews}}]
  rules:
  - matches: [{{path: {{type: PathPrefix, value: /api}}}}]
    filters:
    - type: RequestHeaderModifier
      requestHeaderModifier: {{set: [{{name: x-a, value: '1'}}]}}
    - type: URLRewrite
      urlRewrite: {{hostname: internal.example, path: {{type: ReplacePrefixMatch, replacePrefixMatch: /v2}}}}
    - type: RequestMirror
      requestMirror: {{backendRef: {{name: ratings, port: 9080}}}}
    - type: RequestMirror
      requestMirror: {{backendRef: {{name: reviews-v2, port: 9080}}, percent: 0}}
    backendRefs:
    - name: reviews
      port: 9080
      filters:
      - type: ResponseHeaderModifier
        responseHeaderModifier: {{add: [{{name: x-b, value: '2'}}]}}
"
    ));
    assert_eq!(
        plan_line(&r, 9080, &ask("GET /api/items"), 7),
        "-> reviews:9080 host=internal.example path=/v2/items mods=1/1 mirror=ratings"
    );
}

#[test]
fn timeouts_and_a_written_retry() {
    let r = routes(&format!(
        "{HEAD}  parentRefs: [{{group: \"\", kind: Service, name: reviews}}]
  rules:
  - backendRefs: [{{name: reviews, port: 9080}}]
    timeouts: {{request: 2s, backendRequest: 500ms}}
    retry: {{codes: [503], attempts: 4, backoff: 10ms}}
"
    ));
    let f = forward_of(&r);
    assert_eq!(f.timeouts.request, Some(Duration::from_secs(2)));
    assert_eq!(f.timeouts.backend_request, Some(Duration::from_millis(500)));
    assert_eq!(
        f.retry,
        RetryPolicy {
            retries: 4,
            codes: &[503],
            backoff: Duration::from_millis(10),
            on_reset: true,
        }
    );
}

#[test]
fn backoff_is_full_jitter_capped_at_ten_times_the_base() {
    let p = RetryPolicy {
        retries: 5,
        codes: &[],
        backoff: Duration::from_millis(10),
        on_reset: false,
    };
    // Retry n waits up to (2^n - 1) × base, capped at 10 × base.
    assert_eq!(p.backoff_before(1, 10_000), Duration::from_millis(10));
    assert_eq!(p.backoff_before(1, 10_001), Duration::ZERO);
    assert_eq!(p.backoff_before(2, 30_000), Duration::from_millis(30));
    assert_eq!(p.backoff_before(5, 100_000), Duration::from_millis(100));
    assert_eq!(
        p.backoff_before(30, u64::MAX),
        Duration::from_micros(u64::MAX % 100_001)
    );
}

#[test]
fn a_refused_route_keeps_its_last_good_version() {
    let good = format!(
        "{HEAD}  parentRefs: [{{group: \"\", kind: Service, name: reviews}}]
  rules:
  - backendRefs: [{{name: reviews-v2, port: 9080}}]
"
    );
    let first = routes(&good);
    let bad = good.replace("port: 9080}]", "port: 0}]");
    let parsed = parse_documents("r.yaml", &bad, &ParseOptions::default());
    assert_eq!(parsed.errors.len(), 1, "{:?}", parsed.errors);
    let second = merge_routes(
        parsed.routes.into_iter().map(|r| r.value).collect(),
        &parsed.errors,
        Some(&first),
    );
    assert_eq!(second.kept, ["shop/r"]);
    assert_eq!(second.refused.len(), 1);
    assert_eq!(second.refused[0].0.as_deref(), Some("shop/r"));
    assert_eq!(
        plan_line(&second, 9080, &ask("GET /"), 0),
        "-> reviews-v2:9080"
    );
    // Without a last good version, the route is simply not there.
    let alone = merge_routes(Vec::new(), &parsed.errors, None);
    assert!(alone.kept.is_empty());
    assert_eq!(plan_line(&alone, 9080, &ask("GET /"), 0), "-> reviews:9080");
}

#[test]
fn hosts_lose_their_port() {
    assert_eq!(host_without_port("a.b:80"), "a.b");
    assert_eq!(host_without_port("a.b"), "a.b");
    assert_eq!(host_without_port("[fd00::1]:80"), "[fd00::1]");
    assert_eq!(host_without_port("[fd00::1]"), "[fd00::1]");
    assert_eq!(host_without_port("a:b"), "a:b");
}

/// The waypoint's Gateway in these tests.
fn gateway() -> std::sync::Arc<ServiceKey> {
    std::sync::Arc::new(ServiceKey::new("shop", "waypoint"))
}
