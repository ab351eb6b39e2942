//! What to do about one pod, sans IO (reference §1.4, §1.5): given the pod as the watch cache
//! last showed it (or its deletion), its namespace's labels, the enablement rules and what
//! this agent holds enrolled, the one action that brings the node to the wanted state.
//!
//! Level-triggered: the answer depends only on the current state, never on which event woke
//! the reconcile, so a re-list after a dropped watch (or any repeat) decides the same, and
//! every action is idempotent. The order is istio-cni's:
//!
//! 1. deleted, or terminal (Succeeded/Failed) while enrolled or pending: remove as deleted
//!    (with the IPs the agent recorded: a terminal status may come without IPs);
//! 2. a ztunnel pod, or a terminal one: nothing;
//! 3. enrolled here, annotated `enabled` and still selected: re-sync the probe ipset if the
//!    IPs changed, else nothing;
//! 4. no longer selected: remove (rules and annotation) if enrolled or annotated, else nothing;
//! 5. selected: add, once the pod has IPs (with none: wait for the next update).
//!
//! One difference from Istio, on purpose: Istio reads "enrolled" from the annotation alone;
//! here a pod annotated `enabled` that this agent does not hold (its netns was not found at
//! startup, say) is added again, so the node converges instead of skipping it forever.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ambit_k8s::annotation::Redirection;
use ambit_k8s::{Enablement, PodFacts};

/// A pod as the reconcile sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodView {
    pub uid: String,
    pub name: String,
    pub namespace: String,
    pub service_account: String,
    /// `status.podIPs` (else `status.podIP`), unmapped, in order.
    pub ips: Vec<IpAddr>,
    /// Phase Succeeded or Failed.
    pub terminal: bool,
    /// The redirection annotation.
    pub annotation: Option<Redirection>,
    /// What the enablement rules look at.
    pub facts: PodFacts,
    /// A ztunnel pod (never enrolled).
    pub ztunnel: bool,
}

/// The pod's state in the watch cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Presence<'a> {
    /// The pod exists, with its namespace's labels (`None`: namespace not seen yet).
    Present(&'a PodView, Option<&'a BTreeMap<String, String>>),
    /// The pod was deleted; its last known state.
    Deleted(&'a PodView),
}

/// What the agent holds for the pod (its record of an enrollment).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held<'a> {
    pub ips: &'a [IpAddr],
}

/// The one thing to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Nothing(Why),
    /// Take the pod out of the mesh: ipset entries, rules (unless `deleting`: its netns is
    /// going away), `DelWorkload`, then the annotation (whose errors do not count when
    /// `deleting`).
    Remove {
        deleting: bool,
    },
    /// Re-assert the probe ipset entries for these IPs.
    SyncIpset {
        ips: Vec<IpAddr>,
    },
    /// Enroll with these IPs (netns from the agent's record or the `/proc` scan).
    Add {
        ips: Vec<IpAddr>,
    },
}

/// Why nothing is done (for the logs and tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// In the mesh and should stay, IPs unchanged.
    InPlace,
    /// Not selected and not enrolled.
    NotSelected,
    /// Terminal and never enrolled.
    Terminal,
    /// A ztunnel pod.
    Ztunnel,
    /// Selected but without IPs yet; an update will come.
    NoIps,
    /// Deleted and never ours.
    Gone,
    /// Its namespace is not in the cache yet; its event will re-enqueue the pod.
    NoNamespace,
}

/// The decision. See the module docs for the order.
pub fn decide(presence: Presence<'_>, rules: &Enablement, held: Option<Held<'_>>) -> Action {
    let (pod, ns_labels) = match presence {
        Presence::Deleted(pod) => {
            // Istio also removes a deleted pod that merely matches the selectors, in case
            // its annotation never reached the cache; here the agent's own record answers
            // that, and a pod it does not hold has nothing to undo.
            return if held.is_some() || pod.annotation.is_some() {
                Action::Remove { deleting: true }
            } else {
                Action::Nothing(Why::Gone)
            };
        }
        Presence::Present(pod, ns) => (pod, ns),
    };
    let marked = held.is_some() || pod.annotation.is_some();
    if pod.terminal {
        return if marked {
            Action::Remove { deleting: true }
        } else {
            Action::Nothing(Why::Terminal)
        };
    }
    if pod.ztunnel {
        return Action::Nothing(Why::Ztunnel);
    }
    let Some(ns_labels) = ns_labels else {
        return Action::Nothing(Why::NoNamespace);
    };
    let should = rules.evaluate(&pod.facts, ns_labels).is_ambient();
    match (should, held) {
        (true, Some(h)) if pod.annotation == Some(Redirection::Enabled) => {
            if !pod.ips.is_empty() && !same_set(h.ips, &pod.ips) {
                Action::SyncIpset {
                    ips: pod.ips.clone(),
                }
            } else {
                Action::Nothing(Why::InPlace)
            }
        }
        (true, _) if pod.ips.is_empty() => Action::Nothing(Why::NoIps),
        (true, _) => Action::Add {
            ips: pod.ips.clone(),
        },
        (false, _) if marked => Action::Remove { deleting: false },
        (false, _) => Action::Nothing(Why::NotSelected),
    }
}

