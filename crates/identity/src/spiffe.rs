//! SPIFFE identities of the Istio shape: `spiffe://<trust-domain>/ns/<namespace>/sa/<service-account>`.
//!
//! Security posture: parsing is strict and byte-exact. The SPIFFE ID specification (§2.1,
//! §2.2) allows only `[a-z0-9.-_]` in the trust domain and `[a-zA-Z0-9.-_]` in path
//! segments, with no percent-encoding and no empty, `.` or `..` segments; we refuse
//! everything else. Nothing is case-folded or decoded, so two ids are equal exactly when
//! their strings are equal. The specification calls the scheme case-insensitive; we accept
//! only the lower-case `spiffe://` that every issuer writes, and callers that look for
//! SPIFFE ids among URIs (certificate SANs) match the scheme case-insensitively, so that a
//! `SPIFFE://…` URI is counted as an id, and refused as malformed, never overlooked.

use std::fmt;
use std::str::FromStr;

/// The scheme prefix, matched byte for byte.
pub const SCHEME: &str = "spiffe://";

/// The longest id accepted, in bytes (the SPIFFE specification's URI limit).
pub const MAX_LEN: usize = 2048;

/// The longest trust domain accepted, in bytes (RFC 3986's limit on a URI host, which the
/// SPIFFE specification adopts).
pub const MAX_TRUST_DOMAIN_LEN: usize = 255;

/// A workload identity: trust domain, Kubernetes namespace and service account.
///
/// Equality, ordering and hashing are over the exact bytes of the three parts.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SpiffeId {
    trust_domain: String,
    namespace: String,
    service_account: String,
}

/// Which part of a SPIFFE id a [`SpiffeError`] is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    TrustDomain,
    Namespace,
    ServiceAccount,
}

impl fmt::Display for Part {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Part::TrustDomain => "trust domain",
            Part::Namespace => "namespace",
            Part::ServiceAccount => "service account",
        })
    }
}

/// Why a string is not a valid SPIFFE id.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SpiffeError {
    #[error("SPIFFE id is {len} bytes long; the limit is {MAX_LEN}")]
    TooLong { len: usize },
    #[error(
        "SPIFFE id must start with exactly \"spiffe://\" (lower case); expected spiffe://<trust-domain>/ns/<namespace>/sa/<service-account>"
    )]
    BadScheme,
    #[error(
        "SPIFFE id has no path; expected spiffe://<trust-domain>/ns/<namespace>/sa/<service-account>"
    )]
    MissingPath,
    #[error("SPIFFE id has an empty {0}")]
    Empty(Part),
    #[error("SPIFFE trust domain is {len} bytes long; the limit is {MAX_TRUST_DOMAIN_LEN}")]
    TrustDomainTooLong { len: usize },
    #[error(
        "SPIFFE trust domain has {ch:?} at byte {index}; only lower-case letters, digits, '.', '-' and '_' are allowed"
    )]
    InvalidTrustDomainChar { ch: char, index: usize },
    #[error(
        "SPIFFE {part} has {ch:?} at byte {index}; a SPIFFE path segment allows only ASCII letters, digits, '.', '-' and '_' (no percent-encoding)"
    )]
    InvalidChar { part: Part, ch: char, index: usize },
    #[error("SPIFFE {part} is {found:?}; '.' and '..' are not allowed as path segments")]
    DotSegment { part: Part, found: &'static str },
    #[error("SPIFFE id ends with '/'; remove the trailing slash")]
    TrailingSlash,
    #[error(
        "SPIFFE id path has {found} segments after the trust domain; expected exactly 4: ns/<namespace>/sa/<service-account>"
    )]
    SegmentCount { found: usize },
    #[error("SPIFFE id path has {found:?} where the literal {expected:?} is required")]
    ExpectedLiteral {
        expected: &'static str,
        found: String,
    },
}

