//! What each waypoint is served, sans IO: the objects that target it, and only those.
//!
//! A waypoint (a service account that runs a waypoint Gateway, see [`Waypoints`]) is
//! shown an object when one of its targets (`targetRefs`, or a route's `parentRefs`) is:
//! - its Gateway;
//! - its GatewayClass (the readers take those from the root namespace only);
//! - a Service it fronts: the Service's `istio.io/use-waypoint` label names its Gateway
//!   (with `istio.io/use-waypoint-namespace` naming the Gateway's namespace when it is
//!   not the Service's), else, without such a label on the Service, its namespace's label
//!   does (`none` opts out);
//! - of a kind it cannot be told from here (a ServiceEntry, say, or a DestinationRule's
//!   `host`): shown to every waypoint, which takes only what it fronts.
//!
//! Objects are named as on the wire: `<kind>/<namespace>/<name>`.

use std::collections::{BTreeMap, HashMap};

use serde_json::Value;

use super::waypoints::Waypoints;

pub const USE_WAYPOINT: &str = "istio.io/use-waypoint";
pub const USE_WAYPOINT_NAMESPACE: &str = "istio.io/use-waypoint-namespace";
/// Services and namespaces whose labels are kept at most (a label pair each).
pub const MAX_LABELLED: usize = 500_000;

/// One target of an object, in the object's namespace unless it is a class.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Target {
    Gateway(String),
    GatewayClass(String),
    Service(String),
    /// A kind this server does not follow: shown to every waypoint.
    Other,
}

/// The targets an object names (`spec.targetRefs`, `spec.targetRef`, `spec.parentRefs`).
/// A DestinationRule naming its Service by `spec.host` only targets what cannot be told
/// from here (a host may be a short name, a wildcard or a ServiceEntry's): every waypoint
/// is shown it and applies it where it fronts the host.
pub fn targets_of(object: &Value) -> Vec<Target> {
    let spec = &object["spec"];
    if object["kind"] == "DestinationRule"
        && spec["targetRefs"].as_array().is_none_or(|t| t.is_empty())
    {
        return vec![Target::Other];
    }
    let mut refs: Vec<&Value> = Vec::new();
    for key in ["targetRefs", "parentRefs"] {
        if let Some(list) = spec[key].as_array() {
            refs.extend(list.iter());
        }
    }
    if spec["targetRef"].is_object() {
        refs.push(&spec["targetRef"]);
    }
    refs.into_iter()
        .map(|r| {
            let text = |f: &str| r[f].as_str().unwrap_or_default();
            // Gateway API's defaults: a parentRef's kind is Gateway, its group the API's.
            let kind = match text("kind") {
                "" if r.get("kind").is_none() => "Gateway",
                k => k,
            };
            let group = match r.get("group") {
                None => "gateway.networking.k8s.io",
                Some(_) => text("group"),
            };
            let name = text("name").to_string();
            match (group, kind) {
                ("gateway.networking.k8s.io", "Gateway") => Target::Gateway(name),
                ("gateway.networking.k8s.io", "GatewayClass") => Target::GatewayClass(name),
                ("" | "core", "Service") => Target::Service(name),
                _ => Target::Other,
            }
        })
        .collect()
}

/// The `use-waypoint` labels of a Service or a namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UseWaypoint {
    pub waypoint: Option<String>,
    pub namespace: Option<String>,
}

impl UseWaypoint {
    pub fn of(object: &Value) -> UseWaypoint {
        let label = |k: &str| {
            object["metadata"]["labels"][k]
                .as_str()
                .filter(|v| !v.is_empty())
                .map(str::to_string)
        };
        UseWaypoint {
            waypoint: label(USE_WAYPOINT),
            namespace: label(USE_WAYPOINT_NAMESPACE),
        }
    }
}

/// Everything visibility is decided from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Visibility {
    /// Object (`<kind>/<namespace>/<name>`) → its namespace and targets.
    objects: HashMap<String, (String, Vec<Target>)>,
    /// `namespace/name` of Services with a `use-waypoint` label → the labels.
    services: BTreeMap<String, UseWaypoint>,
    /// Namespaces with a `use-waypoint` label → the labels.
    namespaces: BTreeMap<String, UseWaypoint>,
    pub waypoints: Waypoints,
}

