//! HTTPRoutes and GRPCRoutes applied by `ambit waypoint` end to end, as root: the L7 lab
//! (two nodes with ambit's node proxies, the waypoint pod, apps in and out of the mesh),
//! real HTTP/1.1 clients and a real gRPC client (tonic) in the client node dialling the
//! Services' VIPs, real HTTP and gRPC servers behind. Routes come from the waypoint's
//! config file, as a user writes them.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Duration;

use ambit_netns_lab::l7::{request, L7Lab, Reply, GRPC_VIP, PLAIN_POD, SERVER_POD};
use ambit_netns_lab::mesh::{metric_sum, SERVICE_PORT};

/// `echo` port 80: every filter, weights, timeouts and retries. `echo-v1` is the server
/// pod (in the mesh), `echo-v2` the plain pod.
const ROUTES: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: echo-routes, namespace: default}
spec:
  parentRefs: [{group: "", kind: Service, name: echo, port: 80}]
  rules:
  - matches: [{path: {type: PathPrefix, value: /split}}]
    backendRefs: [{name: echo-v1, port: 80, weight: 90}, {name: echo-v2, port: 80, weight: 10}]
  - matches: [{headers: [{name: x-version, value: v2}]}]
    backendRefs: [{name: echo-v2, port: 80}]
  - matches: [{path: {type: PathPrefix, value: /redirect}}]
    filters:
    - type: RequestRedirect
      requestRedirect: {hostname: example.com, path: {type: ReplacePrefixMatch, replacePrefixMatch: /moved}, statusCode: 301}
  - matches: [{path: {type: PathPrefix, value: /rewrite}}]
    filters:
    - type: URLRewrite
      urlRewrite: {hostname: rewritten.example, path: {type: ReplacePrefixMatch, replacePrefixMatch: /rewritten}}
    backendRefs: [{name: echo-v1, port: 80}]
  - matches: [{path: {type: PathPrefix, value: /headers}}]
    filters:
    - type: RequestHeaderModifier
      requestHeaderModifier:
        set: [{name: x-set, value: by-route}]
        add: [{name: x-add, value: added}]
        remove: [x-remove]
    - type: ResponseHeaderModifier
      responseHeaderModifier: {set: [{name: x-response, value: by-route}]}
    backendRefs:
    - name: echo-v1
      port: 80
      filters:
      - type: RequestHeaderModifier
        requestHeaderModifier: {set: [{name: x-backend, value: v1}]}
  - matches: [{path: {type: PathPrefix, value: /timeout}}]
    timeouts: {request: 300ms}
    backendRefs: [{name: echo-v1, port: 80}]
  - matches: [{path: {type: PathPrefix, value: /retry}}]
    retry: {codes: [503], attempts: 3, backoff: 10ms}
    backendRefs: [{name: echo-v2, port: 80}]
  - matches: [{path: {type: PathPrefix, value: /mirror}}]
    filters:
    - type: RequestMirror
      requestMirror: {backendRef: {name: echo-v2, port: 80}}
    backendRefs: [{name: echo-v1, port: 80}]
  - matches: [{path: {type: PathPrefix, value: /missing}}]
    backendRefs: [{name: nowhere, port: 80}]
  - matches: [{path: {type: PathPrefix, value: /slow}}]
    backendRefs: [{name: echo-v1, port: 80}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: grpc-routes, namespace: default}
spec:
  parentRefs: [{group: "", kind: Service, name: grpc-echo}]
  rules:
  - matches: [{method: {service: lab.Echo, method: Hello}, headers: [{name: x-version, value: v2}]}]
    backendRefs: [{name: echo-v2, port: 80}]
  - matches: [{method: {service: lab.Echo}}]
    filters:
    - type: ResponseHeaderModifier
      responseHeaderModifier: {add: [{name: x-routed, value: grpc}]}
    backendRefs: [{name: echo-v1, port: 80}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: no-forbidden, namespace: default}
spec:
  targetRefs: [{kind: Service, group: "", name: grpc-echo}]
  action: DENY
  rules: [{to: [{operation: {paths: ["/lab.Echo/Forbidden"]}}]}]
"#;

fn launch(tag: &str, routes: &str) -> L7Lab {
    L7Lab::launch(tag, Path::new(env!("CARGO_BIN_EXE_ambit")), routes).unwrap()
}

