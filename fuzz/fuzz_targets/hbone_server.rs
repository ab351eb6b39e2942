//! Raw bytes into the HBONE server: where the TLS ClientHello should be, or (past TLS) as
//! HTTP/2 frames into the server's stream handling, CONNECT validation and limits.
//!
//! Input: byte 0 even = TLS, odd = HTTP/2 (the client preface is added); the rest is what
//! the client sends; it then only reads until the server closes.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "drivers/hbone_server.rs"]
mod driver;

fuzz_target!(|data: &[u8]| {
    let outcome = driver::drive(data);
    // Whatever the bytes, the connection ends (time is virtual, every wait is bounded)
    // and only CONNECTs reach the handler.
    if !data.is_empty() {
        assert!(outcome.ended.is_some(), "the connection never ended");
    }
    if data.first().is_some_and(|m| m % 2 == 0) {
        // Without a TLS handshake no request can arrive.
        assert!(outcome.connects.is_empty(), "{:?}", outcome.connects);
    }
});
