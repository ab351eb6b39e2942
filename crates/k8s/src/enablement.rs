//! Whether a pod belongs in the mesh (istio-cni reference §4.4): the enablement selectors
//! (chart value `ambient.enablementSelectors`, env `AMBIENT_ENABLEMENT_SELECTOR`, the CNI
//! plugin's `enablement_selectors`) and the exclusions no selector can override.
//!
//! A pod is ambient when **some** selector matches it (its pod selector matches the pod's
//! labels and its namespace selector the namespace's; an absent or empty selector matches
//! everything), its namespace is not excluded, it does not use the host's network, and no
//! sidecar was injected into it.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde::Deserialize;

use crate::labels;
use crate::selector::{InvalidSelector, Selector};

/// One entry of the selector list, in the chart's and the plugin config's shape.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RawEnablementSelector {
    #[serde(default)]
    pub pod_selector: Option<LabelSelector>,
    #[serde(default)]
    pub namespace_selector: Option<LabelSelector>,
}

/// A validated selector pair.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnablementSelector {
    pub pod: Selector,
    pub namespace: Selector,
}

/// A selector list that cannot be used; says which entry and why.
#[derive(Debug, thiserror::Error)]
pub enum SelectorListError {
    #[error(
        "the enablement selectors are not a YAML list of {{podSelector, namespaceSelector}}: {0}"
    )]
    Syntax(String),
    #[error("enablement selector {index}, {side}: {source}")]
    Invalid {
        index: usize,
        side: &'static str,
        source: InvalidSelector,
    },
}

impl EnablementSelector {
    /// Validates one raw entry (`index` is its position, for the error).
    pub fn new(
        raw: &RawEnablementSelector,
        index: usize,
    ) -> Result<EnablementSelector, SelectorListError> {
        let check = |s: &Option<LabelSelector>, side| match s {
            None => Ok(Selector::default()),
            Some(s) => Selector::new(s).map_err(|source| SelectorListError::Invalid {
                index,
                side,
                source,
            }),
        };
        Ok(EnablementSelector {
            pod: check(&raw.pod_selector, "podSelector")?,
            namespace: check(&raw.namespace_selector, "namespaceSelector")?,
        })
    }
}

/// Validates a list of raw entries.
pub fn validate(
    raw: &[RawEnablementSelector],
) -> Result<Vec<EnablementSelector>, SelectorListError> {
    raw.iter()
        .enumerate()
        .map(|(i, r)| EnablementSelector::new(r, i))
        .collect()
}

/// Parses `AMBIENT_ENABLEMENT_SELECTOR` (YAML, or JSON, which is YAML too).
pub fn parse_selectors(text: &str) -> Result<Vec<EnablementSelector>, SelectorListError> {
    let raw: Vec<RawEnablementSelector> =
        yaml_serde::from_str(text).map_err(|e| SelectorListError::Syntax(e.to_string()))?;
    validate(&raw)
}

/// Istio's default selectors: a pod labelled `istio.io/dataplane-mode=ambient` anywhere,
/// or any pod not labelled `none` in a namespace labelled `ambient`.
pub fn default_raw_selectors() -> Vec<RawEnablementSelector> {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;
    let ambient = || {
        Some(LabelSelector {
            match_labels: Some(BTreeMap::from([(
                labels::DATAPLANE_MODE.to_owned(),
                labels::DATAPLANE_MODE_AMBIENT.to_owned(),
            )])),
            match_expressions: None,
        })
    };
    vec![
        RawEnablementSelector {
            pod_selector: ambient(),
            namespace_selector: None,
        },
        RawEnablementSelector {
            pod_selector: Some(LabelSelector {
                match_labels: None,
                match_expressions: Some(vec![LabelSelectorRequirement {
                    key: labels::DATAPLANE_MODE.to_owned(),
                    operator: "NotIn".into(),
                    values: Some(vec![labels::DATAPLANE_MODE_NONE.to_owned()]),
                }]),
            }),
            namespace_selector: ambient(),
        },
    ]
}

/// What the decision looks at in a pod.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodFacts {
    pub namespace: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub host_network: bool,
}

impl PodFacts {
    pub fn of(pod: &Pod) -> PodFacts {
        PodFacts {
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            labels: pod.metadata.labels.clone().unwrap_or_default(),
            annotations: pod.metadata.annotations.clone().unwrap_or_default(),
            host_network: pod
                .spec
                .as_ref()
                .and_then(|s| s.host_network)
                .unwrap_or(false),
        }
    }
}

