//! ambit's own xDS resources that carry a Kubernetes document as its user wrote it, read
//! by the waypoint with `ambit_manifests`, the reader its local file goes through (so
//! every check and default holds the same on both paths):
//!
//! - `ambit.waypoint.v1.Route`: an HTTPRoute or GRPCRoute attached to a Service
//!   ([`WaypointRoutes`]), named `<kind>/<namespace>/<name>`;
//! - `ambit.waypoint.v1.RequestAuthentication` ([`WaypointAuthns`]), named
//!   `RequestAuthentication/<namespace>/<name>`.
//!
//! The document is bounded ([`MAX_ROUTE_DOCUMENT`]) before it is read, and the estimate
//! charges every regular expression it could compile at the most a pattern may take.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::marker::PhantomData;
use std::sync::Arc;

use ambit_manifests::{parse_documents, ParseOptions, Parsed, WaypointAuthn};
use ambit_proto::ambit::waypoint::v1 as wp;
use ambit_proto::{WAYPOINT_AUTHN_TYPE, WAYPOINT_ROUTE_TYPE};
use ambit_routes::Route;
use prost::Message;

use crate::convert::ConvertError;
use crate::reject::Rejection;
use crate::resource::{message_name, Decoded, Measured, ResourceType, Slot};

/// The largest document taken, in bytes (Kubernetes' own limit on an object is far
/// larger; a route this size has hundreds of rules).
pub const MAX_ROUTE_DOCUMENT: usize = 64 * 1024;
/// The default budget of the documents of one type held, in estimated bytes.
pub const MAX_HELD_WAYPOINT_ROUTES: u64 = 256 * 1024 * 1024;
/// Estimated bytes held per byte of a document: the translated object keeps its strings
/// once, in vectors and maps with their own overhead.
const BYTES_PER_DOCUMENT_BYTE: u64 = 8;

/// What one kind of carried document is: its type, its messages, and what of a document
/// read it keeps.
pub trait ManifestKind: Debug + Send + Sync + 'static {
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

/// HTTPRoutes and GRPCRoutes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteDocuments;

impl ManifestKind for RouteDocuments {
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

impl ManifestKind for AuthnDocuments {
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

/// The subscription to one type of carried documents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestResources<K> {
    pub budget: u64,
    kind: PhantomData<fn() -> K>,
}

impl<K> Default for ManifestResources<K> {
    fn default() -> Self {
        ManifestResources {
            budget: MAX_HELD_WAYPOINT_ROUTES,
            kind: PhantomData,
        }
    }
}

/// The subscription to `ambit.waypoint.v1.Route`.
pub type WaypointRoutes = ManifestResources<RouteDocuments>;
/// The subscription to `ambit.waypoint.v1.RequestAuthentication`.
pub type WaypointAuthns = ManifestResources<AuthnDocuments>;

/// One change to a store of documents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ManifestOp<V> {
    Put(Arc<V>),
    /// By resource name.
    Remove(String),
}

pub type WaypointRouteOp = ManifestOp<Route>;
pub type WaypointAuthnOp = ManifestOp<WaypointAuthn>;

/// The documents from xDS, by resource name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestStore<V> {
    held: BTreeMap<String, Arc<V>>,
}

impl<V> Default for ManifestStore<V> {
    fn default() -> Self {
        ManifestStore {
            held: BTreeMap::new(),
        }
    }
}

