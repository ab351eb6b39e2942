//! `when` conditions: the keys of Istio's AuthorizationPolicy, each with its kind of value
//! (strings, IPs, ports), read and written as an AuthorizationPolicy writes them.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};

use super::read::text_with;
use super::{check_header_name, parse_port, IpBlock, StringMatch};

/// A `when` condition: a key and the values it must (`values`: one of them) and must not
/// (`notValues`: none of them) have. Each key has its own kind of value.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Condition {
    /// Keys whose values are string matches.
    Text(TextKey, Values<StringMatch>),
    /// `source.ip`, `remote.ip`, `destination.ip`: IPs or CIDRs.
    Ip(IpKey, Values<IpBlock>),
    /// `destination.port`: port numbers.
    DestinationPort(Values<u16>),
}

/// A condition's values. At least one list is set and not empty.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Values<T> {
    pub values: Option<Vec<T>>,
    pub not_values: Option<Vec<T>>,
}

/// The condition keys whose values are strings.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum TextKey {
    /// `request.headers[<name>]`.
    RequestHeader(String),
    /// `source.namespace`.
    SourceNamespace,
    /// `source.serviceAccount` (`<namespace>/<name>`).
    SourceServiceAccount,
    /// `source.trustDomain`.
    SourceTrustDomain,
    /// `source.principal` (the peer's SPIFFE id without `spiffe://`).
    SourcePrincipal,
    /// `request.auth.principal`.
    RequestAuthPrincipal,
    /// `request.auth.audiences`.
    RequestAuthAudiences,
    /// `request.auth.presenter`.
    RequestAuthPresenter,
    /// `request.auth.claims[<a>][<b>]...`: the claim's path, outermost first.
    RequestAuthClaim(Vec<String>),
    /// `connection.sni`.
    ConnectionSni,
    /// `experimental.envoy.filters.<rest>`: Envoy's filter metadata, kept as written (no
    /// proxy of ambit's can see it).
    EnvoyFilter(String),
}

/// The condition keys whose values are IPs or CIDRs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IpKey {
    /// `source.ip`: the peer's address.
    SourceIp,
    /// `remote.ip`: the original client's.
    RemoteIp,
    /// `destination.ip`.
    DestinationIp,
}

/// The keys a condition may have, as an error lists them.
const CONDITION_KEYS: &str = "request.headers[<name>], source.ip, remote.ip, source.namespace, source.serviceAccount, source.trustDomain, source.principal, request.auth.principal, request.auth.audiences, request.auth.presenter, request.auth.claims[<claim>], destination.ip, destination.port, connection.sni, experimental.envoy.filters.<...>";

/// What kind of values a key takes.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Key {
    Text(TextKey),
    Ip(IpKey),
    Port,
}

impl Key {
    fn parse(s: &str) -> Result<Key, String> {
        let key = match s {
            "source.ip" => Key::Ip(IpKey::SourceIp),
            "remote.ip" => Key::Ip(IpKey::RemoteIp),
            "destination.ip" => Key::Ip(IpKey::DestinationIp),
            "destination.port" => Key::Port,
            "source.namespace" => Key::Text(TextKey::SourceNamespace),
            "source.serviceAccount" => Key::Text(TextKey::SourceServiceAccount),
            "source.trustDomain" => Key::Text(TextKey::SourceTrustDomain),
            "source.principal" => Key::Text(TextKey::SourcePrincipal),
            "request.auth.principal" => Key::Text(TextKey::RequestAuthPrincipal),
            "request.auth.audiences" => Key::Text(TextKey::RequestAuthAudiences),
            "request.auth.presenter" => Key::Text(TextKey::RequestAuthPresenter),
            "connection.sni" => Key::Text(TextKey::ConnectionSni),
            _ => {
                if let Some(name) = s
                    .strip_prefix("request.headers[")
                    .and_then(|r| r.strip_suffix(']'))
                {
                    check_header_name(name).map_err(|e| format!("condition key {s:?}: {e}"))?;
                    Key::Text(TextKey::RequestHeader(name.to_string()))
                } else if let Some(path) = s.strip_prefix("request.auth.claims") {
                    Key::Text(TextKey::RequestAuthClaim(parse_claim_path(s, path)?))
                } else if let Some(rest) = s
                    .strip_prefix("experimental.envoy.filters.")
                    .filter(|r| !r.is_empty())
                {
                    Key::Text(TextKey::EnvoyFilter(rest.to_string()))
                } else {
                    return Err(format!(
                        "unknown condition key {s:?}; the keys are {CONDITION_KEYS}"
                    ));
                }
            }
        };
        Ok(key)
    }
}

