//! An AuthorizationPolicy object as it is written (`security.istio.io/v1` and `v1beta1`
//! share it): every field Istio defines, unknown fields refused (Istio's schema refuses
//! them, and a misspelt field silently left out could widen a policy), each leaf value
//! typed where it is read ([`crate::values`]). What the fields mean is [`crate::translate`].

use ambit_state::Condition;
use serde::de::IgnoredAny;
use serde::Deserialize;

use crate::values::{
    ActionName, Host, Method, Path, Pattern, Port, Principal, RemoteIp, RequestPrincipal,
    ServiceAccount, SourceIp, StringMap, Text,
};

// Fields only checked for their shape (apiVersion and kind are read from the document's
// header; status is the cluster's) are never read.
#[allow(dead_code)]
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct Object {
    pub api_version: Text,
    pub kind: Text,
    pub metadata: Metadata,
    pub spec: Option<Spec>,
    /// Written by the cluster (`kubectl get -o yaml`); not ours to read.
    pub status: Option<IgnoredAny>,
}

/// Kubernetes' ObjectMeta: the fields read, and the others it may hold (as `kubectl get -o
/// yaml` writes them), so that a misspelt `namespace` is refused, not ignored.
#[allow(dead_code)] // the fields the cluster writes are only checked for their shape
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct Metadata {
    pub name: Text,
    pub namespace: Option<Text>,
    pub annotations: Option<StringMap>,
    pub labels: Option<StringMap>,
    pub generate_name: Option<IgnoredAny>,
    pub uid: Option<IgnoredAny>,
    pub resource_version: Option<IgnoredAny>,
    pub generation: Option<IgnoredAny>,
    pub creation_timestamp: Option<IgnoredAny>,
    pub deletion_timestamp: Option<IgnoredAny>,
    pub deletion_grace_period_seconds: Option<IgnoredAny>,
    pub owner_references: Option<IgnoredAny>,
    pub finalizers: Option<IgnoredAny>,
    pub managed_fields: Option<IgnoredAny>,
    pub self_link: Option<IgnoredAny>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct Spec {
    pub selector: Option<Selector>,
    pub target_ref: Option<TargetRef>,
    pub target_refs: Option<Vec<TargetRef>>,
    pub action: Option<ActionName>,
    pub provider: Option<Provider>,
    pub rules: Option<Vec<RuleSpec>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct Selector {
    #[allow(dead_code)] // a selector policy is skipped whatever it selects
    pub match_labels: Option<StringMap>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct TargetRef {
    pub group: Option<Text>,
    pub kind: Text,
    pub name: Text,
    pub namespace: Option<Text>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct Provider {
    pub name: Option<Text>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct RuleSpec {
    pub from: Option<Vec<From>>,
    pub to: Option<Vec<To>>,
    pub when: Option<Vec<Condition>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct From {
    pub source: Option<Source>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct To {
    pub operation: Option<Operation>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct Source {
    pub principals: Option<Vec<Principal>>,
    pub not_principals: Option<Vec<Principal>>,
    pub request_principals: Option<Vec<RequestPrincipal>>,
    pub not_request_principals: Option<Vec<RequestPrincipal>>,
    pub namespaces: Option<Vec<Pattern>>,
    pub not_namespaces: Option<Vec<Pattern>>,
    pub service_accounts: Option<Vec<ServiceAccount>>,
    pub not_service_accounts: Option<Vec<ServiceAccount>>,
    pub ip_blocks: Option<Vec<SourceIp>>,
    pub not_ip_blocks: Option<Vec<SourceIp>>,
    pub remote_ip_blocks: Option<Vec<RemoteIp>>,
    pub not_remote_ip_blocks: Option<Vec<RemoteIp>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct Operation {
    pub hosts: Option<Vec<Host>>,
    pub not_hosts: Option<Vec<Host>>,
    pub ports: Option<Vec<Port>>,
    pub not_ports: Option<Vec<Port>>,
    pub methods: Option<Vec<Method>>,
    pub not_methods: Option<Vec<Method>>,
    pub paths: Option<Vec<Path>>,
    pub not_paths: Option<Vec<Path>>,
}
