//! A DNS query from a pod's client through the DNS proxy's local path: parsed, looked up in
//! the mesh and answered. The body and its checks: `ambit_fuzz::dns_query::query_path`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    ambit_fuzz::dns_query::query_path(data);
});
