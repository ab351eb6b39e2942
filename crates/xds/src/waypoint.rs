//! `ambit.waypoint.v1.AuthorizationPolicy` as a [`ResourceType`]: the AuthorizationPolicies
//! that attach to waypoints by `targetRefs`, as `ambit control` translated them from
//! Kubernetes-shaped manifests ([`ambit_manifests::WaypointPolicy`]), named
//! `namespace/name`, into a store of the waypoint's ([`WaypointPolicyStore`]).
//!
//! - [`wire`]: the model as the protobuf message and back, with every check a file's
//!   policy passes ([`manifest`]);
//! - [`manifest`]: a decoded policy written back as the AuthorizationPolicy that would say
//!   it and read again by `ambit_manifests`, so that what the wire carries is exactly what
//!   a file can say, refused with the field at fault otherwise;
//! - [`measure`]: the body's shape and its estimate, on the encoded bytes (and the rules'
//!   JSON walked without building anything) before anything is decoded.
//!
//! A waypoint subscribes to it beside [`crate::Addresses`]:
//! `DeltaClient::subscribing(node, limits).subscribe(Addresses { .. })
//! .subscribe(WaypointPolicies::default())`; each batch of this type is applied to the
//! waypoint's [`WaypointPolicyStore`] ([`crate::Batch::try_apply`] or
//! [`crate::Batch::downcast`]). Readiness waits for the first response, so a waypoint
//! holds no request until it has the control plane's policies (fail closed).

pub mod manifest;
pub mod measure;
pub mod wire;

use std::collections::BTreeMap;
use std::sync::Arc;

use ambit_manifests::WaypointPolicy;
use ambit_proto::ambit::waypoint::v1 as wp;
use ambit_proto::WAYPOINT_POLICY_TYPE;
use prost::Message;

use crate::reject::Rejection;
use crate::resource::{message_name, Decoded, Measured, ResourceType, Slot};

pub use wire::{to_proto_waypoint_policy, waypoint_policy_from_proto};

/// The default budget of the waypoint policies held, in estimated bytes: as the node
/// proxy's policies ([`crate::delta::MAX_HELD_POLICIES`]).
pub const MAX_HELD_WAYPOINT_POLICIES: u64 = crate::delta::MAX_HELD_POLICIES;

/// The subscription to `ambit.waypoint.v1.AuthorizationPolicy`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaypointPolicies {
    /// Estimated bytes the policies held may take.
    pub budget: u64,
    /// Istio's root namespace (MeshConfig `rootNamespace`), the only one whose policies
    /// may target a GatewayClass: the waypoint's own, as it would read a file with
    /// ([`ambit_manifests::ParseOptions::root_namespace`]).
    pub root_namespace: String,
}

impl Default for WaypointPolicies {
    fn default() -> Self {
        WaypointPolicies {
            budget: MAX_HELD_WAYPOINT_POLICIES,
            root_namespace: ambit_manifests::ParseOptions::default().root_namespace,
        }
    }
}

/// One change to the store of waypoint policies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WaypointPolicyOp {
    /// A policy accepted, to hold under `namespace/name` (shared with whoever reads the
    /// store).
    Put(Arc<WaypointPolicy>),
    /// A policy removed by `namespace/name`.
    Remove(String),
}

/// The waypoint's policies from xDS, by `namespace/name`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WaypointPolicyStore {
    policies: BTreeMap<String, Arc<WaypointPolicy>>,
}

impl WaypointPolicyStore {
    /// The policy of that `namespace/name`.
    pub fn get(&self, key: &str) -> Option<&Arc<WaypointPolicy>> {
        self.policies.get(key)
    }

    /// Every policy, in `namespace/name` order.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<WaypointPolicy>> + '_ {
        self.policies.values()
    }

    /// Every policy, in `namespace/name` order, shared (for a waypoint's policy set).
    pub fn to_vec(&self) -> Vec<Arc<WaypointPolicy>> {
        self.policies.values().cloned().collect()
    }

    pub fn len(&self) -> usize {
        self.policies.len()
    }

    pub fn is_empty(&self) -> bool {
        self.policies.is_empty()
    }
}

impl ResourceType for WaypointPolicies {
    const TYPE_URL: &'static str = WAYPOINT_POLICY_TYPE;
    type Op = WaypointPolicyOp;
    type Store = WaypointPolicyStore;

    fn budget(&self) -> u64 {
        self.budget
    }

    fn measure(&self, name: &str, body: &[u8]) -> Result<Measured, Rejection> {
        let estimate = measure::measure(body, name.len())?;
        Ok(Measured {
            estimate,
            slot: Slot::First,
        })
    }

    fn decode(&self, body: &[u8]) -> Result<Decoded<WaypointPolicyOp>, Rejection> {
        let p = wp::AuthorizationPolicy::decode(body)
            .map_err(|e| Rejection::decode(message_name(Self::TYPE_URL), e))?;
        let policy = waypoint_policy_from_proto(p, &self.root_namespace)?;
        Ok(Decoded {
            key: policy.authorization.key(),
            what: "policy namespace/name",
            op: WaypointPolicyOp::Put(Arc::new(policy)),
        })
    }

    fn removal(&self, name: String) -> WaypointPolicyOp {
        WaypointPolicyOp::Remove(name)
    }

    fn apply(ops: Vec<WaypointPolicyOp>, store: &mut WaypointPolicyStore) {
        for op in ops {
            match op {
                WaypointPolicyOp::Put(p) => {
                    store.policies.insert(p.authorization.key(), p);
                }
                WaypointPolicyOp::Remove(name) => {
                    store.policies.remove(&name);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
