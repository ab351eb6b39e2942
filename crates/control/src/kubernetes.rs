//! `ambit control --kubernetes`: the waypoints' L7 configuration from the API server.
//!
//! - [`objects`]: the objects read, each kept at its last accepted version (sans IO).

pub mod objects;
