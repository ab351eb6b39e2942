//! The policy set a load comes to, failing closed: a refused document keeps its policy's
//! last good version; a refused document whose policy has none (or that names no policy),
//! or a file that cannot be read on the first load, leaves the waypoint denying every
//! request until it is fixed: a DENY with a typo must never become an allow. Sans-IO.

use std::collections::BTreeSet;
use std::sync::Arc;

use ambit_manifests::{ErrorKind, Parsed};

use crate::authz::PolicySet;

/// What a load did, for the log.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Policies kept at their last good version (`namespace/name`).
    pub kept: Vec<String>,
    /// Why the set fails closed, if it does.
    pub fail_closed: Option<String>,
}

/// The set `parsed` comes to after `previous`.
pub fn merge(parsed: Parsed, previous: Option<&PolicySet>) -> (PolicySet, Outcome) {
    let mut out = Outcome::default();
    let read_failed = parsed.errors.iter().any(|e| e.kind == ErrorKind::Read);
    if read_failed {
        let why = parsed
            .errors
            .iter()
            .filter(|e| e.kind == ErrorKind::Read)
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ");
        return match previous {
            // The file or directory went missing or unreadable: nothing new is known.
            Some(p) if p.fail_closed.is_none() => {
                out.kept = p.policies.iter().map(|x| x.authorization.key()).collect();
                (p.clone(), out)
            }
            _ => {
                out.fail_closed = Some(why.clone());
                (PolicySet::new(Vec::new(), Some(why)), out)
            }
        };
    }
    let mut policies: Vec<Arc<ambit_manifests::WaypointPolicy>> = parsed
        .policies
        .into_iter()
        .map(|p| Arc::new(p.value))
        .collect();
    let loaded: BTreeSet<String> = policies.iter().map(|p| p.authorization.key()).collect();
    let mut unknown = Vec::new();
    for e in &parsed.errors {
        if e.kind == ErrorKind::Duplicate {
            continue;
        }
        // A refused route or DestinationRule is its own reader's business (neither
        // allows anything); anything else could be a policy.
        if e.object
            .as_ref()
            .is_some_and(|o| o.is_route() || o.is_destination_rule())
        {
            continue;
        }
        let key = e.object.as_ref().and_then(|o| o.key.clone());
        let last_good = key.as_ref().and_then(|key| {
            previous?
                .policies
                .iter()
                .find(|p| &p.authorization.key() == key)
                .cloned()
        });
        match (last_good, key) {
            (Some(p), Some(key)) if !loaded.contains(&key) => {
                out.kept.push(key);
                policies.push(p);
            }
            (Some(_), Some(_)) => {}
            _ => unknown.push(e.to_string()),
        }
    }
    let fail_closed = (!unknown.is_empty()).then(|| unknown.join("; "));
    out.fail_closed = fail_closed.clone();
    (PolicySet::new(policies, fail_closed), out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ambit_manifests::{parse_documents, ParseOptions};

    const GOOD: &str = r#"
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-delete, namespace: shop}
spec:
  targetRefs: [{kind: Service, group: "", name: reviews}]
  action: DENY
  rules: [{to: [{operation: {methods: ["DELETE"]}}]}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: other, namespace: shop}
spec:
  targetRefs: [{kind: Service, group: "", name: ratings}]
  action: ALLOW
  rules: [{}]
"#;

    fn parse(text: &str) -> Parsed {
        parse_documents("p.yaml", text, &ParseOptions::default())
    }

    fn keys(s: &PolicySet) -> Vec<String> {
        let mut k: Vec<String> = s.policies.iter().map(|p| p.authorization.key()).collect();
        k.sort();
        k
    }

    #[test]
    fn a_bad_version_keeps_the_last_good_one() {
        let (first, o) = merge(parse(GOOD), None);
        assert_eq!(o, Outcome::default());
        let typo = GOOD.replace("[\"DELETE\"]", "[\"delete\"]");
        let (second, o) = merge(parse(&typo), Some(&first));
        assert_eq!(o.kept, ["shop/deny-delete"]);
        assert_eq!(o.fail_closed, None);
        assert_eq!(keys(&second), ["shop/deny-delete", "shop/other"]);
        let kept = second
            .policies
            .iter()
            .find(|p| p.authorization.key() == "shop/deny-delete")
            .unwrap();
        assert_eq!(
            kept, &first.policies[0],
            "the previous version, not a new one"
        );
    }

    #[test]
    fn a_bad_policy_never_loaded_fails_closed() {
        let typo = GOOD.replace("[\"DELETE\"]", "[\"delete\"]");
        let (set, o) = merge(parse(&typo), None);
        assert!(
            o.fail_closed
                .as_deref()
                .unwrap()
                .contains("p.yaml:8:40: spec.rules[0].to[0].operation.methods[0]"),
            "{o:?}"
        );
        assert!(set.fail_closed.is_some());
        assert_eq!(keys(&set), ["shop/other"]);
        // Fixed: open again.
        let (fixed, o) = merge(parse(GOOD), Some(&set));
        assert_eq!(o.fail_closed, None);
        assert!(fixed.fail_closed.is_none());
    }

    #[test]
    fn a_refused_route_is_not_taken_for_a_policy() {
        // An HTTPRoute named like no policy, refused (its path does not start with `/`):
        // the routes' reader reports it; the policies stay open.
        let route = "---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: canary, namespace: shop}\nspec:\n  parentRefs: [{group: \"\", kind: Service, name: reviews}]\n  rules: [{matches: [{path: {type: PathPrefix, value: v1}}]}]\n";
        let parsed = parse(&format!("{GOOD}{route}"));
        assert_eq!(parsed.errors.len(), 1, "{:?}", parsed.errors);
        let (set, o) = merge(parsed, None);
        assert_eq!(o.fail_closed, None);
        assert_eq!(keys(&set), ["shop/deny-delete", "shop/other"]);
        // A policy of that name refused: closed, as before.
        let policy = GOOD
            .split("---")
            .next()
            .unwrap()
            .replace("deny-delete", "canary")
            .replace("[\"DELETE\"]", "[\"delete\"]");
        let (_, o) = merge(parse(&format!("{GOOD}---{policy}")), None);
        assert!(o.fail_closed.is_some(), "{o:?}");
        // A refused DestinationRule neither: it only balances.
        let rule = "---\napiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: canary, namespace: shop}\nspec: {host: reviews, trafficPolicy: {loadBalancer: {simple: FASTEST}}}\n";
        let parsed = parse(&format!("{GOOD}{rule}"));
        assert_eq!(parsed.errors.len(), 1, "{:?}", parsed.errors);
        let (_, o) = merge(parsed, None);
        assert_eq!(o.fail_closed, None);
        // A route refused before it names itself is still a route.
        let nameless = route.replace("{name: canary, namespace: shop}", "{namespace: shop}");
        let (set, o) = merge(parse(&format!("{GOOD}{nameless}")), None);
        assert_eq!(o.fail_closed, None);
        assert_eq!(keys(&set), ["shop/deny-delete", "shop/other"]);
        // An empty kind, or a List (which may hold policies), is not known to be a route.
        for other in [
            "---\napiVersion: security.istio.io/v1\nkind: \"\"\nmetadata: {name: x, namespace: shop}\n",
            "---\napiVersion: v1\nkind: List\nmetadata: {name: x, namespace: shop}\nitems: []\n",
        ] {
            let parsed = parse(&format!("{GOOD}{other}"));
            assert_eq!(parsed.errors.len(), 1, "{other}: {:?}", parsed.errors);
            let (_, o) = merge(parsed, None);
            assert!(o.fail_closed.is_some(), "{other}: {o:?}");
        }
    }

    #[test]
    fn a_document_that_names_nothing_fails_closed() {
        let broken = format!("{GOOD}---\nkind: [unclosed\n");
        let (_, o) = merge(parse(&broken), Some(&merge(parse(GOOD), None).0));
        assert!(o.fail_closed.is_some(), "{o:?}");
    }

    #[test]
    fn an_unreadable_path_keeps_the_last_set_or_fails_closed() {
        let missing = ambit_manifests::load_path(
            std::path::Path::new("/nonexistent/ambit-policies"),
            &ParseOptions::default(),
        );
        let (good, _) = merge(parse(GOOD), None);
        let (kept, o) = merge(missing.clone(), Some(&good));
        assert_eq!(keys(&kept), keys(&good));
        assert_eq!(o.fail_closed, None);
        let (none, o) = merge(missing, None);
        assert!(none.fail_closed.is_some() && o.fail_closed.is_some());
    }

    #[test]
    fn duplicates_keep_the_first_and_stay_open() {
        let twice = format!("{GOOD}---{}", GOOD.split("---").next().unwrap());
        let (set, o) = merge(parse(&twice), None);
        assert_eq!(o.fail_closed, None);
        assert_eq!(keys(&set), ["shop/deny-delete", "shop/other"]);
    }
}
