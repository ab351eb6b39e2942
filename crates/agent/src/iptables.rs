//! Installing and removing the rules of [`crate::rules`] with the iptables tools, idempotently
//! (reference §2.5).
//!
//! Applying a [`RuleSet`] in a netns:
//!
//! 1. `iptables-save` there, parse, and compare with the plan (owned chains, rule counts,
//!    jumps); if the structure matches, `-C` every planned rule (one `iptables-restore`
//!    run): all present means **nothing is done**.
//! 2. Otherwise one `iptables-restore -w --noflush` transaction removes whatever of ours is
//!    there (jumps, then flush and delete of our chains) and installs the plan. Because the
//!    removal and the install are one transaction per table, a reconcile never leaves the
//!    pod without capture (Istio installs temporary DROP "guardrails" instead).
//! 3. `iptables-save` again to verify.
//!
//! Everything here blocks (it runs the tools); call it from `spawn_blocking`.

use std::path::Path;

use ambit_zds::Netns;

use crate::exec::{self, netns_label, ExecError};
use crate::netlink::{Added, Deleted, NetlinkError, RouteSocket};
use crate::rules::{
    host_probe_rules, pod_rules, removal_text, Family, PodRuleOptions, ReturnRouting, RuleSet,
    SavedRules,
};

/// Names of the host probe ipsets (Istio's by default).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeSetNames {
    pub v4: String,
    pub v6: String,
}

impl Default for ProbeSetNames {
    fn default() -> Self {
        ProbeSetNames {
            v4: ambit_wellknown::probes::SET_V4.into(),
            v6: ambit_wellknown::probes::SET_V6.into(),
        }
    }
}

impl ProbeSetNames {
    /// The set for `family`.
    pub fn for_family(&self, family: Family) -> &str {
        match family {
            Family::V4 => &self.v4,
            Family::V6 => &self.v6,
        }
    }
}

/// Why rules could not be installed or removed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RulesError {
    /// A tool failed (the message names the netns and carries the tool's stderr).
    #[error(transparent)]
    Exec(#[from] ExecError),
    /// The kernel refused the return-path routing, or could not be asked.
    #[error(transparent)]
    Netlink(#[from] NetlinkError),
    /// The tools reported success but the netns does not hold the plan afterwards
    /// (something else is rewriting the rules concurrently?).
    #[error("{family} rules in netns {netns} still differ from the plan after applying them")]
    Verify { family: Family, netns: String },
}

/// What applying a rule set did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApplyOutcome {
    /// The netns already held exactly the plan; nothing was run but the checks.
    Unchanged,
    /// The netns held nothing of ours; the plan was installed.
    Installed,
    /// Residue or drift was replaced by the plan (one transaction).
    Replaced,
}

/// `iptables-save` (or `ip6tables-save`) in `netns`, parsed.
pub fn save(netns: Option<&Path>, family: Family) -> Result<SavedRules, ExecError> {
    let text = exec::run(netns, family.save_command(), &[], None)?;
    Ok(SavedRules::parse(&text))
}

/// The raw `iptables-save` text in `netns` (for diagnostics and tests).
pub fn save_text(netns: Option<&Path>, family: Family) -> Result<String, ExecError> {
    exec::run(netns, family.save_command(), &[], None)
}

fn restore(netns: Option<&Path>, family: Family, text: &str) -> Result<(), ExecError> {
    exec::run(
        netns,
        family.restore_command(),
        &["-w", "--noflush"],
        Some(text),
    )
    .map(drop)
}

/// Whether every rule of `set` passes `-C` in `netns`.
fn all_rules_present(netns: Option<&Path>, set: &RuleSet) -> bool {
    restore(netns, set.family, &set.check_text()).is_ok()
}

/// Makes `netns` hold exactly `set` (see the module docs).
pub fn apply_rule_set(netns: Option<&Path>, set: &RuleSet) -> Result<ApplyOutcome, RulesError> {
    let saved = save(netns, set.family)?;
    let cmp = set.compare(&saved);
    if cmp.structure_matches && all_rules_present(netns, set) {
        tracing::debug!(netns = %netns_label(netns), family = %set.family, "rules already in place");
        return Ok(ApplyOutcome::Unchanged);
    }
    let (text, outcome) = if cmp.residue {
        tracing::info!(
            netns = %netns_label(netns),
            family = %set.family,
            "replacing stale or drifted rules"
        );
        (
            removal_text(&saved, |t, c| set.owns(t, c), Some(set)),
            ApplyOutcome::Replaced,
        )
    } else {
        (set.restore_text(), ApplyOutcome::Installed)
    };
    restore(netns, set.family, &text)?;
    let after = save(netns, set.family)?;
    if !set.compare(&after).structure_matches || !all_rules_present(netns, set) {
        return Err(RulesError::Verify {
            family: set.family,
            netns: netns_label(netns),
        });
    }
    Ok(outcome)
}

