//! One xDS resource body from a control plane (`istio.workload.Address` or
//! `istio.security.Authorization`): the shape walk that bounds what is decoded, checked
//! against `prost`'s decoding, then the delta client's checks. The body:
//! `ambit_fuzz::xds_resource::resource_body` (its seeds and mutations: `tests/xds_bodies.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    ambit_fuzz::xds_resource::resource_body(data);
});
