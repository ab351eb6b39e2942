//! Finding a rule's tokens in a request, as Envoy's extractor does (sans-IO):
//!
//! - A header location yields one token per value of the header. With a prefix, the prefix
//!   is searched for anywhere in the value (case-sensitive; a value without it yields
//!   nothing) and the token starts at the first base64url character or dot after it and
//!   runs to the end of the value. Without a prefix the whole value is the token.
//! - A query parameter yields its first occurrence, percent-decoded (`%XX`; `+` is kept).
//! - A cookie yields its first occurrence (surrounding double quotes removed).
//!
//! Headers come first, then parameters, then cookies, each in the rule's location order.
//! The query-string edit that removes a token parameter is here too.

use std::borrow::Cow;

use http::HeaderMap;

use crate::rule::{JwtRule, Location};

/// One token found, and where.
#[derive(Debug, Clone)]
pub(crate) struct Found<'a> {
    pub token: Cow<'a, [u8]>,
    pub location: &'a Location,
}

/// Every token of `rule`'s locations, in Envoy's order.
pub(crate) fn tokens<'a>(
    rule: &'a JwtRule,
    headers: &'a HeaderMap,
    query: Option<&'a str>,
) -> Vec<Found<'a>> {
    let mut found = Vec::new();
    for location in &rule.locations {
        match location {
            Location::Header { name, prefix } => {
                for value in headers.get_all(name) {
                    if let Some(token) = after_prefix(value.as_bytes(), prefix.as_bytes()) {
                        found.push(Found {
                            token: Cow::Borrowed(token),
                            location,
                        });
                    }
                }
            }
            Location::Param(param) => {
                if let Some(token) = query.and_then(|q| first_param(q, param)) {
                    found.push(Found { token, location });
                }
            }
            Location::Cookie(cookie) => {
                if let Some(token) = first_cookie(headers, cookie) {
                    found.push(Found {
                        token: Cow::Borrowed(token),
                        location,
                    });
                }
            }
        }
    }
    found
}

fn jwt_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.')
}

/// The token in a header value: after `prefix` (found anywhere), from the first base64url
/// or dot byte on; the rest of the value as it is when no such byte follows (Envoy's
/// fallback, which then fails to parse).
fn after_prefix<'v>(value: &'v [u8], prefix: &[u8]) -> Option<&'v [u8]> {
    if prefix.is_empty() {
        return Some(value);
    }
    let at = value.windows(prefix.len()).position(|w| w == prefix)?;
    let rest = &value[at + prefix.len()..];
    Some(match rest.iter().position(|&b| jwt_byte(b)) {
        Some(start) => &rest[start..],
        None => value,
    })
}

/// The first value of `name` in a query string (names and values percent-decoded; a name
/// without `=` has an empty value).
fn first_param<'q>(query: &'q str, name: &str) -> Option<Cow<'q, [u8]>> {
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (percent_decode(k.as_bytes()).as_ref() == name.as_bytes())
            .then(|| percent_decode(v.as_bytes()))
    })
}

fn percent_decode(s: &[u8]) -> Cow<'_, [u8]> {
    if !s.contains(&b'%') {
        return Cow::Borrowed(s);
    }
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        if s[i] == b'%' && i + 2 < s.len() {
            if let (Some(h), Some(l)) = (hex(s[i + 1]), hex(s[i + 2])) {
                out.push(h << 4 | l);
                i += 3;
                continue;
            }
        }
        out.push(s[i]);
        i += 1;
    }
    Cow::Owned(out)
}

fn hex(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

/// The first cookie named `name` over every `cookie` header.
fn first_cookie<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h [u8]> {
    headers.get_all(http::header::COOKIE).iter().find_map(|h| {
        h.as_bytes().split(|&b| b == b';').find_map(|pair| {
            let pair = pair.trim_ascii();
            let eq = pair.iter().position(|&b| b == b'=')?;
            let (k, v) = (&pair[..eq], &pair[eq + 1..]);
            (k == name.as_bytes()).then(|| {
                v.strip_prefix(b"\"")
                    .and_then(|v| v.strip_suffix(b"\""))
                    .unwrap_or(v)
            })
        })
    })
}

/// `query` without every pair whose decoded name is one of `params`, the other pairs kept
/// byte for byte; `None` when no pair is left.
pub(crate) fn strip_params(query: &str, params: &[String]) -> Option<String> {
    let kept: Vec<&str> = query
        .split('&')
        .filter(|pair| {
            let k = pair.split_once('=').map_or(*pair, |(k, _)| k);
            let k = percent_decode(k.as_bytes());
            !params.iter().any(|p| p.as_bytes() == k.as_ref())
        })
        .collect();
    let kept = kept.join("&");
    (!kept.is_empty()).then_some(kept)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_is_found_anywhere_and_the_token_runs_to_the_end() {
        assert_eq!(
            after_prefix(b"Bearer a.b.c", b"Bearer "),
            Some(&b"a.b.c"[..])
        );
        assert_eq!(
            after_prefix(b"Basic x, Bearer a.b.c", b"Bearer "),
            Some(&b"a.b.c"[..])
        );
        assert_eq!(
            after_prefix(b"Bearer   a.b.c x", b"Bearer "),
            Some(&b"a.b.c x"[..])
        );
        assert_eq!(after_prefix(b"bearer a.b.c", b"Bearer "), None);
        assert_eq!(after_prefix(b"Bearer ", b"Bearer "), Some(&b"Bearer "[..]));
        assert_eq!(after_prefix(b"whole", b""), Some(&b"whole"[..]));
    }

    #[test]
    fn params_are_decoded_and_the_first_wins() {
        let q = "a=1&access%5Ftoken=x%2Ey&access_token=second&b";
        assert_eq!(first_param(q, "access_token").as_deref(), Some(&b"x.y"[..]));
        assert_eq!(first_param(q, "b").as_deref(), Some(&b""[..]));
        assert_eq!(first_param(q, "c"), None);
        assert_eq!(percent_decode(b"%zz%4").as_ref(), b"%zz%4");
        assert_eq!(percent_decode(b"%41%").as_ref(), b"A%");
    }

    #[test]
    fn strip_keeps_other_pairs_verbatim() {
        let params = vec!["access_token".to_string()];
        assert_eq!(
            strip_params("a=%20&access_token=t&b=2&access%5ftoken=u", &params).as_deref(),
            Some("a=%20&b=2")
        );
        assert_eq!(strip_params("access_token=t", &params), None);
    }
}
