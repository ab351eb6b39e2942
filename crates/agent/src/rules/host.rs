//! The host-side probe SNAT rules (reference `istio-cni.md` §2.3).

use super::family::Family;
use super::set::{Ownership, Rule, RuleSet, TableRules};

/// Host chain hooked to `nat POSTROUTING`.
pub const POSTRT_CHAIN: &str = "ISTIO_POSTRT";

/// The host-side probe SNAT rules for one family (§2.3), matching the ipset `set_name`.
pub fn host_probe_rules(family: Family, set_name: &str) -> RuleSet {
    let snat = family.probe_snat().to_string();
    RuleSet {
        family,
        tables: vec![TableRules {
            table: "nat".into(),
            new_chains: vec![POSTRT_CHAIN.into()],
            rules: vec![
                Rule::insert("POSTROUTING", format!("-j {POSTRT_CHAIN}")),
                Rule::append(
                    POSTRT_CHAIN,
                    format!(
                        "-m owner --socket-exists -p tcp -m set --match-set {set_name} dst \
                         -j SNAT --to-source {snat}"
                    ),
                ),
            ],
        }],
        ownership: Ownership::Planned,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::SavedRules;
    use ambit_wellknown::probes::{SET_V4 as PROBE_SET_V4, SET_V6 as PROBE_SET_V6};

    #[test]
    fn golden_host_probe_rules() {
        assert_eq!(
            host_probe_rules(Family::V4, PROBE_SET_V4).restore_text(),
            "*nat\n-N ISTIO_POSTRT\n-I POSTROUTING 1 -j ISTIO_POSTRT\n\
             -A ISTIO_POSTRT -m owner --socket-exists -p tcp -m set --match-set \
             istio-inpod-probes-v4 dst -j SNAT --to-source 169.254.7.127\nCOMMIT\n"
        );
        assert_eq!(
            host_probe_rules(Family::V6, PROBE_SET_V6).restore_text(),
            "*nat\n-N ISTIO_POSTRT\n-I POSTROUTING 1 -j ISTIO_POSTRT\n\
             -A ISTIO_POSTRT -m owner --socket-exists -p tcp -m set --match-set \
             istio-inpod-probes-v6 dst -j SNAT --to-source \
             fd16:9254:7127:1337:ffff:ffff:ffff:ffff\nCOMMIT\n"
        );
        assert_eq!(
            host_probe_rules(Family::V4, PROBE_SET_V4).cleanup_text(),
            "*nat\n-D POSTROUTING -j ISTIO_POSTRT\n-F ISTIO_POSTRT\n-X ISTIO_POSTRT\nCOMMIT\n"
        );
    }

    #[test]
    fn host_ownership_is_exact() {
        let set = host_probe_rules(Family::V4, "s");
        assert!(set.owns("nat", "ISTIO_POSTRT"));
        assert!(!set.owns("nat", "ISTIO_OTHER"));
        assert!(!set.owns("filter", "ISTIO_POSTRT"));
        let saved = SavedRules::parse(
            "*nat\n:POSTROUTING ACCEPT [0:0]\n:ISTIO_OTHER - [0:0]\n:ISTIO_POSTRT - [0:0]\n\
             -A POSTROUTING -j ISTIO_OTHER\n-A POSTROUTING -j ISTIO_POSTRT\n\
             -A ISTIO_POSTRT -m owner --socket-exists -p tcp -m set --match-set s dst -j SNAT --to-source 169.254.7.127\n\
             COMMIT\n",
        );
        let c = set.compare(&saved);
        assert!(c.residue && c.structure_matches);
    }
}
