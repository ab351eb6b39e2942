//! The agent's counters and their Prometheus text exposition (`:15014/metrics`).

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
        let text = m.render();
        for line in [
            "nodeagent_reconcile_events_total{type=\"update\"} 2",
            "nodeagent_reconcile_events_total{type=\"delete\"} 1",
            "istio_cni_plugin_requests_total{response_code=\"200\"} 1",
            "istio_cni_plugin_requests_total{response_code=\"500\"} 1",
            "ambit_agent_enrolled_pods 3",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
    }
}
