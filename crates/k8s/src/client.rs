//! An API client from a kubeconfig file (the CNI plugin's, written by the agent; a user's
//! for the agent outside a cluster) or from the in-cluster service account
//! (`KUBERNETES_SERVICE_HOST`, the mounted token and CA, the token re-read as it rotates).

use std::path::{Path, PathBuf};

use kube::config::{KubeConfigOptions, Kubeconfig};

/// Where the client's configuration comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientSource {
    Kubeconfig(PathBuf),
    InCluster,
}

impl ClientSource {
    /// A kubeconfig if one is named, else the in-cluster account if
    /// `KUBERNETES_SERVICE_HOST` is set, else `None`: not on Kubernetes.
    pub fn detect(kubeconfig: Option<&Path>) -> Option<ClientSource> {
        if let Some(path) = kubeconfig.filter(|p| !p.as_os_str().is_empty()) {
            return Some(ClientSource::Kubeconfig(path.to_owned()));
        }
        std::env::var_os("KUBERNETES_SERVICE_HOST")
            .filter(|v| !v.is_empty())
            .map(|_| ClientSource::InCluster)
    }
}

impl std::fmt::Display for ClientSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientSource::Kubeconfig(p) => write!(f, "kubeconfig {}", p.display()),
            ClientSource::InCluster => f.write_str("the in-cluster service account"),
        }
    }
}

/// A client could not be configured.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot read the kubeconfig {path}: {source}")]
    Kubeconfig {
        path: PathBuf,
        source: kube::config::KubeconfigError,
    },
    #[error("cannot use the in-cluster service account (KUBERNETES_SERVICE_HOST, the token and ca.crt under /var/run/secrets/kubernetes.io/serviceaccount): {0}")]
    InCluster(kube::config::InClusterError),
    #[error("cannot build an API client from {source_name}: {error}")]
    Build {
        source_name: String,
        error: kube::Error,
    },
}

/// Builds the client. Nothing is sent yet.
pub async fn connect(source: &ClientSource) -> Result<kube::Client, ClientError> {
    let config = match source {
        ClientSource::Kubeconfig(path) => {
            let file = Kubeconfig::read_from(path).map_err(|source| ClientError::Kubeconfig {
                path: path.clone(),
                source,
            })?;
            kube::Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
                .await
                .map_err(|source| ClientError::Kubeconfig {
                    path: path.clone(),
                    source,
                })?
        }
        ClientSource::InCluster => kube::Config::incluster().map_err(ClientError::InCluster)?,
    };
    kube::Client::try_from(config).map_err(|error| ClientError::Build {
        source_name: source.to_string(),
        error,
    })
}
