//! HTTP/2 PING keepalive: ping every interval, fail when a PONG does not come back in time.

use std::time::Duration;

use h2::{Ping, PingPong};

use crate::error::HboneError;

/// Pings the peer every `interval` (first after one interval) and returns the error that ends
/// the keepalive: no PONG within `timeout`, or the connection failing. Never returns when
/// keepalive is disabled (`interval` zero or no ping handle).
pub(crate) async fn run(
    ping_pong: Option<PingPong>,
    interval: Duration,
    timeout: Duration,
) -> HboneError {
    let Some(mut ping_pong) = ping_pong.filter(|_| !interval.is_zero()) else {
        return std::future::pending().await;
    };
    loop {
        tokio::time::sleep(interval).await;
        match tokio::time::timeout(timeout, ping_pong.ping(Ping::opaque())).await {
            Ok(Ok(_pong)) => {}
            Ok(Err(e)) => return HboneError::from(e),
            Err(_elapsed) => return HboneError::PingTimeout(timeout),
        }
    }
}
