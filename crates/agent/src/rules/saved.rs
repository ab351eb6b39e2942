//! Reading `iptables-save` output, comparing it with a plan and building the removal of
//! whatever of ours a netns holds.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::set::{Rule, RuleSet};
use super::words::rule_target;

/// One saved table: its chains (built-in and user) and its rules, in save order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SavedTable {
    pub name: String,
    pub chains: Vec<String>,
    pub rules: Vec<SavedRule>,
}

/// One saved rule: `-A <chain> <spec>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SavedRule {
    pub chain: String,
    pub spec: String,
}

/// Parsed `iptables-save` output.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SavedRules {
    pub tables: Vec<SavedTable>,
}

impl SavedRules {
    /// Parses `iptables-save` output. Comments, counters and unknown lines are ignored.
    pub fn parse(text: &str) -> SavedRules {
        let mut tables: Vec<SavedTable> = Vec::new();
        for line in text.lines().map(str::trim) {
            if let Some(name) = line.strip_prefix('*') {
                tables.push(SavedTable {
                    name: name.trim().to_owned(),
                    ..SavedTable::default()
                });
            } else if let Some(decl) = line.strip_prefix(':') {
                if let (Some(t), Some(chain)) = (tables.last_mut(), decl.split_whitespace().next())
                {
                    t.chains.push(chain.to_owned());
                }
            } else if let Some(rest) = line.strip_prefix("-A ") {
                if let Some(t) = tables.last_mut() {
                    let rest = rest.trim_start();
                    let (chain, spec) = rest.split_once(' ').unwrap_or((rest, ""));
                    t.rules.push(SavedRule {
                        chain: chain.to_owned(),
                        spec: spec.trim().to_owned(),
                    });
                }
            }
        }
        SavedRules { tables }
    }

    /// The table called `name`, if saved.
    pub fn table(&self, name: &str) -> Option<&SavedTable> {
        self.tables.iter().find(|t| t.name == name)
    }

    /// Every owned chain (per `owns(table, chain)`) and every rule jumping into one, as
    /// `(table, chain or "chain spec")` strings: what a netns holds of ours. Empty = clean.
    pub fn owned_objects(&self, owns: impl Fn(&str, &str) -> bool) -> Vec<String> {
        let mut out = Vec::new();
        for t in &self.tables {
            for c in t.chains.iter().filter(|c| owns(&t.name, c)) {
                out.push(format!("{}: chain {c}", t.name));
            }
            for r in &t.rules {
                if !owns(&t.name, &r.chain)
                    && rule_target(&r.spec).is_some_and(|j| owns(&t.name, &j))
                {
                    out.push(format!("{}: -A {} {}", t.name, r.chain, r.spec));
                }
            }
        }
        out
    }
}

/// The `iptables-restore --noflush` input that removes everything of ours a netns holds,
/// per `owns(table, chain)`: every jump into an owned chain from a chain we do not own,
/// then a flush of every owned chain, then their deletion. Tables are emitted in save
/// order; `extra` lines (per table, e.g. the new rule set) follow the removal in the same
/// transaction, so a swap is atomic. Tables only in `extra` are appended in its order.
pub fn removal_text(
    saved: &SavedRules,
    owns: impl Fn(&str, &str) -> bool,
    extra: Option<&RuleSet>,
) -> String {
    let mut blocks: Vec<(String, Vec<String>)> = Vec::new();
    for t in &saved.tables {
        let mut lines = Vec::new();
        for r in &t.rules {
            if !owns(&t.name, &r.chain) && rule_target(&r.spec).is_some_and(|j| owns(&t.name, &j)) {
                lines.push(format!("-D {} {}", r.chain, r.spec));
            }
        }
        let owned: Vec<&String> = t.chains.iter().filter(|c| owns(&t.name, c)).collect();
        lines.extend(owned.iter().map(|c| format!("-F {c}")));
        lines.extend(owned.iter().map(|c| format!("-X {c}")));
        if !lines.is_empty() {
            blocks.push((t.name.clone(), lines));
        }
    }
    if let Some(set) = extra {
        for t in &set.tables {
            let mut lines: Vec<String> = t.new_chains.iter().map(|c| format!("-N {c}")).collect();
            lines.extend(t.rules.iter().map(Rule::add_line));
            match blocks.iter_mut().find(|(name, _)| *name == t.table) {
                Some((_, existing)) => existing.extend(lines),
                None => blocks.push((t.table.clone(), lines)),
            }
        }
    }
    let mut out = String::new();
    for (table, lines) in blocks {
        let _ = writeln!(out, "*{table}");
        for l in lines {
            let _ = writeln!(out, "{l}");
        }
        out.push_str("COMMIT\n");
    }
    out
}

