//! The CA directory's PEM files (`LOCAL_CA_DIR`, Istio's plug-in layout). The body, its input
//! layout and its checks: `ambit_fuzz::ca_dir::run`, which `tests/seeds.rs` replays on every
//! seed.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = ambit_fuzz::ca_dir::run(data);
});
