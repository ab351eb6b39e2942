//! The shape of an `ambit.waypoint.v1.AuthorizationPolicy` body, checked on its encoded
//! bytes before it is decoded, and the estimate of what it will hold once decoded and in
//! the waypoint's store (for the delta client's budget, as [`crate::held`] does for the
//! node proxy's types).
//!
//! The message's own fields are walked with [`crate::wire`]: strings at most
//! [`MAX_STRING_BYTES`], at most [`MAX_TARGETS`] targets, rules' JSON at most
//! [`MAX_RULES_JSON_BYTES`]. The rules' JSON is walked too, building nothing (a
//! `serde_json` walk whose visitor only counts): at most [`MAX_RULES_PER_POLICY`] rules,
//! [`MAX_CLAUSES_PER_RULE`] clauses a rule, [`MAX_MATCHES_PER_POLICY`] match objects,
//! [`MAX_VALUES_PER_FIELD`] values a list and [`MAX_VALUES_PER_POLICY`] in all, strings
//! of at most [`MAX_STRING_BYTES`], nesting at most [`MAX_JSON_DEPTH`] deep (the
//! rules' form is 8 deep at most: a `when` condition's values).
//!
//! The estimate errs on the safe side. The walk knows a value's place by its depth: the
//! rules' list (depth 1), a rule's clauses (2), a clause's match objects (3, each a
//! `RbacMatch` with room for its L7 attributes), and below a match object's fields
//! every list (and the `headers` maps) as a list of the largest value type the model
//! has. Every string is charged as a heap block of its length, and one that could be a
//! path template or a claim's path as the segments it could split into. The rules'
//! lists are charged at their length, as the reader shrinks them; a path template's
//! segments and a claim's path as filled by pushes ([`crate::held`]'s rules). The store's part: the
//! policy's `Arc`, names, targets, its entry under `namespace/name`, and the waypoint's
//! pointer to it. `tests/waypoint_held.rs` checks it against a counting allocator.

use std::fmt;
use std::mem::size_of;

use ambit_manifests::{PolicyTarget, WaypointPolicy};
use ambit_state::{
    Clause, Condition, HeaderMatch, IpBlock, L7Attributes, PathMatch, PathSegment, RbacMatch, Rule,
    ServiceAccountMatch, StringMatch,
};
use ipnet::IpNet;
use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};

use crate::convert::ConvertError;
use crate::held::{block, blocks, btree_entry, grown, leaf, ARC_COUNTS, PTR, STRING};
use crate::reject::Rejection;
use crate::shape::{Limit, ShapeError};
use crate::wire::{self, Value};

pub use crate::shape::{
    MAX_CLAUSES_PER_RULE, MAX_MATCHES_PER_POLICY, MAX_RULES_PER_POLICY, MAX_STRING_BYTES,
    MAX_VALUES_PER_FIELD, MAX_VALUES_PER_POLICY,
};

/// Targets of one policy: Istio's CRD allows 16 `targetRefs`.
pub const MAX_TARGETS: usize = 1_024;
/// Bytes of the rules' JSON: a Kubernetes object is at most 1.5 MiB, and the JSON form
/// of its rules at most about twice its text.
pub const MAX_RULES_JSON_BYTES: usize = 4 << 20;
/// Nesting of the rules' JSON: rules, clauses, match objects, a field's list, a
/// condition, its values list, a value.
pub const MAX_JSON_DEPTH: usize = 8;

const MESSAGE: &str = "ambit.waypoint.v1.AuthorizationPolicy";

/// The largest value a list below a match object holds, in bytes.
const VALUE: usize = max(&[
    size_of::<StringMatch>(),
    size_of::<PathMatch>(),
    size_of::<HeaderMatch>(),
    size_of::<IpBlock>(),
    size_of::<IpNet>(),
    size_of::<ServiceAccountMatch>(),
    size_of::<Condition>(),
    size_of::<String>(),
    size_of::<u16>(),
]);

const fn max(v: &[usize]) -> usize {
    let mut m = 0;
    let mut i = 0;
    while i < v.len() {
        if v[i] > m {
            m = v[i];
        }
        i += 1;
    }
    m
}

