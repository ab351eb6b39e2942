//! Istio's environment, as any ambit proxy reads it: a variable reader that checks each
//! value's form ([`env`]), where certificates come from (`CA_ADDRESS`, `LOCAL_CA_DIR`:
//! [`ca`]) and how to reach the xDS server and what node to announce (`XDS_ADDRESS`,
//! `POD_NAME`, `ISTIO_META_*`: [`xds`]). The node proxy (`ambit ztunnel`) and the waypoint
//! (`ambit waypoint`) read the same names the same way.
#![forbid(unsafe_code)]

pub mod ca;
pub mod env;
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
