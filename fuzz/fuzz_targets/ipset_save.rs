//! The agent's reader of `ipset save` output. The body, its input layout and its checks:
//! `ambit_fuzz::ipset_save::run`, which `tests/seeds.rs` replays on every seed.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = ambit_fuzz::ipset_save::run(data);
});
