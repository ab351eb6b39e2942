//! Test support for ambit's deployment artifacts: the Helm charts in `charts/` and the
//! container images `scripts/images` builds.
//!
//! - [`chart`] renders a chart with `helm template` and parses the objects;
//!   [`chart::validate`] checks them against Kubernetes' schemas.
//! - [`spec`] reads a rendered container's security settings, mounts and environment.
//! - [`podman`] runs an image the way that container spec says, in a network namespace
//!   from [`netns`].
//! - [`image`] builds the images and reads their OCI layouts.
//!
//! The external tools (helm, kubernetes-validate) come from `scripts/charts tools`, which
//! downloads pinned versions into `target/tools` the first time.

pub mod chart;
pub mod image;
pub mod netns;
pub mod podman;
pub mod spec;
pub mod tools;

use std::path::{Path, PathBuf};

/// What went wrong, and whose it is to fix.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("running {what}: {source} (is it installed? scripts/tools.sh installs it on Debian)")]
    Spawn {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{what} failed ({status}):\n{stderr}")]
    Failed {
        what: String,
        status: std::process::ExitStatus,
        stderr: String,
    },
    #[error("{what} printed output we cannot read: {detail}")]
    Output { what: String, detail: String },
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("the rendered objects: {0}")]
    Spec(String),
}

pub type Result<T> = std::result::Result<T, Error>;

/// The workspace's root directory (where `charts/` and `scripts/` are).
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../..")
        .canonicalize()
        .unwrap_or_else(|_| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.."))
}

/// Runs a command to completion; a non-zero exit is an error carrying its stderr.
pub(crate) fn run(what: &str, cmd: &mut std::process::Command) -> Result<std::process::Output> {
    let out = cmd.output().map_err(|source| Error::Spawn {
        what: what.to_string(),
        source,
    })?;
    if !out.status.success() {
        return Err(Error::Failed {
            what: what.to_string(),
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    Ok(out)
}
