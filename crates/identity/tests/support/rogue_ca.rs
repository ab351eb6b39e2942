//! A CA for tests that signs workload leaves with one chosen defect (expired, not yet
//! valid, CA:TRUE, keyCertSign, under a root it does not return, under an expired
//! intermediate) or none. rcgen and std only, so that ambit-identity's unit tests,
//! ambit-caclient's tests and the `ambit` binary's tests share it through `#[path]`.
#![allow(dead_code)]

use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, CustomExtension, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose, PublicKeyData,
};

const HOUR: Duration = Duration::from_secs(3600);
const DAY: Duration = Duration::from_secs(86400);

/// What is wrong with a leaf.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Defect {
    /// Nothing: valid from a minute ago for an hour, signed by the root.
    None,
    /// Signed by an intermediate that is sent along (nothing wrong either).
    ViaIntermediate,
    /// Valid from 3 h ago to 2 h ago.
    Expired,
    /// Valid from 2 h ahead.
    NotYetValid,
    /// Valid from 30 s ahead (inside a minute's clock-skew allowance).
    SlightlyAhead,
    /// basicConstraints CA:TRUE.
    CaTrue,
    /// CA:FALSE but keyUsage keyCertSign.
    KeyCertSign,
    /// Signed by a root other than the one returned.
    ForeignRoot,
    /// Signed by an intermediate that expired yesterday (sent along).
    ExpiredIntermediate,
    /// Nothing wrong, but valid from a second ago for a second (due for renewal at once).
    ShortLived,
}

impl Defect {
    pub const ALL_BAD: [Defect; 6] = [
        Defect::Expired,
        Defect::NotYetValid,
        Defect::CaTrue,
        Defect::KeyCertSign,
        Defect::ForeignRoot,
        Defect::ExpiredIntermediate,
    ];
}

/// One certificate, both encodings.
#[derive(Clone, Debug)]
pub struct Cert {
    pub der: Vec<u8>,
    pub pem: String,
}

impl Cert {
    fn of(c: &rcgen::Certificate) -> Cert {
        Cert {
            der: c.der().to_vec(),
            pem: c.pem(),
        }
    }
}

/// A signed leaf: the chain (leaf first, then what intermediates were used) and the
/// root(s) a CA would return with it.
#[derive(Clone, Debug)]
pub struct Issued {
    pub chain: Vec<Cert>,
    pub roots: Vec<Cert>,
}

impl Issued {
    /// The shape of Istio's `IstioCertificateResponse.cert_chain`: leaf, intermediates,
    /// and last the roots concatenated.
    pub fn cert_chain(&self) -> Vec<String> {
        let mut out: Vec<String> = self.chain.iter().map(|c| c.pem.clone()).collect();
        out.push(self.roots.iter().map(|c| c.pem.as_str()).collect());
        out
    }
}

struct Signer {
    cert: rcgen::Certificate,
    key: KeyPair,
}

/// A root, a second root it never returns, and two intermediates under the root (one
/// valid, one expired).
pub struct RogueCa {
    root: Signer,
    foreign: Signer,
    intermediate: Signer,
    expired_intermediate: Signer,
}

fn key() -> KeyPair {
    KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap()
}

fn ca_params(name: &str, not_before: SystemTime, not_after: SystemTime) -> CertificateParams {
    let mut p = CertificateParams::default();
    p.distinguished_name = DistinguishedName::new();
    p.distinguished_name
        .push(DnType::OrganizationName, "cluster.local");
    p.distinguished_name.push(DnType::CommonName, name);
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    p.not_before = not_before.into();
    p.not_after = not_after.into();
    p
}

fn make_root(name: &str, now: SystemTime) -> Signer {
    let key = key();
    let cert = ca_params(name, now - 30 * DAY, now + 30 * DAY)
        .self_signed(&key)
        .unwrap();
    Signer { cert, key }
}

fn make_intermediate(
    name: &str,
    parent: &Signer,
    not_before: SystemTime,
    not_after: SystemTime,
) -> Signer {
    let key = key();
    let cert = ca_params(name, not_before, not_after)
        .signed_by(&key, &parent.cert, &parent.key)
        .unwrap();
    Signer { cert, key }
}

impl RogueCa {
    pub fn new() -> RogueCa {
        let now = SystemTime::now();
        let root = make_root("rogue root", now);
        let foreign = make_root("foreign root", now);
        let intermediate =
            make_intermediate("rogue intermediate", &root, now - 10 * DAY, now + 10 * DAY);
        let expired_intermediate =
            make_intermediate("expired intermediate", &root, now - 10 * DAY, now - DAY);
        RogueCa {
            root,
            foreign,
            intermediate,
            expired_intermediate,
        }
    }

    /// The root this CA returns.
    pub fn root(&self) -> Cert {
        Cert::of(&self.root.cert)
    }

    /// A leaf for `public_key` with the one URI SAN `spiffe_uri`, shaped like a workload
    /// certificate (critical SAN, empty subject, both EKUs) apart from `defect`.
    pub fn sign(
        &self,
        public_key: &impl PublicKeyData,
        spiffe_uri: &str,
        defect: Defect,
        now: SystemTime,
    ) -> Issued {
        let (not_before, not_after) = match defect {
            Defect::Expired => (now - 3 * HOUR, now - 2 * HOUR),
            Defect::NotYetValid => (now + 2 * HOUR, now + 3 * HOUR),
            Defect::SlightlyAhead => (now + Duration::from_secs(30), now + HOUR),
            Defect::ShortLived => (now - Duration::from_secs(1), now + Duration::from_secs(1)),
            _ => (now - Duration::from_secs(60), now + HOUR),
        };
        let mut p = CertificateParams::default();
        p.distinguished_name = DistinguishedName::new();
        let mut san =
            CustomExtension::from_oid_content(&[2, 5, 29, 17], general_name_uri(spiffe_uri));
        san.set_criticality(true);
        p.custom_extensions = vec![san];
        p.not_before = not_before.into();
        p.not_after = not_after.into();
        p.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        p.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        match defect {
            Defect::CaTrue => p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained),
            Defect::KeyCertSign => p.key_usages.push(KeyUsagePurpose::KeyCertSign),
            _ => {}
        }
        let signer = match defect {
            Defect::ForeignRoot => &self.foreign,
            Defect::ViaIntermediate => &self.intermediate,
            Defect::ExpiredIntermediate => &self.expired_intermediate,
            _ => &self.root,
        };
        let leaf = p.signed_by(public_key, &signer.cert, &signer.key).unwrap();
        let mut chain = vec![Cert::of(&leaf)];
        if !std::ptr::eq(signer, &self.root) && !std::ptr::eq(signer, &self.foreign) {
            chain.push(Cert::of(&signer.cert));
        }
        Issued {
            chain,
            roots: vec![self.root()],
        }
    }
}

impl Default for RogueCa {
    fn default() -> Self {
        RogueCa::new()
    }
}

/// `GeneralNames` holding one uniformResourceIdentifier (short URIs only: one-byte lengths).
fn general_name_uri(uri: &str) -> Vec<u8> {
    let len = u8::try_from(uri.len())
        .ok()
        .filter(|l| *l < 0x80 - 2)
        .expect("a short URI");
    let mut out = vec![0x30, len + 2, 0x86, len];
    out.extend_from_slice(uri.as_bytes());
    out
}
