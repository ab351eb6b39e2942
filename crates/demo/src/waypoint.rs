//! The demo's waypoint: HTTP to the `reviews` service goes through `ambit waypoint` (this
//! same binary, started by the lab as a pod of node2; its mesh, certificate and policy
//! from `ambit control`). It shows an L7 AuthorizationPolicy (a GET allowed, a DELETE and
//! another client refused 403), one HTTP/2 connection's requests balanced one by one over
//! the service's endpoints on both nodes, the waypoint's identity at the destinations, and
//! the waypoint's own `reporter="waypoint"` counts. Each is checked; a miss stops the demo.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use anyhow::bail;

use ambit_netns_lab::cluster::waypoint::WaypointPod;
use ambit_netns_lab::cluster::Cluster;
use ambit_netns_lab::l7::Reply;
use ambit_netns_lab::mesh::metric_sum;

pub(crate) const REVIEWS_HOST: &str = "reviews.default.svc.cluster.local";
pub(crate) const REVIEWS_VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 20);
pub(crate) const REVIEWS_PORT: u16 = 80;
/// The HTTP app of `reviews`' endpoints (neighbour on node1, server on node2).
pub(crate) const REVIEWS_APP_PORT: u16 = 9080;
/// The waypoint pod: an extra address of node2's link, where `ambit waypoint` listens on
/// 15008 (in shared mode the node proxy serves 15008 only inside pods).
pub(crate) const WAYPOINT_IP: Ipv4Addr = Ipv4Addr::new(10, 78, 0, 3);
pub(crate) const WAYPOINT_ID: &str = "spiffe://cluster.local/ns/default/sa/waypoint";
/// The waypoint's policy (a file of ambit control's mesh directory): on `reviews`, only
/// the client, and only GET.
pub(crate) const REVIEWS_POLICY_FILE: &str = "reviews-policy.yaml";
pub(crate) const REVIEWS_POLICY: &str = r#"apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: reviews-read-only, namespace: default}
spec:
  targetRefs: [{kind: Service, group: "", name: reviews}]
  action: ALLOW
  rules:
  - from: [{source: {principals: ["cluster.local/ns/default/sa/client"]}}]
    to: [{operation: {methods: ["GET"]}}]
"#;
/// `reviews-v1` (neighbour) and `reviews-v2` (server): the versions the route splits
/// `reviews` between.
pub(crate) const V1_HOST: &str = "reviews-v1.default.svc.cluster.local";
pub(crate) const V2_HOST: &str = "reviews-v2.default.svc.cluster.local";
/// The route on `reviews`, served by ambit control once the policy has been shown: a
/// header picks v2; everything else is split 90/10.
pub(crate) const REVIEWS_ROUTE_FILE: &str = "reviews-route.yaml";
pub(crate) const REVIEWS_ROUTE: &str = r#"apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: reviews-canary, namespace: default}
spec:
  parentRefs: [{group: "", kind: Service, name: reviews, port: 80}]
  rules:
  - matches: [{headers: [{name: x-version, value: v2}]}]
    backendRefs: [{name: reviews-v2, port: 80}]
  - backendRefs: [{name: reviews-v1, port: 80, weight: 90}, {name: reviews-v2, port: 80, weight: 10}]
"#;
/// The RequestAuthentication on `reviews`, served by ambit control: tokens of the demo's
/// own issuer, its key made when the demo starts.
pub(crate) const REVIEWS_JWT_FILE: &str = "reviews-jwt.yaml";
const DEMO_ISSUER: &str = "https://idp.demo.ambit";
/// How the split is checked: requests sent and the v2 answers accepted.
const SPLIT: ambit_netns_lab::stats::ShareCheck = ambit_netns_lab::stats::TEN_PERCENT;
/// How many requests the client sends on its one HTTP/2 connection.
const H2_REQUESTS: usize = 20;
const PATH: &str = "/reviews/1";

