//! The certificate manager every ambit process builds the same way, from where its
//! certificates come from ([`CaSource`]): an Istio CA (istiod or `ambit control`) over its
//! gRPC protocol, renewed at half-life; a local plug-in CA directory; or an ephemeral root
//! for a one-machine mesh.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::Context;

use ambit_caclient::RemoteIssuer;
use ambit_grpc::{ChannelConfig, GrpcChannel, RootCa, Token};
use ambit_identity::{CertManager, CertificateAuthority};

use crate::ca::CaSource;

/// What the certificate manager is built from.
#[derive(Debug, Clone)]
pub struct CertSettings<'a> {
    pub source: &'a CaSource,
    /// `TRUST_DOMAIN`: an ephemeral root's.
    pub trust_domain: &'a str,
    /// `CLUSTER_ID`, sent to a remote CA.
    pub cluster_id: &'a str,
    /// `SECRET_TTL`.
    pub secret_ttl: Duration,
    /// Certificates asked for on behalf of other workloads (the node proxy in shared
    /// mode, for its pods).
    pub impersonate: bool,
}

/// The certificate manager for `settings`' issuer.
pub fn cert_manager(settings: &CertSettings<'_>) -> anyhow::Result<Arc<CertManager>> {
    let ca = match settings.source {
        CaSource::Remote(remote) => {
            let channel = GrpcChannel::new(ChannelConfig {
                server_identity: None,
                address: remote.address.clone(),
                root: RootCa::from_env_value(remote.root.as_deref()),
                alt_hostname: remote.alt_hostname.clone(),
                token: Token::from_env_value(remote.token.as_deref()),
                cluster_id: settings.cluster_id.to_string(),
                headers: remote.headers.clone(),
            })
            .with_context(|| {
                format!(
                    "the CA channel to {} (CA_ADDRESS, CA_ROOT_CA, AUTH_TOKEN, CA_HEADER_*)",
                    remote.address
                )
            })?;
            tracing::info!(address = %remote.address, impersonate = settings.impersonate, "certificates from the CA");
            let issuer = RemoteIssuer::new(channel, remote.address.clone(), settings.impersonate);
            return Ok(CertManager::with_issuer(
                Arc::new(issuer),
                settings.secret_ttl,
                Arc::new(SystemTime::now),
            ));
        }
        CaSource::LocalDir(dir) => CertificateAuthority::from_plugin_dir(dir)
            .with_context(|| format!("LOCAL_CA_DIR={}", dir.display()))?,
        CaSource::Ephemeral => {
            tracing::warn!(
                "neither CA_ADDRESS nor LOCAL_CA_DIR is set: created an ephemeral root CA for \
                 trust domain {}; only peers that share this root can talk to this process \
                 (set LOCAL_CA_DIR to a directory with ca-cert.pem, ca-key.pem, root-cert.pem, \
                 cert-chain.pem)",
                settings.trust_domain
            );
            CertificateAuthority::ephemeral(settings.trust_domain)?
        }
    };
    Ok(CertManager::new(Arc::new(ca), settings.secret_ttl))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn each_source_gives_a_manager_and_a_bad_one_says_which_variable() {
        let settings = |source| CertSettings {
            source,
            trust_domain: "cluster.local",
            cluster_id: "Kubernetes",
            secret_ttl: Duration::from_secs(3600),
            impersonate: false,
        };
        assert!(cert_manager(&settings(&CaSource::Ephemeral)).is_ok());
        let missing = CaSource::LocalDir("/nonexistent/ca".into());
        let e = cert_manager(&settings(&missing)).unwrap_err();
        assert!(
            format!("{e:#}").starts_with("LOCAL_CA_DIR=/nonexistent/ca"),
            "{e:#}"
        );
        let remote = |root: Option<String>| {
            CaSource::Remote(crate::ca::RemoteCa {
                address: "https://istiod.istio-system.svc:15012".into(),
                root,
                alt_hostname: None,
                token: None,
                headers: Vec::new(),
            })
        };
        // The channel is lazy: it is made without the CA being up, from a root given.
        let root = CertificateAuthority::ephemeral("cluster.local")
            .unwrap()
            .root_pem();
        let good = remote(Some(root));
        assert!(cert_manager(&settings(&good)).is_ok());
        let bad = remote(Some("/nonexistent/root.pem".into()));
        let e = cert_manager(&settings(&bad)).unwrap_err();
        assert!(
            format!("{e:#}").contains("(CA_ADDRESS, CA_ROOT_CA, AUTH_TOKEN, CA_HEADER_*)"),
            "{e:#}"
        );
    }
}
