//! The shape of an xDS resource body, checked on its encoded bytes before `prost` decodes
//! it: how many entries each repeated field has, and how long each string is.
//!
//! Why on the bytes: decoding amplifies. An empty `Match` is 2 bytes on the wire and a
//! ~300-byte struct once decoded (a 296-byte `RbacMatch` once converted, 704 before its
//! L7 attributes were boxed), so a 4 MB
//! `Authorization` of 2 million empty matches took 1.9 GiB before any check after
//! decoding could run. The walk here allocates nothing ([`crate::wire`]), so what `prost`
//! is then allowed to decode is bounded by the limits below times the size of each
//! decoded struct.
//!
//! The walk follows `prost`'s merge rules: a singular sub-message that appears several
//! times is merged into one, so the entries of its repeated fields add up across the
//! occurrences (the `Address` oneof, `Service.loadBalancing`, a `services` map entry's
//! value). Fields the walk does not know are skipped, as `prost` skips them; a known field
//! with the wrong wire type is left for `prost` to refuse.
//!
//! Field paths in errors use the proto's JSON names (`rules[0].clauses[1].matches`), as
//! [`crate::ConvertError`] does; a `services` map entry is named by its position.
//!
//! A body within the limits also gets its [`Counts`] (rules, match objects, values by
//! kind, strings and their bytes, addresses, ports...): what [`crate::held`] turns into
//! an estimate of the bytes it will hold once decoded, for the delta client's budget.

use crate::wire::{self, fields, Value, WireError};

// ----- the limits -----------------------------------------------------------------------
//
// Each is far above what a real mesh sends (the reasons say what real figures are) and
// low enough that one resource stays within a few MiB once decoded.

/// Rules of one `Authorization`: one per `rules` entry of an AuthorizationPolicy; people
/// write a handful, generated policies tens.
pub const MAX_RULES_PER_POLICY: usize = 1_024;
/// Clauses of one rule: istiod makes one for `from`, one for `to` and one per `when`
/// condition, so a handful.
pub const MAX_CLAUSES_PER_RULE: usize = 64;
/// Match objects of one rule, over its clauses: one per `from` / `to` entry or `when`
/// value; tens in practice.
pub const MAX_MATCHES_PER_RULE: usize = 4_096;
/// Match objects of one policy, over all its rules: bounds the product of the two limits
/// above (16,384 converted `RbacMatch`es are ~5 MiB).
pub const MAX_MATCHES_PER_POLICY: usize = 16_384;
/// Values of one field of a match object (principals, namespaces, service accounts, IP
/// blocks, ports): people write at most hundreds.
pub const MAX_VALUES_PER_FIELD: usize = 4_096;
/// Values of all fields of all match objects of one policy.
pub const MAX_VALUES_PER_POLICY: usize = 65_536;
/// Bytes of any string or bytes field of a body (names, hostnames, principals,
/// addresses): Kubernetes names and DNS names stop at 253, a SPIFFE id at 2,048.
/// `Extension.config` (opaque, ignored, decoded as one copy) is not bounded here.
pub const MAX_STRING_BYTES: usize = 4_096;
/// Addresses of one workload: a pod has one per IP family, a multi-NIC VM a few more.
pub const MAX_WORKLOAD_ADDRESSES: usize = 64;
/// Entries of a workload's `services` map: one per service selecting it, a few at most.
pub const MAX_WORKLOAD_SERVICES: usize = 1_024;
/// Ports of one port list (a service's `ports`, one `services` entry of a workload): a
/// Kubernetes service lists a few.
pub const MAX_PORTS_PER_LIST: usize = 1_024;
/// Ports over all `services` entries of one workload.
pub const MAX_PORTS_PER_WORKLOAD: usize = 16_384;
/// A workload's `authorizationPolicies`: the WORKLOAD_SELECTOR policies selecting it, a
/// few.
pub const MAX_WORKLOAD_POLICIES: usize = 1_024;
/// VIPs of one service: one per IP family per network.
pub const MAX_SERVICE_ADDRESSES: usize = 256;
/// A service's `subjectAltNames`: one per identity backing it, a few.
pub const MAX_SUBJECT_ALT_NAMES: usize = 1_024;
/// A service's `weightedWaypoints` (not used by ambit; still decoded): a few.
pub const MAX_WEIGHTED_WAYPOINTS: usize = 64;
/// `loadBalancing.routingPreference`: the enum has six scopes.
pub const MAX_ROUTING_PREFERENCES: usize = 64;
/// `extensions` of one message (ignored by ambit and ztunnel; still decoded).
pub const MAX_EXTENSIONS: usize = 64;

