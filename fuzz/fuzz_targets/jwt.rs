//! Outside bytes as a JWT (in a request's `Authorization` header, `access_token` parameter
//! or a custom header) and as a JWKS document. The body, its input layout and its checks:
//! `ambit_jwt::fuzzing::run`, built and tested with its crate; `tests/seeds.rs` replays it
//! on every seed.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = ambit_jwt::fuzzing::run(data);
});
