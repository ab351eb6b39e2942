//! Typed errors. Every error says whose fault it is ([`Fault`]) and its message says what to
//! do about it, so access logs and `response_flags` can be derived without string matching.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;

/// Whose fault an error is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Fault {
    /// The HBONE peer (the other node proxy) misbehaved or refused us: bad TLS identity,
    /// protocol violation, policy denial.
    Peer,
    /// The network path to the peer: refused, unreachable, timed out, keepalive lost.
    Network,
    /// The peer is fine but what it fronts is not: the destination application or workload
    /// is unavailable (HTTP 503).
    Upstream,
    /// Our own side: bad configuration, a request we could not encode, a local I/O failure.
    Local,
}

/// Errors from parsing or building HBONE headers (sans-IO).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HeaderError {
    /// The `:authority` is empty.
    #[error("empty authority: an HBONE CONNECT needs `ip:port` or `host:port`")]
    EmptyAuthority,
    /// The `:authority` is longer than any valid target.
    #[error("authority is {0} bytes long, over the {limit}-byte limit", limit = crate::headers::MAX_AUTHORITY_LEN)]
    AuthorityTooLong(usize),
    /// No `:port` part.
    #[error("authority {0:?} has no port: HBONE targets are `ip:port` or `host:port`")]
    MissingPort(String),
    /// The port is not a decimal number in 1..=65535.
    #[error("authority {0:?} has an invalid port (want a decimal number 1-65535)")]
    InvalidPort(String),
    /// The host is neither an IP address nor a valid DNS name.
    #[error("authority {0:?} has an invalid host (want an IP address or a DNS name)")]
    InvalidHost(String),
    /// A `traceparent` value is not `00-<32 hex>-<16 hex>-<2 hex>`.
    #[error(
        "invalid traceparent {0:?}: want `00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>`"
    )]
    InvalidTraceParent(String),
    /// A header value we were asked to send cannot be encoded as an HTTP header value.
    #[error("header {name} has a value that is not a valid HTTP header value (control or non-ASCII characters)")]
    InvalidHeaderValue {
        /// The header's name.
        name: &'static str,
    },
}

impl HeaderError {
    /// Whose fault: a header we received is the peer's fault; one we failed to build is ours.
    /// Parsing errors are reported as `Peer` because parsing is applied to received values.
    pub fn fault(&self) -> Fault {
        match self {
            HeaderError::InvalidHeaderValue { .. } => Fault::Local,
            _ => Fault::Peer,
        }
    }
}

