//! One `ambit.waypoint.v1.AuthorizationPolicy` body from a control plane (ambit's own xDS
//! type for its waypoints): the shape walk, the decoding with every check a file's policy
//! passes, and the delta client (the body is `ambit_xds::fuzzing::waypoint_policy_body`,
//! tested with its crate).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = ambit_xds::fuzzing::waypoint_policy_body(data);
});
