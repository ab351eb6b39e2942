//! The `ca_dir` target: the CA directory's PEM files (`LOCAL_CA_DIR`, Istio's plug-in
//! layout), certificate chains and the signing key, parsed and cross-checked from bytes.

use std::path::Path;
use std::time::Duration;

use ambit_identity::pem::{certs_pem, parse_certs, parse_private_key};
use ambit_identity::{peer_identity, CertificateAuthority, PluginCaPem, SpiffeId};

/// What the directory came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The CA loaded, and a leaf it issued carries the id asked for.
    Signed,
    /// The CA loaded but did not issue a leaf.
    Loaded,
    /// The CA was refused (the error's variant).
    Refused(String),
}

/// The four files `ca-cert.pem`, `ca-key.pem`, `root-cert.pem`, `cert-chain.pem`, separated
/// by NUL bytes (PEM text never holds one); missing parts are empty files.
///
/// Checks: certificates that parse re-encode (`certs_pem`) to the same certificates; a CA
/// that loads has roots, its `ca_cert` is the one of `ca-cert.pem`, and a leaf it issues
/// carries the id asked for.
pub fn run(data: &[u8]) -> Outcome {
    let mut parts = data.splitn(4, |b| *b == 0);
    let mut next = || parts.next().unwrap_or_default();
    let (ca_cert, ca_key, root_cert, cert_chain) = (next(), next(), next(), next());

    // The PEM readers alone: whatever parses re-encodes to the same certificates.
    for file in [ca_cert, root_cert, cert_chain] {
        if let Ok(certs) = parse_certs(file) {
            assert_eq!(parse_certs(certs_pem(&certs).as_bytes()), Ok(certs));
        }
    }
    let _ = parse_private_key(ca_key);

    // The whole directory: a CA that loads can sign, and its leaves carry the id asked for.
    let files = PluginCaPem {
        ca_cert,
        ca_key,
        root_cert,
        cert_chain,
    };
    let ca = match CertificateAuthority::from_plugin_pem(Path::new("ca"), files) {
        Ok(ca) => ca,
        Err(e) => return Outcome::Refused(crate::variant(&e)),
    };
    assert!(!ca.roots().is_empty());
    assert_eq!(
        parse_certs(ca_cert).ok().as_deref(),
        Some(std::slice::from_ref(ca.ca_cert()))
    );
    let id = SpiffeId::new("cluster.local", "fuzz", "fuzz").expect("a valid id");
    match ca.issue(&id, Duration::from_secs(3600)) {
        Ok(leaf) => {
            assert_eq!(peer_identity(Some(&leaf.chain)), Some(id));
            Outcome::Signed
        }
        Err(_) => Outcome::Loaded,
    }
}
