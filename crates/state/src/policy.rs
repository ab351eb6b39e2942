//! L4 authorization policies, as ztunnel's `istio.security.Authorization`.

use ipnet::IpNet;
use serde::ser::SerializeMap;
use serde::{de, Deserialize, Deserializer, Serialize, Serializer};

use crate::names::{from_str_with, string_enum, StrError};

string_enum! {
    /// Which workloads a policy applies to.
    pub enum PolicyScope {
        /// Every workload of the mesh.
        Global = "Global" | "GLOBAL",
        /// Every workload in the policy's namespace.
        Namespace = "Namespace" | "NAMESPACE",
        /// Workloads that list the policy (`namespace/name`) in `authorizationPolicies`.
        WorkloadSelector = "WorkloadSelector" | "WORKLOAD_SELECTOR",
    }
}

string_enum! {
    /// What a matching policy does.
    pub enum PolicyAction {
        Allow = "Allow" | "ALLOW",
        Deny = "Deny" | "DENY",
    }
}

/// A string comparison. `presence` matches any non-empty string.
///
/// Read as ztunnel writes it, a YAML tag (`!Exact s`, `!Prefix s`, `!Suffix s`,
/// `!Presence`), or as a one-key map (`{exact: s}`, `{Exact: s}`, `{presence: {}}`).
/// Written as ztunnel's `/config_dump` shows it: `{"Exact": s}`, …, `{"Presence": []}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum StringMatch {
    Exact(String),
    Prefix(String),
    Suffix(String),
    Presence,
}

const STRING_MATCH_KINDS: &[&str] = &["exact", "prefix", "suffix", "presence"];

impl Serialize for StringMatch {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(1))?;
        match self {
            StringMatch::Exact(v) => m.serialize_entry("Exact", v)?,
            StringMatch::Prefix(v) => m.serialize_entry("Prefix", v)?,
            StringMatch::Suffix(v) => m.serialize_entry("Suffix", v)?,
            StringMatch::Presence => m.serialize_entry("Presence", &[(); 0])?,
        }
        m.end()
    }
}

/// The kind of a string match, from its key.
enum Kind {
    Exact,
    Prefix,
    Suffix,
    Presence,
}

impl<'de> Deserialize<'de> for Kind {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        from_str_with(
            d,
            "a string match kind",
            |s| -> Result<Kind, StrError<&str>> {
                match s {
                    "exact" | "Exact" => Ok(Kind::Exact),
                    "prefix" | "Prefix" => Ok(Kind::Prefix),
                    "suffix" | "Suffix" => Ok(Kind::Suffix),
                    "presence" | "Presence" => Ok(Kind::Presence),
                    _ => Err(StrError::UnknownVariant(STRING_MATCH_KINDS)),
                }
            },
        )
    }
}

impl<'de> Deserialize<'de> for StringMatch {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        deserialize_string_match(d, |_| Ok(()))
    }
}

/// Deserializes a string match and runs `check` on it inside the visitor, so that a refusal
/// carries the match's line and column.
fn deserialize_string_match<'de, D: Deserializer<'de>>(
    d: D,
    check: fn(&StringMatch) -> Result<(), String>,
) -> Result<StringMatch, D::Error> {
    {
        struct V(fn(&StringMatch) -> Result<(), String>);
        impl<'de> de::Visitor<'de> for V {
            type Value = StringMatch;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("one of {exact: s}, {prefix: s}, {suffix: s}, {presence: {}}")
            }
            fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<StringMatch, A::Error> {
                let Some(kind) = map.next_key::<Kind>()? else {
                    return Err(de::Error::invalid_length(0, &self));
                };
                let m = match kind {
                    Kind::Exact => StringMatch::Exact(map.next_value()?),
                    Kind::Prefix => StringMatch::Prefix(map.next_value()?),
                    Kind::Suffix => StringMatch::Suffix(map.next_value()?),
                    Kind::Presence => {
                        map.next_value::<de::IgnoredAny>()?;
                        StringMatch::Presence
                    }
                };
                if map.next_key::<de::IgnoredAny>()?.is_some() {
                    return Err(de::Error::custom(
                        "a string match has exactly one of exact, prefix, suffix, presence",
                    ));
                }
                (self.0)(&m).map_err(de::Error::custom)?;
                Ok(m)
            }
            fn visit_enum<A: de::EnumAccess<'de>>(self, data: A) -> Result<StringMatch, A::Error> {
                use de::VariantAccess;
                let (kind, v) = data.variant::<Kind>()?;
                let m = match kind {
                    Kind::Exact => StringMatch::Exact(v.newtype_variant()?),
                    Kind::Prefix => StringMatch::Prefix(v.newtype_variant()?),
                    Kind::Suffix => StringMatch::Suffix(v.newtype_variant()?),
                    Kind::Presence => {
                        v.newtype_variant::<de::IgnoredAny>()?;
                        StringMatch::Presence
                    }
                };
                (self.0)(&m).map_err(de::Error::custom)?;
                Ok(m)
            }
        }
        d.deserialize_any(V(check))
    }
}

