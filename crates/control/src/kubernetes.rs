//! `ambit control --kubernetes`: the waypoints' L7 configuration from the API server.
//!
//! - [`objects`]: the objects read, each kept at its last accepted version (sans IO);
//! - [`waypoints`]: which service accounts run a waypoint Gateway (sans IO);
//! - [`review`]: who a token belongs to (TokenReview), cached and bounded;
//! - [`watch`]: the watches, and what is served rebuilt from them;
//! - [`events`]: a Warning Event on each refused object version;
//! - `serve`: the server, its gatekeeper and its certificate from the mesh CA.

pub mod events;
pub mod objects;
pub mod review;
mod serve;
pub mod watch;
pub mod waypoints;

use std::sync::atomic::AtomicBool;
use std::sync::Mutex;

/// What the gatekeeper and the watches share.
pub(crate) struct KubeShared {
    pub(crate) reviewer: review::Reviewer,
    pub(crate) waypoints: Mutex<waypoints::Waypoints>,
    pub(crate) synced: AtomicBool,
}
