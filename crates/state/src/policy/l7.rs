//! The L7 attributes of a match object (HTTP paths, methods, hosts, headers, request
//! principals, remote IPs, `when` conditions), typed as Istio's AuthorizationPolicy defines
//! them and read as it writes them (`"/api/*"`, `"*.example.com"`, `"*"`). One model for
//! the node proxy, which cannot see them (see [`crate::rbac`]), and an L7 proxy that will
//! evaluate them.
//!
//! Every value is checked as it is read: one that is malformed, or that could never match
//! (a path without its leading `/`, a lower-case method, a `*` inside a value), is refused
//! with the field named. What is accepted is written back (YAML, `/config_dump`) exactly as
//! it was written: a value is a string, so a YAML number or boolean must be quoted.

use std::fmt;

use ipnet::IpNet;
use serde::ser::Serializer;
use serde::Serialize;

use super::StringMatch;

/// The L7 attributes of one match object. `None`: not written; `Some` (even empty):
/// written, and so an attribute an L4 proxy must treat as unseen.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct L7Attributes {
    /// The request path, normalised and without its query.
    pub paths: Option<Vec<PathMatch>>,
    pub not_paths: Option<Vec<PathMatch>>,
    /// The HTTP method, compared case-sensitively (methods are upper case).
    pub methods: Option<Vec<StringMatch>>,
    pub not_methods: Option<Vec<StringMatch>>,
    /// `Host` / `:authority` without its port, compared case-insensitively.
    pub hosts: Option<Vec<StringMatch>>,
    pub not_hosts: Option<Vec<StringMatch>>,
    /// `<issuer>/<subject>` of a validated JWT.
    pub request_principals: Option<Vec<StringMatch>>,
    pub not_request_principals: Option<Vec<StringMatch>>,
    /// Request headers by name (compared without case), each with the match its value
    /// must pass; sorted by name, as a map of them is shown.
    pub headers: Option<Vec<HeaderMatch>>,
    pub not_headers: Option<Vec<HeaderMatch>>,
    /// The original client (`X-Forwarded-For`, PROXY protocol), as Istio's
    /// `remoteIpBlocks`.
    pub remote_ips: Option<Vec<IpBlock>>,
    pub not_remote_ips: Option<Vec<IpBlock>>,
    /// Conditions, all of which must hold.
    pub when: Option<Vec<Condition>>,
}

/// A path match: a string match (`/a`, `/a/*`, `*/info`, `*`) or a template.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum PathMatch {
    String(StringMatch),
    Template(PathTemplate),
}

/// A path template, Istio's `{*}` (exactly one segment) and `{**}` (any number of
/// segments, only as the last operator), each a whole segment between `/`s.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PathTemplate {
    /// The segments after the leading `/`.
    segments: Vec<PathSegment>,
}

/// One segment of a [`PathTemplate`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum PathSegment {
    /// Compared as written.
    Literal(String),
    /// `{*}`: one segment.
    One,
    /// `{**}`: any number of segments.
    Many,
}

/// A request header and the match its value must pass.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HeaderMatch {
    /// As written; compared case-insensitively.
    pub name: String,
    pub value: StringMatch,
}

/// An IP address or CIDR, kept with the text it was written as (`10.0.0.1` stays a bare
/// address, `FD00::1` keeps its case), so that it is shown as written.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IpBlock {
    net: IpNet,
    text: String,
}

impl PathMatch {
    /// Reads a path as an AuthorizationPolicy writes it.
    pub fn parse(s: &str) -> Result<PathMatch, String> {
        if s.contains('?') || s.contains('#') {
            return Err(format!(
                "path {s:?} has a query or fragment; paths are matched without them"
            ));
        }
        if s.contains("{*}") || s.contains("{**}") {
            return PathTemplate::parse(s).map(PathMatch::Template);
        }
        let m = StringMatch::from_istio(s).map_err(|e| format!("path {e}"))?;
        if s.contains(['{', '}']) {
            return Err(format!(
                "path {s:?} has a '{{' or '}}' outside a template operator; the operators are {{*}} (one segment) and {{**}} (any number of segments), each a whole segment"
            ));
        }
        match &m {
            StringMatch::Exact(v) | StringMatch::Prefix(v) if !v.starts_with('/') => Err(format!(
                "path {s:?} does not start with \"/\", so it can never match; write \"/{s}\""
            )),
            _ => Ok(PathMatch::String(m)),
        }
    }