impl Visibility {
    pub fn set_object(&mut self, name: String, namespace: String, targets: Vec<Target>) {
        self.objects.insert(name, (namespace, targets));
    }

    pub fn clear_objects(&mut self) {
        self.objects.clear();
    }

    /// Takes a Service (or forgets it when `object` is None or carries no label).
    pub fn set_service(&mut self, key: String, labels: Option<UseWaypoint>) {
        set_labelled(&mut self.services, key, labels);
    }

    pub fn set_namespace(&mut self, name: String, labels: Option<UseWaypoint>) {
        set_labelled(&mut self.namespaces, name, labels);
    }

    pub fn clear_services(&mut self) {
        self.services.clear();
    }

    pub fn clear_namespaces(&mut self) {
        self.namespaces.clear();
    }

    /// Whether the waypoint of the service account `namespace/service_account` is shown
    /// the object `name`. An account that runs no waypoint is shown nothing.
    pub fn shows(&self, namespace: &str, service_account: &str, name: &str) -> bool {
        let Some((gateway, class)) = self.waypoints.gateway_of(namespace, service_account) else {
            return false;
        };
        // Unknown to the index (a stand-in's name is the object's): shown, the waypoint
        // decides.
        let Some((object_ns, targets)) = self.objects.get(name) else {
            return true;
        };
        targets.iter().any(|t| match t {
            Target::Gateway(g) => object_ns == namespace && g == gateway,
            Target::GatewayClass(c) => c == class,
            Target::Service(s) => self.fronts(namespace, gateway, object_ns, s),
            Target::Other => true,
        })
    }

    /// Whether the Gateway `gateway_ns/gateway` fronts the Service `ns/name`.
    fn fronts(&self, gateway_ns: &str, gateway: &str, ns: &str, name: &str) -> bool {
        let names_it = |l: &UseWaypoint| {
            l.waypoint.as_deref() == Some(gateway)
                && l.namespace.as_deref().unwrap_or(ns) == gateway_ns
        };
        match self.services.get(&format!("{ns}/{name}")) {
            Some(own) if own.waypoint.is_some() => names_it(own),
            _ => self.namespaces.get(ns).is_some_and(names_it),
        }
    }
}

