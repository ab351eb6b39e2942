//! Safe upgrade (istio-cni reference §1.7): on SIGTERM, is this an upgrade or node
//! reboot (keep the plugin, the CNI config, the kubeconfig and the host rules, so new pods
//! wait for the next agent instead of starting uncaptured), or an uninstall (clean up)?
//!
//! The answer comes from the DaemonSet `istio-cni-node`: still there, not being deleted and
//! still scheduling onto this node ⇒ upgrade. Gone, being deleted, or our account no longer
//! allowed to read it (the chart's RBAC was removed with it) ⇒ cleanup. Any other failure
//! ⇒ upgrade: fail closed, pods stall rather than start uncaptured.
//!
//! [`decide`] is sans IO; [`lookup`] does the two GETs.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, NodeSelectorRequirement, NodeSelectorTerm};

/// The DaemonSet as the GET saw it.
#[derive(Debug, Clone, PartialEq)]
pub enum DaemonSetLookup {
    Found(Box<DaemonSet>),
    NotFound,
    Unauthorized,
    Forbidden,
    /// Anything else (API down, timeout, 5xx): the reason, for the log.
    Failed(String),
}

/// The Node's labels, if the decision needed them and the GET worked.
pub type NodeLookup = Result<BTreeMap<String, String>, String>;

/// What to do on shutdown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShutdownAction {
    /// Keep the plugin, config, kubeconfig and host rules.
    Upgrade,
    /// Remove them all.
    Cleanup,
}

/// The decision and why (for the log).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShutdownDecision {
    pub action: ShutdownAction,
    pub reason: String,
}

fn decision(action: ShutdownAction, reason: impl Into<String>) -> ShutdownDecision {
    ShutdownDecision {
        action,
        reason: reason.into(),
    }
}

/// Whether the DaemonSet's pods must still run on a node with this name and these labels:
/// its `nodeSelector` and its required node affinity. `None` when no rule exists.
pub fn schedules_here(ds: &DaemonSet) -> Option<Vec<NodeSelectorTerm>> {
    ds.spec
        .as_ref()?
        .template
        .spec
        .as_ref()?
        .affinity
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required_during_scheduling_ignored_during_execution
        .as_ref()
        .map(|r| r.node_selector_terms.clone())
}

fn node_selector(ds: &DaemonSet) -> BTreeMap<String, String> {
    ds.spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|s| s.node_selector.clone())
        .unwrap_or_default()
}

fn requirement_matches(r: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => !value.is_some_and(|v| values.iter().any(|x| x == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(v), [bound]) = (value.and_then(|v| v.parse::<i64>().ok()), values) else {
                return false;
            };
            let Ok(bound) = bound.parse::<i64>() else {
                return false;
            };
            if r.operator == "Gt" {
                v > bound
            } else {
                v < bound
            }
        }
        // An operator the API server would have refused: it matches nothing.
        _ => false,
    }
}

/// The node-affinity rule: some term matches, a term matches when all its expressions
/// (labels) and fields (`metadata.name`) do; an empty term matches nothing.
pub fn terms_match(
    terms: &[NodeSelectorTerm],
    node_name: &str,
    labels: &BTreeMap<String, String>,
) -> bool {
    terms.iter().any(|t| {
        let exprs = t.match_expressions.as_deref().unwrap_or_default();
        let fields = t.match_fields.as_deref().unwrap_or_default();
        (!exprs.is_empty() || !fields.is_empty())
            && exprs
                .iter()
                .all(|r| requirement_matches(r, labels.get(&r.key).map(String::as_str)))
            && fields.iter().all(|r| {
                let v = (r.key == "metadata.name").then_some(node_name);
                requirement_matches(r, v)
            })
    })
}

/// Whether the decision needs the Node's labels (a rule to check against them).
pub fn needs_node(ds: &DaemonSetLookup) -> bool {
    match ds {
        DaemonSetLookup::Found(ds) => schedules_here(ds).is_some() || !node_selector(ds).is_empty(),
        _ => false,
    }
}

