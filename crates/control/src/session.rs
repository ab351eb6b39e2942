//! The delta xDS server side of one client stream, sans-IO: given the client's requests and
//! the current [`Snapshot`], it says which responses to send.
//!
//! What the session believes the client holds (`known`: name → version) starts from the
//! client's `initial_resource_versions` and is updated when a response is produced (as
//! istiod does: a NACKed resource is not resent until it changes, otherwise a client that
//! rejects it would be sent it forever). A response is always sent for the first request
//! of a type, even an empty one, because ztunnel's readiness waits for one of each type.
//!
//! Only the types a client asks for are ever sent to it: a ztunnel asks for the two Istio
//! types and never hears of `ambit.waypoint.v1.AuthorizationPolicy`, which ambit's
//! waypoints ask for. Unknown type URLs are ignored (no response; counted and listed in
//! the debug view): an empty answer to a type we do not serve would claim "you have
//! everything" for something we know nothing about.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use ambit_proto::{DeltaDiscoveryRequest, DeltaDiscoveryResponse, Resource};
use prost::Message;
use serde::Serialize;

/// The type URLs this server answers.
pub const SERVED_TYPES: [&str; 6] = [
    ambit_proto::ADDRESS_TYPE,
    ambit_proto::AUTHORIZATION_TYPE,
    ambit_proto::WAYPOINT_POLICY_TYPE,
    ambit_proto::WAYPOINT_ROUTE_TYPE,
    ambit_proto::WAYPOINT_AUTHN_TYPE,
    ambit_proto::WAYPOINT_DESTINATION_RULE_TYPE,
];

/// The resources of one type, by name.
pub type TypeResources = BTreeMap<String, Arc<Resource>>;

/// Everything the server serves at one moment. Resources are shared between all sessions.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// Bumped on every change; sent as `system_version_info`.
    pub generation: u64,
    types: BTreeMap<&'static str, TypeResources>,
    /// What differs from the snapshot before it (computed once for every session), so a
    /// session in step with that one looks only at these names.
    changes: Option<Changes>,
    /// Address resources' aliases (`<network>/<ip>` of a workload or a service VIP →
    /// resource name), for clients that subscribe by address (on-demand ztunnels).
    aliases: BTreeMap<String, String>,
    /// Address resource name → names a client subscribed to it also needs (a service's
    /// endpoint workloads, a workload's or service's waypoint, by name or alias).
    dependents: BTreeMap<String, Vec<String>>,
}

/// The names whose resource was added, changed or removed since generation `since`.
#[derive(Debug, Clone, Default)]
struct Changes {
    since: u64,
    names: BTreeMap<&'static str, Vec<String>>,
}

impl Snapshot {
    /// An empty snapshot of the served types.
    pub fn new(generation: u64) -> Self {
        Snapshot {
            generation,
            types: SERVED_TYPES
                .iter()
                .map(|t| (*t, TypeResources::new()))
                .collect(),
            changes: None,
            aliases: BTreeMap::new(),
            dependents: BTreeMap::new(),
        }
    }

    /// Records that the Address resource `name` also answers to `alias`
    /// (`<network>/<ip>`); the first resource given an alias keeps it.
    pub fn insert_alias(&mut self, alias: String, name: &str) {
        self.aliases
            .entry(alias)
            .or_insert_with(|| name.to_string());
    }

    /// Records that a client subscribed to the Address resource `name` also needs
    /// `dependent` (a resource name or an alias).
    pub fn insert_dependent(&mut self, name: &str, dependent: String) {
        self.dependents
            .entry(name.to_string())
            .or_default()
            .push(dependent);
    }

    /// The resource name an Address name or alias resolves to.
    pub fn resolve(&self, type_url: &str, name: &str) -> Option<&str> {
        let resources = self.types.get(type_url)?;
        if let Some((k, _)) = resources.get_key_value(name) {
            return Some(k.as_str());
        }
        if type_url != ambit_proto::ADDRESS_TYPE {
            return None;
        }
        let real = self.aliases.get(name)?;
        resources.contains_key(real).then_some(real.as_str())
    }

    /// The resources a client subscribed to `explicit` names of `type_url` follows: what
    /// each name (or alias) resolves to, and their dependents, transitively, at most
    /// `max` names; with the aliases it subscribed to per resource, and how many names
    /// were looked at ([`Snapshot::follow_more`]).
    fn follow(
        &self,
        type_url: &str,
        explicit: &BTreeSet<String>,
        max: usize,
    ) -> (BTreeSet<String>, BTreeMap<String, Vec<String>>, u64) {
        let mut followed = BTreeSet::new();
        let mut alias_of = BTreeMap::new();
        let names = explicit.iter().map(String::as_str);
        let examined = self.follow_more(type_url, names, &mut followed, &mut alias_of, max);
        (followed, alias_of, examined)
    }

    /// Adds to `followed` (at most `max` names in all) and `alias_of` what `names` follow,
    /// as [`Snapshot::follow`] does for all of them: the work is in proportion to
    /// `names` and what they bring, not to what was followed before. Returns how many
    /// names it looked at (each name given, each one reached).
    fn follow_more<'n>(
        &self,
        type_url: &str,
        names: impl IntoIterator<Item = &'n str>,
        followed: &mut BTreeSet<String>,
        alias_of: &mut BTreeMap<String, Vec<String>>,
        max: usize,
    ) -> u64 {
        let mut examined = 0;
        let mut stack: Vec<&str> = Vec::new();
        for name in names {
            examined += 1;
            if let Some(real) = self.resolve(type_url, name) {
                if real != name {
                    // Kept sorted, as a full pass over the (sorted) names gives them.
                    let aliases = alias_of.entry(real.to_string()).or_default();
                    if let Err(at) = aliases.binary_search_by(|a| a.as_str().cmp(name)) {
                        aliases.insert(at, name.to_string());
                    }
                }
                stack.push(real);
            }
        }
        while let Some(name) = stack.pop() {
            examined += 1;
            if followed.len() >= max {
                break;
            }
            if !followed.insert(name.to_string()) || type_url != ambit_proto::ADDRESS_TYPE {
                continue;
            }
            for d in self.dependents.get(name).into_iter().flatten() {
                if let Some(real) = self.resolve(type_url, d) {
                    stack.push(real);
                }
            }
        }
        examined
    }

    /// This snapshot without a list of changes: every session compares everything (what
    /// a client may be shown changed, not only the resources).
    pub fn without_changes(mut self) -> Snapshot {
        self.changes = None;
        self
    }

    /// This snapshot with the list of what differs from `previous`, the snapshot it
    /// replaces: one pass over the resources here, instead of one per connected client.
    pub fn with_changes_from(mut self, previous: &Snapshot) -> Snapshot {
        let mut names = BTreeMap::new();
        for (type_url, now) in &self.types {
            let before = previous.types.get(type_url);
            let mut differ: Vec<String> = now
                .iter()
                .filter(|(name, res)| {
                    before.and_then(|b| b.get(*name)).map(|r| &r.version) != Some(&res.version)
                })
                .map(|(name, _)| name.clone())
                .collect();
            if let Some(before) = before {
                differ.extend(before.keys().filter(|n| !now.contains_key(*n)).cloned());
            }
            names.insert(*type_url, differ);
        }
        if self.aliases != previous.aliases || self.dependents != previous.dependents {
            // Who follows what may have changed beyond the names that changed.
            self.changes = None;
            return self;
        }
        self.changes = Some(Changes {
            since: previous.generation,
            names,
        });
        self
    }

    /// [`Snapshot::insert`] of a resource shared with whoever built it.
    pub fn insert_shared(&mut self, type_url: &str, resource: Arc<Resource>) {
        if let Some(map) = self.types.get_mut(type_url) {
            map.insert(resource.name.clone(), resource);
        }
    }

    /// Adds (or replaces) a resource of a served type; other types are ignored.
    pub fn insert(&mut self, type_url: &str, resource: Resource) {
        if let Some(map) = self.types.get_mut(type_url) {
            map.insert(resource.name.clone(), Arc::new(resource));
        }
    }

    /// The resources of `type_url` (`None` for a type not served).
    pub fn resources(&self, type_url: &str) -> Option<&TypeResources> {
        self.types.get(type_url)
    }

    /// Number of resources of all types.
    pub fn len(&self) -> usize {
        self.types.values().map(|m| m.len()).sum()
    }

    /// True when no resource of any type is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Bounds on what one client can make the server hold or send in one message.
