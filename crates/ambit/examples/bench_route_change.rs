//! The time from a route change in `ambit control` to the first request the waypoint
//! serves by it: the demo's cluster (two nodes through the CNI chain, `ambit control` on
//! node2 serving xDS and the CA), `ambit waypoint` in front of `reviews`, and an HTTPRoute
//! in the control server's mesh directory whose catch-all rule sets a marker header on
//! responses. Each change writes a new marker (aside, then renamed, as a ConfigMap update
//! or a careful editor does) and times until a request on a kept-alive client connection
//! is answered with it; every answer other than 200 meanwhile is counted.
//!
//! ```text
//! bench_route_change --ambit target/release/ambit --out FILE [--changes 20]
//! ```
//! Needs root (network namespaces). Everything it creates is removed when it ends.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use ambit_netns_lab::cluster::{Cluster, ClusterSpec, PodSpec};
use ambit_netns_lab::peer::NodeProxy;
use ambit_netns_lab::stats::{median, percentile, spread};
use anyhow::Context;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;

const REVIEWS_HOST: &str = "reviews.default.svc.cluster.local";
const REVIEWS_VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 20);
const APP_PORT: u16 = 9080;
const WAYPOINT_IP: Ipv4Addr = Ipv4Addr::new(10, 78, 0, 3);
const ROUTE_FILE: &str = "reviews-route.yaml";

fn mesh() -> String {
    format!(
        r#"- uid: cluster1//v1/Pod/default/waypoint
  name: waypoint
  namespace: default
  serviceAccount: waypoint
  trustDomain: cluster.local
  workloadIps: ["{WAYPOINT_IP}"]
  protocol: HBONE
  node: node2
  canonicalName: waypoint
  workloadName: waypoint
services:
- name: reviews
  namespace: default
  hostname: {REVIEWS_HOST}
  vips: ["/{REVIEWS_VIP}"]
  ports: {{80: {APP_PORT}}}
  waypoint: {{destination: "/{WAYPOINT_IP}", hboneMtlsPort: 15008}}
"#
    )
}

fn route(marker: &str) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: reviews, namespace: default}}\nspec:\n  parentRefs: [{{group: \"\", kind: Service, name: reviews, port: 80}}]\n  rules:\n  - filters: [{{type: ResponseHeaderModifier, responseHeaderModifier: {{set: [{{name: x-routes, value: \"{marker}\"}}]}}}}]\n    backendRefs: [{{name: reviews, port: 80}}]\n"
    )
}

/// One request on the kept-alive connection: its status and marker.
async fn probe(
    sender: &mut hyper::client::conn::http1::SendRequest<Full<Bytes>>,
) -> anyhow::Result<(u16, Option<String>)> {
    sender.ready().await?;
    let req = http::Request::builder()
        .uri("/reviews/1")
        .header("host", REVIEWS_HOST)
        .body(Full::new(Bytes::new()))?;
    let r = sender.send_request(req).await?;
    let status = r.status().as_u16();
    let marker = r
        .headers()
        .get("x-routes")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    r.into_body().collect().await?;
    Ok((status, marker))
}

fn main() -> anyhow::Result<()> {
    let mut ambit = PathBuf::from("target/release/ambit");
    let mut out = PathBuf::from("target/bench-route-change.md");
    let mut changes = 20usize;
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut v = || it.next().with_context(|| format!("{k} needs a value"));
        match k.as_str() {
            "--ambit" => ambit = v()?.into(),
            "--out" => out = v()?.into(),
            "--changes" => changes = v()?.parse()?,
            "-h" | "--help" => {
                println!("bench_route_change --ambit PATH --out FILE [--changes N]");
                return Ok(());
            }
            other => anyhow::bail!("unknown argument {other}"),
        }
    }
    let ambit = std::fs::canonicalize(&ambit).with_context(|| ambit.display().to_string())?;
    let key = format!("default/{REVIEWS_HOST}");
    let pods = [
        PodSpec::new("client", 0),
        PodSpec::new("server", 1).endpoint_of(&key, &[]),
    ];
    let extra = mesh();
    let cluster = Cluster::launch(ClusterSpec {
        ambit: &ambit,
        tag: "bench-rc",
        node_proxies: vec![NodeProxy::Ambit(ambit.clone()); 2],
        pods: &pods,
        create: pods.len(),
        extra_yaml: &extra,
        proxy_env: &[],
        control: Some(&ambit),
    })?;
    ambit_netns_lab::remove_on_signal(cluster.lab.cleanup_handle());
    cluster.serve_http("server", APP_PORT)?;
    cluster.serve_manifests(ROUTE_FILE, &route("start"))?;
    let _waypoint = cluster.start_waypoint(1, "waypoint", WAYPOINT_IP, None)?;
    let mesh_dir = cluster
        .control
        .as_ref()
        .context("the cluster's control server")?
        .mesh_dir
        .clone();
    let stream = cluster.connect_from("client", SocketAddr::from((REVIEWS_VIP, 80)))?;
    stream.set_nonblocking(true)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (took, bad) = rt.block_on(async {
        let stream = tokio::net::TcpStream::from_std(stream)?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(conn);
        // The first route in force before timing starts.
        let deadline = Instant::now() + Duration::from_secs(60);
        while probe(&mut sender).await?.1.as_deref() != Some("start") {
            anyhow::ensure!(
                Instant::now() < deadline,
                "the first route was never applied"
            );
        }
        let (mut took, mut bad) = (Vec::new(), 0u64);
        for k in 0..changes {
            let marker = format!("change-{k}");
            let tmp = mesh_dir.join(format!(".{ROUTE_FILE}.tmp"));
            std::fs::write(&tmp, route(&marker))?;
            let written = Instant::now();
            std::fs::rename(&tmp, mesh_dir.join(ROUTE_FILE))?;
            loop {
                let (status, seen) = probe(&mut sender).await?;
                if status != 200 {
                    bad += 1;
                }
                if status == 200 && seen.as_deref() == Some(marker.as_str()) {
                    took.push(written.elapsed().as_secs_f64() * 1000.0);
                    break;
                }
                anyhow::ensure!(
                    written.elapsed() < Duration::from_secs(60),
                    "change {k} was not applied within 60 s"
                );
            }
            // Changes land at different points of the control server's poll.
            tokio::time::sleep(Duration::from_millis(137 * (k as u64 % 7))).await;
        }
        anyhow::Ok((took, bad))
    })?;
    let text = format!(
        "## Route change through `ambit control` (`bench_route_change`)\n\n{} changes of an HTTPRoute in the control server's mesh directory (written aside and renamed), timed from the rename to the first response carrying the new route's marker on a kept-alive client connection through the waypoint.\n\n| figure | value |\n|---|---:|\n| median / p90 / p99 of {} (nearest rank: of fewer than 100 changes, the p99 is the highest) | {:.0} / {:.0} / {:.0} ms |\n| min | {:.0} ms |\n| responses other than 200 during the changes | {bad} |\n\nEach change, in order (ms): {}\n",
        took.len(),
        took.len(),
        median(&took),
        percentile(&took, 90.0),
        percentile(&took, 99.0),
        spread(&took).0,
        took.iter()
            .map(|t| format!("{t:.0}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!("{text}");
    std::fs::write(&out, &text)?;
    eprintln!("written to {}", out.display());
    Ok(())
}
