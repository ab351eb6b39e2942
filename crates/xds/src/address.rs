//! `istio.workload.Address` as a [`ResourceType`]: workloads (named by uid) and services
//! (named `namespace/hostname`) into the node proxy's [`ProxyState`], their shape checked
//! and their size estimated on the encoded bytes ([`crate::shape`], [`crate::held`]),
//! converted by [`crate::convert`].

use ambit_proto::istio::workload as pw;
use ambit_proto::ADDRESS_TYPE;
use ambit_state::{ProxyState, Service, Workload};
use prost::Message;

use crate::convert::{self, AddressResource};
use crate::held;
use crate::limits::MAX_HELD_ADDRESSES;
use crate::reject::Rejection;
use crate::resource::{message_name, Decoded, Holds, Measured, ResourceType, Slot};
use crate::shape;

/// The subscription to `istio.workload.Address`, with its budget of estimated bytes
/// held ([`MAX_HELD_ADDRESSES`] by default).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Addresses {
    pub budget: u64,
}

impl Default for Addresses {
    fn default() -> Self {
        Addresses {
            budget: MAX_HELD_ADDRESSES,
        }
    }
}

/// One change to the store of Address resources.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AddressOp {
    Workload(Box<Workload>),
    Service(Box<Service>),
    /// A name removed (see [`Addresses::apply`](ResourceType::apply)).
    Remove(String),
}

/// A name that a service could have: `namespace/hostname`, no `/` in the hostname.
fn is_service_key(name: &str) -> bool {
    name.split_once('/')
        .is_some_and(|(_, host)| !host.contains('/'))
}

impl ResourceType for Addresses {
    const TYPE_URL: &'static str = ADDRESS_TYPE;
    type Op = AddressOp;
    type Store = ProxyState;

    fn budget(&self) -> u64 {
        self.budget
    }

    fn measure(&self, name: &str, body: &[u8]) -> Result<Measured, Rejection> {
        let counts = shape::measure_address(body)
            .map_err(|e| Rejection::shape(message_name(Self::TYPE_URL), e))?;
        let slot = match counts {
            shape::Counts::Service(_) => Slot::Second,
            _ => Slot::First,
        };
        Ok(Measured {
            estimate: held::estimate(&counts, name.len()),
            slot,
        })
    }

    fn decode(&self, body: &[u8]) -> Result<Decoded<AddressOp>, Rejection> {
        let a = pw::Address::decode(body)
            .map_err(|e| Rejection::decode(message_name(Self::TYPE_URL), e))?;
        Ok(match convert::address_from_proto(a)? {
            AddressResource::Workload(w) => Decoded {
                key: w.uid.to_string(),
                what: "workload uid",
                op: AddressOp::Workload(w),
            },
            AddressResource::Service(s) => Decoded {
                key: s.key(),
                what: "service namespace/hostname",
                op: AddressOp::Service(s),
            },
        })
    }

    fn removal(&self, name: String) -> AddressOp {
        AddressOp::Remove(name)
    }

    /// The workload of that uid; else the service of that `namespace/hostname`.
    fn frees(&self, name: &str, holds: Holds) -> Option<Slot> {
        if holds.first {
            Some(Slot::First)
        } else if is_service_key(name) {
            Some(Slot::Second)
        } else {
            None
        }
    }

    /// A removal follows ztunnel: the name is first tried as a workload uid; else, split
    /// at the first `/` as `namespace/hostname`, it names a service unless the hostname
    /// part still holds a `/` (then it was a workload uid we did not have).
    fn apply(ops: Vec<AddressOp>, state: &mut ProxyState) {
        for op in ops {
            let refused = match op {
                AddressOp::Remove(name) => {
                    if state.remove_workload(&name).is_none() && is_service_key(&name) {
                        state.remove_service(&name);
                    }
                    None
                }
                // The name for the log is made only for a refusal: a sync applies every
                // resource here, and shared names cost a reference count to keep.
                AddressOp::Workload(w) => {
                    let uid = w.uid.clone();
                    state
                        .insert_workload(*w)
                        .err()
                        .map(|e| (uid.to_string(), e))
                }
                AddressOp::Service(s) => {
                    let (ns, host) = (s.namespace.clone(), s.hostname.clone());
                    state
                        .insert_service(*s)
                        .err()
                        .map(|e| (format!("{ns}/{host}"), e))
                }
            };
            if let Some((name, reason)) = refused {
                tracing::warn!(resource = %name, %reason, "xDS resource refused by the store");
            }
        }
    }
}