/// The decision. `node` is consulted only when [`needs_node`] says so.
pub fn decide(
    disable_safe_upgrade: bool,
    ds: &DaemonSetLookup,
    node_name: &str,
    node: Option<&NodeLookup>,
) -> ShutdownDecision {
    use ShutdownAction::*;
    if disable_safe_upgrade {
        return decision(Cleanup, "AMBIENT_DISABLE_SAFE_UPGRADE=true");
    }
    let ds = match ds {
        DaemonSetLookup::NotFound => return decision(Cleanup, "the DaemonSet is gone"),
        DaemonSetLookup::Unauthorized => {
            return decision(Cleanup, "the API server no longer accepts our token (401)")
        }
        DaemonSetLookup::Forbidden => {
            return decision(Cleanup, "we may no longer read the DaemonSet (403)")
        }
        DaemonSetLookup::Failed(why) => {
            return decision(
                Upgrade,
                format!("cannot read the DaemonSet ({why}); keeping everything in place"),
            )
        }
        DaemonSetLookup::Found(ds) => ds,
    };
    if ds.metadata.deletion_timestamp.is_some() {
        return decision(Cleanup, "the DaemonSet is being deleted");
    }
    let terms = schedules_here(ds);
    let selector = node_selector(ds);
    if terms.is_none() && selector.is_empty() {
        return decision(Upgrade, "the DaemonSet is still there");
    }
    let labels = match node {
        Some(Ok(labels)) => labels,
        Some(Err(why)) => {
            return decision(
                Upgrade,
                format!("cannot read the Node ({why}); keeping everything in place"),
            )
        }
        None => {
            return decision(
                Upgrade,
                "the Node was not looked up; keeping everything in place",
            )
        }
    };
    if !selector
        .iter()
        .all(|(k, v)| labels.get(k).is_some_and(|l| l == v))
    {
        return decision(
            Cleanup,
            "the DaemonSet's nodeSelector no longer matches this node",
        );
    }
    if let Some(terms) = terms {
        if !terms_match(&terms, node_name, labels) {
            return decision(
                Cleanup,
                "the DaemonSet's node affinity no longer matches this node",
            );
        }
    }
    decision(Upgrade, "the DaemonSet is still there and still runs here")
}

/// A failed GET, by status code.
pub fn classify(e: &kube::Error) -> DaemonSetLookup {
    match e {
        kube::Error::Api(s) if s.code == 404 => DaemonSetLookup::NotFound,
        kube::Error::Api(s) if s.code == 401 => DaemonSetLookup::Unauthorized,
        kube::Error::Api(s) if s.code == 403 => DaemonSetLookup::Forbidden,
        other => DaemonSetLookup::Failed(other.to_string()),
    }
}

