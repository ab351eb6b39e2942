//! Inbound plaintext (15006): captured connections from clients outside the mesh. They
//! carry no identity, so only identity-free policy can allow them. Decided in
//! [`crate::decide::inbound::plan_plaintext`].

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpStream;

use crate::connections::{Connection, Direction, Protocol};
use crate::copy::proxy_bytes;
use crate::decide::inbound::{plan_plaintext, PlaintextConnection};
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
    transparent: bool,
) {
    let src = socket::canonical(src);
    let _ = socket::tune_stream(&downstream, &pi.cfg.keepalive);
    let dst = match socket::original_destination(&downstream) {
        Ok(d) => d,
        Err(e) => {
            return early_failure(
                Reporter::Destination,
                src,
                None,
                &Error::NoOriginalDestination(e),
            )
        }
    };
    if let Err(e) = crate::on_demand::prepare_inbound(&pi).await {
        return early_failure(Reporter::Destination, src, Some(dst), &e);
    }
    let state = pi.state.get();
    let plan = plan_plaintext(
        &state,
        &PlaintextConnection {
            cfg: &pi.cfg,
            local: pi.local(),
            peer: src,
            original_dst: dst,
            source_policy: pi.source_policy(transparent),
            rbac: &*pi.metrics.rbac,
        },
    );
    drop(state);
    let plan = match plan {
        Ok(plan) => plan,
        Err(e) => return early_failure(Reporter::Destination, src, Some(dst), &e),
    };
    let dst_workload = plan.dst_workload.clone();
    let mut result = ConnectionResult::open(
        &pi.metrics,
        Reporter::Destination,
        Endpoints {
            src_addr: Some(src),
            src_workload: plan.src_workload,
            dst_addr: Some(dst),
            dst_identity: Some(plan.dst_workload.identity()),
            dst_workload: Some(plan.dst_workload),
            ..Default::default()
        },
    );
    result.track(
        &pi.connections,
        Direction::Inbound,
        Connection::new(src, None, dst, Protocol::Tcp),
    );
    if let Err(e) = plan.verdict {
        return result.finish(Err(e));
    }
    let upstream = match socket::connect(&*pi.sockets, &pi.cfg, dst, plan.source).await {
        Ok(s) => s,
        Err(source) => {
            return result.finish(Err(Error::UpstreamConnect {
                target: dst,
                source,
            }))
        }
    };
    let revoked = result.watch_policy(plan.rbac, dst_workload, plan.policy_generation);
    let outcome =
        crate::inbound::until_revoked(revoked, proxy_bytes(&result, downstream, upstream, &drain))
            .await;
    result.finish(outcome);
}
