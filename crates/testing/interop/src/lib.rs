//! The interop and differential suites against Istio's own ztunnel (`scripts/interop`).
//!
//! This library holds what the suites are made of and what can be tested without the peer
//! (that runs in the main test suite): an agent side of ZDS written from the reference
//! alone ([`zds_peer`]), HBONE observers on plain rustls and h2 ([`hbone_probe`]), the apps
//! at the ends of the wires ([`apps`]), and the comparators that line up what ambit and
//! Istio show ([`compare`]). The suites themselves are `tests/interop`, built only with the
//! `peer` feature.

pub mod apps;
pub mod certs;
pub mod compare;
pub mod hbone_probe;
pub mod zds_peer;

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

pub use ambit_netns_lab::peer::{IstioZtunnel, NodeProxy};

/// The workspace root (three levels above this crate).
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../..")
        .canonicalize()
        .expect("the workspace root exists")
}

/// Istio's ztunnel, from `AMBIT_PEER_DIR` or `../shared/peers/istio-ztunnel`; a suite that
/// needs it fails with this error when it is missing, never skips.
pub fn peer() -> anyhow::Result<IstioZtunnel> {
    IstioZtunnel::from_env(&workspace())
}

/// The `ambit` binary under test: `AMBIT_BIN`, else the one Cargo built beside this test
/// executable (`target/<profile>/ambit`); `scripts/interop` builds it first.
pub fn ambit_bin() -> anyhow::Result<PathBuf> {
    let path = match std::env::var_os("AMBIT_BIN") {
        Some(p) => PathBuf::from(p),
        None => {
            let exe = std::env::current_exe()?;
            // target/<profile>/deps/<test binary>
            exe.parent()
                .and_then(Path::parent)
                .context("locating the target directory")?
                .join("ambit")
        }
    };
    if !path.is_file() {
        bail!(
            "the ambit binary is not at {}: build it (`cargo build -p ambit`) or set AMBIT_BIN",
            path.display()
        );
    }
    if std::env::var_os("AMBIT_BIN").is_none() {
        let built = std::fs::metadata(&path)?.modified()?;
        if let Some(newer) = newest_source(&workspace().join("crates")).filter(|(t, _)| *t > built)
        {
            bail!(
                "{} is older than {}: rebuild it (`cargo build -p ambit`; scripts/interop does)",
                path.display(),
                newer.1.display()
            );
        }
    }
    Ok(path.canonicalize()?)
}

/// The most recently modified `.rs` file under `dir` (tests excluded: they are not in
/// the binary).
fn newest_source(dir: &Path) -> Option<(std::time::SystemTime, PathBuf)> {
    let mut newest: Option<(std::time::SystemTime, PathBuf)> = None;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).ok()?.flatten() {
            let path = entry.path();
            let name = entry.file_name();
            if path.is_dir() {
                if name != "tests" && name != "interop" && name != "examples" && name != "benches" {
                    stack.push(path);
                }
            } else if path.extension().is_some_and(|e| e == "rs") {
                if let Ok(t) = entry.metadata().and_then(|m| m.modified()) {
                    if newest.as_ref().is_none_or(|(n, _)| t > *n) {
                        newest = Some((t, path));
                    }
                }
            }
        }
    }
    newest
}

/// Both implementations, ambit's first.
pub fn both() -> anyhow::Result<[NodeProxy; 2]> {
    Ok([NodeProxy::Ambit(ambit_bin()?), NodeProxy::Istio(peer()?)])
}
