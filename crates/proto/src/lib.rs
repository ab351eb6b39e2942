//! Protobuf types of the wires ambit shares with Istio: the `istio.workload.Address` and
//! `istio.security.Authorization` xDS resources, the delta aggregated discovery service of
//! `envoy.service.discovery.v3` (with `envoy.config.core.v3.Node` and `google.rpc.Status`),
//! and the `istio.v1.auth` certificate service; and ambit's own xDS resource for its
//! waypoints, `ambit.waypoint.v1.AuthorizationPolicy`.
//!
//! The `.proto` files in `proto/` are ambit's own, written from the field tables in our
//! reference notes; package, message and field names and numbers are Istio's and Envoy's
//! (`ambit/waypoint/v1/policy.proto` is ambit's alone, with the reasons for its form).
//! Code is generated at build time by prost and tonic from descriptors compiled by protox,
//! so no system `protoc` is needed.
#![forbid(unsafe_code)]
#![allow(clippy::all, missing_docs)]

pub mod istio {
    pub mod workload {
        include!(concat!(env!("OUT_DIR"), "/istio.workload.rs"));
    }
    pub mod security {
        include!(concat!(env!("OUT_DIR"), "/istio.security.rs"));
    }
    pub mod v1 {
        pub mod auth {
            include!(concat!(env!("OUT_DIR"), "/istio.v1.auth.rs"));
        }
    }
}

pub mod envoy {
    pub mod config {
        pub mod core {
            pub mod v3 {
                include!(concat!(env!("OUT_DIR"), "/envoy.config.core.v3.rs"));
            }
        }
    }
    pub mod service {
        pub mod discovery {
            pub mod v3 {
                include!(concat!(env!("OUT_DIR"), "/envoy.service.discovery.v3.rs"));
            }
        }
    }
}

pub mod ambit {
    pub mod waypoint {
        pub mod v1 {
            include!(concat!(env!("OUT_DIR"), "/ambit.waypoint.v1.rs"));
        }
    }
}

pub mod google {
    pub mod rpc {
        include!(concat!(env!("OUT_DIR"), "/google.rpc.rs"));
    }
}

pub use envoy::config::core::v3::Node;
pub use envoy::service::discovery::v3::{DeltaDiscoveryRequest, DeltaDiscoveryResponse, Resource};
pub use google::rpc::Status;
pub use istio::security::Authorization;
pub use istio::v1::auth::{IstioCertificateRequest, IstioCertificateResponse};
pub use istio::workload::{Address, Service, Workload};

/// Type URL of the workload/service resource.
pub const ADDRESS_TYPE: &str = "type.googleapis.com/istio.workload.Address";
/// Type URL of the L4 authorization policy resource.
pub const AUTHORIZATION_TYPE: &str = "type.googleapis.com/istio.security.Authorization";
/// Type URL of ambit's own resource for its waypoints: one AuthorizationPolicy attached by
/// `targetRefs`, as written (`ambit.waypoint.v1.AuthorizationPolicy`, named
/// `AuthorizationPolicy/<namespace>/<name>`). Only waypoints subscribe to it.
pub const WAYPOINT_POLICY_TYPE: &str = "type.googleapis.com/ambit.waypoint.v1.AuthorizationPolicy";
/// Type URL of ambit's own resource for its waypoints: one HTTPRoute or GRPCRoute attached
/// to a Service, as written (`ambit.waypoint.v1.Route`, named `<kind>/<namespace>/<name>`).
/// Only waypoints subscribe to it.
pub const WAYPOINT_ROUTE_TYPE: &str = "type.googleapis.com/ambit.waypoint.v1.Route";
/// Type URL of ambit's own resource for its waypoints: one RequestAuthentication, as
/// written (`ambit.waypoint.v1.RequestAuthentication`, named
/// `RequestAuthentication/<namespace>/<name>`). Only waypoints subscribe to it.
pub const WAYPOINT_AUTHN_TYPE: &str = "type.googleapis.com/ambit.waypoint.v1.RequestAuthentication";
/// Type URL of ambit's own resource for its waypoints: one DestinationRule, as written
/// (`ambit.waypoint.v1.DestinationRule`, named `DestinationRule/<namespace>/<name>`). Only
/// waypoints subscribe to it.
pub const WAYPOINT_DESTINATION_RULE_TYPE: &str =
    "type.googleapis.com/ambit.waypoint.v1.DestinationRule";
/// The delta ADS method path.
pub const DELTA_ADS_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";
/// The CA method path.
pub const CREATE_CERTIFICATE_PATH: &str =
    "/istio.v1.auth.IstioCertificateService/CreateCertificate";
/// `kind` (a workload or a service) as a delta xDS resource named `name` at `version`.
pub fn address_resource(
    name: impl Into<String>,
    version: impl Into<String>,
    kind: istio::workload::address::Type,
) -> Resource {
    use prost::Message;
    Resource {
        name: name.into(),
        version: version.into(),
        resource: Some(prost_types::Any {
            type_url: ADDRESS_TYPE.into(),
            value: Address { r#type: Some(kind) }.encode_to_vec(),
        }),
        ..Default::default()
    }
}

/// ztunnel's bound on one decoded xDS message.
pub const MAX_XDS_MESSAGE: usize = 200 * 1024 * 1024;

#[cfg(test)]
mod wire_tests;
