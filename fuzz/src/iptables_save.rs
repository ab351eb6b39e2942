//! The `iptables_save` target: the agent's reader of `iptables-save` output
//! (`SavedRules::parse`) and what it feeds: the comparison with a plan, the listing of what
//! is ours and the removal text, checked by simulating `iptables-restore --noflush`. The
//! output of the tools in a pod's netns is outside input: the pod's own processes can
//! rewrite its rules.

use std::collections::HashSet;

use ambit_agent::rules::{
    host_probe_rules, pod_rules, removal_text, rule_target, Family, PodRuleOptions, RuleSet,
    SavedRule, SavedRules, SavedTable,
};

/// Three plans cover the code: both families, both ownerships, with and without the `raw`
/// table and the inbound rules (more would only slow each run).
fn plans() -> [RuleSet; 3] {
    let dns = PodRuleOptions::default();
    let ingress = PodRuleOptions {
        dns_capture: false,
        bypass_inbound: true,
        ..dns
    };
    [
        pod_rules(Family::V4, &dns),
        pod_rules(Family::V6, &ingress),
        host_probe_rules(Family::V4, "istio-inpod-probes-v4"),
    ]
}

/// What `iptables-restore --noflush` would leave after `text` (the subset of its language
/// `removal_text` writes: `*table`, `-D`, `-F`, `-X`, `-N`, `-A`, `-I c 1`, `COMMIT`).
fn apply(saved: &SavedRules, text: &str) -> SavedRules {
    let mut out = saved.clone();
    let mut table: Option<usize> = None;
    for line in text.lines() {
        if let Some(name) = line.strip_prefix('*') {
            let i = match out.tables.iter().position(|t| t.name == name) {
                Some(i) => i,
                None => {
                    out.tables.push(SavedTable {
                        name: name.to_owned(),
                        ..SavedTable::default()
                    });
                    out.tables.len() - 1
                }
            };
            table = Some(i);
            continue;
        }
        if line == "COMMIT" {
            table = None;
            continue;
        }
        let t = &mut out.tables[table.expect("a line outside a table block")];
        let (op, rest) = line.split_once(' ').expect("an operation and its argument");
        match op {
            "-D" => {
                let (chain, spec) = rest.split_once(' ').unwrap_or((rest, ""));
                let i = t
                    .rules
                    .iter()
                    .position(|r| r.chain == chain && r.spec == spec)
                    .unwrap_or_else(|| panic!("-D of a rule that is not there: {line}"));
                t.rules.remove(i);
            }
            "-F" => t.rules.retain(|r| r.chain != rest),
            "-X" => {
                assert!(
                    !t.rules
                        .iter()
                        .any(|r| rule_target(&r.spec).as_deref() == Some(rest)),
                    "-X of a chain still jumped to: {line}"
                );
                t.chains.retain(|c| c != rest);
            }
            "-N" => {
                assert!(
                    !t.chains.iter().any(|c| c == rest),
                    "-N of an existing chain: {line}"
                );
                t.chains.push(rest.to_owned());
            }
            "-A" | "-I" => {
                let (chain, spec) = rest.split_once(' ').unwrap_or((rest, ""));
                let spec = if op == "-I" {
                    spec.strip_prefix("1 ").expect("-I at position 1")
                } else {
                    spec
                };
                t.rules.push(SavedRule {
                    chain: chain.to_owned(),
                    spec: spec.to_owned(),
                });
            }
            _ => panic!("unexpected line in a removal text: {line}"),
        }
    }
    out
}

/// Inputs real `iptables-save` output always satisfies, and the simulation above needs: one
/// block per table, every rule in a declared chain, names without blanks, specs without
/// blanks at either end (the parser trims them).
fn well_formed(saved: &SavedRules) -> bool {
    let mut names = HashSet::new();
    saved.tables.iter().all(|t| {
        names.insert(t.name.as_str())
            && !t.name.is_empty()
            && !t.name.contains(char::is_whitespace)
            && t.rules
                .iter()
                .all(|r| t.chains.contains(&r.chain) && !r.chain.contains(char::is_whitespace))
            && t.chains.iter().collect::<HashSet<_>>().len() == t.chains.len()
    })
}

/// What one plan made of the input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanOutcome {
    /// Something of ours is there.
    pub residue: bool,
    /// The netns holds exactly the plan.
    pub in_sync: bool,
    /// How many chains and rules are listed as ours.
    pub ours: usize,
    /// The input is shaped like real output, so the removal and the swap were simulated
    /// and checked.
    pub simulated: bool,
}

/// Input: text; invalid UTF-8 is replaced. Returns, for the v4 in-pod plan with DNS
/// capture, the v6 one in ingress mode without it, and the v4 host probe set, what each
/// made of it.
///
/// Checks: the removal is empty iff nothing is listed as ours; something listed means
/// residue; on input shaped like real output (one block per table, rules only in declared
/// chains, no blanks in names) a simulated `iptables-restore --noflush` of the removal
/// leaves nothing of ours (every `-D` hits a rule, no `-X` of a chain still jumped to), and
/// of the swap leaves a netns that compares as exactly the plan.
pub fn run(data: &[u8]) -> [PlanOutcome; 3] {
    let text = String::from_utf8_lossy(data);
    let saved = SavedRules::parse(&text);
    for t in &saved.tables {
        for r in &t.rules {
            let _ = rule_target(&r.spec);
        }
    }
    let well_formed = well_formed(&saved);
    plans().map(|plan| {
        let owns = |t: &str, c: &str| plan.owns(t, c);
        let cmp = plan.compare(&saved);
        let ours = saved.owned_objects(owns);
        let removal = removal_text(&saved, owns, None);
        // The removal touches exactly what is listed as ours.
        assert_eq!(
            ours.is_empty(),
            removal.is_empty(),
            "{ours:?} vs {removal:?}"
        );
        if !ours.is_empty() {
            assert!(cmp.residue, "ours listed but no residue: {ours:?}");
        }
        let swap = removal_text(&saved, owns, Some(&plan));
        if well_formed {
            // Removing leaves nothing of ours; removing and installing in one transaction
            // (what a reconcile does) leaves exactly the plan.
            let after = apply(&saved, &removal);
            assert!(after.owned_objects(owns).is_empty(), "{removal}");
            assert!(!plan.compare(&after).residue, "residue after {removal}");
            let swapped = apply(&saved, &swap);
            assert!(
                plan.compare(&swapped).structure_matches,
                "not in sync after the swap:\n{swap}"
            );
        }
        PlanOutcome {
            residue: cmp.residue,
            in_sync: cmp.structure_matches,
            ours: ours.len(),
            simulated: well_formed,
        }
    })
}
