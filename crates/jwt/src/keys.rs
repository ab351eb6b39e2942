//! Where a rule's keys come from: an inline `jwks`, or a `jwksUri` fetched and refreshed,
//! one set shared by every rule naming it ([`JwksCache`]); and the key set to verify with
//! now.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use crate::fetch::{FetchConfig, FetchError, RemoteJwks, RemoteState};
use crate::jwks::{Jwks, JwksError};
use crate::reason::Reason;

/// Where a rule's keys come from.
#[derive(Debug, Clone)]
pub enum KeySource {
    /// An inline `jwks` that parsed.
    Inline(Arc<Jwks>),
    /// An inline `jwks` that did not parse: every token of the rule is refused with
    /// Envoy's "Jwks doesn't have any valid public key".
    Invalid(JwksError),
    /// A `jwksUri`, fetched and refreshed by [`crate::JwksCache`]; until a fetch has
    /// succeeded every token of the rule is refused with "Jwks remote fetch is failed".
    Remote(Arc<RemoteJwks>),
}

impl KeySource {
    /// An inline `jwks` text: [`KeySource::Inline`] when it parses, else
    /// [`KeySource::Invalid`] (logged).
    pub fn inline(jwks: &str) -> KeySource {
        match Jwks::parse(jwks.as_bytes()) {
            Ok(set) => {
                for skipped in set.skipped() {
                    tracing::warn!(%skipped, "inline jwks: key skipped");
                }
                KeySource::Inline(Arc::new(set))
            }
            Err(e) => {
                tracing::warn!(error = %e, "inline jwks refused: every token of its rule will be refused");
                KeySource::Invalid(e)
            }
        }
    }

    /// The key set to verify with now, or why there is none.
    pub(crate) fn current(&self) -> Result<Arc<Jwks>, Reason> {
        match self {
            KeySource::Inline(set) => Ok(set.clone()),
            KeySource::Invalid(_) => Err(Reason::JwksNoValidKeys),
            KeySource::Remote(remote) => match remote.state() {
                RemoteState::Ready(set) => Ok(set),
                RemoteState::Pending | RemoteState::Failed(_) => Err(Reason::JwksFetchFailed),
            },
        }
    }
}

/// Remote key sets by URI: rules naming the same `jwksUri` (with the same timeout) share
/// one fetched set and one refresher. A set no rule holds any more stops refreshing.
#[derive(Debug)]
pub struct JwksCache {
    config: FetchConfig,
    entries: Mutex<HashMap<(String, Duration), Weak<RemoteJwks>>>,
}

impl JwksCache {
    /// An empty cache fetching with `config`.
    pub fn new(config: FetchConfig) -> JwksCache {
        JwksCache {
            config,
            entries: Mutex::new(HashMap::new()),
        }
    }

    /// The key source for a `jwksUri` fetched within `timeout` (the rule's `timeout`,
    /// [`crate::DEFAULT_FETCH_TIMEOUT`] when not written): the shared set, started (its refresher
    /// spawned on the current tokio runtime) when no rule held it yet.
    pub fn source(&self, uri: &str, timeout: Duration) -> Result<KeySource, FetchError> {
        self.shared(uri.to_string(), timeout, RemoteJwks::new)
    }

    /// The key source of an issuer found through its discovery document (a rule with
    /// neither `jwks` nor `jwksUri`, as istiod resolves it), shared and started likewise.
    pub fn discovered(&self, issuer: &str, timeout: Duration) -> Result<KeySource, FetchError> {
        self.shared(format!("discovery {issuer}"), timeout, |_, config| {
            RemoteJwks::discovered(issuer, config)
        })
    }

    fn shared(
        &self,
        key: String,
        timeout: Duration,
        make: impl FnOnce(&str, FetchConfig) -> Result<Arc<RemoteJwks>, FetchError>,
    ) -> Result<KeySource, FetchError> {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.retain(|_, w| w.strong_count() > 0);
        let key = (key, timeout);
        if let Some(remote) = entries.get(&key).and_then(Weak::upgrade) {
            return Ok(KeySource::Remote(remote));
        }
        let config = FetchConfig {
            timeout,
            ..self.config.clone()
        };
        let remote = make(&key.0, config)?;
        remote.spawn_refresher();
        entries.insert(key, Arc::downgrade(&remote));
        Ok(KeySource::Remote(remote))
    }
}