fn same_set(a: &[IpAddr], b: &[IpAddr]) -> bool {
    a.len() == b.len() && a.iter().all(|ip| b.contains(ip))
}

/// Whether a namespace change must re-enqueue its pods: the namespace selectors' verdict
/// changed (an empty namespace selector counts as no match, as in Istio).
pub fn namespace_changed(
    rules: &Enablement,
    old: Option<&BTreeMap<String, String>>,
    new: &BTreeMap<String, String>,
) -> bool {
    old.is_none_or(|old| rules.selects_namespace(old) != rules.selects_namespace(new))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ambit_k8s::labels::{DATAPLANE_MODE, SIDECAR_STATUS_ANNOTATION};

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[derive(Clone)]
    struct Case {
        what: &'static str,
        pod_labels: &'static [(&'static str, &'static str)],
        ns_labels: Option<&'static [(&'static str, &'static str)]>,
        annotation: Option<Redirection>,
        ips: &'static [&'static str],
        terminal: bool,
        deleted: bool,
        ztunnel: bool,
        sidecar: bool,
        held: Option<&'static [&'static str]>,
        want: Action,
    }

    const AMB: &[(&str, &str)] = &[(DATAPLANE_MODE, "ambient")];
    const NONE: &[(&str, &str)] = &[(DATAPLANE_MODE, "none")];
    const PLAIN: &[(&str, &str)] = &[];
    const IP1: &[&str] = &["10.0.0.1"];
    const IP2: &[&str] = &["10.0.0.2"];
    const DUAL: &[&str] = &["10.0.0.1", "fd00::1"];
    const NOIP: &[&str] = &[];
    use Redirection::{Enabled, Pending};

    fn base(what: &'static str) -> Case {
        Case {
            what,
            pod_labels: PLAIN,
            ns_labels: Some(AMB),
            annotation: None,
            ips: IP1,
            terminal: false,
            deleted: false,
            ztunnel: false,
            sidecar: false,
            held: None,
            want: Action::Nothing(Why::InPlace),
        }
    }

    fn run(c: &Case) -> Action {
        let mut annotations = BTreeMap::new();
        if c.sidecar {
            annotations.insert(SIDECAR_STATUS_ANNOTATION.to_owned(), "{}".to_owned());
        }
        let pod = PodView {
            uid: "u1".into(),
            name: "web".into(),
            namespace: "shop".into(),
            service_account: "default".into(),
            ips: c.ips.iter().map(|s| ip(s)).collect(),
            terminal: c.terminal,
            annotation: c.annotation,
            facts: PodFacts {
                namespace: "shop".into(),
                labels: labels(c.pod_labels),
                annotations,
                host_network: false,
            },
            ztunnel: c.ztunnel,
        };
        let ns = c.ns_labels.map(labels);
        let held_ips: Option<Vec<IpAddr>> = c.held.map(|h| h.iter().map(|s| ip(s)).collect());
        let held = held_ips.as_deref().map(|ips| Held { ips });
        let presence = if c.deleted {
            Presence::Deleted(&pod)
        } else {
            Presence::Present(&pod, ns.as_ref())
        };
        decide(presence, &Enablement::default(), held)
    }

    #[test]
    fn the_decision_table() {
        let ips = |s: &[&str]| s.iter().map(|s| ip(s)).collect::<Vec<_>>();
        let add = |s: &[&str]| Action::Add { ips: ips(s) };
        let remove = Action::Remove { deleting: false };
        let removed = Action::Remove { deleting: true };
        let cases = vec![
            // Terminal first, with the recorded IPs (a terminal status may have none).
            Case {
                annotation: Some(Enabled),
                held: Some(IP1),
                terminal: true,
                ips: NOIP,
                want: removed.clone(),
                ..base("enrolled, now terminal without IPs")
            },
            Case {
                annotation: Some(Pending),
                held: Some(IP1),
                terminal: true,
                want: removed.clone(),
                ..base("pending, now terminal")
            },
            Case {
                annotation: Some(Enabled),
                terminal: true,
                want: removed.clone(),
                ..base("annotated by a previous agent, terminal")
            },
            Case {
                terminal: true,
                want: Action::Nothing(Why::Terminal),
                ..base("completed job pod never enrolled")
            },
            Case {
                held: Some(IP1),
                terminal: true,
                ns_labels: Some(PLAIN),
                want: removed.clone(),
                ..base("held, terminal, unselected")
            },
            // Enrolled and staying.
            Case {
                annotation: Some(Enabled),
                held: Some(IP1),
                want: Action::Nothing(Why::InPlace),
                ..base("enrolled, no change")
            },
            Case {
                annotation: Some(Enabled),
                held: Some(DUAL),
                ips: &["fd00::1", "10.0.0.1"],
                want: Action::Nothing(Why::InPlace),
                ..base("same IPs in another order")
            },
            Case {
                annotation: Some(Enabled),
                held: Some(IP1),
                ips: IP2,
                want: Action::SyncIpset { ips: ips(IP2) },
                ..base("enrolled, IP changed")
            },
            Case {
                annotation: Some(Enabled),
                held: Some(IP1),
                ips: DUAL,
                want: Action::SyncIpset { ips: ips(DUAL) },
                ..base("enrolled, gained a v6 IP")
            },
            Case {
                annotation: Some(Enabled),
                held: Some(IP1),
                ips: NOIP,
                want: Action::Nothing(Why::InPlace),
                ..base("enrolled, IPs not in the status")
            },
            // No longer selected.
            Case {
                annotation: Some(Enabled),
                held: Some(IP1),
                ns_labels: Some(PLAIN),
                want: remove.clone(),
                ..base("namespace label removed")
            },
            Case {
                annotation: Some(Enabled),
                held: Some(IP1),
                pod_labels: NONE,
                want: remove.clone(),
                ..base("pod opted out")
            },
            Case {
                annotation: Some(Enabled),
                held: Some(IP1),
                sidecar: true,
                want: remove.clone(),
                ..base("sidecar injected")
            },
            Case {
                annotation: Some(Pending),
                ns_labels: Some(PLAIN),
                want: remove.clone(),
                ..base("pending, unselected")
            },
            Case {
                held: Some(IP1),
                ns_labels: Some(PLAIN),
                want: remove.clone(),
                ..base("held without annotation, unselected")
            },
            Case {
                annotation: Some(Enabled),
                ns_labels: Some(PLAIN),
                want: remove.clone(),
                ..base("annotated, not held, unselected")
            },
            Case {
                ns_labels: Some(PLAIN),
                want: Action::Nothing(Why::NotSelected),
                ..base("plain pod")
            },
            Case {
                ns_labels: Some(NONE),
                pod_labels: PLAIN,
                want: Action::Nothing(Why::NotSelected),
                ..base("namespace none")
            },
            // Should be enabled.
            Case {
                want: add(IP1),
                ..base("namespace labelled, running pod")
            },
            Case {
                ns_labels: Some(PLAIN),
                pod_labels: AMB,
                ips: DUAL,
                want: add(DUAL),
                ..base("pod labelled, dual stack")
            },
            Case {
                ips: NOIP,
                want: Action::Nothing(Why::NoIps),
                ..base("selected, no IPs yet")
            },
            Case {
                annotation: Some(Pending),
                held: Some(IP1),
                want: add(IP1),
                ..base("pending: retry the add")
            },
            Case {
                held: Some(IP1),
                want: add(IP1),
                ..base("held, annotation not written yet")
            },
            Case {
                annotation: Some(Enabled),
                want: add(IP1),
                ..base("annotated but not held (netns not found at start)")
            },
            Case {
                ns_labels: None,
                want: Action::Nothing(Why::NoNamespace),
                ..base("namespace not cached yet")
            },
            // Never ztunnel.
            Case {
                ztunnel: true,
                pod_labels: AMB,
                want: Action::Nothing(Why::Ztunnel),
                ..base("ztunnel pod")
            },
            // Deletes.
            Case {
                deleted: true,
                annotation: Some(Enabled),
                held: Some(IP1),
                want: removed.clone(),
                ..base("enrolled pod deleted")
            },
            Case {
                deleted: true,
                annotation: Some(Pending),
                want: removed.clone(),
                ..base("pending pod deleted")
            },
            Case {
                deleted: true,
                held: Some(IP1),
                want: removed.clone(),
                ..base("held, deleted before the annotation")
            },
            Case {
                deleted: true,
                want: Action::Nothing(Why::Gone),
                ..base("deleted, never ours")
            },
            Case {
                deleted: true,
                ztunnel: true,
                want: Action::Nothing(Why::Gone),
                ..base("ztunnel deleted")
            },
        ];
        for c in &cases {
            assert_eq!(run(c), c.want, "{}", c.what);
        }
    }

    #[test]
    fn namespace_reenqueue_only_when_the_selector_verdict_changes() {
        let r = Enablement::default();
        let (amb, plain, other) = (labels(AMB), labels(PLAIN), labels(&[("team", "x")]));
        assert!(namespace_changed(&r, None, &plain));
        assert!(namespace_changed(&r, Some(&plain), &amb));
        assert!(namespace_changed(&r, Some(&amb), &plain));
        assert!(!namespace_changed(&r, Some(&plain), &other));
        assert!(!namespace_changed(&r, Some(&amb), &amb));
    }
}
