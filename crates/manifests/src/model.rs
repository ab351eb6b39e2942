//! What the manifests come to: the waypoint's policies (each an [`Authorization`] of the
//! state crate, with its action and targets), its request authentications (JWT rules and
//! their targets), the documents skipped and why, and where each came from.

use std::fmt;
use std::time::Duration;

use http::header::HeaderName;

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

/// A RequestAuthentication for a waypoint: which JWTs the targets accept. A request that
/// presents a token one of the rules finds must carry a valid one (else 401); a request
/// without a token passes unauthenticated (AuthorizationPolicy decides what it may do).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaypointAuthn {
    pub namespace: String,
    pub name: String,
    /// Where it attaches; never empty (one without targets is not a waypoint's).
    pub targets: Vec<PolicyTarget>,
    /// `spec.jwtRules`, in order; may be empty (then it checks nothing).
    pub rules: Vec<JwtRuleSpec>,
}

impl WaypointAuthn {
    /// `namespace/name`, as a refusal's [`ObjectRef::key`](crate::ObjectRef::key) names it.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// One `jwtRules` entry, checked: what a token must say and where it is looked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JwtRuleSpec {
    /// The `iss` a token must carry; never empty.
    pub issuer: String,
    /// A token must carry one of these in `aud`; empty: Istio accepts the service's own
    /// name (deciding that is the waypoint's).
    pub audiences: Vec<String>,
    pub jwks: JwksSource,
    /// Where the token is looked for. All three empty: Istio's defaults, the
    /// `Authorization` header with the `Bearer ` scheme and the `access_token` query
    /// parameter ([`Self::uses_default_locations`]).
    pub from_headers: Vec<JwtHeader>,
    pub from_params: Vec<String>,
    pub from_cookies: Vec<String>,
    /// Keep the token on the request sent upstream (default false: it is removed).
    pub forward_original_token: bool,
    /// Send the verified payload upstream in this header (base64 of its JSON).
    pub output_payload_to_header: Option<HeaderName>,
    /// Copy claims of a verified token into headers (each header named once).
    pub output_claim_to_headers: Vec<ClaimToHeader>,
    /// How long a JWKS fetch may take ([`DEFAULT_JWKS_TIMEOUT`] when not written).
    pub timeout: Duration,
}

impl JwtRuleSpec {
    /// True when no location is written, so the defaults apply.
    pub fn uses_default_locations(&self) -> bool {
        self.from_headers.is_empty() && self.from_params.is_empty() && self.from_cookies.is_empty()
    }
}

/// A JWKS fetch's timeout when `timeout` is not written.
pub const DEFAULT_JWKS_TIMEOUT: Duration = Duration::from_secs(5);

/// Where the keys that sign a rule's tokens come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JwksSource {
    /// `jwksUri` (or `jwks_uri`): fetched from this `http` or `https` URL.
    Uri(http::Uri),
    /// `jwks`: the key set written inline, as written (a JSON text; not parsed here).
    Inline(String),
    /// Neither written: Istio finds the key set through the issuer's OpenID Connect
    /// discovery document (`<issuer>/.well-known/openid-configuration`).
    Discovery,
}

/// A `fromHeaders` entry: the header a token is read from, and the prefix stripped
/// first (a header without it holds no token for this rule).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JwtHeader {
    /// Lower-cased.
    pub name: HeaderName,
    /// As written (`Bearer ` with its space); empty: none.
    pub prefix: String,
}

/// An `outputClaimToHeaders` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimToHeader {
    /// Lower-cased; set on the request, replacing any value it had.
    pub header: HeaderName,
    /// The claim, a nested one as `a.b.c`.
    pub claim: String,
}

/// A DestinationRule for a waypoint: the traffic policy for the requests it sends to a
/// host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaypointDestinationRule {
    pub namespace: String,
    pub name: String,
    /// `spec.host` as written: a short name (the rule's namespace's Service), a fully
    /// qualified one, or `*.` and a suffix.
    pub host: String,
    /// `spec.targetRefs` (Services and ServiceEntries of its namespace): where written,
    /// the rule applies to them rather than by `host`.
    pub targets: Vec<PolicyTarget>,
    /// `spec.exportTo` as written (empty: every namespace).
    pub export_to: Vec<String>,
    pub policy: ambit_traffic_policy::TrafficPolicy,
}

impl WaypointDestinationRule {
    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
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
    /// An HTTPRoute or GRPCRoute with no `parentRefs` a waypoint serves (a Service,
    /// ServiceEntry or Gateway of its own namespace).
    NoServiceParent,
    /// A RequestAuthentication with a `selector`: for the selected workloads' sidecars
    /// and gateways; waypoints never use `selector`.
    AuthnSelector,
    /// A RequestAuthentication with neither `selector` nor `targetRefs`: for the
    /// namespace's sidecars and gateways (the mesh's, in the root namespace).
    AuthnNamespaceWide,
    /// A DestinationRule with a `workloadSelector`: for the selected sidecars only.
    RuleWorkloadSelector,
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
                "attaches to no Service, ServiceEntry or Gateway of its own namespace: not a mesh route a waypoint serves"
            }
            SkipReason::AuthnSelector => {
                "selects workloads (spec.selector): for their sidecars and gateways, not for a waypoint"
            }
            SkipReason::AuthnNamespaceWide => {
                "has no targetRefs: it applies to the namespace's sidecars and gateways, not to a waypoint"
            }
            SkipReason::RuleWorkloadSelector => {
                "selects workloads (spec.workloadSelector): for their sidecars, not for a waypoint"
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

/// What a text (or a file, or a directory) came to: every policy, request authentication,
/// route and skipped document with its origin, and every refusal. A bad document is
/// refused alone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Parsed {
    pub policies: Vec<Located<WaypointPolicy>>,
    /// RequestAuthentications attached by `targetRefs`, each once.
    pub authns: Vec<Located<WaypointAuthn>>,
    /// HTTPRoutes and GRPCRoutes attached to Services (mesh routes), each once.
    pub routes: Vec<Located<ambit_gateway_routes::Route>>,
    /// DestinationRules, each once.
    pub destination_rules: Vec<Located<WaypointDestinationRule>>,
    pub skipped: Vec<Located<Skipped>>,
    pub errors: Vec<ManifestError>,
}

impl Parsed {
    /// Adds what `other` read after what this holds.
    pub fn extend(&mut self, other: Parsed) {
        self.policies.extend(other.policies);
        self.authns.extend(other.authns);
        self.routes.extend(other.routes);
        self.destination_rules.extend(other.destination_rules);
        self.skipped.extend(other.skipped);
        self.errors.extend(other.errors);
    }
}
