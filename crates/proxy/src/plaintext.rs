//! Inbound plaintext (15006): captured connections from clients outside the mesh. They
//! carry no identity, so only identity-free policy can allow them.

use std::net::SocketAddr;
use std::sync::Arc;

use ambit_state::RbacContext;
use tokio::net::TcpStream;

use crate::connections::{Connection, Direction, Protocol};
use crate::copy::proxy_bytes;
use crate::drain::DrainWatcher;
use crate::inbound::spoof_source;
use crate::inputs::ProxyInputs;
use crate::metrics::Reporter;
use crate::socket;
use crate::telemetry::{early_failure, ConnectionResult, Endpoints, ResponseFlag};

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
                format!("no original destination: {e}"),
            )
        }
    };
    if pi.cfg.loop_ports().contains(&dst.port()) {
        return early_failure(
            Reporter::Destination,
            src,
            Some(dst),
            format!("refusing connection to the proxy's own port {}", dst.port()),
        );
    }
    let state = pi.state.get();
    // Only our own workload is reachable here, and always through its policies: an
    // address we cannot attribute is refused, never forwarded unchecked.
    let dst_workload = match pi.serving_workload(&state, dst.ip()) {
        Ok(w) => w,
        Err(e) => return early_failure(Reporter::Destination, src, Some(dst), e),
    };
    let mut result = ConnectionResult::open(
        &pi.metrics,
        Reporter::Destination,
        Endpoints {
            src_addr: Some(src),
            src_workload: state.workload_by_ip(&pi.cfg.network, src.ip()),
            dst_addr: Some(dst),
            dst_identity: Some(dst_workload.identity()),
            dst_workload: Some(dst_workload.clone()),
            ..Default::default()
        },
    );
    result.track(
        &pi.connections,
        Direction::Inbound,
        Connection::new(src, None, dst, Protocol::Tcp),
    );
    let ctx = RbacContext {
        source_identity: None,
        source_ip: src.ip(),
        destination: dst,
    };
    if let Err(denied) = state.authorize(&ctx, &dst_workload) {
        return result.finish(Err((
            ResponseFlag::Deny,
            format!("connection closed due to policy rejection: {denied}"),
        )));
    }
    drop(state);
    let source = spoof_source(&pi, transparent, src.ip(), dst.ip());
    let upstream = match socket::connect(&*pi.sockets, &pi.cfg, dst, source).await {
        Ok(s) => s,
        Err(e) => {
            return result.finish(Err((
                ResponseFlag::Connect,
                format!("connect to {dst}: {e}"),
            )))
        }
    };
    let outcome = proxy_bytes(&result, downstream, upstream, &drain).await;
    result.finish(outcome);
}
