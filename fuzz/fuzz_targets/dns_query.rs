//! The DNS proxy's query path: bytes a pod sends to 15053, parsed, decided against a small
//! mesh and answered (`ambit_dns::fuzzing::query_path` holds the body and its checks).
//!
//! Input: byte 0 = mode bits (TCP, unknown client, IPv6 off, fixed search list); the rest
//! = the DNS message.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    ambit_dns::fuzzing::query_path(data);
});
