//! The DestinationRules a load comes to, and which one applies to a destination, as Istio
//! resolves them for a proxy (the waypoint, in its namespace): a rule must be exported to
//! the waypoint's namespace; one attached by `targetRefs` wins, then one naming the host
//! exactly over one naming it by wildcard, then one in the waypoint's own namespace, then
//! in the Service's, then in the root namespace, then any other, and among equals the
//! first by namespace and name. A refused rule keeps its last good version; a file that
//! cannot be read keeps them all. Sans-IO.

use std::sync::Arc;

use ambit_manifests::{ErrorKind, ManifestError, ObjectRef, PolicyTarget, WaypointDestinationRule};
use ambit_state::Service;

/// The rules in force.
#[derive(Debug, Clone, Default)]
pub struct DestinationRules {
    rules: Vec<Arc<WaypointDestinationRule>>,
    /// Tells one set from the next (0: the empty set before any load), so a destination's
    /// rule is looked up once per set, not per request.
    generation: u64,
    /// Each refused rule: `namespace/name` when known, and why.
    pub refused: Vec<(Option<String>, String)>,
    /// Rules kept at their last good version.
    pub kept: Vec<String>,
}

/// Where the rules are looked at from.
#[derive(Debug, Clone, Copy)]
pub struct Viewer<'a> {
    /// The waypoint's namespace.
    pub namespace: &'a str,
    /// MeshConfig `rootNamespace`.
    pub root_namespace: &'a str,
    /// The cluster's DNS domain, to read a short host (`reviews`) as
    /// `reviews.<rule's namespace>.svc.<domain>`.
    pub cluster_domain: &'a str,
}

impl DestinationRules {
    pub fn new(rules: Vec<WaypointDestinationRule>) -> Self {
        let mut rules: Vec<Arc<WaypointDestinationRule>> =
            rules.into_iter().map(Arc::new).collect();
        rules.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        static GENERATIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        DestinationRules {
            rules,
            generation: GENERATIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            ..DestinationRules::default()
        }
    }

    /// Which set this is.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    pub fn rules(&self) -> &[Arc<WaypointDestinationRule>] {
        &self.rules
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// The rule for `service`, seen from `viewer`, if any.
    pub fn for_service(
        &self,
        service: &Service,
        viewer: Viewer<'_>,
    ) -> Option<&Arc<WaypointDestinationRule>> {
        self.rules
            .iter()
            .filter(|r| exported_to(r, viewer.namespace))
            .filter_map(|r| rank(r, service, viewer).map(|rank| (rank, r)))
            // The lowest rank; `min_by_key` keeps the first of equals (rules are sorted).
            .min_by_key(|(rank, _)| *rank)
            .map(|(_, r)| r)
    }
}

fn exported_to(rule: &WaypointDestinationRule, namespace: &str) -> bool {
    rule.export_to.is_empty()
        || rule
            .export_to
            .iter()
            .any(|e| e == "*" || e == namespace || (e == "." && rule.namespace == namespace))
}

/// How well `rule` fits `service`: lower is better; `None` when it does not apply.
fn rank(rule: &WaypointDestinationRule, service: &Service, viewer: Viewer<'_>) -> Option<(u8, u8)> {
    let how = if !rule.targets.is_empty() {
        let targeted = rule.targets.iter().any(|t| match t {
            PolicyTarget::Service { namespace, name }
            | PolicyTarget::ServiceEntry { namespace, name } => {
                *namespace == *service.namespace && *name == *service.name
            }
            _ => false,
        });
        if !targeted {
            return None;
        }
        0
    } else if host_matches(rule, &service.hostname, viewer.cluster_domain) {
        if rule.host.starts_with("*.") {
            2
        } else {
            1
        }
    } else {
        return None;
    };
    let place = if rule.namespace == viewer.namespace {
        0
    } else if *rule.namespace == *service.namespace {
        1
    } else if rule.namespace == viewer.root_namespace {
        2
    } else {
        3
    };
    Some((how, place))
}

