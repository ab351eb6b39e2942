//! What ambit's node agent, CNI plugin and waypoint share when they run on Kubernetes.
//!
//! - [`labels`]: the label, annotation and value names Istio's ambient mode uses.
//! - [`selector`]: Kubernetes label selectors, evaluated (sans IO).
//! - [`enablement`]: whether a pod belongs in the mesh: the enablement selectors
//!   (`AMBIENT_ENABLEMENT_SELECTOR`) and istio-cni's exclusions (sans IO).
//! - [`annotation`]: the `ambient.istio.io/redirection` annotation and the exact patch
//!   that sets or removes it on `pods/status`.
//! - [`downward`]: a pod's labels or annotations from a downward-API volume (sans IO).
//! - [`client`]: an API client from a kubeconfig file or the in-cluster service account.
#![forbid(unsafe_code)]

pub mod annotation;
pub mod client;
pub mod downward;
pub mod enablement;
pub mod labels;
pub mod selector;

pub use enablement::{Enablement, EnablementSelector, Exclusion, PodFacts, Verdict};
pub use k8s_openapi;
pub use kube;
