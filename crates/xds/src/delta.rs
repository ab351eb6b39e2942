//! The delta ADS protocol of ztunnel's xDS client, sans-IO: the initial requests, the
//! handling of each `DeltaDiscoveryResponse` into one [`Batch`] for the store plus the
//! ACK/NACK to send, resource versions kept across streams, and readiness.
//!
//! Nothing here opens a socket or looks at a clock; the IO driver (`crate::client`)
//! feeds responses in and sends what comes out.
//!
//! # Limits
//!
//! A control plane is trusted to describe the mesh, not to exhaust the proxy. Besides the
//! gRPC bound on one decoded message ([`ambit_proto::MAX_XDS_MESSAGE`], 200 MiB), the
//! state machine refuses ([`Limits`]):
//! - a response with more than 1,000,000 entries (resources, removed names, aliases),
//!   counted on the encoded bytes before they are decoded ([`DeltaClient::handle_bytes`]),
//!   refused whole: nothing applied, NACKed;
//! - a resource whose name is longer than 1,024 bytes, or whose version is longer than
//!   1,024 bytes (that resource rejected);
//! - a resource body that breaks a limit of [`crate::shape`] (entries of a repeated field,
//!   bytes of a string), checked on its encoded bytes before it is decoded (rejected);
//! - a resource whose body describes another object than its name: a workload is named
//!   by its uid, a service by `namespace/hostname`, a policy by `namespace/name`
//!   (rejected, so that a removal by name always removes what was announced);
//! - a new resource name when 1,000,000 are already tracked for its type (rejected);
//! - a response that would take what is held for its type over the type's budget of
//!   estimated bytes once decoded ([`MAX_HELD_ADDRESSES`], [`MAX_HELD_POLICIES`]), or
//!   whose resources alone would take more than [`MAX_HELD_PER_RESPONSE`], refused whole:
//!   nothing applied, NACKed with the estimate and the budget;
//! - NACK messages list at most 64 rejections, each cut at 512 bytes, then count the rest.
//!
//! # The budget
//!
//! The limits on one resource's shape bound what one resource holds, not what many do:
//! 488 policies of 4,096 empty matches each (4 MB on the wire) held 1.39 GB. So the
//! client estimates what each resource will hold once decoded, converted and in the store
//! ([`crate::held`], from the counts of its shape walk, before decoding it), keeps the sum
//! of what is held per type, and refuses a response that would take the sum over the
//! type's budget (what is held, plus what the response adds, less what it replaces or
//! removes). The check runs twice: on the estimates before anything is decoded (so such a
//! response is never decoded), and once the resources are converted, on what is accepted
//! (a replacement that fails to convert frees nothing). A response over the budget is
//! not applied at all (a bad resource alone is still rejected alone, the rest applying),
//! so what is held never passes the budget; while a response is handled the proxy holds
//! at most the budget plus [`MAX_HELD_PER_RESPONSE`], in estimated bytes.

use std::collections::{BTreeMap, HashMap};

use ambit_proto::istio::security as psec;
use ambit_proto::istio::workload as pw;
use ambit_proto::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, Node, Status, ADDRESS_TYPE, AUTHORIZATION_TYPE,
};
use ambit_state::{Authorization, ProxyState, Service, Workload};
use prost::Message;

use crate::convert::{self, AddressResource};
use crate::held;
use crate::reject::Rejection;
use crate::shape;

pub use crate::node::{NodeConfig, NodeConfigError};

