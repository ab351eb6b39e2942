//! Peer certificates (DER): their SPIFFE ids and the `/config_dump` view. The body, its input
//! layout and its checks: `ambit_fuzz::x509_cert::run`, which `tests/seeds.rs` replays on every
//! seed.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = ambit_fuzz::x509_cert::run(data);
});
