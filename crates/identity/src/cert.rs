//! A workload's certificate, key and trust anchors, and its `/config_dump` view.

use std::time::{Duration, SystemTime};

use base64::Engine;
use rustls::pki_types::{CertificateDer, PrivatePkcs8KeyDer};
use serde::Serialize;

use crate::error::{CertError, PeerError};
use crate::pem;
use crate::spiffe::{has_spiffe_scheme, SpiffeId};
use crate::x509;

/// Everything a workload needs for mTLS.
#[derive(Debug)]
pub struct WorkloadCertificate {
    pub identity: SpiffeId,
    /// Leaf first, then intermediates; never the root.
    pub chain: Vec<CertificateDer<'static>>,
    pub key: PrivatePkcs8KeyDer<'static>,
    /// Trust anchors for verifying peers.
    pub roots: Vec<CertificateDer<'static>>,
    pub not_before: SystemTime,
    pub not_after: SystemTime,
}

impl WorkloadCertificate {
    /// Assembles a certificate from its parts, reading the validity from the leaf and checking
    /// that the leaf is an SVID for `identity` (exactly one SPIFFE id) and carries `key`.
    pub fn new(
        identity: SpiffeId,
        chain: Vec<CertificateDer<'static>>,
        key: PrivatePkcs8KeyDer<'static>,
        roots: Vec<CertificateDer<'static>>,
    ) -> Result<Self, CertError> {
        let leaf = chain.first().ok_or(CertError::EmptyChain)?;
        if roots.is_empty() {
            return Err(CertError::NoRoots);
        }
        let parsed = x509::parse(leaf).map_err(|reason| CertError::Parse { index: 0, reason })?;
        let (not_before, not_after) = x509::validity(&parsed);
        // The leaf must be the SVID peers will accept (exactly one SPIFFE id, `identity`)
        // and must carry our key, whoever issued it.
        match svid_identity(leaf) {
            Ok(found) if found == identity => {}
            Ok(found) => {
                return Err(CertError::IdentityMismatch {
                    expected: identity.to_string(),
                    found: found.to_string(),
                })
            }
            Err(PeerError::NoSpiffeId) => {
                return Err(CertError::NoSpiffeId {
                    found: x509::uri_sans(&parsed)
                        .iter()
                        .map(|u| u.to_string())
                        .collect(),
                })
            }
            Err(e) => {
                return Err(CertError::IdentityMismatch {
                    expected: identity.to_string(),
                    found: e.to_string(),
                })
            }
        }
        let pair = rcgen::KeyPair::try_from(key.secret_pkcs8_der())
            .map_err(|e| CertError::Key(e.to_string()))?;
        if parsed.public_key().subject_public_key.data.as_ref() != pair.public_key_raw() {
            return Err(CertError::KeyMismatch);
        }
        for (index, der) in chain.iter().enumerate().skip(1) {
            x509::parse(der).map_err(|reason| CertError::Parse { index, reason })?;
        }
        Ok(WorkloadCertificate {
            identity,
            chain,
            key,
            roots,
            not_before,
            not_after,
        })
    }

    /// Assembles a certificate from an Istio CA response (`cert_chain`: leaf, intermediates,
    /// and as the last element the root(s), possibly several concatenated) and the PKCS#8 key
    /// that signed the CSR.
    pub fn from_ca_response(
        identity: SpiffeId,
        key: PrivatePkcs8KeyDer<'static>,
        cert_chain: &[String],
    ) -> Result<Self, CertError> {
        let Some((root_pem, chain_pems)) = cert_chain.split_last() else {
            return Err(CertError::EmptyChain);
        };
        if chain_pems.is_empty() {
            // A single element cannot carry both a leaf and its roots.
            return Err(CertError::NoRoots);
        }
        let mut chain = Vec::with_capacity(chain_pems.len());
        for p in chain_pems {
            chain.extend(pem::parse_certs(p.as_bytes()).map_err(CertError::Pem)?);
        }
        let roots = pem::parse_certs(root_pem.as_bytes()).map_err(CertError::Pem)?;
        Self::new(identity, chain, key, roots)
    }

