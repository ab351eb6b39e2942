//! Gateway API routes in mesh (GAMMA) mode for the waypoint: HTTPRoute and GRPCRoute
//! attached to Services (`parentRefs` of kind Service, with or without a port).
//!
//! - [`model`]: the routes as held, translated once by `ambit-manifests` (defaults filled,
//!   regular expressions compiled and bounded, GRPCRoute's service and method made a path).
//! - [`RouteTable::select`]: the rule for a request, by the frontend the client dialled
//!   (Service and port, not `Host`) and the specification's precedence; or no route
//!   attached (the default route), or none matching (404).
//! - [`Rule::action`]: redirect, or the backend picked by weight from a random number
//!   given (so it is testable), or why the answer is 500.
//! - [`replace_prefix`], [`parse_duration`], [`grpc_path_match`]: the specification's
//!   path prefix rewriting, duration format and gRPC match mapping.
//! - [`apply_headers`], [`redirect_location`], [`modified_path`]: what a rule's header
//!   modifiers, redirect and rewrite make of a request.
//!
//! - [`status`]: per Service and port, the routes used in evaluation order and what is
//!   refused and why, for `/config_dump` and the control server's log.
//!
//! Sans-IO: no sockets, no clocks, no randomness of its own.
#![forbid(unsafe_code)]

mod apply;
mod backend;
mod cors;
mod duration;
mod grpc;
pub mod model;
mod path;
mod pattern;
mod select;
mod status;

pub use apply::{apply_headers, modified_path, redirect_location, RedirectSource};
pub use backend::{pick, Action, Failure};
pub use cors::{Cors, CorsAction, OriginPattern, DEFAULT_MAX_AGE};
pub use duration::parse_duration;
pub use grpc::{grpc_path_match, GrpcMatchError, GrpcMatchType};
pub use model::*;
pub use path::{normalize_prefix, prefix_matches, replace_prefix};
pub use pattern::{Pattern, PatternError, MAX_COMPILED_BYTES, MAX_PATTERN_CHARS};
pub use select::{matches, Matched, Refusal, Request, RouteTable, Selection};
pub use status::{status, FrontendStatus};

#[cfg(test)]
mod tests;
