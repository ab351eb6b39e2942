//! The data path's error: one enum for every way a proxied connection can fail. Each
//! variant carries its cause and knows whose fault it was, which `response_flags` value
//! the metrics get, and which status an HBONE client is answered with, so nothing
//! downstream has to guess from an error's text.

use std::io;
use std::net::{IpAddr, SocketAddr};

use ambit_hbone::{HboneError, Rejection};
use ambit_identity::SpiffeId;
use ambit_state::{Denied, RouteError};
use http::StatusCode;

use ambit_telemetry::ResponseFlag;

/// Whose fault a failure was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The side that opened the connection: the local app (outbound) or the HBONE client
    /// (inbound) asked for something it may not have, or went away.
    Downstream,
    /// The side we connect to: the destination app, or the remote proxy and the path to it.
    Upstream,
    /// The mesh configuration or the node's capture setup: retrying will not help until it
    /// changes.
    Config,
    /// This proxy: shutting down, out of resources, or a certificate it cannot get.
    Internal,
}

/// Why a proxied connection failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The connection was not redirected by netfilter, so it has no original destination.
    #[error(
        "no original destination: {0}; the connection was not captured by the redirection rules"
    )]
    NoOriginalDestination(#[source] io::Error),
    /// A captured connection aimed at one of this proxy's own ports would loop forever.
    #[error("refusing connection to the proxy's own port {port}")]
    SelfCall { port: u16 },
    /// The workload this proxy acts for is not in the configuration (yet).
    #[error(
        "this proxy's workload {namespace}/{name} (service account {service_account}) is not in \
         the configuration"
    )]
    LocalWorkloadMissing {
        namespace: String,
        name: String,
        service_account: String,
    },
    /// On-demand xDS: the control plane did not answer a lookup in time (or too many are
    /// pending); the connection is refused rather than sent somewhere unknown.
    #[error("on-demand lookup failed: {0}")]
    OnDemand(String),
    /// An inbound connection for an address that is not our workload's.
    #[error("{ip} is not an address of workload {namespace}/{name}")]
    NotLocalAddress {
        ip: IpAddr,
        namespace: String,
        name: String,
    },
    /// The outbound decision found no way to the destination.
    #[error(transparent)]
    Route(#[from] RouteError),
    /// A CONNECT request that is not a valid HBONE request.
    #[error("{}", .0.reason)]
    BadRequest(Rejection),
    /// A CONNECT whose `:authority` names another IP than the one it arrived on.
    #[error("ip mismatch: {local} != {requested}")]
    IpMismatch { local: IpAddr, requested: IpAddr },
    /// A CONNECT to `host:port` that the local workload does not serve.
    #[error("cannot resolve port {port} of {host} on {workload}")]
    UnknownServicePort {
        host: String,
        port: u16,
        workload: String,
    },
    /// Authorization policy denied the connection.
    #[error("connection closed due to policy rejection: {0}")]
    Denied(Denied),
    /// This proxy has no certificate for the identity it must present.
    #[error("no certificate for {identity}: {reason}")]
    NoCertificate { identity: SpiffeId, reason: String },
    /// The connection to the destination (the app, or a non-mesh target) failed.
    #[error("connect to {target}: {source}")]
    UpstreamConnect {
        target: SocketAddr,
        #[source]
        source: io::Error,
    },
    /// Opening the HBONE tunnel to the remote proxy failed.
    #[error(transparent)]
    Tunnel(#[from] HboneError),
    /// The HBONE client reset the stream (or dropped the connection) before it was answered.
    #[error("client went away: {0}")]
    ClientGone(String),
    /// Moving bytes failed mid-connection.
    #[error("io error: {0}")]
    Relay(#[source] io::Error),
    /// The drain deadline passed while the connection was still open.
    #[error("closed by drain deadline")]
    DrainDeadline,
    /// The connection's record was dropped before it was finished (a task was cancelled).
    #[error("connection dropped")]
    Dropped,
}

impl Error {
    /// Whose fault the failure was.
    pub fn fault(&self) -> Fault {
        match self {
            Error::SelfCall { .. }
            | Error::NotLocalAddress { .. }
            | Error::BadRequest(_)
            | Error::IpMismatch { .. }
            | Error::UnknownServicePort { .. }
            | Error::Denied(_)
            | Error::ClientGone(_) => Fault::Downstream,
            Error::NoOriginalDestination(_) | Error::LocalWorkloadMissing { .. } => Fault::Config,
            Error::Route(
                RouteError::WaypointNotFound { .. } | RouteError::WaypointInOtherNetwork { .. },
            ) => Fault::Config,
            Error::Route(_) | Error::UpstreamConnect { .. } | Error::Relay(_) => Fault::Upstream,
            Error::Tunnel(e) => match e.fault() {
                ambit_hbone::Fault::Local => Fault::Internal,
                _ => Fault::Upstream,
            },
            Error::NoCertificate { .. } | Error::DrainDeadline | Error::Dropped => Fault::Internal,
            Error::OnDemand(_) => Fault::Config,
        }
    }

    /// The `response_flags` label ztunnel gives this failure.
    pub fn response_flag(&self) -> ResponseFlag {
        match self {
            Error::Denied(_) => ResponseFlag::Deny,
            Error::UpstreamConnect { .. } => ResponseFlag::Connect,
            Error::NoCertificate { .. } => ResponseFlag::TlsFailure,
            Error::Tunnel(e) => match e {
                HboneError::Tls(_)
                | HboneError::Alpn(_)
                | HboneError::HandshakeTimeout(_)
                | HboneError::NoClientCertificate => ResponseFlag::TlsFailure,
                HboneError::ConnectTimeout(_) => ResponseFlag::NetworkPolicy,
                HboneError::Status(_) | HboneError::Connect(_) => ResponseFlag::Connect,
                _ => ResponseFlag::H2HandshakeFailure,
            },
            _ => ResponseFlag::None,
        }
    }

    /// The status an HBONE client is answered with when this ends its CONNECT: 400 for a
    /// request that is wrong in itself, 401 for policy, 503 for everything the client could
    /// get through later or elsewhere.
    pub fn hbone_status(&self) -> StatusCode {
        match self {
            Error::BadRequest(r) => r.status,
            Error::IpMismatch { .. } => StatusCode::BAD_REQUEST,
            Error::Denied(_) => StatusCode::UNAUTHORIZED,
            _ => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    fn denied() -> Error {
        Error::Denied(Denied {
            reason: "explicitly denied by: shop/deny-all".into(),
            policy: Some("shop/deny-all".into()),
            matched_rule: None,
        })
    }

    #[test]
    fn each_failure_has_its_flag_status_and_fault() {
        let refused = || io::Error::from(io::ErrorKind::ConnectionRefused);
        let target: SocketAddr = "10.0.0.2:8080".parse().unwrap();
        let cases: Vec<(Error, ResponseFlag, u16, Fault)> = vec![
            (denied(), ResponseFlag::Deny, 401, Fault::Downstream),
            (
                Error::UpstreamConnect {
                    target,
                    source: refused(),
                },
                ResponseFlag::Connect,
                503,
                Fault::Upstream,
            ),
            (
                Error::BadRequest(Rejection::new(StatusCode::BAD_REQUEST, "not CONNECT")),
                ResponseFlag::None,
                400,
                Fault::Downstream,
            ),
            (
                Error::IpMismatch {
                    local: "10.0.0.2".parse().unwrap(),
                    requested: "10.0.0.3".parse().unwrap(),
                },
                ResponseFlag::None,
                400,
                Fault::Downstream,
            ),
            (
                Error::SelfCall { port: 15008 },
                ResponseFlag::None,
                503,
                Fault::Downstream,
            ),
            (
                Error::Route(RouteError::NoHealthyUpstream {
                    service: "shop/api".into(),
                }),
                ResponseFlag::None,
                503,
                Fault::Upstream,
            ),
            (
                Error::Route(RouteError::WaypointInOtherNetwork {
                    target: "service shop/api".into(),
                    network: "far".into(),
                }),
                ResponseFlag::None,
                503,
                Fault::Config,
            ),
            (
                Error::Tunnel(HboneError::ConnectTimeout(Duration::from_secs(10))),
                ResponseFlag::NetworkPolicy,
                503,
                Fault::Upstream,
            ),
            (
                Error::Tunnel(HboneError::Tls(Arc::new(io::Error::other("bad cert")))),
                ResponseFlag::TlsFailure,
                503,
                Fault::Upstream,
            ),
            (
                Error::Tunnel(HboneError::Status(StatusCode::UNAUTHORIZED)),
                ResponseFlag::Connect,
                503,
                Fault::Upstream,
            ),
            (
                Error::Tunnel(HboneError::H2(Arc::new(h2::Error::from(
                    h2::Reason::PROTOCOL_ERROR,
                )))),
                ResponseFlag::H2HandshakeFailure,
                503,
                Fault::Upstream,
            ),
            (
                Error::DrainDeadline,
                ResponseFlag::None,
                503,
                Fault::Internal,
            ),
        ];
        for (error, flag, status, fault) in cases {
            assert_eq!(error.response_flag(), flag, "{error}");
            assert_eq!(error.hbone_status().as_u16(), status, "{error}");
            assert_eq!(error.fault(), fault, "{error}");
        }
    }

    #[test]
    fn messages_name_the_cause() {
        assert_eq!(
            denied().to_string(),
            "connection closed due to policy rejection: explicitly denied by: shop/deny-all"
        );
        let e = Error::UpstreamConnect {
            target: "10.0.0.2:8080".parse().unwrap(),
            source: io::Error::from(io::ErrorKind::ConnectionRefused),
        };
        assert!(
            e.to_string().starts_with("connect to 10.0.0.2:8080: "),
            "{e}"
        );
    }
}