/// Which limit an entry count broke.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Limit {
    RulesPerPolicy,
    ClausesPerRule,
    MatchesPerRule,
    MatchesPerPolicy,
    ValuesPerField,
    ValuesPerPolicy,
    WorkloadAddresses,
    WorkloadServices,
    PortsPerList,
    PortsPerWorkload,
    WorkloadPolicies,
    ServiceAddresses,
    SubjectAltNames,
    WeightedWaypoints,
    RoutingPreferences,
    Extensions,
    /// A limit of another resource type's own shape ([`crate::ResourceType::measure`]):
    /// at most `max` of `what` (`"parts of one widget"`).
    Other {
        max: usize,
        what: &'static str,
    },
}

impl Limit {
    /// The figure (one of the constants above).
    pub fn max(self) -> usize {
        match self {
            Limit::RulesPerPolicy => MAX_RULES_PER_POLICY,
            Limit::ClausesPerRule => MAX_CLAUSES_PER_RULE,
            Limit::MatchesPerRule => MAX_MATCHES_PER_RULE,
            Limit::MatchesPerPolicy => MAX_MATCHES_PER_POLICY,
            Limit::ValuesPerField => MAX_VALUES_PER_FIELD,
            Limit::ValuesPerPolicy => MAX_VALUES_PER_POLICY,
            Limit::WorkloadAddresses => MAX_WORKLOAD_ADDRESSES,
            Limit::WorkloadServices => MAX_WORKLOAD_SERVICES,
            Limit::PortsPerList => MAX_PORTS_PER_LIST,
            Limit::PortsPerWorkload => MAX_PORTS_PER_WORKLOAD,
            Limit::WorkloadPolicies => MAX_WORKLOAD_POLICIES,
            Limit::ServiceAddresses => MAX_SERVICE_ADDRESSES,
            Limit::SubjectAltNames => MAX_SUBJECT_ALT_NAMES,
            Limit::WeightedWaypoints => MAX_WEIGHTED_WAYPOINTS,
            Limit::RoutingPreferences => MAX_ROUTING_PREFERENCES,
            Limit::Extensions => MAX_EXTENSIONS,
            Limit::Other { max, .. } => max,
        }
    }

    /// What is counted, for the message.
    fn what(self) -> &'static str {
        match self {
            Limit::RulesPerPolicy => "rules in one policy",
            Limit::ClausesPerRule => "clauses in one rule",
            Limit::MatchesPerRule => "match objects in one rule",
            Limit::MatchesPerPolicy => "match objects in one policy",
            Limit::ValuesPerField => "values in one field of a match object",
            Limit::ValuesPerPolicy => "values in the match objects of one policy",
            Limit::WorkloadAddresses => "addresses of one workload",
            Limit::WorkloadServices => "services of one workload",
            Limit::PortsPerList => "ports in one list",
            Limit::PortsPerWorkload => "ports over the services of one workload",
            Limit::WorkloadPolicies => "authorization policies of one workload",
            Limit::ServiceAddresses => "addresses of one service",
            Limit::SubjectAltNames => "subject alt names of one service",
            Limit::WeightedWaypoints => "weighted waypoints of one service",
            Limit::RoutingPreferences => "routing preferences",
            Limit::Extensions => "extensions in one message",
            Limit::Other { what, .. } => what,
        }
    }
}

