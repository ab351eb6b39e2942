//! The local mesh file (ztunnel's local config: `LOCAL_XDS_PATH`, `LOCAL_XDS`), the one way
//! both proxies take it: loaded at start-up, then (a file) watched ([`Watched`]) and
//! re-applied when it changes, with the policy metrics that go with it.
//!
//! A change is applied as one batch, so open connections are re-checked against the new
//! policies at once. A file that does not load (bad YAML, a bad workload or service) is
//! refused whole and the running configuration stays; a bad policy is refused alone
//! (see [`ambit_state::load_local_config`]): its last good version, or a fail-closed
//! stand-in, stays in its place, on every reload as at start.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use ambit_runtime::file_watch::Watched;
use ambit_runtime::shared::Shared;
use ambit_state::{KeptVersion, LocalConfig, LocalFile, ProxyState, RejectedPolicy};

/// How often the file is looked at besides the kernel's notifications.
const POLL: Duration = Duration::from_secs(1);

/// Where the local mesh comes from.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub enum LocalConfigSource {
    /// `LOCAL_XDS_PATH`: a file, watched.
    File(PathBuf),
    /// `LOCAL_XDS`: the YAML itself.
    Inline(String),
}

/// The state store both proxies share with their readers.
pub type SharedState = Shared<ProxyState>;

/// The local configuration read from its source: its name (for errors) and text.
pub fn read(source: &LocalConfigSource) -> anyhow::Result<(String, String)> {
    Ok(match source {
        LocalConfigSource::File(path) => (
            path.display().to_string(),
            std::fs::read_to_string(path)
                .with_context(|| format!("LOCAL_XDS_PATH: cannot read {}", path.display()))?,
        ),
        LocalConfigSource::Inline(yaml) => ("LOCAL_XDS".to_string(), yaml.clone()),
    })
}

/// A local configuration as loaded: its store, what the file put in it, and the
/// policies it rejected.
pub struct Loaded {
    pub file: LocalFile,
    pub state: ProxyState,
    pub rejected: Vec<RejectedPolicy>,
}

/// Loads `yaml`, logging each rejected policy loudly, and builds its store. What decoding
/// used is handed back to the system once the store is built.
pub fn load(name: &str, yaml: &str, previous: Option<&LocalConfig>) -> anyhow::Result<Loaded> {
    let mut load = ambit_state::load_local_config(name, yaml, previous)?;
    for r in &load.rejected {
        let kept = match r.kept {
            KeptVersion::Previous => "its previous version stays",
            KeptVersion::FailClosed => {
                "a fail-closed stand-in applies (an ALLOW that admits nobody, or a DENY of all traffic)"
            }
        };
        tracing::error!(policy = %r.key, "policy rejected, {kept}: {}", r.error);
    }
    let rejected = std::mem::take(&mut load.rejected);
    let (file, state) = LocalFile::build(load).map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
    Ok(Loaded {
        file,
        state,
        rejected,
    })
}

/// Reads and checks the local config at start-up: a bad file names the file, the position
/// and field (a bad policy is refused alone). The text and what decoding it used are gone
/// when this returns: the store and the file's record of its items are what stays.
pub fn load_at_start(source: &LocalConfigSource) -> anyhow::Result<Loaded> {
    let loaded = {
        let (name, yaml) = read(source)?;
        load(&name, &yaml, None)?
    };
    ambit_runtime::memory::release_freed();
    Ok(loaded)
}

/// What the policy metrics read.
#[derive(Clone, Default)]
pub struct PolicyReport {
    /// Keys of the policies of the local file refused by the last load.
    rejected: Arc<Mutex<Vec<String>>>,
    /// Applied and refused reloads.
    reloads: Family<ReloadLabels, Counter>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReloadLabels {
    result: &'static str,
}

impl PolicyReport {
    pub fn set_rejected(&self, rejected: &[RejectedPolicy]) {
        let keys = rejected.iter().map(|r| r.key.clone()).collect();
        *self.rejected.lock().unwrap_or_else(|p| p.into_inner()) = keys;
    }
}

/// Registers ambit's policy metrics (all additive, `ambit_` prefixed): policies using
/// attributes an L4 proxy cannot see, rejected local policies, reloads. (Dry-run matches are
/// the node proxy's own: `ambit_nodeproxy::dry_run`.)
pub fn register_metrics(registry: &mut Registry, state: SharedState, report: PolicyReport) {
    registry.register(
        "ambit_local_config_reloads",
        "Changes of LOCAL_XDS_PATH seen, by result (applied, or refused and the running configuration kept)",
        report.reloads.clone(),
    );
    registry.register_collector(Box::new(PolicyGauges { state, report }));
}

#[derive(Clone)]
struct PolicyGauges {
    state: SharedState,
    report: PolicyReport,
}

impl std::fmt::Debug for PolicyGauges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PolicyGauges")
    }
}

