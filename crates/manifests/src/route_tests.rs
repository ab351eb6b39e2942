//! Table tests of reading HTTPRoutes and GRPCRoutes: every field into the routes model
//! with its defaults, which parents attach a route to a waypoint and which are noted or
//! make it skipped, and the CRDs' refusals with their exact line, column and field.

use std::time::Duration;

use ambit_gateway_routes::*;

use super::*;

fn parse(text: &str) -> Parsed {
    parse_documents("r.yaml", text, &ParseOptions::default())
}

/// The one route `text` holds (no refusal, nothing skipped).
fn route(text: &str) -> Route {
    let p = parse(text);
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    assert!(p.skipped.is_empty(), "{:?}", p.skipped);
    assert_eq!(p.routes.len(), 1, "{text}");
    p.routes.into_iter().next().unwrap().value
}

fn refusal(text: &str) -> String {
    let p = parse(text);
    assert!(p.routes.is_empty(), "{:?}", p.routes);
    assert_eq!(p.errors.len(), 1, "{:?}", p.errors);
    p.errors[0].to_string()
}

const HTTP_HEAD: &str = "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: r, namespace: shop}\nspec:\n  parentRefs: [{group: \"\", kind: Service, name: reviews, port: 9080}]\n";

/// An HTTPRoute of `HTTP_HEAD` and one rule written as the YAML flow map `rule`.
fn http(rule: &str) -> String {
    format!("{HTTP_HEAD}  rules:\n  - {rule}\n")
}

fn svc(name: &str, port: u16) -> BackendTarget {
    BackendTarget::Service(ServiceBackend {
        service: ServiceKey::new("shop", name),
        port,
    })
}

