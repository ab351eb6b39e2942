//! The bodies of the fuzz targets, one module (or function) per target: each target's
//! binary in `fuzz_targets/` only calls its body, and `tests/seeds.rs` calls the same body
//! on every seed of the target's corpus, so the invariants a target asserts (round trips,
//! fd rules, the removal simulation, ...) run in every `cargo test` of this crate, not only
//! under the fuzzer. A body panics when an invariant breaks and returns what it reached,
//! which the seed test compares with each seed's expected outcome. What a body needs
//! beyond its seeds (edge inputs, mutations) is in `tests/bodies.rs`.

use std::fmt::Debug;

pub mod ca_dir;
pub mod cmdadd_request;
pub mod cni_conflist;
pub mod cni_plugin;
pub mod csr_request;
pub mod dns_query;
pub mod hbone_headers;
pub mod hbone_server;
pub mod ipset_save;
pub mod iptables_save;
pub mod jwt;
pub mod local_config;
pub mod manifests;
pub mod pod_cgroup;
pub mod pod_labels;
pub mod request_authz;
pub mod request_head;
pub mod socks5_request;
pub mod spiffe_id;
pub mod x509_cert;
pub mod xds_delta;
pub mod xds_resource;
pub mod xds_waypoint_document;
pub mod zds_request;
pub mod zds_sequences;

/// The name of an error's variant (`KeyMismatch` of `KeyMismatch { .. }`): what a seed
/// expects of a refusal, without the wording of its message.
pub fn variant(e: &impl Debug) -> String {
    format!("{e:?}")
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect()
}
