//! Error types of this crate. Each message says what was wrong and, where it helps, what to do.

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use crate::spiffe::SpiffeError;

/// Failures of the local certificate authority: loading, writing, issuing.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CaError {
    #[error(
        "cannot read {path}: {source}; a plug-in CA directory needs ca-cert.pem, ca-key.pem, root-cert.pem and cert-chain.pem"
    )]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not valid PEM: {reason}")]
    Pem { path: PathBuf, reason: String },
    #[error("{path} holds no PEM certificate (expected a -----BEGIN CERTIFICATE----- block)")]
    NoCertificate { path: PathBuf },
    #[error("{path}: certificate #{index} cannot be parsed: {reason}")]
    BadCertificate {
        path: PathBuf,
        index: usize,
        reason: String,
    },
    #[error(
        "{path} holds {found} certificates; it must hold only the signing certificate (put the chain up to the root in cert-chain.pem)"
    )]
    TooManyCertificates { path: PathBuf, found: usize },
    /// The CA key can be read by users other than its owner. Whoever reads it can mint any
    /// identity of the mesh, so the proxy will not use it. The operator's to fix.
    #[error(
        "{path} has mode {mode:04o}: the mesh CA key must be readable by its owner only (whoever reads it can mint any identity in the mesh); run `chmod 600 {path}` (on Kubernetes, mount the secret with defaultMode 0600)"
    )]
    KeyTooOpen { path: PathBuf, mode: u32 },
    #[error(
        "{path} holds no PEM private key (expected -----BEGIN PRIVATE KEY-----, RSA PRIVATE KEY or EC PRIVATE KEY)"
    )]
    NoKey { path: PathBuf },
    #[error(
        "{path} cannot be used as a signing key: {reason} (supported: RSA, ECDSA P-256, P-384)"
    )]
    BadKey { path: PathBuf, reason: String },
    #[error(
        "the private key in {key_path} does not match the public key of {cert_path}; they must come from the same key pair"
    )]
    KeyMismatch {
        key_path: PathBuf,
        cert_path: PathBuf,
    },
    #[error("{path} is not a CA certificate: {reason}")]
    NotCa { path: PathBuf, reason: String },
    #[error(
        "the first certificate of {chain_path} is not the one in {ca_cert_path}; cert-chain.pem must start with ca-cert.pem and go up to the root"
    )]
    ChainStart {
        chain_path: PathBuf,
        ca_cert_path: PathBuf,
    },
    #[error(
        "certificates signed by {ca_cert_path} (with the intermediates of {chain_path}) do not chain to a trust anchor of {root_path}: {reason}"
    )]
    DoesNotChain {
        ca_cert_path: PathBuf,
        chain_path: PathBuf,
        root_path: PathBuf,
        reason: String,
    },
    #[error("{path} cannot be used to sign: {reason}")]
    Unsupported { path: PathBuf, reason: String },
    #[error(
        "the signing certificate expired at {}; rotate the CA (replace ca-cert.pem and ca-key.pem)",
        crate::x509::rfc3339(*not_after)
    )]
    Expired { not_after: SystemTime },
    #[error("certificate lifetime {ttl:?} is invalid; it must be longer than zero")]
    InvalidTtl { ttl: Duration },
    #[error("invalid trust domain: {0}")]
    TrustDomain(#[source] SpiffeError),
    #[error("{context}: {source}")]
    Rcgen {
        context: &'static str,
        source: rcgen::Error,
    },
    #[error("{0}")]
    Certificate(#[from] CertError),
}

/// A workload certificate whose parts do not fit together.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CertError {
    #[error("the certificate chain is empty; it must hold at least the leaf")]
    EmptyChain,
    #[error("the root certificate list is empty; peers could not be verified")]
    NoRoots,
    #[error("certificate #{index} of the chain cannot be parsed: {reason}")]
    Parse { index: usize, reason: String },
    #[error("PEM input is invalid: {0}")]
    Pem(String),
    #[error("the leaf certificate has no SPIFFE URI SAN (found {found:?})")]
    NoSpiffeId { found: Vec<String> },
    #[error("the leaf certificate is for {found}, but {expected} was requested")]
    IdentityMismatch { expected: String, found: String },
    #[error("the private key is not a usable PKCS#8 key: {0}")]
    Key(String),
    #[error("the leaf certificate is not for this private key")]
    KeyMismatch,
}

/// Failures to build a rustls configuration.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    #[error("no expected server identities given; a client must know which SPIFFE ids it accepts")]
    NoExpectedIdentities,
    #[error("the certificate has no roots; peers could not be verified")]
    NoRoots,
    #[error("root certificate #{index} is not a usable trust anchor: {source}")]
    BadRoot { index: usize, source: rustls::Error },
    #[error("building the client-certificate verifier failed: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
    #[error("building the TLS configuration failed: {0}")]
    Rustls(#[from] rustls::Error),
}

