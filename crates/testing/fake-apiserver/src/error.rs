//! API errors as Kubernetes reports them: a `kind: Status` body with its `reason`, `code`
//! and message wording.

use serde_json::{json, Map, Value};

use crate::resource::Resource;

/// A failed request, rendered as a `Status` object.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    /// `details`: name, group, kind (the resource plural), causes, retryAfterSeconds.
    pub details: Option<Value>,
    /// Seconds for a `Retry-After` header (429).
    pub retry_after: Option<u32>,
}

fn details(resource: Resource, name: &str) -> Value {
    let mut d = Map::new();
    if !name.is_empty() {
        d.insert("name".into(), json!(name));
    }
    if !resource.group().is_empty() {
        d.insert("group".into(), json!(resource.group()));
    }
    d.insert("kind".into(), json!(resource.plural()));
    Value::Object(d)
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
            retry_after: None,
        }
    }

    fn with_details(mut self, d: Value) -> ApiError {
        self.details = Some(d);
        self
    }

    pub fn not_found(resource: Resource, name: &str) -> ApiError {
        ApiError::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", resource.qualified()),
        )
        .with_details(details(resource, name))
    }

    /// A path the server does not serve.
    pub fn not_found_path() -> ApiError {
        ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
        .with_details(json!({}))
    }

    pub fn already_exists(resource: Resource, name: &str) -> ApiError {
        ApiError::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", resource.qualified()),
        )
        .with_details(details(resource, name))
    }

    /// A stale `resourceVersion` (or a failed precondition, `why`).
    pub fn conflict(resource: Resource, name: &str, why: &str) -> ApiError {
        ApiError::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                resource.qualified()
            ),
        )
        .with_details(details(resource, name))
    }

    pub(crate) const MODIFIED: &'static str =
        "the object has been modified; please apply your changes to the latest version and try again";

    /// `what` is forbidden: `why` (the authorizer's sentence).
    pub fn forbidden(resource: Option<Resource>, name: &str, why: &str) -> ApiError {
        let what = match (resource, name) {
            (Some(r), "") => format!("{} is forbidden", r.qualified()),
            (Some(r), n) => format!("{} \"{n}\" is forbidden", r.qualified()),
            (None, _) => "forbidden".to_string(),
        };
        let e = ApiError::new(403, "Forbidden", format!("{what}: {why}"));
        match resource {
            Some(r) => e.with_details(details(r, name)),
            None => e.with_details(json!({})),
        }
    }

    pub fn unauthorized() -> ApiError {
        ApiError::new(401, "Unauthorized", "Unauthorized")
    }

    /// 410: the resourceVersion asked for is older than the history kept.
    pub fn expired(requested: u64, oldest: u64) -> ApiError {
        ApiError::new(
            410,
            "Expired",
            format!("too old resource version: {requested} ({oldest})"),
        )
    }

    /// 410 for a `continue` token whose snapshot is gone.
    pub fn continue_expired() -> ApiError {
        ApiError::new(
            410,
            "Expired",
            "The provided continue parameter is too old to display a consistent list result. \
             You can start a new list without the continue parameter.",
        )
    }

    pub fn too_many_requests(retry_after: u32) -> ApiError {
        let mut e = ApiError::new(
            429,
            "TooManyRequests",
            "Too many requests, please try again later.",
        )
        .with_details(json!({"retryAfterSeconds": retry_after}));
        e.retry_after = Some(retry_after);
        e
    }

    pub fn internal(message: &str) -> ApiError {
        ApiError::new(
            500,
            "InternalError",
            format!("Internal error occurred: {message}"),
        )
        .with_details(json!({"causes": [{"message": message}]}))
    }

    pub fn unsupported_patch(content_type: &str) -> ApiError {
        ApiError::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: \
                 application/json-patch+json, application/merge-patch+json, \
                 application/strategic-merge-patch+json (got {content_type:?}; apply patches are \
                 not implemented by this test server)"
            ),
        )
    }

    /// 415 for a request body in a media type (or of a kind) the server cannot decode.
    pub fn unsupported_media(message: &str) -> ApiError {
        ApiError::new(415, "UnsupportedMediaType", message)
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(400, "BadRequest", message)
    }

    /// 422: `Kind "name" is invalid: field: problem` (`Kind.group` outside the core group).
    pub fn invalid(resource: Resource, name: &str, field_error: &str) -> ApiError {
        ApiError::invalid_kind(resource.group(), resource.kind(), name, field_error)
    }

    /// 422 naming the kind `group`/`kind` (a custom resource's body names its own kind).
    pub fn invalid_kind(group: &str, kind: &str, name: &str, field_error: &str) -> ApiError {
        let mut d = Map::new();
        d.insert("name".into(), json!(name));
        if !group.is_empty() {
            d.insert("group".into(), json!(group));
        }
        d.insert("kind".into(), json!(kind));
        ApiError::new(
            422,
            "Invalid",
            format!(
                "{} \"{name}\" is invalid: {field_error}",
                crate::resource::qualified_kind(group, kind)
            ),
        )
        .with_details(Value::Object(d))
    }

    /// 405 for a method no route of the path takes (a GET of create-only TokenReviews), as
    /// the API server's router answers it.
    pub fn method_not_allowed() -> ApiError {
        ApiError::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )
        .with_details(json!({}))
    }

    pub fn method_not_supported(resource: Resource, verb: &str) -> ApiError {
        ApiError::new(
            405,
            "MethodNotAllowed",
            format!(
                "{verb} is not supported on resources of kind \"{}\"",
                resource.plural()
            ),
        )
        .with_details(details(resource, ""))
    }

    pub fn too_large(limit: usize) -> ApiError {
        ApiError::new(
            413,
            "RequestEntityTooLarge",
            format!("Request entity too large: limit is {limit}"),
        )
    }

    /// An injected failure with status `code`.
    pub fn injected(code: u16) -> ApiError {
        match code {
            429 => ApiError::too_many_requests(1),
            500 => ApiError::internal("injected fault"),
            _ => {
                let reason = match code {
                    400 => "BadRequest",
                    401 => "Unauthorized",
                    403 => "Forbidden",
                    404 => "NotFound",
                    409 => "Conflict",
                    410 => "Expired",
                    503 => "ServiceUnavailable",
                    504 => "Timeout",
                    _ => "InternalError",
                };
                ApiError::new(code, reason, format!("injected fault ({code})"))
            }
        }
    }

    /// The `Status` body.
    pub fn to_status(&self) -> Value {
        let mut s = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(d) = &self.details {
            s["details"] = d.clone();
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_use_kubernetes_wording() {
        assert_eq!(
            ApiError::not_found(Resource::Pods, "x").message,
            "pods \"x\" not found"
        );
        assert_eq!(
            ApiError::not_found(Resource::DaemonSets, "d").message,
            "daemonsets.apps \"d\" not found"
        );
        assert_eq!(
            ApiError::conflict(Resource::Pods, "x", ApiError::MODIFIED).message,
            "Operation cannot be fulfilled on pods \"x\": the object has been modified; \
             please apply your changes to the latest version and try again"
        );
        let s = ApiError::not_found(Resource::Pods, "x").to_status();
        assert_eq!(s["kind"], "Status");
        assert_eq!(s["code"], 404);
        assert_eq!(s["details"], json!({"name": "x", "kind": "pods"}));
        assert_eq!(ApiError::too_many_requests(1).retry_after, Some(1));
        assert_eq!(
            ApiError::invalid(Resource::DaemonSets, "d", "metadata.name: Required value").message,
            "DaemonSet.apps \"d\" is invalid: metadata.name: Required value"
        );
        let e = ApiError::invalid(Resource::Pods, "p", "x");
        assert_eq!(e.message, "Pod \"p\" is invalid: x");
        assert_eq!(
            e.to_status()["details"],
            json!({"name": "p", "kind": "Pod"})
        );
        assert_eq!(
            ApiError::method_not_allowed().to_status()["reason"],
            "MethodNotAllowed"
        );
        assert_eq!(
            ApiError::expired(3, 10).message,
            "too old resource version: 3 (10)"
        );
    }
}
