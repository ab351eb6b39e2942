//! Delta xDS responses from a control plane: arbitrary bytes as a
//! `DeltaDiscoveryResponse` through ambit's delta client state machine into a
//! `ProxyState` (the body is `ambit_xds::fuzzing::delta_response`, tested with its crate).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    ambit_xds::fuzzing::delta_response(data);
});
