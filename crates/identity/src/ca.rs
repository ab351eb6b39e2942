//! A local certificate authority that mints workload certificates from a root you give it
//! (Istio's plug-in CA directory layout) or from an ephemeral root it makes itself.
//!
//! This is ambit's additive feature: a mesh without an external CA. On Kubernetes the
//! node proxy asks istiod instead.

use std::fmt;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
use rustls::pki_types::{CertificateDer, PrivatePkcs8KeyDer, UnixTime};
use rustls::RootCertStore;

use crate::cert::WorkloadCertificate;
use crate::error::{CaError, CertError};
use crate::leaf;
use crate::pem;
use crate::spiffe::{validate_trust_domain, SpiffeId};
use crate::x509;

mod sign;
pub use sign::{requested_identity, CsrError, SignedCertificate};

/// The signing certificate.
pub const CA_CERT_FILE: &str = "ca-cert.pem";
/// The signing key (PKCS#8; PKCS#1 RSA and SEC1 EC keys are accepted too).
pub const CA_KEY_FILE: &str = "ca-key.pem";
/// The trust anchor(s).
pub const ROOT_CERT_FILE: &str = "root-cert.pem";
/// The chain from the signing certificate up to the root, both included.
pub const CERT_CHAIN_FILE: &str = "cert-chain.pem";

/// Clock skew allowance: leaves are valid from one minute in the past (at most half the
/// requested lifetime, so that very short test lifetimes keep a renewal window).
const BACKDATE: Duration = Duration::from_secs(60);
/// Lifetime of an ephemeral root.
const EPHEMERAL_ROOT_LIFETIME: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// A certificate authority that signs workload leaves.
pub struct CertificateAuthority {
    /// Issuer name and key identifier, as rcgen needs them to sign.
    issuer: rcgen::Certificate,
    key: KeyPair,
    /// The key as it should be written back (the loaded file verbatim, or PKCS#8 PEM).
    key_pem: String,
    ca_cert: CertificateDer<'static>,
    /// cert-chain.pem as given.
    cert_chain: Vec<CertificateDer<'static>>,
    /// cert-chain.pem without the root(s): appended to every leaf.
    intermediates: Vec<CertificateDer<'static>>,
    roots: Vec<CertificateDer<'static>>,
    /// Whether leaves carry an authority key identifier (only when ca-cert has a subject key id).
    authority_key_id: bool,
    not_after: SystemTime,
}

impl fmt::Debug for CertificateAuthority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertificateAuthority")
            .field("roots", &self.roots.len())
            .field("intermediates", &self.intermediates.len())
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

impl CertificateAuthority {
    /// Loads Istio's plug-in CA layout from `dir` and checks that it can issue certificates
    /// that verify against root-cert.pem.
    ///
    /// The key file must be readable and writable by its owner only ([`CaError::KeyTooOpen`]).
    pub fn from_plugin_dir(dir: &Path) -> Result<Self, CaError> {
        let read = |name: &str| {
            let path = dir.join(name);
            fs::read(&path).map_err(|source| CaError::Read { path, source })
        };
        let ca_cert = read(CA_CERT_FILE)?;
        let ca_key = read_key(&dir.join(CA_KEY_FILE))?;
        let root_cert = read(ROOT_CERT_FILE)?;
        let cert_chain = read(CERT_CHAIN_FILE)?;
        Self::from_plugin_pem(
            dir,
            PluginCaPem {
                ca_cert: &ca_cert,
                ca_key: &ca_key,
                root_cert: &root_cert,
                cert_chain: &cert_chain,
            },
        )
    }

    /// The checks and parsing of [`from_plugin_dir`](Self::from_plugin_dir) on the files'
    /// contents (no file access, no permission check); `dir` only names the files in errors.
    pub fn from_plugin_pem(dir: &Path, files: PluginCaPem<'_>) -> Result<Self, CaError> {
        let ca_cert_path = dir.join(CA_CERT_FILE);
        let key_path = dir.join(CA_KEY_FILE);
        let root_path = dir.join(ROOT_CERT_FILE);
        let chain_path = dir.join(CERT_CHAIN_FILE);

        let ca_certs = parse_cert_file(&ca_cert_path, files.ca_cert)?;
        let [ca_cert] =
            <[_; 1]>::try_from(ca_certs).map_err(|v: Vec<_>| CaError::TooManyCertificates {
                path: ca_cert_path.clone(),
                found: v.len(),
            })?;
        let key_pem = String::from_utf8(files.ca_key.to_vec()).map_err(|_| CaError::Pem {
            path: key_path.clone(),
            reason: "the file is not UTF-8 text".into(),
        })?;
        let roots = parse_cert_file(&root_path, files.root_cert)?;
        let cert_chain = parse_cert_file(&chain_path, files.cert_chain)?;

        let key = parse_key(&key_path, &key_pem)?;
        let parsed = x509::parse(&ca_cert).map_err(|reason| CaError::BadCertificate {
            path: ca_cert_path.clone(),
            index: 0,
            reason,
        })?;
        if parsed.public_key().subject_public_key.data.as_ref() != key.public_key_raw() {
            return Err(CaError::KeyMismatch {
                key_path,
                cert_path: ca_cert_path,
            });
        }
        check_is_ca(&ca_cert_path, &parsed)?;
        check_subject(&ca_cert_path, &parsed)?;
        if cert_chain.first() != Some(&ca_cert) {
            return Err(CaError::ChainStart {
                chain_path,
                ca_cert_path,
            });
        }

        let params =
            CertificateParams::from_ca_cert_der(&ca_cert).map_err(|e| CaError::Unsupported {
                path: ca_cert_path.clone(),
                reason: format!("its extensions or subject are not understood: {e}"),
            })?;
        let authority_key_id = matches!(
            params.key_identifier_method,
            rcgen::KeyIdMethod::PreSpecified(_)
        );
        let issuer = params.self_signed(&key).map_err(|source| CaError::Rcgen {
            context: "preparing the issuer from ca-cert.pem",
            source,
        })?;
        let (_, not_after) = x509::validity(&parsed);
        let intermediates = cert_chain
            .iter()
            .filter(|c| !roots.contains(c))
            .cloned()
            .collect();
        let ca = CertificateAuthority {
            issuer,
            key,
            key_pem,
            ca_cert,
            cert_chain,
            intermediates,
            roots,
            authority_key_id,
            not_after,
        };
        ca.self_check(&ca_cert_path, &chain_path, &root_path)?;
        Ok(ca)
    }

