//! The installer's edit of the host's CNI configuration. The body, its input layout and its checks:
//! `ambit_fuzz::cni_conflist::run`, which `tests/seeds.rs` replays on every seed.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = ambit_fuzz::cni_conflist::run(data);
});
