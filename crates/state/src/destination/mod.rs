//! Where a connection goes in the mesh, and how: the node proxy's outbound plan
//! (`ambit_nodeproxy::decide::outbound`) and the waypoint's balancing are built on it.
//!
//! - [`types`]: the connection to decide, the route, the refusal;
//! - [`plan`]: the decision ([`plan::route`]): a service VIP, a workload, a waypoint, or
//!   passthrough;
//! - [`pick`]: an endpoint of a service, by health, network, port, locality and capacity;
//! - [`waypoint`]: a waypoint address resolved to its pod, and the "sandwich" check.

pub mod pick;
pub mod plan;
pub mod types;
pub mod waypoint;
