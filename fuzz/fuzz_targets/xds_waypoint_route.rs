//! One `ambit.waypoint.v1.Route` body from a control plane (ambit's own xDS type carrying
//! an HTTPRoute or GRPCRoute document): the bound, the document read as a file's, and the
//! delta client (the body is `ambit_xds::fuzzing::waypoint_route_body`, tested with its
//! crate).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = ambit_xds::fuzzing::waypoint_route_body(data);
});
