//! The `forwarded` header (RFC 7239): `for="<client ip:port>"` and, when the destination
//! service is known, `;host=<service hostname>`.

use std::net::SocketAddr;

/// Longest `forwarded` value we look at; anything past it is ignored.
const MAX_INPUT: usize = 8192;

/// Builds `for="1.2.3.4:80";host=svc.ns.svc.cluster.local` (IPv6 bracketed inside the quotes:
/// `for="[::1]:80"`). An empty host is omitted. A host that is not a plain token is sent as a
/// quoted string; characters that cannot appear in a header value are dropped.
pub fn forwarded_value(client: SocketAddr, host: Option<&str>) -> String {
    let mut out = format!("for=\"{client}\"");
    if let Some(host) = host.filter(|h| !h.is_empty()) {
        out.push_str(";host=");
        if host.bytes().all(is_tchar) {
            out.push_str(host);
        } else {
            out.push('"');
            for c in host
                .chars()
                .filter(|c| c.is_ascii() && (*c == ' ' || c.is_ascii_graphic()))
            {
                if c == '"' || c == '\\' {
                    out.push('\\');
                }
                out.push(c);
            }
            out.push('"');
        }
    }
    out
}

/// Extracts the first non-empty `host=` parameter from a `forwarded` value. Tolerant of RFC
/// 7239 syntax: several comma-separated elements, `;`-separated pairs, case-insensitive names,
/// optional whitespace, quoted strings with backslash escapes (which may contain `,` and `;`).
pub fn forwarded_host(value: &str) -> Option<String> {
    let value = truncate(value, MAX_INPUT);
    for element in split_unquoted(value, b',') {
        for pair in split_unquoted(element, b';') {
            let Some((name, v)) = pair.split_once('=') else {
                continue;
            };
            if !name.trim().eq_ignore_ascii_case("host") {
                continue;
            }
            let v = unquote(v.trim());
            if !v.is_empty() {
                return Some(v);
            }
        }
    }
    None
}

/// RFC 7230 `tchar`.
fn is_tchar(c: u8) -> bool {
    c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&c)
}

/// The longest prefix of `s` that is at most `max` bytes and ends on a char boundary.
fn truncate(s: &str, max: usize) -> &str {
    &s[..s.floor_char_boundary(max)]
}

/// Splits on `sep` outside double-quoted strings (honouring backslash escapes inside them).
fn split_unquoted(s: &str, sep: u8) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut start = 0;
    let mut quoted = false;
    let mut escaped = false;
    for (i, &c) in s.as_bytes().iter().enumerate() {
        if quoted {
            if escaped {
                escaped = false;
            } else if c == b'\\' {
                escaped = true;
            } else if c == b'"' {
                quoted = false;
            }
        } else if c == b'"' {
            quoted = true;
        } else if c == sep {
            // `sep` is ASCII, so `i` and `i + 1` are char boundaries.
            parts.push(&s[start..i]);
            start = i + 1;
        }
    }
    parts.push(&s[start..]);
    parts
}

/// Removes surrounding quotes and backslash escapes from a quoted string; a token is returned
/// as is. An unterminated quoted string yields what follows the opening quote.
fn unquote(v: &str) -> String {
    let Some(inner) = v.strip_prefix('"') else {
        return v.to_string();
    };
    let mut out = String::with_capacity(inner.len());
    let mut escaped = false;
    for c in inner.chars() {
        if escaped {
            out.push(c);
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == '"' {
            break;
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build() {
        let v4: SocketAddr = "127.0.0.1:80".parse().unwrap();
        let v6: SocketAddr = "[::1]:80".parse().unwrap();
        assert_eq!(
            forwarded_value(v4, Some("example.com")),
            r#"for="127.0.0.1:80";host=example.com"#
        );
        assert_eq!(forwarded_value(v6, None), r#"for="[::1]:80""#);
        assert_eq!(forwarded_value(v6, Some("")), r#"for="[::1]:80""#);
        assert_eq!(
            forwarded_value(v4, Some("svc.ns.svc.cluster.local")),
            r#"for="127.0.0.1:80";host=svc.ns.svc.cluster.local"#
        );
    }

    #[test]
    fn build_hostile_host() {
        let v4: SocketAddr = "1.2.3.4:5".parse().unwrap();
        let v = forwarded_value(v4, Some("a\"b;c,d\\e\r\nf é"));
        assert!(http::HeaderValue::from_str(&v).is_ok(), "{v}");
        assert_eq!(forwarded_host(&v).as_deref(), Some("a\"b;c,d\\ef "));
    }

    #[test]
    fn parse() {
        assert_eq!(
            forwarded_host(r#"for="127.0.0.1:80";host=example.com"#).as_deref(),
            Some("example.com")
        );
        assert_eq!(forwarded_host(r#"for="[::1]:80""#), None);
        assert_eq!(
            forwarded_host(r#"For=x; HOST = "a.b" ; proto=http"#).as_deref(),
            Some("a.b")
        );
        assert_eq!(
            forwarded_host(r#"for=x, for=y;host=second"#).as_deref(),
            Some("second")
        );
        assert_eq!(
            forwarded_host(r#"for="a;host=fake,x";host=real"#).as_deref(),
            Some("real")
        );
        assert_eq!(forwarded_host(r#"host="";host=b"#).as_deref(), Some("b"));
        assert_eq!(
            forwarded_host(r#"host="unterminated"#).as_deref(),
            Some("unterminated")
        );
        assert_eq!(forwarded_host(r#"host="a\"b""#).as_deref(), Some("a\"b"));
        assert_eq!(forwarded_host("hostname=x"), None);
        assert_eq!(forwarded_host(""), None);
        assert_eq!(forwarded_host("\"\"\"\\"), None);
        assert_eq!(forwarded_host(";;;,,,==="), None);
    }

    #[test]
    fn parse_huge_and_non_ascii() {
        let v = "é".repeat(10_000) + ";host=late";
        assert_eq!(forwarded_host(&v), None);
        assert_eq!(forwarded_host("host=é").as_deref(), Some("é"));
        assert_eq!(truncate("éé", 3), "é");
    }

    #[test]
    fn round_trip() {
        let a: SocketAddr = "[2001:db8::1]:4444".parse().unwrap();
        let v = forwarded_value(a, Some("reviews.default.svc.cluster.local"));
        assert_eq!(
            forwarded_host(&v).as_deref(),
            Some("reviews.default.svc.cluster.local")
        );
    }
}