impl SpiffeId {
    /// Builds an id from its parts, validating each one with the same rules as [`SpiffeId::parse`].
    pub fn new(
        trust_domain: &str,
        namespace: &str,
        service_account: &str,
    ) -> Result<SpiffeId, SpiffeError> {
        validate_trust_domain(trust_domain)?;
        validate_segment(namespace, Part::Namespace)?;
        validate_segment(service_account, Part::ServiceAccount)?;
        let len = SCHEME.len()
            + trust_domain.len()
            + "/ns/".len()
            + namespace.len()
            + "/sa/".len()
            + service_account.len();
        if len > MAX_LEN {
            return Err(SpiffeError::TooLong { len });
        }
        Ok(SpiffeId {
            trust_domain: trust_domain.to_owned(),
            namespace: namespace.to_owned(),
            service_account: service_account.to_owned(),
        })
    }

    /// Parses `spiffe://<td>/ns/<ns>/sa/<sa>` strictly (see the module documentation).
    pub fn parse(s: &str) -> Result<SpiffeId, SpiffeError> {
        if s.len() > MAX_LEN {
            return Err(SpiffeError::TooLong { len: s.len() });
        }
        let rest = s.strip_prefix(SCHEME).ok_or(SpiffeError::BadScheme)?;
        let (td, path) = rest.split_once('/').ok_or(SpiffeError::MissingPath)?;
        validate_trust_domain(td)?;
        if rest.ends_with('/') {
            return Err(SpiffeError::TrailingSlash);
        }
        let segments: Vec<&str> = path.split('/').collect();
        let [ns_lit, ns, sa_lit, sa] = segments.as_slice() else {
            return Err(SpiffeError::SegmentCount {
                found: segments.len(),
            });
        };
        expect_literal(ns_lit, "ns")?;
        expect_literal(sa_lit, "sa")?;
        SpiffeId::new(td, ns, sa)
    }

    pub fn trust_domain(&self) -> &str {
        &self.trust_domain
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    pub fn service_account(&self) -> &str {
        &self.service_account
    }
}

fn expect_literal(found: &str, expected: &'static str) -> Result<(), SpiffeError> {
    if found == expected {
        Ok(())
    } else {
        Err(SpiffeError::ExpectedLiteral {
            expected,
            found: found.chars().take(64).collect(),
        })
    }
}

/// Checks a trust domain against the SPIFFE character set and length limit.
pub(crate) fn validate_trust_domain(td: &str) -> Result<(), SpiffeError> {
    if td.is_empty() {
        return Err(SpiffeError::Empty(Part::TrustDomain));
    }
    if td.len() > MAX_TRUST_DOMAIN_LEN {
        return Err(SpiffeError::TrustDomainTooLong { len: td.len() });
    }
    match td.char_indices().find(|(_, c)| !is_trust_domain_char(*c)) {
        Some((index, ch)) => Err(SpiffeError::InvalidTrustDomainChar { ch, index }),
        None => Ok(()),
    }
}

fn is_trust_domain_char(c: char) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '-' | '_')
}

/// Checks one path segment: SPIFFE's `[a-zA-Z0-9.-_]`, not empty, not `.` or `..`.
fn validate_segment(seg: &str, part: Part) -> Result<(), SpiffeError> {
    match seg {
        "" => return Err(SpiffeError::Empty(part)),
        "." => return Err(SpiffeError::DotSegment { part, found: "." }),
        ".." => return Err(SpiffeError::DotSegment { part, found: ".." }),
        _ => {}
    }
    match seg.char_indices().find(|(_, c)| !is_segment_char(*c)) {
        Some((index, ch)) => Err(SpiffeError::InvalidChar { part, ch, index }),
        None => Ok(()),
    }
}

fn is_segment_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_')
}

/// True if `uri` has the `spiffe` scheme, in any letter case (RFC 3986 schemes are
/// case-insensitive): such a URI claims to be a SPIFFE id, valid or not.
pub fn has_spiffe_scheme(uri: &str) -> bool {
    uri.split_once(':')
        .is_some_and(|(scheme, _)| scheme.eq_ignore_ascii_case("spiffe"))
}

