//! RequestAuthentication at `ambit waypoint` end to end, as root: the L7 lab, tokens
//! signed in the test by an Ed25519 issuer (`ambit_netns_lab::jwt`), real HTTP/1.1 clients in
//! the client node. Key sets inline and fetched from a `jwksUri` served in the server
//! node; a missing token passes to authorization, where `requestPrincipals` and
//! `request.auth.claims` decide. (Each algorithm, and the fetcher against servers that are
//! down, slow, or serve garbage or too much, are the JWT crate's own tests.)

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use ambit_netns_lab::jwt::{now, Issuer};
use ambit_netns_lab::l7::{request, L7Lab, Reply};
use ambit_netns_lab::mesh::metric_sum;
use serde_json::json;

const ISS: &str = "https://idp.example.com";
/// Where the test's JWKS server listens in the server node (the waypoint's node).
const JWKS_IP: Ipv4Addr = Ipv4Addr::new(10, 78, 0, 9);
const JWKS_PORT: u16 = 8089;

fn config(jwks: &str, remote_uri: &str) -> String {
    format!(
        r#"
apiVersion: security.istio.io/v1
kind: RequestAuthentication
metadata: {{name: echo-jwt, namespace: default}}
spec:
  targetRefs: [{{kind: Service, group: "", name: echo}}]
  jwtRules:
  - issuer: {ISS}
    audiences: [echo]
    jwks: '{jwks}'
    outputClaimToHeaders: [{{header: x-jwt-group, claim: group}}]
  - issuer: https://remote.example.com
    jwksUri: {remote_uri}
    fromHeaders: [{{name: x-remote-token}}]
    forwardOriginalToken: true
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {{name: admin-needs-a-token, namespace: default}}
spec:
  targetRefs: [{{kind: Service, group: "", name: echo}}]
  action: DENY
  rules:
  - to: [{{operation: {{paths: ["/admin*"]}}}}]
    from: [{{source: {{notRequestPrincipals: ["*"]}}}}]
  - to: [{{operation: {{paths: ["/admin*"]}}}}]
    when: [{{key: "request.auth.claims[group]", notValues: [admins]}}]
"#
    )
}

fn get(lab: &L7Lab, path: &str, headers: &[(&str, String)]) -> Reply {
    let mut req = request("GET", path).unwrap();
    for (k, v) in headers {
        req.headers_mut().insert(
            http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            v.parse().unwrap(),
        );
    }
    lab.send_http1(vec![req]).unwrap().remove(0)
}

fn bearer(token: &str) -> Vec<(&'static str, String)> {
    vec![("authorization", format!("Bearer {token}"))]
}

fn header<'r>(r: &'r Reply, name: &str) -> Option<&'r str> {
    r.headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// Serves `body` as the JWKS at `http://JWKS_IP:JWKS_PORT/jwks` in the server node.
