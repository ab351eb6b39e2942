//! HBONE request headers, sans-IO: pure functions that parse and format the `:authority`,
//! `baggage`, `forwarded` and `traceparent` values. Everything here is safe on hostile input:
//! no panics, bounded work, and errors instead of guesses.

mod authority;
mod baggage;
mod forwarded;
mod traceparent;

pub(crate) use authority::is_dns_name as authority_is_dns_name;
pub use authority::{parse_authority, Authority, MAX_AUTHORITY_LEN};
pub use baggage::Baggage;
pub use forwarded::{forwarded_host, forwarded_value};
pub use traceparent::TraceParent;

/// `baggage`: source (request) or destination (response) workload metadata.
pub const BAGGAGE: &str = "baggage";
/// `forwarded` (RFC 7239): `for="<client ip:port>"` and optionally `host=<service hostname>`.
pub const FORWARDED: &str = "forwarded";
/// `traceparent` (W3C trace context).
pub const TRACEPARENT: &str = "traceparent";
/// `x-forwarded-network`: set only on the inner CONNECT of double HBONE.
pub const X_FORWARDED_NETWORK: &str = "x-forwarded-network";

/// Shortens and escapes hostile input before it goes into an error message or a log line.
pub(crate) fn excerpt(s: &str) -> String {
    const MAX: usize = 64;
    let mut out: String = s.chars().take(MAX).flat_map(char::escape_default).collect();
    if s.chars().nth(MAX).is_some() {
        out.push_str("...");
    }
    out
}
