//! Table tests of route choice without sockets: path, method, header and query precedence
//! as the specification orders them, ties between routes (age, then name) and within a
//! route (rule order), scoping by Service and port, GRPCRoute's paths, and HTTPRoute and
//! GRPCRoute on one frontend.

use std::sync::Arc;

use http::HeaderMap;

use crate::*;

fn svc(ns: &str, name: &str) -> ServiceKey {
    ServiceKey::new(ns, name)
}

fn frontend(name: &str, port: u16) -> Frontend {
    Frontend {
        service: svc("shop", name),
        port,
        gateway: Some(Arc::new(svc("shop", "waypoint"))),
    }
}

/// A match built up field by field.
#[derive(Clone)]
struct M(RouteMatch);

fn prefix(p: &str) -> M {
    M(RouteMatch {
        path: PathMatch::prefix(p),
        ..RouteMatch::default()
    })
}

fn exact(p: &str) -> M {
    M(RouteMatch {
        path: PathMatch::Exact(p.into()),
        ..RouteMatch::default()
    })
}

fn regex(p: &str) -> M {
    M(RouteMatch {
        path: PathMatch::Regex(Pattern::new(p).unwrap()),
        ..RouteMatch::default()
    })
}

impl M {
    fn method(mut self, m: &str) -> M {
        self.0.method = Some(m.into());
        self
    }
    fn header(mut self, name: &str, value: &str) -> M {
        self.0.headers.push(HeaderMatch {
            name: name.parse().unwrap(),
            value: ValueMatch::Exact(value.into()),
        });
        self
    }
    fn header_re(mut self, name: &str, value: &str) -> M {
        self.0.headers.push(HeaderMatch {
            name: name.parse().unwrap(),
            value: ValueMatch::Regex(Pattern::new(value).unwrap()),
        });
        self
    }
    fn query(mut self, name: &str, value: &str) -> M {
        self.0.query.push(QueryMatch {
            name: name.into(),
            value: ValueMatch::Exact(value.into()),
        });
        self
    }
}

/// A rule named `name` (its backend is the Service of that name) with these matches.
fn rule(name: &str, matches: Vec<M>) -> Rule {
    Rule {
        name: Some(name.into()),
        matches: matches.into_iter().map(|m| m.0).collect(),
        filters: vec![],
        backends: vec![Backend {
            target: BackendTarget::Service(ServiceBackend {
                service: svc("shop", name),
                port: 8080,
            }),
            weight: 1,
            filters: vec![],
        }],
        timeouts: Timeouts::default(),
        retry: None,
        unsupported: None,
    }
}

fn route(
    name: &str,
    created: Option<i64>,
    parents: &[(&str, Option<u16>)],
    rules: Vec<Rule>,
) -> Arc<Route> {
    Arc::new(Route {
        kind: RouteKind::Http,
        namespace: "shop".into(),
        name: name.into(),
        created: created.map(CreationTime),
        parents: parents
            .iter()
            .map(|(s, port)| match s.strip_prefix("gateway:") {
                Some(gw) => ParentRef {
                    service: svc("shop", gw),
                    port: None,
                    kind: ParentKind::Gateway,
                },
                None => ParentRef {
                    service: svc("shop", s),
                    port: *port,
                    kind: ParentKind::Service,
                },
            })
            .collect(),
        notes: vec![],
        rules,
    })
}

/// A request line with headers: `"GET /a/b?x=1"`, `[("h", "v")]`.
struct Req {
    method: String,
    path: String,
    query: Option<String>,
    headers: HeaderMap,
}

fn req(line: &str, headers: &[(&str, &str)]) -> Req {
    let (method, target) = line.split_once(' ').unwrap();
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p.to_string(), Some(q.to_string())),
        None => (target.to_string(), None),
    };
    let mut h = HeaderMap::new();
    for (k, v) in headers {
        h.append(
            k.parse::<http::header::HeaderName>().unwrap(),
            v.parse().unwrap(),
        );
    }
    Req {
        method: method.into(),
        path,
        query,
        headers: h,
    }
}

