//! A RequestAuthentication object as it is written (`security.istio.io/v1` and `v1beta1`
//! share it): every field Istio defines, unknown fields refused (a misspelt `fromHeaders`
//! left out would look for tokens where none are sent), strings read as strings only and
//! `forwardOriginalToken` as a boolean only. What the fields mean, and Istio's checks, are
//! [`crate::authn_translate`].

use serde::de::IgnoredAny;
use serde::Deserialize;

use crate::schema::{Metadata, Selector, TargetRef};
use crate::values::Text;

#[allow(dead_code)] // apiVersion and kind are read from the document's header
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct AuthnObject {
    pub api_version: Text,
    pub kind: Text,
    pub metadata: Metadata,
    pub spec: Option<AuthnSpec>,
    /// Written by the cluster; not ours to read.
    pub status: Option<IgnoredAny>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct AuthnSpec {
    pub selector: Option<Selector>,
    pub target_ref: Option<TargetRef>,
    pub target_refs: Option<Vec<TargetRef>>,
    pub jwt_rules: Option<Vec<JwtRuleFields>>,
}

/// A `jwtRules` entry.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct JwtRuleFields {
    pub issuer: Text,
    pub audiences: Option<Vec<Text>>,
    pub jwks_uri: Option<Text>,
    /// The CRD's other name for `jwksUri` (the proto field's).
    #[serde(rename = "jwks_uri")]
    pub jwks_uri_snake: Option<Text>,
    pub jwks: Option<Text>,
    pub from_headers: Option<Vec<JwtHeaderFields>>,
    pub from_params: Option<Vec<Text>>,
    pub from_cookies: Option<Vec<Text>>,
    pub forward_original_token: Option<bool>,
    pub output_payload_to_header: Option<Text>,
    pub output_claim_to_headers: Option<Vec<ClaimToHeaderFields>>,
    pub timeout: Option<Text>,
    /// Newer Istio fields the waypoint does not implement: read only to refuse them by
    /// name (each changes which requests pass).
    pub space_delimited_claims: Option<IgnoredAny>,
    pub presence: Option<IgnoredAny>,
    pub failed_status_in_metadata: Option<IgnoredAny>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct JwtHeaderFields {
    pub name: Text,
    pub prefix: Option<Text>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct ClaimToHeaderFields {
    pub header: Text,
    pub claim: Text,
}
