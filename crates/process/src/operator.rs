//! The operator ports every ambit process serves the same way: admin (loopback only, and
//! on `::1` too, as ztunnel), metrics and readiness, all bound before anything is served
//! ([`OperatorPorts::bind`]), so a conflict fails start-up cleanly; admin and metrics stop at
//! the drain, readiness keeps answering through it ([`OperatorPorts::serve`]).

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;

use ambit_runtime::drain::DrainWatcher;
use ambit_runtime::http::Handler;
use ambit_runtime::readiness::Ready;

/// Binds a listener, naming what it is for when it cannot.
pub async fn bind(addr: SocketAddr, what: &str) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot bind the {what} endpoint on {addr}"))
}

/// Binds `addr` without listening yet: a port taken fails start-up at once, while a
/// connection before [`Reserved::listen`] is refused (not left waiting in a backlog), as a
/// proxy that is not ready must serve nothing.
pub fn reserve(addr: SocketAddr, what: &str) -> anyhow::Result<Reserved> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()
    } else {
        tokio::net::TcpSocket::new_v6()
    }
    .with_context(|| format!("cannot open a socket for the {what} endpoint"))?;
    // As `TcpListener::bind` does: a restart binds again past TIME_WAIT.
    socket
        .set_reuseaddr(true)
        .and_then(|()| socket.bind(addr))
        .with_context(|| format!("cannot bind the {what} endpoint on {addr}"))?;
    Ok(Reserved { socket, addr })
}

/// A bound port that does not accept yet.
pub struct Reserved {
    socket: tokio::net::TcpSocket,
    addr: SocketAddr,
}

impl Reserved {
    pub fn listen(self) -> anyhow::Result<TcpListener> {
        let addr = self.addr;
        self.socket
            .listen(1024)
            .with_context(|| format!("cannot listen on {addr}"))
    }
}

/// Where the operator ports listen.
#[derive(Debug, Clone, Copy)]
pub struct OperatorAddrs {
    pub admin: SocketAddr,
    /// Admin on `::1` as well, on the same port, when it is on `127.0.0.1` (ztunnel's way;
    /// see [`bind_admin_ipv6`]).
    pub admin_ipv6_twin: bool,
    pub stats: SocketAddr,
    pub readiness: SocketAddr,
}

/// The operator ports, bound.
pub struct OperatorPorts {
    admin: TcpListener,
    admin_v6: Option<TcpListener>,
    stats: TcpListener,
    readiness: TcpListener,
}

impl OperatorPorts {
    pub async fn bind(addrs: &OperatorAddrs) -> anyhow::Result<OperatorPorts> {
        let admin = bind(addrs.admin, "admin").await?;
        let admin_v6 = if addrs.admin_ipv6_twin {
            bind_admin_ipv6(addrs.admin, admin.local_addr()?.port()).await?
        } else {
            None
        };
        Ok(OperatorPorts {
            admin,
            admin_v6,
            stats: bind(addrs.stats, "metrics").await?,
            readiness: bind(addrs.readiness, "readiness").await?,
        })
    }

    /// Serves `admin` and the registry's metrics until the drain begins, and readiness
    /// through the drain (a draining process still says it is not ready to new traffic).
    pub fn serve(
        self,
        admin: Handler,
        registry: Arc<Registry>,
        ready: Ready,
        drain: &DrainWatcher,
    ) {
        if let Some(v6) = self.admin_v6 {
            tokio::spawn(ambit_runtime::http::serve(v6, admin.clone(), drain.clone()));
        }
        tokio::spawn(ambit_runtime::http::serve(self.admin, admin, drain.clone()));
        tokio::spawn(ambit_runtime::http::serve(
            self.stats,
            ambit_runtime::operator::metrics_handler(registry),
            drain.clone(),
        ));
        let (readiness_trigger, readiness_drain) = ambit_runtime::drain::new();
        tokio::spawn(async move {
            ambit_runtime::http::serve(
                self.readiness,
                ambit_runtime::operator::readiness_handler(ready),
                readiness_drain,
            )
            .await;
            drop(readiness_trigger);
        });
    }
}

/// ztunnel serves admin on `::1` as well as `127.0.0.1`: with the IPv4 loopback address
/// (`admin`), bind the IPv6 loopback on the same port too. A node without IPv6 (no `::1`,
/// or IPv6 disabled in the kernel) keeps the IPv4 endpoint alone, and so does a port the
/// kernel picked (configured 0) that is taken on `::1`; any other failure stops start-up.
pub async fn bind_admin_ipv6(admin: SocketAddr, port: u16) -> anyhow::Result<Option<TcpListener>> {
    if admin.ip() != std::net::Ipv4Addr::LOCALHOST {
        return Ok(None);
    }
    let addr = SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, port));
    match TcpListener::bind(addr).await {
        Ok(l) => Ok(Some(l)),
        Err(e) if ipv6_admin_optional(&e, admin.port()) => {
            tracing::debug!(error = %e, "admin on {admin} only");
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
