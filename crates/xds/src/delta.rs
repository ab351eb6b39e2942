//! The delta ADS protocol of ztunnel's xDS client, sans-IO: the initial requests, the
//! handling of each `DeltaDiscoveryResponse` into one [`Batch`] for its type's store plus
//! the ACK/NACK to send, resource versions kept across streams, and readiness.
//!
//! The client serves the set of types it is given, each a [`ResourceType`] (its checks
//! and decoding, its store, its budget, its readiness): the node proxy subscribes to
//! [`Addresses`] and [`Authorizations`] ([`DeltaClient::node_proxy`]); another process
//! to its own set ([`DeltaClient::subscribing`], then [`DeltaClient::subscribe`]).
//! Everything below holds per type, the same for every type.
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
//! - a resource body that breaks a limit on its shape (for Address and Authorization
//!   those of [`crate::shape`]: entries of a repeated field, bytes of a string), checked
//!   on its encoded bytes before it is decoded ([`ResourceType::measure`]; rejected);
//! - a resource whose body describes another object than its name ([`crate::Decoded::key`]): a
//!   workload is named by its uid, a service by `namespace/hostname`, a policy by
//!   `namespace/name` (rejected, so that a removal by name always removes what was
//!   announced);
//! - a new resource name when 1,000,000 are already tracked for its type (rejected);
//! - a response that would take what is held for its type over the type's budget of
//!   estimated bytes once decoded ([`ResourceType::budget`]: [`MAX_HELD_ADDRESSES`],
//!   [`MAX_HELD_POLICIES`]), or whose resources alone would take more than
//!   [`MAX_HELD_PER_RESPONSE`], refused whole: nothing applied, NACKed with the estimate
//!   and the budget;
//! - NACK messages list at most 64 rejections, each cut at 512 bytes, then count the rest.
//!
//! # The budget
//!
//! The limits on one resource's shape bound what one resource holds, not what many do:
//! 488 policies of 4,096 empty matches each (4 MB on the wire) held 1.39 GB. So the
//! client estimates what each resource will hold once decoded, converted and in the store
//! ([`ResourceType::measure`]; for Address and Authorization [`crate::held`], from the
//! counts of its shape walk, before decoding it), keeps the sum of what is held per
//! type, and refuses a response that would take the sum over the type's budget (what is
//! held, plus what the response adds, less what it replaces or removes). The check runs
//! twice: on the estimates before anything is decoded (so such a response is never
//! decoded), and once the resources are converted, on what is accepted (a replacement
//! that fails to convert frees nothing). A response over the budget is
//! not applied at all (a bad resource alone is still rejected alone, the rest applying),
//! so what is held never passes the budget; while a response is handled the proxy holds
//! at most the budget plus [`MAX_HELD_PER_RESPONSE`], in estimated bytes.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use ambit_proto::{DeltaDiscoveryRequest, DeltaDiscoveryResponse, Node, Status};

use crate::address::Addresses;
use crate::authorization::Authorizations;
use crate::batch::Batch;
use crate::on_demand::{Admit, Book};
use crate::reject::Rejection;
use crate::resource::{Readiness, ResourceType};
use crate::shape;

pub use crate::node::{NodeConfig, NodeConfigError};

mod subscription;

use subscription::{Outcome, Subscribed, Subscription};

pub use crate::limits::{Limits, MAX_HELD_ADDRESSES, MAX_HELD_PER_RESPONSE, MAX_HELD_POLICIES};

// ----- the state machine ----------------------------------------------------------------

/// What handling one response produced.
#[derive(Debug, Clone, PartialEq)]
pub struct Handled {
    /// The response's type URL.
    pub type_url: String,
    /// False for a type this client did not subscribe to (ACKed, nothing applied).
    pub known_type: bool,
    /// The changes to apply to the type's store.
    pub batch: Batch,
    /// The ACK, or the NACK when `rejected` is not empty.
    pub reply: DeltaDiscoveryRequest,
    /// `(resource name, reason)` of each rejected resource (`response` for a response
    /// refused whole).
    pub rejected: Vec<(String, Rejection)>,
    /// Sum of the resources' payload bytes (the `istio_xds_message_bytes` metric).
    pub payload_bytes: u64,
    /// On-demand names this response answers, each with the resource that answered it
    /// (`None`: removed); to tell the book once the batch is applied.
    pub answers: Vec<(String, Option<String>)>,
}

/// One subscribed type and what was answered of it.
#[derive(Debug)]
struct Type {
    state: Box<dyn Subscribed>,
    /// A response of this type was answered (ACK or NACK) at least once.
    answered: bool,
    /// On demand: subscribed to no name but those of the book (and never awaited).
    on_demand: Option<Arc<Mutex<Book>>>,
}

fn lock_book(book: &Mutex<Book>) -> std::sync::MutexGuard<'_, Book> {
    book.lock().unwrap_or_else(|p| p.into_inner())
}

impl Type {
    fn is_ready(&self) -> bool {
        if self.on_demand.is_some() {
            // ztunnel's readiness waits only on the types not on demand.
            return true;
        }
        match self.state.readiness() {
            Readiness::FirstResponse => self.answered,
            Readiness::NotAwaited => true,
        }
    }
}

