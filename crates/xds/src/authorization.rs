//! `istio.security.Authorization` as a [`ResourceType`]: policies (named
//! `namespace/name`) into the node proxy's [`ProxyState`], their shape checked and their
//! size estimated on the encoded bytes ([`crate::shape`], [`crate::held`]), converted by
//! [`crate::convert`].

use ambit_proto::istio::security as psec;
use ambit_proto::AUTHORIZATION_TYPE;
use ambit_state::{Authorization, ProxyState};
use prost::Message;

use crate::convert;
use crate::held;
use crate::limits::MAX_HELD_POLICIES;
use crate::reject::Rejection;
use crate::resource::{message_name, Decoded, Measured, ResourceType, Slot};
use crate::shape;

/// The subscription to `istio.security.Authorization`, with its budget of estimated
/// bytes held ([`MAX_HELD_POLICIES`] by default).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Authorizations {
    pub budget: u64,
}

impl Default for Authorizations {
    fn default() -> Self {
        Authorizations {
            budget: MAX_HELD_POLICIES,
        }
    }
}

/// One change to the store of Authorization resources.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthorizationOp {
    Policy(Authorization),
    /// A policy removed by `namespace/name`.
    Remove(String),
}

impl ResourceType for Authorizations {
    const TYPE_URL: &'static str = AUTHORIZATION_TYPE;
    type Op = AuthorizationOp;
    type Store = ProxyState;

    fn budget(&self) -> u64 {
        self.budget
    }

    fn measure(&self, name: &str, body: &[u8]) -> Result<Measured, Rejection> {
        let counts = shape::measure_authorization(body)
            .map_err(|e| Rejection::shape(message_name(Self::TYPE_URL), e))?;
        Ok(Measured {
            estimate: held::estimate(&shape::Counts::Policy(counts), name.len()),
            slot: Slot::First,
        })
    }

    fn decode(&self, body: &[u8]) -> Result<Decoded<AuthorizationOp>, Rejection> {
        let a = psec::Authorization::decode(body)
            .map_err(|e| Rejection::decode(message_name(Self::TYPE_URL), e))?;
        let p = convert::authorization_from_proto(a)?;
        Ok(Decoded {
            key: p.key(),
            what: "policy namespace/name",
            op: AuthorizationOp::Policy(p),
        })
    }

    fn removal(&self, name: String) -> AuthorizationOp {
        AuthorizationOp::Remove(name)
    }

    fn apply(ops: Vec<AuthorizationOp>, state: &mut ProxyState) {
        for op in ops {
            match op {
                AuthorizationOp::Remove(name) => {
                    state.remove_policy(&name);
                }
                AuthorizationOp::Policy(p) => {
                    let key = p.key();
                    if let Err(reason) = state.insert_policy(p) {
                        tracing::warn!(resource = %key, %reason, "xDS resource refused by the store");
                    }
                }
            }
        }
    }
}