    /// A new self-signed ECDSA P-256 root, valid 10 years, CN "ambit ephemeral root",
    /// O = `trust_domain`.
    pub fn ephemeral(trust_domain: &str) -> Result<Self, CaError> {
        validate_trust_domain(trust_domain).map_err(CaError::TrustDomain)?;
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(|source| {
            CaError::Rcgen {
                context: "generating the root key",
                source,
            }
        })?;
        let now = SystemTime::now();
        let mut params = CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::OrganizationName, trust_domain);
        params
            .distinguished_name
            .push(DnType::CommonName, "ambit ephemeral root");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        params.not_before = x509::to_offset(now - BACKDATE);
        params.not_after = x509::to_offset(now + EPHEMERAL_ROOT_LIFETIME);
        params.serial_number = Some(leaf::random_serial());
        let issuer = params.self_signed(&key).map_err(|source| CaError::Rcgen {
            context: "self-signing the root",
            source,
        })?;
        let root = issuer.der().clone();
        let (_, not_after) = x509::validity_of(&root)
            .map_err(|reason| CaError::Certificate(CertError::Parse { index: 0, reason }))?;
        Ok(CertificateAuthority {
            key_pem: key.serialize_pem(),
            issuer,
            key,
            ca_cert: root.clone(),
            cert_chain: vec![root.clone()],
            intermediates: Vec::new(),
            roots: vec![root],
            authority_key_id: true,
            not_after,
        })
    }

    /// Loads the CA from `dir` if ca-cert.pem exists there; otherwise makes an ephemeral
    /// one and publishes it to `dir` atomically (a directory rename), so that several
    /// processes started together end up sharing one root.
    pub fn load_or_create_plugin_dir(dir: &Path, trust_domain: &str) -> Result<Self, CaError> {
        if dir.join(CA_CERT_FILE).exists() {
            return Self::from_plugin_dir(dir);
        }
        let ca = Self::ephemeral(trust_domain)?;
        let name = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "ca".to_owned());
        let staging = dir.with_file_name(format!(".{name}.staging-{}", unique_suffix()));
        ca.write_plugin_dir(&staging)?;
        match fs::rename(&staging, dir) {
            Ok(()) => Ok(ca),
            Err(_) => {
                // Someone else published first (or dir is a non-empty directory): use theirs.
                let _ = fs::remove_dir_all(&staging);
                Self::from_plugin_dir(dir)
            }
        }
    }

    /// Writes this CA in the plug-in layout. The key file gets mode 0600. Each file is
    /// written to a temporary name and renamed into place, so readers never see half a file.
    pub fn write_plugin_dir(&self, dir: &Path) -> Result<(), CaError> {
        fs::create_dir_all(dir).map_err(|source| CaError::Write {
            path: dir.to_path_buf(),
            source,
        })?;
        write_atomic(&dir.join(CA_KEY_FILE), self.key_pem.as_bytes(), 0o600)?;
        write_atomic(
            &dir.join(CA_CERT_FILE),
            pem::cert_pem(&self.ca_cert).as_bytes(),
            0o644,
        )?;
        write_atomic(
            &dir.join(ROOT_CERT_FILE),
            pem::certs_pem(&self.roots).as_bytes(),
            0o644,
        )?;
        write_atomic(
            &dir.join(CERT_CHAIN_FILE),
            pem::certs_pem(&self.cert_chain).as_bytes(),
            0o644,
        )?;
        Ok(())
    }

    /// Mints a workload certificate for `id` valid for `ttl` (clamped to the CA's own expiry).
    pub fn issue(&self, id: &SpiffeId, ttl: Duration) -> Result<WorkloadCertificate, CaError> {
        self.issue_at(id, ttl, SystemTime::now())
    }

    /// Like [`CertificateAuthority::issue`] with an explicit "now" (for injected clocks).
    pub fn issue_at(
        &self,
        id: &SpiffeId,
        ttl: Duration,
        now: SystemTime,
    ) -> Result<WorkloadCertificate, CaError> {
        let (not_before, not_after) = self.validity(ttl, now)?;
        let key = leaf::new_key()?;
        let params = leaf::leaf_params(id, not_before, not_after, self.authority_key_id);
        let cert = params
            .signed_by(&key, &self.issuer, &self.key)
            .map_err(|source| CaError::Rcgen {
                context: "signing the workload certificate",
                source,
            })?;
        let mut chain = Vec::with_capacity(1 + self.intermediates.len());
        chain.push(cert.der().clone());
        chain.extend(self.intermediates.iter().cloned());
        let key = PrivatePkcs8KeyDer::from(key.serialize_der());
        Ok(WorkloadCertificate::new(
            id.clone(),
            chain,
            key,
            self.roots.clone(),
        )?)
    }

    /// The validity of a certificate asked for `ttl` from `now`: back-dated a little for
    /// clock skew, and never past the CA's own expiry.
    pub(crate) fn validity(
        &self,
        ttl: Duration,
        now: SystemTime,
    ) -> Result<(SystemTime, SystemTime), CaError> {
        if ttl.is_zero() {
            return Err(CaError::InvalidTtl { ttl });
        }
        if now >= self.not_after {
            return Err(CaError::Expired {
                not_after: self.not_after,
            });
        }
        let not_before = now.checked_sub(BACKDATE.min(ttl / 2)).unwrap_or(now);
        let not_after = now
            .checked_add(ttl)
            .map_or(self.not_after, |t| t.min(self.not_after));
        Ok((not_before, not_after))
    }

    /// Mints a TLS *server* certificate (for a control plane's xDS/CA port, not a workload):
    /// DNS and IP SANs and, when given, the server's SPIFFE id as its one URI SAN (clients
    /// that verify a SPIFFE identity, as a waypoint does ambit's control server, look only
    /// at that), `serverAuth` only, a fresh ECDSA P-256 key, valid for `ttl` from
    /// `now` (clamped to the CA's own expiry). Returns the chain (leaf, then the
    /// intermediates), the PKCS#8 key and the leaf's expiry.
    pub fn issue_server_cert(
        &self,
        dns_names: &[String],
        ips: &[std::net::IpAddr],
        spiffe: Option<&SpiffeId>,
        ttl: Duration,
        now: SystemTime,
    ) -> Result<
        (
            Vec<CertificateDer<'static>>,
            PrivatePkcs8KeyDer<'static>,
            SystemTime,
        ),
        CaError,
    > {
        let (not_before, not_after) = self.validity(ttl, now)?;
        let mut params = CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        if let Some(first) = dns_names.first() {
            params.distinguished_name.push(DnType::CommonName, first);
        }
        for name in dns_names {
            let dns =
                rcgen::Ia5String::try_from(name.as_str()).map_err(|source| CaError::Rcgen {
                    context: "a server name that is not an IA5 (ASCII) DNS name",
                    source,
                })?;
            params.subject_alt_names.push(rcgen::SanType::DnsName(dns));
        }
        for ip in ips {
            params
                .subject_alt_names
                .push(rcgen::SanType::IpAddress(*ip));
        }
        if let Some(id) = spiffe {
            let uri =
                rcgen::Ia5String::try_from(id.to_string()).map_err(|source| CaError::Rcgen {
                    context: "a SPIFFE id that is not IA5 (ASCII)",
                    source,
                })?;
            params.subject_alt_names.push(rcgen::SanType::URI(uri));
        }
        params.not_before = x509::to_offset(not_before);
        params.not_after = x509::to_offset(not_after);
        params.serial_number = Some(leaf::random_serial());
        leaf::end_entity(&mut params);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = self.authority_key_id;
        let key = leaf::new_key()?;
        let cert = params
            .signed_by(&key, &self.issuer, &self.key)
            .map_err(|source| CaError::Rcgen {
                context: "signing the server certificate",
                source,
            })?;
        let mut chain = Vec::with_capacity(1 + self.intermediates.len());
        chain.push(cert.der().clone());
        chain.extend(self.intermediates.iter().cloned());
        Ok((
            chain,
            PrivatePkcs8KeyDer::from(key.serialize_der()),
            not_after,
        ))
    }

    /// The trust anchors (root-cert.pem).
    pub fn roots(&self) -> &[CertificateDer<'static>] {
        &self.roots
    }

    /// The trust anchors as concatenated PEM.
    pub fn root_pem(&self) -> String {
        pem::certs_pem(&self.roots)
    }

    /// The signing certificate.
    pub fn ca_cert(&self) -> &CertificateDer<'static> {
        &self.ca_cert
    }

    /// When the signing certificate expires.
    pub fn not_after(&self) -> SystemTime {
        self.not_after
    }

    /// Issues a probe leaf and verifies it the way peers will; this catches a chain that
    /// does not reach root-cert.pem, an expired or not-yet-valid CA, and an issuer name
    /// that rcgen could not reproduce byte for byte.
    fn self_check(
        &self,
        ca_cert_path: &Path,
        chain_path: &Path,
        root_path: &Path,
    ) -> Result<(), CaError> {
        let mut store = RootCertStore::empty();
        for (index, root) in self.roots.iter().enumerate() {
            store
                .add(root.clone())
                .map_err(|e| CaError::BadCertificate {
                    path: root_path.to_path_buf(),
                    index,
                    reason: e.to_string(),
                })?;
        }
        let does_not_chain = |reason: String| CaError::DoesNotChain {
            ca_cert_path: ca_cert_path.to_path_buf(),
            chain_path: chain_path.to_path_buf(),
            root_path: root_path.to_path_buf(),
            reason,
        };
        let now = SystemTime::now();
        if now >= self.not_after {
            return Err(does_not_chain(format!(
                "{} expired at {}",
                CA_CERT_FILE,
                x509::rfc3339(self.not_after)
            )));
        }
        let probe_id = SpiffeId::new("ambit.invalid", "ambit-probe", "ambit-probe")
            .map_err(CaError::TrustDomain)?;
        let probe = self.issue_at(&probe_id, Duration::from_secs(300), now)?;
        let leaf = &probe.chain[0];
        let leaf_parsed = x509::parse(leaf).map_err(does_not_chain)?;
        let ca_parsed = x509::parse(&self.ca_cert).map_err(does_not_chain)?;
        if leaf_parsed.issuer().as_raw() != ca_parsed.subject().as_raw() {
            return Err(CaError::Unsupported {
                path: ca_cert_path.to_path_buf(),
                reason: "its subject cannot be reproduced byte for byte as the issuer name of new certificates (unusual string types or repeated attributes); re-issue ca-cert.pem with a plain subject".to_owned(),
            });
        }
        let parsed = rustls::server::ParsedCertificate::try_from(leaf)
            .map_err(|e| does_not_chain(e.to_string()))?;
        rustls::client::verify_server_cert_signed_by_trust_anchor(
            &parsed,
            &store,
            &probe.chain[1..],
            UnixTime::now(),
            crate::tls::crypto_provider()
                .signature_verification_algorithms
                .all,
        )
        .map_err(|e| does_not_chain(e.to_string()))
    }
}

