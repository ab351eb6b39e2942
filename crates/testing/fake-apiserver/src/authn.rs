//! Bearer tokens and their audiences, and the answers to TokenReviews, as kube-apiserver's
//! token authenticators give them. Sans IO.
//!
//! A token is bound to audiences, as a projected service-account token is (Istio's is bound
//! to `istio-ca`). Requests to the API authenticate only with a token bound to the API
//! server's own audience, [`API_AUDIENCE`]. A TokenReview asks about the audiences in its
//! `spec.audiences`, or the API server's when there are none, and succeeds when the
//! token is bound to at least one of them; its `status.audiences` are those.

use std::collections::HashMap;

use serde_json::{json, Map, Value};

use crate::error::ApiError;
use crate::rbac::User;

/// The API server's own audience (its service's name), implied when none is asked for.
pub const API_AUDIENCE: &str = "https://kubernetes.default.svc.cluster.local";

/// What a token stands for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Token {
    pub user: User,
    pub audiences: Vec<String>,
}

/// The tokens the server knows.
#[derive(Clone, Debug, Default)]
pub struct Tokens(HashMap<String, Token>);

/// Go's `%q` of a string slice: `["a" "b"]`.
fn quoted(list: &[String]) -> String {
    let items: Vec<String> = list
        .iter()
        .map(|s| serde_json::to_string(s).unwrap_or_default())
        .collect();
    format!("[{}]", items.join(" "))
}

impl Tokens {
    /// Makes `token` authenticate as `user` for `audiences`.
    pub fn insert(&mut self, token: &str, user: User, audiences: &[&str]) {
        let audiences = audiences.iter().map(|a| a.to_string()).collect();
        self.0.insert(token.to_string(), Token { user, audiences });
    }

    /// The user a request's bearer token authenticates as (a token for other audiences
    /// only authenticates nobody here).
    pub fn authenticate(&self, token: &str) -> Option<User> {
        self.review(token, &[]).ok().map(|(user, _)| user)
    }

    /// Authenticates `token` for `audiences` (none: the API server's): the user and the
    /// audiences asked for that the token is bound to, in the order asked, or the
    /// authenticator's error.
    pub fn review(&self, token: &str, audiences: &[String]) -> Result<(User, Vec<String>), String> {
        let t = self
            .0
            .get(token)
            .ok_or_else(|| "invalid bearer token".to_string())?;
        let wanted = if audiences.is_empty() {
            vec![API_AUDIENCE.to_string()]
        } else {
            audiences.to_vec()
        };
        let common: Vec<String> = wanted
            .iter()
            .filter(|a| t.audiences.contains(a))
            .cloned()
            .collect();
        if common.is_empty() {
            return Err(format!(
                "token audiences {} is invalid for the target audiences {}",
                quoted(&t.audiences),
                quoted(&wanted)
            ));
        }
        Ok((t.user.clone(), common))
    }
}

/// Answers a TokenReview (already type-checked): the request object with its `status`,
/// fields left out as Kubernetes leaves out empty ones. A token that does not authenticate
/// is an answer too (`error` says why), not a failed request.
pub fn token_review(tokens: &Tokens, mut review: Value) -> Result<Value, ApiError> {
    let token = review
        .pointer("/spec/token")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    if token.is_empty() {
        return Err(ApiError::bad_request(
            "token is required for TokenReview in authentication",
        ));
    }
    let audiences: Vec<String> = review
        .pointer("/spec/audiences")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    let status = match tokens.review(&token, &audiences) {
        Ok((user, audiences)) => {
            let mut u = Map::new();
            u.insert("username".into(), json!(user.name));
            if !user.uid.is_empty() {
                u.insert("uid".into(), json!(user.uid));
            }
            if !user.groups.is_empty() {
                u.insert("groups".into(), json!(user.groups));
            }
            json!({"authenticated": true, "user": u, "audiences": audiences})
        }
        Err(error) => json!({"user": {}, "error": error}),
    };
    let obj = review
        .as_object_mut()
        .ok_or_else(|| ApiError::bad_request("the request body must be a JSON object"))?;
    // Never stored, so no server fields: the typed object's zero creationTimestamp.
    let meta = obj.entry("metadata").or_insert_with(|| json!({}));
    if let Some(m) = meta.as_object_mut() {
        m.entry("creationTimestamp").or_insert(Value::Null);
    }
    obj.insert("status".into(), status);
    Ok(review)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens() -> Tokens {
        let mut t = Tokens::default();
        t.insert("api", User::named("alice", &[]), &[API_AUDIENCE]);
        t.insert("ca", User::service_account("default", "app"), &["istio-ca"]);
        t.insert(
            "both",
            User::service_account("default", "both"),
            &["istio-ca", API_AUDIENCE],
        );
        t
    }

    fn review(token: &str, audiences: &[&str]) -> Value {
        let body = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                          "spec": {"token": token, "audiences": audiences}});
        token_review(&tokens(), body).unwrap()
    }

    #[test]
    fn requests_need_the_api_audience() {
        let t = tokens();
        assert_eq!(t.authenticate("api").unwrap().name, "alice");
        assert!(t.authenticate("ca").is_none());
        assert!(t.authenticate("both").is_some());
        assert!(t.authenticate("nope").is_none());
    }

    #[test]
    fn reviews_intersect_audiences() {
        let r = review("ca", &["istio-ca"]);
        assert_eq!(r["status"]["authenticated"], true);
        assert_eq!(r["status"]["audiences"], json!(["istio-ca"]));
        let user = &r["status"]["user"];
        assert_eq!(user["username"], "system:serviceaccount:default:app");
        assert_eq!(
            user["uid"],
            json!(User::service_account("default", "app").uid)
        );
        assert_eq!(
            user["groups"],
            json!([
                "system:serviceaccounts",
                "system:serviceaccounts:default",
                "system:authenticated"
            ])
        );
        // The request is echoed, and nothing of a stored object is added.
        assert_eq!(r["spec"]["token"], "ca");
        assert_eq!(r["metadata"], json!({"creationTimestamp": null}));
        // Only the audiences both sides have, in the order asked.
        let r = review("both", &["other", API_AUDIENCE, "istio-ca"]);
        assert_eq!(r["status"]["audiences"], json!([API_AUDIENCE, "istio-ca"]));
        // None asked: the API server's is implied.
        let r = review("api", &[]);
        assert_eq!(r["status"]["audiences"], json!([API_AUDIENCE]));
        assert!(r["status"]["user"].get("uid").is_none());
    }

    #[test]
    fn failures_are_answers_with_an_error() {
        let r = review("ca", &[]);
        assert_eq!(
            r["status"],
            json!({"user": {}, "error": "token audiences [\"istio-ca\"] is invalid for the target audiences [\"https://kubernetes.default.svc.cluster.local\"]"})
        );
        let r = review("api", &["istio-ca"]);
        assert!(r["status"].get("authenticated").is_none());
        let r = review("unknown", &["istio-ca"]);
        assert_eq!(
            r["status"],
            json!({"user": {}, "error": "invalid bearer token"})
        );
        let e = token_review(&tokens(), json!({"spec": {}})).unwrap_err();
        assert_eq!(
            (e.code, e.message.as_str()),
            (400, "token is required for TokenReview in authentication")
        );
    }
}
