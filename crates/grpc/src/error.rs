//! What can be wrong with a channel's configuration. All of it is the operator's to fix.

/// A channel that cannot be made or a request that cannot be sent.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GrpcError {
    #[error("server address {address:?}: {reason}")]
    Address { address: String, reason: String },
    #[error("root certificate {from}: {reason}")]
    Root { from: String, reason: String },
    #[error("auth token {from}: {reason}")]
    Token { from: String, reason: String },
    #[error("header {name:?}: {reason}")]
    Header { name: String, reason: String },
    #[error("TLS configuration: {0}")]
    Tls(String),
}