/// Refuses a principal match that can never match: ztunnel compares principals with the
/// peer's SPIFFE id *without* its `spiffe://` scheme (`cluster.local/ns/a/sa/b`), and no
/// such string contains `spiffe:` (neither trust domains nor SPIFFE path segments allow
/// a ':'), so a value that starts with the scheme is a mistake.
fn check_principal(m: &StringMatch) -> Result<(), String> {
    let (StringMatch::Exact(v) | StringMatch::Prefix(v) | StringMatch::Suffix(v)) = m else {
        return Ok(());
    };
    match v.get(..ambit_identity::spiffe::SCHEME.len()) {
        Some(scheme) if scheme.eq_ignore_ascii_case(ambit_identity::spiffe::SCHEME) => {
            Err(format!(
                "principal {v:?} starts with \"spiffe://\", but principals are compared without the scheme, so it can never match; drop the prefix: {:?}",
                &v[scheme.len()..]
            ))
        }
        _ => Ok(()),
    }
}

/// serde helper: principal lists (see [`check_principal`]).
pub(crate) mod principal_list {
    use super::*;

    struct Principal(StringMatch);

    impl<'de> Deserialize<'de> for Principal {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            deserialize_string_match(d, check_principal).map(Principal)
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<StringMatch>, D::Error> {
        let v: Vec<Principal> = Vec::deserialize(d)?;
        Ok(v.into_iter().map(|p| p.0).collect())
    }

    pub fn serialize<S: Serializer>(v: &[StringMatch], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(v)
    }
}

impl StringMatch {
    pub fn matches(&self, s: &str) -> bool {
        match self {
            StringMatch::Exact(v) => s == v,
            StringMatch::Prefix(v) => s.starts_with(v.as_str()),
            StringMatch::Suffix(v) => s.ends_with(v.as_str()),
            StringMatch::Presence => !s.is_empty(),
        }
    }
}

/// A service account, by namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ServiceAccountMatch {
    pub namespace: String,
    pub service_account: String,
}

/// One match object: every field that is set must pass (a positive list: some value
/// matches; a negative list: no value matches). A match object that sets nothing never
/// matches.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RbacMatch {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<StringMatch>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_namespaces: Vec<StringMatch>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub service_accounts: Vec<ServiceAccountMatch>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_service_accounts: Vec<ServiceAccountMatch>,
    /// Compared with the peer's SPIFFE id without `spiffe://`.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        with = "principal_list"
    )]
    pub principals: Vec<StringMatch>,
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        with = "principal_list"
    )]
    pub not_principals: Vec<StringMatch>,
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        with = "crate::addr::cidr_list"
    )]
    pub source_ips: Vec<IpNet>,
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        with = "crate::addr::cidr_list"
    )]
    pub not_source_ips: Vec<IpNet>,
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        with = "crate::addr::cidr_list"
    )]
    pub destination_ips: Vec<IpNet>,
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        with = "crate::addr::cidr_list"
    )]
    pub not_destination_ips: Vec<IpNet>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub destination_ports: Vec<u16>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_destination_ports: Vec<u16>,
    // Attributes only an L7 proxy can see, written as an AuthorizationPolicy would (see
    // [`L7_ATTRIBUTES`]): read so that they are never mistaken for "no condition", never
    // evaluated. Kept as written, for `/config_dump`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paths: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_paths: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub methods: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_methods: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hosts: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_hosts: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_principals: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_request_principals: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headers: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_headers: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_ips: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_remote_ips: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when: Option<serde_json::Value>,
}