fn too_many(field: impl Into<String>, limit: Limit) -> Rejection {
    Rejection::Shape(ShapeError::TooMany {
        field: field.into(),
        limit,
    })
}

fn too_long(field: impl Into<String>, len: usize) -> Result<(), Rejection> {
    if len > MAX_STRING_BYTES {
        return Err(Rejection::Shape(ShapeError::TooLong {
            field: field.into(),
            len,
        }));
    }
    Ok(())
}

fn malformed(field: impl Into<String>, error: wire::WireError) -> Rejection {
    Rejection::shape(
        MESSAGE,
        ShapeError::Malformed {
            field: field.into(),
            error,
        },
    )
}

/// Checks the shape of `body` (under a resource name `name_len` bytes long) and
/// estimates what it holds once decoded and stored.
pub fn measure(body: &[u8], name_len: usize) -> Result<u64, Rejection> {
    // Singular fields: the last occurrence is what `prost` keeps.
    let (mut name, mut namespace, mut provider) = (0, 0, 0);
    let (mut targets, mut target_bytes) = (0usize, 0usize);
    let mut rules_json: Option<&[u8]> = None;
    for field in wire::fields(body) {
        let (number, value) = field.map_err(|e| malformed("", e))?;
        let Value::Len(bytes) = value else { continue };
        match number {
            1 => {
                too_long("name", bytes.len())?;
                name = bytes.len();
            }
            2 => {
                too_long("namespace", bytes.len())?;
                namespace = bytes.len();
            }
            4 => {
                too_long("provider", bytes.len())?;
                provider = bytes.len();
            }
            6 => {
                if targets == MAX_TARGETS {
                    let limit = Limit::Other {
                        max: MAX_TARGETS,
                        what: "targets of one policy",
                    };
                    return Err(too_many("targets", limit));
                }
                target_bytes += target_name(targets, bytes)?;
                targets += 1;
            }
            7 => {
                if bytes.len() > MAX_RULES_JSON_BYTES {
                    let limit = Limit::Other {
                        max: MAX_RULES_JSON_BYTES,
                        what: "bytes of the rules' JSON",
                    };
                    return Err(too_many("rulesJson", limit));
                }
                rules_json = Some(bytes);
            }
            _ => {}
        }
    }
    let rules = match rules_json {
        Some(json) if !json.is_empty() => walk(json)?.estimate(),
        _ => 0,
    };
    let policy = block(ARC_COUNTS + size_of::<WaypointPolicy>())
        + block(name)
        + block(namespace)
        + block(provider)
        + block(targets * size_of::<PolicyTarget>())
        + blocks(targets, target_bytes + targets * namespace);
    // The store's entry (a leaf per policy errs high) and the waypoint's `Arc` of it.
    let store =
        block(name_len) + btree_entry(STRING + PTR) + block(leaf(STRING + PTR)) + 2 * PTR as u64;
    Ok(policy + rules + store)
}

/// The bytes of one target's name (its last occurrence).
fn target_name(i: usize, body: &[u8]) -> Result<usize, Rejection> {
    let mut len = 0;
    for field in wire::fields(body) {
        let (number, value) = field.map_err(|e| malformed(format!("targets[{i}]"), e))?;
        if let (2, Value::Len(name)) = (number, value) {
            too_long(format!("targets[{i}].name"), name.len())?;
            len = name.len();
        }
    }
    Ok(len)
}

/// What the walk of the rules' JSON counted.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct JsonCounts {
    /// Rules, clauses and match objects (the entries of the lists at depths 1, 2, 3).
    pub rules: usize,
    pub clauses: usize,
    pub matches: usize,
    /// Match objects that set an L7 attribute (they hold a box of them).
    pub l7_matches: usize,
    /// Lists below match objects (and `headers` maps) and their entries.
    pub value_lists: usize,
    pub values: usize,
    /// The estimate of every list and string so far.
    held: u64,
    /// The element size and L7-ness of the match object field whose value comes next.
    field: (usize, bool),
    /// Whether the match object being walked sets an L7 attribute.
    match_l7: bool,
    /// A limit broken (the walk stops at once).
    broken: Option<ShapeError>,
}

