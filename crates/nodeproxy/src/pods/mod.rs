//! In-pod (shared) mode: the node proxy connects to the node agent over ZDS, receives each
//! pod's network namespace, and runs a full proxy per pod with its listeners and every
//! socket it opens created inside that namespace.

mod factory;
mod manager;
mod metrics;
mod sockets;

pub use factory::{PodDns, PodProxyFactory, RunningPod};
pub use manager::{ManagerError, PodDump, WorkloadManager, WorkloadStateDump};
pub use metrics::InpodMetrics;
pub use sockets::InPodSocketFactory;