/// `[a][b]...` → `["a", "b"]`: at least one claim, none empty or holding a bracket.
fn parse_claim_path(key: &str, mut path: &str) -> Result<Vec<String>, String> {
    let bad = || {
        format!("condition key {key:?} is not request.auth.claims[<claim>] (nested: [<a>][<b>])")
    };
    let mut claims = Vec::new();
    while !path.is_empty() {
        let inner = path.strip_prefix('[').ok_or_else(bad)?;
        let (claim, rest) = inner.split_once(']').ok_or_else(bad)?;
        if claim.is_empty() || claim.contains('[') {
            return Err(bad());
        }
        claims.push(claim.to_string());
        path = rest;
    }
    if claims.is_empty() {
        return Err(bad());
    }
    Ok(claims)
}

impl fmt::Display for TextKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TextKey::RequestHeader(h) => write!(f, "request.headers[{h}]"),
            TextKey::SourceNamespace => f.write_str("source.namespace"),
            TextKey::SourceServiceAccount => f.write_str("source.serviceAccount"),
            TextKey::SourceTrustDomain => f.write_str("source.trustDomain"),
            TextKey::SourcePrincipal => f.write_str("source.principal"),
            TextKey::RequestAuthPrincipal => f.write_str("request.auth.principal"),
            TextKey::RequestAuthAudiences => f.write_str("request.auth.audiences"),
            TextKey::RequestAuthPresenter => f.write_str("request.auth.presenter"),
            TextKey::RequestAuthClaim(path) => {
                f.write_str("request.auth.claims")?;
                path.iter().try_for_each(|c| write!(f, "[{c}]"))
            }
            TextKey::ConnectionSni => f.write_str("connection.sni"),
            TextKey::EnvoyFilter(rest) => write!(f, "experimental.envoy.filters.{rest}"),
        }
    }
}

impl fmt::Display for IpKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            IpKey::SourceIp => "source.ip",
            IpKey::RemoteIp => "remote.ip",
            IpKey::DestinationIp => "destination.ip",
        })
    }
}

impl Condition {
    /// The key, as written.
    pub fn key(&self) -> String {
        match self {
            Condition::Text(k, _) => k.to_string(),
            Condition::Ip(k, _) => k.to_string(),
            Condition::DestinationPort(_) => "destination.port".into(),
        }
    }
}

/// A condition's fields.
#[derive(Clone, Copy, Deserialize)]
#[serde(field_identifier, rename_all = "camelCase")]
enum Field {
    Key,
    Values,
    NotValues,
}

/// Reads a value list, each value checked against the key where it is written when the
/// key came first (`None`: it did not, and the values are checked once it is known).
/// `null` is refused: leaving the field out says the same, and a `null` was shown as
/// written when conditions were kept as JSON.
struct ValuesSeed<'a>(Option<&'a Key>);

impl<'de> DeserializeSeed<'de> for ValuesSeed<'_> {
    type Value = Vec<String>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        // Any: so that a `null` reaches `visit_unit` and its own message.
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ValuesSeed<'_> {
    type Value = Vec<String>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a sequence of values")
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Err(E::custom(
            "null is not a list of values; leave the field out",
        ))
    }
    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        self.visit_unit()
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<String>, A::Error> {
        let mut out = Vec::new();
        while let Some(v) = seq.next_element_seed(Value(self.0))? {
            out.push(v);
        }
        Ok(out)
    }
}

/// One value, as a string, checked against the key when it is known.
struct Value<'a>(Option<&'a Key>);

impl<'de> DeserializeSeed<'de> for Value<'_> {
    type Value = String;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<String, D::Error> {
        let expecting = self.0.map_or("a value", Key::expecting);
        text_with(d, expecting, |s| {
            if let Some(key) = self.0 {
                key.check(s)?;
            }
            Ok(s.to_string())
        })
    }
}

/// A `source.principal` value: refused with `spiffe://`, as the `principals` field.
fn parse_source_principal(s: &str) -> Result<StringMatch, String> {
    let m = StringMatch::from_istio(s).map_err(|e| format!("principal {e}"))?;
    crate::policy::check_principal(&m)?;
    Ok(m)
}

