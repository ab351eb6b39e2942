//! Outbound: connections captured from the local workload (15001), sent to their
//! destination in HBONE or, for non-mesh destinations, as plain TCP.

use std::net::SocketAddr;
use std::sync::Arc;

use ambit_hbone::headers::{forwarded_value, Authority, Baggage, TraceParent};
use ambit_hbone::pool::PoolKey;
use ambit_hbone::request::ConnectRequest;
use ambit_hbone::HboneError;
use ambit_state::{route, Route, RouteInput, Workload};
use tokio::net::TcpStream;

use crate::connections::{Connection, Direction, Protocol};
use crate::copy::{proxy_bytes, proxy_tunnel, TunnelSide};
use crate::drain::DrainWatcher;
use crate::inputs::ProxyInputs;
use crate::metrics::Reporter;
use crate::socket;
use crate::telemetry::{early_failure, ConnectionResult, Endpoints, ResponseFlag};

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
                format!("no original destination: {e}"),
            )
        }
    };
    if is_loop(&pi, &downstream, dst) {
        return early_failure(
            Reporter::Source,
            src,
            Some(dst),
            format!("refusing connection to the proxy's own port {}", dst.port()),
        );
    }
    let state = pi.state.get();
    let local = match pi.require_local_workload(&state) {
        Ok(w) => w,
        Err(e) => return early_failure(Reporter::Source, src, Some(dst), e),
    };
    let input = RouteInput {
        source: &local,
        dst,
        network: &pi.cfg.network,
        hbone_port: pi.cfg.ports.remote_hbone,
    };
    let decision = route(&state, &input, &mut rand::thread_rng());
    drop(state);
    match decision {
        Err(e) => early_failure(Reporter::Source, src, Some(dst), e.to_string()),
        Ok(Route::Tcp {
            target,
            destination,
            service,
        }) => {
            let mut result = ConnectionResult::open(
                &pi.metrics,
                Reporter::Source,
                Endpoints {
                    src_addr: Some(src),
                    src_workload: Some(local),
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
                Err(e) => {
                    return result.finish(Err((
                        ResponseFlag::Connect,
                        format!("connect to {target}: {e}"),
                    )))
                }
            };
            let outcome = proxy_bytes(&result, downstream, upstream, &drain).await;
            result.finish(outcome);
        }
        Ok(Route::Hbone {
            next_hop,
            authority,
            expected_identities,
            destination,
            service,
        }) => {
            let src_identity = local.identity();
            let mut result = ConnectionResult::open(
                &pi.metrics,
                Reporter::Source,
                Endpoints {
                    src_addr: Some(src),
                    src_workload: Some(local.clone()),
                    src_identity: Some(src_identity.clone()),
                    dst_addr: Some(next_hop),
                    dst_hbone_addr: Some(authority.to_string()),
                    dst_identity: Some(destination.identity()),
                    dst_workload: Some(destination),
                    dst_service: service.clone(),
                    mtls: true,
                },
            );
            result.track(
                &pi.connections,
                Direction::Outbound,
                Connection::new(src, Some(dst), next_hop, Protocol::Hbone),
            );
            let request = ConnectRequest {
                authority: Authority::Addr(authority),
                baggage: Some(baggage_of(&local)),
                forwarded: Some(forwarded_value(
                    src,
                    service.as_ref().map(|s| s.hostname.as_str()),
                )),
                traceparent: Some(TraceParent::random()),
            };
            let key = PoolKey {
                src_identity: src_identity.to_string(),
                dst_identities: expected_identities.iter().map(|i| i.to_string()).collect(),
                dst: next_hop,
                src_ip: src.ip(),
            };
            let connector = {
                let pi = pi.clone();
                move || async move {
                    let tls_error =
                        |msg: String| HboneError::Tls(Arc::new(std::io::Error::other(msg)));
                    // Cached per (identity, expected peers): no config is built per dial.
                    let tls = pi
                        .certs
                        .client_config(&src_identity, &expected_identities)
                        .map_err(|e| tls_error(format!("no client TLS for {src_identity}: {e}")))?;
                    let tcp = socket::connect(&*pi.sockets, &pi.cfg, next_hop, None).await?;
                    let tcp = ambit_hbone::ReadAhead::new(tcp);
                    ambit_hbone::tls::connect(tcp, tls).await
                }
            };
            let mut tunnel = match pi.pool.connect(key, connector, &request).await {
                Ok(t) => t,
                Err(e) => return result.finish(Err((flag_of(&e), e.to_string()))),
            };
            let outcome =
                proxy_tunnel(&result, &mut tunnel, downstream, TunnelSide::Server, &drain).await;
            result.finish(outcome);
        }
    }
}

fn flag_of(e: &HboneError) -> ResponseFlag {
    match e {
        HboneError::Tls(_) | HboneError::Alpn(_) | HboneError::HandshakeTimeout(_) => {
            ResponseFlag::TlsFailure
        }
        HboneError::ConnectTimeout(_) => ResponseFlag::NetworkPolicy,
        HboneError::Status(_) | HboneError::Connect(_) => ResponseFlag::Connect,
        _ => ResponseFlag::H2HandshakeFailure,
    }
}

/// Source workload metadata for the CONNECT `baggage` header.
pub(crate) fn baggage_of(w: &Workload) -> Baggage {
    let some = |s: &str| (!s.is_empty()).then(|| s.to_string());
    Baggage {
        cluster_id: some(&w.cluster_id),
        namespace: some(&w.namespace),
        workload_type: some(w.workload_type_or_default()),
        workload_name: some(crate::telemetry::workload_name(w)),
        service_name: some(&w.canonical_name),
        service_version: some(&w.canonical_revision),
        region: some(&w.locality.region),
        zone: some(&w.locality.zone),
    }
}

/// A captured connection aimed at one of our own listeners would loop forever.
fn is_loop(pi: &ProxyInputs, downstream: &TcpStream, dst: SocketAddr) -> bool {
    if !pi.cfg.loop_ports().contains(&dst.port()) {
        return false;
    }
    let local = downstream.local_addr().map(socket::canonical).ok();
    dst.ip().is_loopback() || Some(dst) == local
}
