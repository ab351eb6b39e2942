//! Raw bytes into the HBONE server, before TLS or (past TLS) as HTTP/2 frames. The body, its
//! input layout and its checks: `ambit_fuzz::hbone_server::run`, which `tests/seeds.rs` replays
//! on every seed.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = ambit_fuzz::hbone_server::run(data);
});