/// GETs DaemonSet `name` in `namespace` (retrying other failures `retries` times, 1 s
/// apart) and, when the decision needs it, Node `node_name`; then decides.
pub async fn lookup_and_decide(
    client: &kube::Client,
    disable_safe_upgrade: bool,
    namespace: &str,
    name: &str,
    node_name: &str,
    retries: u32,
) -> ShutdownDecision {
    if disable_safe_upgrade {
        return decide(true, &DaemonSetLookup::NotFound, node_name, None);
    }
    let api: kube::Api<DaemonSet> = kube::Api::namespaced(client.clone(), namespace);
    let mut attempt = 0;
    let ds = loop {
        let got = match api.get(name).await {
            Ok(ds) => DaemonSetLookup::Found(Box::new(ds)),
            Err(e) => classify(&e),
        };
        if matches!(got, DaemonSetLookup::Failed(_)) && attempt < retries {
            attempt += 1;
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        }
        break got;
    };
    let node = if needs_node(&ds) {
        let nodes: kube::Api<Node> = kube::Api::all(client.clone());
        Some(
            nodes
                .get(node_name)
                .await
                .map(|n| n.metadata.labels.unwrap_or_default())
                .map_err(|e| e.to_string()),
        )
    } else {
        None
    };
    decide(false, &ds, node_name, node.as_ref())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::DaemonSetSpec;
    use k8s_openapi::api::core::v1::{Affinity, NodeAffinity, NodeSelector, PodSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use ShutdownAction::*;

    fn req(key: &str, op: &str, values: &[&str]) -> NodeSelectorRequirement {
        NodeSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: (!values.is_empty()).then(|| values.iter().map(|v| v.to_string()).collect()),
        }
    }

    fn ds(terms: Option<Vec<NodeSelectorTerm>>, deleting: bool) -> DaemonSetLookup {
        let mut d = DaemonSet::default();
        if deleting {
            d.metadata.deletion_timestamp = Some(Time(Default::default()));
        }
        let mut spec = DaemonSetSpec::default();
        spec.template.spec = Some(PodSpec {
            affinity: terms.map(|t| Affinity {
                node_affinity: Some(NodeAffinity {
                    required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                        node_selector_terms: t,
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        });
        d.spec = Some(spec);
        DaemonSetLookup::Found(Box::new(d))
    }

    fn term(exprs: Vec<NodeSelectorRequirement>) -> NodeSelectorTerm {
        NodeSelectorTerm {
            match_expressions: Some(exprs),
            match_fields: None,
        }
    }

    fn labels(pairs: &[(&str, &str)]) -> NodeLookup {
        Ok(pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect())
    }

    #[test]
    fn the_shutdown_decision_table() {
        let pool = |op, v: &[&str]| Some(vec![term(vec![req("pool", op, v)])]);
        let node = labels(&[("pool", "mesh"), ("cpus", "8")]);
        let cases: Vec<(
            &str,
            bool,
            DaemonSetLookup,
            Option<NodeLookup>,
            ShutdownAction,
        )> = vec![
            ("exists, no affinity", false, ds(None, false), None, Upgrade),
            ("being deleted", false, ds(None, true), None, Cleanup),
            ("gone", false, DaemonSetLookup::NotFound, None, Cleanup),
            ("401", false, DaemonSetLookup::Unauthorized, None, Cleanup),
            ("403", false, DaemonSetLookup::Forbidden, None, Cleanup),
            (
                "other error",
                false,
                DaemonSetLookup::Failed("503".into()),
                None,
                Upgrade,
            ),
            (
                "safe upgrade disabled",
                true,
                ds(None, false),
                None,
                Cleanup,
            ),
            (
                "In matches",
                false,
                ds(pool("In", &["mesh", "x"]), false),
                Some(node.clone()),
                Upgrade,
            ),
            (
                "In mismatch",
                false,
                ds(pool("In", &["other"]), false),
                Some(node.clone()),
                Cleanup,
            ),
            (
                "NotIn matches",
                false,
                ds(pool("NotIn", &["other"]), false),
                Some(node.clone()),
                Upgrade,
            ),
            (
                "NotIn mismatch",
                false,
                ds(pool("NotIn", &["mesh"]), false),
                Some(node.clone()),
                Cleanup,
            ),
            (
                "NotIn on a missing label",
                false,
                ds(Some(vec![term(vec![req("zone", "NotIn", &["a"])])]), false),
                Some(node.clone()),
                Upgrade,
            ),
            (
                "Exists",
                false,
                ds(pool("Exists", &[]), false),
                Some(node.clone()),
                Upgrade,
            ),
            (
                "Exists mismatch",
                false,
                ds(Some(vec![term(vec![req("zone", "Exists", &[])])]), false),
                Some(node.clone()),
                Cleanup,
            ),
            (
                "DoesNotExist",
                false,
                ds(
                    Some(vec![term(vec![req("zone", "DoesNotExist", &[])])]),
                    false,
                ),
                Some(node.clone()),
                Upgrade,
            ),
            (
                "DoesNotExist mismatch",
                false,
                ds(pool("DoesNotExist", &[]), false),
                Some(node.clone()),
                Cleanup,
            ),
            (
                "Gt",
                false,
                ds(Some(vec![term(vec![req("cpus", "Gt", &["4"])])]), false),
                Some(node.clone()),
                Upgrade,
            ),
            (
                "Lt mismatch",
                false,
                ds(Some(vec![term(vec![req("cpus", "Lt", &["4"])])]), false),
                Some(node.clone()),
                Cleanup,
            ),
            (
                "all expressions of a term must match",
                false,
                ds(
                    Some(vec![term(vec![
                        req("pool", "In", &["mesh"]),
                        req("zone", "Exists", &[]),
                    ])]),
                    false,
                ),
                Some(node.clone()),
                Cleanup,
            ),
            (
                "any term may match",
                false,
                ds(
                    Some(vec![
                        term(vec![req("zone", "Exists", &[])]),
                        term(vec![req("pool", "In", &["mesh"])]),
                    ]),
                    false,
                ),
                Some(node.clone()),
                Upgrade,
            ),
            (
                "an empty term matches nothing",
                false,
                ds(Some(vec![term(vec![])]), false),
                Some(node.clone()),
                Cleanup,
            ),
            (
                "node GET failed",
                false,
                ds(pool("In", &["other"]), false),
                Some(Err("timeout".into())),
                Upgrade,
            ),
        ];
        for (what, disable, lookup, node, want) in cases {
            let got = decide(disable, &lookup, "n1", node.as_ref());
            assert_eq!(got.action, want, "{what}: {}", got.reason);
        }
    }

    #[test]
    fn node_name_fields_and_node_selectors_count() {
        let by_name = NodeSelectorTerm {
            match_expressions: None,
            match_fields: Some(vec![req("metadata.name", "In", &["n1"])]),
        };
        assert!(terms_match(
            std::slice::from_ref(&by_name),
            "n1",
            &BTreeMap::new()
        ));
        assert!(!terms_match(&[by_name], "n2", &BTreeMap::new()));

        let DaemonSetLookup::Found(mut d) = ds(None, false) else {
            unreachable!()
        };
        d.spec
            .as_mut()
            .unwrap()
            .template
            .spec
            .as_mut()
            .unwrap()
            .node_selector = Some(BTreeMap::from([(
            "kubernetes.io/os".to_string(),
            "linux".to_string(),
        )]));
        let d = DaemonSetLookup::Found(d);
        assert!(needs_node(&d));
        let linux = labels(&[("kubernetes.io/os", "linux")]);
        assert_eq!(decide(false, &d, "n1", Some(&linux)).action, Upgrade);
        assert_eq!(decide(false, &d, "n1", Some(&labels(&[]))).action, Cleanup);
        assert!(!needs_node(&ds(None, false)));
    }
}