impl RuleSet {
    /// Compares the set with the saved state of a netns (structure only: chains, rule counts,
    /// jumps). A structural match still needs [`RuleSet::check_text`] to pass before the
    /// netns can be called in sync: the saved form of a rule differs from how it was written.
    pub fn compare(&self, saved: &SavedRules) -> Comparison {
        let residue = saved.tables.iter().any(|t| {
            t.chains.iter().any(|c| self.owns(&t.name, c))
                || t.rules.iter().any(|r| {
                    self.owns(&t.name, &r.chain)
                        || rule_target(&r.spec).is_some_and(|j| self.owns(&t.name, &j))
                })
        });

        let mut matches = true;
        // Planned chains and jumps are there, with the planned number of rules.
        for t in &self.tables {
            let saved_t = saved.table(&t.table);
            for c in &t.new_chains {
                let planned = t.rules.iter().filter(|r| &r.chain == c).count();
                match saved_t {
                    Some(st) if st.chains.contains(c) => {
                        if st.rules.iter().filter(|r| &r.chain == c).count() != planned {
                            matches = false;
                        }
                    }
                    _ => matches = false,
                }
            }
        }
        // Nothing owned that is not planned: chains, and jumps into owned chains from
        // chains we do not own (counted, so a duplicated jump is a delta).
        for st in &saved.tables {
            let planned_t = self.tables.iter().find(|t| t.table == st.name);
            for c in st.chains.iter().filter(|c| self.owns(&st.name, c)) {
                if !planned_t.is_some_and(|t| t.new_chains.contains(c)) {
                    matches = false;
                }
            }
            let mut jumps: BTreeMap<(String, String), isize> = BTreeMap::new();
            for r in st.rules.iter().filter(|r| !self.owns(&st.name, &r.chain)) {
                if let Some(j) = rule_target(&r.spec).filter(|j| self.owns(&st.name, j)) {
                    *jumps.entry((r.chain.clone(), j)).or_default() += 1;
                }
            }
            if let Some(t) = planned_t {
                for r in t.rules.iter().filter(|r| !self.owns(&t.table, &r.chain)) {
                    if let Some(j) = r.target() {
                        *jumps.entry((r.chain.clone(), j)).or_default() -= 1;
                    }
                }
            }
            if jumps.values().any(|n| *n != 0) {
                matches = false;
            }
        }
        // Planned jumps in tables that were not saved at all.
        for t in &self.tables {
            if saved.table(&t.table).is_none() && !t.rules.is_empty() {
                matches = false;
            }
        }
        Comparison {
            residue,
            structure_matches: matches,
        }
    }
}