/// Errors from HBONE connections and streams.
///
/// Cheap to clone (sources are behind `Arc`) so that one failed dial can be reported to every
/// caller that was waiting for it.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HboneError {
    /// Establishing the connection to the peer (TCP connect, or the caller's connect function)
    /// failed.
    #[error("connecting to the HBONE peer failed: {0}; check that the peer is up and listening on its HBONE port (15008)")]
    Connect(#[source] Arc<io::Error>),
    /// Establishing the connection took longer than the connect timeout.
    #[error("connection to the HBONE peer timed out after {0:?}, maybe a NetworkPolicy is blocking HBONE port 15008")]
    ConnectTimeout(Duration),
    /// The TLS handshake failed (bad or unexpected certificate, no client certificate, wrong
    /// trust domain, or not TLS at all).
    #[error("TLS handshake failed: {0}; check that both sides share a root of trust and that the peer identity is one we expect")]
    Tls(#[source] Arc<io::Error>),
    /// The TLS or HTTP/2 handshake did not complete in time.
    #[error("TLS/HTTP2 handshake with the peer did not complete within {0:?}; the peer may not speak HBONE")]
    HandshakeTimeout(Duration),
    /// The peer took the CONNECT stream but never answered it.
    #[error("the HBONE peer did not answer the CONNECT within {0:?}; the peer proxy may be overloaded or hung")]
    ResponseTimeout(Duration),
    /// The peer did not negotiate ALPN `h2`.
    #[error("peer negotiated ALPN {0:?} instead of \"h2\": it is not an HBONE endpoint")]
    Alpn(String),
    /// A client reached the server without a client certificate (HBONE is mutual TLS).
    #[error("peer presented no client certificate; HBONE requires mutual TLS (configure the server to require client auth)")]
    NoClientCertificate,
    /// An HTTP/2 error on the connection or stream.
    #[error("HTTP/2 error: {0}")]
    H2(#[source] Arc<h2::Error>),
    /// The peer answered the CONNECT with a status other than 200.
    #[error("http status: {0}")]
    Status(StatusCode),
    /// The peer did not answer a PING in time; the connection was closed.
    #[error("HBONE peer did not answer an HTTP/2 PING within {0:?}; connection closed (peer hung or network path lost)")]
    PingTimeout(Duration),
    /// A client opened streams on one connection faster than allowed (per second).
    #[error("the HBONE client opened streams faster than {0} per second; connection closed with ENHANCE_YOUR_CALM")]
    StreamRate(u32),
    /// The request could not be built.
    #[error("cannot build the CONNECT request: {0}")]
    Request(#[from] HeaderError),
    /// A local I/O error (reading socket addresses and the like).
    #[error("I/O error: {0}")]
    Io(#[source] Arc<io::Error>),
}

impl From<io::Error> for HboneError {
    /// An `io::Error` from a connect function is a connect failure.
    fn from(e: io::Error) -> Self {
        HboneError::Connect(Arc::new(e))
    }
}

impl From<h2::Error> for HboneError {
    fn from(e: h2::Error) -> Self {
        HboneError::H2(Arc::new(e))
    }
}

impl HboneError {
    /// Whose fault this error is.
    pub fn fault(&self) -> Fault {
        match self {
            HboneError::Connect(_)
            | HboneError::ConnectTimeout(_)
            | HboneError::HandshakeTimeout(_)
            | HboneError::ResponseTimeout(_)
            | HboneError::PingTimeout(_) => Fault::Network,
            HboneError::Tls(_)
            | HboneError::Alpn(_)
            | HboneError::NoClientCertificate
            | HboneError::StreamRate(_) => Fault::Peer,
            HboneError::H2(e) if e.is_io() => Fault::Network,
            HboneError::H2(_) => Fault::Peer,
            HboneError::Status(s) if *s == StatusCode::BAD_REQUEST => Fault::Local,
            HboneError::Status(s) if *s == StatusCode::SERVICE_UNAVAILABLE => Fault::Upstream,
            HboneError::Status(_) => Fault::Peer,
            HboneError::Request(e) => e.fault(),
            HboneError::Io(_) => Fault::Local,
        }
    }

    /// Whether retrying (possibly on another connection or endpoint) may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            HboneError::Connect(_)
            | HboneError::ConnectTimeout(_)
            | HboneError::HandshakeTimeout(_)
            | HboneError::ResponseTimeout(_)
            | HboneError::PingTimeout(_) => true,
            HboneError::H2(e) => {
                e.is_go_away() || e.is_io() || e.reason() == Some(h2::Reason::REFUSED_STREAM)
            }
            HboneError::Status(s) => *s == StatusCode::SERVICE_UNAVAILABLE,
            _ => false,
        }
    }

    /// True when the stream was never processed by the peer because the connection was
    /// going away (GOAWAY) or the stream was refused: the request can be retried on a fresh
    /// connection.
    pub(crate) fn is_unprocessed(&self) -> bool {
        match self {
            HboneError::H2(e) => e.is_go_away() || e.reason() == Some(h2::Reason::REFUSED_STREAM),
            _ => false,
        }
    }

    pub(crate) fn io(e: io::Error) -> Self {
        HboneError::Io(Arc::new(e))
    }

    pub(crate) fn tls(e: io::Error) -> Self {
        HboneError::Tls(Arc::new(e))
    }
}
