//! Sequences of ZDS events into the node agent's sans-IO `ambit_agent::zds_session::Session`.
//! The body, its input layout and its checks: `ambit_fuzz::zds_sequences::agent`, which
//! `tests/seeds.rs` replays on every seed.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = ambit_fuzz::zds_sequences::agent(data);
});
