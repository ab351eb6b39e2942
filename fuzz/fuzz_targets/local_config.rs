//! ztunnel-format local configuration YAML (`LOCAL_XDS_PATH` / `LOCAL_XDS`). The body, its
//! input layout and its checks: `ambit_fuzz::local_config::run`, which `tests/seeds.rs` replays
//! on every seed.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = ambit_fuzz::local_config::run(data);
});