#[test]
fn an_http_route_with_every_field() {
    let text = "\
apiVersion: gateway.networking.k8s.io/v1beta1
kind: HTTPRoute
metadata:
  name: reviews
  namespace: shop
  creationTimestamp: \"2024-05-01T12:00:00Z\"
spec:
  parentRefs:
  - {group: \"\", kind: Service, name: reviews}
  - {group: \"\", kind: Service, name: ratings, port: 9080}
  hostnames: [reviews.shop.svc.cluster.local]
  rules:
  - name: canary
    matches:
    - path: {type: Exact, value: /reviews/1}
      headers:
      - {name: X-User, value: alice}
      - {name: x-user, value: bob}
      - {type: RegularExpression, name: x-team, value: \"blue|green\"}
      queryParams:
      - {name: debug, value: \"1\"}
      method: GET
    - path: {value: /api/}
    - headers: [{name: x-v, value: \"2\"}]
    filters:
    - type: RequestHeaderModifier
      requestHeaderModifier:
        set: [{name: X-Set, value: a}]
        add: [{name: x-add, value: b}]
        remove: [X-Gone]
    - type: ResponseHeaderModifier
      responseHeaderModifier: {remove: [server]}
    - type: URLRewrite
      urlRewrite: {hostname: reviews.example, path: {type: ReplaceFullPath, replaceFullPath: /v2}}
    - type: RequestMirror
      requestMirror: {backendRef: {name: shadow, port: 80}, percent: 25}
    backendRefs:
    - name: reviews-v1
      port: 9080
      weight: 90
    - name: reviews-v2
      port: 9080
      weight: 0
      filters:
      - {type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: x-canary, value: \"true\"}]}}
    - {group: multicluster.x-k8s.io, kind: ServiceImport, name: far, port: 80}
    - {name: other, namespace: elsewhere, port: 80}
    timeouts: {request: 10s, backendRequest: 2s500ms}
    retry: {codes: [503, 502], attempts: 3, backoff: 100ms}
  - matches: [{path: {type: RegularExpression, value: \"/v[0-9]+/.*\"}}]
    filters:
    - {type: RequestRedirect, requestRedirect: {scheme: https, hostname: example.com, port: 8443, statusCode: 301, path: {type: ReplacePrefixMatch, replacePrefixMatch: /new}}}
    timeouts: {request: 0s}
";
    // The redirect rule's prefix replacement needs one PathPrefix match: refused as is.
    let e = refusal(text);
    assert_eq!(
        e,
        "r.yaml:50:14: spec.rules[1].matches: a filter with path type ReplacePrefixMatch needs exactly one match, of type PathPrefix"
    );
    let text = text.replace(
        "{path: {type: RegularExpression, value: \"/v[0-9]+/.*\"}}",
        "{path: {type: PathPrefix, value: /old/}}",
    );
    let r = route(&text);
    assert_eq!(r.kind, RouteKind::Http);
    assert_eq!(r.key(), "shop/reviews");
    assert_eq!(r.created, Some(CreationTime(1_714_564_800)));
    assert_eq!(
        r.parents,
        vec![
            ParentRef {
                service: ServiceKey::new("shop", "reviews"),
                port: None,
                kind: ParentKind::Service,
            },
            ParentRef {
                service: ServiceKey::new("shop", "ratings"),
                port: Some(9080),
                kind: ParentKind::Service,
            },
        ]
    );
    assert_eq!(r.rules.len(), 2);
    let rule = &r.rules[0];
    assert_eq!(rule.name.as_deref(), Some("canary"));
    // Header names lower-cased; of X-User and x-user only the first counts.
    let m = &rule.matches[0];
    assert_eq!(m.path, PathMatch::Exact("/reviews/1".into()));
    assert_eq!(
        m.headers
            .iter()
            .map(|h| (h.name.as_str(), h.value.clone()))
            .collect::<Vec<_>>(),
        vec![
            ("x-user", ValueMatch::Exact("alice".into())),
            (
                "x-team",
                ValueMatch::Regex(Pattern::new("blue|green").unwrap())
            ),
        ]
    );
    assert_eq!(
        m.query,
        vec![QueryMatch {
            name: "debug".into(),
            value: ValueMatch::Exact("1".into())
        }]
    );
    assert_eq!(m.method.as_deref(), Some("GET"));
    // A path written without its type is a prefix; its trailing slash dropped. A match
    // without a path matches every path.
    assert_eq!(rule.matches[1].path, PathMatch::Prefix("/api".into()));
    assert_eq!(rule.matches[2].path, PathMatch::Prefix("/".into()));
    let name = |s: &str| s.parse::<http::header::HeaderName>().unwrap();
    assert_eq!(
        rule.filters,
        vec![
            Filter::RequestHeaders(HeaderModifier {
                set: vec![(name("x-set"), "a".into())],
                add: vec![(name("x-add"), "b".into())],
                remove: vec![name("x-gone")],
            }),
            Filter::ResponseHeaders(HeaderModifier {
                remove: vec![name("server")],
                ..HeaderModifier::default()
            }),
            Filter::Rewrite(Rewrite {
                hostname: Some("reviews.example".into()),
                path: Some(PathModifier::Full("/v2".into())),
            }),
            Filter::Mirror(Mirror {
                backend: ServiceBackend {
                    service: ServiceKey::new("shop", "shadow"),
                    port: 80
                },
                numerator: 25,
                denominator: 100,
            }),
        ]
    );
    let backends: Vec<(BackendTarget, u32, usize)> = rule
        .backends
        .iter()
        .map(|b| (b.target.clone(), b.weight, b.filters.len()))
        .collect();
    assert_eq!(backends[0], (svc("reviews-v1", 9080), 90, 0));
    assert_eq!(backends[1], (svc("reviews-v2", 9080), 0, 1));
    // Not a Service, or another namespace's without a ReferenceGrant: invalid, weight 1
    // (their share of requests is answered 500).
    assert!(
        matches!(&backends[2], (BackendTarget::Invalid(w), 1, 0) if w.contains("ServiceImport"))
    );
    assert!(
        matches!(&backends[3], (BackendTarget::Invalid(w), 1, 0) if w.contains("another namespace"))
    );
    assert_eq!(
        rule.timeouts,
        Timeouts {
            request: Some(Duration::from_secs(10)),
            backend_request: Some(Duration::from_millis(2500)),
        }
    );
    assert_eq!(
        rule.retry,
        Some(Retry {
            codes: vec![503, 502],
            attempts: Some(3),
            backoff: Some(Duration::from_millis(100)),
        })
    );
    let redirect = &r.rules[1];
    assert_eq!(
        redirect.filters,
        vec![Filter::Redirect(Redirect {
            scheme: Some("https".into()),
            hostname: Some("example.com".into()),
            path: Some(PathModifier::Prefix("/new".into())),
            port: Some(8443),
            status: 301,
        })]
    );
    // "0s" disables the timeout.
    assert_eq!(redirect.timeouts, Timeouts::default());
    assert!(r.notes.is_empty(), "{:?}", r.notes);
}

/// What is left out takes the CRD's defaults: a rule matching every path, weight 1, a
/// 302 redirect; no rules at all is one rule without backends (so 500).
#[test]
fn defaults() {
    let r = route(&http("{backendRefs: [{name: a, port: 80}]}"));
    assert_eq!(r.rules[0].matches, vec![RouteMatch::default()]);
    assert_eq!(r.rules[0].backends[0].weight, 1);
    assert_eq!(r.rules[0].backends[0].target, svc("a", 80));
    let r = route(&http(
        "{filters: [{type: RequestRedirect, requestRedirect: {hostname: b.example}}]}",
    ));
    assert!(matches!(
        &r.rules[0].filters[0],
        Filter::Redirect(Redirect { status: 302, .. })
    ));
    let r = route(HTTP_HEAD);
    assert_eq!(r.rules.len(), 1);
    assert!(r.rules[0].backends.is_empty());
    assert_eq!(r.rules[0].matches, vec![RouteMatch::default()]);
    // A kind of backendRef left out is a Service.
    let r = route(&http(
        "{backendRefs: [{name: a, port: 80, kind: Service, group: \"\"}]}",
    ));
    assert_eq!(r.rules[0].backends[0].target, svc("a", 80));
}

/// A retry past the cap, or a backoff under Envoy's floor, is honoured at the bound and
/// noted; at the bounds nothing is noted.
#[test]
fn retries_are_capped_and_noted() {
    /// A rule, the retries and backoff it gets, the notes.
    type Case<'a> = (&'a str, Option<u32>, Option<Duration>, &'a [&'a str]);
    let cases: &[Case] = &[
        (
            "{retry: {codes: [500], attempts: 4294967295, backoff: 1ms}}",
            Some(MAX_RETRY_ATTEMPTS),
            Some(Duration::from_millis(1)),
            &["spec.rules[0].retry.attempts: 4294967295 capped at 10 retries"],
        ),
        (
            "{retry: {attempts: 10, backoff: 0s}}",
            Some(10),
            Some(MIN_RETRY_BACKOFF),
            &["spec.rules[0].retry.backoff: 0ns raised to 1ms"],
        ),
        (
            "{retry: {attempts: 11}}",
            Some(10),
            None,
            &["spec.rules[0].retry.attempts: 11 capped at 10 retries"],
        ),
        ("{retry: {codes: [503]}}", None, None, &[]),
    ];
    for (rule, attempts, backoff, notes) in cases {
        let r = route(&http(rule));
        let retry = r.rules[0].retry.as_ref().unwrap();
        assert_eq!(retry.attempts, *attempts, "{rule}");
        assert_eq!(retry.backoff, *backoff, "{rule}");
        assert_eq!(r.notes, *notes, "{rule}");
    }
}

#[test]
fn grpc_routes_match_service_and_method_as_paths() {
    let text = "\
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: echo, namespace: shop}
spec:
  parentRefs: [{kind: Service, group: \"\", name: echo}]
  rules:
  - matches:
    - method: {service: echo.v1.Echo, method: Echo}
    - method: {service: echo.v1.Echo}
      headers: [{name: X-Tenant, value: a}]
    - method: {type: RegularExpression, method: \"Get.*\"}
    - headers: [{name: x-any, value: b}]
    filters:
    - {type: ResponseHeaderModifier, responseHeaderModifier: {add: [{name: x-served-by, value: echo}]}}
    backendRefs: [{name: echo-v1, port: 9000, weight: 3}, {name: echo-v2, port: 9000, weight: 1}]
  - {}
";
    let r = route(text);
    assert_eq!(r.kind, RouteKind::Grpc);
    let paths: Vec<&PathMatch> = r.rules[0].matches.iter().map(|m| &m.path).collect();
    assert_eq!(paths[0], &PathMatch::Exact("/echo.v1.Echo/Echo".into()));
    assert_eq!(paths[1], &PathMatch::Prefix("/echo.v1.Echo".into()));
    assert!(
        matches!(paths[2], PathMatch::Regex(p) if p.is_match("/a.B/GetAll") && !p.is_match("/a.B/List"))
    );
    assert_eq!(paths[3], &PathMatch::Prefix("/".into()));
    assert_eq!(r.rules[0].matches[1].headers[0].name.as_str(), "x-tenant");
    assert_eq!(
        r.rules[0]
            .backends
            .iter()
            .map(|b| b.weight)
            .collect::<Vec<_>>(),
        [3, 1]
    );
    // A rule without matches matches every request.
    assert_eq!(r.rules[1].matches, vec![RouteMatch::default()]);
    // Filters of HTTPRoute only are refused on a GRPCRoute.
    let e = refusal(&text.replace(
        "{type: ResponseHeaderModifier, responseHeaderModifier: {add: [{name: x-served-by, value: echo}]}}",
        "{type: URLRewrite, urlRewrite: {hostname: a.example}}",
    ));
    assert!(e.starts_with("r.yaml:14:14: spec.rules[0].filters[0].type: unknown GRPCRoute filter type \"URLRewrite\""), "{e}");
}

/// Services and ServiceEntries of the route's own namespace attach it to their frontends,
/// a Gateway of its namespace to that waypoint's frontends without routes of their own;
/// other parents are noted, and a route with none of those is skipped.
#[test]
fn parents_a_waypoint_serves() {
    let foreign = "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: ingress, namespace: shop}\nspec:\n  parentRefs: [{name: gateway, namespace: ingress}]\n";
    let p = parse(foreign);
    assert!(p.routes.is_empty() && p.errors.is_empty(), "{p:?}");
    assert_eq!(p.skipped.len(), 1);
    assert_eq!(p.skipped[0].value.reason, SkipReason::NoServiceParent);
    let mixed = "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: mixed, namespace: shop}\nspec:\n  parentRefs:\n  - {name: gateway, namespace: ingress}\n  - {kind: Service, group: \"\", name: web, namespace: front}\n  - {kind: Service, group: \"\", name: web, sectionName: http}\n  - {kind: Service, group: \"\", name: web, port: 80}\n  - {kind: ServiceEntry, group: networking.istio.io, name: api}\n  - {name: waypoint}\n  - {kind: ConfigMap, group: \"\", name: x}\n";
    let r = route(mixed);
    assert_eq!(
        r.parents,
        vec![
            ParentRef {
                service: ServiceKey::new("shop", "web"),
                port: Some(80),
                kind: ParentKind::Service,
            },
            ParentRef {
                service: ServiceKey::new("shop", "api"),
                port: None,
                kind: ParentKind::Service,
            },
            ParentRef {
                service: ServiceKey::new("shop", "waypoint"),
                port: None,
                kind: ParentKind::Gateway,
            },
        ]
    );
    assert_eq!(r.notes.len(), 4, "{:?}", r.notes);
    assert!(
        r.notes[0].starts_with("parentRefs[0] (Gateway ingress/gateway): not honoured"),
        "{:?}",
        r.notes
    );
    assert!(r.notes[1].contains("consumer route"));
    assert!(r.notes[2].contains("sectionName"));
    assert!(
        r.notes[3].starts_with("parentRefs[6] (ConfigMap shop/x): not honoured"),
        "{:?}",
        r.notes
    );
    // The namespace left out is the default one.
    let r = route("apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: r}\nspec: {parentRefs: [{kind: Service, group: \"\", name: web}]}\n");
    assert_eq!(r.namespace, "default");
    assert_eq!(r.parents[0].service, ServiceKey::new("default", "web"));
}

/// An HTTPRoute and a GRPCRoute (or a policy) may share a name; two HTTPRoutes may not.
#[test]
fn duplicates_are_per_kind() {
    let h = |name: &str| {
        format!("apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: {name}, namespace: shop}}\nspec: {{parentRefs: [{{kind: Service, group: \"\", name: web}}]}}\n")
    };
    let g = "apiVersion: gateway.networking.k8s.io/v1\nkind: GRPCRoute\nmetadata: {name: same, namespace: shop}\nspec: {parentRefs: [{kind: Service, group: \"\", name: web}]}\n";
    let ap = "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: same, namespace: shop}\nspec: {targetRefs: [{kind: Service, name: web}]}\n";
    let text = [h("same"), g.into(), ap.into(), h("same")].join("---\n");
    let p = parse(&text);
    assert_eq!(p.routes.len(), 2);
    assert_eq!(p.policies.len(), 1);
    assert_eq!(
        p.errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
        ["r.yaml:18:18: metadata.name: HTTPRoute shop/same is defined again; the first definition (r.yaml:1) is kept"]
    );
}

/// The CRDs' checks, each refused at its field's line and column.
#[test]
fn refusals_name_the_field() {
    let table: Vec<(String, &str)> = vec![
        (
            http("{matches: [{path: {type: Exact, value: foo}}]}"),
            "r.yaml:7:44: spec.rules[0].matches[0].path.value: \"foo\" must be an absolute path, starting with '/'",
        ),
        (
            http("{matches: [{path: {value: /a//b}}]}"),
            "r.yaml:7:31: spec.rules[0].matches[0].path.value: \"/a//b\" must not contain \"//\"",
        ),
        (
            http("{matches: [{path: {value: \"/a b\"}}]}"),
            "r.yaml:7:31: spec.rules[0].matches[0].path.value: \"/a b\" has a character a path cannot hold unescaped (' '); percent-encode it",
        ),
        (
            http("{matches: [{path: {type: Prefix, value: /a}}]}"),
            "r.yaml:7:30: spec.rules[0].matches[0].path.type: unknown path match type \"Prefix\"; one of Exact, PathPrefix, RegularExpression",
        ),
        (
            http("{matches: [{path: {type: RegularExpression, value: \"/a(\"}}]}"),
            "r.yaml:7:56: spec.rules[0].matches[0].path.value: invalid regular expression: unclosed group",
        ),
        (
            http("{matches: [{path: {type: RegularExpression, value: \"(?:a{1000}){1000}\"}}]}"),
            "r.yaml:7:56: spec.rules[0].matches[0].path.value: regular expression is too large once compiled (limit 32768 bytes); simplify it (fewer or smaller counted repetitions)",
        ),
        (
            http("{matches: [{method: get}]}"),
            "r.yaml:7:25: spec.rules[0].matches[0].method: unknown method \"get\"; one of GET, HEAD, POST, PUT, DELETE, CONNECT, OPTIONS, TRACE, PATCH",
        ),
        (
            http("{matches: [{headers: [{name: \"x:y\", value: a}]}]}"),
            "r.yaml:7:34: spec.rules[0].matches[0].headers[0].name: \"x:y\" is not a header name: 1-256 letters, digits or !#$%&'*+-.^_`|~ (no ':' pseudo-headers)",
        ),
        (
            http("{matches: [{headers: [{name: a, value: x}, {name: a, value: y}]}]}"),
            "r.yaml:7:55: spec.rules[0].matches[0].headers[1].name: \"a\" is matched twice",
        ),
        (
            http("{matches: [{headers: [{name: a, value: \"\"}]}]}"),
            "r.yaml:7:44: spec.rules[0].matches[0].headers[0].value: must not be empty",
        ),
        (
            http("{matches: [{queryParams: [{name: a, value: 1}]}]}"),
            "r.yaml:7:48: spec.rules[0].matches[0].queryParams[0].value: invalid type: integer `1`, expected a string (a string: quote numbers and booleans)",
        ),
        (
            http("{backendRefs: [{name: a, port: 80, weight: 1000001}]}"),
            "r.yaml:7:48: spec.rules[0].backendRefs[0].weight: 1000001 is not a weight (0 to 1000000)",
        ),
        (
            http("{backendRefs: [{name: a, port: 80, weight: -1}]}"),
            "r.yaml:7:48: spec.rules[0].backendRefs[0].weight: -1 is not a weight (0 to 1000000)",
        ),
        (
            http("{backendRefs: [{name: a}]}"),
            "r.yaml:7:20: spec.rules[0].backendRefs[0].port: a Service backend must have a port",
        ),
        (
            http("{backendRefs: [{name: a, port: 0}]}"),
            "r.yaml:7:36: spec.rules[0].backendRefs[0].port: 0 is not a port (1-65535)",
        ),
        (
            http("{backendRefs: [{name: a, port: \"80\"}]}"),
            "r.yaml:7:36: spec.rules[0].backendRefs[0].port: invalid type: string \"80\", expected i64",
        ),
        (
            http("{filters: [{type: RequestRedirect, requestRedirect: {statusCode: 304}}]}"),
            "r.yaml:7:70: spec.rules[0].filters[0].requestRedirect.statusCode: 304 is not a redirect status; one of 301, 302, 303, 307, 308",
        ),
        (
            http("{filters: [{type: RequestRedirect, requestRedirect: {}}], backendRefs: [{name: a, port: 80}]}"),
            "r.yaml:7:15: spec.rules[0].filters: a RequestRedirect filter cannot be used together with backendRefs",
        ),
        (
            http("{filters: [{type: RequestRedirect, requestRedirect: {}}, {type: URLRewrite, urlRewrite: {}}]}"),
            "r.yaml:7:62: spec.rules[0].filters[1]: RequestRedirect and URLRewrite filters cannot be used together",
        ),
        (
            http("{filters: [{type: URLRewrite, urlRewrite: {}}, {type: URLRewrite, urlRewrite: {}}]}"),
            "r.yaml:7:52: spec.rules[0].filters[1]: a URLRewrite filter cannot be repeated",
        ),
        (
            http("{filters: [{type: RequestHeaderModifier}]}"),
            "r.yaml:7:16: spec.rules[0].filters[0]: requestHeaderModifier must be set for a RequestHeaderModifier filter",
        ),
        (
            http("{filters: [{type: RequestHeaderModifier, requestHeaderModifier: {}, urlRewrite: {}}]}"),
            "r.yaml:7:85: spec.rules[0].filters[0].urlRewrite: must not be set for a RequestHeaderModifier filter",
        ),
        (
            http("{filters: [{type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: A, value: x}], remove: [a]}}]}"),
            "r.yaml:7:107: spec.rules[0].filters[0].requestHeaderModifier.remove[0]: header \"a\" is named twice; a header modifier takes one action per header",
        ),
        (
            http("{filters: [{type: URLRewrite, urlRewrite: {path: {type: ReplacePrefixMatch, replacePrefixMatch: /b}}}], matches: [{path: {type: Exact, value: /a}}]}"),
            "r.yaml:7:118: spec.rules[0].matches: a filter with path type ReplacePrefixMatch needs exactly one match, of type PathPrefix",
        ),
        (
            http("{filters: [{type: URLRewrite, urlRewrite: {path: {type: ReplaceFullPath, replacePrefixMatch: /b}}}]}"),
            "r.yaml:7:98: spec.rules[0].filters[0].urlRewrite.path.replacePrefixMatch: must not be set when type is ReplaceFullPath",
        ),
        (
            http("{filters: [{type: RequestMirror, requestMirror: {backendRef: {name: m, port: 80}, percent: 101}}]}"),
            "r.yaml:7:96: spec.rules[0].filters[0].requestMirror.percent: 101 is not a percentage (0 to 100)",
        ),
        (
            http("{timeouts: {request: 1s, backendRequest: 2s}}"),
            "r.yaml:7:46: spec.rules[0].timeouts.backendRequest: is longer than the request timeout, which covers it",
        ),
        (
            http("{timeouts: {request: 1.5s}}"),
            "r.yaml:7:26: spec.rules[0].timeouts.request: \"1.5s\" is not a Gateway API duration (unknown unit); write 1 to 4 parts of up to 5 digits and a unit h, m, s or ms, like 10s, 1m30s or 500ms",
        ),
        (
            http("{retry: {codes: [200]}}"),
            "r.yaml:7:22: spec.rules[0].retry.codes[0]: 200 is not a status code from 400 to 599",
        ),
        (
            http("{sessionPersistenc: {}}"),
            "r.yaml:7:6: spec.rules[0].sessionPersistenc: unknown field `sessionPersistenc`, expected one of `name`, `matches`, `filters`, `backendRefs`, `timeouts`, `retry`, `sessionPersistence`",
        ),
        (
            format!("{HTTP_HEAD}  rules: []\n"),
            "r.yaml:6:10: spec.rules: must hold at least 1 rule; leave rules out for the default rule",
        ),
        (
            format!("{HTTP_HEAD}  rules:\n{}", "  - {}\n".repeat(17)),
            "r.yaml:7:3: spec.rules: at most 16 rules",
        ),
        (
            http(&format!("{{matches: [{}]}}", vec!["{}"; 65].join(", "))),
            "r.yaml:7:15: spec.rules[0].matches: at most 64 matches",
        ),
        (
            format!("{HTTP_HEAD}  rules:\n  - {{name: a}}\n  - {{name: a}}\n"),
            "r.yaml:8:12: spec.rules[1].name: rule name \"a\" is used twice; rule names are unique within a route",
        ),
        (
            "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: r, namespace: shop}\nspec:\n  parentRefs: [{kind: Service, group: \"\", name: a}, {kind: Service, group: \"\", name: a}]\n".into(),
            "r.yaml:5:53: spec.parentRefs[1]: refers to a parent already referred to; references to one parent must each set a distinct sectionName or port",
        ),
        (
            "apiVersion: gateway.networking.k8s.io/v1alpha2\nkind: HTTPRoute\nmetadata: {name: r, namespace: shop}\n".into(),
            "r.yaml:1:13: apiVersion: HTTPRoute is read in versions v1, v1beta1 of gateway.networking.k8s.io, not \"v1alpha2\"",
        ),
        (
            "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: r, namespace: shop, creationTimestamp: yesterday}\n".into(),
            "r.yaml:3:57: metadata.creationTimestamp: \"yesterday\" is not a timestamp like 2024-05-01T12:00:00Z (RFC 3339, UTC)",
        ),
        (
            "apiVersion: gateway.networking.k8s.io/v1\nkind: GRPCRoute\nmetadata: {name: r, namespace: shop}\nspec:\n  rules: [{matches: [{method: {service: \"a/b\"}}]}]\n".into(),
            "r.yaml:5:41: spec.rules[0].matches[0].method.service: service \"a/b\" is not a gRPC service name (letters, digits and '_' in '.'-separated parts, not starting with a digit)",
        ),
        (
            "apiVersion: gateway.networking.k8s.io/v1\nkind: GRPCRoute\nmetadata: {name: r, namespace: shop}\nspec:\n  rules: [{matches: [{method: {type: Exact}}]}]\n".into(),
            "r.yaml:5:31: spec.rules[0].matches[0].method: one or both of service and method must be set",
        ),
    ];
    let wrong: Vec<String> = table
        .iter()
        .filter_map(|(text, want)| {
            let got = refusal(text);
            (got != *want).then(|| format!("got  {got}\nwant {want}"))
        })
        .collect();
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The CORS filter, read with the specification's default `maxAge`, and refused by field.
#[test]
fn cors_filters() {
    let r = route(&http("{filters: [{type: CORS, cors: {allowOrigins: [\"https://app.example.com\", \"https://*.shop.example\"], allowCredentials: true, allowMethods: [GET, PUT], allowHeaders: [X-User], exposeHeaders: [x-trace]}}], backendRefs: [{name: a, port: 80}]}"));
    let rule = &r.rules[0];
    assert!(rule.unsupported.is_none());
    let Filter::Cors(c) = &rule.filters[0] else {
        panic!("{:?}", rule.filters)
    };
    assert_eq!(c.allow_origins.len(), 2);
    assert!(c.allows("https://a.shop.example") && !c.allows("https://evil.example"));
    assert_eq!((c.allow_credentials, c.max_age), (true, 5));
    assert_eq!(c.allow_methods, ["GET", "PUT"]);
    assert_eq!(c.allow_headers, ["x-user"]);
    for (cors, want) in [
        (
            "{allowOrigins: [\"app.example.com\"]}",
            "allowOrigins[0]: \"app.example.com\" is not an origin",
        ),
        (
            "{allowMethods: [FETCH]}",
            "allowMethods[0]: \"FETCH\" is not one of",
        ),
        (
            "{allowHeaders: [\"bad header\"]}",
            "allowHeaders[0]: \"bad header\" is not a header name",
        ),
        (
            "{maxAge: 0}",
            "cors.maxAge: must be 1 to 2147483647 seconds",
        ),
        ("{allowOrigin: [\"*\"]}", "unknown field `allowOrigin`"),
    ] {
        let got = refusal(&http(&format!(
            "{{filters: [{{type: CORS, cors: {cors}}}], backendRefs: [{{name: a, port: 80}}]}}"
        )));
        assert!(got.contains(want), "{cors}: {got}");
    }
}

/// Filters the waypoint does not implement are never skipped: the rule answers 500.
#[test]
fn unsupported_filters_fail_the_rule() {
    for f in [
        "{type: ExtensionRef, extensionRef: {group: x.example, kind: F, name: f}}",
        "{type: ExternalAuth, externalAuth: {protocol: HTTP, backendRef: {name: authz, port: 80}}}",
    ] {
        let r = route(&http(&format!(
            "{{filters: [{f}], backendRefs: [{{name: a, port: 80}}]}}"
        )));
        let rule = &r.rules[0];
        assert!(rule.unsupported.is_some(), "{f}");
        assert!(matches!(
            rule.action(0, |_| true),
            Action::Fail(Failure::UnsupportedFilter(_))
        ));
    }
    // A mirror to a backend that cannot be valid is dropped, and noted.
    let r = route(&http("{filters: [{type: RequestMirror, requestMirror: {backendRef: {name: m, namespace: other, port: 80}}}], backendRefs: [{name: a, port: 80}]}"));
    assert!(r.rules[0].filters.is_empty());
    assert_eq!(r.notes.len(), 1, "{:?}", r.notes);
    assert!(r.notes[0].contains("mirror dropped"));
}
