//! The SOCKS5 greeting and request parsers, read as the server reads them. The body, its input
//! layout and its checks: `ambit_fuzz::socks5_request::run`, which `tests/seeds.rs` replays on
//! every seed.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = ambit_fuzz::socks5_request::run(data);
});