/// Why a body was refused before decoding. The field path is relative to the body.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ShapeError {
    /// A repeated field (or a total over several) has too many entries.
    #[error("{field}: more than {} {} (the limit)", limit.max(), limit.what())]
    TooMany { field: String, limit: Limit },
    /// A string or bytes field is longer than [`MAX_STRING_BYTES`].
    #[error("{field}: {len} bytes, more than the limit of {MAX_STRING_BYTES} bytes per string")]
    TooLong { field: String, len: usize },
    /// The bytes are not a protobuf message.
    #[error("{}{error}", at_prefix(field))]
    Malformed { field: String, error: WireError },
}

pub(crate) fn at_prefix(field: &str) -> String {
    if field.is_empty() {
        String::new()
    } else {
        format!("{field}: ")
    }
}

// ----- what a body holds ----------------------------------------------------------------

/// Strings (and bytes fields) the decoded body holds: how many are non-empty, and their
/// bytes. Every string of the body that the model keeps is counted; a few that it does
/// not (the bytes of a gateway's address) are too, which only errs on the safe side.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Text {
    pub count: usize,
    pub bytes: usize,
}

/// The counts of an `istio.security.Authorization` body.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PolicyCounts {
    pub text: Text,
    pub rules: usize,
    pub clauses: usize,
    pub matches: usize,
    /// The values of match objects by kind, with the number of non-empty lists of each
    /// (a list has a heap block of its own).
    pub string_matches: Values,
    pub service_accounts: Values,
    pub cidrs: Values,
    pub ports: Values,
}

/// Values of one kind, and the non-empty lists they are in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Values {
    pub lists: usize,
    pub values: usize,
}

impl Values {
    fn add(&mut self, n: usize) {
        if n > 0 {
            self.lists += 1;
            self.values += n;
        }
    }
}

/// The counts of an `istio.workload.Address` body that carries a workload.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkloadCounts {
    pub text: Text,
    pub addresses: usize,
    /// Entries of the `services` map, the bytes of their keys, and their ports.
    pub services: usize,
    pub service_key_bytes: usize,
    pub ports: usize,
    pub policies: usize,
    /// Bytes of `network` (copied into the store's index once per address).
    pub network_bytes: usize,
    extensions: usize,
}

/// The counts of an `istio.workload.Address` body that carries a service.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServiceCounts {
    pub text: Text,
    pub addresses: usize,
    /// Bytes of the addresses' `network`s (copied into the store's VIP index).
    pub address_network_bytes: usize,
    pub ports: usize,
    pub subject_alt_names: usize,
    pub routing_preferences: usize,
    /// Bytes of `hostname` (copied into the store's hostname index).
    pub hostname_bytes: usize,
    weighted_waypoints: usize,
    extensions: usize,
}

/// What the walk found in a body within the limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counts {
    Policy(PolicyCounts),
    Workload(WorkloadCounts),
    Service(ServiceCounts),
    /// An `Address` that carries neither (refused when it is converted).
    Neither,
}

// ----- the walk -------------------------------------------------------------------------

/// The path of the message being walked, built only when an error needs it.
type At<'a> = &'a dyn Fn() -> String;

fn join(at: At<'_>, field: &str) -> String {
    let p = at();
    if p.is_empty() {
        field.to_string()
    } else {
        format!("{p}.{field}")
    }
}

fn walk<'a>(
    buf: &'a [u8],
    at: At<'_>,
    mut f: impl FnMut(u32, Value<'a>) -> Result<(), ShapeError>,
) -> Result<(), ShapeError> {
    for field in fields(buf) {
        let (n, v) = field.map_err(|error| ShapeError::Malformed { field: at(), error })?;
        f(n, v)?;
    }
    Ok(())
}

/// Adds `k` entries to a count and checks it.
fn add(
    count: &mut usize,
    k: usize,
    limit: Limit,
    field: impl FnOnce() -> String,
) -> Result<(), ShapeError> {
    *count = count.saturating_add(k);
    if *count > limit.max() {
        return Err(ShapeError::TooMany {
            field: field(),
            limit,
        });
    }
    Ok(())
}

