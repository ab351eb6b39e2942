//! The values routes share: header names and values, paths, hostnames, API groups and
//! kinds, object names and ports, as the CRDs check them. Each check returns what is wrong;
//! the caller names where.

use http::header::HeaderName;

use crate::translate::check_dns;

// The CRDs' limits.
pub(super) const MAX_PATH: usize = 1024;
pub(super) const MAX_HEADER_VALUE: usize = 4096;
const MAX_HEADER_NAME: usize = 256;

/// An HTTP header name as the CRD allows it (a token of RFC 7230, 1-256 long), lower-cased.
pub(crate) fn header_name(s: &str) -> Result<HeaderName, String> {
    let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
    if s.is_empty() || s.len() > MAX_HEADER_NAME || !s.chars().all(token) {
        return Err(format!(
            "{s:?} is not a header name: 1-{MAX_HEADER_NAME} letters, digits or !#$%&'*+-.^_`|~ (no ':' pseudo-headers)"
        ));
    }
    HeaderName::from_bytes(s.to_ascii_lowercase().as_bytes()).map_err(|e| format!("{s:?}: {e}"))
}

/// A header value written in a modifier: visible ASCII, single spaces or tabs between.
pub(super) fn header_value(s: &str) -> Result<(), String> {
    if s.is_empty() || s.len() > MAX_HEADER_VALUE {
        return Err(format!("must be 1-{MAX_HEADER_VALUE} characters"));
    }
    if http::HeaderValue::from_str(s).is_err() {
        return Err(format!(
            "{s:?} is not a header value (visible ASCII, spaces and tabs)"
        ));
    }
    Ok(())
}

/// An Exact or PathPrefix value, as the CRD's rules check it.
pub(super) fn check_path(v: &str) -> Result<(), String> {
    if !v.starts_with('/') {
        return Err(format!("{v:?} must be an absolute path, starting with '/'"));
    }
    for bad in ["//", "/./", "/../", "%2f", "%2F", "#"] {
        if v.contains(bad) {
            return Err(format!("{v:?} must not contain {bad:?}"));
        }
    }
    for bad in ["/..", "/."] {
        if v.ends_with(bad) {
            return Err(format!("{v:?} must not end with {bad:?}"));
        }
    }
    let bytes = v.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        if c == b'%' {
            let hex = |b: Option<&u8>| b.is_some_and(u8::is_ascii_hexdigit);
            if !hex(bytes.get(i + 1)) || !hex(bytes.get(i + 2)) {
                return Err(format!("{v:?} has a '%' not followed by two hex digits"));
            }
            i += 3;
            continue;
        }
        if !(c.is_ascii_alphanumeric() || b"-/._~!$&'()*+,;=:@".contains(&c)) {
            return Err(format!(
                "{v:?} has a character a path cannot hold unescaped ({:?}); percent-encode it",
                v[i..].chars().next().unwrap_or_default()
            ));
        }
        i += 1;
    }
    Ok(())
}

/// A precise hostname (RFC 1123, lower case, no wildcard, 1-253).
pub(super) fn check_hostname(h: &str) -> Result<(), String> {
    check_dns(h, 253, true)
        .map_err(|_| format!("{h:?} is not a hostname (lower-case RFC 1123, 1-253 characters)"))
}

pub(super) fn check_group(g: &str) -> Result<(), String> {
    if g.is_empty() {
        return Ok(());
    }
    check_dns(g, 253, true)
        .map_err(|_| format!("{g:?} is not an API group (empty for the core group, or a DNS name)"))
}

pub(super) fn check_kind(k: &str) -> Result<(), String> {
    let ok = k.len() <= 63
        && k.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        && !k.ends_with('-');
    ok.then_some(()).ok_or_else(|| {
        format!("{k:?} is not a kind (a letter, then letters, digits or '-', at most 63)")
    })
}

pub(super) fn check_object_name(n: &str) -> Result<(), String> {
    if n.is_empty() || n.len() > 253 {
        return Err("must be 1-253 characters".into());
    }
    Ok(())
}

pub(super) fn port(n: i64) -> Result<u16, String> {
    u16::try_from(n)
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| format!("{n} is not a port (1-65535)"))
}
