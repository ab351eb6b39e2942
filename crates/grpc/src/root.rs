//! The root that the server's certificate must chain to (`XDS_ROOT_CA`, `CA_ROOT_CA`).

use std::fmt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use rustls::RootCertStore;

use crate::GrpcError;

/// Where the trust anchors come from.
#[derive(Clone, PartialEq, Eq)]
pub enum RootCa {
    /// A PEM file (watched: a changed file rebuilds the channel).
    File(PathBuf),
    /// The operating system's trust store.
    System,
    /// PEM text given inline.
    Inline(String),
}

/// The root of ztunnel's chart when nothing else is configured.
pub const DEFAULT_ROOT_PATH: &str = "./var/run/secrets/istio/root-cert.pem";

/// What identifies one version of a root file: a Kubernetes secret update swaps a symlink
/// to a new file (new inode), an edit in place changes size or time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stamp(Option<(u64, u64, i64, i64, u64)>);

impl RootCa {
    /// ztunnel's rules: the value names an existing file ⇒ that file; `SYSTEM` ⇒ the OS
    /// store; anything else is PEM. Unset ⇒ the chart's default path.
    pub fn from_env_value(value: Option<&str>) -> RootCa {
        match value {
            None => RootCa::File(PathBuf::from(DEFAULT_ROOT_PATH)),
            Some("SYSTEM") => RootCa::System,
            Some(v) if Path::new(v).is_file() => RootCa::File(PathBuf::from(v)),
            Some(v) => RootCa::Inline(v.to_string()),
        }
    }

    pub(crate) fn stamp(&self) -> Stamp {
        match self {
            RootCa::File(path) => Stamp(
                std::fs::metadata(path)
                    .ok()
                    .map(|m| (m.dev(), m.ino(), m.mtime(), m.mtime_nsec(), m.len())),
            ),
            _ => Stamp(None),
        }
    }

    /// The trust anchors, read now.
    pub fn load(&self) -> Result<RootCertStore, GrpcError> {
        let err = |reason: String| GrpcError::Root {
            from: self.to_string(),
            reason,
        };
        let mut store = RootCertStore::empty();
        let certs: Vec<CertificateDer<'static>> = match self {
            RootCa::File(path) => {
                let pem = std::fs::read(path).map_err(|e| err(e.to_string()))?;
                parse(&pem).map_err(err)?
            }
            RootCa::Inline(pem) => parse(pem.as_bytes()).map_err(err)?,
            RootCa::System => {
                let found = rustls_native_certs::load_native_certs();
                if found.certs.is_empty() {
                    return Err(err(format!(
                        "the system trust store holds no certificates ({} errors)",
                        found.errors.len()
                    )));
                }
                found.certs
            }
        };
        let (added, ignored) = store.add_parsable_certificates(certs);
        if added == 0 {
            return Err(err(format!("no usable certificate ({ignored} unparsable)")));
        }
        Ok(store)
    }
}

fn parse(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("not valid PEM: {e}"))?;
    if certs.is_empty() {
        return Err("holds no -----BEGIN CERTIFICATE----- block".into());
    }
    Ok(certs)
}

impl fmt::Display for RootCa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RootCa::File(p) => write!(f, "{}", p.display()),
            RootCa::System => f.write_str("SYSTEM"),
            RootCa::Inline(_) => f.write_str("(inline PEM)"),
        }
    }
}

impl fmt::Debug for RootCa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}
