//! The SOCKS5 greeting and request parsers (bytes from the local application on
//! 127.0.0.1:15080), read the way the server reads them: only as many bytes as the parser
//! asks for, never more.
//!
//! Input: the bytes a client sends, greeting then request.
#![no_main]

use ambit_proxy::socks5::wire::{parse_greeting, parse_request, Parsed};
use libfuzzer_sys::fuzz_target;

/// Feeds `parse` the prefix it asks for until it finishes, fails or the input runs out;
/// returns the bytes it consumed.
fn drive<T, E>(data: &[u8], parse: impl Fn(&[u8]) -> Result<Parsed<T>, E>) -> Option<usize> {
    let mut have = 0;
    loop {
        match parse(&data[..have]) {
            Ok(Parsed::Incomplete { need }) => {
                assert!(need > have, "asked for {need} bytes with {have} in hand");
                if need > data.len() {
                    return None;
                }
                have = need;
            }
            Ok(Parsed::Done(_, len)) => {
                assert_eq!(len, have, "a message must end where reading stopped");
                return Some(len);
            }
            Err(_) => return None,
        }
    }
}

fuzz_target!(|data: &[u8]| {
    // Whole buffers too: a parser must never read past what it was given.
    let _ = parse_greeting(data);
    let _ = parse_request(data);
    if let Some(used) = drive(data, parse_greeting) {
        drive(&data[used..], parse_request);
    }
});
