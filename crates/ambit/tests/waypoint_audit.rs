//! The waypoint audit's findings, each closed and checked end to end through the real
//! path, as root: a client app in the client node → its node proxy → HBONE → `ambit
//! waypoint` → the `echo` app (over HBONE, or plaintext). Every case here failed before
//! its fix: an `Upgrade: h2c` that joined a backend past every check, a `Host` that
//! differed from what policy saw, a forged `x-forwarded-client-cert`, two `Host` headers,
//! retries without a ceiling, forged claim headers on a CORS preflight, a fronted VIP on
//! any port, 200 streams per HBONE connection, `Connection` stripping the waypoint's own
//! `x-request-id`, and malformed chunked bodies answered 503.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::Duration;

use ambit_netns_lab::jwt::{now, Issuer};
use ambit_netns_lab::l7::{request, L7Lab, Reply, WAYPOINT_ID};
use ambit_netns_lab::mesh::{metric_sum, SERVICE_HOST, SERVICE_PORT, SERVICE_VIP};
use serde_json::json;

const ISS: &str = "https://idp.example.com";
const CLIENT_ID: &str = "spiffe://cluster.local/ns/default/sa/client";

/// DELETE and the host `denied.example` are denied; a RequestAuthentication writes the
/// `group` claim to `x-jwt-group`; `/retry` retries 500s as often as a route can ask.
fn config(jwks: &str) -> String {
    format!(
        r#"
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {{name: no-delete, namespace: default}}
spec:
  targetRefs: [{{kind: Service, group: "", name: echo}}]
  action: DENY
  rules:
  - to: [{{operation: {{methods: ["DELETE"]}}}}]
  - to: [{{operation: {{hosts: ["denied.example"]}}}}]
---
apiVersion: security.istio.io/v1
kind: RequestAuthentication
metadata: {{name: echo-jwt, namespace: default}}
spec:
  targetRefs: [{{kind: Service, group: "", name: echo}}]
  jwtRules:
  - issuer: {ISS}
    jwks: '{jwks}'
    outputClaimToHeaders: [{{header: x-jwt-group, claim: group}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: echo-retries, namespace: default}}
spec:
  parentRefs: [{{group: "", kind: Service, name: echo, port: {SERVICE_PORT}}}]
  rules:
  - matches: [{{path: {{type: PathPrefix, value: /retry}}}}]
    retry: {{codes: [500], attempts: 4294967295, backoff: 1ms}}
    backendRefs: [{{name: echo, port: {SERVICE_PORT}}}]
  - backendRefs: [{{name: echo, port: {SERVICE_PORT}}}]
"#
    )
}

fn launch(tag: &str, env: &[(&str, String)]) -> (L7Lab, Issuer) {
    let idp = Issuer::new(ISS, "k1").unwrap();
    let lab = L7Lab::launch_with_env(
        tag,
        Path::new(env!("CARGO_BIN_EXE_ambit")),
        &config(&idp.jwks()),
        env,
    )
    .unwrap();
    (lab, idp)
}

/// A raw connection from the client node to `echo`'s VIP, as an app makes it.
fn raw(lab: &L7Lab) -> TcpStream {
    let s = lab
        .nodes
        .connect_from_client(SocketAddr::from((SERVICE_VIP, SERVICE_PORT)))
        .unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s
}

/// Sends `bytes` and reads until the waypoint closes (send `Connection: close` for an
/// answer that would keep the connection).
fn exchange(lab: &L7Lab, bytes: &str) -> String {
    let mut s = raw(lab);
    let _ = s.write_all(bytes.as_bytes());
    let mut back = Vec::new();
    let _ = s.read_to_end(&mut back);
    String::from_utf8_lossy(&back).into_owned()
}

/// Reads a response head byte by byte (nothing after it is consumed).
fn read_head(s: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match s.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => break,
        }
    }
    String::from_utf8_lossy(&head).into_owned()
}

fn status_line(answer: &str) -> &str {
    answer.lines().next().unwrap_or("")
}

fn header<'r>(r: &'r Reply, name: &str) -> Option<&'r str> {
    r.headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// A counter without labels.