/// The default budget of the Address resources held (workloads and services, with the
/// store's indexes and the names and versions tracked), in estimated bytes
/// ([`crate::held`]). Issue 23's target mesh, 100,000 workloads and 10,000 services
/// shaped as a large real one (per pod two addresses, three services of four ports,
/// three policies, a waypoint, long names), is estimated at 1.16 GB (it holds about
/// 0.6 GB: the estimate errs high by 1.8 times for such pods): 3 GiB leaves 2.7 times
/// the estimate, 5 times what it holds. A mesh that needs more needs a larger proxy too.
pub const MAX_HELD_ADDRESSES: u64 = 3 << 30;
/// The default budget of the Authorization resources held. 20,000 policies (two per
/// service of that mesh) of three rules of four match objects with a few values each are
/// estimated at 0.2 GB (they hold 0.12 GB): 512 MiB leaves 2.6 times the estimate. The
/// 4 MB split attack (488 policies of 4,096 empty match objects) is estimated at 0.74 GB.
pub const MAX_HELD_POLICIES: u64 = 512 << 20;
/// The default bound on what the resources of one response may take once decoded,
/// before what they replace is freed: the larger budget. The first response of a stream
/// carries the whole mesh (a reconnect sends it again), so a smaller bound would leave a
/// proxy that holds its budget unable to sync again. While a response is applied the
/// proxy holds what it held plus this at most.
pub const MAX_HELD_PER_RESPONSE: u64 = MAX_HELD_ADDRESSES;

/// Bounds on what one control plane can make the proxy hold (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Resources plus removed names plus aliases in one response.
    pub max_per_response: usize,
    /// Bytes of a resource name.
    pub max_name_len: usize,
    /// Bytes of a resource version.
    pub max_version_len: usize,
    /// Resource names tracked (with their versions) per type.
    pub max_tracked_per_type: usize,
    /// Rejections spelled out in one NACK message.
    pub max_errors_listed: usize,
    /// Bytes of one `<name>: <reason>` entry in a NACK message.
    pub max_error_len: usize,
    /// Estimated bytes the Address resources held may take ([`MAX_HELD_ADDRESSES`]).
    pub max_held_addresses: u64,
    /// Estimated bytes the Authorization resources held may take ([`MAX_HELD_POLICIES`]).
    pub max_held_policies: u64,
    /// Estimated bytes the resources of one response may take
    /// ([`MAX_HELD_PER_RESPONSE`]).
    pub max_held_per_response: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_per_response: 1_000_000,
            max_name_len: 1024,
            max_version_len: 1024,
            max_tracked_per_type: 1_000_000,
            max_errors_listed: 64,
            max_error_len: 512,
            max_held_addresses: MAX_HELD_ADDRESSES,
            max_held_policies: MAX_HELD_POLICIES,
            max_held_per_response: MAX_HELD_PER_RESPONSE,
        }
    }
}

impl Limits {
    fn budget(&self, type_url: &str) -> u64 {
        if type_url == ADDRESS_TYPE {
            self.max_held_addresses
        } else {
            self.max_held_policies
        }
    }
}

// ----- batches --------------------------------------------------------------------------

/// One change to the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Workload(Box<Workload>),
    Service(Service),
    Policy(Authorization),
    /// An Address resource removed by name (see [`Batch::apply`]).
    RemoveAddress(String),
    /// An Authorization resource removed by `namespace/name`.
    RemovePolicy(String),
}

/// The changes of one response, to apply to a [`ProxyState`] at once (removals first,
/// then insertions, in the response's order).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Batch {
    pub ops: Vec<Op>,
}

impl Batch {
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Applies the batch. Resources were checked when the batch was made, so the store
    /// refuses none in practice; any it does refuse is logged and skipped.
    ///
    /// An Address removal follows ztunnel: the name is first tried as a workload uid;
    /// else, split at the first `/` as `namespace/hostname`, it names a service unless
    /// the hostname part still holds a `/` (then it was a workload uid we did not have).
    pub fn apply(self, state: &mut ProxyState) {
        for op in self.ops {
            let refused = match op {
                Op::RemoveAddress(name) => {
                    if state.remove_workload(&name).is_none() {
                        if let Some((_, host)) = name.split_once('/') {
                            if !host.contains('/') {
                                state.remove_service(&name);
                            }
                        }
                    }
                    None
                }
                Op::RemovePolicy(name) => {
                    state.remove_policy(&name);
                    None
                }
                Op::Workload(w) => {
                    let uid = w.uid.clone();
                    state.insert_workload(*w).err().map(|e| (uid, e))
                }
                Op::Service(s) => {
                    let key = s.key();
                    state.insert_service(s).err().map(|e| (key, e))
                }
                Op::Policy(p) => {
                    let key = p.key();
                    state.insert_policy(p).err().map(|e| (key, e))
                }
            };
            if let Some((name, reason)) = refused {
                tracing::warn!(resource = %name, %reason, "xDS resource refused by the store");
            }
        }
    }
}

