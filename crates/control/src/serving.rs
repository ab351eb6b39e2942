//! The CA and the serving certificate: the plug-in directory (or an ephemeral root written
//! there), the certificate for the listener's names and addresses, renewed before it
//! expires.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use crate::config::{ControlConfig, ControlError};
use crate::shared::{stopped, Shared};
use ambit_identity::CertificateAuthority;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::sync::watch;

/// The CA: the plug-in directory, or an ephemeral root written there when it holds none
/// of the plug-in files.
pub(crate) fn load_ca(config: &ControlConfig) -> Result<CertificateAuthority, ControlError> {
    let dir = &config.ca_dir;
    let err = |source| ControlError::Ca {
        dir: dir.clone(),
        source,
    };
    let any = [
        "ca-cert.pem",
        "ca-key.pem",
        "root-cert.pem",
        "cert-chain.pem",
    ]
    .iter()
    .any(|f| dir.join(f).exists());
    if any {
        return CertificateAuthority::from_plugin_dir(dir).map_err(err);
    }
    let ca = CertificateAuthority::ephemeral(&config.trust_domain).map_err(err)?;
    ca.write_plugin_dir(dir).map_err(err)?;
    tracing::info!(
        "no CA in {}: made an ephemeral root and wrote it there (clients trust {}/root-cert.pem)",
        dir.display(),
        dir.display()
    );
    Ok(ca)
}

/// The IPs in the serving certificate: the one listened on, or loopback for a wildcard.
pub(crate) fn serving_ips(listen: IpAddr) -> Vec<IpAddr> {
    if listen.is_unspecified() {
        vec![
            IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(Ipv6Addr::LOCALHOST),
        ]
    } else {
        vec![listen]
    }
}

pub(crate) fn issue_serving(
    ca: &CertificateAuthority,
    config: &ControlConfig,
    ips: &[IpAddr],
) -> Result<(Arc<CertifiedKey>, SystemTime), ControlError> {
    let now = SystemTime::now();
    let (chain, key, not_after) = ca
        .issue_server_cert(
            &config.serving_names,
            ips,
            Some(&config.identity),
            config.serving_cert_ttl,
            now,
        )
        .map_err(ControlError::ServingCert)?;
    let signing = ambit_identity::crypto_provider()
        .key_provider
        .load_private_key(key.into())
        .map_err(ControlError::ServingKey)?;
    let half = not_after.duration_since(now).unwrap_or_default() / 2;
    Ok((Arc::new(CertifiedKey::new(chain, signing)), now + half))
}

#[derive(Debug)]
pub(crate) struct ServingCert {
    pub(crate) current: RwLock<Arc<CertifiedKey>>,
}

impl ResolvesServerCert for ServingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(
            self.current
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        )
    }
}

pub(crate) fn server_config(resolver: Arc<ServingCert>) -> Arc<rustls::ServerConfig> {
    // The provider's safe defaults cannot fail to build with its own protocol versions.
    let builder = rustls::ServerConfig::builder_with_provider(ambit_identity::crypto_provider())
        .with_safe_default_protocol_versions()
        .unwrap_or_else(|_| {
            rustls::ServerConfig::builder_with_protocol_versions(rustls::DEFAULT_VERSIONS)
        });
    let mut cfg = builder.with_no_client_auth().with_cert_resolver(resolver);
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    Arc::new(cfg)
}

/// Reissues the serving certificate at half its life.
pub(crate) async fn renew_loop(
    shared: Arc<Shared>,
    resolver: Arc<ServingCert>,
    ips: Vec<IpAddr>,
    mut renew_at: SystemTime,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let wait = renew_at
            .duration_since(SystemTime::now())
            .unwrap_or_default();
        tokio::select! {
            _ = stopped(&mut stop) => return,
            _ = tokio::time::sleep(wait) => {}
        }
        let Some(ca) = shared.ca.as_ref() else {
            return;
        };
        match issue_serving(ca, &shared.config, &ips) {
            Ok((cert, next)) => {
                *resolver.current.write().unwrap_or_else(|p| p.into_inner()) = cert;
                renew_at = next;
                tracing::info!("renewed the serving certificate");
            }
            Err(e) => {
                tracing::warn!("cannot renew the serving certificate (retrying in 60 s): {e}");
                renew_at = SystemTime::now() + Duration::from_secs(60);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Waypoints check the server's SPIFFE id, not a name: the serving certificate carries
    /// it as its one URI SAN, beside the names and addresses node proxies dial.
    #[test]
    fn the_serving_certificate_proves_the_servers_identity() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = ControlConfig::new(
            dir.path().join("mesh"),
            dir.path().join("ca"),
            dir.path().join("tokens.yaml"),
        );
        config.identity =
            ambit_identity::SpiffeId::parse("spiffe://cluster.local/ns/mesh-ops/sa/ctl").unwrap();
        let ca = load_ca(&config).unwrap();
        let (key, _) = issue_serving(
            &ca,
            &config,
            &serving_ips(IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
        )
        .unwrap();
        let leaf = &key.cert[0];
        assert_eq!(
            ambit_identity::svid_identity(leaf).unwrap().to_string(),
            "spiffe://cluster.local/ns/mesh-ops/sa/ctl"
        );
        // The DNS name node proxies verify is still there (an IA5String, as written).
        let name = b"istiod.istio-system.svc";
        assert!(leaf.as_ref().windows(name.len()).any(|w| w == name));
    }
}
