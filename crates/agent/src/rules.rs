//! The redirection rules, sans IO: what to install in a pod's netns and on the host, rendered
//! as `iptables-restore` input and `ip` argument vectors, plus a parser for `iptables-save`
//! output and the comparison that decides whether a netns already holds exactly our rules.
//!
//! The rule sets are Istio's (reference `istio-cni.md` §2.1 and §2.3), rule for rule and in
//! the same order, so that a pod enrolled by either agent looks the same to Istio's tooling:
//!
//! - in-pod, tables `mangle`, `nat` and (DNS capture only) `raw`, chains `ISTIO_PRERT` and
//!   `ISTIO_OUTPUT`; outbound TCP is redirected to 15001, inbound TCP (except HBONE on
//!   15008) to 15006, DNS to 15053; the node proxy's own sockets carry mark `0x539/0xfff`,
//!   and its spoofed-source return path is steered with connmark `0x111/0xfff`, an `ip rule`
//!   and a local route in table 100;
//! - on the host, `nat ISTIO_POSTRT` SNATs node-local TCP (kubelet probes) to enrolled pods
//!   (an ipset) to `169.254.7.127`, which the in-pod rules let through uncaptured.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::IpAddr;

// Istio's ports, marks, table and addresses, shared with the node proxy.
use ambit_wellknown::marks::{MASK as MARK_MASK, PROXY as PROXY_MARK, RETURN as RETURN_MARK};
use ambit_wellknown::ports::{
    DNS as DNS_PORT, HBONE as HBONE_PORT, INBOUND_PLAINTEXT as INBOUND_PLAINTEXT_PORT,
    OUTBOUND as OUTBOUND_PORT,
};
#[cfg(test)]
use ambit_wellknown::probes::{SET_V4 as PROBE_SET_V4, SET_V6 as PROBE_SET_V6};
use ambit_wellknown::probes::{SNAT_V4 as PROBE_SNAT_V4, SNAT_V6 as PROBE_SNAT_V6};
use ambit_wellknown::routing::{RETURN_RULE_PRIORITY, RETURN_TABLE as RETURN_ROUTE_TABLE};

/// In-pod chain hooked to `PREROUTING`.
pub const PRERT_CHAIN: &str = "ISTIO_PRERT";
/// In-pod chain hooked to `OUTPUT`.
pub const OUTPUT_CHAIN: &str = "ISTIO_OUTPUT";
/// Host chain hooked to `nat POSTROUTING`.
pub const POSTRT_CHAIN: &str = "ISTIO_POSTRT";
/// Every chain whose name starts with this is ours (and Istio's) inside a pod netns.
pub const OWNED_CHAIN_PREFIX: &str = "ISTIO_";

/// IPv4 or IPv6: which iptables flavour, which loopback, which probe address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    /// Both families, v4 first.
    pub const ALL: [Family; 2] = [Family::V4, Family::V6];

    /// The family of an address (IPv4-mapped IPv6 counts as IPv4).
    pub fn of(ip: IpAddr) -> Family {
        match unmap(ip) {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }

    /// `iptables-restore` / `ip6tables-restore`.
    pub fn restore_command(self) -> &'static str {
        match self {
            Family::V4 => "iptables-restore",
            Family::V6 => "ip6tables-restore",
        }
    }

    /// `iptables-save` / `ip6tables-save`.
    pub fn save_command(self) -> &'static str {
        match self {
            Family::V4 => "iptables-save",
            Family::V6 => "ip6tables-save",
        }
    }

    /// The loopback destination the rules exempt, as written in the rules.
    pub fn loopback(self) -> &'static str {
        match self {
            Family::V4 => "127.0.0.1/32",
            Family::V6 => "::1/128",
        }
    }

    /// The probe SNAT address.
    pub fn probe_snat(self) -> IpAddr {
        match self {
            Family::V4 => IpAddr::V4(PROBE_SNAT_V4),
            Family::V6 => IpAddr::V6(PROBE_SNAT_V6),
        }
    }

    /// `inet` / `inet6` (ipset family names).
    pub fn ipset_family(self) -> &'static str {
        match self {
            Family::V4 => "inet",
            Family::V6 => "inet6",
        }
    }

    /// `-4` / `-6` (the `ip` flag).
    pub(crate) fn ip_flag(self) -> &'static str {
        match self {
            Family::V4 => "-4",
            Family::V6 => "-6",
        }
    }

    /// The default route as written for `ip route`.
    fn any_route(self) -> &'static str {
        match self {
            Family::V4 => "0.0.0.0/0",
            Family::V6 => "::/0",
        }
    }
}

