//! The body of `POST /cmdadd` (the CNI plugin's call to the agent in Kubernetes mode). The
//! body, its input layout and its checks: `ambit_fuzz::cmdadd_request::run`, which
//! `tests/seeds.rs` replays on every seed.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = ambit_fuzz::cmdadd_request::run(data);
});