/// True when `rule.host` names `hostname`: exactly, as a short name in the rule's
/// namespace, or by a `*.` wildcard.
pub fn host_matches(rule: &WaypointDestinationRule, hostname: &str, cluster_domain: &str) -> bool {
    let host = rule.host.as_str();
    if let Some(suffix) = host.strip_prefix("*.") {
        return hostname
            .strip_suffix(suffix)
            .is_some_and(|head| head.ends_with('.') && head.len() > 1);
    }
    if host.eq_ignore_ascii_case(hostname) {
        return true;
    }
    !host.contains('.')
        && hostname
            .strip_prefix(host)
            .and_then(|rest| rest.strip_prefix('.'))
            .and_then(|rest| rest.strip_prefix(rule.namespace.as_str()))
            .and_then(|rest| rest.strip_prefix(".svc."))
            .is_some_and(|domain| domain == cluster_domain)
}

/// The rules a load comes to after `previous`.
pub fn merge_rules(
    rules: Vec<WaypointDestinationRule>,
    errors: &[ManifestError],
    previous: Option<&DestinationRules>,
) -> DestinationRules {
    if errors.iter().any(|e| e.kind == ErrorKind::Read) {
        if let Some(p) = previous {
            return DestinationRules {
                rules: p.rules.clone(),
                generation: p.generation,
                refused: errors.iter().map(|e| (None, e.to_string())).collect(),
                kept: p.rules.iter().map(|r| r.key()).collect(),
            };
        }
    }
    let mut rules = rules;
    let mut refused = Vec::new();
    let mut kept = Vec::new();
    for e in errors {
        let Some(object) = e
            .object
            .as_ref()
            .filter(|o| ObjectRef::is_destination_rule(o))
        else {
            continue;
        };
        refused.push((object.key.clone(), e.to_string()));
        let last_good = object.key.as_ref().and_then(|key| {
            previous?
                .rules
                .iter()
                .find(|r| &r.key() == key)
                .map(|r| (**r).clone())
        });
        if let Some(r) = last_good {
            if !rules.iter().any(|n| n.key() == r.key()) {
                kept.push(r.key());
                rules.push(r);
            }
        }
    }
    DestinationRules {
        refused,
        kept,
        ..DestinationRules::new(rules)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ambit_manifests::{parse_documents, ParseOptions};
    use ambit_state::ProxyState;

    const MESH: &str = r#"
services:
- {name: reviews, namespace: shop, hostname: reviews.shop.svc.cluster.local, vips: ["/10.96.0.1"], ports: {80: 8080}}
- {name: api, namespace: shop, hostname: api.example.com, vips: ["/10.96.0.2"], ports: {443: 443}}
"#;

    fn rules(text: &str) -> DestinationRules {
        let parsed = parse_documents("dr.yaml", text, &ParseOptions::default());
        assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
        DestinationRules::new(
            parsed
                .destination_rules
                .into_iter()
                .map(|r| r.value)
                .collect(),
        )
    }

    fn doc(ns: &str, name: &str, spec: &str) -> String {
        format!("---\napiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {{name: {name}, namespace: {ns}}}\nspec: {spec}\n")
    }

    const VIEWER: Viewer<'static> = Viewer {
        namespace: "waypoints",
        root_namespace: "istio-system",
        cluster_domain: "cluster.local",
    };

    fn chosen(set: &DestinationRules, service: &str) -> Option<String> {
        let state = ProxyState::from_yaml("mesh", MESH).unwrap();
        let svc = state.service_by_key(service).unwrap();
        set.for_service(&svc, VIEWER).map(|r| r.key())
    }

    #[test]
    fn which_rule_applies() {
        let reviews = "shop/reviews.shop.svc.cluster.local";
        let api = "shop/api.example.com";
        // (rules, expected for reviews, expected for api)
        let table: &[(Vec<String>, Option<&str>, Option<&str>)] = &[
            (vec![], None, None),
            // A short name is the rule's namespace's Service.
            (vec![doc("shop", "short", "{host: reviews}")], Some("shop/short"), None),
            (vec![doc("other", "short", "{host: reviews}")], None, None),
            (
                vec![doc("other", "fqdn", "{host: reviews.shop.svc.cluster.local}")],
                Some("other/fqdn"),
                None,
            ),
            // A wildcard; exact beats it wherever each is.
            (
                vec![
                    doc("shop", "any", "{host: \"*.example.com\"}"),
                    doc("zzz", "exact", "{host: api.example.com}"),
                ],
                None,
                Some("zzz/exact"),
            ),
            (vec![doc("shop", "any", "{host: \"*.example.com\"}")], None, Some("shop/any")),
            (vec![doc("shop", "any", "{host: \"*.svc.cluster.local\"}")], Some("shop/any"), None),
            // The waypoint's namespace, then the Service's, then the root, then others.
            (
                vec![
                    doc("shop", "b", "{host: reviews.shop.svc.cluster.local}"),
                    doc("waypoints", "a", "{host: reviews.shop.svc.cluster.local}"),
                    doc("istio-system", "c", "{host: reviews.shop.svc.cluster.local}"),
                ],
                Some("waypoints/a"),
                None,
            ),
            (
                vec![
                    doc("istio-system", "c", "{host: reviews.shop.svc.cluster.local}"),
                    doc("shop", "b", "{host: reviews.shop.svc.cluster.local}"),
                ],
                Some("shop/b"),
                None,
            ),
            (
                vec![
                    doc("aaa", "d", "{host: reviews.shop.svc.cluster.local}"),
                    doc("istio-system", "c", "{host: reviews.shop.svc.cluster.local}"),
                ],
                Some("istio-system/c"),
                None,
            ),
            // Equals: the first by namespace and name.
            (
                vec![
                    doc("shop", "z", "{host: reviews}"),
                    doc("shop", "m", "{host: reviews}"),
                ],
                Some("shop/m"),
                None,
            ),
            // targetRefs beat hosts, and apply only to what they name.
            (
                vec![
                    doc("waypoints", "host", "{host: reviews.shop.svc.cluster.local}"),
                    doc("shop", "target", "{host: reviews, targetRefs: [{kind: Service, group: \"\", name: reviews}]}"),
                ],
                Some("shop/target"),
                None,
            ),
            (
                vec![doc("shop", "target", "{host: api.example.com, targetRefs: [{kind: ServiceEntry, group: networking.istio.io, name: other}]}")],
                None,
                None,
            ),
            // exportTo: the waypoint's namespace must see it.
            (vec![doc("shop", "dot", "{host: reviews, exportTo: [\".\"]}")], None, None),
            (vec![doc("shop", "to", "{host: reviews, exportTo: [waypoints]}")], Some("shop/to"), None),
            (vec![doc("shop", "all", "{host: reviews, exportTo: [\"*\"]}")], Some("shop/all"), None),
            (vec![doc("waypoints", "dot", "{host: reviews.shop.svc.cluster.local, exportTo: [\".\"]}")], Some("waypoints/dot"), None),
            (vec![doc("shop", "none", "{host: reviews, exportTo: [\"~\"]}")], None, None),
        ];
        for (i, (docs, for_reviews, for_api)) in table.iter().enumerate() {
            let set = rules(&docs.concat());
            assert_eq!(
                chosen(&set, reviews).as_deref(),
                *for_reviews,
                "case {i}: reviews"
            );
            assert_eq!(chosen(&set, api).as_deref(), *for_api, "case {i}: api");
        }
    }

    #[test]
    fn a_refused_rule_keeps_its_last_good_version() {
        let good = doc(
            "shop",
            "r",
            "{host: reviews, trafficPolicy: {loadBalancer: {simple: RANDOM}}}",
        );
        let opts = ParseOptions::default();
        let first = parse_documents("dr.yaml", &good, &opts);
        let first = merge_rules(
            first
                .destination_rules
                .into_iter()
                .map(|r| r.value)
                .collect(),
            &first.errors,
            None,
        );
        let bad = good.replace("RANDOM", "FASTEST");
        let second = parse_documents("dr.yaml", &bad, &opts);
        assert_eq!(second.errors.len(), 1);
        let second = merge_rules(
            second
                .destination_rules
                .into_iter()
                .map(|r| r.value)
                .collect(),
            &second.errors,
            Some(&first),
        );
        assert_eq!(second.kept, ["shop/r"]);
        assert_eq!(second.refused.len(), 1);
        assert!(
            second.refused[0].1.contains("FASTEST"),
            "{:?}",
            second.refused
        );
        assert_eq!(second.rules(), first.rules());
        // Never loaded: nothing applies (the host is balanced as without a rule).
        let none = parse_documents("dr.yaml", &bad, &opts);
        let none = merge_rules(Vec::new(), &none.errors, None);
        assert!(none.is_empty() && none.refused.len() == 1);
    }
}
