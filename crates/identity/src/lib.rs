//! Workload identity for ambit: SPIFFE ids, workload certificates, a local CA, the rustls
//! configurations HBONE uses, and a per-identity certificate cache.
#![forbid(unsafe_code)]

pub mod ca;
pub mod cert;
pub mod csr;
pub mod error;
pub mod manager;
pub mod pem;
pub mod spiffe;
pub mod tls;

mod issued;
mod leaf;
mod verify;
mod x509;

#[cfg(test)]
mod testutil;

pub use ca::{requested_identity, CertificateAuthority, CsrError, PluginCaPem, SignedCertificate};
pub use cert::{spiffe_ids_of, svid_identity, CertInfo, CertificateDump, WorkloadCertificate};
pub use csr::CertificateRequest;
pub use error::{CaError, CertError, IssueError, ManagerError, PeerError, TlsError};
pub use manager::{CertManager, Clock, IssueFuture, Issuer, Priority, MAX_IN_FLIGHT};
pub use spiffe::{has_spiffe_scheme, SpiffeError, SpiffeId};
pub use tls::{
    client_config, crypto_provider, peer_identity, placeholder_server_name, server_config,
    spiffe_server_verifier,
};
