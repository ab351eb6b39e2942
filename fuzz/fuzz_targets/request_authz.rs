//! A request's target, method, host and headers, as a waypoint normalises and authorizes
//! them. The body, its input layout and its checks: `ambit_fuzz::request_authz::run`, which
//! `tests/seeds.rs` replays on every seed.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = ambit_fuzz::request_authz::run(data);
});
