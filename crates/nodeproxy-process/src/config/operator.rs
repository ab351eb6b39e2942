//! The operator endpoints' addresses: admin (loopback only), stats and readiness, and the
//! ports captured traffic must not reach.

use std::net::SocketAddr;

use ambit_wellknown::ports;

use super::{ConfigError, ProxyMode};
use ambit_process::env::Env;

pub(super) struct OperatorAddresses {
    pub(super) admin: SocketAddr,
    pub(super) stats: SocketAddr,
    pub(super) readiness: SocketAddr,
    /// Ports of the workload's addresses that are ours, not the workload's (dedicated mode).
    pub(super) reserved_ports: Vec<u16>,
}

pub(super) fn addresses(
    env: &Env<'_>,
    proxy_mode: ProxyMode,
    ipv6_enabled: bool,
) -> Result<OperatorAddresses, ConfigError> {
    let admin = env.addr("AMBIT_ADMIN_ADDR", &format!("127.0.0.1:{}", ports::ADMIN))?;
    if !admin.ip().is_loopback() {
        return Err(ConfigError::Invalid {
            var: "AMBIT_ADMIN_ADDR",
            value: admin.to_string(),
            expected: "a loopback address: the admin endpoint can shut the proxy down",
        });
    }
    let wildcard = if ipv6_enabled { "[::]" } else { "0.0.0.0" };
    let stats = env.addr("AMBIT_STATS_ADDR", &format!("{wildcard}:{}", ports::STATS))?;
    let readiness = env.addr(
        "AMBIT_READINESS_ADDR",
        &format!("{wildcard}:{}", ports::READINESS),
    )?;
    // In dedicated mode the operator ports share the workload's addresses: captured
    // or tunnelled traffic must not reach them. In-pod they are in the node's netns.
    let reserved_ports = match proxy_mode {
        ProxyMode::Dedicated => vec![stats.port(), readiness.port()],
        ProxyMode::Shared => Vec::new(),
    };
    Ok(OperatorAddresses {
        admin,
        stats,
        readiness,
        reserved_ports,
    })
}