/// The bytes of one entry of a match object's field `name`, and whether it is an L7
/// attribute (held in the match object's box). A field the model does not have is
/// refused once decoded; until then it is charged the most.
fn field(name: &str) -> (usize, bool) {
    match name {
        "namespaces" | "notNamespaces" | "principals" | "notPrincipals" => {
            (size_of::<StringMatch>(), false)
        }
        "serviceAccounts" | "notServiceAccounts" => (size_of::<ServiceAccountMatch>(), false),
        "sourceIps" | "notSourceIps" | "destinationIps" | "notDestinationIps" => {
            (size_of::<IpNet>(), false)
        }
        "destinationPorts" | "notDestinationPorts" => (size_of::<u16>(), false),
        "paths" | "notPaths" => (size_of::<PathMatch>(), true),
        "methods"
        | "notMethods"
        | "hosts"
        | "notHosts"
        | "requestPrincipals"
        | "notRequestPrincipals" => (size_of::<StringMatch>(), true),
        "headers" | "notHeaders" => (size_of::<HeaderMatch>(), true),
        "remoteIps" | "notRemoteIps" => (size_of::<IpBlock>(), true),
        "when" => (size_of::<Condition>(), true),
        _ => (VALUE, true),
    }
}

/// The bytes of one value of a condition's `values` or `notValues`.
const CONDITION_VALUE: usize = max(&[
    size_of::<StringMatch>(),
    size_of::<IpBlock>(),
    size_of::<u16>(),
]);

impl JsonCounts {
    fn estimate(&self) -> u64 {
        self.held + self.l7_matches as u64 * block(size_of::<L7Attributes>())
    }

    fn fail(&mut self, e: ShapeError) -> Stop {
        self.broken = Some(e);
        Stop
    }

    /// The bytes of an entry of a list at `depth`: the model's type there.
    fn entry_size(&self, depth: usize) -> usize {
        match depth {
            1 => size_of::<Rule>(),
            2 => size_of::<Clause>(),
            3 => size_of::<RbacMatch>(),
            5 => self.field.0,
            7 => CONDITION_VALUE,
            _ => VALUE,
        }
    }

    /// A list at `depth` ended with `n` entries of `size` bytes. Held at its length: the
    /// reader gives back the room pushes left (`Authorization::shrink_to_fit`).
    fn list(&mut self, depth: usize, n: usize, size: usize) {
        if depth >= 4 {
            self.value_lists += 1;
        }
        if n > 0 {
            self.held += block(n * size);
        }
    }

    /// The `n`th entry (from 1) of a list at `depth`.
    fn entry(&mut self, depth: usize, n: usize) -> Result<(), Stop> {
        let (count, limit) = match depth {
            1 => {
                self.rules += 1;
                (self.rules, Limit::RulesPerPolicy)
            }
            2 => {
                self.clauses += 1;
                (n, Limit::ClausesPerRule)
            }
            3 => {
                self.matches += 1;
                (self.matches, Limit::MatchesPerPolicy)
            }
            _ => {
                self.values += 1;
                if n > MAX_VALUES_PER_FIELD {
                    return Err(self.fail(ShapeError::TooMany {
                        field: "rulesJson".into(),
                        limit: Limit::ValuesPerField,
                    }));
                }
                (self.values, Limit::ValuesPerPolicy)
            }
        };
        if count > limit.max() {
            return Err(self.fail(ShapeError::TooMany {
                field: "rulesJson".into(),
                limit,
            }));
        }
        Ok(())
    }

