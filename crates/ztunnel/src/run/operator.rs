//! The operator endpoints' listeners: admin (also on `::1`, as ztunnel), metrics and
//! readiness, all bound before anything is served.

use anyhow::Context;
use tokio::net::TcpListener;

use crate::config::Config;

pub(super) async fn bind(addr: std::net::SocketAddr, what: &str) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot bind the {what} endpoint on {addr}"))
}

/// ztunnel serves admin on `::1` as well as `127.0.0.1`: with IPv6 enabled and the default
/// IPv4 loopback address, bind the IPv6 loopback on the same port too. A node without
/// IPv6 (no `::1`, or IPv6 disabled in the kernel) keeps the IPv4 endpoint alone, and so
/// does a port the kernel picked (configured 0) that is taken on `::1`; any other failure
/// stops start-up.
pub(super) async fn bind_admin_ipv6(
    cfg: &Config,
    port: u16,
) -> anyhow::Result<Option<TcpListener>> {
    if !cfg.proxy.ipv6_enabled || cfg.admin_addr.ip() != std::net::Ipv4Addr::LOCALHOST {
        return Ok(None);
    }
    let addr = std::net::SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, port));
    match TcpListener::bind(addr).await {
        Ok(l) => Ok(Some(l)),
        Err(e) if ipv6_admin_optional(&e, cfg.admin_addr.port()) => {
            tracing::debug!(error = %e, "admin on {} only", cfg.admin_addr);
            Ok(None)
        }
        Err(e) => Err(e).with_context(|| format!("cannot bind the admin endpoint on {addr}")),
    }
}

fn ipv6_admin_optional(e: &std::io::Error, configured_port: u16) -> bool {
    use std::io::ErrorKind;
    e.kind() == ErrorKind::AddrNotAvailable
        || e.raw_os_error() == Some(nix::libc::EAFNOSUPPORT)
        || (configured_port == 0 && e.kind() == ErrorKind::AddrInUse)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Error, ErrorKind};

    #[test]
    fn ipv6_admin_is_optional_only_where_the_node_lacks_it() {
        let no_v6 = Error::from_raw_os_error(libc::EAFNOSUPPORT);
        assert!(ipv6_admin_optional(&no_v6, 15000));
        let no_loopback = Error::from_raw_os_error(libc::EADDRNOTAVAIL);
        assert!(ipv6_admin_optional(&no_loopback, 15000));
        // A configured port taken on ::1 is a conflict to report; a picked one is not.
        let taken = Error::from(ErrorKind::AddrInUse);
        assert!(!ipv6_admin_optional(&taken, 15000));
        assert!(ipv6_admin_optional(&taken, 0));
        let denied = Error::from(ErrorKind::PermissionDenied);
        assert!(!ipv6_admin_optional(&denied, 15000));
    }
}