#[derive(Debug, Clone, Copy)]
pub struct SessionLimits {
    /// Names one type may subscribe to explicitly, or report in `initial_resource_versions`.
    pub max_names_per_type: usize,
    /// Bytes of one resource name (or version) a client may send. Istio's names are
    /// Kubernetes names, hostnames and addresses: a few hundred bytes at most.
    pub max_name_bytes: usize,
    /// Bytes of the names (and reported versions) one type may subscribe to or report in
    /// all: the count alone would let 100,000 long names pin hundreds of MiB.
    pub max_name_bytes_per_type: usize,
    /// A response is split so that the resources in one stay under this many bytes.
    pub max_response_bytes: usize,
    /// Responses awaiting an ACK/NACK that are remembered per type; older ones are forgotten.
    pub max_outstanding: usize,
    /// NACK messages kept per type (the newest).
    pub max_nacks_kept: usize,
    /// Bytes of a NACK message kept.
    pub max_nack_message: usize,
    /// Bytes of the node id kept.
    pub max_node_id: usize,
    /// Distinct unknown type URLs remembered.
    pub max_unknown_types: usize,
}

impl Default for SessionLimits {
    fn default() -> Self {
        SessionLimits {
            max_names_per_type: 100_000,
            max_name_bytes: 1024,
            max_name_bytes_per_type: 8 * 1024 * 1024,
            max_response_bytes: 16 * 1024 * 1024,
            max_outstanding: 16,
            max_nacks_kept: 8,
            max_nack_message: 4096,
            max_node_id: 1024,
            max_unknown_types: 8,
        }
    }
}

/// A request the session refuses; the stream should be closed with INVALID_ARGUMENT.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SessionError {
    /// The client's fault: every delta request names its type.
    #[error("a DeltaDiscoveryRequest without type_url (the client must name the resource type)")]
    NoTypeUrl,
    /// The client's fault: it asked for more names than the server keeps per client.
    #[error("{type_url}: the client subscribes to or reports more than {limit} resource names")]
    TooManyNames { type_url: String, limit: usize },
    /// The client's fault: a name (or version) longer than any real one.
    #[error("{type_url}: a resource name or version of {len} bytes (at most {limit})")]
    NameTooLong {
        type_url: String,
        len: usize,
        limit: usize,
    },
    /// The client's fault: its names of one type add up to more than the server keeps.
    #[error("{type_url}: the client's resource names add up to more than {limit} bytes")]
    TooManyNameBytes { type_url: String, limit: usize },
}

impl SessionError {
    /// A short label for the `ambit_control_xds_requests_refused` metric.
    pub fn reason(&self) -> &'static str {
        match self {
            SessionError::NoTypeUrl => "no_type_url",
            SessionError::TooManyNames { .. } => "too_many_names",
            SessionError::NameTooLong { .. } => "name_too_long",
            SessionError::TooManyNameBytes { .. } => "too_many_name_bytes",
        }
    }
}

/// What the last response of a type got from the client.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "state")]
pub enum AckState {
    /// Nothing sent yet, or the newest response is not answered yet.
    Pending,
    Acked {
        nonce: String,
    },
    Nacked {
        nonce: String,
        message: String,
    },
}

/// A NACK as the client sent it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NackRecord {
    pub nonce: String,
    pub message: String,
}

/// The outcome of one request or snapshot change.
#[derive(Debug, Default)]
pub struct Step {
    /// To send, in order.
    pub responses: Vec<DeltaDiscoveryResponse>,
    /// The request ACKed a response.
    pub acked: bool,
    /// The request NACKed a response.
    pub nacked: bool,
    /// The request's nonce matched no remembered response (late or bogus); it was ignored.
    pub stale_nonce: bool,
    /// The request was for a type this server does not serve; it was ignored.
    pub unknown_type: bool,
    /// Names the request newly subscribed to by name (not `*`): asked for in
    /// `resource_names_subscribe`, or reported in a first request's
    /// `initial_resource_versions` (the `ambit_control_xds_names_subscribed` metric).
    pub subscribed: u64,
}

#[derive(Debug, Default)]
struct TypeState {
    wildcard: bool,
    /// The names subscribed to (resource names or aliases).
    explicit: BTreeSet<String>,
    /// The resources those names resolve to, with their dependents
    /// ([`Snapshot::follow`]); recomputed whenever the names or the snapshot change.
    followed: BTreeSet<String>,
    /// Resource name → the aliases subscribed that resolve to it (sent in `aliases`).
    alias_of: BTreeMap<String, Vec<String>>,
    /// Bytes of the names in `explicit`.
    explicit_bytes: usize,
    /// What the client holds, as far as we know: name → version.
    known: BTreeMap<String, String>,
    /// Explicitly subscribed names to answer with a removal if they do not exist.
    absent_to_report: BTreeSet<String>,
    outstanding: VecDeque<String>,
    last_nonce: Option<String>,
    state: Option<AckState>,
    nacks: VecDeque<NackRecord>,
    acks_total: u64,
    nacks_total: u64,
    responses_total: u64,
    /// The snapshot generation `known` was last brought in step with (all of it).
    synced: Option<u64>,
    /// Names looked at for this type since [`Session::take_names_examined`] last asked.
    examined: u64,
}

impl TypeState {
    fn interested(&self, name: &str) -> bool {
        self.wildcard || self.followed.contains(name)
    }

    /// Recomputes what the explicit names follow in `snapshot`; true if it changed.
    fn refollow(&mut self, type_url: &str, snapshot: &Snapshot, max: usize) -> bool {
        if self.wildcard {
            let changed = !self.followed.is_empty();
            self.followed.clear();
            self.alias_of.clear();
            return changed;
        }
        let (followed, alias_of, examined) = snapshot.follow(type_url, &self.explicit, max);
        self.examined += examined;
        let changed = followed != self.followed || alias_of != self.alias_of;
        self.followed = followed;
        self.alias_of = alias_of;
        changed
    }

    /// Adds what `added` (names just subscribed) follow in `snapshot`, which what is
    /// followed is in step with: a request costs in proportion to what it asks, not to
    /// every name asked before (a client sending names one at a time would otherwise
    /// make the server's work grow with the square of its names).
    fn follow_added(&mut self, type_url: &str, snapshot: &Snapshot, added: &[String], max: usize) {
        if self.wildcard {
            return;
        }
        let names = added.iter().map(String::as_str);
        self.examined +=
            snapshot.follow_more(type_url, names, &mut self.followed, &mut self.alias_of, max);
    }
}

/// What one client may be shown, asked per resource: a waypoint is shown only the objects
/// that target it. The answers may change; a snapshot published without its list of
/// changes makes every session compare everything again.
pub trait View: Send + Sync + std::fmt::Debug {
    fn shows(&self, type_url: &str, name: &str) -> bool;
}

/// One client stream.
#[derive(Debug)]
pub struct Session {
    id: u64,
    /// What this client may be shown (everything when none).
    view: Option<Arc<dyn View>>,
    node_id: Option<String>,
    next_nonce: u64,
    limits: SessionLimits,
    types: BTreeMap<String, TypeState>,
    unknown_types: BTreeSet<String>,
    /// The most names the session has held subscribed of one type, at any moment (the
    /// cap's high-water mark, kept on every name added).
    most_names: usize,
}

impl Session {
    /// A session; `id` is unique per server run and prefixes its nonces.
    pub fn new(id: u64, limits: SessionLimits) -> Self {
        Session {
            id,
            view: None,
            node_id: None,
            next_nonce: 0,
            limits,
            types: BTreeMap::new(),
            unknown_types: BTreeSet::new(),
            most_names: 0,
        }
    }

    /// The most names this session has held subscribed of one type, at any moment, even
    /// within a request it then refused.
    /// Shows this client only what `view` shows it.
    pub fn set_view(&mut self, view: Arc<dyn View>) {
        self.view = Some(view);
    }

    pub fn most_names(&self) -> usize {
        self.most_names
    }

    /// The names looked at, since the last call, to work out what the client follows and
    /// what to send it: work that grows with what the client asks and what changes, so
    /// that a cost in the square of its names shows as a count.
    pub fn take_names_examined(&mut self) -> u64 {
        self.types
            .values_mut()
            .map(|ts| std::mem::take(&mut ts.examined))
            .sum()
    }

