//! Kubernetes-shaped manifests, as users write them for Istio (`apiVersion`, `kind`,
//! `metadata`, `spec`; many documents per file, separated by `---`), read once into the
//! waypoint's model.
//!
//! Read: Istio's `AuthorizationPolicy` (`security.istio.io/v1` and `v1beta1`), checked as
//! Istio checks it and translated into a [`WaypointPolicy`]: the state crate's
//! [`Authorization`](ambit_state::Authorization) (its L7 attributes typed by the state's
//! own parsers), the action and the targets (`targetRefs`). A policy that attaches by
//! `selector`, or to a whole namespace, is ztunnel's: skipped, not an error.
//!
//! Istio's `RequestAuthentication` (same group and versions), attached the same way and
//! translated into a [`WaypointAuthn`]: its JWT rules as checked plain data (issuer,
//! audiences, key source, token locations, output headers, JWKS fetch timeout), for the
//! waypoint's JWT checks. One with a `selector`, or neither, is for sidecars: skipped.
//!
//! And the Gateway API's `HTTPRoute` (`gateway.networking.k8s.io/v1`, `v1beta1`) and
//! `GRPCRoute` (`v1`), checked as their CRDs check them and translated into the routes
//! model ([`ambit_gateway_routes::Route`]); a route attached to no Service of its namespace (a
//! Gateway's) is skipped. Other kinds are skipped with a note.
//!
//! And Istio's `DestinationRule` (`networking.istio.io/v1`, `v1beta1`, `v1alpha3`): its
//! traffic policy (load balancer, connection pool, outlier detection) checked and
//! translated into [`WaypointDestinationRule`].
//!
//! A bad document is refused alone, with the file, line, column and field at fault
//! ([`ManifestError`]); the other documents of the file still load.
//!
//! Sans-IO except [`load_path`], which reads a file or a directory.
#![forbid(unsafe_code)]

mod authn_schema;
mod authn_translate;
mod document;
mod dr_schema;
mod dr_translate;
mod error;
mod go_duration;
mod load;
mod locate;
mod model;
mod route_schema;
mod route_translate;
mod schema;
mod split;
mod translate;
mod values;

use std::collections::HashMap;

pub use authn_translate::{MAX_INLINE_JWKS_BYTES, REQUEST_AUTHENTICATION_VERSIONS};
pub use document::{AUTHORIZATION_POLICY_VERSIONS, SECURITY_GROUP};
pub use dr_translate::{DESTINATION_RULE_VERSIONS, NETWORKING_GROUP};
pub use error::{ErrorKind, ManifestError, ObjectRef, Position};
pub use load::{load_path, MAX_FILE_BYTES};
pub use model::{
    ClaimToHeader, JwksSource, JwtHeader, JwtRuleSpec, Located, Origin, Parsed, PolicyTarget,
    SkipReason, Skipped, WaypointAction, WaypointAuthn, WaypointDestinationRule, WaypointPolicy,
    DEFAULT_JWKS_TIMEOUT,
};
pub use route_translate::{GATEWAY_GROUP, GRPC_ROUTE_VERSIONS, HTTP_ROUTE_VERSIONS};
pub use translate::DRY_RUN_ANNOTATION;

use document::Document;

/// How manifests are read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseOptions {
    /// Istio's root namespace (MeshConfig `rootNamespace`): the only one whose policies
    /// may target a GatewayClass.
    pub root_namespace: String,
    /// The namespace of an object whose `metadata.namespace` is left out (as `kubectl
    /// apply` would use the current context's).
    pub default_namespace: String,
}

impl Default for ParseOptions {
    fn default() -> Self {
        ParseOptions {
            root_namespace: "istio-system".into(),
            default_namespace: "default".into(),
        }
    }
}

/// Reads every document of `text`. `source` names where it came from (a file path) and is
/// quoted in errors and origins.
pub fn parse_documents(source: &str, text: &str, options: &ParseOptions) -> Parsed {
    let mut c = Collector::default();
    c.add_text(source, text, options);
    c.parsed
}

/// Each document of `text` read alone, with its own text (for a control server to serve
/// a document as written, to be read again by the very reader that read it here).
pub fn each_document(source: &str, text: &str, options: &ParseOptions) -> Vec<(Parsed, String)> {
    split::documents(text)
        .into_iter()
        .enumerate()
        .map(|(index, seg)| {
            let mut c = Collector::default();
            c.add(document::read(source, index, seg, options));
            (c.parsed, seg.text.to_string())
        })
        .collect()
}

