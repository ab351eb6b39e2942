//! ambit's delta xDS client, generic over the resource types a process subscribes to;
//! the node proxy's two (`istio.workload.Address`, `istio.security.Authorization`) are
//! here too (the waypoint's own are `ambit-waypoint-xds`'s).
//!
//! - [`resource`]: what the client needs of one resource type ([`ResourceType`]);
//! - [`delta`]: the sans-IO delta ADS state machine over a set of types (requests,
//!   ACK/NACK, versions, readiness, limits, budgets);
//! - [`batch`]: the changes one response makes to its type's store;
//! - [`address`], [`authorization`]: the node proxy's types, into `ambit-state`'s
//!   `ProxyState`;
//! - [`convert`]: `istio.workload.Address` / `istio.security.Authorization` to the
//!   `ambit-state` model and back;
//! - [`node`]: the node id and metadata the proxy sends, from its environment;
//! - [`shape`]: limits on the shape of a resource body, checked on its encoded bytes
//!   before it is decoded (an allocation-free walk of the protobuf fields);
//! - [`held`]: the estimate of what a resource will hold once decoded, from its shape,
//!   for the delta client's budget per type;
//! - [`wire`]: an allocation-free walk of the fields of an encoded protobuf message;
//! - [`reject`]: why a resource is refused (the reasons a NACK carries);
//! - [`on_demand`]: on-demand xDS (`XDS_ON_DEMAND=true`): names asked for when a lookup
//!   misses, their bounds, and the handle the askers wait on;
//! - [`client`]: the IO driver over one gRPC bidi stream (an [`XdsTransport`], in the
//!   node proxy `ambit_grpc::GrpcChannel`), with ztunnel's reconnect backoff and metrics.
#![forbid(unsafe_code)]

pub mod address;
pub mod authorization;
pub mod batch;
pub mod client;
pub mod convert;
pub mod delta;
pub mod held;
pub mod limits;
pub mod node;
pub mod on_demand;
pub mod reject;
pub mod resource;
pub mod shape;
#[cfg(test)]
mod test_type;
pub mod wire;

pub use address::{AddressOp, Addresses};
pub use authorization::{AuthorizationOp, Authorizations};
pub use batch::{Batch, TypedBatch};
pub use client::{Backoff, PlainTransport, StreamEnd, XdsClient, XdsMetrics, XdsTransport};
pub use convert::{
    address_from_proto, authorization_from_proto, to_proto_address_service,
    to_proto_address_workload, to_proto_authorization, to_proto_service, to_proto_workload,
    AddressResource, ConvertError,
};
pub use delta::{
    DeltaClient, Handled, Limits, NodeConfig, NodeConfigError, MAX_HELD_ADDRESSES,
    MAX_HELD_PER_RESPONSE, MAX_HELD_POLICIES,
};
pub use on_demand::{FetchError, OnDemand, OnDemandConfig};
pub use reject::{Rejection, Undecodable};
pub use resource::{Decoded, Holds, Measured, Readiness, ResourceType, Slot};
pub use shape::{Limit, ShapeError};
pub use wire::WireError;