/// Checks a string or bytes field's length and counts it into `text`.
fn string(v: Value<'_>, text: &mut Text, field: impl FnOnce() -> String) -> Result<(), ShapeError> {
    match v {
        Value::Len(b) if b.len() > MAX_STRING_BYTES => Err(ShapeError::TooLong {
            field: field(),
            len: b.len(),
        }),
        Value::Len(b) if !b.is_empty() => {
            text.count += 1;
            text.bytes += b.len();
            Ok(())
        }
        _ => Ok(()),
    }
}

/// The payload of a sub-message field; None for the wrong wire type (`prost` refuses it).
fn sub(v: Value<'_>) -> Option<&[u8]> {
    match v {
        Value::Len(b) => Some(b),
        _ => None,
    }
}

/// Checks strings `names` (field number, JSON name) of a message without repeated fields.
fn strings_only(
    buf: &[u8],
    at: At<'_>,
    names: &[(u32, &str)],
    text: &mut Text,
) -> Result<(), ShapeError> {
    walk(buf, at, |n, v| match names.iter().find(|(k, _)| *k == n) {
        Some((_, name)) => string(v, text, || join(at, name)),
        None => Ok(()),
    })
}

/// `istio.workload.Extension`: a name and an opaque `Any`. Never held (the conversion
/// drops extensions), so its strings are not counted.
fn extension(buf: &[u8], at: At<'_>) -> Result<(), ShapeError> {
    let text = &mut Text::default();
    walk(buf, at, |n, v| match (n, sub(v)) {
        (1, _) => string(v, text, || join(at, "name")),
        (2, Some(any)) => strings_only(any, &|| join(at, "config"), &[(1, "typeUrl")], text),
        _ => Ok(()),
    })
}

/// Counts one entry of a message's `extensions` and checks it.
fn extensions_entry(
    count: &mut usize,
    v: Value<'_>,
    field: &str,
    at: At<'_>,
) -> Result<(), ShapeError> {
    let i = *count;
    add(count, 1, Limit::Extensions, || join(at, field))?;
    match sub(v) {
        Some(b) => extension(b, &|| join(at, &format!("{field}[{i}]"))),
        None => Ok(()),
    }
}

// ----- istio.security.Authorization -----------------------------------------------------

/// Checks an encoded `istio.security.Authorization`.
pub fn check_authorization(buf: &[u8]) -> Result<(), ShapeError> {
    measure_authorization(buf).map(|_| ())
}

/// Checks an encoded `istio.security.Authorization` and counts what it holds.
pub fn measure_authorization(buf: &[u8]) -> Result<PolicyCounts, ShapeError> {
    let at: At<'_> = &String::new;
    let mut c = PolicyCounts::default();
    let mut values = 0;
    let mut extensions = 0;
    walk(buf, at, |n, v| match n {
        1 => string(v, &mut c.text, || "name".into()),
        2 => string(v, &mut c.text, || "namespace".into()),
        5 => {
            let r = c.rules;
            add(&mut c.rules, 1, Limit::RulesPerPolicy, || "rules".into())?;
            match sub(v) {
                Some(b) => rule(b, &|| format!("rules[{r}]"), &mut c, &mut values),
                None => Ok(()),
            }
        }
        7 => extensions_entry(&mut extensions, v, "extensions", at),
        _ => Ok(()),
    })?;
    Ok(c)
}

fn rule(
    buf: &[u8],
    at: At<'_>,
    c: &mut PolicyCounts,
    values: &mut usize,
) -> Result<(), ShapeError> {
    let (mut clauses, mut matches) = (0, 0);
    walk(buf, at, |n, v| match (n, sub(v)) {
        (1, payload) => {
            let i = clauses;
            add(&mut clauses, 1, Limit::ClausesPerRule, || {
                join(at, "clauses")
            })?;
            c.clauses += 1;
            match payload {
                Some(b) => clause(
                    b,
                    &|| join(at, &format!("clauses[{i}]")),
                    &mut matches,
                    c,
                    values,
                ),
                None => Ok(()),
            }
        }
        _ => Ok(()),
    })
}