    /// The form it was read from.
    pub fn to_text(&self) -> String {
        match self {
            PathMatch::String(m) => m.to_istio(),
            PathMatch::Template(t) => t.to_string(),
        }
    }

    /// True if `path` (normalised, without its query) matches: a string match compares
    /// the whole path, byte for byte; a template as [`PathTemplate::matches`].
    pub fn matches(&self, path: &str) -> bool {
        match self {
            PathMatch::String(m) => m.matches(path),
            PathMatch::Template(t) => t.matches(path),
        }
    }
}

/// The characters a template operator matches, as Envoy's URI templates define them
/// (RFC 3986 `pchar` without `*` and `=`): `{*}` is one or more of them, `{**}` any number
/// of them and `/`. A segment with another character (`=`, `*`, a space, non-ASCII) is not
/// matched by an operator.
fn is_template_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-._~%!$&'()+,;:@".contains(&b)
}

impl PathTemplate {
    fn parse(s: &str) -> Result<PathTemplate, String> {
        let Some(rest) = s.strip_prefix('/') else {
            return Err(format!("path template {s:?} does not start with \"/\""));
        };
        let mut segments = Vec::new();
        for seg in rest.split('/') {
            let seg = match seg {
                "{*}" => PathSegment::One,
                "{**}" => PathSegment::Many,
                _ if seg.contains(['*', '{', '}']) => {
                    return Err(format!(
                        "path template {s:?}: segment {seg:?} mixes an operator with other text; {{*}} and {{**}} must each be a whole segment, and a template takes no other '*'"
                    ))
                }
                _ => PathSegment::Literal(seg.to_string()),
            };
            let operator = matches!(seg, PathSegment::One | PathSegment::Many);
            if operator && segments.contains(&PathSegment::Many) {
                return Err(format!(
                    "path template {s:?}: {{**}} must be the last operator"
                ));
            }
            segments.push(seg);
        }
        Ok(PathTemplate { segments })
    }

    /// The segments after the leading `/`.
    pub fn segments(&self) -> &[PathSegment] {
        &self.segments
    }

    /// True if the whole of `path` matches: `/`, then the segments joined by `/`, each
    /// literal compared byte for byte, `{*}` one or more template characters (so exactly
    /// one non-empty segment), `{**}` any run of template characters and `/`, even none
    /// (`/a/{**}` matches `/a/` and `/a/b/c`, not `/a`). Literals alone may follow `{**}`,
    /// so the match is decided left to right without backtracking.
    pub fn matches(&self, path: &str) -> bool {
        let Some(mut rest) = path.strip_prefix('/') else {
            return false;
        };
        for (i, seg) in self.segments.iter().enumerate() {
            if i > 0 {
                let Some(r) = rest.strip_prefix('/') else {
                    return false;
                };
                rest = r;
            }
            match seg {
                PathSegment::Literal(l) => {
                    let Some(r) = rest.strip_prefix(l.as_str()) else {
                        return false;
                    };
                    rest = r;
                }
                PathSegment::One => {
                    let n = rest.bytes().take_while(|b| is_template_char(*b)).count();
                    if n == 0 {
                        return false;
                    }
                    rest = &rest[n..];
                }
                PathSegment::Many => {
                    // What follows is literal: `/lit/lit...`, which must end the path.
                    let mut tail = String::new();
                    for seg in &self.segments[i + 1..] {
                        match seg {
                            PathSegment::Literal(l) => {
                                tail.push('/');
                                tail.push_str(l);
                            }
                            // Refused when the template is read.
                            PathSegment::One | PathSegment::Many => return false,
                        }
                    }
                    return rest.strip_suffix(tail.as_str()).is_some_and(|glob| {
                        glob.bytes().all(|b| b == b'/' || is_template_char(b))
                    });
                }
            }
        }
        rest.is_empty()
    }
}