/// The contents of the four files of Istio's plug-in CA layout (see
/// [`CertificateAuthority::from_plugin_pem`]). No `Debug`: it holds the CA key.
#[derive(Clone, Copy)]
pub struct PluginCaPem<'a> {
    /// `ca-cert.pem`: the signing certificate, alone.
    pub ca_cert: &'a [u8],
    /// `ca-key.pem`: its private key.
    pub ca_key: &'a [u8],
    /// `root-cert.pem`: the trust anchor(s).
    pub root_cert: &'a [u8],
    /// `cert-chain.pem`: from the signing certificate up to the root.
    pub cert_chain: &'a [u8],
}

/// Reads the CA key, refusing a file that group or others may read or write (its mode is
/// taken from the opened file, so a swap between the check and the read changes nothing).
fn read_key(path: &Path) -> Result<Vec<u8>, CaError> {
    use std::io::Read;
    let read_err = |source| CaError::Read {
        path: path.to_path_buf(),
        source,
    };
    let mut file = fs::File::open(path).map_err(read_err)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = file.metadata().map_err(read_err)?.permissions().mode() & 0o7777;
        if mode & 0o077 != 0 {
            return Err(CaError::KeyTooOpen {
                path: path.to_path_buf(),
                mode,
            });
        }
    }
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).map_err(read_err)?;
    Ok(bytes)
}

/// Parses the contents of a PEM file holding one or more certificates, each of which must
/// parse; `path` names the file in errors.
fn parse_cert_file(path: &Path, bytes: &[u8]) -> Result<Vec<CertificateDer<'static>>, CaError> {
    let certs = pem::parse_certs(bytes).map_err(|reason| CaError::Pem {
        path: path.to_path_buf(),
        reason,
    })?;
    if certs.is_empty() {
        return Err(CaError::NoCertificate {
            path: path.to_path_buf(),
        });
    }
    for (index, der) in certs.iter().enumerate() {
        x509::parse(der).map_err(|reason| CaError::BadCertificate {
            path: path.to_path_buf(),
            index,
            reason,
        })?;
    }
    Ok(certs)
}

