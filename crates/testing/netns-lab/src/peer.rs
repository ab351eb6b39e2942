//! Which node proxy a lab node runs: ambit's, or Istio's own ztunnel (the reference peer
//! in `../shared/peers/istio-ztunnel`, a release build with `FAKE_CA` support), so the
//! same lab can put either on each end of a wire.

use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

/// Istio's ztunnel: the binary and its test root (`ca/`, Istio's plug-in CA layout).
#[derive(Clone, Debug)]
pub struct IstioZtunnel {
    pub bin: PathBuf,
    pub ca_dir: PathBuf,
}

/// The files of Istio's plug-in CA layout, as the peer ships them in `ca/`.
const CA_FILES: [&str; 4] = [
    ambit_identity::ca::ROOT_CERT_FILE,
    ambit_identity::ca::CA_CERT_FILE,
    ambit_identity::ca::CA_KEY_FILE,
    ambit_identity::ca::CERT_CHAIN_FILE,
];

/// Where the peer lives relative to a checkout of this repository.
pub const DEFAULT_PEER_DIR: &str = "../shared/peers/istio-ztunnel";

impl IstioZtunnel {
    /// The peer in `dir` (`dir/ztunnel`, `dir/ca/`); fails, naming what is missing.
    pub fn find(dir: &Path) -> anyhow::Result<IstioZtunnel> {
        let bin = dir.join("ztunnel");
        let meta = std::fs::metadata(&bin).with_context(|| {
            format!(
                "Istio's ztunnel is not at {}: pass the directory holding `ztunnel` and `ca/`",
                bin.display()
            )
        })?;
        if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 {
            bail!("{} is not an executable file", bin.display());
        }
        let ca_dir = dir.join("ca");
        for f in CA_FILES {
            if !ca_dir.join(f).is_file() {
                bail!(
                    "the peer's test CA is incomplete: {} is missing",
                    ca_dir.join(f).display()
                );
            }
        }
        Ok(IstioZtunnel {
            bin: std::fs::canonicalize(&bin)?,
            ca_dir: std::fs::canonicalize(&ca_dir)?,
        })
    }

    /// The peer named by `AMBIT_PEER_DIR`, else the default directory next to the
    /// workspace (`CARGO_MANIFEST_DIR` of the caller locates the workspace).
    pub fn from_env(workspace: &Path) -> anyhow::Result<IstioZtunnel> {
        let dir = match std::env::var_os("AMBIT_PEER_DIR") {
            Some(d) => PathBuf::from(d),
            None => workspace.join(DEFAULT_PEER_DIR),
        };
        Self::find(&dir)
    }

    /// Copies the peer's test root into `dest` with the key readable by its owner only
    /// (the peer's files are read-only for everyone; a CA key must not be).
    pub fn copy_ca(&self, dest: &Path) -> anyhow::Result<()> {
        std::fs::create_dir_all(dest)?;
        for f in CA_FILES {
            let to = dest.join(f);
            let bytes = std::fs::read(self.ca_dir.join(f))
                .with_context(|| format!("reading the peer's {f}"))?;
            let mode = if f == ambit_identity::ca::CA_KEY_FILE {
                0o600
            } else {
                0o644
            };
            // Created with its mode (never briefly open to others), and set again in case
            // `to` was already there; ambit's proxy refuses a key others can read.
            let _ = std::fs::remove_file(&to);
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(mode)
                .open(&to)
                .with_context(|| format!("creating {}", to.display()))?;
            std::io::Write::write_all(&mut file, &bytes)?;
            file.set_permissions(std::fs::Permissions::from_mode(mode))?;
        }
        Ok(())
    }
}

/// The implementation a lab node's proxy runs.
#[derive(Clone, Debug)]
pub enum NodeProxy {
    /// `ambit ztunnel`, from this binary.
    Ambit(PathBuf),
    /// Istio's ztunnel with `FAKE_CA=true`: it signs its certificates with its test root,
    /// which the lab then gives ambit as `LOCAL_CA_DIR` so the two trust each other.
    Istio(IstioZtunnel),
}

