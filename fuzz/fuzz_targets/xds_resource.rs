//! One xDS resource body from a control plane (`istio.workload.Address` or
//! `istio.security.Authorization`): the shape walk that bounds what is decoded, checked
//! against `prost`'s decoding, then the delta client's checks (the body is
//! `ambit_xds::fuzzing::resource_body`, tested with its crate).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    ambit_xds::fuzzing::resource_body(data);
});