fn get(lab: &L7Lab, path: &str, headers: &[(&str, &str)]) -> Reply {
    let mut req = request("GET", path).unwrap();
    for (k, v) in headers {
        req.headers_mut().insert(
            http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            v.parse().unwrap(),
        );
    }
    lab.send_http1(vec![req]).unwrap().remove(0)
}

fn header<'r>(r: &'r Reply, name: &str) -> Option<&'r str> {
    r.headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

#[test]
fn http_routes_through_the_waypoint() {
    let lab = launch("wp-routes", ROUTES);

    // A 90/10 split, counted on the v2 side (ambit_netns_lab::stats::TEN_PERCENT): 2,000 requests
    // on one HTTP/2 connection, 135..=246 answered by v2. A correct 10 % passes with
    // p = 0.99962; 5 % fails with p = 0.99964, 15 % with p = 0.99970.
    let split = &ambit_netns_lab::stats::TEN_PERCENT;
    let replies = lab
        .h2("GET", "/split", split.samples)
        .unwrap_or_else(|e| panic!("{e:#}\n{}", lab.waypoint_log()));
    assert!(replies.iter().all(|r| r.status == 200), "{replies:?}");
    let v2 = replies
        .iter()
        .filter(|r| r.pod() == Some(PLAIN_POD))
        .count();
    let v1 = replies
        .iter()
        .filter(|r| r.pod() == Some(SERVER_POD))
        .count();
    assert_eq!(v1 + v2, split.samples);
    split
        .check(v2)
        .unwrap_or_else(|e| panic!("v2 answered {e}"));

    // A header match, and no match at all: 404 with flag NR.
    assert_eq!(
        get(&lab, "/any", &[("x-version", "v2")]).pod(),
        Some(PLAIN_POD)
    );
    let none = get(&lab, "/any", &[]);
    assert_eq!(none.status, 404, "{none:?}");

    // Redirect: the host and path changed, the dialled port kept, nothing forwarded.
    let r = get(&lab, "/redirect/a?q=1", &[]);
    assert_eq!(r.status, 301, "{r:?}");
    // The dialled port, 80, is http's own and so left out.
    assert_eq!(
        header(&r, "location"),
        Some("http://example.com/moved/a?q=1")
    );
    assert!(lab.app.seen_with("/redirect").is_empty());

    // Rewrite: the app sees the new host and path, the query kept.
    let r = get(&lab, "/rewrite/x?y=1", &[]);
    assert_eq!(r.status, 200, "{r:?}");
    assert!(r.body.starts_with("server GET /rewritten/x?y=1 "), "{r:?}");
    assert_eq!(header(&r, "echo-host"), Some("rewritten.example"));

    // Header modifiers on the request (the rule's, then the backend's) and the response.
    let r = get(
        &lab,
        "/headers",
        &[
            ("x-set", "client"),
            ("x-add", "client"),
            ("x-remove", "client"),
        ],
    );
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(header(&r, "echo-x-set"), Some("by-route"));
    assert_eq!(header(&r, "echo-x-add"), Some("client,added"));
    assert_eq!(header(&r, "echo-x-remove"), None);
    assert_eq!(header(&r, "echo-x-backend"), Some("v1"));
    assert_eq!(header(&r, "x-response"), Some("by-route"));

    // A request timeout of 300 ms against an app that would take a minute: 504 while the
    // app still holds the request (it saw it, and its delay has not run out), so the answer
    // came from the timeout and not after the app's. A waypoint that waited for the app
    // answers after the minute, and fails here however it answers.
    let r = get(&lab, "/timeout/delay/60000/", &[]);
    assert_eq!(r.status, 504, "{r:?}");
    assert_eq!(r.body, "upstream request timeout");
    assert_eq!(lab.app.seen_with("/timeout/delay/60000/").len(), 1);
    assert_eq!(lab.app.delays_ended.load(Ordering::SeqCst), 0);
    // Within the timeout it is served.
    assert_eq!(get(&lab, "/timeout/delay/10/", &[]).status, 200);

    // Retries on 503, three after the first: a backend failing twice then succeeding is
    // served; one failing five times is answered its fourth 503.
    let r = get(&lab, "/retry/flaky/twice/2/", &[]);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(lab.app.seen_with("/retry/flaky/twice/").len(), 3);
    let r = get(&lab, "/retry/flaky/five/5/", &[]);
    assert_eq!(r.status, 503, "{r:?}");
    assert_eq!(lab.app.seen_with("/retry/flaky/five/").len(), 4);
    // A POST body is sent again on each try.
    let mut post = request("POST", "/retry/flaky/post/1/").unwrap();
    *post.body_mut() = http_body_util::Full::new(bytes::Bytes::from_static(b"twelve bytes"));
    let r = lab.send_http1(vec![post]).unwrap().remove(0);
    assert_eq!(r.status, 200, "{r:?}");
    assert!(
        r.body.contains(" 12 "),
        "the retried body arrived whole: {r:?}"
    );
    // A connection closed after the request was sent (the Gateway API's
    // HTTPRouteRetryConnectionError): retried when the route asks for retries, answered
    // 503 UC by the mesh default (which retries only what never reached the app).
    let r = get(&lab, "/retry/close/once/1/", &[]);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(lab.app.seen_with("/retry/close/once/").len(), 2);
    let r = get(&lab, "/headers/close/default/1/", &[]);
    assert_eq!(r.status, 503, "{r:?}");
    assert_eq!(
        r.body,
        "upstream connect error or disconnect/reset before headers. reset reason: connection termination"
    );
    assert_eq!(lab.app.seen_with("/headers/close/default/").len(), 1);
    let metrics = lab.waypoint_metrics().unwrap();
    let uc = [("response_code", "503"), ("response_flags", "UC")];
    assert_eq!(
        metric_sum(&metrics, "istio_requests_total", &uc),
        1,
        "{metrics}"
    );

    // One onward HTTP/1.1 connection serves request after request, whether the response
    // has a body, none (HEAD), or none by its status (204): each is handed back to the
    // pool as its response ends. At most one new connection (none idle to echo-v1 yet).
    let before = lab.app.connections.load(Ordering::SeqCst);
    let mut requests = Vec::new();
    for i in 0..10 {
        for (method, path) in [
            ("GET", format!("/headers/reuse/{i}")),
            ("HEAD", format!("/headers/reuse-head/{i}")),
            ("GET", format!("/headers/status/204/{i}")),
        ] {
            requests.push(request(method, &path).unwrap());
        }
    }
    let replies = lab.send_http1(requests).unwrap();
    let statuses: Vec<u16> = replies.iter().map(|r| r.status).collect();
    assert_eq!(statuses, [200, 200, 204].repeat(10));
    let opened = lab.app.connections.load(Ordering::SeqCst) - before;
    assert!(
        opened <= 1,
        "{opened} onward connections for 30 requests in a row"
    );
    assert_eq!(lab.app.seen_with("/headers/reuse-head/").len(), 10);

    // A mirror gets a copy (its host marked -shadow); the client sees the primary only.
    let r = get(&lab, "/mirror/one", &[]);
    assert_eq!(r.pod(), Some(SERVER_POD), "{r:?}");
    ambit_netns_lab::wait_until(
        "the mirror to receive its copy",
        Duration::from_secs(5),
        || !lab.app.seen_with("plain GET /mirror/one").is_empty(),
    )
    .unwrap();
    let copy = lab.app.seen_with("plain GET /mirror/one").remove(0);
    assert!(copy.contains("-shadow"), "{copy}");

    // A backend the mesh does not have: 500, and /config_dump says why.
    assert_eq!(get(&lab, "/missing", &[]).status, 500);
    let dump = lab.waypoint_config_dump().unwrap();
    let frontends = dump["waypointRoutes"]["frontends"].as_array().unwrap();
    let echo = frontends
        .iter()
        .find(|f| f["service"] == "default/echo" && f["port"] == 80)
        .unwrap_or_else(|| panic!("{frontends:?}"));
    assert_eq!(echo["attached"], serde_json::json!(["default/echo-routes"]));
    let refused = echo["refused"].to_string();
    assert!(
        refused.contains("default/nowhere does not exist"),
        "{refused}"
    );
    let order = echo["evaluationOrder"].as_array().unwrap();
    assert_eq!(
        order[0]["match"], "PathPrefix /redirect",
        "longest prefix first"
    );
    // Port 3306 of echo has no route.
    assert!(!frontends
        .iter()
        .any(|f| f["service"] == "default/echo" && f["port"] == 3306));

    let metrics = lab.waypoint_metrics().unwrap();
    let nr = metric_sum(
        &metrics,
        "istio_requests_total",
        &[("response_code", "404"), ("response_flags", "NR")],
    );
    assert_eq!(nr, 1, "{metrics}");
    let to_v2 = metric_sum(
        &metrics,
        "istio_requests_total",
        &[
            ("destination_service_name", "echo-v2"),
            ("response_code", "200"),
        ],
    );
    assert!(
        to_v2 >= v2 as u64,
        "requests routed to echo-v2 are labelled with it"
    );
    let ut = metric_sum(
        &metrics,
        "istio_requests_total",
        &[("response_code", "504"), ("response_flags", "UT")],
    );
    assert_eq!(ut, 1, "{metrics}");

    // A change of the routes: new requests follow it, the one in flight finishes.
    let slow = {
        let stream = lab.connect(SERVICE_PORT).unwrap();
        lab.rt.spawn(async move {
            let (mut sender, conn) =
                hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                    .await
                    .unwrap();
            tokio::spawn(conn);
            let resp = sender
                .send_request(request("GET", "/slow").unwrap())
                .await
                .unwrap();
            let status = resp.status().as_u16();
            use http_body_util::BodyExt;
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            (status, String::from_utf8_lossy(&body).into_owned())
        })
    };
    ambit_netns_lab::wait_until("the slow request to begin", Duration::from_secs(5), || {
        lab.app.slow_started.load(Ordering::SeqCst) >= 1
    })
    .unwrap();
    let changed = ROUTES.replace(
        "backendRefs: [{name: echo-v1, port: 80, weight: 90}, {name: echo-v2, port: 80, weight: 10}]",
        "backendRefs: [{name: echo-v2, port: 80}]",
    );
    std::fs::write(&lab.policies, changed).unwrap();
    ambit_netns_lab::wait_until(
        "the changed route to be used",
        Duration::from_secs(10),
        || {
            get(&lab, "/split/after", &[]).pod() == Some(PLAIN_POD)
                && (0..20).all(|_| get(&lab, "/split/after", &[]).pod() == Some(PLAIN_POD))
        },
    )
    .unwrap();
    let (status, body) = lab.rt.block_on(slow).unwrap();
    assert_eq!(status, 200, "the request in flight finished: {body}");
    assert!(body.starts_with("server GET /slow"), "{body}");
}