/// Removes everything of `set`'s (its owned chains and the jumps into them) from `netns`.
/// Returns whether anything was there.
pub fn remove_rule_set(netns: Option<&Path>, set: &RuleSet) -> Result<bool, RulesError> {
    let saved = save(netns, set.family)?;
    let text = removal_text(&saved, |t, c| set.owns(t, c), None);
    if text.is_empty() {
        return Ok(false);
    }
    restore(netns, set.family, &text)?;
    let after = save(netns, set.family)?;
    if !after.owned_objects(|t, c| set.owns(t, c)).is_empty() {
        return Err(RulesError::Verify {
            family: set.family,
            netns: netns_label(netns),
        });
    }
    Ok(true)
}

/// Whether IPv6 is disabled on `lo` in the netns at `path` (then the v6 local route cannot be
/// added, and Istio skips it).
fn ipv6_disabled_on_lo(ns: &Netns) -> bool {
    const KEY: &str = "/proc/sys/net/ipv6/conf/lo/disable_ipv6";
    let read = ns.run_in(|| std::fs::read_to_string(KEY));
    match read {
        Ok(v) => v.trim() == "1",
        // No such sysctl: IPv6 is not available at all.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
        Err(_) => false,
    }
}

/// What [`apply_inpod`] did, per family.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InpodOutcome {
    pub v4: ApplyOutcome,
    pub v6: Option<ApplyOutcome>,
}

impl InpodOutcome {
    /// Whether nothing had to change.
    pub fn unchanged(&self) -> bool {
        self.v4 == ApplyOutcome::Unchanged && self.v6.is_none_or(|o| o == ApplyOutcome::Unchanged)
    }
}

/// Installs the in-pod rules (§2.1) and the return-path policy routing in the pod netns at
/// `netns`, idempotently.
pub fn apply_inpod(netns: &Path, opts: &PodRuleOptions) -> Result<InpodOutcome, RulesError> {
    let ns = Netns::open(netns).map_err(|source| NetlinkError::Open {
        netns: netns.display().to_string(),
        source,
    })?;
    let mut routes = RouteSocket::open_in(&ns, netns.display().to_string())?;
    let mut outcome = InpodOutcome {
        v4: ApplyOutcome::Unchanged,
        v6: None,
    };
    for family in opts.families() {
        // Routing first (as Istio does): the return path must exist before capture starts.
        let plan = ReturnRouting::new(family);
        if routes.add_rule(&plan)? == Added::Existed {
            tracing::debug!(netns = %netns.display(), rule = %plan.rule_text(), "rule already there");
        }
        if family == Family::V6 && ipv6_disabled_on_lo(&ns) {
            tracing::info!(netns = %netns.display(), "IPv6 disabled on lo: no v6 local route");
        } else {
            routes.replace_route(&plan)?;
        }
        let o = apply_rule_set(Some(netns), &pod_rules(family, opts))?;
        match family {
            Family::V4 => outcome.v4 = o,
            Family::V6 => outcome.v6 = Some(o),
        }
    }
    Ok(outcome)
}

/// Removes the in-pod rules (every `ISTIO_*` chain and jump, whatever version put them
/// there) and the return-path routing from the pod netns at `netns`. IPv6 failures are
/// ignored when `opts.ipv6` is off (the netns may have no IPv6 at all).
pub fn remove_inpod(netns: &Path, opts: &PodRuleOptions) -> Result<(), RulesError> {
    let mut routes = RouteSocket::open(netns)?;
    for family in Family::ALL {
        let strict = family == Family::V4 || opts.ipv6;
        let result = (|| {
            remove_rule_set(Some(netns), &pod_rules(family, opts))?;
            let plan = ReturnRouting::new(family);
            // Both may be absent already (a half-done enrollment, a second removal).
            let rule = routes.del_rule(&plan)?;
            let route = routes.del_route(&plan)?;
            if (rule, route) != (Deleted::Removed, Deleted::Removed) {
                tracing::debug!(netns = %netns.display(), %family, ?rule, ?route, "routing partly gone already");
            }
            Ok::<(), RulesError>(())
        })();
        match result {
            Err(e) if !strict => {
                tracing::debug!(netns = %netns.display(), error = %e, "ignoring IPv6 cleanup error")
            }
            other => other?,
        }
    }
    Ok(())
}

/// The families the host rules cover.
fn host_families(ipv6: bool) -> Vec<Family> {
    PodRuleOptions {
        ipv6,
        ..PodRuleOptions::default()
    }
    .families()
}

/// Installs the host probe SNAT rules (§2.3) in `netns` (the agent's own when `None`),
/// idempotently. The ipsets they match must exist first ([`crate::ipset::ProbeSets::ensure`]).
pub fn apply_host(
    netns: Option<&Path>,
    ipv6: bool,
    sets: &ProbeSetNames,
) -> Result<Vec<ApplyOutcome>, RulesError> {
    host_families(ipv6)
        .into_iter()
        .map(|f| apply_rule_set(netns, &host_probe_rules(f, sets.for_family(f))))
        .collect()
}

/// Removes the host probe SNAT rules (full uninstall only: on an upgrade they stay).
pub fn remove_host(
    netns: Option<&Path>,
    ipv6: bool,
    sets: &ProbeSetNames,
) -> Result<(), RulesError> {
    for f in host_families(ipv6) {
        remove_rule_set(netns, &host_probe_rules(f, sets.for_family(f)))?;
    }
    Ok(())
}
