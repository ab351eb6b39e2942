//! What the manifests come to: the waypoint's policies (each an [`Authorization`] of the
//! state crate, with its action and targets), the documents skipped and why, and where each
//! came from.

use std::fmt;

use ambit_state::Authorization;

use crate::error::ManifestError;

/// An AuthorizationPolicy for a waypoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaypointPolicy {
    /// Name, namespace, rules and dry run. `scope` is always `WorkloadSelector`: the policy
    /// applies only where [`Self::targets`] say. `action` is `Allow` for
    /// [`WaypointAction::Allow`] and `Deny` for every other action, so that code reading
    /// only this field fails closed (denies what a CUSTOM or AUDIT policy matches rather
    /// than allowing it); [`Self::action`] is the whole truth.
    pub authorization: Authorization,
    pub action: WaypointAction,
    /// Where it attaches; never empty (a policy without targets is not a waypoint's).
    pub targets: Vec<PolicyTarget>,
}

/// What a matching policy does.
///
/// One enum rather than an `audit` flag and an optional provider beside the state's
/// Allow/Deny: no combination that means nothing (an AUDIT policy with a provider), and a
/// `match` on it makes the waypoint decide what it does with each action.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum WaypointAction {
    Allow,
    Deny,
    /// Marks matching requests for audit logging; never allows or denies.
    Audit,
    /// Asks the external authorizer named by MeshConfig `extensionProviders` (`provider`)
    /// about matching requests.
    Custom {
        provider: String,
    },
}

/// What a policy attaches to, by `targetRefs`. The namespace is the policy's (Istio refuses
/// a `targetRefs` entry that names one).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PolicyTarget {
    /// A waypoint (`gateway.networking.k8s.io` `Gateway`): all of its traffic.
    Gateway { namespace: String, name: String },
    /// A Service (core group), when fronted by the waypoint.
    Service { namespace: String, name: String },
    /// A ServiceEntry (`networking.istio.io`), when fronted by the waypoint.
    ServiceEntry { namespace: String, name: String },
    /// Every waypoint of a class (`gateway.networking.k8s.io` `GatewayClass`, such as
    /// `istio-waypoint`); only from the root namespace.
    GatewayClass { name: String },
}

/// Where a document came from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Origin {
    /// A file path, or the name a caller gave the text.
    pub source: String,
    /// The document's index in its source (0 for the first, counting empty ones).
    pub document: usize,
    /// The 1-based line where the object starts (its first field).
    pub line: usize,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.source, self.line)
    }
}

/// A value and where it was read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Located<T> {
    pub origin: Origin,
    pub value: T,
}

/// A document that was read but is not for the waypoint (not an error).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    pub api_version: String,
    pub kind: String,
    /// `metadata.namespace` (defaulted) and `metadata.name`, when written.
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub reason: SkipReason,
}

/// Why a document was skipped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SkipReason {
    /// An AuthorizationPolicy with a `selector`: it applies to the selected workloads and
    /// is enforced by their ztunnel; waypoints never use `selector`.
    Selector,
    /// An AuthorizationPolicy with neither `selector` nor `targetRefs`: it applies to the
    /// namespace's workloads (the mesh's, in the root namespace), enforced by ztunnel.
    NamespaceWide,
    /// A kind this crate does not read (yet).
    UnsupportedKind,
    /// An HTTPRoute or GRPCRoute with no `parentRefs` a waypoint serves (a Service of its
    /// own namespace): one for a Gateway, say, is the Gateway's.
    NoServiceParent,
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SkipReason::Selector => {
                "selects workloads (spec.selector): enforced by their ztunnel, not by a waypoint"
            }
            SkipReason::NamespaceWide => {
                "has no targetRefs: it applies to the namespace's workloads, enforced by ztunnel, not by a waypoint"
            }
            SkipReason::UnsupportedKind => "a kind the waypoint does not read",
            SkipReason::NoServiceParent => {
                "attaches to no Service of its own namespace (parentRefs of kind Service, group \"\"): not a mesh route a waypoint serves"
            }
        })
    }
}

impl fmt::Display for Skipped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.api_version, self.kind)?;
        match (&self.namespace, &self.name) {
            (Some(ns), Some(name)) => write!(f, " {ns}/{name}")?,
            (None, Some(name)) => write!(f, " {name}")?,
            _ => {}
        }
        write!(f, ": {}", self.reason)
    }
}

/// What a text (or a file, or a directory) came to: every policy, route and skipped document
/// with its origin, and every refusal. A bad document is refused alone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Parsed {
    pub policies: Vec<Located<WaypointPolicy>>,
    /// HTTPRoutes and GRPCRoutes attached to Services (mesh routes), each once.
    pub routes: Vec<Located<ambit_routes::Route>>,
    pub skipped: Vec<Located<Skipped>>,
    pub errors: Vec<ManifestError>,
}

impl Parsed {
    /// Adds what `other` read after what this holds.
    pub fn extend(&mut self, other: Parsed) {
        self.policies.extend(other.policies);
        self.routes.extend(other.routes);
        self.skipped.extend(other.skipped);
        self.errors.extend(other.errors);
    }
}
