//! Authorization policies, as ztunnel's `istio.security.Authorization`, with the L7
//! attributes of an AuthorizationPolicy typed beside the L4 fields ([`l7`]).

mod l7;

pub use l7::{
    parse_host, parse_method, parse_request_principal, values, Condition, HeaderMatch, IpBlock,
    IpKey, L7Attributes, PathMatch, PathSegment, PathTemplate, TextKey, Values,
};

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
pub(crate) fn check_principal(m: &StringMatch) -> Result<(), String> {
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

    /// Reads a value as an AuthorizationPolicy writes it: `v` (exact), `pre*` (prefix),
    /// `*suf` (suffix), `*` (presence). Refused: an empty value, and a `*` anywhere else
    /// (Istio would read `*a*` as the suffix `a*`, with a literal star, which is never
    /// what was meant).
    pub fn from_istio(s: &str) -> Result<StringMatch, String> {
        let m = match s {
            "" => return Err("must not be empty (\"*\" is any value)".into()),
            "*" => StringMatch::Presence,
            _ => match (s.strip_prefix('*'), s.strip_suffix('*')) {
                (Some(rest), _) => StringMatch::Suffix(rest.to_string()),
                (None, Some(rest)) => StringMatch::Prefix(rest.to_string()),
                (None, None) => StringMatch::Exact(s.to_string()),
            },
        };
        match &m {
            StringMatch::Exact(v) | StringMatch::Prefix(v) | StringMatch::Suffix(v)
                if v.contains('*') =>
            {
                Err(format!(
                    "{s:?} has a '*' inside; a '*' may only be the whole value, or begin (\"*suffix\") or end (\"prefix*\") it"
                ))
            }
            _ => Ok(m),
        }
    }

    /// The AuthorizationPolicy form (see [`StringMatch::from_istio`]), which reads back
    /// as `self` for every match it made.
    pub fn to_istio(&self) -> String {
        match self {
            StringMatch::Exact(v) => v.clone(),
            StringMatch::Prefix(v) => format!("{v}*"),
            StringMatch::Suffix(v) => format!("*{v}"),
            StringMatch::Presence => "*".into(),
        }
    }

    /// The text the match compares (none for presence).
    pub fn literal(&self) -> Option<&str> {
        match self {
            StringMatch::Exact(v) | StringMatch::Prefix(v) | StringMatch::Suffix(v) => Some(v),
            StringMatch::Presence => None,
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
///
/// Read and written with the L7 attributes among the other fields, as an
/// AuthorizationPolicy writes them (`{principals: [...], paths: [...]}`); held apart, in
/// [`RbacMatch::l7`], so that an L4-only match (every match from xDS) does not pay for
/// them: 296 bytes instead of 704.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(from = "MatchFields")]
pub struct RbacMatch {
    pub namespaces: Vec<StringMatch>,
    pub not_namespaces: Vec<StringMatch>,
    pub service_accounts: Vec<ServiceAccountMatch>,
    pub not_service_accounts: Vec<ServiceAccountMatch>,
    /// Compared with the peer's SPIFFE id without `spiffe://`.
    pub principals: Vec<StringMatch>,
    pub not_principals: Vec<StringMatch>,
    pub source_ips: Vec<IpNet>,
    pub not_source_ips: Vec<IpNet>,
    pub destination_ips: Vec<IpNet>,
    pub not_destination_ips: Vec<IpNet>,
    pub destination_ports: Vec<u16>,
    pub not_destination_ports: Vec<u16>,
    /// The L7 attributes, `None` when the match sets none (what parsing makes; a
    /// `Some` with nothing set is treated the same).
    pub l7: Option<Box<L7Attributes>>,
}

/// A match object as it is written: the L4 fields and the L7 attributes side by side.
/// Only for reading; [`RbacMatch`]'s own `Serialize` writes the same form.
#[derive(Deserialize)]
#[serde(rename = "RbacMatch", rename_all = "camelCase", deny_unknown_fields)]
struct MatchFields {
    #[serde(default)]
    namespaces: Vec<StringMatch>,
    #[serde(default)]
    not_namespaces: Vec<StringMatch>,
    #[serde(default)]
    service_accounts: Vec<ServiceAccountMatch>,
    #[serde(default)]
    not_service_accounts: Vec<ServiceAccountMatch>,
    #[serde(default, with = "principal_list")]
    principals: Vec<StringMatch>,
    #[serde(default, with = "principal_list")]
    not_principals: Vec<StringMatch>,
    #[serde(default, with = "crate::addr::cidr_list")]
    source_ips: Vec<IpNet>,
    #[serde(default, with = "crate::addr::cidr_list")]
    not_source_ips: Vec<IpNet>,
    #[serde(default, with = "crate::addr::cidr_list")]
    destination_ips: Vec<IpNet>,
    #[serde(default, with = "crate::addr::cidr_list")]
    not_destination_ips: Vec<IpNet>,
    #[serde(default)]
    destination_ports: Vec<u16>,
    #[serde(default)]
    not_destination_ports: Vec<u16>,
    #[serde(default, deserialize_with = "l7::paths")]
    paths: Option<Vec<PathMatch>>,
    #[serde(default, deserialize_with = "l7::paths")]
    not_paths: Option<Vec<PathMatch>>,
    #[serde(default, deserialize_with = "l7::methods")]
    methods: Option<Vec<StringMatch>>,
    #[serde(default, deserialize_with = "l7::methods")]
    not_methods: Option<Vec<StringMatch>>,
    #[serde(default, deserialize_with = "l7::hosts")]
    hosts: Option<Vec<StringMatch>>,
    #[serde(default, deserialize_with = "l7::hosts")]
    not_hosts: Option<Vec<StringMatch>>,
    #[serde(default, deserialize_with = "l7::request_principals")]
    request_principals: Option<Vec<StringMatch>>,
    #[serde(default, deserialize_with = "l7::request_principals")]
    not_request_principals: Option<Vec<StringMatch>>,
    #[serde(default, deserialize_with = "l7::headers")]
    headers: Option<Vec<HeaderMatch>>,
    #[serde(default, deserialize_with = "l7::headers")]
    not_headers: Option<Vec<HeaderMatch>>,
    #[serde(default, deserialize_with = "l7::ips")]
    remote_ips: Option<Vec<IpBlock>>,
    #[serde(default, deserialize_with = "l7::ips")]
    not_remote_ips: Option<Vec<IpBlock>>,
    #[serde(default, deserialize_with = "l7::when")]
    when: Option<Vec<Condition>>,
}

impl From<MatchFields> for RbacMatch {
    fn from(m: MatchFields) -> RbacMatch {
        let l7 = L7Attributes {
            paths: m.paths,
            not_paths: m.not_paths,
            methods: m.methods,
            not_methods: m.not_methods,
            hosts: m.hosts,
            not_hosts: m.not_hosts,
            request_principals: m.request_principals,
            not_request_principals: m.not_request_principals,
            headers: m.headers,
            not_headers: m.not_headers,
            remote_ips: m.remote_ips,
            not_remote_ips: m.not_remote_ips,
            when: m.when,
        };
        RbacMatch {
            namespaces: m.namespaces,
            not_namespaces: m.not_namespaces,
            service_accounts: m.service_accounts,
            not_service_accounts: m.not_service_accounts,
            principals: m.principals,
            not_principals: m.not_principals,
            source_ips: m.source_ips,
            not_source_ips: m.not_source_ips,
            destination_ips: m.destination_ips,
            not_destination_ips: m.not_destination_ips,
            destination_ports: m.destination_ports,
            not_destination_ports: m.not_destination_ports,
            l7: (!l7.is_empty()).then(|| Box::new(l7)),
        }
    }
}

impl Serialize for RbacMatch {
    /// Every set field in declaration order, the L7 attributes last, as written.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        struct Principals<'a>(&'a [StringMatch]);
        impl Serialize for Principals<'_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                principal_list::serialize(self.0, s)
            }
        }
        struct Cidrs<'a>(&'a [IpNet]);
        impl Serialize for Cidrs<'_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                crate::addr::cidr_list::serialize(self.0, s)
            }
        }
        let l7 = self.l7.as_deref().map(L7Attributes::fields);
        let lists = [
            self.namespaces.len(),
            self.not_namespaces.len(),
            self.service_accounts.len(),
            self.not_service_accounts.len(),
            self.principals.len(),
            self.not_principals.len(),
            self.source_ips.len(),
            self.not_source_ips.len(),
            self.destination_ips.len(),
            self.not_destination_ips.len(),
            self.destination_ports.len(),
            self.not_destination_ports.len(),
        ];
        let l7_set = self.l7.as_deref().map_or(0, |a| a.names().count());
        let len = lists.iter().filter(|n| **n > 0).count() + l7_set;
        let mut st = s.serialize_struct("RbacMatch", len)?;
        fn field<M: SerializeStruct, T: Serialize + ?Sized>(
            st: &mut M,
            name: &'static str,
            set: bool,
            v: &T,
        ) -> Result<(), M::Error> {
            if set {
                st.serialize_field(name, v)
            } else {
                st.skip_field(name)
            }
        }
        let ns = |v: &[StringMatch]| !v.is_empty();
        field(
            &mut st,
            "namespaces",
            ns(&self.namespaces),
            &self.namespaces,
        )?;
        field(
            &mut st,
            "notNamespaces",
            ns(&self.not_namespaces),
            &self.not_namespaces,
        )?;
        field(
            &mut st,
            "serviceAccounts",
            !self.service_accounts.is_empty(),
            &self.service_accounts,
        )?;
        field(
            &mut st,
            "notServiceAccounts",
            !self.not_service_accounts.is_empty(),
            &self.not_service_accounts,
        )?;
        field(
            &mut st,
            "principals",
            ns(&self.principals),
            &Principals(&self.principals),
        )?;
        field(
            &mut st,
            "notPrincipals",
            ns(&self.not_principals),
            &Principals(&self.not_principals),
        )?;
        for (name, v) in [
            ("sourceIps", &self.source_ips),
            ("notSourceIps", &self.not_source_ips),
            ("destinationIps", &self.destination_ips),
            ("notDestinationIps", &self.not_destination_ips),
        ] {
            field(&mut st, name, !v.is_empty(), &Cidrs(v))?;
        }
        for (name, v) in [
            ("destinationPorts", &self.destination_ports),
            ("notDestinationPorts", &self.not_destination_ports),
        ] {
            field(&mut st, name, !v.is_empty(), v)?;
        }
        match l7 {
            Some(fields) => {
                for (name, v) in fields {
                    match v {
                        Some(v) => st.serialize_field(name, &v)?,
                        None => st.skip_field(name)?,
                    }
                }
            }
            None => {
                for name in L7_ATTRIBUTES {
                    st.skip_field(name)?;
                }
            }
        }
        st.end()
    }
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
        self.has_no_l4_field() && !self.has_l7()
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
        self.l7.as_deref().into_iter().flat_map(L7Attributes::names)
    }

    /// True if an L7 attribute is set.
    pub fn has_l7(&self) -> bool {
        self.l7_attributes().next().is_some()
    }

    fn shrink_to_fit(&mut self) {
        self.namespaces.shrink_to_fit();
        self.not_namespaces.shrink_to_fit();
        self.service_accounts.shrink_to_fit();
        self.not_service_accounts.shrink_to_fit();
        self.principals.shrink_to_fit();
        self.not_principals.shrink_to_fit();
        self.source_ips.shrink_to_fit();
        self.not_source_ips.shrink_to_fit();
        self.destination_ips.shrink_to_fit();
        self.not_destination_ips.shrink_to_fit();
        self.destination_ports.shrink_to_fit();
        self.not_destination_ports.shrink_to_fit();
        if let Some(l7) = &mut self.l7 {
            l7.shrink_to_fit();
        }
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

    /// Gives back the spare capacity that reading left in its lists. A match object is
    /// 300 bytes and a list read from YAML or JSON starts with room for four, so without
    /// this a policy of two one-object clauses holds about three times what it uses.
    pub fn shrink_to_fit(&mut self) {
        self.rules.shrink_to_fit();
        for rule in &mut self.rules {
            rule.shrink_to_fit();
            for clause in rule {
                clause.shrink_to_fit();
                clause.iter_mut().for_each(RbacMatch::shrink_to_fit);
            }
        }
    }

    /// Checks the policy (the error names the field at fault) and gives back its spare
    /// capacity ([`Self::shrink_to_fit`]): every reader of policies calls it once.
    pub fn normalize(&mut self) -> Result<(), String> {
        self.shrink_to_fit();
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A match with every field set, as the local config writes it.
    const EVERY_FIELD: &str = r#"
name: p
namespace: ns
scope: Namespace
action: Deny
rules:
- - - namespaces: [{exact: a}]
      notNamespaces: [{prefix: b}]
      serviceAccounts: [{namespace: a, serviceAccount: s}]
      notServiceAccounts: [{namespace: b, serviceAccount: t}]
      principals: [{suffix: /sa/x}]
      notPrincipals: [{presence: {}}]
      sourceIps: [10.0.0.0/8]
      notSourceIps: [10.1.0.1]
      destinationIps: ["fd00::/64"]
      notDestinationIps: [192.168.0.0/16]
      destinationPorts: [80]
      notDestinationPorts: [81]
      paths: ["/a"]
      notPaths: ["/b"]
      methods: [GET]
      notMethods: [PUT]
      hosts: [h.example]
      notHosts: [i.example]
      requestPrincipals: ["*"]
      notRequestPrincipals: [x]
      headers: {x-a: b}
      notHeaders: {x-c: d}
      remoteIps: [10.2.0.0/16]
      notRemoteIps: [10.3.0.1]
      when: [{key: "request.auth.claims[iss]", values: [x]}]
    - {}
"#;

    /// Each list's capacity against its length, outermost first; `l7` lists last.
    fn capacities(p: &Authorization) -> Vec<(usize, usize)> {
        let mut out = vec![(p.rules.capacity(), p.rules.len())];
        for rule in &p.rules {
            out.push((rule.capacity(), rule.len()));
            for clause in rule {
                out.push((clause.capacity(), clause.len()));
                for m in clause {
                    out.push((m.principals.capacity(), m.principals.len()));
                    out.push((m.namespaces.capacity(), m.namespaces.len()));
                    if let Some(l7) = &m.l7 {
                        let paths = l7.paths.as_ref().unwrap();
                        out.push((paths.capacity(), paths.len()));
                    }
                }
            }
        }
        out
    }

    #[test]
    fn normalizing_gives_back_what_reading_over_allocated() {
        let mut p: Authorization = yaml_serde::from_str(EVERY_FIELD).unwrap();
        assert!(
            capacities(&p).iter().any(|(cap, len)| cap > len),
            "reading leaves spare room: {:?}",
            capacities(&p)
        );
        let before = p.clone();
        p.normalize().unwrap();
        assert!(
            capacities(&p).iter().all(|(cap, len)| cap == len),
            "{:?}",
            capacities(&p)
        );
        assert_eq!(p, before, "the same policy");
    }

    /// `/config_dump`'s form of [`EVERY_FIELD`] (and of an empty match): every set field
    /// in declaration order, L7 attributes last and as written, unset ones left out.
    const EVERY_FIELD_JSON: &str = r#"{"name":"p","namespace":"ns","scope":"Namespace","action":"Deny","rules":[[[{"namespaces":[{"Exact":"a"}],"notNamespaces":[{"Prefix":"b"}],"serviceAccounts":[{"namespace":"a","serviceAccount":"s"}],"notServiceAccounts":[{"namespace":"b","serviceAccount":"t"}],"principals":[{"Suffix":"/sa/x"}],"notPrincipals":[{"Presence":[]}],"sourceIps":["10.0.0.0/8"],"notSourceIps":["10.1.0.1/32"],"destinationIps":["fd00::/64"],"notDestinationIps":["192.168.0.0/16"],"destinationPorts":[80],"notDestinationPorts":[81],"paths":["/a"],"notPaths":["/b"],"methods":["GET"],"notMethods":["PUT"],"hosts":["h.example"],"notHosts":["i.example"],"requestPrincipals":["*"],"notRequestPrincipals":["x"],"headers":{"x-a":"b"},"notHeaders":{"x-c":"d"},"remoteIps":["10.2.0.0/16"],"notRemoteIps":["10.3.0.1"],"when":[{"key":"request.auth.claims[iss]","values":["x"]}]},{}]]],"dryRun":false}"#;

    #[test]
    fn every_field_is_read_and_written_as_before() {
        let p: Authorization = yaml_serde::from_str(EVERY_FIELD).unwrap();
        let json = serde_json::to_string(&p).unwrap();
        assert_eq!(json, EVERY_FIELD_JSON);
        assert_eq!(
            p.l7_attributes().into_iter().collect::<Vec<_>>().len(),
            L7_ATTRIBUTES.len()
        );
        let m = &p.rules[0][0];
        assert!(m[0].has_l7() && !m[0].has_no_l4_field() && !m[0].is_empty());
        assert!(m[1].is_empty() && !m[1].has_l7());
        // What is written reads back the same.
        let back: Authorization = serde_json::from_str(&json).unwrap();
        assert_eq!(back, p);
        // A match without L7 attributes holds none.
        let l4: Authorization = yaml_serde::from_str(
            "{name: p, scope: Global, action: Allow, rules: [[[{destinationPorts: [9], paths: null}]]]}",
        )
        .unwrap();
        assert_eq!(
            l4.rules[0][0][0],
            RbacMatch {
                destination_ports: vec![9],
                ..RbacMatch::default()
            }
        );
    }

    /// An L4-only match pays for its twelve lists and one pointer, not for the thirteen
    /// L7 attributes (704 bytes when they were inline).
    #[test]
    fn an_l4_match_does_not_hold_l7_attributes() {
        let lists = 12 * std::mem::size_of::<Vec<u8>>();
        assert_eq!(
            std::mem::size_of::<RbacMatch>(),
            lists + std::mem::size_of::<usize>()
        );
    }
}