impl<V> ManifestStore<V> {
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

pub type WaypointRouteStore = ManifestStore<Route>;
pub type WaypointAuthnStore = ManifestStore<WaypointAuthn>;

/// The resource name of an object: `<kind>/<namespace>/<name>`.
pub fn manifest_resource_name<K: ManifestKind>(v: &K::Value) -> String {
    let (kind, namespace, name) = K::identity(v);
    format!("{kind}/{namespace}/{name}")
}

/// The resource name of a route: `<kind>/<namespace>/<name>`.
pub fn route_resource_name(r: &Route) -> String {
    manifest_resource_name::<RouteDocuments>(r)
}

/// The object a wire message carries, read from its document as a file's would be, and
/// refused unless the document says the kind, namespace and name the message does.
pub fn manifest_from_proto<K: ManifestKind>(m: K::Message) -> Result<K::Value, ConvertError> {
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
    if manifest.len() > MAX_ROUTE_DOCUMENT {
        return Err(ConvertError::new(
            "manifest",
            format!(
                "{} bytes, more than the limit of {MAX_ROUTE_DOCUMENT}",
                manifest.len()
            ),
        ));
    }
    let options = ParseOptions {
        default_namespace: namespace.clone(),
        ..ParseOptions::default()
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

/// The route a wire message carries ([`manifest_from_proto`]).
pub fn waypoint_route_from_proto(m: wp::Route) -> Result<Route, ConvertError> {
    manifest_from_proto::<RouteDocuments>(m)
}

/// The wire message of a document (the control server's side).
pub fn to_proto_manifest<K: ManifestKind>(v: &K::Value, manifest: &str) -> K::Message {
    let (kind, namespace, name) = K::identity(v);
    K::message(kind, namespace, name, manifest.to_string())
}

/// The wire message of a route document.
pub fn to_proto_waypoint_route(route: &Route, manifest: &str) -> wp::Route {
    to_proto_manifest::<RouteDocuments>(route, manifest)
}

impl<K: ManifestKind> ResourceType for ManifestResources<K> {
    const TYPE_URL: &'static str = K::TYPE_URL;
    type Op = ManifestOp<K::Value>;
    type Store = ManifestStore<K::Value>;

    fn budget(&self) -> u64 {
        self.budget
    }

    fn measure(&self, name: &str, body: &[u8]) -> Result<Measured, Rejection> {
        // The document is most of the body; refuse an oversized one before reading it.
        if body.len() > MAX_ROUTE_DOCUMENT + 4096 {
            return Err(ConvertError::new(
                "manifest",
                format!(
                    "the message is {} bytes, more than a document of {MAX_ROUTE_DOCUMENT} can make",
                    body.len()
                ),
            )
            .into());
        }
        let patterns = count(body, b"RegularExpression") as u64;
        let estimate = name.len() as u64
            + body.len() as u64 * BYTES_PER_DOCUMENT_BYTE
            + patterns * ambit_routes::MAX_COMPILED_BYTES as u64;
        Ok(Measured {
            estimate,
            slot: Slot::First,
        })
    }

    fn decode(&self, body: &[u8]) -> Result<Decoded<Self::Op>, Rejection> {
        let m = K::Message::decode(body)
            .map_err(|e| Rejection::decode(message_name(Self::TYPE_URL), e))?;
        let value = manifest_from_proto::<K>(m)?;
        Ok(Decoded {
            key: manifest_resource_name::<K>(&value),
            what: "kind/namespace/name",
            op: ManifestOp::Put(Arc::new(value)),
        })
    }

    fn removal(&self, name: String) -> Self::Op {
        ManifestOp::Remove(name)
    }

    fn apply(ops: Vec<Self::Op>, store: &mut Self::Store) {
        for op in ops {
            match op {
                ManifestOp::Put(v) => {
                    store.held.insert(manifest_resource_name::<K>(&v), v);
                }
                ManifestOp::Remove(name) => {
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
mod tests {
    use super::*;

    const DOC: &str = "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: r, namespace: shop}\nspec:\n  parentRefs: [{group: \"\", kind: Service, name: reviews}]\n  rules:\n  - backendRefs: [{name: reviews-v2, port: 9080}]\n";

    fn message(kind: &str, ns: &str, name: &str, manifest: &str) -> wp::Route {
        wp::Route {
            kind: kind.into(),
            namespace: ns.into(),
            name: name.into(),
            manifest: manifest.into(),
        }
    }

    fn decode(m: wp::Route) -> Result<Decoded<WaypointRouteOp>, Rejection> {
        WaypointRoutes::default().decode(&m.encode_to_vec())
    }

    #[test]
    fn a_route_goes_over_the_wire_as_its_document_and_reads_the_same() {
        let file = parse_documents("f.yaml", DOC, &ParseOptions::default());
        let route = &file.routes[0].value;
        let wire = to_proto_waypoint_route(route, DOC);
        let decoded = decode(wire).unwrap();
        assert_eq!(decoded.key, "HTTPRoute/shop/r");
        assert_eq!(decoded.op, WaypointRouteOp::Put(Arc::new(route.clone())));
        // A document without a namespace takes the message's, as a file takes its
        // default.
        let bare = DOC.replace(", namespace: shop", "");
        assert!(decode(message("HTTPRoute", "shop", "r", &bare)).is_ok());
    }

    #[test]
    fn refusals_name_the_field() {
        let cases = [
            (message("TCPRoute", "shop", "r", DOC), "kind: \"TCPRoute\" is not HTTPRoute or GRPCRoute"),
            (message("HTTPRoute", "", "r", DOC), "namespace: must be set"),
            (message("HTTPRoute", "shop", "other", DOC), "not the HTTPRoute shop/other the message names"),
            (message("GRPCRoute", "shop", "r", DOC), "not the GRPCRoute shop/r"),
            (message("HTTPRoute", "shop", "r", &DOC.replace("port: 9080", "port: 0")), "manifest: HTTPRoute/shop/r:7:44: spec.rules[0].backendRefs[0].port: 0 is not a port"),
            (message("HTTPRoute", "shop", "r", &format!("{DOC}---\n{}", DOC.replace("name: r,", "name: s,"))), "holds 2 objects of its kind"),
            (message("HTTPRoute", "shop", "r", &DOC.replace("group: \"\", kind: Service, ", "group: gateway.networking.k8s.io, kind: Gateway, ")), "not an object a waypoint serves"),
        ];
        for (m, want) in cases {
            let err = decode(m).unwrap_err().to_string();
            assert!(err.contains(want), "{err}\nwanted: {want}");
        }
        let huge = message(
            "HTTPRoute",
            "shop",
            "r",
            &"#".repeat(MAX_ROUTE_DOCUMENT + 1),
        );
        let err = waypoint_route_from_proto(huge).unwrap_err().to_string();
        assert!(err.contains("more than the limit"), "{err}");
    }

    #[test]
    fn the_estimate_charges_the_document_and_its_patterns() {
        let ty = WaypointRoutes::default();
        let plain = ty.measure("n", DOC.as_bytes()).unwrap().estimate;
        assert_eq!(plain, 1 + DOC.len() as u64 * BYTES_PER_DOCUMENT_BYTE);
        let with_regex = format!("{DOC}# RegularExpression\n");
        let e = ty.measure("n", with_regex.as_bytes()).unwrap().estimate;
        assert!(e >= ambit_routes::MAX_COMPILED_BYTES as u64, "{e}");
        assert!(ty
            .measure("n", &vec![b'a'; MAX_ROUTE_DOCUMENT + 5000])
            .is_err());
    }

    /// A RequestAuthentication goes the same way, as its own type, and a route is not
    /// taken for one.
    #[test]
    fn a_request_authentication_goes_over_the_wire_as_its_document() {
        let doc = "apiVersion: security.istio.io/v1\nkind: RequestAuthentication\nmetadata: {name: jwt, namespace: shop}\nspec:\n  targetRefs: [{kind: Service, group: \"\", name: reviews}]\n  jwtRules: [{issuer: https://idp.example.com, jwksUri: https://idp.example.com/jwks}]\n";
        let file = parse_documents("f.yaml", doc, &ParseOptions::default());
        let authn = &file.authns[0].value;
        let wire = to_proto_manifest::<AuthnDocuments>(authn, doc);
        let decoded = WaypointAuthns::default()
            .decode(&wire.encode_to_vec())
            .unwrap();
        assert_eq!(decoded.key, "RequestAuthentication/shop/jwt");
        assert_eq!(decoded.op, ManifestOp::Put(Arc::new(authn.clone())));
        let route_as_authn = wp::RequestAuthentication {
            kind: "RequestAuthentication".into(),
            namespace: "shop".into(),
            name: "r".into(),
            manifest: DOC.into(),
        };
        let err = WaypointAuthns::default()
            .decode(&route_as_authn.encode_to_vec())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("holds 0 objects of its kind and 1 others"),
            "{err}"
        );
    }

    #[test]
    fn the_store_puts_and_removes_by_name() {
        let file = parse_documents("f.yaml", DOC, &ParseOptions::default());
        let route = Arc::new(file.routes[0].value.clone());
        let mut store = WaypointRouteStore::default();
        WaypointRoutes::apply(vec![WaypointRouteOp::Put(route.clone())], &mut store);
        assert_eq!(store.to_vec(), vec![route]);
        WaypointRoutes::apply(
            vec![WaypointRouteOp::Remove("HTTPRoute/shop/r".into())],
            &mut store,
        );
        assert!(store.is_empty());
    }
}
