//! `ambit control`: a small control server for meshes without Kubernetes. It serves
//! ztunnel's delta xDS (`istio.workload.Address`, `istio.security.Authorization`) from YAML
//! files in the local-config schema, the waypoints' AuthorizationPolicies (attached by
//! `targetRefs`) from Kubernetes-shaped manifests as ambit's own
//! `ambit.waypoint.v1.AuthorizationPolicy` (to the clients that ask for it only), and
//! Istio's CA (`CreateCertificate`) from a plug-in CA directory, over one TLS port like
//! istiod's 15012.
//!
//! - [`session`]: the per-client delta xDS state machine (sans-IO);
//! - [`convert`]: the mesh model as xDS resources;
//! - [`mesh`]: the mesh directory (local config and manifests), merged;
//! - [`tokens`], [`ca_service`]: who may ask for which certificate;
//! - [`server`]: the sockets.
#![forbid(unsafe_code)]

mod ads;
pub mod bearer;
pub mod ca_service;
pub mod config;
pub mod convert;
pub mod kubernetes;
pub mod mesh;
mod reload;
pub mod server;
mod serving;
pub mod session;
mod shared;
pub mod tokens;

pub use config::{ControlConfig, ControlError, DEFAULT_LISTEN, DEFAULT_SERVING_NAME};
pub use server::Control;
pub use session::{Session, SessionLimits, Snapshot};
