//! Inbound HBONE (15008): mutual-TLS-terminated CONNECT streams, decided in
//! [`crate::decide::inbound`], then connected to the local workload and relayed.

use std::sync::{Arc, OnceLock};

use ambit_hbone::server::IncomingConnect;
use ambit_identity::SpiffeId;
use tokio::io::AsyncWriteExt;

use crate::connections::{Connection, Direction, Protocol};
use crate::copy::{proxy_tunnel, TunnelSide};
use crate::decide::inbound::{plan_hbone, HboneRequest};
use crate::decide::outbound::baggage_of;
use crate::error::Error;
use crate::inputs::ProxyInputs;
use crate::metrics::Reporter;
use crate::socket;
use crate::telemetry::{early_failure, ConnectionResult, Endpoints};
use ambit_runtime::drain::DrainWatcher;

/// Relays until done, or until a policy change denies the connection (the relay is
/// dropped, which closes both sides).
pub(crate) async fn until_revoked(
    revoked: Option<crate::connections::Revoked>,
    relay: impl std::future::Future<Output = Result<(), Error>>,
) -> Result<(), Error> {
    let Some(revoked) = revoked else {
        return relay.await;
    };
    tokio::select! {
        outcome = relay => outcome,
        denied = revoked.denied() => {
            tracing::info!(reason = %denied, "closing a connection that a policy change denies");
            Err(Error::Denied(denied))
        }
    }
}

/// Handles one CONNECT stream: 200 only once the upstream connection exists.
pub(crate) async fn handle_connect(
    pi: Arc<ProxyInputs>,
    mut incoming: IncomingConnect,
    drain: DrainWatcher,
    transparent: bool,
    peer_identity: Arc<OnceLock<Option<SpiffeId>>>,
) {
    let peer = incoming.peer().clone();
    let src = socket::canonical(peer.addr);
    // The HBONE listener the connection arrived on: what ztunnel logs as `dst.addr`.
    let listener = socket::canonical(peer.local_addr);
    // The client certificate is the same for every stream of the connection.
    let src_identity = peer_identity
        .get_or_init(|| ambit_identity::tls::peer_identity(Some(&peer.certificates)))
        .clone();
    if let Err(e) = crate::on_demand::prepare_inbound(&pi).await {
        early_failure(Reporter::Destination, src, Some(listener), &e);
        return incoming.reject(e.hbone_status());
    }
    let state = pi.state.get();
    let plan = plan_hbone(
        &state,
        &HboneRequest {
            cfg: &pi.cfg,
            local: pi.local(),
            request: incoming.request(),
            peer: peer.addr,
            arrived_on: peer.local_addr,
            peer_identity: src_identity.as_ref(),
            source_policy: pi.source_policy(transparent),
            rbac: &*pi.metrics.rbac,
        },
    );
    drop(state);
    let plan = match plan {
        Ok(plan) => plan,
        Err(e) => {
            early_failure(Reporter::Destination, src, Some(listener), &e);
            return incoming.reject(e.hbone_status());
        }
    };
    let mut result = ConnectionResult::open(
        &pi.metrics,
        Reporter::Destination,
        Endpoints {
            src_addr: Some(src),
            src_workload: plan.src_workload,
            src_identity,
            dst_addr: Some(listener),
            dst_hbone_addr: plan.authority,
            dst_identity: Some(plan.dst_workload.identity()),
            dst_workload: Some(plan.dst_workload.clone()),
            dst_service: plan.dst_service,
            mtls: true,
        },
    );
    result.track(
        &pi.connections,
        Direction::Inbound,
        Connection::new(src, None, plan.target, Protocol::Hbone),
    );
    if let Err(e) = plan.verdict {
        incoming.reject(e.hbone_status());
        return result.finish(Err(e));
    }
    let target = plan.connect;
    // The client may give up while we dial the app: stop dialing then.
    let connected = tokio::select! {
        connected = async {
            let mut upstream = socket::connect(&*pi.sockets, &pi.cfg, target, plan.source).await?;
            // A PROXY application tunnel learns who the client is before any payload.
            if let Some(header) = &plan.proxy_header {
                upstream.write_all(header).await?;
            }
            Ok::<_, std::io::Error>(upstream)
        } => connected,
        reason = incoming.client_reset() => {
            return result.finish(Err(Error::ClientGone(format!(
                "stream reset ({reason}) while connecting to {target}"
            ))));
        }
    };
    let upstream = match connected {
        Ok(s) => s,
        Err(source) => {
            let e = Error::UpstreamConnect { target, source };
            incoming.reject(e.hbone_status());
            return result.finish(Err(e));
        }
    };
    let mut headers = http::HeaderMap::new();
    if pi.cfg.response_baggage {
        if let Ok(v) =
            http::HeaderValue::from_str(&baggage_of(&plan.dst_workload).to_header_value())
        {
            headers.insert("baggage", v);
        }
    }
    let mut tunnel = match incoming.accept(headers) {
        Ok(t) => t,
        Err(e) => return result.finish(Err(Error::ClientGone(e.to_string()))),
    };
    let revoked = result.watch_policy(plan.rbac, plan.dst_workload, plan.policy_generation);
    let outcome = until_revoked(
        revoked,
        proxy_tunnel(&result, &mut tunnel, upstream, TunnelSide::Client, &drain),
    )
    .await;
    result.finish(outcome);
}