impl std::fmt::Display for Family {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        })
    }
}

/// An IPv4-mapped IPv6 address (`::ffff:a.b.c.d`) as IPv4; anything else unchanged.
pub fn unmap(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    }
}

/// Per-pod choices that change the in-pod rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InpodRuleOptions {
    /// Redirect DNS to 15053 and put the proxy's DNS traffic in conntrack zone 1 (`raw`).
    pub dns_capture: bool,
    /// Also install the IPv6 twin (ip6tables, `ip -6`).
    pub ipv6: bool,
    /// "Ingress mode": no inbound capture (no probe accept, no redirect to 15006).
    pub bypass_inbound: bool,
}

impl Default for InpodRuleOptions {
    /// Istio's chart defaults: DNS capture on, IPv6 on, inbound captured.
    fn default() -> Self {
        InpodRuleOptions {
            dns_capture: true,
            ipv6: true,
            bypass_inbound: false,
        }
    }
}

impl InpodRuleOptions {
    /// The families these options install rules for (v4 always, v6 if enabled).
    pub fn families(&self) -> Vec<Family> {
        if self.ipv6 {
            Family::ALL.to_vec()
        } else {
            vec![Family::V4]
        }
    }
}

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
    fn append(chain: &str, spec: impl Into<String>) -> Rule {
        Rule {
            chain: chain.to_owned(),
            spec: spec.into(),
            insert_first: false,
        }
    }

    fn insert(chain: &str, spec: impl Into<String>) -> Rule {
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
    /// set; [`removal_text`] builds the cleanup from what a netns actually holds.
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

fn ip_str(ip: IpAddr) -> String {
    ip.to_string()
}

/// The in-pod rule set for one family (§2.1, with the §2.2 DNS and ingress variants).
pub fn inpod_rules(family: Family, opts: &InpodRuleOptions) -> RuleSet {
    let lo = family.loopback();
    let probe = ip_str(family.probe_snat());
    let (m, k) = (PROXY_MARK, MARK_MASK);
    let r = RETURN_MARK;

    let mangle = TableRules {
        table: "mangle".into(),
        new_chains: vec![PRERT_CHAIN.into(), OUTPUT_CHAIN.into()],
        rules: vec![
            Rule::append("PREROUTING", format!("-j {PRERT_CHAIN}")),
            Rule::append("OUTPUT", format!("-j {OUTPUT_CHAIN}")),
            Rule::append(
                PRERT_CHAIN,
                format!("-m mark --mark {m:#x}/{k:#x} -j CONNMARK --set-xmark {r:#x}/{k:#x}"),
            ),
            Rule::append(
                OUTPUT_CHAIN,
                format!(
                    "-m connmark --mark {r:#x}/{k:#x} -j CONNMARK --restore-mark \
                     --nfmask 0xffffffff --ctmask 0xffffffff"
                ),
            ),
        ],
    };

    let mut nat_rules = vec![
        Rule::append("OUTPUT", format!("-j {OUTPUT_CHAIN}")),
        Rule::append("PREROUTING", format!("-j {PRERT_CHAIN}")),
    ];
    if !opts.bypass_inbound {
        nat_rules.push(Rule::append(
            PRERT_CHAIN,
            format!("-s {probe} -p tcp -m tcp -j ACCEPT"),
        ));
    }
    nat_rules.push(Rule::append(
        OUTPUT_CHAIN,
        format!("-d {probe} -p tcp -m tcp -j ACCEPT"),
    ));
    if !opts.bypass_inbound {
        nat_rules.push(Rule::append(
            PRERT_CHAIN,
            format!(
                "! -d {lo} -p tcp ! --dport {HBONE_PORT} -m mark ! --mark {m:#x}/{k:#x} \
                 -j REDIRECT --to-ports {INBOUND_PLAINTEXT_PORT}"
            ),
        ));
    }
    if opts.dns_capture {
        nat_rules.push(Rule::append(
            OUTPUT_CHAIN,
            format!(
                "! -o lo -p udp -m mark ! --mark {m:#x}/{k:#x} -m udp --dport 53 \
                 -j REDIRECT --to-port {DNS_PORT}"
            ),
        ));
        nat_rules.push(Rule::append(
            OUTPUT_CHAIN,
            format!(
                "! -d {lo} -p tcp --dport 53 -m mark ! --mark {m:#x}/{k:#x} \
                 -j REDIRECT --to-ports {DNS_PORT}"
            ),
        ));
    }
    nat_rules.extend([
        Rule::append(
            OUTPUT_CHAIN,
            format!("-p tcp -m mark --mark {r:#x}/{k:#x} -j ACCEPT"),
        ),
        Rule::append(OUTPUT_CHAIN, format!("! -d {lo} -o lo -j ACCEPT")),
        Rule::append(
            OUTPUT_CHAIN,
            format!(
                "! -d {lo} -p tcp -m mark ! --mark {m:#x}/{k:#x} \
                 -j REDIRECT --to-ports {OUTBOUND_PORT}"
            ),
        ),
    ]);
    let nat = TableRules {
        table: "nat".into(),
        new_chains: vec![PRERT_CHAIN.into(), OUTPUT_CHAIN.into()],
        rules: nat_rules,
    };

    let mut tables = vec![mangle, nat];
    if opts.dns_capture {
        tables.push(TableRules {
            table: "raw".into(),
            new_chains: vec![OUTPUT_CHAIN.into(), PRERT_CHAIN.into()],
            rules: vec![
                Rule::append("PREROUTING", format!("-j {PRERT_CHAIN}")),
                Rule::append("OUTPUT", format!("-j {OUTPUT_CHAIN}")),
                Rule::append(
                    OUTPUT_CHAIN,
                    format!("-p udp -m mark --mark {m:#x}/{k:#x} -m udp --dport 53 -j CT --zone 1"),
                ),
                Rule::append(
                    PRERT_CHAIN,
                    format!(
                        "-p udp -m mark ! --mark {m:#x}/{k:#x} -m udp --sport 53 -j CT --zone 1"
                    ),
                ),
            ],
        });
    }
    RuleSet {
        family,
        tables,
        ownership: Ownership::Prefix(OWNED_CHAIN_PREFIX.into()),
    }
}

/// The host-side probe SNAT rules for one family (§2.3), matching the ipset `set_name`.
pub fn host_probe_rules(family: Family, set_name: &str) -> RuleSet {
    let snat = ip_str(family.probe_snat());
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

/// The `ip` commands (argument vectors, without the leading `ip`) that install the
/// return-path policy routing for one family. The rule is added (an "exists" error means
/// it is already there); the route is replaced.
pub fn inpod_netlink_add(family: Family) -> Vec<Vec<String>> {
    netlink(family, "add", "replace")
}

/// The `ip` commands that remove the return-path policy routing ("not found" errors mean
/// it is already gone).
pub fn inpod_netlink_del(family: Family) -> Vec<Vec<String>> {
    netlink(family, "del", "del")
}

fn netlink(family: Family, rule_verb: &str, route_verb: &str) -> Vec<Vec<String>> {
    let to_vec = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let mark = format!("{RETURN_MARK:#x}/{MARK_MASK:#x}");
    let pref = RETURN_RULE_PRIORITY.to_string();
    let table = RETURN_ROUTE_TABLE.to_string();
    vec![
        to_vec(&[
            family.ip_flag(),
            "rule",
            rule_verb,
            "fwmark",
            &mark,
            "pref",
            &pref,
            "lookup",
            &table,
        ]),
        to_vec(&[
            family.ip_flag(),
            "route",
            route_verb,
            "local",
            family.any_route(),
            "dev",
            "lo",
            "table",
            &table,
        ]),
    ]
}

// ---- iptables-save parsing --------------------------------------------------------------

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

/// Splits a rule spec into words, keeping double-quoted strings (with `\"` escapes) whole.
fn words(spec: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut quoted = false;
    let mut chars = spec.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' if quoted => {
                if let Some(n) = chars.next() {
                    cur.push(n);
                }
            }
            '"' => {
                quoted = !quoted;
                in_word = true;
            }
            c if c.is_whitespace() && !quoted => {
                if in_word {
                    out.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            c => {
                cur.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        out.push(cur);
    }
    out
}

/// The `-j`/`--jump`/`-g`/`--goto` target of a rule spec.
pub fn rule_target(spec: &str) -> Option<String> {
    let w = words(spec);
    w.iter()
        .position(|t| matches!(t.as_str(), "-j" | "--jump" | "-g" | "--goto"))
        .and_then(|i| w.get(i + 1).cloned())
}

/// Splits an `ipset save` line into words (quotes honoured); shared with [`crate::ipset`].
pub(crate) fn split_words(line: &str) -> Vec<String> {
    words(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    const V4_DNS: &str = "\
*mangle
-N ISTIO_PRERT
-N ISTIO_OUTPUT
-A PREROUTING -j ISTIO_PRERT
-A OUTPUT -j ISTIO_OUTPUT
-A ISTIO_PRERT -m mark --mark 0x539/0xfff -j CONNMARK --set-xmark 0x111/0xfff
-A ISTIO_OUTPUT -m connmark --mark 0x111/0xfff -j CONNMARK --restore-mark --nfmask 0xffffffff --ctmask 0xffffffff
COMMIT
*nat
-N ISTIO_PRERT
-N ISTIO_OUTPUT
-A OUTPUT -j ISTIO_OUTPUT
-A PREROUTING -j ISTIO_PRERT
-A ISTIO_PRERT -s 169.254.7.127 -p tcp -m tcp -j ACCEPT
-A ISTIO_OUTPUT -d 169.254.7.127 -p tcp -m tcp -j ACCEPT
-A ISTIO_PRERT ! -d 127.0.0.1/32 -p tcp ! --dport 15008 -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15006
-A ISTIO_OUTPUT ! -o lo -p udp -m mark ! --mark 0x539/0xfff -m udp --dport 53 -j REDIRECT --to-port 15053
-A ISTIO_OUTPUT ! -d 127.0.0.1/32 -p tcp --dport 53 -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15053
-A ISTIO_OUTPUT -p tcp -m mark --mark 0x111/0xfff -j ACCEPT
-A ISTIO_OUTPUT ! -d 127.0.0.1/32 -o lo -j ACCEPT
-A ISTIO_OUTPUT ! -d 127.0.0.1/32 -p tcp -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15001
COMMIT
*raw
-N ISTIO_OUTPUT
-N ISTIO_PRERT
-A PREROUTING -j ISTIO_PRERT
-A OUTPUT -j ISTIO_OUTPUT
-A ISTIO_OUTPUT -p udp -m mark --mark 0x539/0xfff -m udp --dport 53 -j CT --zone 1
-A ISTIO_PRERT -p udp -m mark ! --mark 0x539/0xfff -m udp --sport 53 -j CT --zone 1
COMMIT
";

    const V4_NO_DNS: &str = "\
*mangle
-N ISTIO_PRERT
-N ISTIO_OUTPUT
-A PREROUTING -j ISTIO_PRERT
-A OUTPUT -j ISTIO_OUTPUT
-A ISTIO_PRERT -m mark --mark 0x539/0xfff -j CONNMARK --set-xmark 0x111/0xfff
-A ISTIO_OUTPUT -m connmark --mark 0x111/0xfff -j CONNMARK --restore-mark --nfmask 0xffffffff --ctmask 0xffffffff
COMMIT
*nat
-N ISTIO_PRERT
-N ISTIO_OUTPUT
-A OUTPUT -j ISTIO_OUTPUT
-A PREROUTING -j ISTIO_PRERT
-A ISTIO_PRERT -s 169.254.7.127 -p tcp -m tcp -j ACCEPT
-A ISTIO_OUTPUT -d 169.254.7.127 -p tcp -m tcp -j ACCEPT
-A ISTIO_PRERT ! -d 127.0.0.1/32 -p tcp ! --dport 15008 -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15006
-A ISTIO_OUTPUT -p tcp -m mark --mark 0x111/0xfff -j ACCEPT
-A ISTIO_OUTPUT ! -d 127.0.0.1/32 -o lo -j ACCEPT
-A ISTIO_OUTPUT ! -d 127.0.0.1/32 -p tcp -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15001
COMMIT
";

    const V6_DNS: &str = "\
*mangle
-N ISTIO_PRERT
-N ISTIO_OUTPUT
-A PREROUTING -j ISTIO_PRERT
-A OUTPUT -j ISTIO_OUTPUT
-A ISTIO_PRERT -m mark --mark 0x539/0xfff -j CONNMARK --set-xmark 0x111/0xfff
-A ISTIO_OUTPUT -m connmark --mark 0x111/0xfff -j CONNMARK --restore-mark --nfmask 0xffffffff --ctmask 0xffffffff
COMMIT
*nat
-N ISTIO_PRERT
-N ISTIO_OUTPUT
-A OUTPUT -j ISTIO_OUTPUT
-A PREROUTING -j ISTIO_PRERT
-A ISTIO_PRERT -s fd16:9254:7127:1337:ffff:ffff:ffff:ffff -p tcp -m tcp -j ACCEPT
-A ISTIO_OUTPUT -d fd16:9254:7127:1337:ffff:ffff:ffff:ffff -p tcp -m tcp -j ACCEPT
-A ISTIO_PRERT ! -d ::1/128 -p tcp ! --dport 15008 -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15006
-A ISTIO_OUTPUT ! -o lo -p udp -m mark ! --mark 0x539/0xfff -m udp --dport 53 -j REDIRECT --to-port 15053
-A ISTIO_OUTPUT ! -d ::1/128 -p tcp --dport 53 -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15053
-A ISTIO_OUTPUT -p tcp -m mark --mark 0x111/0xfff -j ACCEPT
-A ISTIO_OUTPUT ! -d ::1/128 -o lo -j ACCEPT
-A ISTIO_OUTPUT ! -d ::1/128 -p tcp -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15001
COMMIT
*raw
-N ISTIO_OUTPUT
-N ISTIO_PRERT
-A PREROUTING -j ISTIO_PRERT
-A OUTPUT -j ISTIO_OUTPUT
-A ISTIO_OUTPUT -p udp -m mark --mark 0x539/0xfff -m udp --dport 53 -j CT --zone 1
-A ISTIO_PRERT -p udp -m mark ! --mark 0x539/0xfff -m udp --sport 53 -j CT --zone 1
COMMIT
";

    const V6_NO_DNS: &str = "\
*mangle
-N ISTIO_PRERT
-N ISTIO_OUTPUT
-A PREROUTING -j ISTIO_PRERT
-A OUTPUT -j ISTIO_OUTPUT
-A ISTIO_PRERT -m mark --mark 0x539/0xfff -j CONNMARK --set-xmark 0x111/0xfff
-A ISTIO_OUTPUT -m connmark --mark 0x111/0xfff -j CONNMARK --restore-mark --nfmask 0xffffffff --ctmask 0xffffffff
COMMIT
*nat
-N ISTIO_PRERT
-N ISTIO_OUTPUT
-A OUTPUT -j ISTIO_OUTPUT
-A PREROUTING -j ISTIO_PRERT
-A ISTIO_PRERT -s fd16:9254:7127:1337:ffff:ffff:ffff:ffff -p tcp -m tcp -j ACCEPT
-A ISTIO_OUTPUT -d fd16:9254:7127:1337:ffff:ffff:ffff:ffff -p tcp -m tcp -j ACCEPT
-A ISTIO_PRERT ! -d ::1/128 -p tcp ! --dport 15008 -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15006
-A ISTIO_OUTPUT -p tcp -m mark --mark 0x111/0xfff -j ACCEPT
-A ISTIO_OUTPUT ! -d ::1/128 -o lo -j ACCEPT
-A ISTIO_OUTPUT ! -d ::1/128 -p tcp -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15001
COMMIT
";

    const V4_INGRESS_NO_DNS: &str = "\
*mangle
-N ISTIO_PRERT
-N ISTIO_OUTPUT
-A PREROUTING -j ISTIO_PRERT
-A OUTPUT -j ISTIO_OUTPUT
-A ISTIO_PRERT -m mark --mark 0x539/0xfff -j CONNMARK --set-xmark 0x111/0xfff
-A ISTIO_OUTPUT -m connmark --mark 0x111/0xfff -j CONNMARK --restore-mark --nfmask 0xffffffff --ctmask 0xffffffff
COMMIT
*nat
-N ISTIO_PRERT
-N ISTIO_OUTPUT
-A OUTPUT -j ISTIO_OUTPUT
-A PREROUTING -j ISTIO_PRERT
-A ISTIO_OUTPUT -d 169.254.7.127 -p tcp -m tcp -j ACCEPT
-A ISTIO_OUTPUT -p tcp -m mark --mark 0x111/0xfff -j ACCEPT
-A ISTIO_OUTPUT ! -d 127.0.0.1/32 -o lo -j ACCEPT
-A ISTIO_OUTPUT ! -d 127.0.0.1/32 -p tcp -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15001
COMMIT
";

    fn opts(dns_capture: bool, bypass_inbound: bool) -> InpodRuleOptions {
        InpodRuleOptions {
            dns_capture,
            ipv6: true,
            bypass_inbound,
        }
    }

    #[test]
    fn golden_v4_with_dns() {
        assert_eq!(
            inpod_rules(Family::V4, &opts(true, false)).restore_text(),
            V4_DNS
        );
    }

    #[test]
    fn golden_v4_without_dns() {
        assert_eq!(
            inpod_rules(Family::V4, &opts(false, false)).restore_text(),
            V4_NO_DNS
        );
    }

    #[test]
    fn golden_v6_with_dns() {
        assert_eq!(
            inpod_rules(Family::V6, &opts(true, false)).restore_text(),
            V6_DNS
        );
    }

    #[test]
    fn golden_v6_without_dns() {
        assert_eq!(
            inpod_rules(Family::V6, &opts(false, false)).restore_text(),
            V6_NO_DNS
        );
    }

    #[test]
    fn golden_ingress_mode() {
        assert_eq!(
            inpod_rules(Family::V4, &opts(false, true)).restore_text(),
            V4_INGRESS_NO_DNS
        );
    }

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
    fn golden_cleanup_and_check() {
        let set = inpod_rules(Family::V4, &opts(true, false));
        assert_eq!(
            set.cleanup_text(),
            "*mangle\n-D PREROUTING -j ISTIO_PRERT\n-D OUTPUT -j ISTIO_OUTPUT\n\
             -F ISTIO_PRERT\n-F ISTIO_OUTPUT\n-X ISTIO_PRERT\n-X ISTIO_OUTPUT\nCOMMIT\n\
             *nat\n-D OUTPUT -j ISTIO_OUTPUT\n-D PREROUTING -j ISTIO_PRERT\n\
             -F ISTIO_PRERT\n-F ISTIO_OUTPUT\n-X ISTIO_PRERT\n-X ISTIO_OUTPUT\nCOMMIT\n\
             *raw\n-D PREROUTING -j ISTIO_PRERT\n-D OUTPUT -j ISTIO_OUTPUT\n\
             -F ISTIO_OUTPUT\n-F ISTIO_PRERT\n-X ISTIO_OUTPUT\n-X ISTIO_PRERT\nCOMMIT\n"
        );
        let check = set.check_text();
        assert_eq!(check.lines().filter(|l| l.starts_with("-C ")).count(), 18);
        assert!(check.contains("-C ISTIO_OUTPUT ! -d 127.0.0.1/32 -o lo -j ACCEPT\n"));
    }

    #[test]
    fn golden_netlink() {
        let join = |v: Vec<Vec<String>>| v.into_iter().map(|a| a.join(" ")).collect::<Vec<_>>();
        assert_eq!(
            join(inpod_netlink_add(Family::V4)),
            [
                "-4 rule add fwmark 0x111/0xfff pref 32764 lookup 100",
                "-4 route replace local 0.0.0.0/0 dev lo table 100"
            ]
        );
        assert_eq!(
            join(inpod_netlink_add(Family::V6)),
            [
                "-6 rule add fwmark 0x111/0xfff pref 32764 lookup 100",
                "-6 route replace local ::/0 dev lo table 100"
            ]
        );
        assert_eq!(
            join(inpod_netlink_del(Family::V4)),
            [
                "-4 rule del fwmark 0x111/0xfff pref 32764 lookup 100",
                "-4 route del local 0.0.0.0/0 dev lo table 100"
            ]
        );
    }

    #[test]
    fn families_follow_options() {
        assert_eq!(opts(true, false).families(), vec![Family::V4, Family::V6]);
        let v4only = InpodRuleOptions {
            ipv6: false,
            ..InpodRuleOptions::default()
        };
        assert_eq!(v4only.families(), vec![Family::V4]);
        assert_eq!(
            Family::of("::ffff:10.0.0.1".parse().unwrap()),
            Family::V4,
            "mapped addresses are IPv4"
        );
        assert_eq!(Family::of("fd00::1".parse().unwrap()), Family::V6);
    }

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
        let set = inpod_rules(Family::V4, &opts(true, false));
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
        let no_dns = inpod_rules(Family::V4, &opts(false, false));
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
        let set = inpod_rules(Family::V4, &opts(true, false));
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
        let no_dns = inpod_rules(Family::V4, &opts(false, false));
        let swap = removal_text(&saved, |t, c| no_dns.owns(t, c), Some(&no_dns));
        assert!(swap.starts_with("*mangle\n-D PREROUTING -j ISTIO_PRERT\n"));
        assert!(swap.contains("-X ISTIO_PRERT\n-N ISTIO_PRERT\n-N ISTIO_OUTPUT\n"));
        assert_eq!(swap.matches("COMMIT\n").count(), 3, "{swap}");
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

    #[test]
    fn quoted_words() {
        assert_eq!(
            words(r#"add s 10.0.0.1 comment "a \"b\" c""#),
            ["add", "s", "10.0.0.1", "comment", r#"a "b" c"#]
        );
        assert_eq!(
            rule_target(r#"-m comment --comment "x -j Y" -g ISTIO_Z"#).as_deref(),
            Some("ISTIO_Z")
        );
    }
}