impl NodeProxy {
    /// `ambit` or `istio`, for names and reports.
    pub fn label(&self) -> &'static str {
        match self {
            NodeProxy::Ambit(_) => "ambit",
            NodeProxy::Istio(_) => "istio",
        }
    }

    pub fn is_istio(&self) -> bool {
        matches!(self, NodeProxy::Istio(_))
    }

    /// The program and arguments that run the node proxy.
    pub fn command(&self) -> (&Path, &'static [&'static str]) {
        match self {
            NodeProxy::Ambit(bin) => (bin, &["ztunnel"]),
            // As Istio's chart runs it.
            NodeProxy::Istio(p) => (&p.bin, &["proxy", "ztunnel"]),
        }
    }

    /// The process name (`/proc/<pid>/comm`) of a running node proxy.
    pub fn comm(&self) -> &'static str {
        match self {
            NodeProxy::Ambit(_) => "ambit",
            NodeProxy::Istio(_) => "ztunnel",
        }
    }

    /// The environment every node proxy of the lab gets, whatever its implementation:
    /// no xDS (the mesh comes from `config`), certificates from the lab's CA.
    pub fn env(&self, config: &Path, ca_dir: &Path) -> Vec<(&'static str, String)> {
        let mut env = vec![
            ("LOCAL_XDS_PATH", config.display().to_string()),
            // Empty disables xDS; Istio's default would dial istiod.
            ("XDS_ADDRESS", String::new()),
            ("RUST_LOG", "info".to_string()),
            // The DNS proxies stay off unless a test turns them on (its proxy env comes
            // after this): the lab's pods do not resolve names, and both do the same work.
            ("ISTIO_META_DNS_CAPTURE", "false".to_string()),
        ];
        match self {
            NodeProxy::Ambit(_) => env.push(("LOCAL_CA_DIR", ca_dir.display().to_string())),
            NodeProxy::Istio(_) => {
                env.push(("FAKE_CA", "true".to_string()));
            }
        }
        env
    }
}

/// The CA directory a lab writes for its node proxies: the peer's test root when an Istio
/// node takes part (Istio's fake CA signs with it), else a fresh root for this lab.
pub fn write_lab_ca(dir: &Path, proxies: &[&NodeProxy]) -> anyhow::Result<()> {
    match proxies.iter().find_map(|p| match p {
        NodeProxy::Istio(peer) => Some(peer),
        NodeProxy::Ambit(_) => None,
    }) {
        Some(peer) => peer.copy_ca(dir),
        None => Ok(
            ambit_identity::CertificateAuthority::ephemeral("cluster.local")?
                .write_plugin_dir(dir)?,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ambit_identity::ca::CA_KEY_FILE;
    use ambit_identity::CertificateAuthority;

    fn key_mode(dir: &Path) -> u32 {
        std::fs::metadata(dir.join(CA_KEY_FILE))
            .unwrap()
            .permissions()
            .mode()
            & 0o777
    }

    /// Both ways a lab gets its CA leave a key the proxy accepts (owner-only).
    #[test]
    fn lab_ca_keys_are_owner_only() {
        let tmp = super::super::tempfile_dir::TempDir::new(&format!(
            "ambit-test-lab-ca-{}",
            std::process::id()
        ))
        .unwrap();
        let own = tmp.path().join("own");
        write_lab_ca(&own, &[&NodeProxy::Ambit(PathBuf::from("/bin/true"))]).unwrap();
        assert_eq!(key_mode(&own), 0o600);
        CertificateAuthority::from_plugin_dir(&own).unwrap();

        // The peer ships its test root read-only for everyone; the copy is 0600.
        let shipped = tmp.path().join("peer-ca");
        CertificateAuthority::ephemeral("cluster.local")
            .unwrap()
            .write_plugin_dir(&shipped)
            .unwrap();
        for f in CA_FILES {
            std::fs::set_permissions(shipped.join(f), std::fs::Permissions::from_mode(0o444))
                .unwrap();
        }
        let peer = IstioZtunnel {
            bin: PathBuf::from("/bin/true"),
            ca_dir: shipped,
        };
        let copy = tmp.path().join("copy");
        write_lab_ca(&copy, &[&NodeProxy::Istio(peer.clone())]).unwrap();
        assert_eq!(key_mode(&copy), 0o600);
        CertificateAuthority::from_plugin_dir(&copy).unwrap();
        // Copying again over the first copy keeps it so.
        peer.copy_ca(&copy).unwrap();
        assert_eq!(key_mode(&copy), 0o600);
    }
}
