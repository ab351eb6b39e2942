//! The waypoint's configuration over delta xDS: ambit's own resource types, each carrying a
//! Kubernetes document as its user wrote it, read by the waypoint with `ambit_manifests`,
//! the reader its local file goes through (so every check and default holds the same on
//! both paths, with no second schema to drift):
//!
//! - `ambit.waypoint.v1.AuthorizationPolicy` ([`WaypointPolicies`]);
//! - `ambit.waypoint.v1.Route`: an HTTPRoute or GRPCRoute attached to a Service
//!   ([`WaypointRoutes`]);
//! - `ambit.waypoint.v1.RequestAuthentication` ([`WaypointAuthns`]);
//! - `ambit.waypoint.v1.DestinationRule` ([`WaypointDestinationRules`]).
//!
//! Each is named `<kind>/<namespace>/<name>`. The document is bounded
//! ([`MAX_DOCUMENT_BYTES`]) before it is read, and the estimate charges every regular
//! expression it could compile at the most a pattern may take. A waypoint subscribes to
//! them beside `ambit_xds::Addresses` (`DeltaClient::subscribing(..).subscribe(..)`) and
//! applies each batch to a [`DocumentStore`]; `ambit control` makes the resources.

#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::marker::PhantomData;
use std::sync::Arc;

use ambit_gateway_routes::Route;
use ambit_manifests::{
    parse_documents, ParseOptions, Parsed, WaypointAuthn, WaypointDestinationRule, WaypointPolicy,
};
use ambit_proto::ambit::waypoint::v1 as wp;
use ambit_proto::{
    WAYPOINT_AUTHN_TYPE, WAYPOINT_DESTINATION_RULE_TYPE, WAYPOINT_POLICY_TYPE, WAYPOINT_ROUTE_TYPE,
};
use ambit_xds::resource::message_name;
use ambit_xds::{ConvertError, Decoded, Measured, Rejection, ResourceType, Slot};
use prost::Message;

/// The largest document taken, in bytes (Kubernetes' own limit on an object is far
/// larger; a route or policy this size has hundreds of rules).
pub const MAX_DOCUMENT_BYTES: usize = 64 * 1024;
/// The default budget of the documents of one type held, in estimated bytes.
pub const MAX_HELD_DOCUMENTS: u64 = 256 * 1024 * 1024;
/// Estimated bytes held per byte of a document: the translated object keeps its strings
/// once, in vectors and maps with their own overhead.
const BYTES_PER_DOCUMENT_BYTE: u64 = 8;

/// What one kind of carried document is: its type, its messages, and what of a document
/// read it keeps.
pub trait DocumentKind: Debug + Send + Sync + 'static {
    const TYPE_URL: &'static str;
    /// The document kinds the type carries.
    const KINDS: &'static [&'static str];
    type Value: Debug + Clone + PartialEq + Send + Sync + 'static;
    type Message: Message + Default;
    /// The objects of this kind a document read to.
    fn take(parsed: &mut Parsed) -> Vec<Self::Value>;
    /// `(kind, namespace, name)`.
    fn identity(v: &Self::Value) -> (String, String, String);
    fn message(kind: String, namespace: String, name: String, manifest: String) -> Self::Message;
    /// `(kind, namespace, name, manifest)`.
    fn fields(m: Self::Message) -> (String, String, String, String);
}

/// AuthorizationPolicies that attach to waypoints by `targetRefs`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyDocuments;

impl DocumentKind for PolicyDocuments {
    const TYPE_URL: &'static str = WAYPOINT_POLICY_TYPE;
    const KINDS: &'static [&'static str] = &["AuthorizationPolicy"];
    type Value = WaypointPolicy;
    type Message = wp::AuthorizationPolicy;
    fn take(parsed: &mut Parsed) -> Vec<WaypointPolicy> {
        std::mem::take(&mut parsed.policies)
            .into_iter()
            .map(|p| p.value)
            .collect()
    }
    fn identity(p: &WaypointPolicy) -> (String, String, String) {
        (
            "AuthorizationPolicy".into(),
            p.authorization.namespace.clone(),
            p.authorization.name.clone(),
        )
    }
    fn message(
        kind: String,
        namespace: String,
        name: String,
        manifest: String,
    ) -> wp::AuthorizationPolicy {
        wp::AuthorizationPolicy {
            kind,
            namespace,
            name,
            manifest,
        }
    }
    fn fields(m: wp::AuthorizationPolicy) -> (String, String, String, String) {
        (m.kind, m.namespace, m.name, m.manifest)
    }
}

/// HTTPRoutes and GRPCRoutes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteDocuments;

