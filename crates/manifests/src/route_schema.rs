//! HTTPRoute (`gateway.networking.k8s.io/v1`, `v1beta1`) and GRPCRoute (`v1`) objects as
//! they are written: every field the Gateway API defines for them, unknown fields refused
//! (as `kubectl apply` refuses them), strings read as strings only and numbers as numbers
//! only. What the fields mean, and the CRDs' checks, are [`crate::route_translate`].

use serde::de::IgnoredAny;
use serde::Deserialize;

use crate::schema::Metadata;
use crate::values::Text;

/// A route object; `R` is the rule of its kind.
#[allow(dead_code)] // apiVersion and kind are read from the document's header
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct RouteObject<R> {
    pub api_version: Text,
    pub kind: Text,
    pub metadata: Metadata,
    pub spec: Option<RouteSpec<R>>,
    /// Written by the cluster; not ours to read.
    pub status: Option<IgnoredAny>,
}

#[derive(Debug, Deserialize)]
#[serde(
    rename_all = "camelCase",
    deny_unknown_fields,
    bound(deserialize = "R: Deserialize<'de>")
)]
pub(crate) struct RouteSpec<R> {
    pub parent_refs: Option<Vec<ParentRefSpec>>,
    pub hostnames: Option<Vec<Text>>,
    pub rules: Option<Vec<R>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct ParentRefSpec {
    pub group: Option<Text>,
    pub kind: Option<Text>,
    pub namespace: Option<Text>,
    pub name: Text,
    pub section_name: Option<Text>,
    pub port: Option<i64>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct HttpRuleSpec {
    pub name: Option<Text>,
    pub matches: Option<Vec<HttpMatchSpec>>,
    pub filters: Option<Vec<FilterSpec>>,
    pub backend_refs: Option<Vec<BackendRefSpec>>,
    pub timeouts: Option<TimeoutsSpec>,
    pub retry: Option<RetrySpec>,
    pub session_persistence: Option<IgnoredAny>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct GrpcRuleSpec {
    pub name: Option<Text>,
    pub matches: Option<Vec<GrpcMatchSpec>>,
    pub filters: Option<Vec<FilterSpec>>,
    pub backend_refs: Option<Vec<BackendRefSpec>>,
    pub session_persistence: Option<IgnoredAny>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct HttpMatchSpec {
    pub path: Option<PathSpec>,
    pub headers: Option<Vec<ValueMatchSpec>>,
    pub query_params: Option<Vec<ValueMatchSpec>>,
    pub method: Option<Text>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct PathSpec {
    #[serde(rename = "type")]
    pub kind: Option<Text>,
    pub value: Option<Text>,
}

/// A header or query parameter match.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct ValueMatchSpec {
    #[serde(rename = "type")]
    pub kind: Option<Text>,
    pub name: Text,
    pub value: Text,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct GrpcMatchSpec {
    pub method: Option<GrpcMethodSpec>,
    pub headers: Option<Vec<ValueMatchSpec>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct GrpcMethodSpec {
    #[serde(rename = "type")]
    pub kind: Option<Text>,
    pub service: Option<Text>,
    pub method: Option<Text>,
}

/// A filter of either kind of route (which types each kind takes is checked on reading).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct FilterSpec {
    #[serde(rename = "type")]
    pub kind: Text,
    pub request_header_modifier: Option<HeaderFilterSpec>,
    pub response_header_modifier: Option<HeaderFilterSpec>,
    pub request_mirror: Option<MirrorSpec>,
    pub request_redirect: Option<RedirectSpec>,
    pub url_rewrite: Option<RewriteSpec>,
    pub cors: Option<CorsSpec>,
    pub external_auth: Option<IgnoredAny>,
    pub extension_ref: Option<IgnoredAny>,
}

/// `cors` (HTTPCORSFilter).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct CorsSpec {
    pub allow_origins: Option<Vec<Text>>,
    pub allow_credentials: Option<bool>,
    pub allow_methods: Option<Vec<Text>>,
    pub allow_headers: Option<Vec<Text>>,
    pub expose_headers: Option<Vec<Text>>,
    pub max_age: Option<i64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct HeaderFilterSpec {
    pub set: Option<Vec<HeaderSpec>>,
    pub add: Option<Vec<HeaderSpec>>,
    pub remove: Option<Vec<Text>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct HeaderSpec {
    pub name: Text,
    pub value: Text,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct MirrorSpec {
    pub backend_ref: BackendObjectSpec,
    pub percent: Option<i64>,
    pub fraction: Option<FractionSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct FractionSpec {
    pub numerator: i64,
    pub denominator: Option<i64>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct RedirectSpec {
    pub scheme: Option<Text>,
    pub hostname: Option<Text>,
    pub path: Option<PathModifierSpec>,
    pub port: Option<i64>,
    pub status_code: Option<i64>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct RewriteSpec {
    pub hostname: Option<Text>,
    pub path: Option<PathModifierSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct PathModifierSpec {
    #[serde(rename = "type")]
    pub kind: Text,
    pub replace_full_path: Option<Text>,
    pub replace_prefix_match: Option<Text>,
}

/// A `backendRef` of a rule: the object, its weight and its own filters.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct BackendRefSpec {
    pub group: Option<Text>,
    pub kind: Option<Text>,
    pub name: Text,
    pub namespace: Option<Text>,
    pub port: Option<i64>,
    pub weight: Option<i64>,
    pub filters: Option<Vec<FilterSpec>>,
}

/// A backend object (a mirror's).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct BackendObjectSpec {
    pub group: Option<Text>,
    pub kind: Option<Text>,
    pub name: Text,
    pub namespace: Option<Text>,
    pub port: Option<i64>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct TimeoutsSpec {
    pub request: Option<Text>,
    pub backend_request: Option<Text>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct RetrySpec {
    pub codes: Option<Vec<i64>>,
    pub attempts: Option<i64>,
    pub backoff: Option<Text>,
}
