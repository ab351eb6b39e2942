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

use ambit_inpod::Netns;

use crate::exec::{self, netns_label, ExecError};
use crate::rules::{
    host_probe_rules, inpod_netlink_add, inpod_netlink_del, inpod_rules, removal_text, Family,
    InpodRuleOptions, RuleSet, SavedRules,
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
fn ipv6_disabled_on_lo(path: &Path) -> bool {
    const KEY: &str = "/proc/sys/net/ipv6/conf/lo/disable_ipv6";
    let read = Netns::open(path).and_then(|ns| ns.run_in(|| std::fs::read_to_string(KEY)));
    match read {
        Ok(v) => v.trim() == "1",
        // No such sysctl: IPv6 is not available at all.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
        Err(_) => false,
    }
}

/// Runs `commands` (`ip` argument vectors of one family, each starting with the family flag,
/// as [`inpod_netlink_add`] builds them) in one `ip -force -batch -`: one process where one
/// per command used to run (enrollment is dominated by process starts). `-force` runs every
/// line even after one failed; the run succeeds when each failed line's error contains one
/// of `ignore`.
fn ip_batch(
    netns: &Path,
    family: Family,
    commands: &[Vec<String>],
    ignore: &[&str],
) -> Result<(), ExecError> {
    let mut script = String::new();
    for command in commands {
        let Some((flag, args)) = command.split_first() else {
            continue;
        };
        debug_assert_eq!(flag, family.ip_flag(), "one family per batch");
        script.push_str(&args.join(" "));
        script.push('\n');
    }
    if script.is_empty() {
        return Ok(());
    }
    let args = [family.ip_flag(), "-force", "-batch", "-"];
    match exec::run(Some(netns), "ip", &args, Some(&script)) {
        Ok(_) => Ok(()),
        Err(e) if tolerable_batch_failures(e.stderr(), ignore) => Ok(()),
        Err(mut e) => {
            // Name the lines: the error's `-:N` counts them.
            if let ExecError::Failed { command, .. } = &mut e {
                let lines: Vec<&str> = script.lines().collect();
                *command = format!("{command} with lines: {}", lines.join("; "));
            }
            Err(e)
        }
    }
}

/// Whether an `ip -batch` run that failed only failed in ways `ignore` tolerates. ip prints
/// each failed line's error followed by `Command failed <file>:<line>`; anything else on
/// stderr is an error of its own.
fn tolerable_batch_failures(stderr: &str, ignore: &[&str]) -> bool {
    let mut failures = Vec::new();
    let mut text = String::new();
    for line in stderr.lines() {
        if line.starts_with("Command failed ") {
            failures.push(std::mem::take(&mut text));
        } else {
            text.push_str(line);
            text.push('\n');
        }
    }
    if !text.trim().is_empty() {
        failures.push(text);
    }
    !failures.is_empty()
        && failures
            .iter()
            .all(|f| ignore.iter().any(|allowed| f.contains(allowed)))
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
pub fn apply_inpod(netns: &Path, opts: &InpodRuleOptions) -> Result<InpodOutcome, RulesError> {
    let mut outcome = InpodOutcome {
        v4: ApplyOutcome::Unchanged,
        v6: None,
    };
    for family in opts.families() {
        // Routing first (as Istio does): the return path must exist before capture starts.
        let mut routing = inpod_netlink_add(family);
        if family == Family::V6 && ipv6_disabled_on_lo(netns) {
            tracing::info!(netns = %netns.display(), "IPv6 disabled on lo: no v6 local route");
            routing.retain(|command| command.get(1).map(String::as_str) != Some("route"));
        }
        ip_batch(netns, family, &routing, &["File exists"])?;
        let o = apply_rule_set(Some(netns), &inpod_rules(family, opts))?;
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
pub fn remove_inpod(netns: &Path, opts: &InpodRuleOptions) -> Result<(), RulesError> {
    const GONE: &[&str] = &[
        "No such file or directory",
        "No such process",
        "Cannot find",
    ];
    for family in Family::ALL {
        let strict = family == Family::V4 || opts.ipv6;
        let result = (|| {
            remove_rule_set(Some(netns), &inpod_rules(family, opts))?;
            ip_batch(netns, family, &inpod_netlink_del(family), GONE)?;
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
    InpodRuleOptions {
        ipv6,
        ..InpodRuleOptions::default()
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

#[cfg(test)]
mod tests {
    use super::*;

    const EXISTS: &[&str] = &["File exists"];

    #[test]
    fn batch_failures_are_tolerated_only_when_each_is_allowed() {
        // A rule that is already there (what a re-enrollment meets).
        let rule_exists = "RTNETLINK answers: File exists\nCommand failed -:1\n";
        assert!(tolerable_batch_failures(rule_exists, EXISTS));
        // The same, and the next line failed for another reason: not tolerated.
        let also_route = format!("{rule_exists}Cannot find device \"lo\"\nCommand failed -:2\n");
        assert!(!tolerable_batch_failures(&also_route, EXISTS));
        // An error ip printed outside any numbered line (a bad option, say) counts as a
        // failure of its own: tolerated only if it is an allowed one.
        assert!(!tolerable_batch_failures(
            "Option \"-forse\" is unknown\n",
            EXISTS
        ));
        assert!(tolerable_batch_failures(
            "RTNETLINK answers: File exists\n",
            EXISTS
        ));
        // A failed run that said nothing is not a tolerated one.
        assert!(!tolerable_batch_failures("", EXISTS));
        // Removal: both already gone.
        let gone = "RTNETLINK answers: No such file or directory\nCommand failed -:1\nRTNETLINK answers: No such process\nCommand failed -:2\n";
        assert!(tolerable_batch_failures(
            gone,
            &["No such file or directory", "No such process"]
        ));
    }
}