// ----- the state machine ----------------------------------------------------------------

/// What handling one response produced.
#[derive(Debug, Clone, PartialEq)]
pub struct Handled {
    /// The response's type URL.
    pub type_url: String,
    /// False for a type this client did not subscribe to (ACKed, nothing applied).
    pub known_type: bool,
    /// The changes to apply.
    pub batch: Batch,
    /// The ACK, or the NACK when `rejected` is not empty.
    pub reply: DeltaDiscoveryRequest,
    /// `(resource name, reason)` of each rejected resource (`response` for a response
    /// refused whole).
    pub rejected: Vec<(String, Rejection)>,
    /// Sum of the resources' payload bytes (the `istio_xds_message_bytes` metric).
    pub payload_bytes: u64,
}

/// What is held under one resource name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Entry {
    /// The version accepted last; `None` once an update was rejected (the store keeps
    /// what was accepted before, and the name is left out of `initial_resource_versions`
    /// so that the control plane sends it again).
    version: Option<String>,
    /// Estimated bytes held ([`crate::held`]): a policy or a workload in `[WHOLE]`, a
    /// service in `[SERVICE]` (an Address name can be a workload uid and a service key at
    /// once: the store holds both).
    held: [u64; 2],
}

const WHOLE: usize = 0;
const SERVICE: usize = 1;

impl Entry {
    fn holds_nothing(&self) -> bool {
        self.version.is_none() && self.held == [0, 0]
    }
}

#[derive(Debug)]
struct TypeState {
    type_url: &'static str,
    /// Resource name → what is held under it (names with a version or something held).
    entries: HashMap<String, Entry>,
    /// The sum of the entries' estimates.
    held: u64,
    /// A response of this type was answered (ACK or NACK) at least once.
    answered: bool,
}

/// The delta ADS client state: what was accepted (for `initial_resource_versions`), what
/// it holds (for the budget) and what was answered (for readiness). Kept across streams.
#[derive(Debug)]
pub struct DeltaClient {
    node: Node,
    limits: Limits,
    types: Vec<TypeState>,
}

/// A resource that passed the checks made before decoding.
struct Prechecked {
    body: Vec<u8>,
    counts: shape::Counts,
    /// Its estimate, with the tracking of its name and version.
    estimate: u64,
}

/// One resource of a response through the checks: its name, version, and either what
/// to hold or why not.
struct Checked<T> {
    name: String,
    version: String,
    result: Result<T, Rejection>,
}

/// The entries a response changes, over those held: what applying it would leave.
struct Plan<'a> {
    entries: &'a HashMap<String, Entry>,
    changed: HashMap<String, Entry>,
    /// Names tracked after the changes so far.
    tracked: usize,
}

impl<'a> Plan<'a> {
    fn new(entries: &'a HashMap<String, Entry>) -> Self {
        Plan {
            entries,
            changed: HashMap::new(),
            tracked: entries.len(),
        }
    }

    fn entry(&mut self, name: &str) -> &mut Entry {
        if !self.changed.contains_key(name) {
            let e = self.entries.get(name).cloned().unwrap_or_default();
            self.changed.insert(name.to_string(), e);
        }
        self.changed.get_mut(name).expect("just inserted")
    }

    /// Runs `f` on the entry of `name`, keeping the tracked count right.
    fn update(&mut self, name: &str, f: impl FnOnce(&mut Entry)) {
        let e = self.entry(name);
        let was = !e.holds_nothing();
        f(e);
        let is = !e.holds_nothing();
        self.tracked = self.tracked + usize::from(is) - usize::from(was);
    }

