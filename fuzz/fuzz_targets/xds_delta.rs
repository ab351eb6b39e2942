//! Delta xDS responses from a control plane: arbitrary bytes as a `DeltaDiscoveryResponse`
//! through ambit's delta client state machine into a `ProxyState`. The body and its checks:
//! `ambit_fuzz::xds_delta::delta_response` (its seeds and mutations: `tests/xds_bodies.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    ambit_fuzz::xds_delta::delta_response(data);
});
