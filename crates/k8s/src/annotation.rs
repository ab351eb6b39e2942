//! The `ambient.istio.io/redirection` annotation: the agent's record, on the pod itself,
//! that the pod is captured (istio-cni reference §1.3 step 4). istiod reads it to turn
//! HBONE on for the pod; a restarted agent reads it to know which pods it had enrolled.
//!
//! It is written with a JSON merge patch on the `pods/status` subresource (the permission
//! the chart grants), `{"metadata":{"annotations":{...}}}`, and removed by patching `null`.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams};
use kube::Api;
use serde_json::{json, Value};

use crate::labels::REDIRECTION_ANNOTATION;

/// The annotation's values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Redirection {
    /// Rules installed and the node proxy took the pod.
    Enabled,
    /// Rules installed, but no node proxy took the pod yet: its traffic fails closed.
    Pending,
}

impl Redirection {
    pub fn as_str(self) -> &'static str {
        match self {
            Redirection::Enabled => "enabled",
            Redirection::Pending => "pending",
        }
    }

    fn parse(value: &str) -> Option<Redirection> {
        match value {
            "enabled" => Some(Redirection::Enabled),
            "pending" => Some(Redirection::Pending),
            _ => None,
        }
    }
}

/// The pod's annotation, if it has one of the two values.
pub fn redirection_of(pod: &Pod) -> Option<Redirection> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(REDIRECTION_ANNOTATION)
        .and_then(|v| Redirection::parse(v))
}

/// The merge patch that sets the annotation to `state`, or removes it for `None`.
pub fn patch_body(state: Option<Redirection>) -> Value {
    let value = state.map_or(Value::Null, |s| Value::String(s.as_str().to_owned()));
    json!({ "metadata": { "annotations": { REDIRECTION_ANNOTATION: value } } })
}

/// Sends the patch: `PATCH /api/v1/namespaces/{namespace}/pods/{name}/status` with
/// `Content-Type: application/merge-patch+json`.
pub async fn set_redirection(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    state: Option<Redirection>,
) -> Result<Pod, kube::Error> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    pods.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(patch_body(state)),
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_patch_bodies_are_istios() {
        assert_eq!(
            patch_body(Some(Redirection::Enabled)).to_string(),
            r#"{"metadata":{"annotations":{"ambient.istio.io/redirection":"enabled"}}}"#
        );
        assert_eq!(
            patch_body(Some(Redirection::Pending)).to_string(),
            r#"{"metadata":{"annotations":{"ambient.istio.io/redirection":"pending"}}}"#
        );
        assert_eq!(
            patch_body(None).to_string(),
            r#"{"metadata":{"annotations":{"ambient.istio.io/redirection":null}}}"#
        );
    }

    #[test]
    fn only_the_two_values_count() {
        let mut pod = Pod::default();
        assert_eq!(redirection_of(&pod), None);
        for (value, want) in [
            ("enabled", Some(Redirection::Enabled)),
            ("pending", Some(Redirection::Pending)),
            ("Enabled", None),
            ("", None),
        ] {
            pod.metadata.annotations =
                Some([(REDIRECTION_ANNOTATION.to_owned(), value.to_owned())].into());
            assert_eq!(redirection_of(&pod), want, "{value:?}");
        }
    }
}
