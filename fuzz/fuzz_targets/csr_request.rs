//! Certificate signing requests as `ambit control`'s CA receives them. The body, its input
//! layout and its checks: `ambit_fuzz::csr_request::run`, which `tests/seeds.rs` replays on
//! every seed.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = ambit_fuzz::csr_request::run(data);
});