fn serve_jwks(lab: &L7Lab, body: String) {
    lab.nodes
        .lab
        .exec(
            &lab.nodes.server_ns,
            &[
                "ip",
                "addr",
                "add",
                &format!("{JWKS_IP}/24"),
                "dev",
                ambit_netns_lab::mesh::LINK_DEV,
            ],
        )
        .unwrap();
    let listener = ambit_netns_lab::Lab::in_netns(&lab.nodes.server_ns, || {
        std::net::TcpListener::bind(SocketAddr::from((JWKS_IP, JWKS_PORT)))
    })
    .unwrap();
    listener.set_nonblocking(true).unwrap();
    let _guard = lab.rt.enter();
    let listener = tokio::net::TcpListener::from_std(listener).unwrap();
    lab.rt.spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let body = body.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |_req| {
                    let body = body.clone();
                    async move {
                        Ok::<_, std::convert::Infallible>(http::Response::new(
                            http_body_util::Full::new(bytes::Bytes::from(body)),
                        ))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
}

#[test]
fn tokens_are_validated_and_feed_authorization() {
    let idp = Issuer::new(ISS, "k1").unwrap();
    let remote = Issuer::new("https://remote.example.com", "r1").unwrap();
    let stranger = Issuer::new(ISS, "k1").unwrap();
    let uri = format!("http://{JWKS_IP}:{JWKS_PORT}/jwks");
    // The lab starts without the RequestAuthentication; it is written once the JWKS
    // server is up.
    let lab = L7Lab::launch("wp-jwt", Path::new(env!("CARGO_BIN_EXE_ambit")), "").unwrap();
    serve_jwks(&lab, remote.jwks());
    std::fs::write(&lab.policies, config(&idp.jwks(), &uri)).unwrap();

    let t = now();
    let good =
        idp.token(&json!({"sub": "alice", "aud": "echo", "exp": t + 600, "group": "admins"}));
    ambit_netns_lab::wait_until(
        "the RequestAuthentication to load",
        Duration::from_secs(10),
        || {
            get(&lab, "/admin", &bearer(&good)).status == 200
                && get(&lab, "/admin", &[]).status == 403
        },
    )
    .unwrap();

    // A good token: 200, the token not forwarded, its claim copied to a header.
    let r = get(&lab, "/any", &bearer(&good));
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(header(&r, "echo-x-jwt-group"), Some("admins"));
    assert!(
        !r.headers.iter().any(|(k, _)| k == "echo-authorization"),
        "the token is removed before forwarding"
    );

    // No token: passes authentication; authorization decides (requestPrincipals).
    assert_eq!(get(&lab, "/any", &[]).status, 200);
    let r = get(&lab, "/admin", &[]);
    assert_eq!((r.status, r.body.as_str()), (403, "RBAC: access denied"));
    // A valid token without the claim the policy wants: 403 from authorization.
    let user = idp.token(&json!({"sub": "bob", "aud": "echo", "exp": t + 600, "group": "users"}));
    assert_eq!(get(&lab, "/admin", &bearer(&user)).status, 403);
    assert_eq!(get(&lab, "/any", &bearer(&user)).status, 200);

    // Tokens that are not valid: 401 with Envoy's reason and a challenge; never the app.
    let cases = [
        ("forged", idp.forged(&json!({"sub": "alice", "aud": "echo", "exp": t + 600})), "Jwt verification fails"),
        ("another key", stranger.token(&json!({"sub": "alice", "aud": "echo", "exp": t + 600})), "Jwt verification fails"),
        ("expired", idp.token(&json!({"sub": "alice", "aud": "echo", "exp": t - 3600})), "Jwt is expired"),
        ("not yet valid", idp.token(&json!({"sub": "alice", "aud": "echo", "nbf": t + 3600, "exp": t + 7200})), "Jwt not yet valid"),
        ("wrong issuer", idp.token(&json!({"iss": "https://other.example.com", "sub": "alice", "aud": "echo", "exp": t + 600})), "Jwt issuer is not configured"),
        ("garbage", "not-a-token".to_string(), "Jwt is not in the form of Header.Payload.Signature"),
    ];
    for (what, token, reason) in &cases {
        let r = get(&lab, "/any", &bearer(token));
        assert_eq!(r.status, 401, "{what}: {r:?}");
        assert!(r.body.contains(reason), "{what}: {r:?}");
        assert!(r.pod().is_none(), "{what}: the app answered");
        let challenge = header(&r, "www-authenticate").unwrap_or_default();
        assert!(
            challenge.starts_with("Bearer realm=\"http://")
                && challenge.contains("error=\"invalid_token\""),
            "{what}: {challenge}"
        );
    }
    // The wrong audience is Envoy's 403.
    let r = get(
        &lab,
        "/any",
        &bearer(&idp.token(&json!({"sub": "alice", "aud": "other", "exp": t + 600}))),
    );
    assert_eq!(
        (r.status, r.body.as_str()),
        (403, "Audiences in Jwt are not allowed")
    );

    // A key set fetched from its jwksUri; this rule forwards the token.
    let remote_token = remote.token(&json!({"sub": "carol", "exp": t + 600}));
    let r = get(&lab, "/any", &[("x-remote-token", remote_token.clone())]);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(
        header(&r, "echo-x-remote-token"),
        Some(remote_token.as_str())
    );
    let r = get(
        &lab,
        "/any",
        &[(
            "x-remote-token",
            remote.forged(&json!({"sub": "carol", "exp": t + 600})),
        )],
    );
    assert_eq!(r.status, 401, "{r:?}");

    let metrics = lab.waypoint_metrics().unwrap();
    assert!(
        metric_sum(
            &metrics,
            "istio_requests_total",
            &[("response_code", "401")]
        ) >= cases.len() as u64,
        "{metrics}"
    );
    let dump = lab.waypoint_config_dump().unwrap();
    let authns = &dump["waypointRequestAuthentications"];
    assert_eq!(authns[0]["name"], "echo-jwt", "{authns}");
    assert_eq!(authns[0]["jwtRules"][1]["jwks"], uri.as_str());
}

/// A `jwksUri` that never answers: a token of its issuer is refused (never let through),
/// a request without one still passes to authorization.
#[test]
fn a_key_set_that_cannot_be_fetched_refuses_its_tokens() {
    let remote = Issuer::new("https://remote.example.com", "r1").unwrap();
    // Nothing listens there: the fetch is refused at once.
    let uri = format!("http://{JWKS_IP}:{JWKS_PORT}/jwks");
    let lab = L7Lab::launch("wp-jwt-down", Path::new(env!("CARGO_BIN_EXE_ambit")), "").unwrap();
    std::fs::write(
        &lab.policies,
        config(&Issuer::new(ISS, "k1").unwrap().jwks(), &uri),
    )
    .unwrap();
    let token = remote.token(&json!({"sub": "carol", "exp": now() + 600}));
    ambit_netns_lab::wait_until(
        "the RequestAuthentication to load",
        Duration::from_secs(10),
        || get(&lab, "/any", &[("x-remote-token", token.clone())]).status == 401,
    )
    .unwrap();
    let r = get(&lab, "/any", &[("x-remote-token", token)]);
    assert_eq!(r.status, 401, "{r:?}");
    assert!(r.body.contains("Jwks remote fetch is failed"), "{r:?}");
    assert_eq!(get(&lab, "/any", &[]).status, 200);
}
