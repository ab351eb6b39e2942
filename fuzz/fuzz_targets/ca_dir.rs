//! The CA directory's PEM files (`LOCAL_CA_DIR`, Istio's plug-in layout): certificate
//! chains and the signing key, parsed and cross-checked from bytes.
//!
//! Input: the four files' contents separated by NUL bytes, in the order `ca-cert.pem`,
//! `ca-key.pem`, `root-cert.pem`, `cert-chain.pem` (PEM text never holds a NUL); missing
//! parts are empty files.
#![no_main]

use std::path::Path;
use std::time::Duration;

use ambit_identity::pem::{certs_pem, parse_certs, parse_private_key};
use ambit_identity::{peer_identity, CertificateAuthority, PluginCaPem, SpiffeId};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
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
    let Ok(ca) = CertificateAuthority::from_plugin_pem(Path::new("ca"), files) else {
        return;
    };
    assert!(!ca.roots().is_empty());
    assert_eq!(
        parse_certs(ca_cert).ok().as_deref(),
        Some(std::slice::from_ref(ca.ca_cert()))
    );
    let id = SpiffeId::new("cluster.local", "fuzz", "fuzz").unwrap();
    if let Ok(leaf) = ca.issue(&id, Duration::from_secs(3600)) {
        assert_eq!(peer_identity(Some(&leaf.chain)), Some(id));
    }
});
