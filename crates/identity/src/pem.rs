//! PEM text in and out.

use base64::Engine;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{pem, CertificateDer, PrivateKeyDer};

/// Encodes DER as a PEM block with 64-character lines.
pub fn encode(label: &str, der: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = String::with_capacity(b64.len() + b64.len() / 64 + 2 * label.len() + 40);
    out.push_str("-----BEGIN ");
    out.push_str(label);
    out.push_str("-----\n");
    for line in b64.as_bytes().chunks(64) {
        // base64 output is ASCII, so every chunk is valid UTF-8.
        out.push_str(std::str::from_utf8(line).unwrap_or_default());
        out.push('\n');
    }
    out.push_str("-----END ");
    out.push_str(label);
    out.push_str("-----\n");
    out
}

/// PEM of one certificate.
pub fn cert_pem(der: &CertificateDer<'_>) -> String {
    encode("CERTIFICATE", der)
}

/// PEM of several certificates, concatenated.
pub fn certs_pem(ders: &[CertificateDer<'_>]) -> String {
    ders.iter().map(|d| cert_pem(d)).collect()
}

/// Every `CERTIFICATE` block of `text` (other blocks are skipped). Errors on malformed PEM.
pub fn parse_certs(text: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    CertificateDer::pem_slice_iter(text)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())
}

/// The first private key of `text` (PKCS#8, PKCS#1 RSA or SEC1 EC; other blocks are
/// skipped), `None` when there is none. Errors on malformed PEM.
pub fn parse_private_key(text: &[u8]) -> Result<Option<PrivateKeyDer<'static>>, String> {
    match PrivateKeyDer::from_pem_slice(text) {
        Ok(key) => Ok(Some(key)),
        Err(pem::Error::NoItemsFound) => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let der: Vec<u8> = (0..200u8).collect();
        let pem = encode("CERTIFICATE", &der);
        assert!(pem.starts_with("-----BEGIN CERTIFICATE-----\n"));
        assert!(pem.lines().all(|l| l.len() <= 64));
        let back = parse_certs(pem.as_bytes()).unwrap();
        assert_eq!(back, vec![CertificateDer::from(der)]);
        assert!(parse_certs(b"not pem").unwrap().is_empty());
    }

    #[test]
    fn private_keys() {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert_block = encode("CERTIFICATE", &[1, 2, 3]);
        // Blocks of other kinds before the key are skipped.
        let text = cert_block.clone() + &key.serialize_pem();
        match parse_private_key(text.as_bytes()).unwrap() {
            Some(PrivateKeyDer::Pkcs8(der)) => {
                assert_eq!(der.secret_pkcs8_der(), key.serialize_der())
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(parse_private_key(b"not pem").unwrap(), None);
        assert_eq!(parse_private_key(cert_block.as_bytes()).unwrap(), None);
        let bad = "-----BEGIN PRIVATE KEY-----\nnot base64!\n-----END PRIVATE KEY-----\n";
        assert!(parse_private_key(bad.as_bytes()).is_err());
        let unterminated = "-----BEGIN PRIVATE KEY-----\naGVsbG8=\n";
        assert!(parse_private_key(unterminated.as_bytes()).is_err());
    }
}
