//! The mesh model of ambit's proxies: workloads, services and authorization policies,
//! loaded from ztunnel's local configuration YAML (`LOCAL_XDS_PATH` / `LOCAL_XDS`), kept in
//! a [`ProxyState`] store with the lookups the data path needs, the outbound routing
//! decision ([`route()`]), and RBAC: of connections on their L4 fields for the node proxy
//! ([`ProxyState::authorize`]), and of HTTP requests on every field for the waypoint
//! ([`authorize_request`], after [`normalize_path`]).
//!
//! Sans-IO: nothing here opens a socket, reads a file or looks at the clock.
#![forbid(unsafe_code)]

mod addr;
mod destination;
mod dump;
mod error;
mod ident;
mod local;
mod local_config;
mod local_file;
mod local_schema;
pub mod locate;
mod name;
mod names;
mod policy;
mod ports;
mod rbac;
mod request_path;
mod service;
mod store;
mod workload;

pub use addr::{ip_from_bytes, parse_ip, AddressError, NamespacedHostname, NetworkAddress};
pub use destination::pick::{
    endpoint_candidates, has_hostname_endpoints, hostname_candidates, pick_endpoint,
    pick_waypoint_endpoint, weighted_index, PickMode, Picked,
};
pub use destination::plan::route;
pub use destination::types::{Route, RouteError, RouteInput};
pub use destination::waypoint::{
    is_from_waypoint, is_waypoint_for, names_waypoint, resolve_waypoint, ResolvedWaypoint,
};
pub use error::{ConfigError, UnknownPolicy};
pub use local::{load_local_config, KeptVersion, LocalLoad, RejectedPolicy};
pub use local_config::LocalConfig;
pub use local_file::LocalFile;
pub use local_schema::parse_local_config;
pub use name::Name;
pub use policy::{
    parse_host, parse_method, parse_request_principal, values, Authorization, Clause, Condition,
    HeaderMatch, IpBlock, IpKey, L7Attributes, PathMatch, PathSegment, PathTemplate, PolicyAction,
    PolicyScope, RbacMatch, Rule, ServiceAccountMatch, StringMatch, TextKey, Values, L7_ATTRIBUTES,
};
pub use ports::{PortMap, ServicePorts, SortedMap};
pub use rbac::{
    authorize_observed, authorize_request, matches as policy_matches, Allowed, Denied, MatchedRule,
    RbacContext, RbacObserver, RequestAttributes, RequestAuth, Unobserved,
};
pub use request_path::{normalize_path, Normalized, PathError, PathNormalization};
pub use service::{
    AppProtocol, IpFamilies, LoadBalancer, LoadBalancerHealthPolicy, LoadBalancerMode,
    LoadBalancerScope, Service, Visibility,
};
pub use store::{AddressTarget, Endpoint, ProxyState};
pub use workload::{
    check_gateway, AppTunnelProtocol, ApplicationTunnel, GatewayAddress, GatewayDestination,
    HealthStatus, Locality, NetworkMode, TunnelProtocol, Workload, DEFAULT_CLUSTER_ID,
    DEFAULT_HBONE_PORT, DEFAULT_SERVICE_ACCOUNT, DEFAULT_TRUST_DOMAIN, DEFAULT_WORKLOAD_TYPE,
};