impl fmt::Display for PathTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for seg in &self.segments {
            f.write_str("/")?;
            match seg {
                PathSegment::Literal(s) => f.write_str(s)?,
                PathSegment::One => f.write_str("{*}")?,
                PathSegment::Many => f.write_str("{**}")?,
            }
        }
        Ok(())
    }
}

/// `tchar` of RFC 9110: the characters of a method or a header name.
fn is_token_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c)
}

/// Reads an HTTP method (`GET`, `P*`, `*`).
pub fn parse_method(s: &str) -> Result<StringMatch, String> {
    let m = StringMatch::from_istio(s).map_err(|e| format!("method {e}"))?;
    let literal = m.literal().unwrap_or_default();
    if !literal.chars().all(is_token_char) {
        return Err(format!("{s:?} is not an HTTP method"));
    }
    if literal.chars().any(|c| c.is_ascii_lowercase()) {
        return Err(format!(
            "method {s:?} is not upper case; methods are compared case-sensitively and a request whose method is not upper case is refused, so it can never match; write {:?}",
            s.to_ascii_uppercase()
        ));
    }
    Ok(m)
}

/// Reads a host (`example.com`, `*.example.com`, `api.*`, `*`).
pub fn parse_host(s: &str) -> Result<StringMatch, String> {
    let m = StringMatch::from_istio(s).map_err(|e| format!("host {e}"))?;
    let literal = m.literal().unwrap_or_default();
    if literal.contains(|c: char| c.is_whitespace() || c.is_control() || c == '/') {
        return Err(format!(
            "{s:?} is not a host; hosts are compared with the request's Host, without scheme or path"
        ));
    }
    Ok(m)
}

/// Reads a request principal (`<issuer>/<subject>`, with `*` as for any string).
pub fn parse_request_principal(s: &str) -> Result<StringMatch, String> {
    StringMatch::from_istio(s).map_err(|e| format!("request principal {e}"))
}

/// Checks a header name: a token, or a pseudo-header (`:authority`).
pub(super) fn check_header_name(name: &str) -> Result<(), String> {
    let token = name.strip_prefix(':').unwrap_or(name);
    if token.is_empty() || !token.chars().all(is_token_char) {
        return Err(format!("{name:?} is not a header name"));
    }
    Ok(())
}

impl IpBlock {
    /// Reads an IP address or CIDR, refused as the L4 fields refuse one (an IPv4-mapped
    /// IPv6 address never matches).
    pub fn parse(s: &str) -> Result<IpBlock, String> {
        let net = crate::addr::cidr_list::parse_cidr(s)?;
        Ok(IpBlock {
            net,
            text: s.to_string(),
        })
    }

    /// The address or network (a bare address is its /32 or /128).
    pub fn net(&self) -> IpNet {
        self.net
    }

