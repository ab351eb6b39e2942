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

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// Random and mutated inputs never panic any parser (a cheap stand-in for a fuzz target).
    #[test]
    fn parsers_survive_random_input() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x0048_424f_4e45);
        let seeds = [
            "10.0.0.1:80",
            "[ff06::c3]:80",
            "svc.ns.svc.cluster.local:8080",
            "k8s.cluster.name=c,k8s.deployment.name=w;p=1",
            r#"for="[::1]:80";host="a\"b",for=x"#,
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ];
        let alphabet: Vec<char> = ":[]%.,;=\"\\ -0123456789abcdefxyzé\u{0}\u{7f}\u{10ffff}"
            .chars()
            .collect();
        for i in 0..20_000 {
            let s: String = if i % 2 == 0 {
                let len = rng.gen_range(0..80);
                (0..len)
                    .map(|_| alphabet[rng.gen_range(0..alphabet.len())])
                    .collect()
            } else {
                let mut s: Vec<char> = seeds[rng.gen_range(0..seeds.len())].chars().collect();
                for _ in 0..rng.gen_range(1..4) {
                    let c = alphabet[rng.gen_range(0..alphabet.len())];
                    match rng.gen_range(0..3) {
                        0 if !s.is_empty() => {
                            let at = rng.gen_range(0..s.len());
                            s[at] = c;
                        }
                        1 if !s.is_empty() => {
                            s.remove(rng.gen_range(0..s.len()));
                        }
                        _ => {
                            let at = rng.gen_range(0..=s.len());
                            s.insert(at, c);
                        }
                    }
                }
                s.into_iter().collect()
            };
            if let Ok(a) = parse_authority(&s) {
                // Whatever parses displays as something that parses to the same value.
                assert_eq!(parse_authority(&a.to_string()).as_ref(), Ok(&a), "{s:?}");
            }
            let b = Baggage::parse([s.as_str()]);
            assert!(
                http::HeaderValue::from_str(&b.to_header_value()).is_ok(),
                "{s:?}"
            );
            let _ = forwarded_host(&s);
            if let Ok(t) = TraceParent::parse(&s) {
                assert_eq!(TraceParent::parse(&t.to_string()), Ok(t));
            }
            let _ = excerpt(&s);
        }
    }
}
