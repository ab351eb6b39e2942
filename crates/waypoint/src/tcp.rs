//! Opaque tunnels: a declared-TCP port (never sniffed, so server-first protocols work) or
//! undeclared bytes that are not HTTP. L4 policy only; one endpoint per tunnel; bytes
//! copied both ways and counted as `istio_tcp_*`.

use std::sync::Arc;

use ambit_hbone::server::IncomingConnect;
use ambit_runtime::drain::DrainWatcher;
use tokio::io::{AsyncRead, AsyncWrite};

use crate::authz::{self, Verdict};
use crate::balance::choose;
use crate::downstream::{destination_labels, Downstream};
use crate::metrics::TrafficLabels;
use crate::upstream::Onward;
use crate::Waypoint;

/// A declared-TCP tunnel: authorized, connected onward, and only then answered 200 (a
/// refusal or a failed connect is the CONNECT's status, as ztunnel does).
pub async fn carry(
    wp: Arc<Waypoint>,
    down: Arc<Downstream>,
    incoming: IncomingConnect,
    drain: DrainWatcher,
) {
    let Some((onward, labels)) = connect(&wp, &down).await else {
        return incoming.reject(http::StatusCode::SERVICE_UNAVAILABLE);
    };
    let Ok(stream) = incoming.accept(http::HeaderMap::new()) else {
        return;
    };
    relay(&wp, labels, stream, onward, drain).await;
}

/// Undeclared bytes that are not HTTP, on a tunnel already answered 200.
pub async fn carry_accepted<IO>(
    wp: Arc<Waypoint>,
    down: Arc<Downstream>,
    io: IO,
    drain: DrainWatcher,
) where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    if let Some((onward, labels)) = connect(&wp, &down).await {
        relay(&wp, labels, io, onward, drain).await;
    }
}

async fn connect(wp: &Arc<Waypoint>, down: &Arc<Downstream>) -> Option<(Onward, TrafficLabels)> {
    let state = wp.state.get();
    let mut labels = down.tcp_labels();
    if let Verdict::Deny { details } = authz::authorize_connection(wp, down) {
        tracing::info!(source = %down.peer_ip, fronted = %down.fronted.describe(), details = %details, "opaque tunnel denied");
        return None;
    }
    let mut tried = Vec::with_capacity(crate::http::CONNECT_ATTEMPTS);
    for _ in 0..crate::http::CONNECT_ATTEMPTS {
        let choice = match choose(wp, &state, &down.fronted, &tried) {
            Ok(c) => c,
            Err(e) => {
                tracing::info!(fronted = %down.fronted.describe(), "opaque tunnel: {e}");
                return None;
            }
        };
        destination_labels(
            &mut labels,
            down.fronted.service().map(|s| &**s),
            &down.fronted,
            choice.workload.as_deref(),
        );
        match wp.upstream().open(&choice.endpoint).await {
            Ok(onward) => return Some((onward, labels.clone())),
            Err(e) => {
                tracing::debug!(endpoint = %choice.endpoint.target, "opaque tunnel: {e}");
                tried.push(choice.endpoint.target);
            }
        }
    }
    None
}

async fn relay<IO>(
    wp: &Arc<Waypoint>,
    labels: TrafficLabels,
    mut downstream: IO,
    mut onward: Onward,
    drain: DrainWatcher,
) where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    wp.metrics.tcp_opened(&labels);
    let copied = tokio::select! {
        r = tokio::io::copy_bidirectional(&mut downstream, &mut onward) => r,
        _ = drain.forced() => Ok((0, 0)),
    };
    let (received, sent) = copied.unwrap_or((0, 0));
    wp.metrics.tcp_closed(&labels, received, sent);
}
