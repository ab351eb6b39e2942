//! Key sets fetched from a rule's `jwksUri` (IO): one GET over HTTPS (rustls with aws-lc-rs,
//! roots given by the caller) or plain HTTP, bounded in time and size, refreshed on a
//! timer, shared by every rule naming the same URI.
//!
//! Defaults as Istio configures Envoy for a remote JWKS: a 5 s timeout for the whole fetch
//! (the `jwtRule` `timeout` default) and a 5 min cache duration. Unlike Envoy (whose cache
//! expires and then fails requests until a fetch succeeds), a set is replaced only by a
//! newer good one: a failed refresh keeps the last good set and is retried sooner (1 s,
//! doubling up to the refresh period). A URI never fetched successfully leaves its rule
//! with no keys, so every token of that rule is refused ("Jwks remote fetch is failed");
//! nothing is ever let through for want of keys. Redirects are not followed (an answer
//! other than 200 is a failure, as in Envoy's fetcher).

use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode, Uri};
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, RootCertStore};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::watch;

use crate::jwks::{Jwks, JwksError, MAX_JWKS_BYTES};

/// Istio's default `jwtRule` `timeout` for fetching the key set.
pub const DEFAULT_FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// Istio's cache duration for a remote key set: how often a good set is refreshed.
pub const DEFAULT_REFRESH: Duration = Duration::from_secs(300);
/// The first retry after a failed fetch (doubling up to the refresh period).
pub const DEFAULT_RETRY: Duration = Duration::from_secs(1);

/// How key sets are fetched.
#[derive(Clone)]
pub struct FetchConfig {
    /// The TLS client for `https` URIs (its roots decide which servers are trusted).
    pub tls: Arc<ClientConfig>,
    /// The bound on one whole fetch: connect, TLS, request and body.
    pub timeout: Duration,
    /// The largest body read.
    pub max_body: usize,
    /// How long a good set is kept before it is fetched again.
    pub refresh: Duration,
    /// The first wait after a failed fetch.
    pub retry: Duration,
}

impl std::fmt::Debug for FetchConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FetchConfig")
            .field("timeout", &self.timeout)
            .field("max_body", &self.max_body)
            .field("refresh", &self.refresh)
            .field("retry", &self.retry)
            .finish_non_exhaustive()
    }
}

impl FetchConfig {
    /// Istio's defaults, trusting `roots` (TLS 1.2 and 1.3, aws-lc-rs).
    pub fn new(roots: RootCertStore) -> Result<FetchConfig, FetchError> {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let tls = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| FetchError::Setup(e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(FetchConfig {
            tls: Arc::new(tls),
            timeout: DEFAULT_FETCH_TIMEOUT,
            max_body: MAX_JWKS_BYTES,
            refresh: DEFAULT_REFRESH,
            retry: DEFAULT_RETRY,
        })
    }

    /// Istio's defaults, trusting the operating system's store (as istiod does when it
    /// fetches a `jwksUri`).
    pub fn with_system_roots() -> Result<FetchConfig, FetchError> {
        let found = rustls_native_certs::load_native_certs();
        let mut roots = RootCertStore::empty();
        let (added, _) = roots.add_parsable_certificates(found.certs);
        if added == 0 {
            return Err(FetchError::Setup(format!(
                "the system trust store holds no usable certificate ({} errors reading it)",
                found.errors.len()
            )));
        }
        FetchConfig::new(roots)
    }
}

/// Why a key set could not be fetched. Every variant but [`FetchError::Setup`] and
/// [`FetchError::BadUri`] is the fault of the server or the network on the way to it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FetchError {
    /// The TLS client could not be built (a local fault).
    #[error("JWKS fetching cannot be set up: {0}")]
    Setup(String),
    /// The `jwksUri` is not an absolute `http` or `https` URI with a host (fix the policy).
    #[error("jwksUri {uri:?} is not usable: {reason}")]
    BadUri {
        /// The URI as written.
        uri: String,
        /// Why.
        reason: &'static str,
    },
    /// No TCP connection (name not resolved, refused, unreachable).
    #[error("fetching {uri}: cannot connect: {error}")]
    Connect {
        /// The URI.
        uri: String,
        /// What the network said.
        error: String,
    },
    /// The TLS handshake failed (an untrusted or mismatched certificate, among others).
    #[error("fetching {uri}: TLS: {error}")]
    Tls {
        /// The URI.
        uri: String,
        /// What rustls said.
        error: String,
    },
    /// The HTTP exchange failed.
    #[error("fetching {uri}: HTTP: {error}")]
    Http {
        /// The URI.
        uri: String,
        /// What hyper said.
        error: String,
    },
    /// Not done within the timeout.
    #[error("fetching {uri}: no complete answer within {after:?}")]
    Timeout {
        /// The URI.
        uri: String,
        /// The timeout.
        after: Duration,
    },
    /// An answer other than 200.
    #[error("fetching {uri}: the server answered {status}")]
    Status {
        /// The URI.
        uri: String,
        /// Its status.
        status: StatusCode,
    },
    /// A body over the limit (announced or sent).
    #[error("fetching {uri}: the body is over {limit} bytes")]
    TooLarge {
        /// The URI.
        uri: String,
        /// The limit.
        limit: usize,
    },
    /// An issuer's discovery document that names no key set.
    #[error("fetching {uri}: {reason}")]
    Discovery {
        /// The discovery document's URI.
        uri: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A body that is not a usable key set.
    #[error("fetching {uri}: {error}")]
    Jwks {
        /// The URI.
        uri: String,
        /// What is wrong with it.
        error: JwksError,
    },
}

/// What a remote key set holds now.
#[derive(Debug, Clone)]
pub enum RemoteState {
    /// No fetch has finished yet.
    Pending,
    /// The last good set (a later failed refresh does not replace it).
    Ready(Arc<Jwks>),
    /// Every fetch so far failed; the last error.
    Failed(FetchError),
}

/// The target of a `jwksUri`.
#[derive(Debug, Clone)]
struct Target {
    https: bool,
    host: String,
    port: u16,
    authority: String,
    path: String,
}

fn target(uri: &str) -> Result<Target, FetchError> {
    let bad = |reason| FetchError::BadUri {
        uri: uri.to_string(),
        reason,
    };
    let parsed: Uri = uri.parse().map_err(|_| bad("it does not parse as a URI"))?;
    let https = match parsed.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        _ => return Err(bad("the scheme must be http or https")),
    };
    let authority = parsed.authority().ok_or_else(|| bad("it has no host"))?;
    let host = authority.host();
    if host.is_empty() {
        return Err(bad("it has no host"));
    }
    if authority.as_str().contains('@') {
        return Err(bad("it carries user information"));
    }
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
        .to_string();
    Ok(Target {
        https,
        port: authority.port_u16().unwrap_or(if https { 443 } else { 80 }),
        authority: authority.as_str().to_string(),
        path: parsed
            .path_and_query()
            .map_or("/".to_string(), |p| p.as_str().to_string()),
        host,
    })
}