impl Collector for PolicyGauges {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let state = self.state.get();
        {
            let mut family = encoder.encode_descriptor(
                "ambit_rbac_unsupported_attributes",
                "1 for each attribute an L4 proxy cannot see (HTTP paths, methods, ...) that a policy uses: its ALLOW rules using it never match, its DENY rules are enforced without it",
                None,
                MetricType::Gauge,
            )?;
            for p in state.policies() {
                for attribute in p.l7_attributes() {
                    let labels = [
                        ("policy".to_string(), p.key()),
                        ("attribute".to_string(), attribute.to_string()),
                    ];
                    ConstGauge::new(1i64).encode(family.encode_family(&labels)?)?;
                }
            }
        }
        let rejected = self
            .report
            .rejected
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let mut family = encoder.encode_descriptor(
            "ambit_local_config_rejected_policies",
            "1 for each policy of the local configuration refused by its last load (its previous version, or a fail-closed stand-in, applies)",
            None,
            MetricType::Gauge,
        )?;
        for key in rejected {
            let labels = [("policy".to_string(), key)];
            ConstGauge::new(1i64).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

/// Watches `path` ([`Watched`]: on the kernel's notification, polled each second) and
/// applies each new version to `shared` as one batch, loaded after the last good one (a
/// refused policy keeps its last good version). `applied` is what the file loaded at
/// start-up put in the store. Call it within the tokio runtime, right after that load.
pub fn spawn_watch(
    path: PathBuf,
    shared: SharedState,
    mut applied: Arc<LocalFile>,
    report: PolicyReport,
) {
    // Stamped now, not when the task first runs: a change made in between is seen.
    let mut watched = Watched::new(&path, POLL);
    tokio::spawn(async move {
        loop {
            watched.changed().await;
            let name = path.display().to_string();
            let loaded = tokio::task::spawn_blocking({
                let path = path.clone();
                let previous = applied.previous();
                move || -> anyhow::Result<Loaded> {
                    let (name, yaml) = read(&LocalConfigSource::File(path))?;
                    load(&name, &yaml, Some(&previous))
                }
            })
            .await;
            match loaded {
                Ok(Ok(next)) => {
                    report.set_rejected(&next.rejected);
                    if next.file.same_as(&applied) {
                        continue;
                    }
                    shared.update(|s| s.apply_local_change(&applied, &next.file));
                    report
                        .reloads
                        .get_or_create(&ReloadLabels { result: "applied" })
                        .inc();
                    tracing::info!(file = %name, rejected = next.rejected.len(), "local configuration reloaded");
                    // The new items are in the live store now; the store they were built
                    // in goes, and what it held comes back to the system.
                    applied = Arc::new(next.file);
                    drop(next.state);
                    ambit_runtime::memory::release_freed();
                }
                Ok(Err(e)) => {
                    report
                        .reloads
                        .get_or_create(&ReloadLabels { result: "refused" })
                        .inc();
                    tracing::error!(
                        "local configuration not reloaded, the running one stays: {e:#}"
                    );
                }
                Err(e) => tracing::error!("local configuration reload failed: {e}"),
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    const WORKLOAD: &str =
        "workloads:\n- {uid: w, name: w, namespace: ns, workloadIps: [\"10.0.0.1\"]}\n";

    fn policy(ips: &str) -> String {
        format!("policies:\n- {{name: p, namespace: ns, scope: Namespace, action: Allow, rules: [[[{{sourceIps: [\"{ips}\"]}}]]]}}\n")
    }

    /// Waits until `done` (a guard against a hang, not a measure of time).
    async fn wait(what: &str, done: impl Fn() -> bool) {
        for _ in 0..2000 {
            if done() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("{what} never happened");
    }

    /// The policy's source IPs as the store holds it.
    fn held(state: &SharedState) -> String {
        let s = state.get();
        let p = s
            .policies()
            .find(|p| p.key() == "ns/p")
            .expect("the policy");
        serde_json::to_string(&p.rules).unwrap()
    }

    /// A reload that refuses a policy keeps its last good version in the store (not the
    /// fail-closed stand-in a first load would put there), and reports the refusal; a
    /// fixed policy then applies.
    #[tokio::test]
    async fn a_reload_keeps_the_last_good_version_of_a_refused_policy() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mesh.yaml");
        std::fs::write(&path, format!("{WORKLOAD}{}", policy("10.0.0.0/8"))).unwrap();
        let loaded = load_at_start(&LocalConfigSource::File(path.clone())).unwrap();
        let state = SharedState::new(loaded.state);
        let good = held(&state);
        assert!(good.contains("10.0.0.0/8"), "{good}");
        let report = PolicyReport::default();
        spawn_watch(
            path.clone(),
            state.clone(),
            Arc::new(loaded.file),
            report.clone(),
        );
        let rejected = || report.rejected.lock().unwrap().clone();
        std::fs::write(&path, format!("{WORKLOAD}{}", policy("10.0.0.0/33"))).unwrap();
        wait("the refusal", || rejected() == ["ns/p"]).await;
        assert_eq!(held(&state), good, "the last good version stays");
        // The same refusal from scratch is a fail-closed stand-in: what a reload that
        // forgot the last good state would have put in the store.
        let fresh = load("f", &format!("{WORKLOAD}{}", policy("10.0.0.0/33")), None).unwrap();
        let stand_in = fresh
            .state
            .policies()
            .find(|p| p.key() == "ns/p")
            .unwrap()
            .rules
            .clone();
        assert_ne!(serde_json::to_string(&stand_in).unwrap(), good);

        std::fs::write(&path, format!("{WORKLOAD}{}", policy("192.168.0.0/16"))).unwrap();
        wait("the fix", || held(&state).contains("192.168.0.0/16")).await;
        assert!(rejected().is_empty());
    }
}
