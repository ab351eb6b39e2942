//! A planned rule set and how it is written as `iptables-restore` input (install, check,
//! static cleanup). Comparing it with what a netns holds is [`super::saved`]'s job.

use std::fmt::Write as _;

use super::family::Family;
use super::words::rule_target;

/// Which `ISTIO_*` chains a rule set considers its own (and may delete).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ownership {
    /// Every chain with this name prefix, in every table (the pod netns is ours).
    Prefix(String),
    /// Only the chains the set creates (the host netns is shared with others).
    Planned,
}

/// One rule: `-A <chain> <spec>` (or `-I <chain> 1 <spec>` when `insert_first`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    pub chain: String,
    pub spec: String,
    pub insert_first: bool,
}

impl Rule {
    pub(super) fn append(chain: &str, spec: impl Into<String>) -> Rule {
        Rule {
            chain: chain.to_owned(),
            spec: spec.into(),
            insert_first: false,
        }
    }

    pub(super) fn insert(chain: &str, spec: impl Into<String>) -> Rule {
        Rule {
            chain: chain.to_owned(),
            spec: spec.into(),
            insert_first: true,
        }
    }

    /// The restore line that adds this rule.
    pub fn add_line(&self) -> String {
        if self.insert_first {
            format!("-I {} 1 {}", self.chain, self.spec)
        } else {
            format!("-A {} {}", self.chain, self.spec)
        }
    }

    /// The restore line that checks for this rule (`-C`).
    pub fn check_line(&self) -> String {
        format!("-C {} {}", self.chain, self.spec)
    }

    /// The restore line that deletes this rule (`-D`).
    pub fn delete_line(&self) -> String {
        format!("-D {} {}", self.chain, self.spec)
    }

    /// The jump (`-j`/`-g`) target, if any.
    pub fn target(&self) -> Option<String> {
        rule_target(&self.spec)
    }
}

/// The chains one table gets and its rules, in emission order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableRules {
    pub table: String,
    pub new_chains: Vec<String>,
    pub rules: Vec<Rule>,
}

/// A complete rule set for one family, in one netns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleSet {
    pub family: Family,
    pub tables: Vec<TableRules>,
    pub ownership: Ownership,
}

impl RuleSet {
    /// The `iptables-restore --noflush` input that installs the set (on a clean netns).
    pub fn restore_text(&self) -> String {
        let mut out = String::new();
        for t in &self.tables {
            let _ = writeln!(out, "*{}", t.table);
            for c in &t.new_chains {
                let _ = writeln!(out, "-N {c}");
            }
            for r in &t.rules {
                let _ = writeln!(out, "{}", r.add_line());
            }
            out.push_str("COMMIT\n");
        }
        out
    }

    /// The `iptables-restore --noflush` input that succeeds iff every rule is present
    /// (`-C` lines; nothing is changed).
    pub fn check_text(&self) -> String {
        let mut out = String::new();
        for t in &self.tables {
            if t.rules.is_empty() {
                continue;
            }
            let _ = writeln!(out, "*{}", t.table);
            for r in &t.rules {
                let _ = writeln!(out, "{}", r.check_line());
            }
            out.push_str("COMMIT\n");
        }
        out
    }

    /// The static cleanup: delete the jumps, then flush and delete the chains. Each line
    /// fails if its object is missing, so this is for a netns known to hold exactly this
    /// set; [`removal_text`](super::removal_text) builds the cleanup from what a netns actually holds.
    pub fn cleanup_text(&self) -> String {
        let mut out = String::new();
        for t in &self.tables {
            let _ = writeln!(out, "*{}", t.table);
            for r in t.rules.iter().filter(|r| !t.new_chains.contains(&r.chain)) {
                let _ = writeln!(out, "{}", r.delete_line());
            }
            for c in &t.new_chains {
                let _ = writeln!(out, "-F {c}");
            }
            for c in &t.new_chains {
                let _ = writeln!(out, "-X {c}");
            }
            out.push_str("COMMIT\n");
        }
        out
    }

    /// Whether `chain` (in any table) belongs to this set.
    pub fn owns(&self, table: &str, chain: &str) -> bool {
        match &self.ownership {
            Ownership::Prefix(p) => chain.starts_with(p.as_str()),
            Ownership::Planned => self
                .tables
                .iter()
                .any(|t| t.table == table && t.new_chains.iter().any(|c| c == chain)),
        }
    }
}
