//! The client side of a TLS gRPC channel to istiod (or `ambit control`), made as ztunnel
//! makes it for both xDS and the CA:
//!
//! - the server is verified against a root from `XDS_ROOT_CA`/`CA_ROOT_CA` ([`RootCa`]) by
//!   the address's host name, or by the alternative name of `ALT_XDS_HOSTNAME`/
//!   `ALT_CA_HOSTNAME`; no client certificate;
//! - every request carries `authorization: Bearer <token>` (the token file re-read each
//!   time, [`Token`]), `clusterid`, and the `XDS_HEADER_*`/`CA_HEADER_*` headers;
//! - TCP keepalive 300 s / 75 s / 9 probes, 5 s connect timeout, HTTP/2 keepalive pings
//!   every 30 s with a 10 s timeout;
//! - when the root is a file and it changed (a new inode, as when Kubernetes swaps a
//!   mounted secret, or new contents), the channel is rebuilt before the next request.
//!
//! TLS is rustls with aws-lc-rs, done here and handed to tonic as a connector, so tonic's
//! own TLS (which would bring a second crypto library) stays off.
//!
//! [`server`] is the other end: tonic served over the same TLS (ambit control, tests).
#![forbid(unsafe_code)]

mod connect;
mod error;
mod root;
pub mod server;
mod token;

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tonic::metadata::{AsciiMetadataKey, AsciiMetadataValue, MetadataMap};
use tonic::transport::{Channel, Endpoint};

pub use error::GrpcError;
pub use root::RootCa;
pub use token::Token;

/// HTTP/2 keepalive ping interval and timeout.
const H2_PING_INTERVAL: Duration = Duration::from_secs(30);
const H2_PING_TIMEOUT: Duration = Duration::from_secs(10);
/// TCP connect timeout.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Where and how to reach the server.
#[derive(Debug, Clone)]
pub struct ChannelConfig {
    /// `https://host:port` (a missing scheme is taken as `https://`).
    pub address: String,
    pub root: RootCa,
    /// Another server name the certificate may prove instead of the address's host.
    pub alt_hostname: Option<String>,
    /// When set, the server must prove this SPIFFE identity (byte for byte) with a
    /// certificate chaining to `root`, and host names are not looked at: a server whose
    /// certificate the mesh CA issued, as a workload's.
    pub server_identity: Option<ambit_identity::SpiffeId>,
    pub token: Token,
    /// Sent as `clusterid`.
    pub cluster_id: String,
    /// Extra request headers (`XDS_HEADER_<NAME>=v` ⇒ `<NAME>: v`), lower-cased.
    pub headers: Vec<(String, String)>,
}

/// A gRPC channel to one server. Cheap to clone; clones share the connection.
#[derive(Clone)]
pub struct GrpcChannel {
    inner: Arc<Inner>,
}

struct Inner {
    endpoint: Endpoint,
    host: String,
    server_name: rustls::pki_types::ServerName<'static>,
    port: u16,
    alt_hostname: Option<String>,
    server_identity: Option<ambit_identity::SpiffeId>,
    root: RootCa,
    token: Token,
    metadata: MetadataMap,
    cached: Mutex<Option<(root::Stamp, Channel)>>,
}

impl std::fmt::Debug for GrpcChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrpcChannel")
            .field("address", &self.inner.endpoint.uri().to_string())
            .finish_non_exhaustive()
    }
}

/// `host:port` → `https://host:port`; anything with a scheme stays as it is.
pub fn with_scheme(address: &str) -> String {
    if address.contains("://") {
        address.to_string()
    } else {
        format!("https://{address}")
    }
}

