//! Kubernetes-shaped YAML manifests (Istio AuthorizationPolicy) for the waypoint. The body,
//! its input layout and its checks: `ambit_fuzz::manifests::run`, which `tests/seeds.rs`
//! replays on every seed.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = ambit_fuzz::manifests::run(data);
});