impl DocumentKind for RouteDocuments {
    const TYPE_URL: &'static str = WAYPOINT_ROUTE_TYPE;
    const KINDS: &'static [&'static str] = &["HTTPRoute", "GRPCRoute"];
    type Value = Route;
    type Message = wp::Route;
    fn take(parsed: &mut Parsed) -> Vec<Route> {
        std::mem::take(&mut parsed.routes)
            .into_iter()
            .map(|r| r.value)
            .collect()
    }
    fn identity(r: &Route) -> (String, String, String) {
        (r.kind.to_string(), r.namespace.clone(), r.name.clone())
    }
    fn message(kind: String, namespace: String, name: String, manifest: String) -> wp::Route {
        wp::Route {
            kind,
            namespace,
            name,
            manifest,
        }
    }
    fn fields(m: wp::Route) -> (String, String, String, String) {
        (m.kind, m.namespace, m.name, m.manifest)
    }
}

/// RequestAuthentications.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthnDocuments;

impl DocumentKind for AuthnDocuments {
    const TYPE_URL: &'static str = WAYPOINT_AUTHN_TYPE;
    const KINDS: &'static [&'static str] = &["RequestAuthentication"];
    type Value = WaypointAuthn;
    type Message = wp::RequestAuthentication;
    fn take(parsed: &mut Parsed) -> Vec<WaypointAuthn> {
        std::mem::take(&mut parsed.authns)
            .into_iter()
            .map(|a| a.value)
            .collect()
    }
    fn identity(a: &WaypointAuthn) -> (String, String, String) {
        (
            "RequestAuthentication".into(),
            a.namespace.clone(),
            a.name.clone(),
        )
    }
    fn message(
        kind: String,
        namespace: String,
        name: String,
        manifest: String,
    ) -> wp::RequestAuthentication {
        wp::RequestAuthentication {
            kind,
            namespace,
            name,
            manifest,
        }
    }
    fn fields(m: wp::RequestAuthentication) -> (String, String, String, String) {
        (m.kind, m.namespace, m.name, m.manifest)
    }
}

/// DestinationRules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DestinationRuleDocuments;

impl DocumentKind for DestinationRuleDocuments {
    const TYPE_URL: &'static str = WAYPOINT_DESTINATION_RULE_TYPE;
    const KINDS: &'static [&'static str] = &["DestinationRule"];
    type Value = WaypointDestinationRule;
    type Message = wp::DestinationRule;
    fn take(parsed: &mut Parsed) -> Vec<WaypointDestinationRule> {
        std::mem::take(&mut parsed.destination_rules)
            .into_iter()
            .map(|r| r.value)
            .collect()
    }
    fn identity(r: &WaypointDestinationRule) -> (String, String, String) {
        (
            "DestinationRule".into(),
            r.namespace.clone(),
            r.name.clone(),
        )
    }
    fn message(
        kind: String,
        namespace: String,
        name: String,
        manifest: String,
    ) -> wp::DestinationRule {
        wp::DestinationRule {
            kind,
            namespace,
            name,
            manifest,
        }
    }
    fn fields(m: wp::DestinationRule) -> (String, String, String, String) {
        (m.kind, m.namespace, m.name, m.manifest)
    }
}

/// The subscription to one type of carried documents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Documents<K> {
    /// Estimated bytes the documents held may take.
    pub budget: u64,
    /// Istio's root namespace (MeshConfig `rootNamespace`), the only one whose policies may
    /// target a GatewayClass: the waypoint's own, as it reads a file with.
    pub root_namespace: String,
    kind: PhantomData<fn() -> K>,
}

impl<K> Default for Documents<K> {
    fn default() -> Self {
        Documents {
            budget: MAX_HELD_DOCUMENTS,
            root_namespace: ParseOptions::default().root_namespace,
            kind: PhantomData,
        }
    }
}

impl<K> Documents<K> {
    /// The subscription of a waypoint whose root namespace is `root_namespace`.
    pub fn with_root_namespace(root_namespace: &str) -> Self {
        Documents {
            root_namespace: root_namespace.to_string(),
            ..Documents::default()
        }
    }
}

/// The subscription to `ambit.waypoint.v1.AuthorizationPolicy`.
pub type WaypointPolicies = Documents<PolicyDocuments>;
/// The subscription to `ambit.waypoint.v1.Route`.
pub type WaypointRoutes = Documents<RouteDocuments>;
/// The subscription to `ambit.waypoint.v1.RequestAuthentication`.
pub type WaypointAuthns = Documents<AuthnDocuments>;
/// The subscription to `ambit.waypoint.v1.DestinationRule`.
pub type WaypointDestinationRules = Documents<DestinationRuleDocuments>;

/// One change to a store of documents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DocumentOp<V> {
    Put(Arc<V>),
    /// By resource name.
    Remove(String),
}

/// The documents of one type from xDS, by resource name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DocumentStore<V> {
    held: BTreeMap<String, Arc<V>>,
}

impl<V> Default for DocumentStore<V> {
    fn default() -> Self {
        DocumentStore {
            held: BTreeMap::new(),
        }
    }
}

impl<V> DocumentStore<V> {
    /// The object held under a resource name (`<kind>/<namespace>/<name>`).
    pub fn get(&self, name: &str) -> Option<&Arc<V>> {
        self.held.get(name)
    }

    /// Every object, in name order, shared.
    pub fn to_vec(&self) -> Vec<Arc<V>> {
        self.held.values().cloned().collect()
    }