fn parse_key(path: &Path, text: &str) -> Result<KeyPair, CaError> {
    let der = pem::parse_private_key(text.as_bytes())
        .map_err(|reason| CaError::Pem {
            path: path.to_path_buf(),
            reason,
        })?
        .ok_or_else(|| CaError::NoKey {
            path: path.to_path_buf(),
        })?;
    KeyPair::try_from(&der).map_err(|e| CaError::BadKey {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

fn check_is_ca(
    path: &Path,
    cert: &x509_parser::certificate::X509Certificate<'_>,
) -> Result<(), CaError> {
    let not_ca = |reason: &str| CaError::NotCa {
        path: path.to_path_buf(),
        reason: reason.to_owned(),
    };
    match cert.basic_constraints() {
        Ok(Some(bc)) if bc.value.ca => {}
        Ok(_) => return Err(not_ca("basicConstraints does not say CA:TRUE")),
        Err(e) => return Err(not_ca(&format!("basicConstraints is invalid: {e}"))),
    }
    match cert.key_usage() {
        Ok(Some(ku)) if !ku.value.key_cert_sign() => {
            Err(not_ca("keyUsage does not include keyCertSign"))
        }
        Ok(_) => Ok(()),
        Err(e) => Err(not_ca(&format!("keyUsage is invalid: {e}"))),
    }
}

/// rcgen re-encodes the issuer name from parsed attributes; refuse shapes it cannot
/// reproduce (and one that would make it panic: an empty RDN).
fn check_subject(
    path: &Path,
    cert: &x509_parser::certificate::X509Certificate<'_>,
) -> Result<(), CaError> {
    for rdn in cert.subject().iter() {
        let n = rdn.iter().count();
        if n != 1 {
            return Err(CaError::Unsupported {
                path: path.to_path_buf(),
                reason: format!("its subject has a relative distinguished name with {n} attributes; re-issue ca-cert.pem with one attribute per RDN"),
            });
        }
    }
    Ok(())
}

/// Writes `data` to a temporary sibling and renames it over `path`.
fn write_atomic(path: &Path, data: &[u8], mode: u32) -> Result<(), CaError> {
    let err = |source| CaError::Write {
        path: path.to_path_buf(),
        source,
    };
    let tmp = tmp_path(path);
    let mut options = fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(mode);
    }
    #[cfg(not(unix))]
    let _ = mode;
    let result = (|| {
        let mut f = options.open(&tmp)?;
        f.write_all(data)?;
        f.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result.map_err(err)
}

fn tmp_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.tmp-{}", unique_suffix()))
}

/// `<pid>-<counter>`: unique among concurrent writers of this and other processes.
fn unique_suffix() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    format!(
        "{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{exchange, id};
    use crate::tls::{client_config, server_config};
    use rcgen::{KeyIdMethod, PKCS_ECDSA_P384_SHA384, PKCS_RSA_SHA256};
    use std::process::Command;

    /// A leaf signed by `ca` whose SAN carries two SPIFFE ids: legal X.509, not a valid SVID.
    fn two_id_leaf(
        ca: &CertificateAuthority,
        first: &SpiffeId,
        second: &SpiffeId,
    ) -> WorkloadCertificate {
        uri_leaf(ca, first, &[&first.to_string(), &second.to_string()])
    }

    /// A leaf signed by `ca` for `identity` whose SAN holds exactly `uris`.
    fn uri_leaf(
        ca: &CertificateAuthority,
        identity: &SpiffeId,
        uris: &[&str],
    ) -> WorkloadCertificate {
        let key = leaf::new_key().unwrap();
        let now = SystemTime::now();
        let mut params = leaf::leaf_params(identity, now, now + Duration::from_secs(3600), true);
        params.custom_extensions.clear();
        params.subject_alt_names = uris
            .iter()
            .map(|u| rcgen::SanType::URI((*u).try_into().unwrap()))
            .collect();
        let cert = params.signed_by(&key, &ca.issuer, &ca.key).unwrap();
        WorkloadCertificate {
            identity: identity.clone(),
            chain: vec![cert.der().clone()],
            key: PrivatePkcs8KeyDer::from(key.serialize_der()),
            roots: ca.roots.clone(),
            not_before: now,
            not_after: now + Duration::from_secs(3600),
        }
    }

    #[tokio::test]
    async fn certificates_with_several_spiffe_ids_are_refused_both_ways() {
        let ca = CertificateAuthority::ephemeral("cluster.local").unwrap();
        let admin = SpiffeId::parse("spiffe://other.td/ns/prod/sa/admin").unwrap();
        let plain = SpiffeId::new("cluster.local", "default", "web").unwrap();
        let sneaky = two_id_leaf(&ca, &admin, &plain);
        let honest = ca.issue(&plain, Duration::from_secs(3600)).unwrap();
        // As a client: passes a naive "any SAN in our trust domain" check, must be refused.
        let err = exchange(
            server_config(&honest).unwrap(),
            client_config(&sneaky, std::slice::from_ref(&plain)).unwrap(),
        )
        .await
        .unwrap_err();
        assert!(err.contains("SeveralSpiffeIds"), "{err}");
        // As a server: one of its ids is expected, must be refused all the same.
        let err = exchange(
            server_config(&sneaky).unwrap(),
            client_config(&honest, &[plain.clone(), admin.clone()]).unwrap(),
        )
        .await
        .unwrap_err();
        assert!(err.contains("SeveralSpiffeIds"), "{err}");
        assert_eq!(crate::tls::peer_identity(Some(&sneaky.chain)), None);
    }

    #[tokio::test]
    async fn certificates_with_a_malformed_spiffe_uri_beside_a_good_one_are_refused() {
        let ca = CertificateAuthority::ephemeral("cluster.local").unwrap();
        let plain = SpiffeId::new("cluster.local", "default", "web").unwrap();
        let honest = ca.issue(&plain, Duration::from_secs(3600)).unwrap();
        let good = plain.to_string();
        for bad in [
            "spiffe://cluster.local/ns/default/sa/web/admin",
            "SPIFFE://cluster.local/ns/prod/sa/admin",
        ] {
            let sneaky = uri_leaf(&ca, &plain, &[&good, bad]);
            let err = exchange(
                server_config(&honest).unwrap(),
                client_config(&sneaky, std::slice::from_ref(&plain)).unwrap(),
            )
            .await
            .unwrap_err();
            assert!(err.contains("SeveralSpiffeIds"), "{bad}: {err}");
            let err = exchange(
                server_config(&sneaky).unwrap(),
                client_config(&honest, std::slice::from_ref(&plain)).unwrap(),
            )
            .await
            .unwrap_err();
            assert!(err.contains("SeveralSpiffeIds"), "{bad}: {err}");
            assert_eq!(crate::tls::peer_identity(Some(&sneaky.chain)), None);
        }
        // The control: the same leaf shape with only the good URI is accepted.
        let fine = uri_leaf(&ca, &plain, &[&good]);
        exchange(
            server_config(&honest).unwrap(),
            client_config(&fine, std::slice::from_ref(&plain)).unwrap(),
        )
        .await
        .unwrap();
    }

    const HOUR: Duration = Duration::from_secs(3600);

    /// Two leaves of `ca` (or of `ca` and `peer`) complete a real mTLS exchange.
    async fn assert_handshake(ca: &CertificateAuthority, peer: &CertificateAuthority) {
        let server = ca
            .issue(&id("spiffe://cluster.local/ns/default/sa/server"), HOUR)
            .unwrap();
        let client = peer
            .issue(&id("spiffe://cluster.local/ns/default/sa/client"), HOUR)
            .unwrap();
        let out = exchange(
            server_config(&server).unwrap(),
            client_config(&client, std::slice::from_ref(&server.identity)).unwrap(),
        )
        .await
        .unwrap();
        assert_eq!(out.client_id, Some(client.identity));
        assert_eq!(out.server_id, Some(server.identity));
    }

    /// Writes a plug-in CA file as an operator should: the key 0600, the rest 0644.
    fn write(dir: &Path, name: &str, text: &str) {
        fs::write(dir.join(name), text).unwrap();
        let mode = if name == CA_KEY_FILE { 0o600 } else { 0o644 };
        set_mode(&dir.join(name), mode);
    }

    fn set_mode(path: &Path, mode: u32) {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
    }

    fn ca_params(cn: &str) -> CertificateParams {
        let mut p = CertificateParams::default();
        p.distinguished_name = rcgen::DistinguishedName::new();
        p.distinguished_name.push(DnType::OrganizationName, "Istio");
        p.distinguished_name.push(DnType::CommonName, cn);
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        p.not_before = x509::to_offset(SystemTime::now() - HOUR);
        p.not_after = x509::to_offset(SystemTime::now() + 1000 * HOUR);
        p
    }

    /// root -> intermediate (the signing CA), written in the plug-in layout.
    fn intermediate_dir(dir: &Path, alg: &'static rcgen::SignatureAlgorithm) -> (String, String) {
        let root_key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let root = ca_params("Root CA").self_signed(&root_key).unwrap();
        let int_key = if alg == &PKCS_RSA_SHA256 {
            KeyPair::generate_rsa_for(alg, rcgen::RsaKeySize::_2048).unwrap()
        } else {
            KeyPair::generate_for(alg).unwrap()
        };
        let mut int_params = ca_params("Intermediate CA");
        int_params.use_authority_key_identifier_extension = true;
        int_params.key_identifier_method = KeyIdMethod::Sha256;
        let int = int_params.signed_by(&int_key, &root, &root_key).unwrap();
        write(dir, CA_CERT_FILE, &int.pem());
        write(dir, CA_KEY_FILE, &int_key.serialize_pem());
        write(dir, ROOT_CERT_FILE, &root.pem());
        write(dir, CERT_CHAIN_FILE, &(int.pem() + &root.pem()));
        (int.pem(), root.pem())
    }

    #[tokio::test]
    async fn ephemeral_leaf_has_the_workload_shape() {
        let ca = CertificateAuthority::ephemeral("cluster.local").unwrap();
        let wid = id("spiffe://cluster.local/ns/ns1/sa/sa1");
        let before = SystemTime::now();
        let cert = ca.issue(&wid, HOUR).unwrap();
        assert_eq!(cert.identity, wid);
        assert_eq!(cert.chain.len(), 1, "a self-signed root is not sent");
        assert_eq!(cert.roots, ca.roots());
        let leaf = x509::parse(&cert.chain[0]).unwrap();
        assert_eq!(leaf.subject().iter().count(), 0, "empty subject");
        let san = leaf.subject_alternative_name().unwrap().unwrap();
        assert!(san.critical, "SAN must be critical");
        assert_eq!(
            san.value.general_names,
            vec![x509_parser::extensions::GeneralName::URI(
                "spiffe://cluster.local/ns/ns1/sa/sa1"
            )]
        );
        let key = KeyPair::try_from(cert.key.secret_pkcs8_der()).unwrap();
        assert_eq!(key.algorithm(), &rcgen::PKCS_ECDSA_P256_SHA256);
        assert_eq!(
            leaf.public_key().subject_public_key.data.as_ref(),
            key.public_key_raw()
        );
        assert!(!leaf.is_ca());
        let ku = leaf.key_usage().unwrap().unwrap().value;
        assert!(ku.digital_signature() && ku.key_encipherment() && !ku.key_cert_sign());
        let eku = leaf.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.server_auth && eku.client_auth);
        assert_eq!(
            leaf.issuer().as_raw(),
            x509::parse(&ca.roots()[0]).unwrap().subject().as_raw()
        );
        // Validity: one minute back for clock skew, then the requested lifetime.
        let lifetime = cert.not_after.duration_since(cert.not_before).unwrap();
        assert!(
            (HOUR + BACKDATE).abs_diff(lifetime) <= Duration::from_secs(1),
            "{lifetime:?}"
        );
        assert!(cert.not_before <= before - BACKDATE + Duration::from_secs(1));
        assert_eq!(cert.renew_at(), cert.not_before + lifetime / 2);
        // The root.
        let root = x509::parse(&ca.roots()[0]).unwrap();
        assert!(root.is_ca());
        let names: Vec<String> = root
            .subject()
            .iter_attributes()
            .map(|a| a.as_str().unwrap().to_owned())
            .collect();
        assert_eq!(names, ["cluster.local", "ambit ephemeral root"]);
        let (nb, na) = x509::validity(&root);
        let years = na.duration_since(nb).unwrap().as_secs() / (365 * 86400);
        assert_eq!(years, 10);
        // The leaf's authority key id names the root's subject key id.
        use x509_parser::extensions::ParsedExtension;
        let ski = root
            .extensions()
            .iter()
            .find_map(|e| match e.parsed_extension() {
                ParsedExtension::SubjectKeyIdentifier(k) => Some(k.0.to_vec()),
                _ => None,
            });
        let aki = leaf
            .extensions()
            .iter()
            .find_map(|e| match e.parsed_extension() {
                ParsedExtension::AuthorityKeyIdentifier(k) => {
                    k.key_identifier.as_ref().map(|k| k.0.to_vec())
                }
                _ => None,
            });
        assert!(ski.is_some());
        assert_eq!(ski, aki);
        assert_handshake(&ca, &ca).await;
    }

    #[test]
    fn ttl_is_validated_and_clamped_to_the_ca() {
        let ca = CertificateAuthority::ephemeral("td").unwrap();
        let wid = id("spiffe://td/ns/a/sa/b");
        assert!(matches!(
            ca.issue(&wid, Duration::ZERO),
            Err(CaError::InvalidTtl { .. })
        ));
        let cert = ca.issue(&wid, Duration::MAX).unwrap();
        assert_eq!(cert.not_after, ca.not_after());
        assert!(matches!(
            ca.issue_at(&wid, HOUR, ca.not_after() + HOUR),
            Err(CaError::Expired { .. })
        ));
        assert!(matches!(
            CertificateAuthority::ephemeral("Bad TD"),
            Err(CaError::TrustDomain(_))
        ));
    }

    #[tokio::test]
    async fn plugin_dir_round_trip() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("ca");
        let ca = CertificateAuthority::ephemeral("cluster.local").unwrap();
        ca.write_plugin_dir(&dir).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = fs::metadata(dir.join(CA_KEY_FILE))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let key_text = fs::read_to_string(dir.join(CA_KEY_FILE)).unwrap();
        assert!(key_text.starts_with("-----BEGIN PRIVATE KEY-----"));
        let loaded = CertificateAuthority::from_plugin_dir(&dir).unwrap();
        assert_eq!(loaded.roots(), ca.roots());
        assert_eq!(loaded.root_pem(), ca.root_pem());
        assert_eq!(loaded.not_after(), ca.not_after());
        // Leaves of the two instances trust each other: one shared root.
        assert_handshake(&loaded, &ca).await;
        assert_handshake(&ca, &loaded).await;
        // Writing again (over existing files) works and keeps the content.
        loaded.write_plugin_dir(&dir).unwrap();
        assert_eq!(fs::read_to_string(dir.join(CA_KEY_FILE)).unwrap(), key_text);
        let leftovers: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .filter(|n| n.to_string_lossy().starts_with('.'))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }

    #[test]
    fn load_or_create_shares_one_root_between_racers() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("shared-ca");
        let roots: Vec<Vec<CertificateDer<'static>>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|_| {
                    s.spawn(|| {
                        CertificateAuthority::load_or_create_plugin_dir(&dir, "cluster.local")
                            .unwrap()
                            .roots()
                            .to_vec()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(roots.windows(2).all(|w| w[0] == w[1]));
        let again = CertificateAuthority::load_or_create_plugin_dir(&dir, "cluster.local").unwrap();
        assert_eq!(again.roots(), &roots[0][..]);
        let names: Vec<_> = fs::read_dir(tmp.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "staging directories are cleaned up");
    }

    #[tokio::test]
    async fn plugin_dir_with_intermediate() {
        for alg in [
            &rcgen::PKCS_ECDSA_P256_SHA256,
            &PKCS_ECDSA_P384_SHA384,
            &PKCS_RSA_SHA256,
        ] {
            let tmp = tempfile::tempdir().unwrap();
            let (int_pem, root_pem) = intermediate_dir(tmp.path(), alg);
            let ca = CertificateAuthority::from_plugin_dir(tmp.path()).unwrap();
            assert_eq!(ca.root_pem(), root_pem);
            let cert = ca.issue(&id("spiffe://td/ns/a/sa/b"), HOUR).unwrap();
            assert_eq!(cert.chain.len(), 2, "leaf + intermediate, no root");
            assert_eq!(crate::pem::cert_pem(&cert.chain[1]), int_pem);
            assert_eq!(cert.roots.len(), 1);
            assert_handshake(&ca, &ca).await;
        }
    }

    #[tokio::test]
    async fn plugin_dir_with_rsa_self_signed_root() {
        let tmp = tempfile::tempdir().unwrap();
        let key = KeyPair::generate_rsa_for(&PKCS_RSA_SHA256, rcgen::RsaKeySize::_2048).unwrap();
        let root = ca_params("RSA Root").self_signed(&key).unwrap();
        write(tmp.path(), CA_CERT_FILE, &root.pem());
        write(tmp.path(), CA_KEY_FILE, &key.serialize_pem());
        write(tmp.path(), ROOT_CERT_FILE, &root.pem());
        write(tmp.path(), CERT_CHAIN_FILE, &root.pem());
        let ca = CertificateAuthority::from_plugin_dir(tmp.path()).unwrap();
        let cert = ca.issue(&id("spiffe://td/ns/a/sa/b"), HOUR).unwrap();
        assert_eq!(cert.chain.len(), 1);
        let leaf = x509::parse(&cert.chain[0]).unwrap();
        assert_eq!(
            leaf.signature_algorithm.algorithm,
            x509_parser::oid_registry::OID_PKCS1_SHA256WITHRSA
        );
        assert_handshake(&ca, &ca).await;
    }

    fn openssl(dir: &Path, args: &[&str]) {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .unwrap_or_else(|e| {
                panic!("this test needs the openssl CLI (apt-get install openssl): {e}")
            });
        assert!(
            out.status.success(),
            "openssl {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// An Istio-style plug-in directory made by the openssl CLI: RSA root, intermediate
    /// with the given key algorithm, subject with UTF8Strings and a locality.
    fn openssl_dir(dir: &Path, int_key_args: &[&str], traditional: bool) {
        openssl_dir_with_subject(
            dir,
            int_key_args,
            traditional,
            "/O=Istio/CN=Intermediate CA/L=cluster1",
        );
    }

    fn openssl_dir_with_subject(
        dir: &Path,
        int_key_args: &[&str],
        traditional: bool,
        subject: &str,
    ) {
        let ext = "[ca]\nbasicConstraints=critical,CA:TRUE\nkeyUsage=critical,keyCertSign,cRLSign,digitalSignature\nsubjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n";
        write(dir, "ext.cnf", ext);
        openssl(
            dir,
            &[
                "genpkey",
                "-algorithm",
                "RSA",
                "-pkeyopt",
                "rsa_keygen_bits:2048",
                "-out",
                "root-key.pem",
            ],
        );
        openssl(
            dir,
            &[
                "req",
                "-x509",
                "-new",
                "-key",
                "root-key.pem",
                "-days",
                "30",
                "-subj",
                "/O=Istio/CN=Root CA",
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
                "-out",
                ROOT_CERT_FILE,
            ],
        );
        let mut gen = vec!["genpkey"];
        gen.extend_from_slice(int_key_args);
        gen.extend_from_slice(&["-out", "int-key.pem"]);
        openssl(dir, &gen);
        openssl(
            dir,
            &[
                "req",
                "-new",
                "-key",
                "int-key.pem",
                "-multivalue-rdn",
                "-subj",
                subject,
                "-out",
                "int.csr",
            ],
        );
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                "int.csr",
                "-CA",
                ROOT_CERT_FILE,
                "-CAkey",
                "root-key.pem",
                "-CAcreateserial",
                "-days",
                "30",
                "-extfile",
                "ext.cnf",
                "-extensions",
                "ca",
                "-out",
                CA_CERT_FILE,
            ],
        );
        if traditional && int_key_args.contains(&"RSA") {
            // PKCS#1 "RSA PRIVATE KEY", like Istio's sample certificates.
            openssl(
                dir,
                &[
                    "rsa",
                    "-in",
                    "int-key.pem",
                    "-traditional",
                    "-out",
                    CA_KEY_FILE,
                ],
            );
        } else if traditional {
            // SEC1 "EC PRIVATE KEY".
            openssl(dir, &["ec", "-in", "int-key.pem", "-out", CA_KEY_FILE]);
        } else {
            fs::copy(dir.join("int-key.pem"), dir.join(CA_KEY_FILE)).unwrap();
        }
        // As the README tells operators to.
        set_mode(&dir.join(CA_KEY_FILE), 0o600);
        let chain = fs::read_to_string(dir.join(CA_CERT_FILE)).unwrap()
            + &fs::read_to_string(dir.join(ROOT_CERT_FILE)).unwrap();
        write(dir, CERT_CHAIN_FILE, &chain);
    }

    #[tokio::test]
    async fn openssl_made_plugin_dirs_work() {
        let cases: [(&[&str], bool); 4] = [
            (
                &["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"],
                true,
            ),
            (
                &["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"],
                false,
            ),
            (
                &["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-384"],
                false,
            ),
            (
                &["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"],
                true,
            ),
        ];
        for (args, traditional) in cases {
            let tmp = tempfile::tempdir().unwrap();
            openssl_dir(tmp.path(), args, traditional);
            let key_text = fs::read_to_string(tmp.path().join(CA_KEY_FILE)).unwrap();
            let pkcs8 = key_text.starts_with("-----BEGIN PRIVATE KEY-----");
            assert_eq!(pkcs8, !traditional, "{key_text}");
            let ca = CertificateAuthority::from_plugin_dir(tmp.path())
                .unwrap_or_else(|e| panic!("{args:?} traditional={traditional}: {e}"));
            // Written back verbatim.
            let out = tempfile::tempdir().unwrap();
            ca.write_plugin_dir(out.path()).unwrap();
            assert_eq!(
                fs::read_to_string(out.path().join(CA_KEY_FILE)).unwrap(),
                key_text
            );
            CertificateAuthority::from_plugin_dir(out.path()).unwrap();
            let cert = ca.issue(&id("spiffe://td/ns/a/sa/b"), HOUR).unwrap();
            assert_eq!(cert.chain.len(), 2);
            assert_handshake(&ca, &ca).await;
            // openssl itself agrees that the leaf chains to the root.
            fs::write(tmp.path().join("leaf.pem"), cert.chain_pem()).unwrap();
            openssl(
                tmp.path(),
                &[
                    "verify",
                    "-CAfile",
                    ROOT_CERT_FILE,
                    "-untrusted",
                    CA_CERT_FILE,
                    "leaf.pem",
                ],
            );
        }
    }

    #[test]
    fn subjects_that_cannot_be_reproduced_are_refused_at_load() {
        let ec: &[&str] = &["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"];
        for subject in [
            "/O=Istio+CN=Intermediate CA",
            "/O=Istio/OU=a/OU=b/CN=Intermediate CA",
        ] {
            let tmp = tempfile::tempdir().unwrap();
            openssl_dir_with_subject(tmp.path(), ec, false, subject);
            let e = load_err(tmp.path(), CA_CERT_FILE);
            assert!(matches!(e, CaError::Unsupported { .. }), "{subject}: {e}");
        }
    }

    /// Loads `dir` expecting an error whose message names `file`.
    fn load_err(dir: &Path, file: &str) -> CaError {
        let e = CertificateAuthority::from_plugin_dir(dir).unwrap_err();
        assert!(e.to_string().contains(file), "{file} not named in: {e}");
        e
    }

    #[test]
    fn plugin_pem_is_the_directory_without_the_file_system() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let ca = CertificateAuthority::ephemeral("td").unwrap();
        ca.write_plugin_dir(dir).unwrap();
        let read = |f: &str| fs::read(dir.join(f)).unwrap();
        let (cert, key, root, chain) = (
            read(CA_CERT_FILE),
            read(CA_KEY_FILE),
            read(ROOT_CERT_FILE),
            read(CERT_CHAIN_FILE),
        );
        let files = PluginCaPem {
            ca_cert: &cert,
            ca_key: &key,
            root_cert: &root,
            cert_chain: &chain,
        };
        let named = Path::new("/etc/ambit/ca");
        let loaded = CertificateAuthority::from_plugin_pem(named, files).unwrap();
        assert_eq!(loaded.ca_cert(), ca.ca_cert());
        // Errors name the file under the directory given, and the key must be text.
        let bad = PluginCaPem {
            ca_key: b"\xff\xfe",
            ..files
        };
        let err = CertificateAuthority::from_plugin_pem(named, bad).unwrap_err();
        assert!(
            matches!(&err, CaError::Pem { path, .. } if *path == named.join(CA_KEY_FILE)),
            "{err:?}"
        );
        let bad = PluginCaPem {
            root_cert: b"",
            ..files
        };
        let err = CertificateAuthority::from_plugin_pem(named, bad).unwrap_err();
        assert!(
            matches!(&err, CaError::NoCertificate { path } if *path == named.join(ROOT_CERT_FILE)),
            "{err:?}"
        );
    }

    #[test]
    fn a_ca_key_readable_by_others_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        CertificateAuthority::ephemeral("td")
            .unwrap()
            .write_plugin_dir(dir)
            .unwrap();
        let key = dir.join(CA_KEY_FILE);
        for mode in [0o640, 0o604, 0o644, 0o660, 0o602, 0o666] {
            set_mode(&key, mode);
            let err = CertificateAuthority::from_plugin_dir(dir).unwrap_err();
            assert!(
                matches!(&err, CaError::KeyTooOpen { path, mode: m } if *path == key && *m == mode),
                "{mode:o}: {err:?}"
            );
            let text = err.to_string();
            for part in [
                key.display().to_string(),
                format!("mode {mode:04o}"),
                format!("chmod 600 {}", key.display()),
            ] {
                assert!(text.contains(&part), "{mode:o}: {part:?} not in {text}");
            }
        }
        // Owner-only modes are fine, read-only included.
        for mode in [0o600, 0o400] {
            set_mode(&key, mode);
            CertificateAuthority::from_plugin_dir(dir).unwrap_or_else(|e| panic!("{mode:o}: {e}"));
        }
    }

    #[test]
    fn plugin_dir_errors_name_the_file() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let good = CertificateAuthority::ephemeral("td").unwrap();
        let other = CertificateAuthority::ephemeral("td").unwrap();
        let reset = || good.write_plugin_dir(dir).unwrap();

        // Missing directory / file.
        assert!(matches!(
            load_err(&dir.join("nope"), CA_CERT_FILE),
            CaError::Read { .. }
        ));
        reset();
        fs::remove_file(dir.join(CERT_CHAIN_FILE)).unwrap();
        assert!(matches!(
            load_err(dir, CERT_CHAIN_FILE),
            CaError::Read { .. }
        ));

        // Not PEM.
        reset();
        write(dir, CA_CERT_FILE, "hello");
        assert!(matches!(
            load_err(dir, CA_CERT_FILE),
            CaError::NoCertificate { .. }
        ));
        reset();
        write(
            dir,
            ROOT_CERT_FILE,
            "-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n",
        );
        load_err(dir, ROOT_CERT_FILE);
        reset();
        write(
            dir,
            ROOT_CERT_FILE,
            "-----BEGIN CERTIFICATE-----\naGVsbG8=\n-----END CERTIFICATE-----\n",
        );
        assert!(matches!(
            load_err(dir, ROOT_CERT_FILE),
            CaError::BadCertificate { .. }
        ));
        reset();
        write(dir, CA_KEY_FILE, "hello");
        assert!(matches!(load_err(dir, CA_KEY_FILE), CaError::NoKey { .. }));
        reset();
        write(
            dir,
            CA_KEY_FILE,
            "-----BEGIN PRIVATE KEY-----\naGVsbG8=\n-----END PRIVATE KEY-----\n",
        );
        assert!(matches!(load_err(dir, CA_KEY_FILE), CaError::BadKey { .. }));

        // Two certificates in ca-cert.pem.
        reset();
        write(dir, CA_CERT_FILE, &(good.root_pem() + &other.root_pem()));
        assert!(matches!(
            load_err(dir, CA_CERT_FILE),
            CaError::TooManyCertificates { found: 2, .. }
        ));

        // Key of another CA.
        reset();
        write(dir, CA_KEY_FILE, &other.key_pem);
        let e = load_err(dir, CA_KEY_FILE);
        assert!(matches!(e, CaError::KeyMismatch { .. }));
        assert!(e.to_string().contains(CA_CERT_FILE));

        // ca-cert.pem is a leaf, not a CA.
        let leaf = good.issue(&id("spiffe://td/ns/a/sa/b"), HOUR).unwrap();
        reset();
        write(dir, CA_CERT_FILE, &crate::pem::cert_pem(&leaf.chain[0]));
        write(dir, CA_KEY_FILE, &leaf.key_pem());
        write(dir, CERT_CHAIN_FILE, &crate::pem::cert_pem(&leaf.chain[0]));
        assert!(matches!(load_err(dir, CA_CERT_FILE), CaError::NotCa { .. }));

        // cert-chain.pem does not start with ca-cert.pem.
        reset();
        write(dir, CERT_CHAIN_FILE, &other.root_pem());
        assert!(matches!(
            load_err(dir, CERT_CHAIN_FILE),
            CaError::ChainStart { .. }
        ));

        // root-cert.pem is another CA's root.
        reset();
        write(dir, ROOT_CERT_FILE, &other.root_pem());
        let e = load_err(dir, ROOT_CERT_FILE);
        assert!(matches!(e, CaError::DoesNotChain { .. }), "{e}");

        // Intermediate whose cert-chain.pem lacks nothing but root-cert.pem is unrelated.
        let tmp2 = tempfile::tempdir().unwrap();
        intermediate_dir(tmp2.path(), &rcgen::PKCS_ECDSA_P256_SHA256);
        write(tmp2.path(), ROOT_CERT_FILE, &other.root_pem());
        assert!(matches!(
            load_err(tmp2.path(), ROOT_CERT_FILE),
            CaError::DoesNotChain { .. }
        ));

        // Everything restored loads again.
        reset();
        CertificateAuthority::from_plugin_dir(dir).unwrap();
    }

    #[test]
    fn several_roots_are_all_trust_anchors() {
        let tmp = tempfile::tempdir().unwrap();
        let a = CertificateAuthority::ephemeral("td").unwrap();
        let b = CertificateAuthority::ephemeral("td").unwrap();
        a.write_plugin_dir(tmp.path()).unwrap();
        // Root rotation: the new root is listed next to the current one.
        write(tmp.path(), ROOT_CERT_FILE, &(b.root_pem() + &a.root_pem()));
        write(tmp.path(), CERT_CHAIN_FILE, &a.root_pem());
        let ca = CertificateAuthority::from_plugin_dir(tmp.path()).unwrap();
        assert_eq!(ca.roots().len(), 2);
        let cert = ca.issue(&id("spiffe://td/ns/a/sa/b"), HOUR).unwrap();
        assert_eq!(
            cert.chain.len(),
            1,
            "the root in cert-chain.pem is not sent"
        );
        assert_eq!(cert.roots.len(), 2);
    }
}