    /// The node id from the client's first request that carried one.
    pub fn node_id(&self) -> Option<&str> {
        self.node_id.as_deref()
    }

    /// Handles one request from the client.
    pub fn on_request(
        &mut self,
        req: DeltaDiscoveryRequest,
        snapshot: &Snapshot,
    ) -> Result<Step, SessionError> {
        if req.type_url.is_empty() {
            return Err(SessionError::NoTypeUrl);
        }
        if self.node_id.is_none() {
            if let Some(node) = &req.node {
                if !node.id.is_empty() {
                    self.node_id = Some(truncate(&node.id, self.limits.max_node_id));
                }
            }
        }
        let mut step = Step::default();
        if snapshot.resources(&req.type_url).is_none() {
            if self.unknown_types.len() < self.limits.max_unknown_types {
                self.unknown_types
                    .insert(truncate(&req.type_url, self.limits.max_node_id));
            }
            step.unknown_type = true;
            return Ok(step);
        }
        let limits = self.limits;
        let max_names = limits.max_names_per_type;
        let too_many = || SessionError::TooManyNames {
            type_url: req.type_url.clone(),
            limit: max_names,
        };
        let too_many_bytes = || SessionError::TooManyNameBytes {
            type_url: req.type_url.clone(),
            limit: limits.max_name_bytes_per_type,
        };
        // Every name's length is checked before any is kept.
        let sent = req
            .resource_names_subscribe
            .iter()
            .chain(&req.resource_names_unsubscribe)
            .chain(req.initial_resource_versions.keys())
            .chain(req.initial_resource_versions.values());
        let mut reported_bytes = 0usize;
        for name in sent {
            if name.len() > limits.max_name_bytes {
                return Err(SessionError::NameTooLong {
                    type_url: req.type_url.clone(),
                    len: name.len(),
                    limit: limits.max_name_bytes,
                });
            }
        }
        for (name, version) in &req.initial_resource_versions {
            reported_bytes += name.len() + version.len();
        }
        let first = !self.types.contains_key(&req.type_url);
        let ts = self.types.entry(req.type_url.clone()).or_default();

        if !req.response_nonce.is_empty() {
            match ts.outstanding.iter().position(|n| *n == req.response_nonce) {
                Some(pos) => {
                    // Answers to older responses will not come any more.
                    ts.outstanding.drain(..=pos);
                    let nonce = req.response_nonce.clone();
                    // The state shown is the newest response's; an answer to an older one
                    // is counted (and a NACK kept) but leaves it pending.
                    let newest = ts.last_nonce.as_deref() == Some(nonce.as_str());
                    match &req.error_detail {
                        Some(status) => {
                            let message = truncate(&status.message, limits.max_nack_message);
                            if ts.nacks.len() >= limits.max_nacks_kept {
                                ts.nacks.pop_front();
                            }
                            ts.nacks.push_back(NackRecord {
                                nonce: nonce.clone(),
                                message: message.clone(),
                            });
                            ts.nacks_total += 1;
                            if newest {
                                ts.state = Some(AckState::Nacked { nonce, message });
                            }
                            step.nacked = true;
                        }
                        None => {
                            ts.acks_total += 1;
                            if newest {
                                ts.state = Some(AckState::Acked { nonce });
                            }
                            step.acked = true;
                        }
                    }
                }
                None => step.stale_nonce = true,
            }
        }

        let mut changed = false;
        if first {
            // An empty subscribe list on the first request means "everything" (wildcard).
            ts.wildcard = req.resource_names_subscribe.is_empty();
            if req.initial_resource_versions.len() > max_names {
                return Err(too_many());
            }
            if reported_bytes > limits.max_name_bytes_per_type {
                return Err(too_many_bytes());
            }
            for (name, version) in &req.initial_resource_versions {
                // An empty version: asked for on demand, not received yet (ztunnel).
                if !version.is_empty() {
                    ts.known.insert(name.clone(), version.clone());
                }
                if !ts.wildcard && ts.explicit.insert(name.clone()) {
                    // A client holding (or waiting for) a resource wants to hear about it.
                    self.most_names = self.most_names.max(ts.explicit.len());
                    ts.explicit_bytes += name.len();
                    step.subscribed += 1;
                    if version.is_empty() {
                        ts.absent_to_report.insert(name.clone());
                    }
                }
            }
            changed = true;
        }
        // What is followed is worked out again from every name only when needed (a new
        // stream, a wildcard change, a name unsubscribed that brought something, another
        // snapshot); names only added are followed on their own.
        let mut refollow_all = first || ts.synced != Some(snapshot.generation);
        let mut added = Vec::new();
        for name in &req.resource_names_subscribe {
            if name == "*" {
                refollow_all |= !ts.wildcard;
                changed |= !ts.wildcard;
                ts.wildcard = true;
            } else if !ts.explicit.contains(name) {
                // Checked before it is kept: the session never holds more than the caps
                // (it stays listed in /debug until its stream is gone).
                if ts.explicit.len() >= max_names {
                    return Err(too_many());
                }
                if ts.explicit_bytes + name.len() > limits.max_name_bytes_per_type {
                    return Err(too_many_bytes());
                }
                ts.explicit.insert(name.clone());
                self.most_names = self.most_names.max(ts.explicit.len());
                added.push(name.clone());
                ts.explicit_bytes += name.len();
                step.subscribed += 1;
                ts.absent_to_report.insert(name.clone());
                // Asked for: answered even if the client holds it already (under
                // another name), so that the answer carries the name it asked by.
                if let Some(real) = snapshot.resolve(&req.type_url, name) {
                    ts.known.remove(real);
                }
                changed = true;
            }
        }
        // A resource the client held that nothing it follows brings any more is answered
        // with its removal, also when the client unsubscribed it by name: after a reconnect
        // it reported (and so subscribed to) what it held under the resources' own names,
        // and unsubscribing those must not leave what it no longer follows behind, stale.
        // (A client that dropped it already ignores the removal.)
        for name in &req.resource_names_unsubscribe {
            if name == "*" {
                refollow_all |= ts.wildcard;
                changed |= ts.wildcard;
                ts.wildcard = false;
            } else if ts.explicit.remove(name) {
                ts.explicit_bytes -= name.len();
                ts.absent_to_report.remove(name);
                refollow_all |= snapshot.resolve(&req.type_url, name).is_some();
                changed = true;
            }
        }
        if changed {
            let max_followed = max_names.saturating_mul(4);
            if refollow_all {
                ts.refollow(&req.type_url, snapshot, max_followed);
            } else {
                ts.follow_added(&req.type_url, snapshot, &added, max_followed);
            }
            let responses = self.delta(&req.type_url, snapshot, first);
            step.responses = responses;
        }
        Ok(step)
    }

    /// Handles a new snapshot: the changes of every subscribed type.
    pub fn on_snapshot(&mut self, snapshot: &Snapshot) -> Vec<DeltaDiscoveryResponse> {
        let subscribed: Vec<String> = self.types.keys().cloned().collect();
        let max_followed = self.limits.max_names_per_type.saturating_mul(4);
        let mut out = Vec::new();
        for type_url in subscribed {
            if snapshot.resources(&type_url).is_none() {
                continue;
            }
            let Some(ts) = self.types.get_mut(&type_url) else {
                continue;
            };
            // What the client follows may change with the mesh (a new endpoint of a
            // service it follows, an alias now naming another workload).
            let refollowed = ts.refollow(&type_url, snapshot, max_followed);
            // In step with the snapshot this one replaces: only the names that changed
            // can need sending. Otherwise (a skipped generation) compare everything.
            let changed = snapshot.changes.as_ref().and_then(|c| {
                let in_step = !refollowed && ts.synced == Some(c.since);
                in_step.then(|| c.names.get(type_url.as_str())).flatten()
            });
            out.extend(match changed {
                Some(names) => self.delta_of(&type_url, snapshot, names),
                None => self.delta(&type_url, snapshot, false),
            });
        }
        out
    }

