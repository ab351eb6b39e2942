//! What both demos print and check: the control plane's summary, and one exchange through
//! the mesh with the doubling echo app.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::mpsc::Receiver;
use std::time::Duration;

use ambit_netns_lab::control::ControlPlane;
use anyhow::{bail, Context};

/// Two lines on the control plane: where it runs and what its clients acknowledged.
pub(crate) fn control_summary(plane: &ControlPlane) -> anyhow::Result<String> {
    let metrics = plane.metrics()?;
    let value = |name: &str| -> f64 {
        metrics
            .lines()
            .filter(|l| l.starts_with(name))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    Ok(format!(
        "  control plane: ambit control at {} (delta xDS + CA; no node holds the CA key)\n  control metrics: clients {} pushes {} acks {} nacks {} certificates signed {}",
        plane.listen,
        value("ambit_control_xds_clients"),
        value("ambit_control_xds_pushes_total"),
        value("ambit_control_xds_acks_total"),
        value("ambit_control_xds_nacks_total"),
        value("ambit_control_csr_signed_total"),
    ))
}

/// Sends `secret` on `conn`, half-closes, and checks that the doubling echo sent it back
/// twice; returns the bytes received and the address the app saw the connection from
/// (`seen`).
pub(crate) fn doubled_echo(
    what: &str,
    mut conn: TcpStream,
    secret: &[u8],
    seen: &Receiver<SocketAddr>,
) -> anyhow::Result<(usize, SocketAddr)> {
    conn.write_all(secret)?;
    conn.shutdown(std::net::Shutdown::Write)?;
    let mut back = Vec::new();
    conn.read_to_end(&mut back)?;
    if back.len() != secret.len() * 2 {
        bail!(
            "{what}: expected {} bytes back, got {}",
            secret.len() * 2,
            back.len()
        );
    }
    let peer = seen
        .recv_timeout(Duration::from_secs(5))
        .context("the app saw no connection")?;
    Ok((
        back.len(),
        SocketAddr::new(peer.ip().to_canonical(), peer.port()),
    ))
}