    fn is_tracked(&self, name: &str) -> bool {
        match self.changed.get(name) {
            Some(e) => !e.holds_nothing(),
            None => self.entries.contains_key(name),
        }
    }

    /// A removal by name, as [`Batch::apply`] does it: a policy; or a workload uid, else
    /// a service `namespace/hostname`.
    fn remove(&mut self, type_url: &str, name: &str) {
        self.update(name, |e| {
            e.version = None;
            if type_url != ADDRESS_TYPE || e.held[WHOLE] > 0 {
                e.held[WHOLE] = 0;
            } else if name.split_once('/').is_some_and(|(_, h)| !h.contains('/')) {
                e.held[SERVICE] = 0;
            }
        });
    }

    /// A resource accepted with `version`, holding `estimate` in `slot`.
    fn put(&mut self, name: &str, version: &str, slot: usize, estimate: u64) {
        self.update(name, |e| {
            e.version = Some(version.to_string());
            e.held[slot] = estimate;
        });
    }

    /// A rejected resource: what was held stays, its version goes.
    fn reject(&mut self, name: &str) {
        self.update(name, |e| e.version = None);
    }

    /// What would be held after the changes, given `held` before.
    fn held_after(&self, held: u64) -> u64 {
        let (mut before, mut after) = (0u64, 0u64);
        for (name, e) in &self.changed {
            let old = self.entries.get(name).map_or([0, 0], |e| e.held);
            before = before.saturating_add(old[0] + old[1]);
            after = after.saturating_add(e.held[0].saturating_add(e.held[1]));
        }
        held.saturating_sub(before).saturating_add(after)
    }

    /// The entries changed, to [`commit`].
    fn into_changes(self) -> HashMap<String, Entry> {
        self.changed
    }
}

/// Writes the changes of a [`Plan`] into the entries.
fn commit(changes: HashMap<String, Entry>, entries: &mut HashMap<String, Entry>) {
    for (name, e) in changes {
        if e.holds_nothing() {
            entries.remove(&name);
        } else {
            entries.insert(name, e);
        }
    }
}

/// The slot of [`Entry::held`] a body fills.
fn slot(counts: &shape::Counts) -> usize {
    match counts {
        shape::Counts::Service(_) => SERVICE,
        _ => WHOLE,
    }
}

impl DeltaClient {
    /// A wildcard client for ADDRESS_TYPE and AUTHORIZATION_TYPE.
    pub fn new(node: Node) -> Self {
        Self::with_limits(node, Limits::default())
    }

    pub fn with_limits(node: Node, limits: Limits) -> Self {
        let ty = |type_url| TypeState {
            type_url,
            entries: HashMap::new(),
            held: 0,
            answered: false,
        };
        DeltaClient {
            node,
            limits,
            types: vec![ty(ADDRESS_TYPE), ty(AUTHORIZATION_TYPE)],
        }
    }

    /// The requests to send first on every stream: one wildcard subscription per type,
    /// with the node and the versions of the resources accepted so far.
    pub fn initial_requests(&self) -> Vec<DeltaDiscoveryRequest> {
        self.types
            .iter()
            .map(|t| DeltaDiscoveryRequest {
                node: Some(self.node.clone()),
                type_url: t.type_url.to_string(),
                initial_resource_versions: t
                    .entries
                    .iter()
                    .filter_map(|(k, e)| Some((k.clone(), e.version.clone()?)))
                    .collect(),
                ..Default::default()
            })
            .collect()
    }

    /// True once a response of every type was answered ([`DeltaClient::answered`]).
    pub fn is_ready(&self) -> bool {
        self.types.iter().all(|t| t.answered)
    }

    /// Records that the reply to a response of `type_url` was sent. Returns true if that
    /// made the client ready just now.
    pub fn answered(&mut self, type_url: &str) -> bool {
        let was = self.is_ready();
        if let Some(t) = self.types.iter_mut().find(|t| t.type_url == type_url) {
            t.answered = true;
        }
        !was && self.is_ready()
    }