/// Fetches and parses one key set (one attempt, bounded by `config.timeout` and
/// `config.max_body`).
pub async fn fetch_jwks(uri: &str, config: &FetchConfig) -> Result<Jwks, FetchError> {
    let body = fetch_body(uri, config).await?;
    Jwks::parse(&body).map_err(|error| FetchError::Jwks {
        uri: uri.to_string(),
        error,
    })
}

/// Where Istio looks for an issuer's key set when a rule names neither `jwks` nor
/// `jwksUri`: its OpenID Connect discovery document.
pub fn discovery_uri(issuer: &str) -> String {
    format!(
        "{}/.well-known/openid-configuration",
        issuer.trim_end_matches('/')
    )
}

/// Fetches an issuer's discovery document ([`discovery_uri`]), then the key set its
/// `jwks_uri` names (each fetch bounded as [`fetch_jwks`]).
pub async fn fetch_discovered(issuer: &str, config: &FetchConfig) -> Result<Jwks, FetchError> {
    let uri = discovery_uri(issuer);
    let body = fetch_body(&uri, config).await?;
    let bad = |reason: &'static str| FetchError::Discovery {
        uri: uri.clone(),
        reason,
    };
    let doc: serde_json::Value =
        serde_json::from_slice(&body).map_err(|_| bad("the document is not JSON"))?;
    let jwks_uri = doc
        .get("jwks_uri")
        .and_then(serde_json::Value::as_str)
        .ok_or_else(|| bad("the document has no jwks_uri string"))?;
    fetch_jwks(jwks_uri, config).await
}

/// One GET, bounded in time and size; the body of a 200.
async fn fetch_body(uri: &str, config: &FetchConfig) -> Result<Bytes, FetchError> {
    let t = target(uri)?;
    match tokio::time::timeout(config.timeout, fetch_from(&t, uri, config)).await {
        Ok(result) => result,
        Err(_) => Err(FetchError::Timeout {
            uri: uri.to_string(),
            after: config.timeout,
        }),
    }
}

async fn fetch_from(t: &Target, uri: &str, config: &FetchConfig) -> Result<Bytes, FetchError> {
    let tcp = TcpStream::connect((t.host.as_str(), t.port))
        .await
        .map_err(|e| FetchError::Connect {
            uri: uri.to_string(),
            error: e.to_string(),
        })?;
    if t.https {
        let tls_err = |error: String| FetchError::Tls {
            uri: uri.to_string(),
            error,
        };
        let name = ServerName::try_from(t.host.clone())
            .map_err(|_| tls_err(format!("{:?} is not a valid server name", t.host)))?;
        let tls = tokio_rustls::TlsConnector::from(config.tls.clone())
            .connect(name, tcp)
            .await
            .map_err(|e| tls_err(e.to_string()))?;
        get(tls, t, uri, config.max_body).await
    } else {
        get(tcp, t, uri, config.max_body).await
    }
}