/// What went through the waypoint, and what was counted of it.
pub(crate) struct Seen {
    get: Reply,
    delete: Reply,
    intruder: Reply,
    /// The HTTP/2 connection's requests answered by neighbour (node1) and server (node2).
    spread: (usize, usize),
    /// Connections from the waypoint's identity counted by node1's proxy (to neighbour)
    /// and node2's (to server).
    at_destinations: (u64, u64),
    /// The waypoint's `istio_requests_total`: 200s to neighbour and to server, and 403s.
    counted: (u64, u64, u64),
}

/// The app's answer names its pod first.
fn pod(reply: &Reply) -> Option<&str> {
    reply
        .body
        .split(' ')
        .next()
        .filter(|p| *p == "neighbour" || *p == "server")
}

/// Sends the demo's requests through the waypoint and reads what was counted.
pub(crate) fn through(cluster: &Cluster, waypoint: &WaypointPod) -> anyhow::Result<Seen> {
    let vip = SocketAddr::from((REVIEWS_VIP, REVIEWS_PORT));
    let mut replies = cluster.http1_from(
        "client",
        vip,
        REVIEWS_HOST,
        &[("GET", PATH), ("DELETE", PATH)],
    )?;
    let (get, delete) = match (replies.pop(), replies.pop()) {
        (Some(delete), Some(get)) => (get, delete),
        _ => bail!("client -> {REVIEWS_HOST}: two requests sent, not two answers"),
    };
    if get.status != 200 || pod(&get).is_none() {
        bail!("client GET {PATH} through the waypoint: expected 200 from an app, got {get:?}");
    }
    if delete.status != 403 {
        bail!("client DELETE {PATH}: expected 403 from the waypoint's policy, got {delete:?}");
    }
    let intruder = cluster
        .http1_from("intruder", vip, REVIEWS_HOST, &[("GET", PATH)])?
        .pop();
    let intruder = match intruder {
        Some(r) if r.status == 403 => r,
        other => {
            bail!("intruder GET {PATH}: expected 403 from the waypoint's policy, got {other:?}")
        }
    };

    let replies = cluster.h2_from("client", vip, REVIEWS_HOST, ("GET", PATH), H2_REQUESTS)?;
    let on = |name: &str| replies.iter().filter(|r| pod(r) == Some(name)).count();
    let spread = (on("neighbour"), on("server"));
    if spread.0 + spread.1 != H2_REQUESTS || replies.iter().any(|r| r.status != 200) {
        bail!("{H2_REQUESTS} GETs on one HTTP/2 connection: not all answered 200 by an app: {replies:?}");
    }
    if spread.0 == 0 || spread.1 == 0 {
        bail!("{H2_REQUESTS} GETs on one HTTP/2 connection all went to one endpoint: {spread:?}");
    }

    let from_waypoint = |node: usize, workload: &str| -> anyhow::Result<u64> {
        Ok(metric_sum(
            &cluster.metrics(node)?,
            "istio_tcp_connections_opened_total",
            &[
                ("reporter", "destination"),
                ("source_principal", WAYPOINT_ID),
                ("destination_workload", workload),
            ],
        ))
    };
    let at_destinations = (from_waypoint(0, "neighbour")?, from_waypoint(1, "server")?);
    if at_destinations.0 == 0 || at_destinations.1 == 0 {
        bail!("the destinations' node proxies did not see the waypoint's identity: {at_destinations:?}");
    }

    // The waypoint counts a request when its response ends: allow it a moment.
    let mut text = String::new();
    let count = |text: &str, code: &str, workload: Option<&str>| {
        let mut labels = vec![("reporter", "waypoint"), ("response_code", code)];
        labels.extend(workload.map(|w| ("destination_workload", w)));
        metric_sum(text, "istio_requests_total", &labels)
    };
    let counted = ambit_netns_lab::wait_until(
        "the waypoint to count every request",
        Duration::from_secs(10),
        || {
            text = cluster.waypoint_metrics(waypoint).unwrap_or_default();
            count(&text, "200", None) == 1 + H2_REQUESTS as u64 && count(&text, "403", None) == 2
        },
    );
    if counted.is_err() {
        bail!(
            "the waypoint did not count 200 x{} and 403 x2:\n{text}",
            1 + H2_REQUESTS
        );
    }
    Ok(Seen {
        get,
        delete,
        intruder,
        spread,
        at_destinations,
        counted: (
            count(&text, "200", Some("neighbour")),
            count(&text, "200", Some("server")),
            count(&text, "403", None),
        ),
    })
}