impl GrpcChannel {
    /// Checks the configuration (address, root, headers) without connecting.
    pub fn new(cfg: ChannelConfig) -> Result<GrpcChannel, GrpcError> {
        let address = with_scheme(&cfg.address);
        let uri: http::Uri = address.parse().map_err(|e| GrpcError::Address {
            address: address.clone(),
            reason: format!("{e}"),
        })?;
        if uri.scheme_str() != Some("https") {
            return Err(GrpcError::Address {
                address,
                reason:
                    "only https:// is supported: xDS and certificates never travel in plaintext"
                        .into(),
            });
        }
        let host = uri
            .host()
            .ok_or_else(|| GrpcError::Address {
                address: address.clone(),
                reason: "no host".into(),
            })?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let port = uri.port_u16().unwrap_or(443);
        let endpoint = Endpoint::from_shared(address.clone())
            .map_err(|e| GrpcError::Address {
                address: address.clone(),
                reason: e.to_string(),
            })?
            .connect_timeout(CONNECT_TIMEOUT)
            .http2_keep_alive_interval(H2_PING_INTERVAL)
            .keep_alive_timeout(H2_PING_TIMEOUT)
            .keep_alive_while_idle(true);
        let mut metadata = MetadataMap::new();
        let cluster = AsciiMetadataValue::try_from(cfg.cluster_id.as_str()).map_err(|_| {
            GrpcError::Header {
                name: "clusterid".into(),
                reason: "the cluster id is not printable ASCII".into(),
            }
        })?;
        metadata.insert("clusterid", cluster);
        for (name, value) in &cfg.headers {
            let key = AsciiMetadataKey::from_bytes(name.to_ascii_lowercase().as_bytes()).map_err(
                |_| GrpcError::Header {
                    name: name.clone(),
                    reason: "not a valid header name".into(),
                },
            )?;
            let value =
                AsciiMetadataValue::try_from(value.as_str()).map_err(|_| GrpcError::Header {
                    name: name.clone(),
                    reason: "the value is not printable ASCII".into(),
                })?;
            metadata.insert(key, value);
        }
        // Fail at start-up, not at the first request, on a root that cannot be used.
        cfg.root.load()?;
        Ok(GrpcChannel {
            inner: Arc::new(Inner {
                endpoint,
                server_name: connect::server_name(&host)?,
                host,
                port,
                alt_hostname: cfg.alt_hostname,
                server_identity: cfg.server_identity,
                root: cfg.root,
                token: cfg.token,
                metadata,
                cached: Mutex::new(None),
            }),
        })
    }

    /// The channel, built lazily (it connects on first use and reconnects by itself);
    /// rebuilt when the root file changed since it was built.
    pub fn channel(&self) -> Result<Channel, GrpcError> {
        let inner = &self.inner;
        let stamp = inner.root.stamp();
        let mut cached = inner.cached.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((built_with, channel)) = cached.as_ref() {
            if *built_with == stamp {
                return Ok(channel.clone());
            }
            tracing::info!(root = %inner.root, "the root certificate changed: reconnecting with the new one");
        }
        let roots = inner.root.load()?;
        let tls = match &inner.server_identity {
            Some(id) => connect::spiffe_client_config(roots, id.clone())?,
            None => connect::client_config(roots, inner.alt_hostname.as_deref())?,
        };
        let connector = connect::TlsConnector::new(
            tls,
            inner.host.clone(),
            inner.server_name.clone(),
            inner.port,
        );
        let channel = inner.endpoint.connect_with_connector_lazy(connector);
        *cached = Some((stamp, channel.clone()));
        Ok(channel)
    }

    /// `message` as a request with the bearer token (read now), `clusterid` and the extra
    /// headers.
    pub fn request<T>(&self, message: T) -> Result<tonic::Request<T>, GrpcError> {
        let mut request = tonic::Request::new(message);
        let metadata = request.metadata_mut();
        for kv in self.inner.metadata.iter() {
            if let tonic::metadata::KeyAndValueRef::Ascii(k, v) = kv {
                metadata.insert(k.clone(), v.clone());
            }
        }
        if let Some(token) = self.inner.token.read()? {
            let value = AsciiMetadataValue::try_from(format!("Bearer {token}")).map_err(|_| {
                GrpcError::Token {
                    from: self.inner.token.to_string(),
                    reason: "the token is not printable ASCII".into(),
                }
            })?;
            metadata.insert("authorization", value);
        }
        Ok(request)
    }
}
