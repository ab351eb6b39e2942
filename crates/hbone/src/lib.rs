//! HBONE: HTTP/2 CONNECT over mutual TLS (port 15008), wire-compatible with Istio's ztunnel.
//!
//! This crate knows nothing of workloads or services: callers hand it rustls configs,
//! transports and request metadata.
//!
//! - [`headers`], [`request`], [`status`]: sans-IO parsing, building and validation;
//! - [`stream::H2Stream`]: a tunnel as `AsyncRead + AsyncWrite`;
//! - [`server`]: serve one accepted connection;
//! - [`pool`]: the client connection pool;
//! - [`tls`]: the TLS handshakes with HBONE's extra checks;
//! - [`ReadAhead`]: the socket under TLS, read in chunks that grow with the traffic.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod error;
pub mod headers;
mod keepalive;
mod payload;
pub mod pool;
mod rate;
mod read_ahead;
pub mod request;
pub mod server;
mod settings;
mod splice;
pub mod status;
pub mod stream;
pub mod tls;

pub use error::{Fault, HboneError, HeaderError};
pub use headers::{
    forwarded_host, forwarded_value, parse_authority, Authority, Baggage, TraceParent,
};
pub use pool::{ClientSettings, Pool, PoolKey};
pub use read_ahead::ReadAhead;
pub use request::{validate, ConnectRequest, Rejection, ValidatedConnect};
pub use server::{
    accept, accept_connection, accept_connection_reporting, accept_h2, accept_reporting, serve,
    serve_connection, Accepted, HandshakeStep, IncomingConnect, PeerInfo,
};
pub use settings::H2Settings;
pub use stream::H2Stream;

/// The HBONE port.
pub const HBONE_PORT: u16 = ambit_wellknown::ports::HBONE;