/// The result of [`RuleSet::compare`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Comparison {
    /// Something of ours (an owned chain or a jump into one) exists.
    pub residue: bool,
    /// Chains, rule counts and jumps are exactly as planned.
    pub structure_matches: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::pod::tests::opts;
    use crate::rules::{pod_rules, Family};

    /// What nf_tables iptables-save 1.8.9 prints after restoring `V4_DNS`.
    const SAVED_V4_DNS: &str = "\
# Generated by iptables-save v1.8.9 (nf_tables) on Mon Nov 30 04:57:59 2026
*mangle
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:ISTIO_OUTPUT - [0:0]
:ISTIO_PRERT - [0:0]
-A PREROUTING -j ISTIO_PRERT
-A OUTPUT -j ISTIO_OUTPUT
-A ISTIO_OUTPUT -m connmark --mark 0x111/0xfff -j CONNMARK --restore-mark --nfmask 0xffffffff --ctmask 0xffffffff
-A ISTIO_PRERT -m mark --mark 0x539/0xfff -j CONNMARK --set-xmark 0x111/0xfff
COMMIT
# Completed on Mon Nov 30 04:57:59 2026
*raw
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:ISTIO_OUTPUT - [0:0]
:ISTIO_PRERT - [0:0]
-A PREROUTING -j ISTIO_PRERT
-A OUTPUT -j ISTIO_OUTPUT
-A ISTIO_OUTPUT -p udp -m mark --mark 0x539/0xfff -m udp --dport 53 -j CT --zone 1
-A ISTIO_PRERT -p udp -m mark ! --mark 0x539/0xfff -m udp --sport 53 -j CT --zone 1
COMMIT
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:ISTIO_OUTPUT - [0:0]
:ISTIO_PRERT - [0:0]
-A PREROUTING -j ISTIO_PRERT
-A OUTPUT -j ISTIO_OUTPUT
-A ISTIO_OUTPUT -d 169.254.7.127/32 -p tcp -m tcp -j ACCEPT
-A ISTIO_OUTPUT ! -o lo -p udp -m mark ! --mark 0x539/0xfff -m udp --dport 53 -j REDIRECT --to-ports 15053
-A ISTIO_OUTPUT ! -d 127.0.0.1/32 -p tcp -m tcp --dport 53 -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15053
-A ISTIO_OUTPUT -p tcp -m mark --mark 0x111/0xfff -j ACCEPT
-A ISTIO_OUTPUT ! -d 127.0.0.1/32 -o lo -j ACCEPT
-A ISTIO_OUTPUT ! -d 127.0.0.1/32 -p tcp -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15001
-A ISTIO_PRERT -s 169.254.7.127/32 -p tcp -m tcp -j ACCEPT
-A ISTIO_PRERT ! -d 127.0.0.1/32 -p tcp -m tcp ! --dport 15008 -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15006
COMMIT
";

    const SAVED_EMPTY_NAT: &str = "*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n\
        :OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\nCOMMIT\n";

    #[test]
    fn parse_save_output() {
        let saved = SavedRules::parse(SAVED_V4_DNS);
        let names: Vec<_> = saved.tables.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["mangle", "raw", "nat"]);
        let nat = saved.table("nat").unwrap();
        assert_eq!(
            nat.chains,
            [
                "PREROUTING",
                "INPUT",
                "OUTPUT",
                "POSTROUTING",
                "ISTIO_OUTPUT",
                "ISTIO_PRERT"
            ]
        );
        assert_eq!(nat.rules.len(), 10);
        assert_eq!(nat.rules[0].chain, "PREROUTING");
        assert_eq!(nat.rules[0].spec, "-j ISTIO_PRERT");
        assert_eq!(rule_target(&nat.rules[2].spec).as_deref(), Some("ACCEPT"));
    }

    #[test]
    fn compare_in_sync_clean_and_drifted() {
        let set = pod_rules(Family::V4, &opts(true, false));
        let c = set.compare(&SavedRules::parse(SAVED_V4_DNS));
        assert_eq!(
            c,
            Comparison {
                residue: true,
                structure_matches: true
            }
        );

        let clean = set.compare(&SavedRules::parse(SAVED_EMPTY_NAT));
        assert_eq!(
            clean,
            Comparison {
                residue: false,
                structure_matches: false
            }
        );

        // DNS capture turned off: the raw chains are now unexpected.
        let no_dns = pod_rules(Family::V4, &opts(false, false));
        let c = no_dns.compare(&SavedRules::parse(SAVED_V4_DNS));
        assert!(c.residue && !c.structure_matches);

        // A duplicated jump is drift.
        let dup = SAVED_V4_DNS.replacen(
            "-A OUTPUT -j ISTIO_OUTPUT\n",
            "-A OUTPUT -j ISTIO_OUTPUT\n-A OUTPUT -j ISTIO_OUTPUT\n",
            1,
        );
        assert!(!set.compare(&SavedRules::parse(&dup)).structure_matches);

        // A missing rule is drift.
        let missing =
            SAVED_V4_DNS.replace("-A ISTIO_OUTPUT ! -d 127.0.0.1/32 -o lo -j ACCEPT\n", "");
        assert!(!set.compare(&SavedRules::parse(&missing)).structure_matches);

        // A foreign ISTIO_ chain is drift (and residue).
        let foreign = SAVED_V4_DNS.replace(
            ":ISTIO_PRERT - [0:0]\n-A PREROUTING -j ISTIO_PRERT\n-A OUTPUT -j ISTIO_OUTPUT\n-A ISTIO_OUTPUT -m connmark",
            ":ISTIO_PRERT - [0:0]\n:ISTIO_OLD - [0:0]\n-A PREROUTING -j ISTIO_PRERT\n-A OUTPUT -j ISTIO_OUTPUT\n-A ISTIO_OUTPUT -m connmark",
        );
        assert_ne!(foreign, SAVED_V4_DNS);
        assert!(!set.compare(&SavedRules::parse(&foreign)).structure_matches);
    }

    #[test]
    fn removal_from_saved_state() {
        let set = pod_rules(Family::V4, &opts(true, false));
        let saved = SavedRules::parse(SAVED_V4_DNS);
        let text = removal_text(&saved, |t, c| set.owns(t, c), None);
        assert_eq!(
            text,
            "*mangle\n-D PREROUTING -j ISTIO_PRERT\n-D OUTPUT -j ISTIO_OUTPUT\n\
             -F ISTIO_OUTPUT\n-F ISTIO_PRERT\n-X ISTIO_OUTPUT\n-X ISTIO_PRERT\nCOMMIT\n\
             *raw\n-D PREROUTING -j ISTIO_PRERT\n-D OUTPUT -j ISTIO_OUTPUT\n\
             -F ISTIO_OUTPUT\n-F ISTIO_PRERT\n-X ISTIO_OUTPUT\n-X ISTIO_PRERT\nCOMMIT\n\
             *nat\n-D PREROUTING -j ISTIO_PRERT\n-D OUTPUT -j ISTIO_OUTPUT\n\
             -F ISTIO_OUTPUT\n-F ISTIO_PRERT\n-X ISTIO_OUTPUT\n-X ISTIO_PRERT\nCOMMIT\n"
        );
        assert!(removal_text(
            &SavedRules::parse(SAVED_EMPTY_NAT),
            |t, c| set.owns(t, c),
            None
        )
        .is_empty());

        // Swap: removal and the new set in one transaction per table.
        let no_dns = pod_rules(Family::V4, &opts(false, false));
        let swap = removal_text(&saved, |t, c| no_dns.owns(t, c), Some(&no_dns));
        assert!(swap.starts_with("*mangle\n-D PREROUTING -j ISTIO_PRERT\n"));
        assert!(swap.contains("-X ISTIO_PRERT\n-N ISTIO_PRERT\n-N ISTIO_OUTPUT\n"));
        assert_eq!(swap.matches("COMMIT\n").count(), 3, "{swap}");
    }
}