/// A unary call with tonic, to `grpc-echo`, of `/lab.Echo/<method>`.
#[allow(clippy::result_large_err)] // tonic's own error type, as its calls return it
fn grpc_call(
    lab: &L7Lab,
    method: &str,
    headers: &[(&str, &str)],
) -> Result<(String, tonic::metadata::MetadataMap), tonic::Status> {
    let stream = lab
        .connect_to(std::net::SocketAddr::from((GRPC_VIP, SERVICE_PORT)))
        .unwrap();
    let path = format!("/lab.Echo/{method}");
    let headers: Vec<(String, String)> = headers
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    lab.rt.block_on(async move {
        let stream = std::sync::Arc::new(std::sync::Mutex::new(Some(stream)));
        let channel =
            tonic::transport::Endpoint::from_static("http://grpc-echo.default.svc.cluster.local")
                .connect_with_connector(tower_service_fn(move || {
                    stream
                        .lock()
                        .unwrap()
                        .take()
                        .map(hyper_util::rt::TokioIo::new)
                }))
                .await
                .map_err(|e| tonic::Status::unknown(format!("connect: {e}")))?;
        let mut client = tonic::client::Grpc::new(channel);
        client
            .ready()
            .await
            .map_err(|e| tonic::Status::unknown(e.to_string()))?;
        let mut req = tonic::Request::new("hi".to_string());
        for (k, v) in &headers {
            req.metadata_mut().insert(
                tonic::metadata::MetadataKey::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        let codec = tonic::codec::ProstCodec::<String, String>::default();
        let resp = client.unary(req, path.parse().unwrap(), codec).await?;
        let metadata = resp.metadata().clone();
        Ok((resp.into_inner(), metadata))
    })
}

/// A connector that hands out one already-made connection.
fn tower_service_fn<F, IO>(
    take: F,
) -> impl tower_service::Service<
    http::Uri,
    Response = IO,
    Error = std::io::Error,
    Future = std::future::Ready<Result<IO, std::io::Error>>,
> + Clone
where
    F: Fn() -> Option<IO> + Clone,
{
    #[derive(Clone)]
    struct Once<F>(F);
    impl<F: Fn() -> Option<IO> + Clone, IO> tower_service::Service<http::Uri> for Once<F> {
        type Response = IO;
        type Error = std::io::Error;
        type Future = std::future::Ready<Result<IO, std::io::Error>>;
        fn poll_ready(
            &mut self,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Result<(), std::io::Error>> {
            std::task::Poll::Ready(Ok(()))
        }
        fn call(&mut self, _: http::Uri) -> Self::Future {
            std::future::ready(
                (self.0)()
                    .ok_or_else(|| std::io::Error::other("the lab's connection was already used")),
            )
        }
    }
    Once(take)
}

#[test]
fn grpc_routes_with_a_real_client_and_server() {
    let lab = launch("wp-grpc", ROUTES);
    // By service and method, and by a header: each to its backend.
    let (reply, metadata) = grpc_call(&lab, "Hello", &[]).unwrap();
    assert_eq!(reply, "server /lab.Echo/Hello hi");
    assert_eq!(
        metadata.get("x-routed").map(|v| v.to_str().unwrap()),
        Some("grpc")
    );
    let (reply, _) = grpc_call(&lab, "Hello", &[("x-version", "v2")]).unwrap();
    assert_eq!(reply, "plain /lab.Echo/Hello hi");
    // Refusals as trailers-only answers, with Envoy's mapping: policy denial 403 is
    // PERMISSION_DENIED; no route 404 is UNIMPLEMENTED.
    let denied = grpc_call(&lab, "Forbidden", &[]).unwrap_err();
    assert_eq!(denied.code(), tonic::Code::PermissionDenied, "{denied:?}");
    // The app's own status passes through (UNAVAILABLE is retried, as Istio's default
    // retry does, and answered again).
    let failed = grpc_call(&lab, "Fail", &[]).unwrap_err();
    assert_eq!(failed.code(), tonic::Code::Unavailable, "{failed:?}");
    assert_eq!(lab.app.seen_with("/lab.Echo/Fail").len(), 3, "two retries");

    // A request is counted once its answer has gone out whole, which the client can see
    // a moment before: wait for the last one's count (every other is checked exactly).
    let mut metrics = String::new();
    let counted = ambit_netns_lab::wait_until(
        "the waypoint to count the UNAVAILABLE answer",
        std::time::Duration::from_secs(10),
        || {
            metrics = lab.waypoint_metrics().unwrap();
            metric_sum(
                &metrics,
                "istio_requests_total",
                &[("grpc_response_status", "14")],
            ) > 0
        },
    );
    assert!(counted.is_ok(), "{metrics}");
    let ok = metric_sum(
        &metrics,
        "istio_requests_total",
        &[("request_protocol", "grpc"), ("grpc_response_status", "0")],
    );
    assert_eq!(ok, 2, "{metrics}");
    let denied = metric_sum(
        &metrics,
        "istio_requests_total",
        &[("grpc_response_status", "7"), ("response_code", "200")],
    );
    assert_eq!(denied, 1, "{metrics}");
    let unavailable = metric_sum(
        &metrics,
        "istio_requests_total",
        &[("grpc_response_status", "14")],
    );
    assert_eq!(unavailable, 1, "{metrics}");
}

#[test]
fn a_grpc_request_no_route_matches_is_unimplemented() {
    // Only this GRPCRoute: lab.Echo/Hello; another method has no route.
    let routes = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: only-hello, namespace: default}
spec:
  parentRefs: [{group: "", kind: Service, name: grpc-echo}]
  rules:
  - matches: [{method: {service: lab.Echo, method: Hello}}]
    backendRefs: [{name: echo-v1, port: 80}]
"#;
    let lab = launch("wp-grpc-nr", routes);
    assert!(grpc_call(&lab, "Hello", &[]).is_ok());
    let missing = grpc_call(&lab, "Other", &[]).unwrap_err();
    assert_eq!(missing.code(), tonic::Code::Unimplemented, "{missing:?}");
    let metrics = lab.waypoint_metrics().unwrap();
    assert_eq!(
        metric_sum(
            &metrics,
            "istio_requests_total",
            &[("grpc_response_status", "12"), ("response_flags", "NR")],
        ),
        1,
        "{metrics}"
    );
}

#[test]
fn routes_attached_to_the_waypoints_gateway_serve_services_without_their_own() {
    // One route on the waypoint's Gateway (its GATEWAY_NAME is its service account,
    // `waypoint`), one on `echo`: `echo` keeps its own; `flaky` has none and takes the
    // Gateway's.
    let routes = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: whole-waypoint, namespace: default}
spec:
  parentRefs: [{name: waypoint}]
  rules:
  - matches: [{path: {type: PathPrefix, value: /gw}}]
    filters:
    - type: ResponseHeaderModifier
      responseHeaderModifier: {set: [{name: x-route, value: gateway}]}
    backendRefs: [{name: echo-v2, port: 80}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: echo-own, namespace: default}
spec:
  parentRefs: [{group: "", kind: Service, name: echo}]
  rules:
  - backendRefs: [{name: echo-v1, port: 80}]
"#;
    let lab = launch("wp-gw-routes", routes);
    let flaky = |path: &str| {
        let mut req = request("GET", path).unwrap();
        let host = ambit_netns_lab::l7::FLAKY_HOST;
        *req.uri_mut() = format!("http://{host}{path}").parse().unwrap();
        req.headers_mut().insert("host", host.parse().unwrap());
        lab.send_http1_to(
            std::net::SocketAddr::from((ambit_netns_lab::l7::FLAKY_VIP, 80)),
            vec![req],
        )
        .unwrap()
        .remove(0)
    };
    let r = flaky("/gw/1");
    assert_eq!((r.status, r.pod()), (200, Some(PLAIN_POD)), "{r:?}");
    assert_eq!(header(&r, "x-route"), Some("gateway"));
    // Routes are bound to flaky (the Gateway's) and none matches: 404.
    assert_eq!(flaky("/other").status, 404);
    // echo has its own route: the Gateway's never applies to it.
    let r = get(&lab, "/gw/1", &[]);
    assert_eq!((r.status, r.pod()), (200, Some(SERVER_POD)), "{r:?}");
    assert_eq!(header(&r, "x-route"), None);
}

#[test]
fn the_cors_filter_answers_preflights_and_annotates_answers() {
    let routes = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: echo-cors, namespace: default}
spec:
  parentRefs: [{group: "", kind: Service, name: echo}]
  rules:
  - filters:
    - type: CORS
      cors:
        allowOrigins: ["https://app.example.com", "https://*.shop.example"]
        allowMethods: [GET, PUT]
        allowHeaders: [x-user]
        exposeHeaders: [x-trace]
        allowCredentials: true
        maxAge: 600
    backendRefs: [{name: echo-v1, port: 80}]
"#;
    let lab = launch("wp-cors", routes);
    let send = |method: &str, path: &str, headers: &[(&str, &str)]| {
        let mut req = request(method, path).unwrap();
        for (k, v) in headers {
            req.headers_mut().insert(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        lab.send_http1(vec![req]).unwrap().remove(0)
    };
    // A preflight from an allowed origin: answered by the waypoint, never forwarded.
    let r = send(
        "OPTIONS",
        "/cors/preflight",
        &[
            ("origin", "https://a.shop.example"),
            ("access-control-request-method", "PUT"),
            ("access-control-request-headers", "x-user"),
        ],
    );
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(
        header(&r, "access-control-allow-origin"),
        Some("https://a.shop.example")
    );
    assert_eq!(header(&r, "access-control-allow-methods"), Some("GET, PUT"));
    assert_eq!(header(&r, "access-control-allow-headers"), Some("x-user"));
    assert_eq!(header(&r, "access-control-allow-credentials"), Some("true"));
    assert_eq!(header(&r, "access-control-max-age"), Some("600"));
    assert!(lab.app.seen_with("/cors/preflight").is_empty());
    // The request itself: forwarded, the answer annotated.
    let r = send("GET", "/cors/get", &[("origin", "https://app.example.com")]);
    assert_eq!((r.status, r.pod()), (200, Some(SERVER_POD)), "{r:?}");
    assert_eq!(
        header(&r, "access-control-allow-origin"),
        Some("https://app.example.com")
    );
    assert_eq!(header(&r, "access-control-expose-headers"), Some("x-trace"));
    // Another origin: forwarded as is (the browser enforces the missing headers), its
    // preflight too.
    let r = send("GET", "/cors/evil", &[("origin", "https://evil.example")]);
    assert_eq!(r.status, 200);
    assert_eq!(header(&r, "access-control-allow-origin"), None);
    let r = send(
        "OPTIONS",
        "/cors/evil-preflight",
        &[
            ("origin", "https://evil.example"),
            ("access-control-request-method", "PUT"),
        ],
    );
    assert_eq!(header(&r, "access-control-allow-origin"), None);
    assert_eq!(lab.app.seen_with("/cors/evil-preflight").len(), 1);
}