    /// Responses bringing the client of `type_url` to `snapshot`; at least one when
    /// `always`.
    fn delta(
        &mut self,
        type_url: &str,
        snapshot: &Snapshot,
        always: bool,
    ) -> Vec<DeltaDiscoveryResponse> {
        let (Some(ts), Some(resources)) = (self.types.get(type_url), snapshot.resources(type_url))
        else {
            return Vec::new();
        };
        // Every resource (wildcard) or every one followed, then every one the client holds.
        let scanned = if ts.wildcard {
            resources.len()
        } else {
            ts.followed.len()
        } + ts.known.len();
        let shown = |name: &str| self.view.as_ref().is_none_or(|v| v.shows(type_url, name));
        let mut changed: Vec<Arc<Resource>> = Vec::new();
        if ts.wildcard {
            for (name, res) in resources {
                if ts.known.get(name) != Some(&res.version) && shown(name) {
                    changed.push(res.clone());
                }
            }
        } else {
            for name in &ts.followed {
                if let Some(res) = resources.get(name) {
                    if ts.known.get(name) != Some(&res.version) && shown(name) {
                        changed.push(res.clone());
                    }
                }
            }
        }
        // Gone, no longer followed (a client removes what it no longer gets news of), or
        // no longer shown.
        let removed: Vec<String> = ts
            .known
            .keys()
            .filter(|n| !resources.contains_key(*n) || !ts.interested(n) || !shown(n))
            .cloned()
            .collect();
        self.respond(type_url, snapshot, changed, removed, always, scanned as u64)
    }

    /// Like [`Session::delta`] when only `names` can differ from what the client holds.
    fn delta_of(
        &mut self,
        type_url: &str,
        snapshot: &Snapshot,
        names: &[String],
    ) -> Vec<DeltaDiscoveryResponse> {
        let (Some(ts), Some(resources)) = (self.types.get(type_url), snapshot.resources(type_url))
        else {
            return Vec::new();
        };
        let shown = |name: &str| self.view.as_ref().is_none_or(|v| v.shows(type_url, name));
        let mut changed = Vec::new();
        let mut removed = Vec::new();
        for name in names {
            match resources.get(name) {
                Some(_) if !shown(name) && ts.known.contains_key(name) => {
                    removed.push(name.clone())
                }
                Some(res)
                    if ts.interested(name)
                        && shown(name)
                        && ts.known.get(name) != Some(&res.version) =>
                {
                    changed.push(res.clone())
                }
                Some(_) => {}
                None if ts.known.contains_key(name) => removed.push(name.clone()),
                None => {}
            }
        }
        self.respond(
            type_url,
            snapshot,
            changed,
            removed,
            false,
            names.len() as u64,
        )
    }

    /// Records what is sent and builds the responses (at least one when `always`);
    /// `scanned` is the names the caller looked at to find them.
    fn respond(
        &mut self,
        type_url: &str,
        snapshot: &Snapshot,
        changed: Vec<Arc<Resource>>,
        mut removed: Vec<String>,
        always: bool,
        scanned: u64,
    ) -> Vec<DeltaDiscoveryResponse> {
        let limits = self.limits;
        let generation = snapshot.generation;
        let Some(ts) = self.types.get_mut(type_url) else {
            return Vec::new();
        };
        ts.synced = Some(generation);
        ts.examined += scanned + ts.absent_to_report.len() as u64;
        for name in std::mem::take(&mut ts.absent_to_report) {
            if snapshot.resolve(type_url, &name).is_none() && !ts.known.contains_key(&name) {
                removed.push(name);
            }
        }
        if changed.is_empty() && removed.is_empty() && !always {
            return Vec::new();
        }
        for res in &changed {
            ts.known.insert(res.name.clone(), res.version.clone());
        }
        for name in &removed {
            ts.known.remove(name);
        }
        // A resource asked for by an alias carries it, so the client knows it answered.
        let changed: Vec<Arc<Resource>> = changed
            .into_iter()
            .map(|res| match ts.alias_of.get(&res.name) {
                Some(aliases) => {
                    let mut r = (*res).clone();
                    r.aliases = aliases.clone();
                    Arc::new(r)
                }
                None => res,
            })
            .collect();

        // Split the resources so that no response grows past the byte bound.
        let mut batches: Vec<Vec<Resource>> = vec![Vec::new()];
        let mut size = 0usize;
        for res in changed {
            let len = res.encoded_len();
            let current = batches.last().map_or(0, Vec::len);
            if current > 0 && size + len > limits.max_response_bytes {
                batches.push(Vec::new());
                size = 0;
            }
            size += len;
            if let Some(b) = batches.last_mut() {
                b.push((*res).clone());
            }
        }
        let last = batches.len() - 1;
        let mut out = Vec::with_capacity(batches.len());
        for (i, batch) in batches.into_iter().enumerate() {
            let nonce = format!("{:x}-{}", self.id, self.next_nonce);
            self.next_nonce += 1;
            if ts.outstanding.len() >= limits.max_outstanding {
                ts.outstanding.pop_front();
            }
            ts.outstanding.push_back(nonce.clone());
            ts.last_nonce = Some(nonce.clone());
            ts.state = Some(AckState::Pending);
            ts.responses_total += 1;
            out.push(DeltaDiscoveryResponse {
                system_version_info: generation.to_string(),
                resources: batch,
                type_url: type_url.to_string(),
                removed_resources: if i == last {
                    std::mem::take(&mut removed)
                } else {
                    Vec::new()
                },
                nonce,
            });
        }
        out
    }

    /// What `/debug` shows for this client; at most `max_versions` versions per type.
    pub fn debug(&self, max_versions: usize) -> SessionDebug {
        SessionDebug {
            id: self.id,
            node_id: self.node_id.clone(),
            types: self
                .types
                .iter()
                .map(|(url, ts)| {
                    (
                        url.clone(),
                        TypeDebug {
                            wildcard: ts.wildcard,
                            explicit_subscriptions: ts.explicit.len(),
                            resources_sent: ts.known.len(),
                            versions: ts
                                .known
                                .iter()
                                .take(max_versions)
                                .map(|(k, v)| (k.clone(), v.clone()))
                                .collect(),
                            last_nonce: ts.last_nonce.clone(),
                            ack: ts.state.clone().unwrap_or(AckState::Pending),
                            nacks: ts.nacks.iter().cloned().collect(),
                            responses: ts.responses_total,
                            acks: ts.acks_total,
                            nacks_total: ts.nacks_total,
                        },
                    )
                })
                .collect(),
            unknown_types: self.unknown_types.iter().cloned().collect(),
        }
    }
}

/// `/debug`'s view of one client.
#[derive(Debug, Clone, Serialize)]
pub struct SessionDebug {
    pub id: u64,
    pub node_id: Option<String>,
    /// Per type URL.
    pub types: BTreeMap<String, TypeDebug>,
    /// Type URLs the client asked for that are not served (ignored).
    pub unknown_types: Vec<String>,
}

/// `/debug`'s view of one type of one client.
#[derive(Debug, Clone, Serialize)]
pub struct TypeDebug {
    pub wildcard: bool,
    pub explicit_subscriptions: usize,
    /// How many resources the client holds, as far as the server knows.
    pub resources_sent: usize,
    /// name → version the client holds (capped).
    pub versions: BTreeMap<String, String>,
    pub last_nonce: Option<String>,
    pub ack: AckState,
    /// The newest NACKs, oldest first.
    pub nacks: Vec<NackRecord>,
    pub responses: u64,
    pub acks: u64,
    pub nacks_total: u64,
}

