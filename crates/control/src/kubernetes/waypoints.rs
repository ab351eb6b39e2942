//! Which service accounts run a waypoint, from the Gateways and GatewayClasses watched
//! (sans IO). istiod deploys a waypoint Gateway `<namespace>/<name>` of Istio's waypoint
//! class as pods of the ServiceAccount `<namespace>/<name>`, and one of another class
//! whose controller is Istio's mesh controller as `<namespace>/<name>-<class>` (the
//! deployer's naming: the class is added unless it is its controller's default class).

use std::collections::BTreeMap;

use serde_json::Value;

/// Istio's waypoint GatewayClass.
pub const WAYPOINT_CLASS: &str = "istio-waypoint";
/// The controller of the classes istiod deploys as waypoints.
pub const MESH_CONTROLLER: &str = "istio.io/mesh-controller";

/// The Gateways (`namespace/name` → class) and GatewayClasses (name → controller) known.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Waypoints {
    gateways: BTreeMap<(String, String), String>,
    classes: BTreeMap<String, String>,
}

impl Waypoints {
    /// Takes a Gateway as the API server returned it (one without a class is forgotten).
    pub fn apply_gateway(&mut self, object: &Value) {
        let Some((ns, name)) = namespaced_name(object) else {
            return;
        };
        match text(object, "/spec/gatewayClassName") {
            Some(class) => {
                self.gateways.insert((ns, name), class);
            }
            None => {
                self.gateways.remove(&(ns, name));
            }
        }
    }

    pub fn delete_gateway(&mut self, object: &Value) {
        if let Some(key) = namespaced_name(object) {
            self.gateways.remove(&key);
        }
    }

    /// Takes a GatewayClass.
    pub fn apply_class(&mut self, object: &Value) {
        let Some(name) = text(object, "/metadata/name") else {
            return;
        };
        let controller = text(object, "/spec/controllerName").unwrap_or_default();
        self.classes.insert(name, controller);
    }

    pub fn delete_class(&mut self, object: &Value) {
        if let Some(name) = text(object, "/metadata/name") {
            self.classes.remove(&name);
        }
    }

    /// Forgets every Gateway (a re-list replaces them).
    pub fn clear_gateways(&mut self) {
        self.gateways.clear();
    }

    /// Forgets every GatewayClass.
    pub fn clear_classes(&mut self) {
        self.classes.clear();
    }

    /// Whether the service account `namespace/name` runs a waypoint Gateway (names
    /// compared byte for byte).
    pub fn runs_waypoint(&self, namespace: &str, service_account: &str) -> bool {
        self.gateway_of(namespace, service_account).is_some()
    }

    /// The waypoint Gateway (in the account's namespace) and its class that the service
    /// account `namespace/name` runs.
    pub fn gateway_of(&self, namespace: &str, service_account: &str) -> Option<(&str, &str)> {
        let key = (namespace.to_string(), service_account.to_string());
        if let Some(((_, gateway), class)) = self.gateways.get_key_value(&key) {
            if class == WAYPOINT_CLASS {
                return Some((gateway.as_str(), class.as_str()));
            }
        }
        let in_namespace = (namespace.to_string(), String::new())..;
        self.gateways
            .range(in_namespace)
            .take_while(|((ns, _), _)| ns == namespace)
            .find(|((_, gateway), class)| {
                *class != WAYPOINT_CLASS
                    && self
                        .classes
                        .get(*class)
                        .is_some_and(|c| c == MESH_CONTROLLER)
                    && service_account.strip_prefix(gateway.as_str())
                        == Some(&format!("-{class}")[..])
            })
            .map(|((_, gateway), class)| (gateway.as_str(), class.as_str()))
    }

    pub fn gateways(&self) -> usize {
        self.gateways.len()
    }
}

fn text(object: &Value, pointer: &str) -> Option<String> {
    object
        .pointer(pointer)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

fn namespaced_name(object: &Value) -> Option<(String, String)> {
    Some((
        text(object, "/metadata/namespace")?,
        text(object, "/metadata/name")?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn gateway(ns: &str, name: &str, class: &str) -> Value {
        json!({"metadata": {"namespace": ns, "name": name}, "spec": {"gatewayClassName": class}})
    }

    fn class(name: &str, controller: &str) -> Value {
        json!({"metadata": {"name": name}, "spec": {"controllerName": controller}})
    }

    #[test]
    fn a_service_account_runs_a_waypoint_when_its_gateway_is_one() {
        let mut w = Waypoints::default();
        w.apply_gateway(&gateway("shop", "waypoint", "istio-waypoint"));
        w.apply_gateway(&gateway("shop", "ingress", "istio"));
        w.apply_gateway(&gateway("shop", "custom", "ambit-waypoint"));
        w.apply_class(&class("istio", "istio.io/gateway-controller"));
        let cases: &[(&str, &str, bool)] = &[
            ("shop", "waypoint", true),
            // Another namespace's account of the same name.
            ("bank", "waypoint", false),
            // An ingress Gateway is not a waypoint.
            ("shop", "ingress", false),
            // A custom class, until its controller is known to be Istio's mesh controller.
            ("shop", "custom-ambit-waypoint", false),
            ("shop", "custom", false),
            ("shop", "nobody", false),
            // Compared byte for byte.
            ("shop", "Waypoint", false),
        ];
        for (ns, sa, want) in cases {
            assert_eq!(w.runs_waypoint(ns, sa), *want, "{ns}/{sa}");
        }
        w.apply_class(&class("ambit-waypoint", MESH_CONTROLLER));
        // Its account is named `<gateway>-<class>`, as istiod names it.
        assert!(w.runs_waypoint("shop", "custom-ambit-waypoint"));
        assert!(!w.runs_waypoint("shop", "custom"));
        assert!(!w.runs_waypoint("bank", "custom-ambit-waypoint"));
        w.delete_class(&class("ambit-waypoint", ""));
        assert!(!w.runs_waypoint("shop", "custom-ambit-waypoint"));
        w.delete_gateway(&gateway("shop", "waypoint", ""));
        assert!(!w.runs_waypoint("shop", "waypoint"));
        // A Gateway whose class is removed is forgotten.
        w.apply_gateway(&json!({"metadata": {"namespace": "shop", "name": "ingress"}, "spec": {}}));
        assert_eq!(w.gateways(), 1);
        w.clear_gateways();
        assert_eq!(w.gateways(), 0);
    }
}