    /// The leaf certificate, if the chain is not empty.
    pub fn leaf(&self) -> Option<&CertificateDer<'static>> {
        self.chain.first()
    }

    /// When to renew: half way through the validity period.
    pub fn renew_at(&self) -> SystemTime {
        let lifetime = self
            .not_after
            .duration_since(self.not_before)
            .unwrap_or(Duration::ZERO);
        self.not_before + lifetime / 2
    }

    /// Whether the certificate is outside its validity period at `now`.
    pub fn is_expired_at(&self, now: SystemTime) -> bool {
        now >= self.not_after
    }

    /// The private key as PKCS#8 PEM.
    pub fn key_pem(&self) -> String {
        pem::encode("PRIVATE KEY", self.key.secret_pkcs8_der())
    }

    /// The chain (leaf first) as concatenated PEM.
    pub fn chain_pem(&self) -> String {
        pem::certs_pem(&self.chain)
    }

    /// The shape ztunnel shows under `certificates` in `/config_dump`.
    pub fn dump(&self) -> CertificateDump {
        CertificateDump {
            identity: self.identity.to_string(),
            state: "Available".to_owned(),
            cert_chain: self.chain.iter().map(|c| CertInfo::of(c)).collect(),
            root_certs: self.roots.iter().map(|c| CertInfo::of(c)).collect(),
        }
    }
}

/// One identity's certificates as shown in `/config_dump`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CertificateDump {
    pub identity: String,
    pub state: String,
    pub cert_chain: Vec<CertInfo>,
    pub root_certs: Vec<CertInfo>,
}

impl CertificateDump {
    /// An identity without a certificate yet, in `state` (`Initializing`, `Unavailable: ...`).
    pub fn pending(identity: &SpiffeId, state: String) -> CertificateDump {
        CertificateDump {
            identity: identity.to_string(),
            state,
            cert_chain: Vec::new(),
            root_certs: Vec::new(),
        }
    }
}

/// One certificate as shown in `/config_dump`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CertInfo {
    /// Base64 of the PEM text.
    pub pem: String,
    /// In decimal, as ztunnel shows it.
    pub serial_number: String,
    /// RFC 3339, UTC.
    pub valid_from: String,
    /// RFC 3339, UTC.
    pub expiration_time: String,
}

impl CertInfo {
    /// Describes a DER certificate; fields that cannot be read are left empty.
    pub fn of(der: &CertificateDer<'_>) -> CertInfo {
        let pem = base64::engine::general_purpose::STANDARD.encode(pem::cert_pem(der));
        match x509::parse(der) {
            Ok(cert) => {
                let (from, to) = x509::validity(&cert);
                CertInfo {
                    pem,
                    serial_number: cert.serial.to_str_radix(10),
                    valid_from: x509::rfc3339(from),
                    expiration_time: x509::rfc3339(to),
                }
            }
            Err(_) => CertInfo {
                pem,
                serial_number: String::new(),
                valid_from: String::new(),
                expiration_time: String::new(),
            },
        }
    }
}

/// The SPIFFE id of an X.509 SVID (a peer's leaf certificate).
///
/// An SVID carries exactly one SPIFFE id. Every URI SAN whose scheme is `spiffe`, in any
/// letter case, counts toward that one, valid or not: a malformed `spiffe:` URI next to a
/// good one makes the certificate ambiguous and it is refused, never accepted on the good
/// one. URIs of other schemes and other SAN types are ignored.
pub fn svid_identity(cert: &CertificateDer<'_>) -> Result<SpiffeId, PeerError> {
    let parsed = x509::parse(cert).map_err(|reason| PeerError::BadCertificate { reason })?;
    let claims: Vec<&str> = x509::uri_sans(&parsed)
        .into_iter()
        .filter(|u| has_spiffe_scheme(u))
        .collect();
    match claims.as_slice() {
        [] => Err(PeerError::NoSpiffeId),
        [uri] => SpiffeId::parse(uri).map_err(|reason| PeerError::MalformedSpiffeId {
            uri: shorten(uri),
            reason,
        }),
        several => Err(PeerError::SeveralSpiffeIds {
            found: several.iter().map(|u| shorten(u)).collect(),
        }),
    }
}

/// A peer-supplied URI as quoted in an error: at most 256 characters.
fn shorten(uri: &str) -> String {
    uri.chars().take(256).collect()
}