/// The L7 attributes a match object may carry in the local configuration, by their
/// camelCase names. An L4 proxy cannot see them, so (as Istio does for TCP traffic) a rule
/// of an ALLOW policy that uses one never matches (allow less), and a DENY policy is
/// enforced with them ignored (deny more): never a silent "allow".
pub const L7_ATTRIBUTES: &[&str] = &[
    "paths",
    "notPaths",
    "methods",
    "notMethods",
    "hosts",
    "notHosts",
    "requestPrincipals",
    "notRequestPrincipals",
    "headers",
    "notHeaders",
    "remoteIps",
    "notRemoteIps",
    "when",
];

impl RbacMatch {
    /// True if no field is set (such a match object never matches).
    pub fn is_empty(&self) -> bool {
        *self == RbacMatch::default()
    }

    /// True if no L4 field is set (L7 attributes may be).
    pub fn has_no_l4_field(&self) -> bool {
        self.namespaces.is_empty()
            && self.not_namespaces.is_empty()
            && self.service_accounts.is_empty()
            && self.not_service_accounts.is_empty()
            && self.principals.is_empty()
            && self.not_principals.is_empty()
            && self.source_ips.is_empty()
            && self.not_source_ips.is_empty()
            && self.destination_ips.is_empty()
            && self.not_destination_ips.is_empty()
            && self.destination_ports.is_empty()
            && self.not_destination_ports.is_empty()
    }

    /// The L7 attributes set (camelCase names, in [`L7_ATTRIBUTES`] order).
    pub fn l7_attributes(&self) -> impl Iterator<Item = &'static str> + '_ {
        let set = [
            &self.paths,
            &self.not_paths,
            &self.methods,
            &self.not_methods,
            &self.hosts,
            &self.not_hosts,
            &self.request_principals,
            &self.not_request_principals,
            &self.headers,
            &self.not_headers,
            &self.remote_ips,
            &self.not_remote_ips,
            &self.when,
        ];
        L7_ATTRIBUTES
            .iter()
            .zip(set)
            .filter(|(_, v)| v.is_some())
            .map(|(n, _)| *n)
    }

    /// True if an L7 attribute is set.
    pub fn has_l7(&self) -> bool {
        self.l7_attributes().next().is_some()
    }
}

/// A clause: matches if any of its match objects matches (or it has none).
pub type Clause = Vec<RbacMatch>;
/// A rule: matches if all of its clauses match (or it has none).
pub type Rule = Vec<Clause>;

/// An L4 authorization policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Authorization {
    pub name: String,
    #[serde(default)]
    pub namespace: String,
    pub scope: PolicyScope,
    pub action: PolicyAction,
    /// The policy matches if any rule matches; a policy without rules never matches.
    #[serde(default)]
    pub rules: Vec<Rule>,
    /// Evaluated and logged, never enforced.
    #[serde(default)]
    pub dry_run: bool,
}

impl Authorization {
    /// The key workloads use to select the policy: `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// The L7 attributes (see [`L7_ATTRIBUTES`]) any of its match objects sets.
    pub fn l7_attributes(&self) -> std::collections::BTreeSet<&'static str> {
        self.rules
            .iter()
            .flatten()
            .flatten()
            .flat_map(RbacMatch::l7_attributes)
            .collect()
    }

    /// Checks the policy. The error names the field at fault.
    pub fn normalize(&mut self) -> Result<(), String> {
        if self.name.is_empty() || self.name.contains('/') {
            return Err("name: must be non-empty and contain no '/'".into());
        }
        if self.namespace.contains('/') {
            return Err("namespace: must contain no '/'".into());
        }
        if self.scope == PolicyScope::Namespace && self.namespace.is_empty() {
            return Err("namespace: a Namespace-scoped policy needs a namespace".into());
        }
        Ok(())
    }
}
