//! The store's sections of `/config_dump`, shaped like ztunnel's (camelCase keys).

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{json, Map, Value};

use crate::name::Name;
use crate::service::LoadBalancerHealthPolicy;
use crate::store::ProxyState;
use crate::workload::HealthStatus;
use crate::workload::Workload;

impl ProxyState {
    /// `{workloads, services, policies, stagedServices}`: workloads sorted by uid,
    /// services by hostname (then namespace) with their endpoints, policies by
    /// `namespace/name`, and endpoints of services referenced but not (yet) known.
    ///
    /// As ztunnel shows them: a workload's `services` appear as the services' endpoints,
    /// not under the workload, and an unhealthy workload is an endpoint only of services
    /// whose health policy is `AllowAll`.
    pub fn dump(&self) -> Value {
        let workloads: Vec<Value> = self
            .workloads()
            .map(|w| {
                let mut v = to_value(&**w);
                if let Value::Object(m) = &mut v {
                    m.remove("services");
                }
                v
            })
            .collect();

        let mut services: Vec<_> = self.services().collect();
        services.sort_by(|a, b| (&a.hostname, &a.namespace).cmp(&(&b.hostname, &b.namespace)));
        let services: Vec<Value> = services
            .into_iter()
            .map(|s| {
                let mut v = to_value(&**s);
                let allow_unhealthy = s.health_policy() == LoadBalancerHealthPolicy::AllowAll;
                let key = s.key();
                let endpoints = self
                    .endpoint_map(&key)
                    .map(|eps| Self::endpoints_value(&key, eps, allow_unhealthy))
                    .unwrap_or_else(|| Value::Object(Map::new()));
                if let Value::Object(m) = &mut v {
                    m.insert("endpoints".into(), endpoints);
                }
                v
            })
            .collect();

        let policies: Vec<Value> = self.policies().map(|p| to_value(&**p)).collect();

        let staged: Map<String, Value> = self
            .staged_services()
            .map(|(k, eps)| (k.to_string(), Self::endpoints_value(k, eps, false)))
            .collect();

        json!({
            "workloads": workloads,
            "services": services,
            "policies": policies,
            "stagedServices": staged,
        })
    }

    /// uid → `{workloadUid, port, status}`, unhealthy workloads only if allowed.
    fn endpoints_value(
        service_key: &str,
        eps: &BTreeMap<Name, Arc<Workload>>,
        allow_unhealthy: bool,
    ) -> Value {
        let m: Map<String, Value> = eps
            .iter()
            .filter_map(|(uid, w)| {
                if w.status == HealthStatus::Unhealthy && !allow_unhealthy {
                    return None;
                }
                // Always there: a workload is an endpoint of the services it names.
                let ports = w.services.get(service_key)?;
                Some((
                    uid.to_string(),
                    json!({"workloadUid": uid, "port": ports, "status": w.status.as_str()}),
                ))
            })
            .collect();
        Value::Object(m)
    }
}

fn to_value<T: serde::Serialize>(v: &T) -> Value {
    // Our model types serialize to JSON without failure (string keys, no non-finite
    // floats); fall back to null rather than panic.
    serde_json::to_value(v).unwrap_or(Value::Null)
}

#[cfg(test)]
mod tests {
    use crate::store::ProxyState;
    use serde_json::json;