    /// Accepted resources of a type (name → version).
    pub fn versions(&self, type_url: &str) -> Option<BTreeMap<&str, &str>> {
        let t = self.types.iter().find(|t| t.type_url == type_url)?;
        Some(
            t.entries
                .iter()
                .filter_map(|(k, e)| Some((k.as_str(), e.version.as_deref()?)))
                .collect(),
        )
    }

    /// The estimated bytes held for a type ([`crate::held`]), what its budget bounds.
    pub fn held(&self, type_url: &str) -> Option<u64> {
        Some(self.types.iter().find(|t| t.type_url == type_url)?.held)
    }

    /// Decodes `bytes` as a `DeltaDiscoveryResponse` and handles it. The entries of its
    /// repeated fields are counted on the bytes first: a response over
    /// [`Limits::max_per_response`] is NACKed whole from its type and nonce alone, without
    /// decoding the rest (an empty resource is 2 bytes on the wire and ~150 once decoded).
    pub fn handle_bytes(&mut self, bytes: &[u8]) -> Result<Handled, prost::DecodeError> {
        let count = shape::count_response_entries(bytes);
        if count > self.limits.max_per_response {
            let head = shape::ResponseHead::decode(bytes)?;
            let payload_bytes = bytes.len() as u64;
            let limit = self.limits.max_per_response;
            return Ok(self.refuse_whole(
                head.type_url,
                head.nonce,
                Rejection::ResponseTooLarge { count, limit },
                payload_bytes,
            ));
        }
        Ok(self.handle(DeltaDiscoveryResponse::decode(bytes)?))
    }

    /// The answer to a response refused whole for `why`: nothing applied, nothing of the
    /// client's state changed.
    fn refuse_whole(
        &mut self,
        type_url: String,
        nonce: String,
        why: Rejection,
        payload_bytes: u64,
    ) -> Handled {
        let limits = self.limits;
        let Some(ty) = self.types.iter().find(|t| t.type_url == type_url) else {
            return Handled {
                reply: reply(&type_url, nonce, &[], &limits),
                type_url,
                known_type: false,
                batch: Batch::default(),
                rejected: Vec::new(),
                payload_bytes,
            };
        };
        tracing::warn!(
            type_url = ty.type_url,
            reason = %why,
            "xDS response refused whole (NACK)"
        );
        let rejected = vec![("response".to_string(), why)];
        Handled {
            reply: reply(ty.type_url, nonce, &rejected, &limits),
            type_url,
            known_type: true,
            batch: Batch::default(),
            rejected,
            payload_bytes,
        }
    }

