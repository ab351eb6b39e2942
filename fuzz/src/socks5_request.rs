//! The `socks5_request` target: the SOCKS5 greeting and request parsers (bytes from the
//! local application on 127.0.0.1:15080), read the way the server reads them: only as many
//! bytes as the parser asks for, never more.

use ambit_nodeproxy::socks5::wire::{parse_greeting, parse_request, Parsed, Target};

/// How far the bytes got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The greeting did not finish (refused, or the input ran out).
    NoGreeting,
    /// A greeting, then no finished request.
    Greeting,
    /// A greeting and a request for this target, ending `trailing` bytes before the input.
    Request { target: String, trailing: usize },
}

/// Feeds `parse` the prefix it asks for until it finishes, fails or the input runs out;
/// returns what it parsed and the bytes it consumed.
fn drive<T, E>(data: &[u8], parse: impl Fn(&[u8]) -> Result<Parsed<T>, E>) -> Option<(T, usize)> {
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
            Ok(Parsed::Done(value, len)) => {
                assert_eq!(len, have, "a message must end where reading stopped");
                return Some((value, len));
            }
            Err(_) => return None,
        }
    }
}

/// Input: the bytes a client sends, greeting then request.
///
/// Checks: a parser asks for more than it holds and never past the input; a finished
/// message ends exactly where reading stopped; whole buffers never panic.
pub fn run(data: &[u8]) -> Outcome {
    // Whole buffers too: a parser must never read past what it was given.
    let _ = parse_greeting(data);
    let _ = parse_request(data);
    let Some(((), used)) = drive(data, parse_greeting) else {
        return Outcome::NoGreeting;
    };
    match drive(&data[used..], parse_request) {
        Some((target, len)) => Outcome::Request {
            target: match target {
                Target::Addr(addr) => addr.to_string(),
                Target::Name { host, port } => format!("{host}:{port}"),
            },
            trailing: data.len() - used - len,
        },
        None => Outcome::Greeting,
    }
}