    /// As written.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

/// Reads a port number: digits, 1–65535, no leading zero (so that it reads back as written).
pub(super) fn parse_port(s: &str) -> Result<u16, String> {
    match s.parse::<u16>() {
        Ok(p) if p != 0 && s.bytes().all(|b| b.is_ascii_digit()) && !s.starts_with('0') => Ok(p),
        _ => Err(format!("{s:?} is not a port number (1-65535)")),
    }
}

/// One attribute's value, to write it as it was read.
pub(super) enum FieldRef<'a> {
    Paths(&'a [PathMatch]),
    Strings(&'a [StringMatch]),
    Headers(&'a [HeaderMatch]),
    Ips(&'a [IpBlock]),
    When(&'a [Condition]),
}

impl Serialize for FieldRef<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            FieldRef::Paths(v) => s.collect_seq(v.iter().map(PathMatch::to_text)),
            FieldRef::Strings(v) => s.collect_seq(v.iter().map(StringMatch::to_istio)),
            FieldRef::Headers(v) => {
                s.collect_map(v.iter().map(|h| (h.name.as_str(), h.value.to_istio())))
            }
            FieldRef::Ips(v) => s.collect_seq(v.iter().map(IpBlock::as_str)),
            FieldRef::When(v) => s.collect_seq(v.iter()),
        }
    }
}

impl L7Attributes {
    pub(super) fn shrink_to_fit(&mut self) {
        fn shrink<T>(v: &mut Option<Vec<T>>) {
            if let Some(v) = v {
                v.shrink_to_fit();
            }
        }
        shrink(&mut self.paths);
        shrink(&mut self.not_paths);
        shrink(&mut self.methods);
        shrink(&mut self.not_methods);
        shrink(&mut self.hosts);
        shrink(&mut self.not_hosts);
        shrink(&mut self.request_principals);
        shrink(&mut self.not_request_principals);
        shrink(&mut self.headers);
        shrink(&mut self.not_headers);
        shrink(&mut self.remote_ips);
        shrink(&mut self.not_remote_ips);
        shrink(&mut self.when);
    }

    /// Every attribute with its camelCase name, in [`super::L7_ATTRIBUTES`] order.
    pub(super) fn fields(&self) -> [(&'static str, Option<FieldRef<'_>>); 13] {
        fn paths(v: &Option<Vec<PathMatch>>) -> Option<FieldRef<'_>> {
            v.as_deref().map(FieldRef::Paths)
        }
        fn strings(v: &Option<Vec<StringMatch>>) -> Option<FieldRef<'_>> {
            v.as_deref().map(FieldRef::Strings)
        }
        fn headers(v: &Option<Vec<HeaderMatch>>) -> Option<FieldRef<'_>> {
            v.as_deref().map(FieldRef::Headers)
        }
        fn ips(v: &Option<Vec<IpBlock>>) -> Option<FieldRef<'_>> {
            v.as_deref().map(FieldRef::Ips)
        }
        let v = [
            paths(&self.paths),
            paths(&self.not_paths),
            strings(&self.methods),
            strings(&self.not_methods),
            strings(&self.hosts),
            strings(&self.not_hosts),
            strings(&self.request_principals),
            strings(&self.not_request_principals),
            headers(&self.headers),
            headers(&self.not_headers),
            ips(&self.remote_ips),
            ips(&self.not_remote_ips),
            self.when.as_deref().map(FieldRef::When),
        ];
        let mut v = v.into_iter();
        std::array::from_fn(|i| (super::L7_ATTRIBUTES[i], v.next().flatten()))
    }

    /// The attributes set (camelCase names, in [`super::L7_ATTRIBUTES`] order).
    pub fn names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.fields()
            .into_iter()
            .filter(|(_, v)| v.is_some())
            .map(|(n, _)| n)
    }

    /// True if no attribute is set.
    pub fn is_empty(&self) -> bool {
        self.names().next().is_none()
    }

    /// True if some attribute has an entry (a set but empty list constrains nothing).
    pub fn has_entries(&self) -> bool {
        self.fields().into_iter().any(|(_, v)| match v {
            None => false,
            Some(FieldRef::Paths(v)) => !v.is_empty(),
            Some(FieldRef::Strings(v)) => !v.is_empty(),
            Some(FieldRef::Headers(v)) => !v.is_empty(),
            Some(FieldRef::Ips(v)) => !v.is_empty(),
            Some(FieldRef::When(v)) => !v.is_empty(),
        })
    }
}

mod condition;
mod read;

pub use condition::{Condition, IpKey, TextKey, Values};
pub(super) use read::{headers, hosts, ips, methods, paths, request_principals, when};
/// The values of a policy's fields, each read by its parser (only a string).
pub mod values {
    pub use super::read::{text_with, Host, Method, Path, Pattern, RemoteIp, RequestPrincipal};
}

#[cfg(test)]
mod tests;