/// The delta ADS client state, per subscribed type: what was accepted (for
/// `initial_resource_versions`), what it holds (for the budget) and what was answered
/// (for readiness). Kept across streams.
#[derive(Debug)]
pub struct DeltaClient {
    node: Node,
    limits: Limits,
    types: Vec<Type>,
}

impl DeltaClient {
    /// The node proxy's client ([`DeltaClient::node_proxy`]) with the default limits.
    pub fn new(node: Node) -> Self {
        Self::node_proxy(node, Limits::default())
    }

    /// The node proxy's client ([`DeltaClient::node_proxy`]).
    pub fn with_limits(node: Node, limits: Limits) -> Self {
        Self::node_proxy(node, limits)
    }

    /// The node proxy's client: wildcard subscriptions to [`Addresses`] and
    /// [`Authorizations`], with the budgets of `limits`.
    pub fn node_proxy(node: Node, limits: Limits) -> Self {
        Self::subscribing(node, limits)
            .subscribe(Addresses {
                budget: limits.max_held_addresses,
            })
            .subscribe(Authorizations {
                budget: limits.max_held_policies,
            })
    }

    /// A client of no type yet: add each with [`DeltaClient::subscribe`].
    pub fn subscribing(node: Node, limits: Limits) -> Self {
        DeltaClient {
            node,
            limits,
            types: Vec::new(),
        }
    }

    /// Adds a wildcard subscription to `ty`; its initial request follows those of the
    /// types added before.
    ///
    /// # Panics
    ///
    /// If a type of that URL was added already (two stores for one type URL is a
    /// mistake of the process's wiring).
    pub fn subscribe<T: ResourceType>(mut self, ty: T) -> Self {
        assert!(
            self.find(T::TYPE_URL).is_none(),
            "{} subscribed twice",
            T::TYPE_URL
        );
        self.types.push(Type {
            state: Box::new(Subscription::new(ty)),
            answered: false,
            on_demand: None,
        });
        self
    }

    /// Puts the subscribed type `type_url` on demand (`XDS_ON_DEMAND=true`): its initial
    /// request subscribes to nothing (`*` subscribed and unsubscribed at once) but the
    /// names of `book`, readiness does not wait for it, and a response's resources are
    /// kept only if they answer a name asked for, are already held, or are dependents
    /// within the book's bound ([`Book::admit`]).
    ///
    /// # Panics
    ///
    /// If `type_url` was not subscribed (a wiring mistake).
    pub fn with_on_demand(mut self, type_url: &str, book: Arc<Mutex<Book>>) -> Self {
        let i = self
            .find(type_url)
            .unwrap_or_else(|| panic!("{type_url} put on demand but not subscribed"));
        self.types[i].on_demand = Some(book);
        self
    }

    /// Whether `type_url` is on demand.
    pub fn is_on_demand(&self, type_url: &str) -> bool {
        self.find(type_url)
            .is_some_and(|i| self.types[i].on_demand.is_some())
    }

    /// Stops tracking `names` of `type_url` (on-demand names unused for a while): the
    /// batch that removes them from the store.
    pub fn forget(&mut self, type_url: &str, names: Vec<String>) -> Batch {
        match self.find(type_url) {
            Some(i) => self.types[i].state.forget(names),
            None => Batch::default(),
        }
    }

    fn find(&self, type_url: &str) -> Option<usize> {
        self.types
            .iter()
            .position(|t| t.state.type_url() == type_url)
    }

    /// The requests to send first on every stream: one wildcard subscription per type,
    /// with the node and the versions of the resources accepted so far.
    ///
    /// A type on demand subscribes `*` and unsubscribes `*` in the same request (ztunnel's
    /// "subscribe to nothing"), and reports the names asked for but not held with an
    /// empty version, so that the server answers them again; a request after all the
    /// others then unsubscribes the resources it holds under names it did not ask by.
    pub fn initial_requests(&self) -> Vec<DeltaDiscoveryRequest> {
        let mut followups = Vec::new();
        let mut out: Vec<DeltaDiscoveryRequest> = self
            .types
            .iter()
            .map(|t| {
                let mut versions = t.state.initial_versions();
                let (subscribe, unsubscribe) = match &t.on_demand {
                    None => (Vec::new(), Vec::new()),
                    Some(book) => {
                        let asked = lock_book(book).initial_names();
                        // The server takes every name reported as subscribed (as istiod
                        // does); held resources no name was asked by (those an alias
                        // resolved to, dependents) are unsubscribed at once, so that
                        // they stay only as long as an asked name brings them. (`asked` is
                        // sorted: the book keeps its names in order.)
                        let mut implied: Vec<String> = versions
                            .keys()
                            .filter(|n| asked.binary_search(n).is_err())
                            .cloned()
                            .collect();
                        implied.sort_unstable();
                        if !implied.is_empty() {
                            followups.push(DeltaDiscoveryRequest {
                                type_url: t.state.type_url().to_string(),
                                resource_names_unsubscribe: implied,
                                ..Default::default()
                            });
                        }
                        for name in asked {
                            versions.entry(name).or_default();
                        }
                        (vec!["*".to_string()], vec!["*".to_string()])
                    }
                };
                DeltaDiscoveryRequest {
                    node: Some(self.node.clone()),
                    type_url: t.state.type_url().to_string(),
                    initial_resource_versions: versions,
                    resource_names_subscribe: subscribe,
                    resource_names_unsubscribe: unsubscribe,
                    ..Default::default()
                }
            })
            .collect();
        out.extend(followups);
        out
    }