/// The labels of a namespace object.
pub fn namespace_labels(ns: &Namespace) -> BTreeMap<String, String> {
    ns.metadata.labels.clone().unwrap_or_default()
}

/// Why a pod stays out of the mesh.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Exclusion {
    /// Its namespace is in `EXCLUDE_NAMESPACES` / `exclude_namespaces`.
    ExcludedNamespace,
    /// `hostNetwork: true`: it shares the node's network namespace.
    HostNetwork,
    /// It carries `sidecar.istio.io/status`: a sidecar proxy handles it.
    SidecarInjected,
    /// No enablement selector matches it (or it opted out with `istio.io/dataplane-mode=none`).
    NotSelected,
}

impl std::fmt::Display for Exclusion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Exclusion::ExcludedNamespace => "its namespace is excluded from ambient capture",
            Exclusion::HostNetwork => "it uses the host network",
            Exclusion::SidecarInjected => "it has an injected sidecar",
            Exclusion::NotSelected => "no ambient enablement selector matches it",
        })
    }
}

/// The decision for one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Ambient,
    Excluded(Exclusion),
}

impl Verdict {
    pub fn is_ambient(&self) -> bool {
        matches!(self, Verdict::Ambient)
    }
}

/// The rules of one node: selectors and excluded namespaces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Enablement {
    pub selectors: Vec<EnablementSelector>,
    pub exclude_namespaces: BTreeSet<String>,
}

impl Default for Enablement {
    /// Istio's defaults: the two default selectors, `kube-system` excluded.
    fn default() -> Self {
        Enablement {
            selectors: validate(&default_raw_selectors()).expect("the default selectors are valid"),
            exclude_namespaces: BTreeSet::from(["kube-system".to_owned()]),
        }
    }
}

impl Enablement {
    /// Decides for `pod` in a namespace with `namespace_labels`.
    pub fn evaluate(&self, pod: &PodFacts, namespace_labels: &BTreeMap<String, String>) -> Verdict {
        let excluded = if self.exclude_namespaces.contains(&pod.namespace) {
            Some(Exclusion::ExcludedNamespace)
        } else if pod.host_network {
            Some(Exclusion::HostNetwork)
        } else if pod
            .annotations
            .contains_key(labels::SIDECAR_STATUS_ANNOTATION)
        {
            Some(Exclusion::SidecarInjected)
        } else if !self
            .selectors
            .iter()
            .any(|s| s.pod.matches(&pod.labels) && s.namespace.matches(namespace_labels))
        {
            Some(Exclusion::NotSelected)
        } else {
            None
        };
        excluded.map_or(Verdict::Ambient, Verdict::Excluded)
    }

