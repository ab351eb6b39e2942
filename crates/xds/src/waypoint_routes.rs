//! `ambit.waypoint.v1.Route` as a [`ResourceType`]: the HTTPRoutes and GRPCRoutes attached
//! to Services, each carried as the Kubernetes document its user wrote and read by the
//! waypoint with `ambit_manifests`, the reader its local file goes through (so every
//! check and default holds the same on both paths). Named `<kind>/<namespace>/<name>`,
//! held in a [`WaypointRouteStore`].
//!
//! The document is bounded ([`MAX_ROUTE_DOCUMENT`]) before it is read, and its estimate
//! charges every regular expression it could compile at the most a pattern may take.

use std::collections::BTreeMap;
use std::sync::Arc;

use ambit_manifests::{parse_documents, ParseOptions};
use ambit_proto::ambit::waypoint::v1 as wp;
use ambit_proto::WAYPOINT_ROUTE_TYPE;
use ambit_routes::Route;
use prost::Message;

use crate::convert::ConvertError;
use crate::reject::Rejection;
use crate::resource::{message_name, Decoded, Measured, ResourceType, Slot};

/// The largest route document taken, in bytes (Kubernetes' own limit on an object is far
/// larger; a route this size has hundreds of rules).
pub const MAX_ROUTE_DOCUMENT: usize = 64 * 1024;
/// The default budget of the routes held, in estimated bytes.
pub const MAX_HELD_WAYPOINT_ROUTES: u64 = 256 * 1024 * 1024;
/// Estimated bytes held per byte of a document: the translated route keeps its strings
/// once, in vectors and maps with their own overhead.
const BYTES_PER_DOCUMENT_BYTE: u64 = 8;

/// The subscription to `ambit.waypoint.v1.Route`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaypointRoutes {
    pub budget: u64,
}

impl Default for WaypointRoutes {
    fn default() -> Self {
        WaypointRoutes {
            budget: MAX_HELD_WAYPOINT_ROUTES,
        }
    }
}

/// One change to the store of routes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WaypointRouteOp {
    Put(Arc<Route>),
    /// By `<kind>/<namespace>/<name>`.
    Remove(String),
}

/// The waypoint's routes from xDS, by `<kind>/<namespace>/<name>`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WaypointRouteStore {
    routes: BTreeMap<String, Arc<Route>>,
}

impl WaypointRouteStore {
    /// Every route, in name order, shared (for a waypoint's route table).
    pub fn to_vec(&self) -> Vec<Arc<Route>> {
        self.routes.values().cloned().collect()
    }

    pub fn len(&self) -> usize {
        self.routes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }
}

/// The resource name of a route: `<kind>/<namespace>/<name>`.
pub fn route_resource_name(r: &Route) -> String {
    format!("{}/{}/{}", r.kind, r.namespace, r.name)
}

/// The route a wire message carries, read from its document as a file's would be, and
/// refused unless the document says the kind, namespace and name the message does.
pub fn waypoint_route_from_proto(m: wp::Route) -> Result<Route, ConvertError> {
    if !matches!(m.kind.as_str(), "HTTPRoute" | "GRPCRoute") {
        return Err(ConvertError::new(
            "kind",
            format!("{:?} is not HTTPRoute or GRPCRoute", m.kind),
        ));
    }
    for (field, value) in [("namespace", &m.namespace), ("name", &m.name)] {
        if value.is_empty() {
            return Err(ConvertError::new(field, "must be set"));
        }
    }
    if m.manifest.len() > MAX_ROUTE_DOCUMENT {
        return Err(ConvertError::new(
            "manifest",
            format!(
                "{} bytes, more than the limit of {MAX_ROUTE_DOCUMENT}",
                m.manifest.len()
            ),
        ));
    }
    let options = ParseOptions {
        default_namespace: m.namespace.clone(),
        ..ParseOptions::default()
    };
    let source = format!("{}/{}/{}", m.kind, m.namespace, m.name);
    let mut parsed = parse_documents(&source, &m.manifest, &options);
    if let Some(e) = parsed.errors.first() {
        return Err(ConvertError::new("manifest", e));
    }
    if let Some(s) = parsed.skipped.first() {
        return Err(ConvertError::new(
            "manifest",
            format!("not a route a waypoint serves: {:?}", s.value.reason),
        ));
    }
    if parsed.routes.len() != 1 || !parsed.policies.is_empty() {
        return Err(ConvertError::new(
            "manifest",
            format!(
                "holds {} routes and {} other objects; exactly one route is carried",
                parsed.routes.len(),
                parsed.policies.len()
            ),
        ));
    }
    let route = parsed.routes.remove(0).value;
    let said = (route.kind.to_string(), &route.namespace, &route.name);
    if said != (m.kind.clone(), &m.namespace, &m.name) {
        return Err(ConvertError::new(
            "manifest",
            format!(
                "the document is {} {}/{}, not the {} {}/{} the message names",
                said.0, said.1, said.2, m.kind, m.namespace, m.name
            ),
        ));
    }
    Ok(route)
}

/// The wire message of a route document (the control server's side).
pub fn to_proto_waypoint_route(route: &Route, manifest: &str) -> wp::Route {
    wp::Route {
        kind: route.kind.to_string(),
        namespace: route.namespace.clone(),
        name: route.name.clone(),
        manifest: manifest.to_string(),
    }
}

impl ResourceType for WaypointRoutes {
    const TYPE_URL: &'static str = WAYPOINT_ROUTE_TYPE;
    type Op = WaypointRouteOp;
    type Store = WaypointRouteStore;

    fn budget(&self) -> u64 {
        self.budget
    }

    fn measure(&self, name: &str, body: &[u8]) -> Result<Measured, Rejection> {
        // The document is most of the body; refuse an oversized one before reading it.
        if body.len() > MAX_ROUTE_DOCUMENT + 4096 {
            return Err(ConvertError::new(
                "manifest",
                format!(
                    "the message is {} bytes, more than a route document of {MAX_ROUTE_DOCUMENT} can make",
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

    fn decode(&self, body: &[u8]) -> Result<Decoded<WaypointRouteOp>, Rejection> {
        let m = wp::Route::decode(body)
            .map_err(|e| Rejection::decode(message_name(Self::TYPE_URL), e))?;
        let route = waypoint_route_from_proto(m)?;
        Ok(Decoded {
            key: route_resource_name(&route),
            what: "route kind/namespace/name",
            op: WaypointRouteOp::Put(Arc::new(route)),
        })
    }

    fn removal(&self, name: String) -> WaypointRouteOp {
        WaypointRouteOp::Remove(name)
    }

    fn apply(ops: Vec<WaypointRouteOp>, store: &mut WaypointRouteStore) {
        for op in ops {
            match op {
                WaypointRouteOp::Put(r) => {
                    store.routes.insert(route_resource_name(&r), r);
                }
                WaypointRouteOp::Remove(name) => {
                    store.routes.remove(&name);
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
            (message("HTTPRoute", "shop", "r", &format!("{DOC}---\n{}", DOC.replace("name: r,", "name: s,"))), "holds 2 routes"),
            (message("HTTPRoute", "shop", "r", &DOC.replace("group: \"\", kind: Service, ", "group: gateway.networking.k8s.io, kind: Gateway, ")), "not a route a waypoint serves"),
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