/// The first `max` bytes of `s`, cut at a character boundary.
fn truncate(s: &str, max: usize) -> String {
    s[..s.floor_char_boundary(max)].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ambit_proto::{Node, Status, ADDRESS_TYPE, AUTHORIZATION_TYPE};

    fn res(name: &str, version: &str) -> Resource {
        Resource {
            name: name.into(),
            version: version.into(),
            resource: Some(prost_types::Any {
                type_url: ADDRESS_TYPE.into(),
                value: name.as_bytes().to_vec(),
            }),
            ..Default::default()
        }
    }

    fn snap(generation: u64, addresses: &[(&str, &str)], policies: &[(&str, &str)]) -> Snapshot {
        let mut s = Snapshot::new(generation);
        for (n, v) in addresses {
            s.insert(ADDRESS_TYPE, res(n, v));
        }
        for (n, v) in policies {
            s.insert(AUTHORIZATION_TYPE, res(n, v));
        }
        s
    }

    fn initial(type_url: &str, versions: &[(&str, &str)]) -> DeltaDiscoveryRequest {
        DeltaDiscoveryRequest {
            node: Some(Node {
                id: "ztunnel~10.0.0.1~zt.istio-system~istio-system.svc.cluster.local".into(),
                ..Default::default()
            }),
            type_url: type_url.into(),
            initial_resource_versions: versions
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        }
    }

    fn ack(type_url: &str, nonce: &str) -> DeltaDiscoveryRequest {
        DeltaDiscoveryRequest {
            type_url: type_url.into(),
            response_nonce: nonce.into(),
            ..Default::default()
        }
    }

    fn nack(type_url: &str, nonce: &str, message: &str) -> DeltaDiscoveryRequest {
        DeltaDiscoveryRequest {
            error_detail: Some(Status {
                code: 0,
                message: message.into(),
                details: vec![],
            }),
            ..ack(type_url, nonce)
        }
    }

    fn names(r: &DeltaDiscoveryResponse) -> Vec<&str> {
        r.resources.iter().map(|r| r.name.as_str()).collect()
    }

    fn session() -> Session {
        Session::new(7, SessionLimits::default())
    }

    #[test]
    fn first_request_gets_everything_and_the_other_type_an_empty_response() {
        let s = snap(3, &[("a", "1"), ("b", "1")], &[]);
        let mut c = session();
        let step = c.on_request(initial(ADDRESS_TYPE, &[]), &s).unwrap();
        assert_eq!(step.responses.len(), 1);
        let r = &step.responses[0];
        assert_eq!(r.type_url, ADDRESS_TYPE);
        assert_eq!(names(r), ["a", "b"]);
        assert!(r.removed_resources.is_empty());
        assert_eq!(r.system_version_info, "3");
        assert_eq!(r.nonce, "7-0");
        assert_eq!(
            c.node_id(),
            Some("ztunnel~10.0.0.1~zt.istio-system~istio-system.svc.cluster.local")
        );
        // No policy exists, but the client still needs a response to become ready.
        let step = c.on_request(initial(AUTHORIZATION_TYPE, &[]), &s).unwrap();
        assert_eq!(step.responses.len(), 1);
        assert!(step.responses[0].resources.is_empty());
        assert_eq!(step.responses[0].nonce, "7-1");
    }

    /// A view whose answers the test changes.
    #[derive(Debug, Default)]
    struct Hidden(std::sync::Mutex<BTreeSet<String>>);

    impl View for Hidden {
        fn shows(&self, _type_url: &str, name: &str) -> bool {
            !self.0.lock().unwrap().contains(name)
        }
    }

    #[test]
    fn a_client_is_shown_only_what_its_view_shows_as_the_view_changes() {
        let hidden = Arc::new(Hidden::default());
        hidden.0.lock().unwrap().insert("b".into());
        let mut c = session();
        c.set_view(hidden.clone());
        let s1 = snap(1, &[("a", "1"), ("b", "1")], &[]);
        let step = c.on_request(initial(ADDRESS_TYPE, &[]), &s1).unwrap();
        assert_eq!(names(&step.responses[0]), ["a"]);
        c.on_request(ack(ADDRESS_TYPE, &step.responses[0].nonce), &s1)
            .unwrap();
        // The view changes with the resources unchanged: a snapshot without its changes.
        hidden.0.lock().unwrap().remove("b");
        hidden.0.lock().unwrap().insert("a".into());
        let out = c.on_snapshot(&snap(2, &[("a", "1"), ("b", "1")], &[]).without_changes());
        assert_eq!(names(&out[0]), ["b"]);
        assert_eq!(out[0].removed_resources, ["a"]);
        c.on_request(ack(ADDRESS_TYPE, &out[0].nonce), &s1).unwrap();
        // With the changes listed (in step): a hidden resource that changes is not sent, and
        // one the client holds that becomes hidden is removed.
        let s2 = snap(2, &[("a", "1"), ("b", "1")], &[]);
        let s3 = snap(3, &[("a", "2"), ("b", "2")], &[]).with_changes_from(&s2);
        hidden.0.lock().unwrap().insert("b".into());
        let out = c.on_snapshot(&s3);
        assert!(names(&out[0]).is_empty(), "{out:?}");
        assert_eq!(out[0].removed_resources, ["b"]);
        // A reconnecting client holding a hidden resource is told to remove it.
        let mut again = session();
        again.set_view(hidden);
        let step = again
            .on_request(initial(ADDRESS_TYPE, &[("b", "2")]), &s3)
            .unwrap();
        assert!(names(&step.responses[0]).is_empty());
        assert_eq!(step.responses[0].removed_resources, ["b"]);
    }

    #[test]
    fn reconnect_sends_only_what_the_client_lacks_and_removes_what_is_gone() {
        let s = snap(1, &[("same", "1"), ("changed", "2"), ("new", "1")], &[]);
        let mut c = session();
        let step = c
            .on_request(
                initial(
                    ADDRESS_TYPE,
                    &[("same", "1"), ("changed", "1"), ("gone", "1")],
                ),
                &s,
            )
            .unwrap();
        let r = &step.responses[0];
        assert_eq!(names(r), ["changed", "new"]);
        assert_eq!(r.removed_resources, ["gone"]);
    }

    #[test]
    fn reconnect_with_everything_current_still_gets_one_empty_response() {
        let s = snap(1, &[("a", "1")], &[]);
        let mut c = session();
        let step = c
            .on_request(initial(ADDRESS_TYPE, &[("a", "1")]), &s)
            .unwrap();
        assert_eq!(step.responses.len(), 1);
        assert!(step.responses[0].resources.is_empty());
        assert!(step.responses[0].removed_resources.is_empty());
    }

    #[test]
    fn snapshot_changes_are_deltas() {
        let mut c = session();
        let s1 = snap(1, &[("a", "1"), ("b", "1")], &[("p", "1")]);
        c.on_request(initial(ADDRESS_TYPE, &[]), &s1).unwrap();
        c.on_request(initial(AUTHORIZATION_TYPE, &[]), &s1).unwrap();
        // Nothing changed: nothing to send.
        assert!(c
            .on_snapshot(&snap(2, &[("a", "1"), ("b", "1")], &[("p", "1")]))
            .is_empty());
        // a changed, b removed, c added; policies unchanged.
        let out = c.on_snapshot(&snap(3, &[("a", "2"), ("c", "1")], &[("p", "1")]));
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].type_url, ADDRESS_TYPE);
        assert_eq!(names(&out[0]), ["a", "c"]);
        assert_eq!(out[0].removed_resources, ["b"]);
        assert_eq!(out[0].system_version_info, "3");
        // A removal is sent once.
        assert!(c
            .on_snapshot(&snap(4, &[("a", "2"), ("c", "1")], &[("p", "1")]))
            .is_empty());
        // The policy goes away.
        let out = c.on_snapshot(&snap(5, &[("a", "2"), ("c", "1")], &[]));
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].type_url, AUTHORIZATION_TYPE);
        assert_eq!(out[0].removed_resources, ["p"]);
    }

    #[test]
    fn a_session_in_step_gets_the_same_delta_from_the_precomputed_changes() {
        let s1 = snap(1, &[("a", "1"), ("b", "1"), ("c", "1")], &[("p", "1")]);
        let s2 = snap(2, &[("a", "2"), ("c", "1"), ("d", "1")], &[]).with_changes_from(&s1);
        let start = |s: &Snapshot| {
            let mut c = session();
            c.on_request(initial(ADDRESS_TYPE, &[]), s).unwrap();
            c.on_request(initial(AUTHORIZATION_TYPE, &[]), s).unwrap();
            c
        };
        // In step with s1: the changes are used; the delta is what a full compare gives.
        let mut in_step = start(&s1);
        let mut full = start(&s1);
        let plain = snap(2, &[("a", "2"), ("c", "1"), ("d", "1")], &[]);
        let fast = in_step.on_snapshot(&s2);
        let slow = full.on_snapshot(&plain);
        let shape = |out: &[DeltaDiscoveryResponse]| {
            out.iter()
                .map(|r| {
                    (
                        r.type_url.clone(),
                        names(r).join(","),
                        r.removed_resources.join(","),
                    )
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(shape(&fast), shape(&slow));
        // Types in the order the session keeps them (type URL order).
        assert_eq!(
            shape(&fast),
            [
                (
                    AUTHORIZATION_TYPE.to_string(),
                    String::new(),
                    "p".to_string()
                ),
                (ADDRESS_TYPE.to_string(), "a,d".to_string(), "b".to_string()),
            ]
        );
        // Out of step (it last saw generation 0): the changes since 1 are not enough, so
        // everything is compared and nothing is missed.
        let s0 = snap(0, &[("old", "1")], &[]);
        let mut behind = start(&s0);
        let out = behind.on_snapshot(&s2);
        let address = out.iter().find(|r| r.type_url == ADDRESS_TYPE).unwrap();
        assert_eq!(names(address), ["a", "c", "d"]);
        assert_eq!(address.removed_resources, ["old"]);
    }

    #[test]
    fn a_type_never_requested_is_never_pushed() {
        let mut c = session();
        let s = snap(1, &[("a", "1")], &[("p", "1")]);
        c.on_request(initial(ADDRESS_TYPE, &[]), &s).unwrap();
        let out = c.on_snapshot(&snap(2, &[("a", "1")], &[("p", "2")]));
        assert!(out.is_empty());
    }

    /// A ztunnel subscribes to the two Istio types: the waypoints' policies are never
    /// sent to it, at its first request or when they change, while a waypoint that asks
    /// for them gets them (and their removal) like any type.
    #[test]
    fn waypoint_policies_go_only_to_clients_that_ask_for_them() {
        use ambit_proto::WAYPOINT_POLICY_TYPE;
        let with = |generation: u64, policies: &[(&str, &str)]| {
            let mut s = snap(generation, &[("a", "1")], &[("p", "1")]);
            for (n, v) in policies {
                s.insert(WAYPOINT_POLICY_TYPE, res(n, v));
            }
            s
        };
        let s1 = with(1, &[("shop/reviews", "1")]);
        let mut ztunnel = session();
        let mut waypoint = session();
        let mut sent = Vec::new();
        for t in [ADDRESS_TYPE, AUTHORIZATION_TYPE] {
            sent.extend(ztunnel.on_request(initial(t, &[]), &s1).unwrap().responses);
        }
        let first = waypoint
            .on_request(initial(WAYPOINT_POLICY_TYPE, &[]), &s1)
            .unwrap()
            .responses;
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].type_url, WAYPOINT_POLICY_TYPE);
        assert_eq!(names(&first[0]), ["shop/reviews"]);
        // A policy changes, one is added, then all are removed.
        let s2 = with(2, &[("shop/reviews", "2"), ("shop/deny", "1")]).with_changes_from(&s1);
        sent.extend(ztunnel.on_snapshot(&s2));
        let out = waypoint.on_snapshot(&s2);
        assert_eq!(names(&out[0]), ["shop/deny", "shop/reviews"]);
        let s3 = with(3, &[]).with_changes_from(&s2);
        sent.extend(ztunnel.on_snapshot(&s3));
        let out = waypoint.on_snapshot(&s3);
        assert_eq!(out[0].removed_resources, ["shop/deny", "shop/reviews"]);
        assert!(
            sent.iter().all(|r| r.type_url != WAYPOINT_POLICY_TYPE),
            "{sent:?}"
        );
        assert_eq!(sent.len(), 2, "one first response of each Istio type only");
    }

    #[test]
    fn acks_and_nacks_are_recorded_per_nonce() {
        let mut c = session();
        let s = snap(1, &[("a", "1")], &[]);
        let n0 = c
            .on_request(initial(ADDRESS_TYPE, &[]), &s)
            .unwrap()
            .responses[0]
            .nonce
            .clone();
        let step = c.on_request(ack(ADDRESS_TYPE, &n0), &s).unwrap();
        assert!(step.acked && !step.nacked && step.responses.is_empty());
        let t = &c.debug(10).types[ADDRESS_TYPE];
        assert_eq!(t.ack, AckState::Acked { nonce: n0.clone() });
        assert_eq!(t.versions["a"], "1");

        let out = c.on_snapshot(&snap(2, &[("a", "2")], &[]));
        let n1 = out[0].nonce.clone();
        assert_ne!(n0, n1, "a fresh nonce per response");
        assert_eq!(c.debug(10).types[ADDRESS_TYPE].ack, AckState::Pending);
        let step = c
            .on_request(nack(ADDRESS_TYPE, &n1, "a: bad address"), &s)
            .unwrap();
        assert!(step.nacked && !step.acked);
        // A NACKed resource is not resent (the client would reject it again).
        assert!(step.responses.is_empty());
        assert!(c.on_snapshot(&snap(3, &[("a", "2")], &[])).is_empty());
        let t = &c.debug(10).types[ADDRESS_TYPE];
        assert_eq!(
            t.ack,
            AckState::Nacked {
                nonce: n1.clone(),
                message: "a: bad address".into()
            }
        );
        assert_eq!(t.nacks.len(), 1);
        assert_eq!((t.acks, t.nacks_total, t.responses), (1, 1, 2));

        // The same nonce again, or one never sent: stale, ignored.
        let step = c.on_request(ack(ADDRESS_TYPE, &n1), &s).unwrap();
        assert!(step.stale_nonce && !step.acked);
        let step = c.on_request(ack(ADDRESS_TYPE, "bogus"), &s).unwrap();
        assert!(step.stale_nonce);
        assert_eq!(c.debug(10).types[ADDRESS_TYPE].acks, 1);
    }

    #[test]
    fn an_ack_of_an_older_response_leaves_the_newest_pending() {
        let mut c = session();
        let s1 = snap(1, &[("a", "1")], &[]);
        let n0 = c
            .on_request(initial(ADDRESS_TYPE, &[]), &s1)
            .unwrap()
            .responses[0]
            .nonce
            .clone();
        let n1 = c.on_snapshot(&snap(2, &[("a", "2")], &[]))[0].nonce.clone();
        assert!(c.on_request(ack(ADDRESS_TYPE, &n0), &s1).unwrap().acked);
        assert_eq!(c.debug(10).types[ADDRESS_TYPE].ack, AckState::Pending);
        assert!(c.on_request(ack(ADDRESS_TYPE, &n1), &s1).unwrap().acked);
        assert_eq!(
            c.debug(10).types[ADDRESS_TYPE].ack,
            AckState::Acked { nonce: n1 }
        );
        // n0 was answered (and is older than n1): a repeat is stale.
        assert!(
            c.on_request(ack(ADDRESS_TYPE, &n0), &s1)
                .unwrap()
                .stale_nonce
        );
    }

    #[test]
    fn nack_history_and_messages_are_bounded() {
        let limits = SessionLimits {
            max_nacks_kept: 2,
            max_nack_message: 5,
            ..SessionLimits::default()
        };
        let mut c = Session::new(1, limits);
        let mut s = snap(0, &[("a", "0")], &[]);
        let mut nonce = c
            .on_request(initial(ADDRESS_TYPE, &[]), &s)
            .unwrap()
            .responses[0]
            .nonce
            .clone();
        for i in 1..=4 {
            c.on_request(nack(ADDRESS_TYPE, &nonce, "éééééé"), &s)
                .unwrap();
            s = snap(i, &[("a", &i.to_string())], &[]);
            nonce = c.on_snapshot(&s)[0].nonce.clone();
        }
        let t = &c.debug(10).types[ADDRESS_TYPE];
        assert_eq!(t.nacks.len(), 2);
        assert_eq!(t.nacks_total, 4);
        assert_eq!(t.nacks[0].message, "éé", "cut at a character boundary");
    }

    #[test]
    fn unknown_types_are_ignored() {
        let mut c = session();
        let s = snap(1, &[("a", "1")], &[]);
        let step = c
            .on_request(
                initial("type.googleapis.com/envoy.config.cluster.v3.Cluster", &[]),
                &s,
            )
            .unwrap();
        assert!(step.unknown_type && step.responses.is_empty());
        assert_eq!(
            c.debug(10).unknown_types,
            ["type.googleapis.com/envoy.config.cluster.v3.Cluster"]
        );
        assert!(c.on_snapshot(&s).is_empty());
    }

    #[test]
    fn a_request_without_type_is_refused() {
        let mut c = session();
        let err = c
            .on_request(DeltaDiscoveryRequest::default(), &Snapshot::new(0))
            .unwrap_err();
        assert_eq!(err, SessionError::NoTypeUrl);
    }

    #[test]
    fn on_demand_subscriptions() {
        let s = snap(1, &[("a", "1"), ("b", "1")], &[]);
        let mut c = session();
        // ztunnel's XDS_ON_DEMAND: subscribe "*" and unsubscribe "*" = subscribe to nothing.
        let req = DeltaDiscoveryRequest {
            resource_names_subscribe: vec!["*".into()],
            resource_names_unsubscribe: vec!["*".into()],
            ..initial(ADDRESS_TYPE, &[])
        };
        let step = c.on_request(req, &s).unwrap();
        assert_eq!(step.responses.len(), 1);
        assert!(step.responses[0].resources.is_empty());
        // A lookup for b, and one for something that does not exist.
        let req = DeltaDiscoveryRequest {
            type_url: ADDRESS_TYPE.into(),
            resource_names_subscribe: vec!["b".into(), "/10.9.9.9".into()],
            ..Default::default()
        };
        let r = &c.on_request(req, &s).unwrap().responses[0];
        assert_eq!(names(r), ["b"]);
        assert_eq!(r.removed_resources, ["/10.9.9.9"]);
        // Only b is followed.
        let out = c.on_snapshot(&snap(2, &[("a", "2"), ("b", "2")], &[]));
        assert_eq!(names(&out[0]), ["b"]);
        // The missing name appears later: it is sent.
        let s3 = snap(3, &[("a", "2"), ("b", "2"), ("/10.9.9.9", "1")], &[]);
        let out = c.on_snapshot(&s3);
        assert_eq!(names(&out[0]), ["/10.9.9.9"]);
        // Unsubscribed: no longer followed, and its removal sent (the client may hold it
        // under a subscription it made implicitly, by reporting it after a reconnect).
        let req = DeltaDiscoveryRequest {
            type_url: ADDRESS_TYPE.into(),
            resource_names_unsubscribe: vec!["b".into()],
            ..Default::default()
        };
        let r = &c.on_request(req, &s3).unwrap().responses[0];
        assert!(r.resources.is_empty());
        assert_eq!(r.removed_resources, ["b"]);
        let s4 = snap(4, &[("a", "2"), ("/10.9.9.9", "1")], &[]);
        assert!(c.on_snapshot(&s4).is_empty());
        // Subscribing to "*" later turns into wildcard: a is sent.
        let req = DeltaDiscoveryRequest {
            type_url: ADDRESS_TYPE.into(),
            resource_names_subscribe: vec!["*".into()],
            ..Default::default()
        };
        let r = &c.on_request(req, &s4).unwrap().responses[0];
        assert_eq!(names(r), ["a"]);
        assert!(r.removed_resources.is_empty());
    }

    #[test]
    fn on_demand_names_resolve_by_alias_and_bring_their_dependents() {
        // (workloads w1 at /10.0.0.1 and w2, endpoints of ns/svc at VIP /10.96.0.1; w3 unrelated)
        let mesh = |generation, with_w2: bool| {
            let mut addrs = vec![("w1", "1"), ("ns/svc", "1"), ("w3", "1")];
            if with_w2 {
                addrs.push(("w2", "1"));
            }
            let mut s = snap(generation, &addrs, &[]);
            s.insert_alias("/10.0.0.1".into(), "w1");
            s.insert_alias("/10.96.0.1".into(), "ns/svc");
            s.insert_dependent("ns/svc", "w1".into());
            if with_w2 {
                s.insert_dependent("ns/svc", "w2".into());
            }
            s
        };
        let s = mesh(1, true);
        let mut c = session();
        let req = DeltaDiscoveryRequest {
            resource_names_subscribe: vec!["*".into()],
            resource_names_unsubscribe: vec!["*".into()],
            ..initial(ADDRESS_TYPE, &[])
        };
        assert!(c.on_request(req, &s).unwrap().responses[0]
            .resources
            .is_empty());
        let ask = |name: &str| DeltaDiscoveryRequest {
            type_url: ADDRESS_TYPE.into(),
            resource_names_subscribe: vec![name.into()],
            ..Default::default()
        };
        // By a workload's address: the workload under its uid, the alias in `aliases`.
        let r = &c.on_request(ask("/10.0.0.1"), &s).unwrap().responses[0];
        assert_eq!(names(r), ["w1"]);
        assert_eq!(r.resources[0].aliases, ["/10.0.0.1"]);
        // By a service VIP: the service and its endpoints (w1 again, as the client holds
        // it already under another name it asked by: only w2 is new).
        let r = &c.on_request(ask("/10.96.0.1"), &s).unwrap().responses[0];
        assert_eq!(names(r), ["ns/svc", "w2"]);
        assert_eq!(r.resources[0].aliases, ["/10.96.0.1"]);
        // An endpoint leaving the service (and the mesh) is removed; w3 is never sent.
        let out = c.on_snapshot(&mesh(2, false));
        assert_eq!(out.len(), 1);
        assert!(out[0].resources.is_empty());
        assert_eq!(out[0].removed_resources, ["w2"]);
        // Unsubscribing both: what they resolved to is no longer followed, and removed.
        let req = DeltaDiscoveryRequest {
            type_url: ADDRESS_TYPE.into(),
            resource_names_unsubscribe: vec!["/10.96.0.1".into(), "/10.0.0.1".into()],
            ..Default::default()
        };
        let step = c.on_request(req, &mesh(2, false)).unwrap();
        assert!(step.responses.iter().all(|r| r.resources.is_empty()));
        let mut removed: Vec<&str> = step
            .responses
            .iter()
            .flat_map(|r| r.removed_resources.iter().map(String::as_str))
            .collect();
        removed.sort();
        assert_eq!(removed, ["ns/svc", "w1"]);
        let mut s3 = snap(3, &[("w1", "2"), ("ns/svc", "2"), ("w3", "1")], &[]);
        s3.insert_alias("/10.0.0.1".into(), "w1");
        assert!(c.on_snapshot(&s3).is_empty());
    }

    /// An on-demand client reconnecting reports the alias it asked by (empty version) and
    /// what it holds; it then unsubscribes the held names it did not ask by. What the
    /// alias still brings stays (no removal); what nothing brings any more is removed.
    #[test]
    fn held_names_unsubscribed_after_a_reconnect_stay_only_while_an_asked_name_brings_them() {
        let mut s = snap(1, &[("w1", "1"), ("w9", "2")], &[]);
        s.insert_alias("/10.0.0.1".into(), "w1");
        let mut c = session();
        let req = DeltaDiscoveryRequest {
            resource_names_subscribe: vec!["*".into()],
            resource_names_unsubscribe: vec!["*".into()],
            ..initial(ADDRESS_TYPE, &[("/10.0.0.1", ""), ("w1", "1"), ("w9", "1")])
        };
        let r = &c.on_request(req, &s).unwrap().responses[0];
        // w9 changed while the client was away; w1 it holds as it is.
        assert_eq!(names(r), ["w9"]);
        let req = DeltaDiscoveryRequest {
            type_url: ADDRESS_TYPE.into(),
            resource_names_unsubscribe: vec!["w1".into(), "w9".into()],
            ..Default::default()
        };
        let r = &c.on_request(req, &s).unwrap().responses[0];
        assert!(r.resources.is_empty());
        assert_eq!(r.removed_resources, ["w9"], "w1 stays: the alias brings it");
        // The alias unsubscribed (idle): w1 is removed too.
        let req = DeltaDiscoveryRequest {
            type_url: ADDRESS_TYPE.into(),
            resource_names_unsubscribe: vec!["/10.0.0.1".into()],
            ..Default::default()
        };
        let r = &c.on_request(req, &s).unwrap().responses[0];
        assert_eq!(r.removed_resources, ["w1"]);
    }

    #[test]
    fn a_non_wildcard_client_keeps_following_what_it_reported_holding() {
        let s = snap(1, &[("a", "2"), ("b", "1")], &[]);
        let mut c = session();
        let req = DeltaDiscoveryRequest {
            resource_names_subscribe: vec!["*".into()],
            resource_names_unsubscribe: vec!["*".into()],
            ..initial(ADDRESS_TYPE, &[("a", "1")])
        };
        let r = &c.on_request(req, &s).unwrap().responses[0];
        assert_eq!(names(r), ["a"]);
    }

    #[test]
    fn name_counts_are_bounded() {
        let limits = SessionLimits {
            max_names_per_type: 2,
            ..SessionLimits::default()
        };
        let s = snap(1, &[], &[]);
        let mut c = Session::new(1, limits);
        let err = c
            .on_request(
                initial(ADDRESS_TYPE, &[("a", "1"), ("b", "1"), ("c", "1")]),
                &s,
            )
            .unwrap_err();
        assert!(matches!(err, SessionError::TooManyNames { limit: 2, .. }));
        let mut c = Session::new(1, limits);
        let req = DeltaDiscoveryRequest {
            resource_names_subscribe: vec!["a".into(), "b".into(), "c".into()],
            ..initial(ADDRESS_TYPE, &[])
        };
        assert!(c.on_request(req, &s).is_err());
        // The refused name was never kept: the session (listed until its stream is gone)
        // holds at most the cap.
        assert_eq!(c.debug(0).types[ADDRESS_TYPE].explicit_subscriptions, 2);
    }

    #[test]
    fn the_most_names_held_is_kept_on_every_name_a_refused_request_included() {
        let limits = SessionLimits {
            max_names_per_type: 3,
            ..SessionLimits::default()
        };
        let s = snap(1, &[], &[]);
        let subscribe = |names: &[&str], unsubscribe: &[&str]| DeltaDiscoveryRequest {
            type_url: ADDRESS_TYPE.into(),
            resource_names_subscribe: names.iter().map(|n| n.to_string()).collect(),
            resource_names_unsubscribe: unsubscribe.iter().map(|n| n.to_string()).collect(),
            ..Default::default()
        };
        let mut c = Session::new(1, limits);
        c.on_request(
            DeltaDiscoveryRequest {
                resource_names_subscribe: vec!["a".into(), "b".into()],
                ..initial(ADDRESS_TYPE, &[])
            },
            &s,
        )
        .unwrap();
        assert_eq!(c.most_names(), 2);
        // Dropped again: the mark stays at the most ever held.
        c.on_request(subscribe(&[], &["a", "b"]), &s).unwrap();
        assert_eq!(c.most_names(), 2);
        // Refused on its fourth name: the three kept before the refusal are the mark.
        assert!(c
            .on_request(subscribe(&["c", "d", "e", "f"], &[]), &s)
            .is_err());
        assert_eq!(c.most_names(), 3);
        // Names an on-demand client reports on its first request count too.
        let mut c = Session::new(1, limits);
        let reported = DeltaDiscoveryRequest {
            resource_names_subscribe: vec!["*".into()],
            resource_names_unsubscribe: vec!["*".into()],
            ..initial(ADDRESS_TYPE, &[("x", ""), ("y", "")])
        };
        c.on_request(reported, &s).unwrap();
        assert_eq!(c.most_names(), 2);
    }

    /// A client adding names one request at a time costs in proportion to its names, not
    /// to their square; a new snapshot looks at every name once.
    #[test]
    fn names_examined_grow_with_what_is_asked() {
        const NAMES: u64 = 2_000;
        let s = snap(1, &[("a", "1")], &[]);
        let mut c = session();
        let first = DeltaDiscoveryRequest {
            resource_names_subscribe: vec!["*".into()],
            resource_names_unsubscribe: vec!["*".into()],
            ..initial(ADDRESS_TYPE, &[])
        };
        c.on_request(first, &s).unwrap();
        c.take_names_examined();
        for i in 0..NAMES {
            let req = DeltaDiscoveryRequest {
                type_url: ADDRESS_TYPE.into(),
                resource_names_subscribe: vec![format!("nobody/{i}")],
                ..Default::default()
            };
            let step = c.on_request(req, &s).unwrap();
            assert_eq!(step.responses[0].removed_resources.len(), 1);
        }
        // Each request: its name followed, then reported absent. Following every name
        // again on each request would be NAMES² / 2 (2,000,000 here).
        assert_eq!(c.take_names_examined(), 2 * NAMES);
        assert_eq!(c.take_names_examined(), 0, "taken");
        // A snapshot with another generation: every name followed again, once.
        let next = snap(2, &[("a", "2")], &[]);
        c.on_snapshot(&next);
        let examined = c.take_names_examined();
        assert!((NAMES..=NAMES + 10).contains(&examined), "{examined}");
    }

    #[test]
    fn name_bytes_are_bounded() {
        let limits = SessionLimits {
            max_name_bytes: 8,
            max_name_bytes_per_type: 20,
            ..SessionLimits::default()
        };
        let s = snap(1, &[], &[]);
        let subscribe = |names: &[&str]| DeltaDiscoveryRequest {
            resource_names_subscribe: names.iter().map(|n| n.to_string()).collect(),
            ..initial(ADDRESS_TYPE, &[])
        };
        // One name over the per-name bound: refused, whichever list carries it.
        let mut c = Session::new(1, limits);
        let err = c.on_request(subscribe(&["123456789"]), &s).unwrap_err();
        assert!(
            matches!(
                err,
                SessionError::NameTooLong {
                    len: 9,
                    limit: 8,
                    ..
                }
            ),
            "{err:?}"
        );
        let mut c = Session::new(1, limits);
        let err = c
            .on_request(initial(ADDRESS_TYPE, &[("a", "123456789")]), &s)
            .unwrap_err();
        assert!(matches!(err, SessionError::NameTooLong { .. }), "{err:?}");
        // Names within the bound, but too many bytes of them in all.
        let mut c = Session::new(1, limits);
        assert!(c
            .on_request(subscribe(&["aaaaaaaa", "bbbbbbbb"]), &s)
            .is_ok());
        // Unsubscribing gives bytes back: one more name of 8 fits after it.
        let mut req = subscribe(&[]);
        req.resource_names_unsubscribe = vec!["aaaaaaaa".into()];
        assert!(c.on_request(req, &s).is_ok());
        assert!(c.on_request(subscribe(&["cccccccc"]), &s).is_ok());
        let err = c.on_request(subscribe(&["dddddddd"]), &s).unwrap_err();
        assert!(
            matches!(err, SessionError::TooManyNameBytes { limit: 20, .. }),
            "{err:?}"
        );
        // Reported versions count too.
        let mut c = Session::new(1, limits);
        let err = c
            .on_request(
                initial(
                    ADDRESS_TYPE,
                    &[("aaaa", "1111"), ("bbbb", "2222"), ("cccc", "3333")],
                ),
                &s,
            )
            .unwrap_err();
        assert!(
            matches!(err, SessionError::TooManyNameBytes { .. }),
            "{err:?}"
        );
    }

    #[test]
    fn large_updates_are_split_and_removals_ride_on_the_last_part() {
        let limits = SessionLimits {
            max_response_bytes: 40,
            ..SessionLimits::default()
        };
        let mut c = Session::new(1, limits);
        let s1 = snap(1, &[("old", "1")], &[]);
        c.on_request(initial(ADDRESS_TYPE, &[]), &s1).unwrap();
        let many: Vec<(String, String)> =
            (0..5).map(|i| (format!("name-{i}"), "1".into())).collect();
        let refs: Vec<(&str, &str)> = many.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
        let out = c.on_snapshot(&snap(2, &refs, &[]));
        assert!(out.len() > 1, "{} responses", out.len());
        let all: Vec<&str> = out.iter().flat_map(names).collect();
        assert_eq!(all.len(), 5);
        for r in &out[..out.len() - 1] {
            assert!(r.removed_resources.is_empty());
        }
        assert_eq!(out.last().unwrap().removed_resources, ["old"]);
        let nonces: BTreeSet<_> = out.iter().map(|r| r.nonce.clone()).collect();
        assert_eq!(nonces.len(), out.len());
        // Each part can be ACKed on its own.
        for r in &out {
            assert!(
                c.on_request(ack(ADDRESS_TYPE, &r.nonce), &s1)
                    .unwrap()
                    .acked
            );
        }
    }

    #[test]
    fn the_node_id_is_taken_from_the_first_request_that_has_one_and_bounded() {
        let limits = SessionLimits {
            max_node_id: 4,
            ..SessionLimits::default()
        };
        let mut c = Session::new(1, limits);
        let s = Snapshot::new(0);
        let mut req = initial(ADDRESS_TYPE, &[]);
        req.node = None;
        c.on_request(req, &s).unwrap();
        assert_eq!(c.node_id(), None);
        c.on_request(initial(AUTHORIZATION_TYPE, &[]), &s).unwrap();
        assert_eq!(c.node_id(), Some("ztun"));
    }
}