/// [`parse_documents`] of bytes that should be UTF-8 text (bytes that are not are one
/// error, placed at the first that is not).
pub fn parse_bytes(source: &str, bytes: &[u8], options: &ParseOptions) -> Parsed {
    let mut c = Collector::default();
    c.add_bytes(source, bytes, options);
    c.parsed
}

/// Gathers what documents come to, in reading order, refusing a second object of the same
/// kind, namespace and name (Kubernetes holds one; which was meant is unknown, so the
/// first is kept and the second reported).
#[derive(Debug, Default)]
pub(crate) struct Collector {
    pub parsed: Parsed,
    /// `kind/namespace/name` of every AuthorizationPolicy, RequestAuthentication and route
    /// read, and where.
    seen: HashMap<String, Origin>,
}

impl Collector {
    pub fn add_bytes(&mut self, source: &str, bytes: &[u8], options: &ParseOptions) {
        match std::str::from_utf8(bytes) {
            Ok(text) => self.add_text(source, text, options),
            Err(e) => {
                let valid = &bytes[..e.valid_up_to()];
                let line = valid.iter().filter(|b| **b == b'\n').count() + 1;
                let line_start = valid.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
                let column = String::from_utf8_lossy(&valid[line_start..])
                    .chars()
                    .count()
                    + 1;
                self.parsed.errors.push(ManifestError {
                    object: None,
                    kind: ErrorKind::Syntax,
                    source: source.to_string(),
                    position: Some(Position { line, column }),
                    field: String::new(),
                    message: "not UTF-8 text; manifests are UTF-8".into(),
                });
            }
        }
    }

    pub fn add_text(&mut self, source: &str, text: &str, options: &ParseOptions) {
        for (index, seg) in split::documents(text).into_iter().enumerate() {
            let doc = document::read(source, index, seg, options);
            self.add(doc);
        }
    }

    fn add(&mut self, doc: Document) {
        match doc {
            Document::Empty => {}
            Document::Refused(e) => self.parsed.errors.push(e),
            Document::Policy { policy, name_at } => {
                let a = &policy.value.authorization;
                if self.first(
                    "AuthorizationPolicy",
                    &a.namespace,
                    &a.name,
                    &policy.origin,
                    name_at,
                ) {
                    self.parsed.policies.push(policy);
                }
            }
            Document::Authn { authn, name_at } => {
                let a = &authn.value;
                if self.first(
                    "RequestAuthentication",
                    &a.namespace,
                    &a.name,
                    &authn.origin,
                    name_at,
                ) {
                    self.parsed.authns.push(authn);
                }
            }
            Document::Route { route, name_at } => {
                let r = &route.value;
                let kind = r.kind.to_string();
                if self.first(&kind, &r.namespace, &r.name, &route.origin, name_at) {
                    self.parsed.routes.push(route);
                }
            }
            Document::DestinationRule { rule, name_at } => {
                let r = &rule.value;
                if self.first(
                    "DestinationRule",
                    &r.namespace,
                    &r.name,
                    &rule.origin,
                    name_at,
                ) {
                    self.parsed.destination_rules.push(*rule);
                }
            }
            Document::Skipped { skipped, name_at } => {
                let s = &skipped.value;
                let keep = match (name_at, &s.namespace, &s.name) {
                    (Some(at), Some(ns), Some(name)) => {
                        self.first(&s.kind, ns, name, &skipped.origin, at)
                    }
                    _ => true,
                };
                if keep {
                    self.parsed.skipped.push(skipped);
                }
            }
        }
    }

    /// True for the first object of this kind, namespace and name; a later one is refused.
    fn first(
        &mut self,
        kind: &str,
        namespace: &str,
        name: &str,
        origin: &Origin,
        name_at: Position,
    ) -> bool {
        let key = format!("{namespace}/{name}");
        if let Some(first) = self.seen.get(&format!("{kind}/{key}")) {
            self.parsed.errors.push(ManifestError {
                object: None,
                kind: ErrorKind::Duplicate,
                source: origin.source.clone(),
                position: Some(name_at),
                field: "metadata.name".into(),
                message: format!(
                    "{kind} {key} is defined again; the first definition ({first}) is kept"
                ),
            });
            return false;
        }
        self.seen.insert(format!("{kind}/{key}"), origin.clone());
        true
    }
}

#[cfg(test)]
mod authn_tests;
#[cfg(test)]
mod dr_tests;
#[cfg(test)]
mod route_tests;
#[cfg(test)]
mod tests;