/// Aborts the connection task when the fetch ends (or is dropped at its timeout).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn get<S>(io: S, t: &Target, uri: &str, max_body: usize) -> Result<Bytes, FetchError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let http_err = |e: hyper::Error| FetchError::Http {
        uri: uri.to_string(),
        error: e.to_string(),
    };
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(http_err)?;
    let _conn = AbortOnDrop(tokio::spawn(async move {
        let _ = conn.await;
    }));
    let request = Request::get(t.path.as_str())
        .header(http::header::HOST, t.authority.as_str())
        .header(http::header::ACCEPT, "application/json")
        .body(Empty::<Bytes>::new())
        .map_err(|_| FetchError::BadUri {
            uri: uri.to_string(),
            reason: "its path is not a valid request target",
        })?;
    let response = sender.send_request(request).await.map_err(http_err)?;
    if response.status() != StatusCode::OK {
        return Err(FetchError::Status {
            uri: uri.to_string(),
            status: response.status(),
        });
    }
    let too_large = || FetchError::TooLarge {
        uri: uri.to_string(),
        limit: max_body,
    };
    let announced = response
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if announced.is_some_and(|n| n > max_body as u64) {
        return Err(too_large());
    }
    match Limited::new(response.into_body(), max_body).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(too_large()),
        Err(e) => Err(FetchError::Http {
            uri: uri.to_string(),
            error: e.to_string(),
        }),
    }
}

/// One `jwksUri`'s key set, shared by the rules that name it.
pub struct RemoteJwks {
    uri: String,
    /// `uri` is an issuer whose discovery document names the key set.
    discover: bool,
    config: FetchConfig,
    state: watch::Sender<RemoteState>,
}

impl std::fmt::Debug for RemoteJwks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteJwks")
            .field("uri", &self.uri)
            .field("state", &*self.state.borrow())
            .finish()
    }
}

impl RemoteJwks {
    /// A key set for `uri`, not fetched yet (see [`RemoteJwks::refresh`] and
    /// [`RemoteJwks::spawn_refresher`]).
    pub fn new(uri: &str, config: FetchConfig) -> Result<Arc<RemoteJwks>, FetchError> {
        target(uri)?;
        Ok(Arc::new(RemoteJwks {
            uri: uri.to_string(),
            discover: false,
            config,
            state: watch::Sender::new(RemoteState::Pending),
        }))
    }

    /// The key set of an issuer found through its discovery document (a rule with
    /// neither `jwks` nor `jwksUri`), not fetched yet.
    pub fn discovered(issuer: &str, config: FetchConfig) -> Result<Arc<RemoteJwks>, FetchError> {
        target(&discovery_uri(issuer))?;
        Ok(Arc::new(RemoteJwks {
            uri: issuer.to_string(),
            discover: true,
            config,
            state: watch::Sender::new(RemoteState::Pending),
        }))
    }

    /// The URI (the issuer, for a discovered set).
    pub fn uri(&self) -> &str {
        &self.uri
    }

    /// What it holds now.
    pub fn state(&self) -> RemoteState {
        self.state.borrow().clone()
    }

    /// Fetches once: a good set replaces the one held; a failure keeps it (and is
    /// recorded as the state only while no good set was ever had).
    pub async fn refresh(&self) -> Result<(), FetchError> {
        let result = if self.discover {
            fetch_discovered(&self.uri, &self.config).await
        } else {
            fetch_jwks(&self.uri, &self.config).await
        };
        match result {
            Ok(set) => {
                for skipped in set.skipped() {
                    tracing::warn!(uri = %self.uri, %skipped, "jwksUri: key skipped");
                }
                tracing::debug!(uri = %self.uri, keys = set.keys().len(), "jwksUri fetched");
                self.state.send_replace(RemoteState::Ready(Arc::new(set)));
                Ok(())
            }
            Err(error) => {
                let had_set = matches!(&*self.state.borrow(), RemoteState::Ready(_));
                if had_set {
                    tracing::warn!(%error, "jwksUri refresh failed; keeping the last good key set");
                } else {
                    tracing::warn!(%error, "jwksUri fetch failed; tokens of its rules are refused until one succeeds");
                    self.state.send_replace(RemoteState::Failed(error.clone()));
                }
                Err(error)
            }
        }
    }

    /// Resolves once the first fetch has finished (well or not).
    pub async fn ready(&self) {
        let mut rx = self.state.subscribe();
        let _ = rx.wait_for(|s| !matches!(s, RemoteState::Pending)).await;
    }

    /// Runs [`RemoteJwks::refresh`] now and then on the refresh period (sooner after a
    /// failure), until every holder of the key set has dropped it.
    pub fn spawn_refresher(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        tokio::spawn(refresh_loop(Arc::downgrade(self)))
    }
}

async fn refresh_loop(weak: Weak<RemoteJwks>) {
    let mut backoff: Option<Duration> = None;
    loop {
        let Some(remote) = weak.upgrade() else { return };
        let wait = match remote.refresh().await {
            Ok(()) => {
                backoff = None;
                remote.config.refresh
            }
            Err(_) => {
                let next = backoff
                    .map_or(remote.config.retry, |b| b * 2)
                    .min(remote.config.refresh);
                backoff = Some(next);
                next
            }
        };
        // Not held while waiting, so dropping the last rule ends the loop.
        drop(remote);
        tokio::time::sleep(wait).await;
    }
}

#[cfg(test)]
mod tests;