fn clause(
    buf: &[u8],
    at: At<'_>,
    rule_matches: &mut usize,
    c: &mut PolicyCounts,
    values: &mut usize,
) -> Result<(), ShapeError> {
    let mut i = 0;
    walk(buf, at, |n, v| match (n, sub(v)) {
        (2, payload) => {
            let m = i;
            i += 1;
            add(rule_matches, 1, Limit::MatchesPerRule, || {
                join(at, "matches")
            })?;
            add(&mut c.matches, 1, Limit::MatchesPerPolicy, || {
                join(at, "matches")
            })?;
            match payload {
                Some(b) => rbac_match(b, &|| join(at, &format!("matches[{m}]")), c, values),
                None => Ok(()),
            }
        }
        _ => Ok(()),
    })
}

/// JSON names of `istio.security.Match`'s fields 1..=13.
const MATCH_FIELDS: [&str; 13] = [
    "namespaces",
    "notNamespaces",
    "principals",
    "notPrincipals",
    "sourceIps",
    "notSourceIps",
    "destinationIps",
    "notDestinationIps",
    "destinationPorts",
    "notDestinationPorts",
    "serviceAccounts",
    "notServiceAccounts",
    "extensions",
];

fn rbac_match(
    buf: &[u8],
    at: At<'_>,
    c: &mut PolicyCounts,
    values: &mut usize,
) -> Result<(), ShapeError> {
    let mut counts = [0usize; 13];
    let text = &mut c.text;
    // The bytes of an address become an `IpNet`, not a string.
    let ip_text = &mut Text::default();
    walk(buf, at, |n, v| {
        let Some(name) = n.checked_sub(1).and_then(|i| MATCH_FIELDS.get(i as usize)) else {
            return Ok(());
        };
        let idx = (n - 1) as usize;
        if n == 13 {
            return extensions_entry(&mut counts[idx], v, name, at);
        }
        let i = counts[idx];
        let k = if matches!(n, 9 | 10) {
            wire::varint_count(v)
        } else {
            1
        };
        add(&mut counts[idx], k, Limit::ValuesPerField, || {
            join(at, name)
        })?;
        add(values, k, Limit::ValuesPerPolicy, || join(at, name))?;
        let item = || join(at, &format!("{name}[{i}]"));
        match (n, sub(v)) {
            (1..=4, Some(b)) => strings_only(
                b,
                &item,
                &[(1, "exact"), (2, "prefix"), (3, "suffix")],
                text,
            ),
            (5..=8, Some(b)) => strings_only(b, &item, &[(1, "address")], ip_text),
            (11 | 12, Some(b)) => {
                strings_only(b, &item, &[(1, "namespace"), (2, "serviceAccount")], text)
            }
            _ => Ok(()),
        }
    })?;
    for (i, n) in counts[..12].iter().enumerate() {
        match i {
            0..=3 => c.string_matches.add(*n),
            4..=7 => c.cidrs.add(*n),
            8 | 9 => c.ports.add(*n),
            _ => c.service_accounts.add(*n),
        }
    }
    Ok(())
}

// ----- istio.workload.Address -----------------------------------------------------------

/// Checks an encoded `istio.workload.Address`. The counts of a workload (or service) that
/// appears several times add up, as `prost` merges the occurrences into one.
pub fn check_address(buf: &[u8]) -> Result<(), ShapeError> {
    measure_address(buf).map(|_| ())
}

/// Checks an encoded `istio.workload.Address` and counts what it holds: the workload or
/// the service, whichever comes last (as `prost` keeps the last of a oneof).
pub fn measure_address(buf: &[u8]) -> Result<Counts, ShapeError> {
    let at: At<'_> = &String::new;
    let mut w = WorkloadCounts::default();
    let mut s = ServiceCounts::default();
    // Which of the oneof came last: 0 neither, 1 workload, 2 service.
    let mut last = 0;
    walk(buf, at, |n, v| match (n, sub(v)) {
        (1, Some(b)) => {
            last = 1;
            workload(b, &mut w)
        }
        (2, Some(b)) => {
            last = 2;
            service(b, &mut s)
        }
        _ => Ok(()),
    })?;
    Ok(match last {
        1 => Counts::Workload(w),
        2 => Counts::Service(s),
        _ => Counts::Neither,
    })
}

