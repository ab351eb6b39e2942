//! PEM text in and out.

use base64::Engine;
use rustls::pki_types::CertificateDer;

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
    rustls_pemfile::certs(&mut &text[..])
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())
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
}