    /// Whether a namespace with `labels` is selected by some selector's namespace part, for
    /// deciding that a namespace's label change concerns its pods. An empty namespace
    /// selector does not count here (it selects every namespace, so no change of labels
    /// changes anything through it).
    pub fn selects_namespace(&self, labels: &BTreeMap<String, String>) -> bool {
        self.selectors
            .iter()
            .any(|s| !s.namespace.is_empty() && s.namespace.matches(labels))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    const AMBIENT: (&str, &str) = (labels::DATAPLANE_MODE, "ambient");
    const NONE: (&str, &str) = (labels::DATAPLANE_MODE, "none");

    /// The decision table of istio-cni reference §4.4, under the default rules.
    #[test]
    fn the_default_rules_decide_as_istio_cni_does() {
        use Exclusion::*;
        let pod = |ns: &str, labels: &[(&str, &str)], annotations: &[(&str, &str)], host: bool| {
            PodFacts {
                namespace: ns.into(),
                labels: map(labels),
                annotations: map(annotations),
                host_network: host,
            }
        };
        let sidecar = (labels::SIDECAR_STATUS_ANNOTATION, "{}");
        let redirected = (labels::REDIRECTION_ANNOTATION, "enabled");
        let ambient_ns = map(&[AMBIENT]);
        let plain_ns = map(&[]);
        let none_ns = map(&[NONE]);
        let rules = Enablement::default();
        let cases: Vec<(&str, PodFacts, &BTreeMap<String, String>, Verdict)> = vec![
            (
                "pod label in a plain namespace",
                pod("a", &[AMBIENT], &[], false),
                &plain_ns,
                Verdict::Ambient,
            ),
            (
                "namespace label",
                pod("a", &[], &[], false),
                &ambient_ns,
                Verdict::Ambient,
            ),
            (
                "pod label in a namespace labelled none",
                pod("a", &[AMBIENT], &[], false),
                &none_ns,
                Verdict::Ambient,
            ),
            (
                "pod opts out in an ambient namespace",
                pod("a", &[NONE], &[], false),
                &ambient_ns,
                Verdict::Excluded(NotSelected),
            ),
            (
                "other pod labels do not matter",
                pod("a", &[("app", "x")], &[], false),
                &ambient_ns,
                Verdict::Ambient,
            ),
            (
                "nothing labelled",
                pod("a", &[], &[], false),
                &plain_ns,
                Verdict::Excluded(NotSelected),
            ),
            (
                "namespace labelled none",
                pod("a", &[], &[], false),
                &none_ns,
                Verdict::Excluded(NotSelected),
            ),
            (
                "another value on the pod",
                pod("a", &[(labels::DATAPLANE_MODE, "sidecar")], &[], false),
                &plain_ns,
                Verdict::Excluded(NotSelected),
            ),
            (
                "excluded namespace wins over labels",
                pod("kube-system", &[AMBIENT], &[], false),
                &ambient_ns,
                Verdict::Excluded(ExcludedNamespace),
            ),
            (
                "host network",
                pod("a", &[AMBIENT], &[], true),
                &ambient_ns,
                Verdict::Excluded(HostNetwork),
            ),
            (
                "sidecar injected",
                pod("a", &[AMBIENT], &[sidecar], false),
                &ambient_ns,
                Verdict::Excluded(SidecarInjected),
            ),
            (
                "our own annotation decides nothing",
                pod("a", &[], &[redirected], false),
                &plain_ns,
                Verdict::Excluded(NotSelected),
            ),
        ];
        for (what, facts, ns, want) in cases {
            assert_eq!(rules.evaluate(&facts, ns), want, "{what}");
        }
    }

    #[test]
    fn custom_selectors_from_the_chart_yaml() {
        let rules = Enablement {
            selectors: parse_selectors(
                "- podSelector:\n    matchLabels: {team: mesh}\n- namespaceSelector:\n    matchExpressions:\n    - {key: env, operator: In, values: [prod]}\n",
            )
            .unwrap(),
            exclude_namespaces: BTreeSet::new(),
        };
        let facts = |l: &[(&str, &str)]| PodFacts {
            namespace: "a".into(),
            labels: map(l),
            ..Default::default()
        };
        assert!(rules
            .evaluate(&facts(&[("team", "mesh")]), &map(&[]))
            .is_ambient());
        assert!(rules
            .evaluate(&facts(&[]), &map(&[("env", "prod")]))
            .is_ambient());
        assert!(!rules
            .evaluate(&facts(&[AMBIENT]), &map(&[AMBIENT]))
            .is_ambient());
        assert!(rules.selects_namespace(&map(&[("env", "prod")])));
        assert!(!rules.selects_namespace(&map(&[("team", "mesh")])));
    }

    #[test]
    fn the_default_yaml_of_the_chart_equals_the_built_in_defaults() {
        let yaml = "- podSelector:\n    matchLabels: {istio.io/dataplane-mode: ambient}\n- podSelector:\n    matchExpressions:\n    - {key: istio.io/dataplane-mode, operator: NotIn, values: [none]}\n  namespaceSelector:\n    matchLabels: {istio.io/dataplane-mode: ambient}\n";
        assert_eq!(
            parse_selectors(yaml).unwrap(),
            Enablement::default().selectors
        );
        assert!(Enablement::default().selects_namespace(&map(&[AMBIENT])));
        assert!(!Enablement::default().selects_namespace(&map(&[])));
    }

    #[test]
    fn bad_selector_lists_name_the_entry() {
        let err = parse_selectors("- podSelector: {matchExpressions: [{key: a, operator: In}]}")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("enablement selector 0, podSelector") && err.contains("needs values"),
            "{err}"
        );
        let err = parse_selectors("- podSelectr: {}").unwrap_err().to_string();
        assert!(err.contains("podSelectr"), "{err}");
        assert!(parse_selectors("podSelector: {}").is_err());
    }
}
