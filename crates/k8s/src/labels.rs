//! Names Istio's ambient mode gives meaning to (istio-cni reference §1.3, §4.4).

/// Pod and namespace label that opts into (`ambient`) or out of (`none`) ambient mode.
pub const DATAPLANE_MODE: &str = "istio.io/dataplane-mode";
/// [`DATAPLANE_MODE`]'s opt-in value.
pub const DATAPLANE_MODE_AMBIENT: &str = "ambient";
/// [`DATAPLANE_MODE`]'s opt-out value.
pub const DATAPLANE_MODE_NONE: &str = "none";

/// The annotation the agent writes once a pod is captured; istiod turns HBONE on for pods
/// that carry `enabled`, so other nodes tunnel to them.
pub const REDIRECTION_ANNOTATION: &str = "ambient.istio.io/redirection";

/// The annotation the sidecar injector leaves on injected pods: such pods have their own
/// proxy and are never captured.
pub const SIDECAR_STATUS_ANNOTATION: &str = "sidecar.istio.io/status";

/// The label that marks ztunnel pods (in the system namespace).
pub const APP_LABEL: &str = "app";
/// [`APP_LABEL`]'s value on ztunnel pods.
pub const ZTUNNEL_APP: &str = "ztunnel";

/// The agent's DaemonSet: the CNI plugin recognises the agent's own pods by this name
/// prefix, and the safe-upgrade check on shutdown looks it up.
pub const CNI_DAEMONSET: &str = "istio-cni-node";

/// Istio's system namespace by default (`SYSTEM_NAMESPACE`).
pub const DEFAULT_SYSTEM_NAMESPACE: &str = "istio-system";