impl fmt::Display for SpiffeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{SCHEME}{}/ns/{}/sa/{}",
            self.trust_domain, self.namespace, self.service_account
        )
    }
}

impl FromStr for SpiffeId {
    type Err = SpiffeError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        SpiffeId::parse(s)
    }
}

impl TryFrom<&str> for SpiffeId {
    type Error = SpiffeError;
    fn try_from(s: &str) -> Result<Self, Self::Error> {
        SpiffeId::parse(s)
    }
}

impl serde::Serialize for SpiffeId {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for SpiffeId {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = SpiffeId;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "a SPIFFE id spiffe://<trust-domain>/ns/<namespace>/sa/<service-account>",
                )
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<SpiffeId, E> {
                SpiffeId::parse(v).map_err(E::custom)
            }
        }
        deserializer.deserialize_str(Visitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(s: &str) -> SpiffeError {
        match SpiffeId::parse(s) {
            Ok(id) => panic!("{s:?} parsed as {id}"),
            Err(e) => e,
        }
    }

    #[test]
    fn parses_and_round_trips() {
        let s = "spiffe://cluster.local/ns/default/sa/bookinfo-productpage";
        let id = SpiffeId::parse(s).unwrap();
        assert_eq!(id.trust_domain(), "cluster.local");
        assert_eq!(id.namespace(), "default");
        assert_eq!(id.service_account(), "bookinfo-productpage");
        assert_eq!(id.to_string(), s);
        assert_eq!(s.parse::<SpiffeId>().unwrap(), id);
        assert_eq!(
            SpiffeId::new("cluster.local", "default", "bookinfo-productpage").unwrap(),
            id
        );
    }

    #[test]
    fn scheme_is_byte_exact() {
        for s in [
            "SPIFFE://td/ns/a/sa/b",
            "Spiffe://td/ns/a/sa/b",
            "spiffe:/td/ns/a/sa/b",
            "spiffe:td/ns/a/sa/b",
            " spiffe://td/ns/a/sa/b",
            "https://td/ns/a/sa/b",
            "",
        ] {
            assert_eq!(err(s), SpiffeError::BadScheme, "{s:?}");
        }
    }

    #[test]
    fn path_shape() {
        assert_eq!(err("spiffe://td"), SpiffeError::MissingPath);
        assert_eq!(err("spiffe://td/"), SpiffeError::TrailingSlash);
        assert_eq!(err("spiffe://td/ns/a/sa/b/"), SpiffeError::TrailingSlash);
        assert_eq!(
            err("spiffe://td/ns/a/sa/b/c"),
            SpiffeError::SegmentCount { found: 5 }
        );
        assert_eq!(
            err("spiffe://td/ns/a/sa"),
            SpiffeError::SegmentCount { found: 3 }
        );
        assert_eq!(
            err("spiffe://td/ns/a/b"),
            SpiffeError::SegmentCount { found: 3 }
        );
        assert_eq!(
            err("spiffe:///ns/a/sa/b"),
            SpiffeError::Empty(Part::TrustDomain)
        );
        assert_eq!(
            err("spiffe://td/ns//sa/b"),
            SpiffeError::Empty(Part::Namespace)
        );
        assert_eq!(err("spiffe://td/ns/a/sa/"), SpiffeError::TrailingSlash);
        assert!(matches!(
            err("spiffe://td//ns/a/sa/b"),
            SpiffeError::SegmentCount { found: 5 }
        ));
    }

    #[test]
    fn literals_are_exact() {
        for (s, expected) in [
            ("spiffe://td/NS/a/sa/b", "ns"),
            ("spiffe://td/ns/a/SA/b", "sa"),
            ("spiffe://td/namespace/a/sa/b", "ns"),
            ("spiffe://td/sa/a/ns/b", "ns"),
            ("spiffe://td/n%73/a/sa/b", "ns"),
        ] {
            match err(s) {
                SpiffeError::ExpectedLiteral { expected: e, .. } => assert_eq!(e, expected),
                other => panic!("{s:?}: {other}"),
            }
        }
    }

    #[test]
    fn hostile_characters_are_refused() {
        let cases: &[(&str, Part)] = &[
            ("spiffe://td/ns/a\0b/sa/c", Part::Namespace),
            ("spiffe://td/ns/a/sa/c\0", Part::ServiceAccount),
            ("spiffe://td/ns/a b/sa/c", Part::Namespace),
            ("spiffe://td/ns/a\tb/sa/c", Part::Namespace),
            ("spiffe://td/ns/a/sa/c\n", Part::ServiceAccount),
            ("spiffe://td/ns/a/sa/c\u{7f}", Part::ServiceAccount),
            ("spiffe://td/ns/a/sa/c?x=1", Part::ServiceAccount),
            ("spiffe://td/ns/a/sa/c#frag", Part::ServiceAccount),
            ("spiffe://td/ns/a\\b/sa/c", Part::Namespace),
            ("spiffe://td/ns/défaut/sa/c", Part::Namespace),
            ("spiffe://td/ns/a/sa/\u{202e}c", Part::ServiceAccount),
            ("spiffe://td/ns/a/sa/c\u{a0}", Part::ServiceAccount),
        ];
        for (s, part) in cases {
            match err(s) {
                SpiffeError::InvalidChar { part: p, .. } => assert_eq!(p, *part, "{s:?}"),
                other => panic!("{s:?}: {other}"),
            }
        }
    }

    #[test]
    fn trust_domain_charset() {
        for s in [
            "spiffe://Cluster.local/ns/a/sa/b",
            "spiffe://td:8080/ns/a/sa/b",
            "spiffe://user@td/ns/a/sa/b",
            "spiffe://td?x/ns/a/sa/b",
            "spiffe://t\0d/ns/a/sa/b",
            "spiffe://tëd/ns/a/sa/b",
            "spiffe://t%41/ns/a/sa/b",
        ] {
            assert!(
                matches!(err(s), SpiffeError::InvalidTrustDomainChar { .. }),
                "{s:?}"
            );
        }
        assert!(SpiffeId::parse("spiffe://my_td-1.example/ns/a/sa/b").is_ok());
    }

    #[test]
    fn path_segments_use_the_spiffe_character_set() {
        // Letters of both cases, digits, '.', '-' and '_' only; case is significant.
        let id = SpiffeId::parse("spiffe://td/ns/My.Name_-1/sa/...a..").unwrap();
        assert_eq!(id.namespace(), "My.Name_-1");
        assert_eq!(id.service_account(), "...a..");
        assert_ne!(
            id,
            SpiffeId::parse("spiffe://td/ns/my.name_-1/sa/...a..").unwrap()
        );
        // RFC 3986 allows these in a path; SPIFFE does not, percent-encoding included.
        for ch in "%~!$&'()*+,;=:@".chars() {
            let s = format!("spiffe://td/ns/a/sa/x{ch}41");
            assert_eq!(
                err(&s),
                SpiffeError::InvalidChar {
                    part: Part::ServiceAccount,
                    ch,
                    index: 1
                },
                "{s:?}"
            );
        }
        assert!(matches!(
            err("spiffe://td/ns/a%41/sa/b"),
            SpiffeError::InvalidChar {
                part: Part::Namespace,
                ch: '%',
                index: 1
            }
        ));
        // A '%' before a multi-byte character does not panic on a char boundary.
        assert!(matches!(
            err("spiffe://td/ns/a%é1/sa/b"),
            SpiffeError::InvalidChar { ch: '%', .. }
        ));
    }

    #[test]
    fn dot_segments_are_refused() {
        for (s, part, found) in [
            ("spiffe://td/ns/./sa/b", Part::Namespace, "."),
            ("spiffe://td/ns/../sa/b", Part::Namespace, ".."),
            ("spiffe://td/ns/a/sa/.", Part::ServiceAccount, "."),
            ("spiffe://td/ns/a/sa/..", Part::ServiceAccount, ".."),
        ] {
            assert_eq!(err(s), SpiffeError::DotSegment { part, found }, "{s:?}");
        }
        assert!(matches!(
            SpiffeId::new("td", "..", "b"),
            Err(SpiffeError::DotSegment { .. })
        ));
    }

    #[test]
    fn trust_domain_length_limit() {
        let td = "a".repeat(MAX_TRUST_DOMAIN_LEN);
        assert!(SpiffeId::new(&td, "a", "b").is_ok());
        let td = "a".repeat(MAX_TRUST_DOMAIN_LEN + 1);
        assert_eq!(
            err(&format!("spiffe://{td}/ns/a/sa/b")),
            SpiffeError::TrustDomainTooLong { len: td.len() }
        );
    }

    #[test]
    fn spiffe_scheme_detection_ignores_case() {
        for uri in [
            "spiffe://td/ns/a/sa/b",
            "SPIFFE://td/ns/a/sa/b",
            "Spiffe:td",
            "spiffe:",
        ] {
            assert!(has_spiffe_scheme(uri), "{uri:?}");
        }
        for uri in ["https://td/", "spiffe", "spiffex://td", "", " spiffe://td"] {
            assert!(!has_spiffe_scheme(uri), "{uri:?}");
        }
    }

    #[test]
    fn length_limit() {
        let sa = "a".repeat(MAX_LEN);
        let s = format!("spiffe://td/ns/a/sa/{sa}");
        assert_eq!(err(&s), SpiffeError::TooLong { len: s.len() });
        assert!(matches!(
            SpiffeId::new("td", "a", &sa),
            Err(SpiffeError::TooLong { .. })
        ));
        let fits = "a".repeat(MAX_LEN - "spiffe://td/ns/a/sa/".len());
        let s = format!("spiffe://td/ns/a/sa/{fits}");
        assert_eq!(s.len(), MAX_LEN);
        assert_eq!(SpiffeId::parse(&s).unwrap().to_string(), s);
        // Huge input is refused before any work is done.
        let huge = "spiffe://td/".to_string() + &"/".repeat(1 << 20);
        assert!(matches!(err(&huge), SpiffeError::TooLong { .. }));
    }

    #[test]
    fn new_validates_each_part() {
        assert_eq!(
            SpiffeId::new("", "a", "b").unwrap_err(),
            SpiffeError::Empty(Part::TrustDomain)
        );
        assert_eq!(
            SpiffeId::new("td", "", "b").unwrap_err(),
            SpiffeError::Empty(Part::Namespace)
        );
        assert!(matches!(
            SpiffeId::new("td", "a/b", "c").unwrap_err(),
            SpiffeError::InvalidChar {
                part: Part::Namespace,
                ch: '/',
                ..
            }
        ));
        assert!(matches!(
            SpiffeId::new("td", "a", "b/sa/c").unwrap_err(),
            SpiffeError::InvalidChar {
                part: Part::ServiceAccount,
                ..
            }
        ));
    }

    #[test]
    fn serde_as_string() {
        let id = SpiffeId::parse("spiffe://td/ns/a/sa/b").unwrap();
        let json = serde_json::to_string(&id).unwrap();
        assert_eq!(json, "\"spiffe://td/ns/a/sa/b\"");
        assert_eq!(serde_json::from_str::<SpiffeId>(&json).unwrap(), id);
        let bad = serde_json::from_str::<SpiffeId>("\"spiffe://td/ns/a/sa/b/c\"");
        assert!(bad.unwrap_err().to_string().contains("segments"));
    }

    #[test]
    fn errors_are_readable() {
        let msg = err("spiffe://td/ns/a\0/sa/b").to_string();
        assert!(msg.contains("namespace") && msg.contains("\\0"), "{msg}");
    }
}
