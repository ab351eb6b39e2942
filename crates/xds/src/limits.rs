//! Bounds on what one control plane can make a proxy hold: sizes and counts per response
//! and per type, and the default budgets of the node proxy's types (see [`crate::delta`]).

/// The default budget of the Address resources held (workloads and services, with the
/// store's indexes and the names and versions tracked), in estimated bytes
/// ([`crate::held`]). Issue 23's target mesh, 100,000 workloads and 10,000 services
/// shaped as a large real one (per pod two addresses, three services of four ports,
/// three policies, a waypoint, long names), is estimated at 1.16 GB (it holds about
/// 0.6 GB: the estimate errs high by 1.8 times for such pods): 3 GiB leaves 2.7 times
/// the estimate, 5 times what it holds. A mesh that needs more needs a larger proxy too.
pub const MAX_HELD_ADDRESSES: u64 = 3 << 30;
/// The default budget of the Authorization resources held. 20,000 policies (two per
/// service of that mesh) of three rules of four match objects with a few values each are
/// estimated at 0.2 GB (they hold 0.12 GB): 512 MiB leaves 2.6 times the estimate. The
/// 4 MB split attack (488 policies of 4,096 empty match objects) is estimated at 0.74 GB.
pub const MAX_HELD_POLICIES: u64 = 512 << 20;
/// The default bound on what the resources of one response may take once decoded,
/// before what they replace is freed: the larger budget. The first response of a stream
/// carries the whole mesh (a reconnect sends it again), so a smaller bound would leave a
/// proxy that holds its budget unable to sync again. While a response is applied the
/// proxy holds what it held plus this at most.
pub const MAX_HELD_PER_RESPONSE: u64 = MAX_HELD_ADDRESSES;

/// Bounds on what one control plane can make the proxy hold (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Resources plus removed names plus aliases in one response.
    pub max_per_response: usize,
    /// Bytes of a resource name.
    pub max_name_len: usize,
    /// Bytes of a resource version.
    pub max_version_len: usize,
    /// Resource names tracked (with their versions) per type.
    pub max_tracked_per_type: usize,
    /// Rejections spelled out in one NACK message.
    pub max_errors_listed: usize,
    /// Bytes of one `<name>: <reason>` entry in a NACK message.
    pub max_error_len: usize,
    /// Estimated bytes the Address resources held may take ([`MAX_HELD_ADDRESSES`]): the
    /// budget of [`crate::Addresses`] in [`crate::DeltaClient::node_proxy`] (any other type has its own,
    /// [`crate::ResourceType::budget`]).
    pub max_held_addresses: u64,
    /// Estimated bytes the Authorization resources held may take ([`MAX_HELD_POLICIES`]):
    /// the budget of [`crate::Authorizations`] in [`crate::DeltaClient::node_proxy`].
    pub max_held_policies: u64,
    /// Estimated bytes the resources of one response may take
    /// ([`MAX_HELD_PER_RESPONSE`]).
    pub max_held_per_response: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_per_response: 1_000_000,
            max_name_len: 1024,
            max_version_len: 1024,
            max_tracked_per_type: 1_000_000,
            max_errors_listed: 64,
            max_error_len: 512,
            max_held_addresses: MAX_HELD_ADDRESSES,
            max_held_policies: MAX_HELD_POLICIES,
            max_held_per_response: MAX_HELD_PER_RESPONSE,
        }
    }
}
