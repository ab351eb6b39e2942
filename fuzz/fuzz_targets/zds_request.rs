//! ZDS messages as the node proxy and the node agent receive them, with the fd rules. The body,
//! its input layout and its checks: `ambit_fuzz::zds_request::run`, which `tests/seeds.rs`
//! replays on every seed.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = ambit_fuzz::zds_request::run(data);
});
