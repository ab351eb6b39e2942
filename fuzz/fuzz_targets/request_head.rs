//! A request head as the waypoint prepares it before any decision. The body, its input
//! layout and its checks: `ambit_fuzz::request_head::run`, which `tests/seeds.rs` replays on
//! every seed.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = ambit_fuzz::request_head::run(data);
});
