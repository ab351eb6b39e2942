//! The process kit: what every ambit process (`ambit ztunnel`, `ambit waypoint`, `ambit
//! control`) is wired from, so each is wired the same way:
//!
//! - [`env`]: Istio's environment, read one way ([`env::ProcessEnv`]: a value that is not
//!   UTF-8 is refused by name wherever it is read), and the forms values take;
//! - [`ca`] and [`certs`]: where certificates come from (`CA_ADDRESS`, `LOCAL_CA_DIR`, an
//!   ephemeral root) and the certificate manager built from it;
//! - [`xds`]: the xDS channel and the node a proxy announces (`XDS_ADDRESS`, `ISTIO_META_*`);
//! - [`operator`]: the admin, metrics and readiness ports, bound first and served with the
//!   drain;
//! - [`lifecycle`]: the metrics registry, and serving until told to stop, then a bounded
//!   drain;
//! - [`mesh_file`]: ztunnel's local mesh file, loaded, watched and re-applied with the last
//!   good version of a refused policy kept.
#![forbid(unsafe_code)]

pub mod ca;
pub mod certs;
pub mod env;
pub mod lifecycle;
pub mod mesh_file;
pub mod operator;
pub mod xds;

/// A variable that does not hold: which one, what it was, what was expected.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("{var}={value:?} is not valid: expected {expected}")]
    Invalid {
        var: &'static str,
        value: String,
        expected: &'static str,
    },
    #[error("{0}")]
    Conflict(String),
    #[error("{var} is required when {because}")]
    Missing {
        var: &'static str,
        because: &'static str,
    },
}
