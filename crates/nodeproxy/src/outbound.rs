//! Outbound: connections captured from the local workload (15001), sent to their
//! destination in HBONE or, for non-mesh destinations, as plain TCP. What to do is
//! decided in [`crate::decide::outbound`]; this carries it out.

use std::net::SocketAddr;
use std::sync::Arc;

use ambit_hbone::headers::{Authority, TraceParent};
use ambit_hbone::request::ConnectRequest;
use ambit_hbone::HboneError;
use tokio::net::TcpStream;

use crate::connections::{Connection, Direction, Protocol};
use crate::copy::{proxy_bytes, proxy_tunnel, TunnelSide};
use crate::decide::outbound::{plan_outbound, HbonePlan, Hop, Outbound};
use crate::error::Error;
use crate::inputs::ProxyInputs;
use crate::metrics::Reporter;
use crate::socket;
use crate::telemetry::{early_failure, ConnectionResult, Endpoints};
use ambit_runtime::drain::DrainWatcher;

pub(crate) async fn handle(
    pi: Arc<ProxyInputs>,
    downstream: TcpStream,
    src: SocketAddr,
    drain: DrainWatcher,
) {
    let src = socket::canonical(src);
    if let Err(e) = socket::tune_stream(&downstream, &pi.cfg.keepalive) {
        tracing::debug!(%src, "could not tune accepted socket: {e}");
    }
    let dst = match socket::original_destination(&downstream) {
        Ok(dst) => dst,
        Err(e) => {
            return early_failure(
                Reporter::Source,
                src,
                None,
                &Error::NoOriginalDestination(e),
            )
        }
    };
    forward(pi, downstream, src, dst, drain).await
}

/// Sends a connection from the local workload to `dst`, as decided for a captured one.
/// SOCKS5 comes here too, with the destination its client asked for.
pub(crate) async fn forward(
    pi: Arc<ProxyInputs>,
    downstream: TcpStream,
    src: SocketAddr,
    dst: SocketAddr,
    drain: DrainWatcher,
) {
    // Unknown only on a socket that already failed; then nothing matches it.
    let listener = downstream
        .local_addr()
        .map(socket::canonical)
        .unwrap_or(SocketAddr::from(([0, 0, 0, 0], 0)));
    // On demand: what the decision would miss is asked for first (fail closed on no answer).
    if let Err(e) = crate::on_demand::prepare_outbound(&pi, dst.ip()).await {
        return early_failure(Reporter::Source, src, Some(dst), &e);
    }
    let state = pi.state.get();
    let input = Outbound {
        cfg: &pi.cfg,
        local: pi.local(),
        src,
        original_dst: dst,
        listener,
    };
    let plan = plan_outbound(&state, &input, &mut rand::thread_rng());
    drop(state);
    let plan = match plan {
        Ok(plan) => plan,
        Err(e) => return early_failure(Reporter::Source, src, Some(dst), &e),
    };
    match plan.hop {
        Hop::Tcp {
            target,
            destination,
            service,
        } => {
            let mut result = ConnectionResult::open(
                &pi.metrics,
                Reporter::Source,
                Endpoints {
                    src_addr: Some(src),
                    src_workload: Some(plan.source),
                    dst_addr: Some(target),
                    dst_identity: destination.as_ref().map(|w| w.identity()),
                    dst_workload: destination,
                    dst_service: service,
                    ..Default::default()
                },
            );
            result.track(
                &pi.connections,
                Direction::Outbound,
                Connection::new(src, Some(dst), target, Protocol::Tcp),
            );
            let upstream = match socket::connect(&*pi.sockets, &pi.cfg, target, None).await {
                Ok(s) => s,
                Err(source) => {
                    return result.finish(Err(Error::UpstreamConnect { target, source }))
                }
            };
            let outcome = proxy_bytes(&result, downstream, upstream, &drain).await;
            result.finish(outcome);
        }
        Hop::Hbone(hbone) => {
            let mut result = ConnectionResult::open(
                &pi.metrics,
                Reporter::Source,
                Endpoints {
                    src_addr: Some(src),
                    src_workload: Some(plan.source),
                    src_identity: Some(hbone.source_identity.clone()),
                    dst_addr: Some(hbone.next_hop),
                    dst_hbone_addr: Some(hbone.authority.to_string()),
                    dst_identity: Some(hbone.destination.identity()),
                    dst_workload: Some(hbone.destination.clone()),
                    dst_service: hbone.service.clone(),
                    mtls: true,
                },
            );
            result.track(
                &pi.connections,
                Direction::Outbound,
                Connection::new(src, Some(dst), hbone.next_hop, Protocol::Hbone),
            );
            let outcome = tunnel(&pi, *hbone, &result, downstream, &drain).await;
            result.finish(outcome);
        }
    }
}

/// Opens (or joins) the pooled HBONE connection, sends the CONNECT and relays.
async fn tunnel(
    pi: &Arc<ProxyInputs>,
    plan: HbonePlan,
    result: &ConnectionResult,
    downstream: TcpStream,
    drain: &DrainWatcher,
) -> Result<(), Error> {
    let request = ConnectRequest {
        authority: Authority::Addr(plan.authority),
        baggage: Some(plan.baggage),
        forwarded: Some(plan.forwarded),
        traceparent: Some(TraceParent::random()),
    };
    let connector = {
        let pi = pi.clone();
        let (identity, expected, next_hop) = (
            plan.source_identity,
            plan.expected_identities,
            plan.next_hop,
        );
        move || async move {
            // Cached per (identity, expected peers): no config is built per dial.
            let tls = pi
                .certs
                .client_config(&identity, &expected)
                .await
                .map_err(|e| {
                    HboneError::Tls(Arc::new(std::io::Error::other(format!(
                        "no client TLS for {identity}: {e}"
                    ))))
                })?;
            let tcp = socket::connect(&*pi.sockets, &pi.cfg, next_hop, None).await?;
            let tcp = ambit_hbone::ReadAhead::new(tcp);
            ambit_hbone::tls::connect(tcp, tls).await
        }
    };
    let mut tunnel = pi.pool.connect(plan.pool_key, connector, &request).await?;
    proxy_tunnel(result, &mut tunnel, downstream, TunnelSide::Server, drain).await
}
