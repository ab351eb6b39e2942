//! The agent's reader of `iptables-save` output, the comparison with a plan and the removal
//! text. The body, its input layout and its checks: `ambit_fuzz::iptables_save::run`, which
//! `tests/seeds.rs` replays on every seed.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = ambit_fuzz::iptables_save::run(data);
});