/// URI SANs of a DER certificate that parse as SPIFFE ids (invalid ones ignored). For
/// diagnostics; to learn a peer's identity use [`svid_identity`].
pub fn spiffe_ids_of(cert: &CertificateDer<'_>) -> Vec<SpiffeId> {
    match x509::parse(cert) {
        Ok(c) => x509::uri_sans(&c)
            .into_iter()
            .filter_map(|u| SpiffeId::parse(u).ok())
            .collect(),
        Err(_) => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ca::CertificateAuthority;
    use crate::testutil::id;

    const HOUR: Duration = Duration::from_secs(3600);

    #[test]
    fn a_leaf_peers_would_refuse_or_for_another_key_is_not_assembled() {
        let ours = id("spiffe://cluster.local/ns/a/sa/b");
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let leaf_with = |uris: &[&str], signing: &rcgen::KeyPair| {
            let mut p = rcgen::CertificateParams::default();
            p.subject_alt_names = uris
                .iter()
                .map(|u| rcgen::SanType::URI((*u).try_into().unwrap()))
                .collect();
            p.self_signed(signing).unwrap().der().clone()
        };
        let pkcs8 = || PrivatePkcs8KeyDer::from(key.serialize_der());
        let build = |leaf: CertificateDer<'static>| {
            WorkloadCertificate::new(ours.clone(), vec![leaf.clone()], pkcs8(), vec![leaf])
        };
        // Ours first, then a second SPIFFE id: every peer would refuse this SVID.
        let two = leaf_with(
            &[
                "spiffe://cluster.local/ns/a/sa/b",
                "spiffe://cluster.local/ns/x/sa/y",
            ],
            &key,
        );
        assert!(matches!(
            build(two),
            Err(CertError::IdentityMismatch { .. })
        ));
        // The right identity, but another key than the one we hold.
        let other = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let foreign = leaf_with(&["spiffe://cluster.local/ns/a/sa/b"], &other);
        assert!(matches!(build(foreign), Err(CertError::KeyMismatch)));
        let good = leaf_with(&["spiffe://cluster.local/ns/a/sa/b"], &key);
        assert_eq!(build(good).unwrap().identity, ours);
    }

    #[test]
    fn dump_has_ztunnel_shape() {
        let ca = CertificateAuthority::ephemeral("cluster.local").unwrap();
        let cert = ca
            .issue(&id("spiffe://cluster.local/ns/default/sa/web"), HOUR)
            .unwrap();
        let json = serde_json::to_value(cert.dump()).unwrap();
        assert_eq!(json["identity"], "spiffe://cluster.local/ns/default/sa/web");
        assert_eq!(json["state"], "Available");
        let chain = json["certChain"].as_array().unwrap();
        let roots = json["rootCerts"].as_array().unwrap();
        assert_eq!((chain.len(), roots.len()), (1, 1));
        let leaf = chain[0].as_object().unwrap();
        let mut keys: Vec<_> = leaf.keys().cloned().collect();
        keys.sort();
        assert_eq!(keys, ["expirationTime", "pem", "serialNumber", "validFrom"]);
        let pem_text = base64::engine::general_purpose::STANDARD
            .decode(leaf["pem"].as_str().unwrap())
            .unwrap();
        let pem_text = String::from_utf8(pem_text).unwrap();
        assert!(pem_text.starts_with("-----BEGIN CERTIFICATE-----\n"));
        assert_eq!(pem::parse_certs(pem_text.as_bytes()).unwrap(), cert.chain);
        let parsed = x509::parse(&cert.chain[0]).unwrap();
        let serial = leaf["serialNumber"].as_str().unwrap();
        // Decimal, as ztunnel writes it.
        assert_eq!(serial, parsed.serial.to_str_radix(10));
        assert!(serial.chars().all(|c| c.is_ascii_digit()), "{serial}");
        assert_eq!(leaf["validFrom"], x509::rfc3339(cert.not_before));
        assert_eq!(leaf["expirationTime"], x509::rfc3339(cert.not_after));
        let valid_from = leaf["validFrom"].as_str().unwrap();
        assert!(
            time::OffsetDateTime::parse(valid_from, &time::format_description::well_known::Rfc3339)
                .is_ok()
                && valid_from.ends_with('Z'),
            "{valid_from}"
        );
    }

    #[test]
    fn from_ca_response_splits_chain_and_roots() {
        let ca = CertificateAuthority::ephemeral("td").unwrap();
        let other = CertificateAuthority::ephemeral("td").unwrap();
        let wid = id("spiffe://td/ns/a/sa/b");
        let issued = ca.issue(&wid, HOUR).unwrap();
        let response = vec![
            pem::cert_pem(&issued.chain[0]),
            ca.root_pem() + &other.root_pem(),
        ];
        let cert =
            WorkloadCertificate::from_ca_response(wid.clone(), issued.key.clone_key(), &response)
                .unwrap();
        assert_eq!(cert.chain, issued.chain);
        assert_eq!(cert.roots.len(), 2);
        assert_eq!(cert.not_after, issued.not_after);
        // The CA answered for someone else.
        let e = WorkloadCertificate::from_ca_response(
            id("spiffe://td/ns/a/sa/c"),
            issued.key.clone_key(),
            &response,
        )
        .unwrap_err();
        assert!(matches!(e, CertError::IdentityMismatch { .. }), "{e}");
        assert!(matches!(
            WorkloadCertificate::from_ca_response(wid.clone(), issued.key.clone_key(), &[]),
            Err(CertError::EmptyChain)
        ));
        assert!(matches!(
            WorkloadCertificate::from_ca_response(
                wid.clone(),
                issued.key.clone_key(),
                &response[..1]
            ),
            Err(CertError::NoRoots)
        ));
        let garbage = vec!["junk".to_owned(), ca.root_pem()];
        assert!(matches!(
            WorkloadCertificate::from_ca_response(wid, issued.key.clone_key(), &garbage),
            Err(CertError::EmptyChain)
        ));
    }

    #[test]
    fn spiffe_ids_ignore_other_and_invalid_uris() {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::default();
        params.subject_alt_names = vec![
            rcgen::SanType::URI("https://example.com/".try_into().unwrap()),
            rcgen::SanType::URI("spiffe://BAD/ns/a/sa/b".try_into().unwrap()),
            rcgen::SanType::DnsName("example.com".try_into().unwrap()),
            rcgen::SanType::URI("spiffe://td/ns/a/sa/b".try_into().unwrap()),
            rcgen::SanType::URI("spiffe://td/ns/a/sa/b/extra".try_into().unwrap()),
            rcgen::SanType::URI("spiffe://td2/ns/c/sa/d".try_into().unwrap()),
        ];
        let cert = params.self_signed(&key).unwrap();
        assert_eq!(
            spiffe_ids_of(cert.der()),
            vec![id("spiffe://td/ns/a/sa/b"), id("spiffe://td2/ns/c/sa/d")]
        );
        // Two valid ids: not an SVID, so no identity at all rather than the first one.
        assert_eq!(
            crate::tls::peer_identity(Some(std::slice::from_ref(cert.der()))),
            None
        );
        assert!(spiffe_ids_of(&CertificateDer::from(vec![0x30, 0x00])).is_empty());
        let no_san = rcgen::CertificateParams::default()
            .self_signed(&key)
            .unwrap();
        assert!(spiffe_ids_of(no_san.der()).is_empty());
    }

    fn cert_with_uris(uris: &[&str]) -> CertificateDer<'static> {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::default();
        params.subject_alt_names = uris
            .iter()
            .map(|u| rcgen::SanType::URI((*u).try_into().unwrap()))
            .chain([rcgen::SanType::DnsName("example.com".try_into().unwrap())])
            .collect();
        params.self_signed(&key).unwrap().der().clone()
    }

    #[test]
    fn svid_identity_counts_every_spiffe_uri() {
        let good = "spiffe://td/ns/a/sa/b";
        let ok = |uris: &[&str]| svid_identity(&cert_with_uris(uris)).map_err(|e| e.to_string());
        assert_eq!(ok(&[good]), Ok(id(good)));
        assert_eq!(ok(&["https://example.com/", good, "urn:x"]), Ok(id(good)));
        // A malformed spiffe URI beside a good one: ambiguous, refused.
        for other in [
            "spiffe://td/ns/a/sa/b/extra",
            "spiffe://td/ns/a%41/sa/b",
            "spiffe://TD/ns/a/sa/b",
            "SPIFFE://td/ns/a/sa/c",
            "Spiffe://td/ns/a/sa/b",
            "spiffe:td",
        ] {
            for uris in [[good, other], [other, good]] {
                let e = svid_identity(&cert_with_uris(&uris)).unwrap_err();
                assert!(
                    matches!(&e, PeerError::SeveralSpiffeIds { found } if found.len() == 2),
                    "{uris:?}: {e}"
                );
            }
        }
        // The only spiffe URI is malformed (an upper-case scheme included).
        for bad in ["SPIFFE://td/ns/a/sa/b", "spiffe://td/ns/../sa/b"] {
            let e = svid_identity(&cert_with_uris(&[bad])).unwrap_err();
            assert!(
                matches!(e, PeerError::MalformedSpiffeId { .. }),
                "{bad}: {e}"
            );
            assert!(e.to_string().contains(bad), "{e}");
        }
        assert!(matches!(
            svid_identity(&cert_with_uris(&["https://example.com/"])),
            Err(PeerError::NoSpiffeId)
        ));
        assert!(matches!(
            svid_identity(&CertificateDer::from(vec![0x30, 0x00])),
            Err(PeerError::BadCertificate { .. })
        ));
    }

    #[test]
    fn renew_at_is_half_life() {
        let ca = CertificateAuthority::ephemeral("td").unwrap();
        let mut cert = ca.issue(&id("spiffe://td/ns/a/sa/b"), HOUR).unwrap();
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
        cert.not_before = t0;
        cert.not_after = t0 + Duration::from_secs(100);
        assert_eq!(cert.renew_at(), t0 + Duration::from_secs(50));
        // A nonsensical validity does not panic.
        cert.not_after = t0 - Duration::from_secs(100);
        assert_eq!(cert.renew_at(), t0);
        assert!(cert.is_expired_at(t0));
    }
}
