//! `ambit_rbac_dry_run_matches{policy,action}`: the dry-run policies a proxy's
//! authorizations matched (logged, never enforced). Each registry its own counter, told
//! by each authorization it is passed to, so two proxies in one process count apart.

use ambit_state::{Authorization, PolicyAction, RbacObserver};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DryRunLabels {
    policy: String,
    action: &'static str,
}

/// Counts dry-run matches by policy (`namespace/name`) and action (`ALLOW`, `DENY`).
#[derive(Clone, Debug, Default)]
pub struct DryRunMatches(Family<DryRunLabels, Counter>);

impl DryRunMatches {
    /// Registers the counter in `registry`.
    pub fn register(registry: &mut Registry) -> DryRunMatches {
        let m = DryRunMatches::default();
        registry.register(
            "ambit_rbac_dry_run_matches",
            "Connections a dry-run authorization policy matched (logged, not enforced), by policy and action",
            m.0.clone(),
        );
        m
    }
}

impl RbacObserver for DryRunMatches {
    fn dry_run_matched(&self, policy: &Authorization) {
        let action = match policy.action {
            PolicyAction::Allow => "ALLOW",
            PolicyAction::Deny => "DENY",
        };
        self.0
            .get_or_create(&DryRunLabels {
                policy: policy.key(),
                action,
            })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ambit_state::PolicyScope;
    use prometheus_client::encoding::text::encode;

    #[test]
    fn counted_by_policy_and_action() {
        let mut registry = Registry::default();
        let m = DryRunMatches::register(&mut registry);
        let p = |name: &str, action| Authorization {
            name: name.into(),
            namespace: "ns".into(),
            scope: PolicyScope::Global,
            action,
            rules: vec![],
            dry_run: true,
        };
        m.dry_run_matched(&p("a", PolicyAction::Deny));
        m.dry_run_matched(&p("a", PolicyAction::Deny));
        m.dry_run_matched(&p("b", PolicyAction::Allow));
        let mut out = String::new();
        encode(&mut out, &registry).unwrap();
        let mut samples: Vec<&str> = out
            .lines()
            .filter(|l| l.starts_with("ambit_rbac_dry_run_matches_total{"))
            .collect();
        samples.sort();
        assert_eq!(
            samples,
            [
                "ambit_rbac_dry_run_matches_total{policy=\"ns/a\",action=\"DENY\"} 2",
                "ambit_rbac_dry_run_matches_total{policy=\"ns/b\",action=\"ALLOW\"} 1",
            ]
        );
    }
}
