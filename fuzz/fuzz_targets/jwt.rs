//! Outside bytes as a JWT in a request (through every location) and as a JWKS document. The
//! body, its input layout and its checks: `ambit_fuzz::jwt::run`; `tests/seeds.rs` replays
//! it on every seed.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = ambit_fuzz::jwt::run(data);
});