/// Why an [`crate::Issuer`] produced no certificate, saying whose fault it is.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IssueError {
    /// Local certificate work failed: the local CA could not sign (its files or key, the
    /// operator's to fix), or a key or CSR could not be made.
    #[error("local certificate signing failed: {0}")]
    Local(#[from] CaError),
    /// The CA answered with a gRPC error: it refused this request (often the token or
    /// the requested identity is not allowed); retrying helps only if that changes.
    #[error("the CA refused the certificate request with status {code}: {message}")]
    Refused { code: String, message: String },
    /// No answer from the CA (connection, TLS or timeout): retried with backoff.
    #[error("the CA at {address} is unreachable: {reason}")]
    Unreachable { address: String, reason: String },
    /// The CA channel could not be set up from our configuration (root, token, headers).
    #[error("cannot talk to the CA: {reason}")]
    Channel { reason: String },
    /// The CA answered with a chain we cannot use: the CA's fault.
    #[error("the CA returned an unusable certificate chain: {reason}")]
    BadChain { reason: String },
    /// The CA signed a certificate for another identity than the one asked for.
    #[error(
        "the CA returned a certificate for {found}, but {expected} was requested; it was rejected"
    )]
    WrongIdentity { expected: String, found: String },
    /// The leaf's validity ended before it arrived, by this node's clock. Either the CA
    /// signs with a wrong clock or this node's clock is ahead: refused, retried with backoff.
    #[error(
        "the CA returned a certificate that expired at {}, {} before this node's clock; it was refused (the node clock looks skewed ahead of the CA's, unless the CA's clock is wrong)",
        crate::x509::rfc3339(*not_after),
        human(*by)
    )]
    Expired { not_after: SystemTime, by: Duration },
    /// The leaf's validity starts later than this node's clock allows (beyond a small
    /// allowance): this node's clock is behind the CA's, or the CA's is wrong.
    #[error(
        "the CA returned a certificate valid only from {}, {} after this node's clock; it was refused (the node clock looks skewed behind the CA's, unless the CA's clock is wrong)",
        crate::x509::rfc3339(*not_before),
        human(*by)
    )]
    NotYetValid {
        not_before: SystemTime,
        by: Duration,
    },
    /// The leaf may sign certificates: whoever holds its key could mint any identity
    /// under the mesh root. The CA's fault; never used.
    #[error("the CA returned a CA certificate as the workload leaf ({reason}); it was refused")]
    CaLeaf { reason: &'static str },
    /// The leaf's signature does not verify up to the root(s) the CA returned with it
    /// (through the intermediates it sent): peers would refuse it. The CA's fault.
    #[error(
        "the leaf the CA returned does not verify up to the root(s) it returned: {reason}; it was refused"
    )]
    DoesNotChain { reason: String },
    /// The fetch was dropped before it finished (the identity was forgotten meanwhile,
    /// or the fetch task ended without an answer).
    #[error("the certificate fetch for {identity} was abandoned: {reason}")]
    Abandoned {
        identity: String,
        reason: &'static str,
    },
}

impl IssueError {
    /// A short label for the `cause` of a failed fetch in metrics.
    pub fn cause(&self) -> &'static str {
        match self {
            IssueError::Local(_) => "local_ca",
            IssueError::Refused { .. } => "refused",
            IssueError::Unreachable { .. } => "unreachable",
            IssueError::Channel { .. } => "channel",
            IssueError::BadChain { .. } => "bad_chain",
            IssueError::WrongIdentity { .. } => "wrong_identity",
            IssueError::Expired { .. } => "expired",
            IssueError::NotYetValid { .. } => "not_yet_valid",
            IssueError::CaLeaf { .. } => "ca_leaf",
            IssueError::DoesNotChain { .. } => "does_not_chain",
            IssueError::Abandoned { .. } => "abandoned",
        }
    }
}

/// A duration as `2h0m5s` (whole seconds), or in milliseconds below a second.
pub(crate) fn human(d: Duration) -> String {
    let secs = d.as_secs();
    if secs == 0 {
        return format!("{}ms", d.as_millis());
    }
    let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
    match (h, m) {
        (0, 0) => format!("{s}s"),
        (0, _) => format!("{m}m{s}s"),
        _ => format!("{h}h{m}m{s}s"),
    }
}

/// Failures of [`crate::CertManager`] to produce a certificate or a TLS configuration.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ManagerError {
    /// No certificate: the issuer failed (shared by every caller that waited for it).
    #[error(transparent)]
    Issue(std::sync::Arc<IssueError>),
    #[error(transparent)]
    Tls(std::sync::Arc<TlsError>),
}

impl From<TlsError> for ManagerError {
    fn from(e: TlsError) -> Self {
        ManagerError::Tls(std::sync::Arc::new(e))
    }
}

impl From<IssueError> for ManagerError {
    fn from(e: IssueError) -> Self {
        ManagerError::Issue(std::sync::Arc::new(e))
    }
}

/// Why a peer was refused during the handshake (carried inside `rustls::Error`).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PeerError {
    #[error("peer certificate has no SPIFFE URI SAN")]
    NoSpiffeId,
    /// An X.509 SVID carries exactly one SPIFFE id; with several, which one would
    /// authorization see?
    #[error(
        "peer certificate has several SPIFFE URI SANs {found:?}; an SVID must have exactly one"
    )]
    SeveralSpiffeIds { found: Vec<String> },
    /// The one `spiffe:` URI SAN is not a valid id: the peer's CA issued a bad certificate.
    #[error("peer certificate's SPIFFE URI SAN {uri:?} is malformed: {reason}")]
    MalformedSpiffeId {
        uri: String,
        #[source]
        reason: SpiffeError,
    },
    #[error("peer certificate cannot be parsed: {reason}")]
    BadCertificate { reason: String },
    #[error("server identities {found:?} are not among the expected {expected:?}")]
    UnexpectedServer {
        found: Vec<String>,
        expected: Vec<String>,
    },
    #[error("client identities {found:?} are not in trust domain {trust_domain:?}")]
    ForeignTrustDomain {
        found: Vec<String>,
        trust_domain: String,
    },
}