fn counter(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

/// `Upgrade: h2c` is served as plain HTTP/1.1 (its headers dropped, as Envoy does) and
/// never joins the client to the backend: the HTTP/2 requests that followed the backend's
/// 101 reached it with no policy, route or metric. Other upgrades are allowed by name only,
/// and an allowed one still passes every check first.
#[test]
fn upgrades_are_allowed_by_name_and_h2c_never_joins() {
    let (lab, _) = launch("wp-audit-up", &[]);
    let mut s = raw(&lab);
    s.write_all(
        format!(
            "GET /h2c HTTP/1.1\r\nHost: {SERVICE_HOST}\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n"
        )
        .as_bytes(),
    )
    .unwrap();
    let head = read_head(&mut s);
    if status_line(&head).starts_with("HTTP/1.1 101") {
        // What the audit did: HTTP/2 on the joined connection, a DELETE policy denies.
        s.set_nonblocking(true).unwrap();
        let _guard = lab.rt.enter();
        let stream = tokio::net::TcpStream::from_std(s.try_clone().unwrap()).unwrap();
        let sent = lab.rt.block_on(async move {
            use hyper_util::rt::{TokioExecutor, TokioIo};
            let (mut sender, conn) =
                hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                    .await?;
            tokio::spawn(conn);
            let resp = sender
                .send_request(request("DELETE", "/h2c-smuggled")?)
                .await?;
            anyhow::Ok(resp.status().as_u16())
        });
        panic!(
            "the waypoint joined an h2c upgrade; a DELETE sent on it got {sent:?}; the app saw {:?}",
            lab.app.seen_with("/h2c-smuggled")
        );
    }
    assert!(
        status_line(&head).starts_with("HTTP/1.1 200"),
        "{head:?}\n{}",
        lab.waypoint_log()
    );
    let seen = lab.app.seen_with(" /h2c");
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(
        !seen[0].contains("upgrade=h2c"),
        "the app was asked to upgrade: {seen:?}"
    );
    drop(s);

    // An upgrade that is not allowed: 403, as Envoy answers one its route does not allow.
    let answer = exchange(
        &lab,
        &format!("GET /echo-upgrade HTTP/1.1\r\nHost: {SERVICE_HOST}\r\nConnection: upgrade\r\nUpgrade: echo\r\n\r\n"),
    );
    assert!(
        status_line(&answer).starts_with("HTTP/1.1 403"),
        "{answer:?}"
    );
    assert!(lab.app.seen_with("/echo-upgrade").is_empty());

    // An allowed upgrade is still a request: policy denies a DELETE before any join.
    let answer = exchange(
        &lab,
        &format!("DELETE /ws-denied HTTP/1.1\r\nHost: {SERVICE_HOST}\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n"),
    );
    assert!(
        status_line(&answer).starts_with("HTTP/1.1 403"),
        "{answer:?}"
    );
    assert!(answer.contains("RBAC: access denied"), "{answer:?}");
    assert!(lab.app.seen_with("/ws-denied").is_empty());
}

/// What reaches policy and the backend is one request: the authority of an absolute-form
/// target (written into `Host`), one `Host` only, no client `x-forwarded-client-cert`, no
/// client claim header even on a CORS preflight, the waypoint's own `x-request-id`
/// whatever `Connection` names; malformed chunked framing is the client's 400; a fronted
/// Service is served on its own ports; an HBONE connection carries at most 100 streams.
#[test]
fn one_request_reaches_policy_and_backend() {
    let (lab, _) = launch("wp-audit-head", &[]);

    // Absolute form with another Host: authorised and forwarded on the target's authority.
    let answer = exchange(
        &lab,
        &format!("GET http://{SERVICE_HOST}/absolute HTTP/1.1\r\nHost: denied.example\r\nConnection: close\r\n\r\n"),
    );
    assert!(
        status_line(&answer).starts_with("HTTP/1.1 200"),
        "{answer:?}"
    );
    let seen = lab.app.seen_with("/absolute");
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(
        seen[0].ends_with(&format!(" GET /absolute host={SERVICE_HOST}")),
        "the app saw another Host than policy: {seen:?}"
    );
    // The same Host in origin form is what policy denies.
    let answer = exchange(
        &lab,
        "GET /origin HTTP/1.1\r\nHost: denied.example\r\nConnection: close\r\n\r\n",
    );
    assert!(
        status_line(&answer).starts_with("HTTP/1.1 403"),
        "{answer:?}"
    );

    // Two Host headers: 400 (RFC 9112 §3.2), nothing forwarded.
    let answer = exchange(
        &lab,
        &format!("GET /two-hosts HTTP/1.1\r\nHost: {SERVICE_HOST}\r\nHost: denied.example\r\n\r\n"),
    );
    assert!(
        status_line(&answer).starts_with("HTTP/1.1 400"),
        "{answer:?}"
    );
    assert!(lab.app.seen_with("/two-hosts").is_empty());

    // A forged XFCC never reaches the app.
    let mut req = request("GET", "/xfcc").unwrap();
    req.headers_mut().insert(
        "x-forwarded-client-cert",
        "By=spiffe://cluster.local/ns/default/sa/echo;URI=spiffe://cluster.local/ns/kube-system/sa/admin"
            .parse()
            .unwrap(),
    );
    let r = lab.send_http1(vec![req]).unwrap().remove(0);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(header(&r, "echo-x-forwarded-client-cert"), None, "{r:?}");

    // A CORS preflight passes without a token check, its forged claim header removed.
    let mut req = request("OPTIONS", "/cors").unwrap();
    for (k, v) in [
        ("origin", "https://app.example"),
        ("access-control-request-method", "GET"),
        ("x-jwt-group", "admins"),
    ] {
        req.headers_mut().insert(k, v.parse().unwrap());
    }
    let r = lab.send_http1(vec![req]).unwrap().remove(0);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(header(&r, "echo-x-jwt-group"), None, "{r:?}");

    // `Connection` naming x-request-id strips the client's, never the waypoint's.
    let answer = exchange(
        &lab,
        &format!("GET /rid HTTP/1.1\r\nHost: {SERVICE_HOST}\r\nConnection: close, x-request-id\r\nX-Request-Id: mine\r\n\r\n"),
    );
    assert!(
        status_line(&answer).starts_with("HTTP/1.1 200"),
        "{answer:?}"
    );
    let id = answer.trim_end().rsplit(' ').next().unwrap_or_default();
    assert_eq!(id.len(), 36, "the app got no request id: {answer:?}");
    assert_ne!(id, "mine");

    // Malformed chunked framing: the client's error.
    let answer = exchange(
        &lab,
        &format!("POST /chunked HTTP/1.1\r\nHost: {SERVICE_HOST}\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n"),
    );
    assert!(
        status_line(&answer).starts_with("HTTP/1.1 400"),
        "{answer:?}\n{}",
        lab.waypoint_log()
    );

    // A port the Service does not have is refused at the CONNECT and counted.
    let refused_before = counter(
        &lab.waypoint_metrics().unwrap(),
        "ambit_waypoint_refused_authorities_total",
    );
    let status = lab
        .hbone_connect(CLIENT_ID, &format!("{SERVICE_VIP}:81"))
        .unwrap();
    assert_eq!(status, 400);
    assert_eq!(
        counter(
            &lab.waypoint_metrics().unwrap(),
            "ambit_waypoint_refused_authorities_total"
        ),
        refused_before + 1
    );
    assert_eq!(
        lab.hbone_connect(CLIENT_ID, &format!("{SERVICE_VIP}:{SERVICE_PORT}"))
            .unwrap(),
        200
    );

    // Envoy's waypoint allows 100 streams per HBONE connection; so does this one.
    assert_eq!(
        lab.hbone_max_streams(CLIENT_ID, &format!("{SERVICE_VIP}:{SERVICE_PORT}"))
            .unwrap(),
        100
    );
}

/// A route asking for 4294967295 retries gets ten, and a destination's retries in flight
/// stay within its budget (20 % of its requests in flight, at least 3); both refusals are
/// counted.
#[test]
fn retries_have_a_ceiling_and_a_budget() {
    let (lab, _) = launch("wp-audit-retry", &[]);
    let answer = exchange(
        &lab,
        &format!(
            "GET /retry/status/500 HTTP/1.1\r\nHost: {SERVICE_HOST}\r\nConnection: close\r\n\r\n"
        ),
    );
    assert!(
        status_line(&answer).starts_with("HTTP/1.1 500"),
        "{answer:?}"
    );
    assert_eq!(
        lab.app.seen_with(" /retry/status/500 ").len(),
        1 + ambit_gateway_routes::MAX_RETRY_ATTEMPTS as usize
    );
    let metrics = lab.waypoint_metrics().unwrap();
    assert_eq!(
        counter(&metrics, "ambit_waypoint_upstream_retries_total"),
        u64::from(ambit_gateway_routes::MAX_RETRY_ATTEMPTS)
    );
    let refused = |m: &str, reason| {
        metric_sum(
            m,
            "ambit_waypoint_upstream_retries_refused_total",
            &[("reason", reason)],
        )
    };
    assert_eq!(refused(&metrics, "limit"), 1, "{metrics}");
    assert_eq!(refused(&metrics, "budget"), 0, "{metrics}");
    let status = lab.waypoint_config_dump().unwrap()["waypointRoutes"].to_string();
    assert!(
        status.contains("retry.attempts: 4294967295 capped at 10 retries"),
        "{status}"
    );

    // Ten requests at once, each failing slowly: three retries in flight at most (the
    // floor; ten requests in flight give two), the others refused by the budget.
    let replies = lab
        .h2("GET", "/retry/budget/delay/200/status/500", 10)
        .unwrap();
    assert!(replies.iter().all(|r| r.status == 500), "{replies:?}");
    let after = lab.waypoint_metrics().unwrap();
    let retried = counter(&after, "ambit_waypoint_upstream_retries_total")
        - u64::from(ambit_gateway_routes::MAX_RETRY_ATTEMPTS);
    assert!(refused(&after, "budget") >= 1, "{after}");
    assert_eq!(
        lab.app.seen_with("/retry/budget/").len() as u64,
        10 + retried,
        "every try the app saw is a request or a retry granted"
    );
}

/// The opt-ins: `AMBIT_XFCC_INCLUDE_CLIENT_IDENTITY` replaces a client's XFCC with the
/// caller's verified identity, as Istio's `ambient.istio.io/xfcc-include-client-identity`;
/// `AMBIT_UPGRADE_TYPES` allows another upgrade by name. A valid token's claim is written.
#[test]
fn xfcc_and_upgrade_types_when_configured() {
    let (lab, idp) = launch(
        "wp-audit-opt",
        &[
            ("AMBIT_XFCC_INCLUDE_CLIENT_IDENTITY", "true".into()),
            ("AMBIT_UPGRADE_TYPES", "websocket, echo".into()),
        ],
    );
    let token = idp.token(&json!({"sub": "alice", "exp": now() + 600, "group": "users"}));
    let mut req = request("GET", "/xfcc").unwrap();
    for (k, v) in [
        (
            "x-forwarded-client-cert",
            "By=spiffe://cluster.local/ns/default/sa/echo;URI=spiffe://cluster.local/ns/kube-system/sa/admin".to_string(),
        ),
        ("x-jwt-group", "admins".into()),
        ("authorization", format!("Bearer {token}")),
    ] {
        req.headers_mut().insert(k, v.parse().unwrap());
    }
    let r = lab.send_http1(vec![req]).unwrap().remove(0);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(
        header(&r, "echo-x-forwarded-client-cert"),
        Some(format!("By={WAYPOINT_ID};URI={CLIENT_ID}").as_str()),
        "{r:?}"
    );
    assert_eq!(header(&r, "echo-x-jwt-group"), Some("users"), "{r:?}");

    let mut s = raw(&lab);
    s.write_all(
        format!("GET /echo-upgrade HTTP/1.1\r\nHost: {SERVICE_HOST}\r\nConnection: upgrade\r\nUpgrade: echo\r\n\r\n")
            .as_bytes(),
    )
    .unwrap();
    let head = read_head(&mut s);
    assert!(status_line(&head).starts_with("HTTP/1.1 101"), "{head:?}");
    let mut hello = [0u8; 64];
    let n = s.read(&mut hello).unwrap();
    assert!(
        String::from_utf8_lossy(&hello[..n]).ends_with(" upgraded\n"),
        "{:?}",
        String::from_utf8_lossy(&hello[..n])
    );
}
