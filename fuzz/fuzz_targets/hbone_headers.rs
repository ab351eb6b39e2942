//! HBONE request metadata (`:authority`, `baggage`, `forwarded`, `traceparent`) and `validate`.
//! The body, its input layout and its checks: `ambit_fuzz::hbone_headers::run`, which
//! `tests/seeds.rs` replays on every seed.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = ambit_fuzz::hbone_headers::run(data);
});
