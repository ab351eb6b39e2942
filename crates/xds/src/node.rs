//! What the proxy says about itself in the `node` of its xDS requests: ztunnel's node id
//! and metadata, read from the process's environment.

use std::collections::BTreeMap;

use ambit_proto::Node;
use prost_types::{value::Kind, ListValue, Struct, Value};

/// What the proxy says about itself in the `node` of its requests (from `POD_NAME`,
/// `POD_NAMESPACE`, `INSTANCE_IP`, `NODE_NAME`, `ISTIO_META_*`, `ISTIO_METAJSON_*`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeConfig {
    pub pod_name: String,
    pub pod_namespace: String,
    /// `INSTANCE_IP`; `1.1.1.1` when unset, as ztunnel does.
    pub instance_ip: Option<String>,
    pub node_name: String,
    /// `ISTIO_META_<X>` entries with the prefix stripped, in the order to apply them.
    pub proxy_metadata: Vec<(String, String)>,
    /// `ISTIO_METAJSON_<X>` entries with the prefix stripped, already parsed.
    pub json_metadata: Vec<(String, serde_json::Value)>,
}

/// A bad `ISTIO_METAJSON_*` variable.
#[derive(Debug, thiserror::Error)]
#[error("{var}: not valid JSON ({source}); fix or unset the variable")]
pub struct NodeConfigError {
    pub var: String,
    #[source]
    pub source: serde_json::Error,
}

const META_PREFIX: &str = "ISTIO_META_";
const METAJSON_PREFIX: &str = "ISTIO_METAJSON_";

impl NodeConfig {
    /// Reads the node's variables from `vars` (e.g. `std::env::vars()`). Metadata
    /// entries are sorted by name, so the result does not depend on the environment's
    /// order.
    pub fn from_vars(
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Result<NodeConfig, NodeConfigError> {
        let mut cfg = NodeConfig::default();
        for (k, v) in vars {
            match k.as_str() {
                "POD_NAME" => cfg.pod_name = v,
                "POD_NAMESPACE" => cfg.pod_namespace = v,
                "INSTANCE_IP" => cfg.instance_ip = Some(v),
                "NODE_NAME" => cfg.node_name = v,
                _ => {
                    if let Some(name) = k.strip_prefix(METAJSON_PREFIX) {
                        let value = serde_json::from_str(&v).map_err(|source| NodeConfigError {
                            var: k.clone(),
                            source,
                        })?;
                        cfg.json_metadata.push((name.to_string(), value));
                    } else if let Some(name) = k.strip_prefix(META_PREFIX) {
                        cfg.proxy_metadata.push((name.to_string(), v));
                    }
                }
            }
        }
        cfg.proxy_metadata.sort();
        cfg.json_metadata.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(cfg)
    }

    fn ip(&self) -> &str {
        match self.instance_ip.as_deref() {
            Some(ip) if !ip.is_empty() => ip,
            _ => "1.1.1.1",
        }
    }

    /// `ztunnel~<ip>~<pod>.<ns>~<ns>.svc.cluster.local`.
    pub fn node_id(&self) -> String {
        format!(
            "ztunnel~{}~{}.{}~{}.svc.cluster.local",
            self.ip(),
            self.pod_name,
            self.pod_namespace,
            self.pod_namespace
        )
    }

    /// The `node` of the initial requests: id and metadata (`NAME`, `NAMESPACE`,
    /// `INSTANCE_IPS`, `NODE_NAME`, then the proxy metadata, then the JSON metadata; a
    /// later entry of the same name wins). `cluster` and `build_version` stay empty.
    pub fn to_node(&self) -> Node {
        let mut fields = BTreeMap::new();
        let s = |v: &str| Value {
            kind: Some(Kind::StringValue(v.to_string())),
        };
        fields.insert("NAME".to_string(), s(&self.pod_name));
        fields.insert("NAMESPACE".to_string(), s(&self.pod_namespace));
        fields.insert("INSTANCE_IPS".to_string(), s(self.ip()));
        fields.insert("NODE_NAME".to_string(), s(&self.node_name));
        for (k, v) in &self.proxy_metadata {
            fields.insert(k.clone(), s(v));
        }
        for (k, v) in &self.json_metadata {
            fields.insert(k.clone(), json_to_value(v));
        }
        Node {
            id: self.node_id(),
            cluster: String::new(),
            metadata: Some(Struct { fields }),
            build_version: String::new(),
        }
    }
}

fn json_to_value(v: &serde_json::Value) -> Value {
    use serde_json::Value as J;
    let kind = match v {
        J::Null => Kind::NullValue(0),
        J::Bool(b) => Kind::BoolValue(*b),
        J::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(0.0)),
        J::String(s) => Kind::StringValue(s.clone()),
        J::Array(a) => Kind::ListValue(ListValue {
            values: a.iter().map(json_to_value).collect(),
        }),
        J::Object(o) => Kind::StructValue(Struct {
            fields: o
                .iter()
                .map(|(k, v)| (k.clone(), json_to_value(v)))
                .collect(),
        }),
    };
    Value { kind: Some(kind) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_id_and_metadata() {
        let cfg = NodeConfig::from_vars(
            [
                ("POD_NAME", "ztunnel-abc"),
                ("POD_NAMESPACE", "istio-system"),
                ("NODE_NAME", "node1"),
                ("ISTIO_META_DNS_CAPTURE", "true"),
                ("ISTIO_META_CLUSTER_ID", "c1"),
                (
                    "ISTIO_METAJSON_LABELS",
                    r#"{"app":"z","n":2,"l":[true,null]}"#,
                ),
                ("OTHER", "x"),
            ]
            .map(|(k, v)| (k.to_string(), v.to_string())),
        )
        .unwrap();
        let n = cfg.to_node();
        assert_eq!(
            n.id,
            "ztunnel~1.1.1.1~ztunnel-abc.istio-system~istio-system.svc.cluster.local"
        );
        assert_eq!(n.cluster, "");
        let f = &n.metadata.as_ref().unwrap().fields;
        let s = |k: &str| match &f[k].kind {
            Some(Kind::StringValue(s)) => s.clone(),
            other => panic!("{k}: {other:?}"),
        };
        assert_eq!(s("NAME"), "ztunnel-abc");
        assert_eq!(s("NAMESPACE"), "istio-system");
        assert_eq!(s("INSTANCE_IPS"), "1.1.1.1");
        assert_eq!(s("NODE_NAME"), "node1");
        assert_eq!(s("DNS_CAPTURE"), "true");
        assert_eq!(s("CLUSTER_ID"), "c1");
        let Some(Kind::StructValue(labels)) = &f["LABELS"].kind else {
            panic!("LABELS")
        };
        assert_eq!(
            labels.fields["app"].kind,
            Some(Kind::StringValue("z".into()))
        );
        assert_eq!(labels.fields["n"].kind, Some(Kind::NumberValue(2.0)));
        assert_eq!(f.len(), 7);

        let with_ip = NodeConfig {
            instance_ip: Some("10.0.0.5".into()),
            ..cfg
        };
        assert!(with_ip.to_node().id.starts_with("ztunnel~10.0.0.5~"));

        let bad = NodeConfig::from_vars([("ISTIO_METAJSON_X".to_string(), "{".to_string())]);
        assert!(bad
            .unwrap_err()
            .to_string()
            .starts_with("ISTIO_METAJSON_X: not valid JSON"));
    }
}
