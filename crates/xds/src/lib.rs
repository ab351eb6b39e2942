//! ambit's delta xDS client for the node proxy.
//!
//! - [`convert`]: `istio.workload.Address` / `istio.security.Authorization` to the
//!   `ambit-state` model and back;
//! - [`delta`]: the sans-IO delta ADS state machine (requests, ACK/NACK, versions,
//!   readiness, limits);
//! - [`client`]: the IO driver over one gRPC bidi stream (an [`XdsTransport`], in the
//!   node proxy `ambit_grpc::GrpcChannel`), with ztunnel's reconnect backoff and metrics.
#![forbid(unsafe_code)]

pub mod client;
pub mod convert;
pub mod delta;
#[doc(hidden)]
pub mod fuzzing;

pub use client::{Backoff, PlainTransport, StreamEnd, XdsClient, XdsMetrics, XdsTransport};
pub use convert::{
    address_from_proto, authorization_from_proto, to_proto_address_service,
    to_proto_address_workload, to_proto_authorization, to_proto_service, to_proto_workload,
    AddressResource, ConvertError,
};
pub use delta::{Batch, DeltaClient, Handled, Limits, NodeConfig, NodeConfigError, Op};
