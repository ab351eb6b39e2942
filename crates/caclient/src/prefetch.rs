//! Which certificates the node proxy should hold ahead of connections: one per identity
//! of the HBONE (or native-tunnel) workloads on this node. Sans-IO: [`NodePrefetch::plan`]
//! compares the state with what was prefetched before.

use std::collections::BTreeSet;

use ambit_identity::{CertManager, SpiffeId};
use ambit_state::{ProxyState, TunnelProtocol};

/// Identities of the workloads on `node` that speak HBONE or tunnel natively, i.e. whose
/// traffic this node proxy will carry with their certificate.
pub fn local_identities(state: &ProxyState, node: &str) -> BTreeSet<SpiffeId> {
    state
        .workloads()
        .filter(|w| w.node == node && (w.protocol == TunnelProtocol::Hbone || w.native_tunnel))
        .filter_map(|w| w.try_identity().ok())
        .collect()
}

/// What to do after a state update.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct PrefetchPlan {
    /// Identities that arrived on this node: prefetch.
    pub prefetch: Vec<SpiffeId>,
    /// Identities whose last workload on this node left: forget.
    pub forget: Vec<SpiffeId>,
}

/// Tracks the node's identities across state updates (shared mode only: a dedicated
/// proxy serves one identity and fetches it on first use).
#[derive(Debug)]
pub struct NodePrefetch {
    node: String,
    known: BTreeSet<SpiffeId>,
}

impl NodePrefetch {
    pub fn new(node: impl Into<String>) -> NodePrefetch {
        NodePrefetch {
            node: node.into(),
            known: BTreeSet::new(),
        }
    }

    /// The change since the last call (the first call prefetches everything local).
    pub fn plan(&mut self, state: &ProxyState) -> PrefetchPlan {
        let now = local_identities(state, &self.node);
        let plan = PrefetchPlan {
            prefetch: now.difference(&self.known).cloned().collect(),
            forget: self.known.difference(&now).cloned().collect(),
        };
        self.known = now;
        plan
    }

    /// [`NodePrefetch::plan`], carried out on `certs`. Call inside a tokio runtime.
    pub fn apply(&mut self, state: &ProxyState, certs: &CertManager) -> PrefetchPlan {
        let plan = self.plan(state);
        for id in &plan.prefetch {
            certs.prefetch(id);
        }
        for id in &plan.forget {
            certs.forget(id);
        }
        if !plan.prefetch.is_empty() || !plan.forget.is_empty() {
            tracing::debug!(
                prefetch = plan.prefetch.len(),
                forget = plan.forget.len(),
                "node-local certificates updated"
            );
        }
        plan
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ambit_state::Workload;

    fn workload(uid: &str, ns: &str, sa: &str, node: &str, hbone: bool) -> Workload {
        let mut w = Workload::new(uid, ns);
        w.uid = uid.into();
        w.service_account = sa.into();
        w.node = node.into();
        // A distinct address per uid ("a1" -> 10.0.97.49).
        let b = uid.as_bytes();
        w.workload_ips = vec![format!("10.0.{}.{}", b[0], b[b.len() - 1]).parse().unwrap()];
        if hbone {
            w.protocol = TunnelProtocol::Hbone;
        }
        w
    }

    fn id(s: &str) -> SpiffeId {
        SpiffeId::parse(s).unwrap()
    }

    #[test]
    fn prefetches_local_hbone_identities_and_forgets_the_last_to_leave() {
        let mut state = ProxyState::new();
        state
            .insert_workload(workload("a1", "a", "sa", "n1", true))
            .unwrap();
        state
            .insert_workload(workload("a2", "a", "sa", "n1", true))
            .unwrap();
        // Not prefetched: another node, and a plain-TCP workload.
        state
            .insert_workload(workload("b1", "b", "sa", "n2", true))
            .unwrap();
        state
            .insert_workload(workload("c1", "c", "sa", "n1", false))
            .unwrap();
        let mut native = workload("d1", "d", "sa", "n1", false);
        native.native_tunnel = true;
        state.insert_workload(native).unwrap();
        let mut p = NodePrefetch::new("n1");
        assert_eq!(
            p.plan(&state),
            PrefetchPlan {
                prefetch: vec![
                    id("spiffe://cluster.local/ns/a/sa/sa"),
                    id("spiffe://cluster.local/ns/d/sa/sa")
                ],
                forget: vec![],
            }
        );
        assert_eq!(p.plan(&state), PrefetchPlan::default());
        // One of two workloads with identity a leaves: nothing to forget yet.
        state.remove_workload("a1");
        assert_eq!(p.plan(&state), PrefetchPlan::default());
        state.remove_workload("a2");
        assert_eq!(
            p.plan(&state),
            PrefetchPlan {
                prefetch: vec![],
                forget: vec![id("spiffe://cluster.local/ns/a/sa/sa")],
            }
        );
    }

    #[tokio::test]
    async fn apply_prefetches_into_the_manager_and_forgets() {
        let ca = std::sync::Arc::new(
            ambit_identity::CertificateAuthority::ephemeral("cluster.local").unwrap(),
        );
        let certs = CertManager::new(ca, std::time::Duration::from_secs(3600));
        let mut state = ProxyState::new();
        state
            .insert_workload(workload("a1", "a", "sa", "n1", true))
            .unwrap();
        let mut p = NodePrefetch::new("n1");
        p.apply(&state, &certs);
        certs.wait_idle().await;
        let a = id("spiffe://cluster.local/ns/a/sa/sa");
        assert!(certs.cached(&a).is_some());
        state.remove_workload("a1");
        p.apply(&state, &certs);
        assert!(certs.cached(&a).is_none());
    }
}
