//! The chained CNI plugin with an in-memory node agent, and the agent's request-line parser.
//! The body, its input layout and its checks: `ambit_fuzz::cni_plugin::run`, which
//! `tests/seeds.rs` replays on every seed.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = ambit_fuzz::cni_plugin::run(data);
});
