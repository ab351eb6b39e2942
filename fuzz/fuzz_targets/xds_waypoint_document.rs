//! The body of one of the waypoint's own xDS resources (a document as written) through
//! its type and a waypoint's delta client. The body, its input layout and its checks:
//! `ambit_fuzz::xds_waypoint_document::run`, which `tests/seeds.rs` replays on every seed.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = ambit_fuzz::xds_waypoint_document::run(data);
});
