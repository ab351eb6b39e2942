//! Reading the L7 attributes: each value a string (only a string), checked by its field's
//! parser inside the deserializer, so that a refusal carries the value's line and column.
//! These readers are the project's one way of reading a policy's values: the local config
//! reads its match objects with them, and `ambit-manifests` an AuthorizationPolicy's
//! (exported as `ambit_state::values`).

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, Visitor};
use serde::Deserialize;

use super::{
    check_header_name, parse_host, parse_method, parse_request_principal, Condition, HeaderMatch,
    IpBlock, PathMatch, StringMatch,
};

/// Reads a string, only a string (a YAML number, boolean or null is refused: it would not
/// be written back as it was written), converted by `f` inside the visitor so that an
/// error carries the value's line and column.
pub fn text_with<'de, D, T>(
    d: D,
    expecting: &'static str,
    f: impl FnOnce(&str) -> Result<T, String>,
) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
{
    struct V<F>(F, &'static str);
    impl<'de, T, F: FnOnce(&str) -> Result<T, String>> Visitor<'de> for V<F> {
        type Value = T;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "{} (a string: quote numbers and booleans)", self.1)
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<T, E> {
            (self.0)(v).map_err(E::custom)
        }
    }
    d.deserialize_any(V(f, expecting))
}

/// A value read with one of the parsers above (only a string).
macro_rules! text_item {
    ($(#[$m:meta])* $name:ident, $out:ty, $expecting:literal, $parse:expr) => {
        $(#[$m])*
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub struct $name(pub $out);
        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                text_with(d, $expecting, $parse).map($name)
            }
        }
    };
}

text_item!(
    /// A path match (exact, `prefix*`, `*suffix`, templates).
    Path,
    PathMatch,
    "a path",
    PathMatch::parse
);
text_item!(
    /// An HTTP method.
    Method,
    StringMatch,
    "an HTTP method",
    parse_method
);
text_item!(
    /// A host match, without case.
    Host,
    StringMatch,
    "a host",
    parse_host
);
text_item!(
    /// A request principal (`<iss>/<sub>`).
    RequestPrincipal,
    StringMatch,
    "a request principal",
    parse_request_principal
);
text_item!(
    /// An address or CIDR, kept as written.
    RemoteIp,
    IpBlock,
    "an IP address or CIDR",
    IpBlock::parse
);
text_item!(
    /// A value match (exact, `prefix*`, `*suffix` or `*`).
    Pattern,
    StringMatch,
    "a value (exact, prefix*, *suffix or *)",
    StringMatch::from_istio
);
/// `Option<Vec<Item>>` → `Option<Vec<T>>`.
fn list<'de, D: Deserializer<'de>, I: Deserialize<'de>, T>(
    d: D,
    unwrap: fn(I) -> T,
) -> Result<Option<Vec<T>>, D::Error> {
    Ok(Option::<Vec<I>>::deserialize(d)?.map(|v| v.into_iter().map(unwrap).collect()))
}

// serde `deserialize_with` helpers for `MatchFields`.

pub(in crate::policy) fn paths<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<Vec<PathMatch>>, D::Error> {
    list(d, |i: Path| i.0)
}

pub(in crate::policy) fn methods<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<Vec<StringMatch>>, D::Error> {
    list(d, |i: Method| i.0)
}

pub(in crate::policy) fn hosts<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<Vec<StringMatch>>, D::Error> {
    list(d, |i: Host| i.0)
}

pub(in crate::policy) fn request_principals<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<Vec<StringMatch>>, D::Error> {
    list(d, |i: RequestPrincipal| i.0)
}

pub(in crate::policy) fn ips<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<Vec<IpBlock>>, D::Error> {
    list(d, |i: RemoteIp| i.0)
}

pub(in crate::policy) fn headers<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<Vec<HeaderMatch>>, D::Error> {
    Ok(Option::<Headers>::deserialize(d)?.map(|h| h.0))
}

pub(in crate::policy) fn when<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<Vec<Condition>>, D::Error> {
    Option::<Vec<Condition>>::deserialize(d)
}

/// A header map: `{name: value, ...}`, names unique regardless of case.
struct Headers(Vec<HeaderMatch>);

/// A header name, refused when the map already has it (in any case): checked while the
/// key is read, so that the refusal points at it.
struct HeaderName<'a>(&'a [HeaderMatch]);

impl<'de> DeserializeSeed<'de> for HeaderName<'_> {
    type Value = String;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<String, D::Error> {
        text_with(d, "a header name", |s| {
            check_header_name(s)?;
            if self.0.iter().any(|h| h.name.eq_ignore_ascii_case(s)) {
                return Err(format!(
                    "header {s:?} is given twice (names are compared without case)"
                ));
            }
            Ok(s.to_string())
        })
    }
}

impl<'de> Deserialize<'de> for Headers {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Headers;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map of header names to values")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Headers, A::Error> {
                let mut out: Vec<HeaderMatch> = Vec::new();
                while let Some(name) = map.next_key_seed(HeaderName(&out))? {
                    let Pattern(value) = map.next_value()?;
                    out.push(HeaderMatch { name, value });
                }
                // The order of a map says nothing; sorted, as the map is shown.
                out.sort_by(|a, b| a.name.cmp(&b.name));
                Ok(Headers(out))
            }
        }
        d.deserialize_map(V)
    }
}