    /// Handles one response: each resource checked on its own (a bad one is rejected,
    /// the rest applies), removals, versions, the budget, and the reply.
    pub fn handle(&mut self, resp: DeltaDiscoveryResponse) -> Handled {
        let limits = self.limits;
        let payload_bytes = resp
            .resources
            .iter()
            .filter_map(|r| r.resource.as_ref())
            .map(|a| a.value.len() as u64)
            .sum();
        let Some(ty) = self.types.iter().find(|t| t.type_url == resp.type_url) else {
            tracing::info!(type_url = %cut(&resp.type_url, 256), "xDS response of a type we did not ask for: ACKed and ignored");
            return Handled {
                reply: reply(&resp.type_url, resp.nonce, &[], &limits),
                type_url: resp.type_url,
                known_type: false,
                batch: Batch::default(),
                rejected: Vec::new(),
                payload_bytes,
            };
        };
        let type_url = ty.type_url;
        let count = resp
            .resources
            .iter()
            .map(|r| r.aliases.len())
            .fold(resp.resources.len(), usize::saturating_add)
            .saturating_add(resp.removed_resources.len());
        if count > limits.max_per_response {
            let why = Rejection::ResponseTooLarge {
                count,
                limit: limits.max_per_response,
            };
            return self.refuse_whole(resp.type_url, resp.nonce, why, payload_bytes);
        }
        // Names over the limit were never accepted: nothing to remove.
        let removed: Vec<String> = resp
            .removed_resources
            .into_iter()
            .filter(|n| n.len() <= limits.max_name_len)
            .collect();

        // Before decoding: each resource's checks and estimate, then the budget on them.
        let prechecked: Vec<Checked<Prechecked>> = resp
            .resources
            .into_iter()
            .map(|r| Checked {
                result: precheck(type_url, &r.name, &r.version, r.resource, &limits),
                name: r.name,
                version: r.version,
            })
            .collect();
        let adds = prechecked
            .iter()
            .filter_map(|c| c.result.as_ref().ok())
            .fold(0u64, |sum, p| sum.saturating_add(p.estimate));
        if adds > limits.max_held_per_response {
            let why = Rejection::ResponseOverBudget {
                estimate: adds,
                limit: limits.max_held_per_response,
            };
            return self.refuse_whole(resp.type_url, resp.nonce, why, payload_bytes);
        }
        let mut plan = Plan::new(&ty.entries);
        for name in &removed {
            plan.remove(type_url, name);
        }
        for c in &prechecked {
            if let Ok(p) = &c.result {
                plan.put(&c.name, &c.version, slot(&p.counts), p.estimate);
            }
        }
        if let Some(why) = over_budget(type_url, ty.held, plan.held_after(ty.held), &limits) {
            return self.refuse_whole(resp.type_url, resp.nonce, why, payload_bytes);
        }

        // Decoded and converted; then the budget again, on what was accepted.
        let checked: Vec<Checked<(Op, usize, u64)>> = prechecked
            .into_iter()
            .map(|c| Checked {
                result: c.result.and_then(|p| {
                    let slot = slot(&p.counts);
                    decode(type_url, &c.name, &p.body).map(|op| (op, slot, p.estimate))
                }),
                name: c.name,
                version: c.version,
            })
            .collect();
        let mut plan = Plan::new(&ty.entries);
        let mut batch = Batch::default();
        for name in removed {
            plan.remove(type_url, &name);
            batch.ops.push(if type_url == ADDRESS_TYPE {
                Op::RemoveAddress(name)
            } else {
                Op::RemovePolicy(name)
            });
        }
        let mut rejected = Vec::new();
        for c in checked {
            let accepted = c.result.and_then(|held| {
                if !plan.is_tracked(&c.name) && plan.tracked >= limits.max_tracked_per_type {
                    return Err(Rejection::TooManyTracked {
                        limit: limits.max_tracked_per_type,
                    });
                }
                Ok(held)
            });
            match accepted {
                Ok((op, slot, estimate)) => {
                    plan.put(&c.name, &c.version, slot, estimate);
                    batch.ops.push(op);
                }
                Err(reason) => {
                    // Its version is dropped, so the control plane sends it again.
                    plan.reject(&c.name);
                    rejected.push((c.name, reason));
                }
            }
        }
        let held = plan.held_after(ty.held);
        if let Some(why) = over_budget(type_url, ty.held, held, &limits) {
            return self.refuse_whole(resp.type_url, resp.nonce, why, payload_bytes);
        }
        let changes = plan.into_changes();
        let ty = self
            .types
            .iter_mut()
            .find(|t| t.type_url == type_url)
            .expect("found above");
        commit(changes, &mut ty.entries);
        ty.held = held;
        if !rejected.is_empty() {
            tracing::warn!(
                type_url,
                rejected = rejected.len(),
                first = %format!("{}: {}", cut(&rejected[0].0, 256), cut(&rejected[0].1.to_string(), 512)),
                "xDS resources rejected (NACK); the rest of the response applies"
            );
        }
        Handled {
            reply: reply(type_url, resp.nonce, &rejected, &limits),
            type_url: resp.type_url,
            known_type: true,
            batch,
            rejected,
            payload_bytes,
        }
    }
}

