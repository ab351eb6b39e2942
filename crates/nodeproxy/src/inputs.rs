//! What one proxy instance (the node, in dedicated mode; one pod, in-pod) works with.

use std::sync::Arc;

use ambit_hbone::pool::Pool;
use ambit_identity::CertManager;
use ambit_state::ProxyState;

use crate::admission::HandshakeGate;
use crate::connections::OpenConnections;
use crate::metrics::Metrics;
use crate::settings::ProxyConfig;
use crate::socket::SocketFactory;

/// The mesh state: readers take a snapshot (an `Arc`) per decision; writers apply a
/// whole batch at once, so a reader never sees half an update.
pub type SharedState = ambit_runtime::shared::Shared<ProxyState>;

pub use crate::decide::LocalIdentity;

pub struct ProxyInputs {
    pub cfg: Arc<ProxyConfig>,
    pub state: SharedState,
    pub certs: Arc<CertManager>,
    pub metrics: Metrics,
    pub sockets: Arc<dyn SocketFactory>,
    pub local: LocalIdentity,
    /// This node's name, to prefer the local copy when a workload name is ambiguous.
    pub node: Option<String>,
    pub pool: Pool,
    /// With `ENABLE_ORIG_SRC` unset, whether to connect to the app from the client's IP.
    /// In-pod the agent's connmark routing returns the replies to us; in dedicated mode
    /// nothing does, so there it stays off unless asked for.
    pub spoof_by_default: bool,
    /// The connections open right now (`/config_dump`'s `workloadState`).
    pub connections: Arc<OpenConnections>,
    /// Admission to the HBONE handshake (this instance's share of the node's).
    pub handshakes: Arc<HandshakeGate>,
    /// The DNS proxy's resolver, for SOCKS5 requests by name (none: DNS proxy disabled).
    pub names: Option<Arc<dyn crate::lookups::NameLookup>>,
    /// On-demand xDS (`XDS_ON_DEMAND=true`): names a decision misses are asked for.
    pub on_demand: Option<Arc<dyn crate::lookups::OnDemandLookups>>,
}

impl ProxyInputs {
    /// Who this proxy acts for, for the connection decisions.
    pub fn local(&self) -> crate::decide::Local<'_> {
        crate::decide::Local {
            identity: &self.local,
            node: self.node.as_deref(),
        }
    }

    /// How a listener that is (or is not) transparent reaches the app.
    pub fn source_policy(&self, transparent: bool) -> crate::decide::SourcePolicy {
        crate::decide::SourcePolicy {
            original_source: self.cfg.original_source,
            transparent,
            spoof_by_default: self.spoof_by_default,
        }
    }
}