/// What the table answers for `r` dialled to `f`: the rule's name, `default` or `404`.
fn choose(table: &RouteTable, f: &Frontend, r: &Req) -> String {
    let request = Request {
        method: &r.method,
        path: &r.path,
        query: r.query.as_deref(),
        headers: &r.headers,
    };
    match table.select(f, &request) {
        Selection::NoRoutes => "default".into(),
        Selection::NotFound => "404".into(),
        Selection::Matched(m) => m.rule.name.clone().unwrap(),
    }
}

/// A request line, its headers and the answer expected.
type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str);

fn check(table: &RouteTable, f: &Frontend, cases: &[Case<'_>]) {
    for (line, headers, want) in cases {
        assert_eq!(
            choose(table, f, &req(line, headers)),
            *want,
            "{line} {headers:?}"
        );
    }
}

const NONE: &[(&str, &str)] = &[];

/// Exact paths beat prefixes, longer prefixes beat shorter, whole segments only; the
/// order the rules are written in does not matter.
#[test]
fn path_precedence() {
    let table = RouteTable::new([route(
        "paths",
        None,
        &[("web", None)],
        vec![
            rule("root", vec![prefix("/")]),
            rule("match", vec![prefix("/match")]),
            rule("match-exact", vec![prefix("/match/exact")]),
            rule("exact-one", vec![exact("/match/exact/one")]),
            rule("exact-match", vec![exact("/match")]),
            rule("prefix-slash", vec![prefix("/match/prefix/")]),
            rule("regex", vec![regex("/match/.*/re")]),
        ],
    )]);
    let f = frontend("web", 80);
    check(
        &table,
        &f,
        &[
            ("GET /match", NONE, "exact-match"),
            ("GET /match/", NONE, "match"),
            ("GET /matchx", NONE, "root"),
            ("GET /match/exact", NONE, "match-exact"),
            ("GET /match/exact/one", NONE, "exact-one"),
            ("GET /match/exact/one/two", NONE, "match-exact"),
            ("GET /match/exact/onex", NONE, "match-exact"),
            ("GET /match/exactly", NONE, "match"),
            // A prefix written with a trailing slash matches the bare path too.
            ("GET /match/prefix", NONE, "prefix-slash"),
            ("GET /match/prefix/x", NONE, "prefix-slash"),
            // A regular expression is ranked after every prefix (as Istio ranks it), so
            // only where the prefixes give way to "/" does it win.
            ("GET /match/x/re", NONE, "match"),
            ("GET /", NONE, "root"),
        ],
    );
    let re_only = RouteTable::new([route(
        "re",
        None,
        &[("web", None)],
        vec![
            rule("root", vec![prefix("/")]),
            rule("regex", vec![regex("/v[0-9]+/.*")]),
        ],
    )]);
    check(
        &re_only,
        &f,
        &[("GET /v2/items", NONE, "root"), ("GET /x", NONE, "root")],
    );
    // Only a prefix of "/" is below nothing; with nothing else a regex is chosen when it
    // holds.
    let alone = RouteTable::new([route(
        "re",
        None,
        &[("web", None)],
        vec![rule("regex", vec![regex("/v[0-9]+/.*")])],
    )]);
    check(
        &alone,
        &f,
        &[("GET /v2/items", NONE, "regex"), ("GET /x", NONE, "404")],
    );
}

/// After the path: a method match, then more header matches, then more query matches.
#[test]
fn method_header_and_query_precedence() {
    let table = RouteTable::new([route(
        "r",
        None,
        &[("web", None)],
        vec![
            rule("query2", vec![prefix("/").query("a", "1").query("b", "2")]),
            rule("query1", vec![prefix("/").query("a", "1")]),
            rule("headers1", vec![prefix("/").header("version", "one")]),
            rule(
                "headers2",
                vec![prefix("/").header("version", "one").header("color", "blue")],
            ),
            rule("method", vec![prefix("/").method("POST")]),
            rule("get-longer", vec![prefix("/items").method("GET")]),
            rule("plain", vec![prefix("/")]),
        ],
    )]);
    let f = frontend("web", 80);
    check(
        &table,
        &f,
        &[
            ("GET /", NONE, "plain"),
            ("GET /?a=1", NONE, "query1"),
            ("GET /?b=2&a=1", NONE, "query2"),
            ("GET /?a=2", NONE, "plain"),
            // A header match beats any number of query matches.
            ("GET /?a=1&b=2", &[("version", "one")], "headers1"),
            // Header names compare case-insensitively.
            (
                "GET /",
                &[("Version", "one"), ("COLOR", "blue")],
                "headers2",
            ),
            ("GET /", &[("version", "One")], "plain"),
            // A method match beats any number of header matches.
            (
                "POST /?a=1",
                &[("version", "one"), ("color", "blue")],
                "method",
            ),
            // A longer prefix beats a method match.
            ("POST /items", NONE, "method"),
            ("GET /items/1", &[("version", "one")], "get-longer"),
            ("get /", NONE, "plain"),
        ],
    );
}

/// Every condition of one match must hold; any one match of a rule is enough.
#[test]
fn conditions_and_matches() {
    let table = RouteTable::new([route(
        "r",
        None,
        &[("web", None)],
        vec![
            rule(
                "both",
                vec![prefix("/foo").header("version", "v2"), prefix("/v2/foo")],
            ),
            rule(
                "re-header",
                vec![prefix("/re").header_re("x-user", "(alice|bob)-[0-9]+")],
            ),
        ],
    )]);
    let f = frontend("web", 80);
    check(
        &table,
        &f,
        &[
            ("GET /foo", &[("version", "v2")], "both"),
            ("GET /foo", NONE, "404"),
            ("GET /v2/foo/x", NONE, "both"),
            ("GET /re", &[("x-user", "bob-12")], "re-header"),
            ("GET /re", &[("x-user", "bob-12x")], "404"),
            ("GET /re", &[("x-user", "bob"), ("x-user", "1")], "404"),
            ("GET /re", NONE, "404"),
        ],
    );
}

/// Equal matches in two routes: the older route wins; then `namespace/name`; a route with
/// no creation time counts as the newest. Within a route, the first rule.
#[test]
fn ties_between_routes_and_rules() {
    let f = frontend("web", 80);
    let same = |r: &str| vec![rule(r, vec![prefix("/same")])];
    let table = RouteTable::new([
        route("b-new", Some(200), &[("web", None)], same("b-new")),
        route("c-old", Some(100), &[("web", None)], same("c-old")),
    ]);
    check(&table, &f, &[("GET /same", NONE, "c-old")]);
    let table = RouteTable::new([
        route("b", Some(100), &[("web", None)], same("b")),
        route("a", Some(100), &[("web", None)], same("a")),
    ]);
    check(&table, &f, &[("GET /same", NONE, "a")]);
    let table = RouteTable::new([
        route("a-unset", None, &[("web", None)], same("a-unset")),
        route("z-set", Some(i64::MAX), &[("web", None)], same("z-set")),
    ]);
    check(&table, &f, &[("GET /same", NONE, "z-set")]);
    let table = RouteTable::new([route(
        "r",
        None,
        &[("web", None)],
        vec![
            rule("first", vec![prefix("/same")]),
            rule("second", vec![prefix("/same")]),
        ],
    )]);
    check(&table, &f, &[("GET /same", NONE, "first")]);
    // Precedence is across routes: a longer prefix in a newer route still wins.
    let table = RouteTable::new([
        route("old", Some(1), &[("web", None)], same("old")),
        route(
            "new",
            Some(2),
            &[("web", None)],
            vec![rule("new", vec![prefix("/same/x")])],
        ),
    ]);
    check(
        &table,
        &f,
        &[("GET /same/x", NONE, "new"), ("GET /same", NONE, "old")],
    );
}

/// A route for one Service never applies to another; a port-scoped one only to its port;
/// a port-less one to every port. No route attached is the default route; routes attached
/// and none matching is 404.
#[test]
fn scoping_by_service_and_port() {
    let table = RouteTable::new([
        route(
            "web-80",
            None,
            &[("web", Some(80))],
            vec![rule("web-80", vec![prefix("/a")])],
        ),
        route(
            "web-all",
            None,
            &[("web", None)],
            vec![rule("web-all", vec![prefix("/b")])],
        ),
        route(
            "api",
            None,
            &[("api", Some(80))],
            vec![rule("api", vec![prefix("/")])],
        ),
    ]);
    check(
        &table,
        &frontend("web", 80),
        &[
            ("GET /a", NONE, "web-80"),
            ("GET /b", NONE, "web-all"),
            ("GET /c", NONE, "404"),
        ],
    );
    check(
        &table,
        &frontend("web", 9090),
        &[("GET /a", NONE, "404"), ("GET /b", NONE, "web-all")],
    );
    // api's route matches every path, but only on api's port 80.
    check(&table, &frontend("api", 80), &[("GET /a", NONE, "api")]);
    check(&table, &frontend("api", 81), &[("GET /a", NONE, "default")]);
    check(
        &table,
        &frontend("other", 80),
        &[("GET /a", NONE, "default")],
    );
    // The same name in another namespace is another Service.
    let f = Frontend {
        service: svc("test", "web"),
        port: 80,
        gateway: None,
    };
    check(&table, &f, &[("GET /a", NONE, "default")]);
    // One route with two parents applies to both.
    let two = RouteTable::new([route(
        "two",
        None,
        &[("web", Some(80)), ("api", None)],
        vec![rule("two", vec![prefix("/")])],
    )]);
    check(&two, &frontend("web", 80), &[("GET /x", NONE, "two")]);
    check(&two, &frontend("web", 81), &[("GET /x", NONE, "default")]);
    check(&two, &frontend("api", 1234), &[("GET /x", NONE, "two")]);
    assert_eq!(
        two.attached(&frontend("api", 1))
            .iter()
            .map(|r| r.name.as_str())
            .collect::<Vec<_>>(),
        ["two"]
    );
    assert!(two.attached(&frontend("web", 81)).is_empty());
}

#[test]
fn a_waypoints_gateway_routes_apply_where_a_service_has_none() {
    // Istio: routes attached to a Service beat those attached to its waypoint's Gateway.
    let table = RouteTable::new([
        route(
            "everything",
            None,
            &[("gateway:waypoint", None)],
            vec![rule("gateway", vec![prefix("/")])],
        ),
        route(
            "web-80",
            None,
            &[("web", Some(80))],
            vec![rule("web-80", vec![prefix("/a")])],
        ),
    ]);
    // web on 80 has its own: those only (no fallback to the Gateway's per request).
    check(
        &table,
        &frontend("web", 80),
        &[("GET /a", NONE, "web-80"), ("GET /b", NONE, "404")],
    );
    // web on another port, and api, have none: the Gateway's.
    check(
        &table,
        &frontend("web", 8080),
        &[("GET /b", NONE, "gateway")],
    );
    check(&table, &frontend("api", 80), &[("GET /x", NONE, "gateway")]);
    // Another waypoint's Gateway, or none known: the default.
    let mut other = frontend("api", 80);
    other.gateway = Some(Arc::new(svc("shop", "other-waypoint")));
    check(&table, &other, &[("GET /x", NONE, "default")]);
    other.gateway = None;
    check(&table, &other, &[("GET /x", NONE, "default")]);
    assert_eq!(
        table
            .attached(&frontend("api", 80))
            .iter()
            .map(|r| r.name.as_str())
            .collect::<Vec<_>>(),
        ["everything"]
    );
}

fn grpc_rule(name: &str, service: Option<&str>, method: Option<&str>) -> Rule {
    let path = grpc_path_match(GrpcMatchType::Exact, service, method).unwrap();
    let mut r = rule(name, vec![]);
    r.matches = vec![RouteMatch {
        path,
        ..RouteMatch::default()
    }];
    r
}

/// GRPCRoute's service and method as paths, in precedence: service and method, then the
/// service alone, then the method alone.
#[test]
fn grpc_routes_choose_by_service_and_method() {
    let mut g = (*route(
        "grpc",
        None,
        &[("echo", None)],
        vec![
            grpc_rule("method-only", None, Some("Echo")),
            grpc_rule("service-only", Some("echo.v1.Echo"), None),
            grpc_rule("both", Some("echo.v1.Echo"), Some("Echo")),
        ],
    ))
    .clone();
    g.kind = RouteKind::Grpc;
    let table = RouteTable::new([Arc::new(g)]);
    check(
        &table,
        &frontend("echo", 9000),
        &[
            ("POST /echo.v1.Echo/Echo", NONE, "both"),
            ("POST /echo.v1.Echo/Stream", NONE, "service-only"),
            ("POST /other.Svc/Echo", NONE, "method-only"),
            ("POST /other.Svc/Other", NONE, "404"),
        ],
    );
}

/// HTTPRoutes and GRPCRoutes on one frontend are not merged: the oldest route's kind is
/// used and the other kind's routes are left out.
#[test]
fn http_and_grpc_routes_are_not_merged() {
    let mut g = (*route(
        "grpc",
        Some(1),
        &[("echo", None)],
        vec![rule("grpc", vec![prefix("/grpc")])],
    ))
    .clone();
    g.kind = RouteKind::Grpc;
    let h = route(
        "http",
        Some(2),
        &[("echo", Some(80))],
        vec![rule("http", vec![prefix("/")])],
    );
    let table = RouteTable::new([Arc::new(g), h]);
    check(
        &table,
        &frontend("echo", 80),
        &[("GET /grpc", NONE, "grpc"), ("GET /other", NONE, "404")],
    );
    assert_eq!(table.attached(&frontend("echo", 80)).len(), 1);
}

/// What users are shown: the evaluation order, a match that another evaluated first
/// always wins over, and a route of the other kind left out.
#[test]
fn evaluation_order_and_refusals() {
    let older = route(
        "older",
        Some(1),
        &[("echo", None)],
        vec![rule("older", vec![prefix("/api"), exact("/health")])],
    );
    let newer = route(
        "newer",
        Some(2),
        &[("echo", Some(80))],
        vec![
            rule("shadowed", vec![prefix("/api/")]),
            rule("distinct", vec![prefix("/api").method("POST")]),
        ],
    );
    let mut g = (*route("grpc", Some(3), &[("echo", Some(80))], vec![])).clone();
    g.kind = RouteKind::Grpc;
    let table = RouteTable::new([newer, older, Arc::new(g)]);
    let f = frontend("echo", 80);
    let order: Vec<String> = table
        .evaluation(&f)
        .iter()
        .map(|m| format!("{}#{}.{}", m.route.name, m.rule_index, m.match_index))
        .collect();
    assert_eq!(
        order,
        ["older#0.1", "newer#1.0", "older#0.0", "newer#0.0"],
        "exact, then a prefix with a method, then equal prefixes oldest first"
    );
    let refusals = table.refusals(&f);
    assert_eq!(refusals.len(), 2, "{refusals:?}");
    assert_eq!(refusals[0].route, "shop/newer");
    assert!(
        refusals[0]
            .why
            .contains("rule 0 match 0 conflicts with HTTPRoute shop/older rule 0 match 0"),
        "{}",
        refusals[0].why
    );
    assert_eq!(
        (refusals[1].route.as_str(), refusals[1].kind),
        ("shop/grpc", RouteKind::Grpc)
    );
    // Another port of the Service sees only the route attached to every port.
    assert!(table.refusals(&frontend("echo", 81)).is_empty());
    assert_eq!(table.ports_named(&svc("shop", "echo")), [80]);
}

/// Exact matches are looked up by path: only those of the request's own path are
/// evaluated, in their order, and one whose other conditions fail falls through to the
/// rest (prefixes, regular expressions) as a scan would.
#[test]
fn exact_paths_are_looked_up_in_order_and_fall_through() {
    let table = RouteTable::new([
        route(
            "older",
            Some(1),
            &[("web", None)],
            vec![
                rule("exact-get", vec![exact("/a").method("GET")]),
                rule("exact-other", vec![exact("/b")]),
                rule("root", vec![prefix("/")]),
            ],
        ),
        route(
            "newer",
            Some(2),
            &[("web", Some(80))],
            vec![
                rule("exact-header", vec![exact("/a").header("x-v", "1")]),
                rule("exact-any", vec![exact("/a")]),
            ],
        ),
    ]);
    check(
        &table,
        &frontend("web", 80),
        &[
            ("GET /a", NONE, "exact-get"),
            ("POST /a", &[("x-v", "1")], "exact-header"),
            ("POST /a", NONE, "exact-any"),
            ("GET /b", NONE, "exact-other"),
            ("GET /c", NONE, "root"),
        ],
    );
    // Port 81 has only the route attached to every port: no exact match for POST /a.
    check(
        &table,
        &frontend("web", 81),
        &[("POST /a", NONE, "root"), ("GET /a", NONE, "exact-get")],
    );
}