const WORKLOAD_STRINGS: &[(u32, &str)] = &[
    (20, "uid"),
    (1, "name"),
    (2, "namespace"),
    (21, "hostname"),
    (4, "network"),
    (6, "trustDomain"),
    (7, "serviceAccount"),
    (9, "node"),
    (10, "canonicalName"),
    (11, "canonicalRevision"),
    (13, "workloadName"),
    (18, "clusterId"),
];

fn workload(buf: &[u8], c: &mut WorkloadCounts) -> Result<(), ShapeError> {
    let at: At<'_> = &String::new;
    walk(buf, at, |n, v| {
        if let Some((_, name)) = WORKLOAD_STRINGS.iter().find(|(k, _)| *k == n) {
            if let (4, Value::Len(b)) = (n, v) {
                c.network_bytes = c.network_bytes.max(b.len());
            }
            return string(v, &mut c.text, || name.to_string());
        }
        match (n, sub(v)) {
            (3, _) => {
                let i = c.addresses;
                add(&mut c.addresses, 1, Limit::WorkloadAddresses, || {
                    "addresses".into()
                })?;
                // An `IpAddr` once decoded, not a string.
                string(v, &mut Text::default(), || format!("addresses[{i}]"))
            }
            (8, Some(b)) => gateway(b, &|| "waypoint".into(), &mut c.text),
            (19, Some(b)) => gateway(b, &|| "networkGateway".into(), &mut c.text),
            (24, Some(b)) => strings_only(
                b,
                &|| "locality".into(),
                &[(1, "region"), (2, "zone"), (3, "subzone")],
                &mut c.text,
            ),
            (22, payload) => {
                let i = c.services;
                add(&mut c.services, 1, Limit::WorkloadServices, || {
                    "services".into()
                })?;
                match payload {
                    Some(b) => services_entry(b, i, c),
                    None => Ok(()),
                }
            }
            (16, _) => {
                let i = c.policies;
                add(&mut c.policies, 1, Limit::WorkloadPolicies, || {
                    "authorizationPolicies".into()
                })?;
                string(v, &mut c.text, || format!("authorizationPolicies[{i}]"))
            }
            (26, _) => extensions_entry(&mut c.extensions, v, "extensions", at),
            _ => Ok(()),
        }
    })
}

/// One `services` map entry: key 1 (a string), value 2 (a `PortList`, merged if repeated).
fn services_entry(buf: &[u8], i: usize, c: &mut WorkloadCounts) -> Result<(), ShapeError> {
    let at = || format!("services[{i}]");
    let mut ports = 0;
    let WorkloadCounts {
        text,
        ports: total,
        service_key_bytes,
        ..
    } = c;
    walk(buf, &at, |n, v| match (n, sub(v)) {
        (1, key) => {
            *service_key_bytes += key.map_or(0, <[u8]>::len);
            string(v, text, || format!("services[{i}].key"))
        }
        (2, Some(list)) => walk(list, &at, |n, _| {
            if n != 1 {
                return Ok(());
            }
            let field = || format!("services[{i}].ports");
            add(&mut ports, 1, Limit::PortsPerList, field)?;
            add(total, 1, Limit::PortsPerWorkload, field)
        }),
        _ => Ok(()),
    })
}

fn gateway(buf: &[u8], at: At<'_>, text: &mut Text) -> Result<(), ShapeError> {
    walk(buf, at, |n, v| match (n, sub(v)) {
        (1, Some(b)) => strings_only(
            b,
            &|| join(at, "hostname"),
            &[(1, "namespace"), (2, "hostname")],
            text,
        ),
        (2, Some(b)) => strings_only(
            b,
            &|| join(at, "address"),
            &[(1, "network"), (2, "address")],
            text,
        ),
        _ => Ok(()),
    })
}