    pub fn len(&self) -> usize {
        self.held.len()
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }
}

/// The resource name of an object: `<kind>/<namespace>/<name>`.
pub fn resource_name<K: DocumentKind>(v: &K::Value) -> String {
    let (kind, namespace, name) = K::identity(v);
    format!("{kind}/{namespace}/{name}")
}

/// The object a wire message carries, read from its document as a file's would be (with
/// `root_namespace`), and refused unless the document says the kind, namespace and name
/// the message does.
pub fn from_proto<K: DocumentKind>(
    m: K::Message,
    root_namespace: &str,
) -> Result<K::Value, ConvertError> {
    let (kind, namespace, name, manifest) = K::fields(m);
    if !K::KINDS.contains(&kind.as_str()) {
        return Err(ConvertError::new(
            "kind",
            format!("{kind:?} is not {}", K::KINDS.join(" or ")),
        ));
    }
    for (field, value) in [("namespace", &namespace), ("name", &name)] {
        if value.is_empty() {
            return Err(ConvertError::new(field, "must be set"));
        }
    }
    if manifest.len() > MAX_DOCUMENT_BYTES {
        return Err(ConvertError::new(
            "manifest",
            format!(
                "{} bytes, more than the limit of {MAX_DOCUMENT_BYTES}",
                manifest.len()
            ),
        ));
    }
    let options = ParseOptions {
        default_namespace: namespace.clone(),
        root_namespace: root_namespace.to_string(),
    };
    let source = format!("{kind}/{namespace}/{name}");
    let mut parsed = parse_documents(&source, &manifest, &options);
    if let Some(e) = parsed.errors.first() {
        return Err(ConvertError::new("manifest", e));
    }
    if let Some(s) = parsed.skipped.first() {
        return Err(ConvertError::new(
            "manifest",
            format!("not an object a waypoint serves: {:?}", s.value.reason),
        ));
    }
    let mut found = K::take(&mut parsed);
    let others = parsed.policies.len() + parsed.routes.len() + parsed.authns.len();
    if found.len() != 1 || others != 0 {
        return Err(ConvertError::new(
            "manifest",
            format!(
                "holds {} objects of its kind and {others} others; exactly one is carried",
                found.len()
            ),
        ));
    }
    let value = found.remove(0);
    let said = K::identity(&value);
    if said != (kind.clone(), namespace.clone(), name.clone()) {
        return Err(ConvertError::new(
            "manifest",
            format!(
                "the document is {} {}/{}, not the {kind} {namespace}/{name} the message names",
                said.0, said.1, said.2
            ),
        ));
    }
    Ok(value)
}

/// The wire message of a document (the control server's side).
pub fn to_proto<K: DocumentKind>(v: &K::Value, manifest: &str) -> K::Message {
    let (kind, namespace, name) = K::identity(v);
    K::message(kind, namespace, name, manifest.to_string())
}

impl<K: DocumentKind> ResourceType for Documents<K> {
    const TYPE_URL: &'static str = K::TYPE_URL;
    type Op = DocumentOp<K::Value>;
    type Store = DocumentStore<K::Value>;

    fn budget(&self) -> u64 {
        self.budget
    }

    fn measure(&self, name: &str, body: &[u8]) -> Result<Measured, Rejection> {
        // The document is most of the body; refuse an oversized one before reading it.
        if body.len() > MAX_DOCUMENT_BYTES + 4096 {
            return Err(ConvertError::new(
                "manifest",
                format!(
                    "the message is {} bytes, more than a document of {MAX_DOCUMENT_BYTES} can make",
                    body.len()
                ),
            )
            .into());
        }
        let patterns = count(body, b"RegularExpression") as u64;
        let estimate = name.len() as u64
            + body.len() as u64 * BYTES_PER_DOCUMENT_BYTE
            + patterns * ambit_gateway_routes::MAX_COMPILED_BYTES as u64;
        Ok(Measured {
            estimate,
            slot: Slot::First,
        })
    }

    fn decode(&self, body: &[u8]) -> Result<Decoded<Self::Op>, Rejection> {
        let m = K::Message::decode(body)
            .map_err(|e| Rejection::decode(message_name(Self::TYPE_URL), e))?;
        let value = from_proto::<K>(m, &self.root_namespace)?;
        Ok(Decoded {
            key: resource_name::<K>(&value),
            what: "kind/namespace/name",
            op: DocumentOp::Put(Arc::new(value)),
        })
    }

    fn removal(&self, name: String) -> Self::Op {
        DocumentOp::Remove(name)
    }

    fn apply(ops: Vec<Self::Op>, store: &mut Self::Store) {
        for op in ops {
            match op {
                DocumentOp::Put(v) => {
                    store.held.insert(resource_name::<K>(&v), v);
                }
                DocumentOp::Remove(name) => {
                    store.held.remove(&name);
                }
            }
        }
    }
}

/// Occurrences of `needle` in `hay`.
fn count(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len()).filter(|w| *w == needle).count()
}

#[cfg(test)]
mod tests;
