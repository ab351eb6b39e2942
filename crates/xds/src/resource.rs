//! What the delta client needs of one resource type to subscribe to it: a
//! [`ResourceType`] checks and measures a resource's encoded body, decodes it into a
//! change to its store, applies a batch of changes, and says whether the process waits
//! for it to be ready. The client does the rest alike for every type (names, versions,
//! the budget, removals, ACK/NACK, readiness), so a process subscribes to its set of types
//! with no copy of the client: the node proxy to [`crate::Addresses`] and
//! [`crate::Authorizations`], a waypoint to addresses and a type of its own.

use std::fmt;

use crate::reject::Rejection;

/// One resource type a [`crate::DeltaClient`] subscribes to.
///
/// The client calls, per resource of a response of [`ResourceType::TYPE_URL`]:
/// [`measure`](ResourceType::measure) on the encoded body (before anything is decoded,
/// so that its shape is bounded and what it will hold counts against
/// [`budget`](ResourceType::budget)), then [`decode`](ResourceType::decode) on the bodies
/// of a response within the budget; per removed name, [`removal`](ResourceType::removal).
/// What a response changes goes to the store in one batch ([`ResourceType::apply`]).
pub trait ResourceType: Send + 'static {
    /// The type URL subscribed to; every resource's payload must carry it too. Errors name
    /// the message by its last segment (`istio.workload.Address`).
    const TYPE_URL: &'static str;
    /// One change to the store: a resource accepted, or a name removed.
    type Op: fmt::Debug + Clone + PartialEq + Send + 'static;
    /// Where the changes go.
    type Store: 'static;

    /// The estimated bytes the resources of this type may hold at once (what
    /// [`measure`](ResourceType::measure) estimates, summed over the names held). A
    /// response that would take them over is refused whole.
    fn budget(&self) -> u64;

    /// Checks the encoded `body` of a resource named `name` before it is decoded (its
    /// shape: entries of repeated fields, bytes of strings; see [`crate::shape`]) and
    /// estimates what it will hold once decoded and in the store, the name (as the
    /// store's key) included. Errs on the safe side: never below what it holds.
    fn measure(&self, name: &str, body: &[u8]) -> Result<Measured, Rejection>;

    /// Decodes and converts a body that [`measure`](ResourceType::measure) accepted,
    /// with the name its body gives the object (the client refuses a body that names
    /// another object than its resource name, so that a removal by name always removes
    /// what was announced).
    fn decode(&self, body: &[u8]) -> Result<Decoded<Self::Op>, Rejection>;

    /// The change that removes the resource `name`.
    fn removal(&self, name: String) -> Self::Op;

    /// Which of what `name` holds its removal frees, as [`ResourceType::apply`] removes
    /// it. Most types hold one object per name, freed whole.
    fn frees(&self, name: &str, holds: Holds) -> Option<Slot> {
        let _ = (name, holds);
        Some(Slot::First)
    }

    /// Applies the changes of one response to the store, in order, at once. They were
    /// checked when they were made, so the store should refuse none; one it does refuse
    /// is the type's to log and skip.
    fn apply(ops: Vec<Self::Op>, store: &mut Self::Store);

    /// What readiness waits for of this type.
    fn readiness(&self) -> Readiness {
        Readiness::FirstResponse
    }
}

/// The estimate of one resource, before it is decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Measured {
    /// Estimated bytes held once decoded and stored.
    pub estimate: u64,
    /// What of its name it fills.
    pub slot: Slot,
}

/// Which of the (at most two) objects a resource name holds in its store. Most types
/// hold one per name, in [`Slot::First`]; an `istio.workload.Address` name can be a
/// workload uid and a service key at once, and the store then holds both (the service in
/// [`Slot::Second`]), so that each is counted and freed apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    First,
    Second,
}

/// What a resource name holds now, by slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holds {
    pub first: bool,
    pub second: bool,
}

/// A body decoded and converted.
#[derive(Debug, Clone, PartialEq)]
pub struct Decoded<Op> {
    /// The change it makes.
    pub op: Op,
    /// The name its body gives the object (its store key): must be the resource name.
    pub key: String,
    /// What that name is, for the refusal of one that is not (`workload uid`).
    pub what: &'static str,
}

/// What the client waits for of a type before it is ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readiness {
    /// A response of the type applied and answered (ACK or NACK) once: the type's store
    /// holds what the control plane had when it answered.
    FirstResponse,
    /// Nothing: the process does not wait for this type.
    NotAwaited,
}

/// The message name of a type URL: its last segment (`istio.workload.Address`).
pub fn message_name(type_url: &'static str) -> &'static str {
    type_url.rsplit('/').next().unwrap_or(type_url)
}