/// What the route did.
pub(crate) struct Routed {
    /// Of [`SPLIT`]'s requests, answered by v1 (neighbour) and v2 (server).
    split: (usize, usize),
    /// Requests with `x-version: v2` and who answered them.
    header: Vec<Option<String>>,
}

/// Serves the route through ambit control, waits for the waypoint to apply it, then shows
/// the header route and the 90/10 split.
pub(crate) fn routed(cluster: &Cluster) -> anyhow::Result<Routed> {
    use ambit_netns_lab::cluster::http::request;
    let vip = SocketAddr::from((REVIEWS_VIP, REVIEWS_PORT));
    cluster.serve_manifests(REVIEWS_ROUTE_FILE, REVIEWS_ROUTE)?;
    let with_header = || -> anyhow::Result<Vec<Reply>> {
        let requests = (0..5)
            .map(|_| {
                let mut r = request("GET", REVIEWS_HOST, PATH)?;
                r.headers_mut()
                    .insert("x-version", http::HeaderValue::from_static("v2"));
                Ok(r)
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        cluster.send_http1_from("client", vip, requests)
    };
    // The route reaches the waypoint over xDS: its header rule is in force once every
    // request carrying the header lands on v2.
    let applied = ambit_netns_lab::wait_until(
        "the waypoint to apply the route",
        Duration::from_secs(20),
        || with_header().is_ok_and(|rs| rs.iter().all(|r| pod(r) == Some("server"))),
    );
    if applied.is_err() {
        bail!("the route from ambit control was not applied by the waypoint within 20 s");
    }
    let header = with_header()?
        .iter()
        .map(|r| pod(r).map(str::to_string))
        .collect();
    let n = SPLIT.samples;
    let replies = cluster.h2_from("client", vip, REVIEWS_HOST, ("GET", PATH), n)?;
    let on = |name: &str| replies.iter().filter(|r| pod(r) == Some(name)).count();
    let split = (on("neighbour"), on("server"));
    if split.0 + split.1 != n || replies.iter().any(|r| r.status != 200) {
        bail!("{n} GETs through the route: not all answered 200 by an app: {replies:?}");
    }
    // 2,000 requests, 135..=246 answered by v2 (ambit_netns_lab::stats::TEN_PERCENT): a correct
    // 10 % passes with p = 0.99962; 5 % fails with p = 0.99964, 15 % with p = 0.99970.
    if let Err(e) = SPLIT.check(split.1) {
        bail!("the 90/10 split sent too few or too many to v2: {e}");
    }
    Ok(Routed { split, header })
}

/// What RequestAuthentication did.
pub(crate) struct Authenticated {
    forged: Reply,
    good: Reply,
    none: Reply,
}

/// Serves a RequestAuthentication for `reviews` through ambit control (an inline key set
/// of a key made now), then sends a forged token, a good one and none.
pub(crate) fn authenticated(cluster: &Cluster) -> anyhow::Result<Authenticated> {
    use ambit_netns_lab::cluster::http::request;
    use ambit_netns_lab::jwt::{now, Issuer};
    let issuer = Issuer::new(DEMO_ISSUER, "demo-key")?;
    let doc = format!(
        "apiVersion: security.istio.io/v1\nkind: RequestAuthentication\nmetadata: {{name: reviews-jwt, namespace: default}}\nspec:\n  targetRefs: [{{kind: Service, group: \"\", name: reviews}}]\n  jwtRules:\n  - issuer: {DEMO_ISSUER}\n    jwks: '{}'\n",
        issuer.jwks()
    );
    cluster.serve_manifests(REVIEWS_JWT_FILE, &doc)?;
    let claims = serde_json::json!({"sub": "alice", "exp": now() + 600});
    let (good_token, forged_token) = (issuer.token(&claims), issuer.forged(&claims));
    let vip = SocketAddr::from((REVIEWS_VIP, REVIEWS_PORT));
    let send = |token: Option<&str>| -> anyhow::Result<Reply> {
        let mut r = request("GET", REVIEWS_HOST, PATH)?;
        if let Some(t) = token {
            r.headers_mut().insert(
                "authorization",
                http::HeaderValue::from_str(&format!("Bearer {t}"))?,
            );
        }
        cluster
            .send_http1_from("client", vip, vec![r])?
            .pop()
            .ok_or_else(|| anyhow::anyhow!("no answer"))
    };
    let applied = ambit_netns_lab::wait_until(
        "the waypoint to apply the RequestAuthentication",
        Duration::from_secs(20),
        || send(Some(&forged_token)).is_ok_and(|r| r.status == 401),
    );
    if applied.is_err() {
        bail!("the RequestAuthentication from ambit control was not applied by the waypoint within 20 s");
    }
    let (forged, good, none) = (
        send(Some(&forged_token))?,
        send(Some(&good_token))?,
        send(None)?,
    );
    if forged.status != 401 || good.status != 200 || none.status != 200 {
        bail!(
            "tokens through the waypoint: forged {}, good {}, none {} (expected 401, 200, 200)",
            forged.status,
            good.status,
            none.status
        );
    }
    Ok(Authenticated { forged, good, none })
}

impl Authenticated {
    pub(crate) fn print(&self) {
        let challenge = self
            .forged
            .headers
            .iter()
            .find(|(k, _)| k == "www-authenticate")
            .map_or("", |(_, v)| v.as_str());
        println!(
            "  RequestAuthentication default/reviews-jwt (issuer {DEMO_ISSUER}, from ambit control): forged token -> {} {:?} ({challenge}); good token -> {} (answered by {}); no token -> {} (authorization decides)",
            self.forged.status,
            self.forged.body,
            self.good.status,
            pod(&self.good).unwrap_or("?"),
            self.none.status
        );
    }
}

impl Routed {
    pub(crate) fn print(&self) {
        println!(
            "  HTTPRoute default/reviews-canary (from ambit control, applied live): x-version: v2 -> {:?}; {} GETs on one HTTP/2 connection split {} to v1 (neighbour) / {} to v2 (server), weights 90/10",
            self.header.iter().map(|p| p.as_deref().unwrap_or("?")).collect::<Vec<_>>(),
            SPLIT.samples,
            self.split.0,
            self.split.1
        );
    }
}

impl Seen {
    pub(crate) fn print(&self, waypoint: &WaypointPod) {
        let vip = SocketAddr::from((REVIEWS_VIP, REVIEWS_PORT));
        println!(
            "  waypoint: ambit waypoint at {} (node{}) as {}; mesh, certificate and policy default/reviews-read-only (ALLOW GET from client, on reviews) from ambit control",
            waypoint.hbone_addr(),
            waypoint.node + 1,
            waypoint.identity,
        );
        println!(
            "  client -> {REVIEWS_HOST} ({vip}), HTTP/1.1 via the waypoint: GET {PATH} -> {} (answered by {}), DELETE {PATH} -> {} {:?}",
            self.get.status,
            pod(&self.get).unwrap_or("?"),
            self.delete.status,
            self.delete.body,
        );
        println!(
            "  intruder -> reviews: GET {PATH} -> {} (not the client)",
            self.intruder.status
        );
        println!(
            "  client -> reviews, ONE HTTP/2 connection, {H2_REQUESTS} requests: {} to neighbour (node1), {} to server (node2), each balanced by the waypoint",
            self.spread.0, self.spread.1
        );
        println!(
            "  the destinations saw the waypoint's identity, not the client's: node1 counted {} connection(s) to neighbour from {WAYPOINT_ID}, node2 counted {} to server, over mTLS",
            self.at_destinations.0, self.at_destinations.1
        );
        println!(
            "  waypoint metrics (reporter=\"waypoint\"): istio_requests_total 200: {} (neighbour {}, server {}), 403: {}",
            self.counted.0 + self.counted.1,
            self.counted.0,
            self.counted.1,
            self.counted.2
        );
    }
}