fn service(buf: &[u8], c: &mut ServiceCounts) -> Result<(), ShapeError> {
    let at: At<'_> = &String::new;
    walk(buf, at, |n, v| match (n, sub(v)) {
        (1, _) => string(v, &mut c.text, || "name".into()),
        (2, _) => string(v, &mut c.text, || "namespace".into()),
        (3, hostname) => {
            c.hostname_bytes = c.hostname_bytes.max(hostname.map_or(0, <[u8]>::len));
            string(v, &mut c.text, || "hostname".into())
        }
        (4, payload) => {
            let i = c.addresses;
            add(&mut c.addresses, 1, Limit::ServiceAddresses, || {
                "addresses".into()
            })?;
            let ServiceCounts {
                text,
                address_network_bytes,
                ..
            } = c;
            let at = || format!("addresses[{i}]");
            match payload {
                Some(b) => walk(b, &at, |n, v| match n {
                    1 => {
                        *address_network_bytes += sub(v).map_or(0, <[u8]>::len);
                        string(v, text, || join(&at, "network"))
                    }
                    // An `IpAddr` once decoded.
                    2 => string(v, &mut Text::default(), || join(&at, "address")),
                    _ => Ok(()),
                }),
                None => Ok(()),
            }
        }
        // A Port holds numbers only.
        (5, _) => add(&mut c.ports, 1, Limit::PortsPerList, || "ports".into()),
        (6, _) => {
            let i = c.subject_alt_names;
            add(&mut c.subject_alt_names, 1, Limit::SubjectAltNames, || {
                "subjectAltNames".into()
            })?;
            string(v, &mut c.text, || format!("subjectAltNames[{i}]"))
        }
        (7, Some(b)) => gateway(b, &|| "waypoint".into(), &mut c.text),
        (8, Some(b)) => walk(b, &|| "loadBalancing".into(), |n, v| {
            if n != 1 {
                return Ok(());
            }
            add(
                &mut c.routing_preferences,
                wire::varint_count(v),
                Limit::RoutingPreferences,
                || "loadBalancing.routingPreference".into(),
            )
        }),
        (10, _) => extensions_entry(&mut c.extensions, v, "extensions", at),
        (13, payload) => {
            let i = c.weighted_waypoints;
            add(
                &mut c.weighted_waypoints,
                1,
                Limit::WeightedWaypoints,
                || "weightedWaypoints".into(),
            )?;
            let item = || format!("weightedWaypoints[{i}]");
            // Not carried by the conversion: not counted as held.
            let text = &mut Text::default();
            match payload {
                Some(b) => walk(b, &item, |n, v| match (n, sub(v)) {
                    (1, Some(g)) => {
                        gateway(g, &|| format!("weightedWaypoints[{i}].destination"), text)
                    }
                    _ => Ok(()),
                }),
                None => Ok(()),
            }
        }
        _ => Ok(()),
    })
}

// ----- envoy.service.discovery.v3.DeltaDiscoveryResponse --------------------------------

/// The entries of a response's repeated fields that `prost` would decode: resources,
/// removed names, and the aliases of every resource. Counted up to the first malformed
/// field (`prost` stops there too).
pub(crate) fn count_response_entries(buf: &[u8]) -> usize {
    let mut count = 0usize;
    for field in fields(buf) {
        let Ok((n, v)) = field else { break };
        match (n, v) {
            (2, Value::Len(resource)) => {
                count = count.saturating_add(1);
                for field in fields(resource) {
                    let Ok((n, _)) = field else { break };
                    if n == 4 {
                        count = count.saturating_add(1);
                    }
                }
            }
            (2 | 6, _) => count = count.saturating_add(1),
            _ => {}
        }
    }
    count
}

/// What a response says about itself, decoded without its repeated fields (`prost`
/// skips fields a message does not declare, allocating nothing for them).
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ResponseHead {
    #[prost(string, tag = "4")]
    pub type_url: String,
    #[prost(string, tag = "5")]
    pub nonce: String,
}

#[cfg(test)]
mod tests;