    /// True once every type is ready ([`ResourceType::readiness`]): by default, once a
    /// response of the type was answered ([`DeltaClient::answered`]).
    pub fn is_ready(&self) -> bool {
        self.types.iter().all(Type::is_ready)
    }

    /// Records that the reply to a response of `type_url` was sent. Returns true if that
    /// made the client ready just now.
    pub fn answered(&mut self, type_url: &str) -> bool {
        let was = self.is_ready();
        if let Some(i) = self.find(type_url) {
            self.types[i].answered = true;
        }
        !was && self.is_ready()
    }

    /// Accepted resources of a type (name → version).
    pub fn versions(&self, type_url: &str) -> Option<BTreeMap<&str, &str>> {
        Some(self.types[self.find(type_url)?].state.versions())
    }

    /// The estimated bytes held for a type, what its budget bounds.
    pub fn held(&self, type_url: &str) -> Option<u64> {
        Some(self.types[self.find(type_url)?].state.held())
    }

    /// Decodes `bytes` as a `DeltaDiscoveryResponse` and handles it. The entries of its
    /// repeated fields are counted on the bytes first: a response over
    /// [`Limits::max_per_response`] is NACKed whole from its type and nonce alone, without
    /// decoding the rest (an empty resource is 2 bytes on the wire and ~150 once decoded).
    pub fn handle_bytes(&mut self, bytes: &[u8]) -> Result<Handled, prost::DecodeError> {
        use prost::Message as _;
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

    /// The answer to a response of a type we did not ask for: ACKed, nothing applied.
    fn unknown(&self, type_url: String, nonce: String, payload_bytes: u64) -> Handled {
        Handled {
            reply: reply(&type_url, nonce, &[], &self.limits),
            type_url,
            known_type: false,
            batch: Batch::default(),
            rejected: Vec::new(),
            payload_bytes,
            answers: Vec::new(),
        }
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
        if self.find(&type_url).is_none() {
            return self.unknown(type_url, nonce, payload_bytes);
        }
        tracing::warn!(
            type_url,
            reason = %why,
            "xDS response refused whole (NACK)"
        );
        let rejected = vec![("response".to_string(), why)];
        Handled {
            reply: reply(&type_url, nonce, &rejected, &self.limits),
            type_url,
            known_type: true,
            batch: Batch::default(),
            rejected,
            payload_bytes,
            answers: Vec::new(),
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
        let Some(i) = self.find(&resp.type_url) else {
            tracing::info!(type_url = %cut(&resp.type_url, 256), "xDS response of a type we did not ask for: ACKed and ignored");
            return self.unknown(resp.type_url, resp.nonce, payload_bytes);
        };
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
        let mut resources = resp.resources;
        let mut answers = Vec::new();
        if let Some(book) = &self.types[i].on_demand {
            let mut book = lock_book(book);
            let state = &self.types[i].state;
            resources.retain(|r| {
                let asked = book.asked_by(&r.name, &r.aliases);
                if !asked.is_empty() {
                    answers.extend(asked.into_iter().map(|a| (a, Some(r.name.clone()))));
                    return true;
                }
                state.is_tracked(&r.name) || book.admit(&r.name, &r.aliases) == Admit::Dependent
            });
            for name in &resp.removed_resources {
                if let Some(asked) = book.removal_answers(name) {
                    answers.push((asked, None));
                }
            }
        }
        let outcome = self.types[i]
            .state
            .handle(resources, resp.removed_resources, &limits);
        let (batch, rejected) = match outcome {
            Outcome::Refused(why) => {
                return self.refuse_whole(resp.type_url, resp.nonce, why, payload_bytes)
            }
            Outcome::Applied { batch, rejected } => (batch, rejected),
        };
        if !rejected.is_empty() {
            tracing::warn!(
                type_url = resp.type_url,
                rejected = rejected.len(),
                first = %format!("{}: {}", cut(&rejected[0].0, 256), cut(&rejected[0].1.to_string(), 512)),
                "xDS resources rejected (NACK); the rest of the response applies"
            );
        }
        Handled {
            reply: reply(&resp.type_url, resp.nonce, &rejected, &limits),
            type_url: resp.type_url,
            known_type: true,
            batch,
            rejected,
            payload_bytes,
            answers,
        }
    }
}

/// At most `max` bytes of `s`, cut at a character boundary.
fn cut(s: &str, max: usize) -> &str {
    &s[..s.floor_char_boundary(max)]
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