fn set_labelled(map: &mut BTreeMap<String, UseWaypoint>, key: String, labels: Option<UseWaypoint>) {
    match labels {
        Some(l) if l.waypoint.is_some() && (map.len() < MAX_LABELLED || map.contains_key(&key)) => {
            map.insert(key, l);
        }
        _ => {
            map.remove(&key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn labels(waypoint: &str, ns: Option<&str>) -> Option<UseWaypoint> {
        Some(UseWaypoint {
            waypoint: Some(waypoint.into()),
            namespace: ns.map(str::to_string),
        })
    }

    fn world() -> Visibility {
        let mut v = Visibility::default();
        v.waypoints.apply_gateway(
            &json!({"metadata": {"namespace": "shop", "name": "waypoint"},
            "spec": {"gatewayClassName": "istio-waypoint"}}),
        );
        v.waypoints.apply_gateway(
            &json!({"metadata": {"namespace": "bank", "name": "waypoint"},
            "spec": {"gatewayClassName": "istio-waypoint"}}),
        );
        // shop's namespace uses shop/waypoint; one Service opts out, one uses bank's.
        v.set_namespace("shop".into(), labels("waypoint", None));
        v.set_service("shop/audit".into(), labels("none", None));
        v.set_service("shop/ledger".into(), labels("waypoint", Some("bank")));
        // A Service elsewhere that uses shop's waypoint across namespaces.
        v.set_service("edge/front".into(), labels("waypoint", Some("shop")));
        let target = |kind: &str, name: &str| match kind {
            "Gateway" => {
                json!({"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": name})
            }
            "GatewayClass" => {
                json!({"group": "gateway.networking.k8s.io", "kind": "GatewayClass", "name": name})
            }
            "ServiceEntry" => {
                json!({"group": "networking.istio.io", "kind": "ServiceEntry", "name": name})
            }
            _ => json!({"group": "", "kind": "Service", "name": name}),
        };
        let objects: &[(&str, &str, Value)] = &[
            (
                "AuthorizationPolicy/shop/on-gateway",
                "shop",
                json!({"spec": {"targetRefs": [target("Gateway", "waypoint")]}}),
            ),
            (
                "AuthorizationPolicy/shop/on-cart",
                "shop",
                json!({"spec": {"targetRefs": [target("Service", "cart")]}}),
            ),
            (
                "AuthorizationPolicy/shop/on-audit",
                "shop",
                json!({"spec": {"targetRefs": [target("Service", "audit")]}}),
            ),
            (
                "AuthorizationPolicy/shop/on-ledger",
                "shop",
                json!({"spec": {"targetRefs": [target("Service", "ledger")]}}),
            ),
            (
                "AuthorizationPolicy/edge/on-front",
                "edge",
                json!({"spec": {"targetRefs": [target("Service", "front")]}}),
            ),
            (
                "AuthorizationPolicy/istio-system/on-class",
                "istio-system",
                json!({"spec": {"targetRefs": [target("GatewayClass", "istio-waypoint")]}}),
            ),
            (
                "AuthorizationPolicy/shop/on-entry",
                "shop",
                json!({"spec": {"targetRefs": [target("ServiceEntry", "ext")]}}),
            ),
            // A route's parentRef without group or kind is a Gateway.
            (
                "HTTPRoute/shop/on-gateway",
                "shop",
                json!({"spec": {"parentRefs": [{"name": "waypoint"}]}}),
            ),
            (
                "HTTPRoute/shop/on-cart",
                "shop",
                json!({"spec": {"parentRefs": [{"group": "", "kind": "Service", "name": "cart", "port": 80}]}}),
            ),
        ];
        for (name, ns, object) in objects {
            v.set_object(name.to_string(), ns.to_string(), targets_of(object));
        }
        v
    }

    #[test]
    fn a_waypoint_is_shown_what_targets_it() {
        let v = world();
        let shop = |name: &str| v.shows("shop", "waypoint", name);
        let bank = |name: &str| v.shows("bank", "waypoint", name);
        let cases: &[(&str, bool, bool)] = &[
            ("AuthorizationPolicy/shop/on-gateway", true, false),
            // cart has no label of its own: its namespace's says shop's waypoint.
            ("AuthorizationPolicy/shop/on-cart", true, false),
            // audit opted out.
            ("AuthorizationPolicy/shop/on-audit", false, false),
            // ledger uses bank's waypoint, across namespaces.
            ("AuthorizationPolicy/shop/on-ledger", false, true),
            ("AuthorizationPolicy/edge/on-front", true, false),
            ("AuthorizationPolicy/istio-system/on-class", true, true),
            ("AuthorizationPolicy/shop/on-entry", true, true),
            ("HTTPRoute/shop/on-gateway", true, false),
            ("HTTPRoute/shop/on-cart", true, false),
            // Not in the index: shown.
            ("AuthorizationPolicy/shop/unknown", true, true),
        ];
        for (name, to_shop, to_bank) in cases {
            assert_eq!((shop(name), bank(name)), (*to_shop, *to_bank), "{name}");
        }
        // An account that runs no waypoint is shown nothing.
        assert!(!v.shows("shop", "web", "AuthorizationPolicy/istio-system/on-class"));
    }

    #[test]
    fn labels_come_and_go() {
        let mut v = world();
        v.set_namespace("shop".into(), None);
        assert!(!v.shows("shop", "waypoint", "AuthorizationPolicy/shop/on-cart"));
        v.set_service("shop/cart".into(), labels("waypoint", None));
        assert!(v.shows("shop", "waypoint", "AuthorizationPolicy/shop/on-cart"));
        v.set_service("shop/cart".into(), Some(UseWaypoint::default()));
        assert!(!v.shows("shop", "waypoint", "AuthorizationPolicy/shop/on-cart"));
        assert_eq!(
            UseWaypoint::of(
                &json!({"metadata": {"labels": {"istio.io/use-waypoint": "w",
                "istio.io/use-waypoint-namespace": "n"}}})
            ),
            UseWaypoint {
                waypoint: Some("w".into()),
                namespace: Some("n".into())
            }
        );
    }
}
