//! A pod's labels or annotations from a downward-API volume. The body, its input layout and
//! its checks: `ambit_fuzz::pod_labels::run`, which `tests/seeds.rs` replays on every seed.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = ambit_fuzz::pod_labels::run(data);
});
