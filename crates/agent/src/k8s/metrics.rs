//! The agent's counters and their Prometheus text exposition (`:15014/metrics`).
//!
//! `ambit_agent_reconcile_pending_pods` is rendered after `nodeagent_reconcile_events_total`
//! and an event is counted only once its pod is queued, so a scrape that shows an event and
//! no pending pod shows that event's reconcile finished (what the no-churn tests wait for).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;

#[derive(Debug, Default)]
pub struct Metrics {
    /// `nodeagent_reconcile_events_total{type}`.
    reconcile: Mutex<BTreeMap<&'static str, u64>>,
    /// `istio_cni_plugin_requests_total{response_code}`.
    plugin: Mutex<BTreeMap<u16, u64>>,
    /// Pods held (`ambit_agent_enrolled_pods`), set by the controller.
    enrolled: Mutex<u64>,
    /// `ambit_agent_reconciles_total{result}`: finished reconciles of one pod.
    reconciles: Mutex<BTreeMap<&'static str, u64>>,
    /// Pods queued, being reconciled or waiting to retry
    /// (`ambit_agent_reconcile_pending_pods`), set by the controller under its queue's lock.
    pending: Mutex<u64>,
}

impl Metrics {
    pub fn reconcile_event(&self, kind: &'static str) {
        *self
            .reconcile
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(kind)
            .or_default() += 1;
    }

    pub fn plugin_request(&self, code: u16) {
        *self
            .plugin
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(code)
            .or_default() += 1;
    }

    pub fn set_enrolled(&self, n: usize) {
        *self.enrolled.lock().unwrap_or_else(|e| e.into_inner()) = n as u64;
    }

    /// A reconcile of one pod finished: `ok`, `retry` (failed, queued again after its
    /// backoff) or `dropped` (failed for good).
    pub fn reconciled(&self, result: &'static str) {
        *self
            .reconciles
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(result)
            .or_default() += 1;
    }

    pub fn set_pending(&self, n: usize) {
        *self.pending.lock().unwrap_or_else(|e| e.into_inner()) = n as u64;
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        out.push_str("# HELP nodeagent_reconcile_events_total The pod and namespace events the node agent reconciled.\n# TYPE nodeagent_reconcile_events_total counter\n");
        for (k, v) in self
            .reconcile
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            let _ = writeln!(out, "nodeagent_reconcile_events_total{{type=\"{k}\"}} {v}");
        }
        out.push_str("# HELP istio_cni_plugin_requests_total The CNI plugin's cmdadd requests, by HTTP status.\n# TYPE istio_cni_plugin_requests_total counter\n");
        for (k, v) in self.plugin.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            let _ = writeln!(
                out,
                "istio_cni_plugin_requests_total{{response_code=\"{k}\"}} {v}"
            );
        }
        let enrolled = *self.enrolled.lock().unwrap_or_else(|e| e.into_inner());
        let _ = writeln!(out, "# HELP ambit_agent_enrolled_pods Pods this node agent holds in the mesh.\n# TYPE ambit_agent_enrolled_pods gauge\nambit_agent_enrolled_pods {enrolled}");
        out.push_str("# HELP ambit_agent_reconciles_total Reconciles of one pod finished, by result (ok; retry: failed and queued again after a backoff; dropped: failed for good).\n# TYPE ambit_agent_reconciles_total counter\n");
        for (k, v) in self
            .reconciles
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            let _ = writeln!(out, "ambit_agent_reconciles_total{{result=\"{k}\"}} {v}");
        }
        // Last, after the event counters (see the module doc).
        let pending = *self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let _ = writeln!(out, "# HELP ambit_agent_reconcile_pending_pods Pods queued for a reconcile, being reconciled, or waiting to retry one; 0: every event counted has been acted on.\n# TYPE ambit_agent_reconcile_pending_pods gauge\nambit_agent_reconcile_pending_pods {pending}");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_render_with_their_labels() {
        let m = Metrics::default();
        m.reconcile_event("update");
        m.reconcile_event("update");
        m.reconcile_event("delete");
        m.plugin_request(200);
        m.plugin_request(500);
        m.set_enrolled(3);
        m.reconciled("ok");
        m.reconciled("ok");
        m.reconciled("retry");
        m.set_pending(4);
        let text = m.render();
        for line in [
            "nodeagent_reconcile_events_total{type=\"update\"} 2",
            "nodeagent_reconcile_events_total{type=\"delete\"} 1",
            "istio_cni_plugin_requests_total{response_code=\"200\"} 1",
            "istio_cni_plugin_requests_total{response_code=\"500\"} 1",
            "ambit_agent_enrolled_pods 3",
            "ambit_agent_reconciles_total{result=\"ok\"} 2",
            "ambit_agent_reconciles_total{result=\"retry\"} 1",
            "ambit_agent_reconcile_pending_pods 4",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
        let at = |prefix: &str| text.find(prefix).unwrap();
        assert!(
            at("nodeagent_reconcile_events_total{") < at("ambit_agent_reconcile_pending_pods "),
            "the pending gauge is read after the event counters"
        );
    }
}