    /// A string at `depth`; `key`: a map's key.
    fn string(&mut self, s: &str, depth: usize, key: bool) -> Result<(), Stop> {
        let len = s.len();
        if len > MAX_STRING_BYTES {
            return Err(self.fail(ShapeError::TooLong {
                field: "rulesJson".into(),
                len,
            }));
        }
        if key && depth == 5 {
            // A match object's field: its name is not held; what it holds is typed by it.
            self.field = field(s);
            self.match_l7 |= self.field.1;
            return Ok(());
        }
        if key && depth != 6 {
            // A struct's field name (a string match's kind, a condition's `values`); only
            // a `headers` map's keys (depth 6) are held, as header names.
            return Ok(());
        }
        let mut held = block(len);
        // A path template: a segment per '/', each a literal at most.
        if s.contains('{') {
            let segments = s.bytes().filter(|b| *b == b'/').count() + 1;
            held += grown(1, segments, size_of::<PathSegment>()) + blocks(segments, len);
        }
        // A claim's path (`request.auth.claims[a][b]`): a string per '['.
        if s.contains('[') {
            let claims = s.bytes().filter(|b| *b == b'[').count();
            held += grown(1, claims, STRING) + blocks(claims, len);
        }
        self.held += held;
        Ok(())
    }
}

/// Walks the rules' JSON, building nothing.
pub(crate) fn walk(json: &[u8]) -> Result<JsonCounts, Rejection> {
    let mut counts = JsonCounts::default();
    let mut de = serde_json::Deserializer::from_slice(json);
    let walked = Walk {
        depth: 1,
        key: false,
        counts: &mut counts,
    }
    .deserialize(&mut de)
    .and_then(|()| de.end());
    if let Some(e) = counts.broken.take() {
        return Err(Rejection::Shape(e));
    }
    walked.map_err(|e| ConvertError::new("rulesJson", format!("not JSON: {e}")))?;
    Ok(counts)
}

/// The error that stops the walk once [`JsonCounts::broken`] is set.
#[derive(Clone, Copy)]
struct Stop;

impl Stop {
    fn to_error<E: de::Error>(self) -> E {
        E::custom("a limit is broken")
    }
}

/// One value of the rules' JSON at `depth` (1 for the whole).
struct Walk<'c> {
    depth: usize,
    /// A map's key.
    key: bool,
    counts: &'c mut JsonCounts,
}

impl<'de> DeserializeSeed<'de> for Walk<'_> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl Walk<'_> {
    fn deeper(&mut self) -> Walk<'_> {
        Walk {
            depth: self.depth + 1,
            key: false,
            counts: self.counts,
        }
    }

    fn key(&mut self) -> Walk<'_> {
        Walk {
            depth: self.depth + 1,
            key: true,
            counts: self.counts,
        }
    }

    fn enter<E: de::Error>(&mut self) -> Result<(), E> {
        if self.depth > MAX_JSON_DEPTH {
            let limit = Limit::Other {
                max: MAX_JSON_DEPTH,
                what: "levels of nesting in the rules' JSON",
            };
            return Err(self
                .counts
                .fail(ShapeError::TooMany {
                    field: "rulesJson".into(),
                    limit,
                })
                .to_error());
        }
        Ok(())
    }
}

impl<'de> Visitor<'de> for Walk<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the rules' JSON")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<(), E> {
        self.counts
            .string(s, self.depth, self.key)
            .map_err(Stop::to_error)
    }

    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
        self.enter()?;
        let depth = self.depth;
        let size = self.counts.entry_size(depth);
        let mut n = 0;
        while seq.next_element_seed(self.deeper())?.is_some() {
            n += 1;
            self.counts.entry(depth, n).map_err(Stop::to_error)?;
        }
        self.counts.list(depth, n, size);
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
        self.enter()?;
        let depth = self.depth;
        // A map of a match object's field (`headers`) becomes a list; other maps (a
        // match object, a string match, a condition) are structs.
        let list = depth == 5;
        let size = self.counts.entry_size(depth);
        if depth == 4 {
            self.counts.match_l7 = false;
        }
        let mut n = 0;
        while map.next_key_seed(self.key())?.is_some() {
            map.next_value_seed(self.deeper())?;
            n += 1;
            if list {
                self.counts.entry(depth, n).map_err(Stop::to_error)?;
            }
        }
        if list {
            self.counts.list(depth, n, size);
        }
        if depth == 4 && self.counts.match_l7 {
            self.counts.l7_matches += 1;
        }
        Ok(())
    }
}
