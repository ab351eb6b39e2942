//! ambit's delta xDS client for the node proxy.
//!
//! - [`convert`]: `istio.workload.Address` / `istio.security.Authorization` to the
//!   `ambit-state` model and back;
//! - [`node`]: the node id and metadata the proxy sends, from its environment;
//! - [`delta`]: the sans-IO delta ADS state machine (requests, ACK/NACK, versions,
//!   readiness, limits);
//! - [`shape`]: limits on the shape of a resource body, checked on its encoded bytes
//!   before it is decoded (an allocation-free walk of the protobuf fields);
//! - [`held`]: the estimate of what a resource will hold once decoded, from its shape,
//!   for the delta client's budget per type;
//! - [`reject`]: why a resource is refused (the reasons a NACK carries);
//! - [`client`]: the IO driver over one gRPC bidi stream (an [`XdsTransport`], in the
//!   node proxy `ambit_grpc::GrpcChannel`), with ztunnel's reconnect backoff and metrics.
#![forbid(unsafe_code)]

pub mod client;
pub mod convert;
pub mod delta;
#[doc(hidden)]
pub mod fuzzing;
pub mod held;
pub mod node;
pub mod reject;
pub mod shape;
mod wire;

pub use client::{Backoff, PlainTransport, StreamEnd, XdsClient, XdsMetrics, XdsTransport};
pub use convert::{
    address_from_proto, authorization_from_proto, to_proto_address_service,
    to_proto_address_workload, to_proto_authorization, to_proto_service, to_proto_workload,
    AddressResource, ConvertError,
};
pub use delta::{
    Batch, DeltaClient, Handled, Limits, NodeConfig, NodeConfigError, Op, MAX_HELD_ADDRESSES,
    MAX_HELD_PER_RESPONSE, MAX_HELD_POLICIES,
};
pub use reject::Rejection;
pub use shape::{Limit, ShapeError};
pub use wire::WireError;