    #[test]
    fn dump_shape() {
        let yaml = r#"
workloads:
- name: b
  namespace: default
  workloadIps: ["10.0.0.3"]
  protocol: HBONE
  services: {default/echo.default.svc.cluster.local: {80: 8080}, default/later: {90: 9090}}
- name: a
  namespace: default
  workloadIps: ["10.0.0.2"]
services:
- {name: zeta, namespace: default, hostname: zeta, vips: ["/10.96.0.11"], ports: {80: 80}}
- {name: echo, namespace: default, hostname: echo.default.svc.cluster.local, vips: ["/10.96.0.10"], ports: {80: 8080}}
policies:
- {name: p, namespace: default, scope: Namespace, action: Deny, rules: [[[{destinationPorts: [22]}]]]}
- {name: q, namespace: default, scope: Namespace, action: Allow, rules: [[[{principals: [!Exact a, !Presence ""]}]]]}
"#;
        let s = ProxyState::from_yaml("t", yaml).unwrap();
        let d = s.dump();
        let w = &d["workloads"];
        assert_eq!(w[0]["uid"], "Kubernetes//v1/Pod/default/a");
        assert_eq!(w[1]["uid"], "Kubernetes//v1/Pod/default/b");
        assert_eq!(w[1]["workloadIps"], json!(["10.0.0.3"]));
        assert_eq!(w[1]["protocol"], "HBONE");
        assert_eq!(w[0]["protocol"], "TCP");
        // As configured, with ztunnel's omissions: no trust domain, service account or
        // workload type when empty, `clusterId` always, the services only as endpoints.
        let keys: Vec<&str> = w[1]
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(
            keys,
            [
                "capacity",
                "clusterId",
                "name",
                "namespace",
                "networkMode",
                "protocol",
                "status",
                "uid",
                "workloadIps"
            ]
        );
        assert_eq!(w[1]["clusterId"], "");
        assert_eq!(w[1]["status"], "Healthy");
        assert_eq!(w[1]["capacity"], 1);
        let svc = &d["services"];
        assert_eq!(svc[0]["hostname"], "echo.default.svc.cluster.local");
        assert_eq!(svc[1]["hostname"], "zeta");
        assert_eq!(svc[0]["vips"], json!(["/10.96.0.10"]));
        assert_eq!(svc[0]["ports"], json!({"80": 8080}));
        assert_eq!(
            svc[0]["endpoints"]["Kubernetes//v1/Pod/default/b"],
            json!({"workloadUid": "Kubernetes//v1/Pod/default/b", "port": {"80": 8080}, "status": "Healthy"})
        );
        assert_eq!(svc[1]["endpoints"], json!({}));

        let p = &d["policies"][0];
        assert_eq!(p["name"], "p");
        assert_eq!(p["scope"], "Namespace");
        assert_eq!(p["action"], "Deny");
        assert_eq!(p["dryRun"], false);
        assert_eq!(p["rules"], json!([[[{"destinationPorts": [22]}]]]));
        assert_eq!(
            d["policies"][1]["rules"],
            json!([[[{"principals": [{"Exact": "a"}, {"Presence": []}]}]]])
        );

        assert_eq!(
            d["stagedServices"],
            json!({"default/later": {"Kubernetes//v1/Pod/default/b": {"workloadUid": "Kubernetes//v1/Pod/default/b", "port": {"90": 9090}, "status": "Healthy"}}})
        );
    }

    #[test]
    fn unhealthy_endpoints_show_only_where_the_health_policy_allows_them() {
        let yaml = r#"
workloads:
- name: sick
  namespace: default
  workloadIps: ["10.0.0.3"]
  status: Unhealthy
  services: {default/strict: {80: 8080}, default/lenient: {80: 8080}}
services:
- {name: strict, namespace: default, hostname: strict, vips: ["/10.96.0.1"], ports: {80: 8080}}
- name: lenient
  namespace: default
  hostname: lenient
  vips: ["/10.96.0.2"]
  ports: {80: 8080}
  loadBalancer: {routingPreferences: [], mode: Failover, healthPolicy: AllowAll}
"#;
        let s = ProxyState::from_yaml("t", yaml).unwrap();
        let d = s.dump();
        assert_eq!(d["services"][0]["hostname"], "lenient");
        assert_eq!(
            d["services"][0]["endpoints"]["Kubernetes//v1/Pod/default/sick"]["status"],
            "Unhealthy"
        );
        assert_eq!(
            d["services"][0]["loadBalancer"],
            json!({"routingPreferences": [], "mode": "Failover", "healthPolicy": "AllowAll"})
        );
        assert_eq!(d["services"][1]["hostname"], "strict");
        assert_eq!(d["services"][1]["endpoints"], json!({}));
    }
}