impl Key {
    /// What a value of this key is, for an error.
    fn expecting(&self) -> &'static str {
        match self {
            Key::Text(TextKey::SourcePrincipal) => "a principal",
            Key::Text(_) => "a value (exact, prefix*, *suffix or *)",
            Key::Ip(_) => "an IP address or CIDR",
            Key::Port => "a port number",
        }
    }

    /// Checks one value of this key.
    fn check(&self, s: &str) -> Result<(), String> {
        match self {
            Key::Text(TextKey::SourcePrincipal) => parse_source_principal(s).map(drop),
            Key::Text(_) => StringMatch::from_istio(s).map(drop),
            Key::Ip(_) => IpBlock::parse(s).map(drop),
            Key::Port => parse_port(s).map(drop),
        }
    }
}

/// Both lists of a condition, typed; an error names the list and the entry.
fn typed<T>(
    values: Option<Vec<String>>,
    not_values: Option<Vec<String>>,
    parse: fn(&str) -> Result<T, String>,
) -> Result<Values<T>, String> {
    let list = |field: &str, l: Option<Vec<String>>| -> Result<Option<Vec<T>>, String> {
        l.map(|l| {
            l.iter()
                .enumerate()
                .map(|(i, s)| parse(s).map_err(|e| format!("{field}[{i}]: {e}")))
                .collect()
        })
        .transpose()
    };
    Ok(Values {
        values: list("values", values)?,
        not_values: list("notValues", not_values)?,
    })
}

struct KeyText(Key);

impl<'de> Deserialize<'de> for KeyText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        text_with(d, "a condition key", Key::parse).map(KeyText)
    }
}

impl<'de> Deserialize<'de> for Condition {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Condition;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a condition {key, values, notValues}")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Condition, A::Error> {
                let mut key: Option<Key> = None;
                let mut values: Option<Vec<String>> = None;
                let mut not_values: Option<Vec<String>> = None;
                while let Some(field) = map.next_key::<Field>()? {
                    let (slot, name) = match field {
                        Field::Key => {
                            if key.is_some() {
                                return Err(de::Error::duplicate_field("key"));
                            }
                            key = Some(map.next_value::<KeyText>()?.0);
                            continue;
                        }
                        Field::Values => (&mut values, "values"),
                        Field::NotValues => (&mut not_values, "notValues"),
                    };
                    if slot.is_some() {
                        return Err(de::Error::duplicate_field(name));
                    }
                    *slot = Some(map.next_value_seed(ValuesSeed(key.as_ref()))?);
                }
                let key = key.ok_or_else(|| de::Error::missing_field("key"))?;
                Condition::new(key, values, not_values).map_err(de::Error::custom)
            }
        }
        d.deserialize_map(V)
    }
}

impl Condition {
    fn new(
        key: Key,
        values: Option<Vec<String>>,
        not_values: Option<Vec<String>>,
    ) -> Result<Condition, String> {
        let empty = |v: &Option<Vec<String>>| v.as_ref().is_none_or(Vec::is_empty);
        if empty(&values) && empty(&not_values) {
            return Err("a condition needs values or notValues (at least one value)".into());
        }
        Ok(match key {
            Key::Text(TextKey::SourcePrincipal) => Condition::Text(
                TextKey::SourcePrincipal,
                typed(values, not_values, parse_source_principal)?,
            ),
            Key::Text(k) => Condition::Text(k, typed(values, not_values, StringMatch::from_istio)?),
            Key::Ip(k) => Condition::Ip(k, typed(values, not_values, IpBlock::parse)?),
            Key::Port => Condition::DestinationPort(typed(values, not_values, parse_port)?),
        })
    }
}

impl Serialize for Condition {
    /// `{key, notValues, values}`: the keys in the order a JSON object sorts them, as the
    /// condition was shown when it was kept as JSON.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        fn lists<T, F: Fn(&T) -> String>(
            v: &Values<T>,
            f: F,
        ) -> [(&'static str, Option<Vec<String>>); 2] {
            let text = |l: &Option<Vec<T>>| l.as_ref().map(|l| l.iter().map(&f).collect());
            [
                ("notValues", text(&v.not_values)),
                ("values", text(&v.values)),
            ]
        }
        let lists = match self {
            Condition::Text(_, v) => lists(v, StringMatch::to_istio),
            Condition::Ip(_, v) => lists(v, |b: &IpBlock| b.as_str().to_string()),
            Condition::DestinationPort(v) => lists(v, u16::to_string),
        };
        let len = 1 + lists.iter().filter(|(_, l)| l.is_some()).count();
        let mut m = s.serialize_map(Some(len))?;
        m.serialize_entry("key", &self.key())?;
        for (name, l) in &lists {
            if let Some(l) = l {
                m.serialize_entry(name, l)?;
            }
        }
        m.end()
    }
}