/// The refusal of a response that would leave `after` held for `type_url`, over the
/// type's budget (`held` is what is held before it).
fn over_budget(
    type_url: &'static str,
    held: u64,
    after: u64,
    limits: &Limits,
) -> Option<Rejection> {
    let budget = limits.budget(type_url);
    (after > budget).then(|| Rejection::OverBudget {
        message: message_name(type_url),
        estimate: after,
        budget,
        held,
    })
}

fn message_name(type_url: &str) -> &'static str {
    if type_url == ADDRESS_TYPE {
        "istio.workload.Address"
    } else {
        "istio.security.Authorization"
    }
}

/// The checks made before decoding: name, version, payload type, and the body's shape,
/// whose counts give the estimate of what it will hold.
fn precheck(
    type_url: &'static str,
    name: &str,
    version: &str,
    any: Option<prost_types::Any>,
    limits: &Limits,
) -> Result<Prechecked, Rejection> {
    if name.len() > limits.max_name_len {
        return Err(Rejection::NameTooLong {
            len: name.len(),
            limit: limits.max_name_len,
        });
    }
    if version.len() > limits.max_version_len {
        return Err(Rejection::VersionTooLong {
            len: version.len(),
            limit: limits.max_version_len,
        });
    }
    let any = any.ok_or(Rejection::NoPayload)?;
    if any.type_url != type_url {
        return Err(Rejection::WrongType {
            got: cut(&any.type_url, 256).to_string(),
            want: type_url,
        });
    }
    let message = message_name(type_url);
    let counts = if type_url == ADDRESS_TYPE {
        shape::measure_address(&any.value)
    } else {
        shape::measure_authorization(&any.value).map(shape::Counts::Policy)
    }
    .map_err(|e| Rejection::shape(message, e))?;
    let estimate = held::estimate(&counts, name.len()).saturating_add(held::tracking(
        name.len(),
        version.len(),
        std::mem::size_of::<Entry>(),
    ));
    Ok(Prechecked {
        body: any.value,
        counts,
        estimate,
    })
}

/// Decodes and converts a body that passed [`precheck`], and checks that it describes
/// the object its resource name names.
fn decode(type_url: &'static str, name: &str, bytes: &[u8]) -> Result<Op, Rejection> {
    let message = message_name(type_url);
    let decode_error = |e| Rejection::decode(message, e);
    let (op, what, body) = if type_url == ADDRESS_TYPE {
        let a = pw::Address::decode(bytes).map_err(decode_error)?;
        match convert::address_from_proto(a)? {
            AddressResource::Workload(w) => {
                let uid = w.uid.clone();
                (Op::Workload(w), "workload uid", uid)
            }
            AddressResource::Service(s) => {
                let key = s.key();
                (Op::Service(*s), "service namespace/hostname", key)
            }
        }
    } else {
        let a = psec::Authorization::decode(bytes).map_err(decode_error)?;
        let p = convert::authorization_from_proto(a)?;
        let key = p.key();
        (Op::Policy(p), "policy namespace/name", key)
    };
    if body != name {
        return Err(Rejection::NameMismatch {
            what,
            body: cut(&body, 256).to_string(),
        });
    }
    Ok(op)
}

/// At most `max` bytes of `s`, cut at a character boundary.
fn cut(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

fn reply(
    type_url: &str,
    nonce: String,
    rejected: &[(String, Rejection)],
    limits: &Limits,
) -> DeltaDiscoveryRequest {
    let error_detail = (!rejected.is_empty()).then(|| {
        let mut parts: Vec<String> = rejected
            .iter()
            .take(limits.max_errors_listed)
            .map(|(n, r)| cut(&format!("{n}: {r}"), limits.max_error_len).to_string())
            .collect();
        if rejected.len() > limits.max_errors_listed {
            parts.push(format!(
                "and {} more",
                rejected.len() - limits.max_errors_listed
            ));
        }
        Status {
            code: 0,
            message: parts.join("; "),
            details: Vec::new(),
        }
    });
    DeltaDiscoveryRequest {
        type_url: type_url.to_string(),
        response_nonce: nonce,
        error_detail,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests;
