//! SPIFFE ids, as read from peer certificates, policies and configuration. The body, its input
//! layout and its checks: `ambit_fuzz::spiffe_id::run`, which `tests/seeds.rs` replays on every
//! seed.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = ambit_fuzz::spiffe_id::run(data);
});
