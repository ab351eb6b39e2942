//! Transitional: the process-wide dry-run hook the node proxy's binary installs today
//! (`ambit_ztunnel::local_config::register_metrics`). Authorization no longer reads it:
//! it tells the observer passed to each call. [`ProcessDryRunHook`] is the observer the
//! node proxy passes until its binary hands it a per-proxy one; then this module goes.

use std::sync::OnceLock;

use crate::policy::{Authorization, PolicyAction};
use crate::rbac::RbacObserver;

/// Told of every dry-run policy that matched (its key and action), for a metric.
pub type DryRunHook = Box<dyn Fn(&str, PolicyAction) + Send + Sync>;

static HOOK: OnceLock<DryRunHook> = OnceLock::new();

/// Installs the process-wide hook [`ProcessDryRunHook`] forwards to. Only the first call
/// installs; false after that.
pub fn set_dry_run_hook(hook: DryRunHook) -> bool {
    HOOK.set(hook).is_ok()
}

/// Forwards each dry-run match to the hook of [`set_dry_run_hook`] (nothing when none is
/// installed).
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessDryRunHook;

impl RbacObserver for ProcessDryRunHook {
    fn dry_run_matched(&self, policy: &Authorization) {
        if let Some(hook) = HOOK.get() {
            hook(&policy.key(), policy.action);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::PolicyScope;

    /// Until the binary passes its own observer, the hook it installs still counts.
    #[test]
    fn the_process_hook_is_told_of_dry_run_matches() {
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = seen.clone();
        assert!(set_dry_run_hook(Box::new(move |key, action| {
            sink.lock().unwrap().push((key.to_string(), action))
        })));
        assert!(!set_dry_run_hook(Box::new(|_, _| {})), "installed once");
        let p = Authorization {
            name: "p".into(),
            namespace: "ns".into(),
            scope: PolicyScope::Global,
            action: PolicyAction::Allow,
            rules: vec![vec![]],
            dry_run: true,
        };
        ProcessDryRunHook.dry_run_matched(&p);
        assert_eq!(
            *seen.lock().unwrap(),
            [("ns/p".to_string(), PolicyAction::Allow)]
        );
    }
}
