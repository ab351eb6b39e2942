//! Sequences of ZDS messages, reconnects, retries and start outcomes into the node proxy's
//! `ambit_zds::WorkloadStates`. The body, its input layout and its checks:
//! `ambit_fuzz::zds_sequences::proxy`, which `tests/seeds.rs` replays on every seed.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = ambit_fuzz::zds_sequences::proxy(data);
});
