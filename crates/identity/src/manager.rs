//! Per-identity certificate cache for the node proxy: fetches through an [`Issuer`] (the
//! local CA or a remote Istio CA), renews at half life, backs off after failures.
//!
//! - One fetch per identity at a time: concurrent callers share it (single flight).
//! - At most [`MAX_IN_FLIGHT`] fetches run node-wide; the rest wait in a queue ordered by
//!   [`Priority`] (a connection waiting beats a prefetch beats a rotation).
//! - A still valid certificate is always served at once, even while its renewal is due,
//!   running or failing; callers wait only when there is no valid certificate.
//! - A certificate is checked before it is cached (see `issued.rs`): for the identity
//!   asked for, a leaf, inside its validity by our clock, chaining to the roots sent with
//!   it. A refused one is a failure like any other, named by its cause in the metrics.
//! - After a failure the identity backs off (≈1 s, ×2, jitter 0.2, cap 150 s), never past
//!   the expiry of the certificate it still serves. Callers without a valid certificate
//!   get the last error until the retry time, so a CA outage is not hammered.
//! - Two fetches of one identity start at least [`MIN_FETCH_INTERVAL`] apart, whatever
//!   asks for them (renewal, retry, a connection), so no answer of the CA, however short
//!   lived its certificate, makes the manager loop.
//!
//! TLS configurations are cached with the certificate they were built from, so the data
//! path does not rebuild them per connection; a renewed certificate serves new connections
//! only, and starts with empty config caches.

use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, SystemTime};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use rustls::{ClientConfig, ServerConfig};
use tokio::sync::{watch, Notify};

use crate::ca::CertificateAuthority;
use crate::cert::{CertificateDump, WorkloadCertificate};
use crate::error::{human, IssueError, ManagerError};
use crate::issued;
use crate::spiffe::SpiffeId;
use crate::tls;

/// A source of "now" (injectable for tests).
pub type Clock = Arc<dyn Fn() -> SystemTime + Send + Sync>;

/// What [`Issuer::issue`] returns.
pub type IssueFuture<'a> =
    Pin<Box<dyn Future<Output = Result<WorkloadCertificate, IssueError>> + Send + 'a>>;

/// Something that mints workload certificates: the local [`CertificateAuthority`], or a
/// client of a remote CA.
pub trait Issuer: Send + Sync {
    /// A certificate for `id`, asked to be valid for `ttl` from `now`.
    fn issue<'a>(&'a self, id: &'a SpiffeId, ttl: Duration, now: SystemTime) -> IssueFuture<'a>;
}

impl Issuer for CertificateAuthority {
    fn issue<'a>(&'a self, id: &'a SpiffeId, ttl: Duration, now: SystemTime) -> IssueFuture<'a> {
        Box::pin(std::future::ready(
            self.issue_at(id, ttl, now).map_err(IssueError::from),
        ))
    }
}

/// Who is waiting for a certificate; decides the queue order when [`MAX_IN_FLIGHT`]
/// fetches are running.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Priority {
    /// Rotation of a certificate that is still valid.
    Background,
    /// A prefetch for a workload that arrived on this node.
    Warmup,
    /// A connection is waiting.
    RealTime,
}

/// Fetches running at once, node-wide (ztunnel's bound on concurrent CSRs).
pub const MAX_IN_FLIGHT: usize = 8;
/// First retry delay after a failed fetch.
const BACKOFF_START: Duration = Duration::from_secs(1);
/// Longest retry delay after failed fetches.
const BACKOFF_MAX: Duration = Duration::from_secs(150);
/// Each delay is moved by up to this fraction either way, so identities that failed
/// together do not retry together.
const JITTER: f64 = 0.2;
/// The renewal task wakes at least this often.
const MAX_IDLE: Duration = Duration::from_secs(3600);
/// The renewal task never loops faster than this, woken or not.
const MIN_WAIT: Duration = Duration::from_millis(250);
/// The least time between the starts of two fetches of one identity (below the shortest
/// jittered backoff, so it never changes the backoff schedule).
pub const MIN_FETCH_INTERVAL: Duration = Duration::from_millis(500);
/// Client configs cached per certificate (one per distinct expected-identity set).
const MAX_CLIENT_CONFIGS: usize = 256;

type Outcome = Result<Arc<WorkloadCertificate>, Arc<IssueError>>;
type QueueKey = (Reverse<Priority>, u64);

/// Fetches, caches and renews workload certificates.
pub struct CertManager {
    shared: Arc<Shared>,
}

struct Shared {
    issuer: Arc<dyn Issuer>,
    ttl: Duration,
    clock: Clock,
    state: Mutex<State>,
    /// Wakes the renewal task when due times may have moved (or the manager is gone).
    changed: Arc<Notify>,
    metrics: CertMetrics,
}

#[derive(Default)]
struct State {
    slots: HashMap<SpiffeId, Slot>,
    /// Fetches waiting for one of the [`MAX_IN_FLIGHT`] places, best first.
    queue: BTreeMap<QueueKey, Queued>,
    running: usize,
    next_seq: u64,
}

struct Queued {
    id: SpiffeId,
    tx: watch::Sender<Option<Outcome>>,
}

#[derive(Default)]
struct Slot {
    current: Option<Entry>,
    fetch: Option<InFlight>,
    backoff: Option<Backoff>,
    /// When the last fetch asked the issuer (or will, if it waits for its turn).
    last_start: Option<SystemTime>,
}

/// A fetch queued or running; callers join it through `rx`.
struct InFlight {
    seq: u64,
    priority: Priority,
    queued: bool,
    rx: watch::Receiver<Option<Outcome>>,
}

struct Backoff {
    retry_at: SystemTime,
    /// The un-jittered delay just used; the next one doubles it.
    base: Duration,
    error: Arc<IssueError>,
}

struct Entry {
    cert: Arc<WorkloadCertificate>,
    server: Option<Arc<ServerConfig>>,
    clients: HashMap<Vec<SpiffeId>, Arc<ClientConfig>>,
}

impl Entry {
    fn new(cert: Arc<WorkloadCertificate>) -> Entry {
        Entry {
            cert,
            server: None,
            clients: HashMap::new(),
        }
    }
}

impl Slot {
    /// A certificate that is still valid at `now`.
    fn valid(&self, now: SystemTime) -> Option<&Entry> {
        self.current.as_ref().filter(|e| !e.cert.is_expired_at(now))
    }

    /// When a background fetch should start; `None` while one is in flight.
    fn due_at(&self) -> Option<SystemTime> {
        if self.fetch.is_some() {
            return None;
        }
        let due = match (&self.backoff, &self.current) {
            (Some(b), _) => b.retry_at,
            (None, Some(e)) => e.cert.renew_at(),
            (None, None) => return None,
        };
        Some(self.earliest_start().map_or(due, |t| due.max(t)))
    }

    /// The earliest a new fetch may ask the issuer: [`MIN_FETCH_INTERVAL`] after the last.
    fn earliest_start(&self) -> Option<SystemTime> {
        self.last_start.map(|t| t + MIN_FETCH_INTERVAL)
    }
}

/// The delay after a failure, given the previous un-jittered one: doubling from
/// [`BACKOFF_START`], jittered by ±[`JITTER`] (`unit` in 0..1), never above [`BACKOFF_MAX`].
fn next_delay(previous: Option<Duration>, unit: f64) -> (Duration, Duration) {
    let base = previous.map_or(BACKOFF_START, |d| (d * 2).min(BACKOFF_MAX));
    let factor = 1.0 + JITTER * (2.0 * unit.clamp(0.0, 1.0) - 1.0);
    (base, base.mul_f64(factor).min(BACKOFF_MAX))
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Metrics of the certificate cache (see [`CertManager::register_metrics`]).
#[derive(Clone, Default)]
struct CertMetrics {
    expiry: Family<Vec<(String, String)>, Gauge>,
    failures: Family<Vec<(String, String)>, Counter>,
}

impl CertMetrics {
    fn identity_label(id: &SpiffeId) -> Vec<(String, String)> {
        vec![("identity".to_string(), id.to_string())]
    }

    fn set_expiry(&self, cert: &WorkloadCertificate) {
        let secs = cert
            .not_after
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
        self.expiry
            .get_or_create(&Self::identity_label(&cert.identity))
            .set(secs);
    }
}

impl CertManager {
    /// A manager minting certificates valid for `ttl` from the local `ca`.
    pub fn new(ca: Arc<CertificateAuthority>, ttl: Duration) -> Arc<Self> {
        Self::with_issuer(ca, ttl, Arc::new(SystemTime::now))
    }

    /// Like [`CertManager::new`] with any issuer and an injected clock.
    pub fn with_issuer(issuer: Arc<dyn Issuer>, ttl: Duration, clock: Clock) -> Arc<Self> {
        Arc::new(CertManager {
            shared: Arc::new(Shared {
                issuer,
                ttl,
                clock,
                state: Mutex::new(State::default()),
                changed: Arc::new(Notify::new()),
                metrics: CertMetrics::default(),
            }),
        })
    }

    /// The certificate lifetime requested for new certificates.
    pub fn ttl(&self) -> Duration {
        self.shared.ttl
    }

    /// Registers `ambit_certificate_expiration_timestamp_seconds{identity}` (the
    /// `not_after` of each cached certificate, as Unix seconds) and
    /// `ambit_certificate_fetch_failures_total{cause}`.
    pub fn register_metrics(&self, registry: &mut Registry) {
        let m = &self.shared.metrics;
        registry.register(
            "ambit_certificate_expiration_timestamp_seconds",
            "When each cached workload certificate expires (not_after), in seconds since the Unix epoch, by SPIFFE identity",
            m.expiry.clone(),
        );
        registry.register(
            "ambit_certificate_fetch_failures",
            "Workload certificate fetches that failed, by cause (refused, unreachable, channel, bad_chain, wrong_identity, expired, not_yet_valid, ca_leaf, does_not_chain, local_ca, abandoned)",
            m.failures.clone(),
        );
    }

    /// A valid certificate for `id`, waiting as a connection would ([`Priority::RealTime`]).
    pub async fn fetch(&self, id: &SpiffeId) -> Result<Arc<WorkloadCertificate>, ManagerError> {
        self.fetch_with(id, Priority::RealTime).await
    }

    /// A valid certificate for `id`: the cached one if still valid (starting its renewal
    /// if due), else the outcome of a fetch, joined if one is already in flight.
    pub async fn fetch_with(
        &self,
        id: &SpiffeId,
        priority: Priority,
    ) -> Result<Arc<WorkloadCertificate>, ManagerError> {
        let mut rx = match self.shared.lookup(id, priority) {
            Lookup::Ready(cert) => return Ok(cert),
            Lookup::Failed(e) => return Err(ManagerError::Issue(e)),
            Lookup::Wait(rx) => rx,
        };
        let outcome = match rx.wait_for(Option::is_some).await {
            Ok(v) => v.clone(),
            Err(_) => None,
        };
        outcome
            .unwrap_or_else(|| {
                Err(Arc::new(IssueError::Abandoned {
                    identity: id.to_string(),
                    reason: "the identity was forgotten while its fetch waited",
                }))
            })
            .map_err(ManagerError::Issue)
    }

    /// Starts fetching `id`'s certificate ([`Priority::Warmup`]) unless a valid one is
    /// cached or a fetch is in flight; returns at once. Call inside a tokio runtime.
    pub fn prefetch(&self, id: &SpiffeId) {
        drop(self.shared.lookup(id, Priority::Warmup));
    }

    /// The (cached) HBONE server config for `id`'s current certificate.
    pub async fn server_config(&self, id: &SpiffeId) -> Result<Arc<ServerConfig>, ManagerError> {
        let cert = self.fetch(id).await?;
        if let Some(config) = self
            .shared
            .with_current(&cert, |e| e.server.clone())
            .flatten()
        {
            return Ok(config);
        }
        // Built outside the lock: it parses the roots, and other identities must not wait.
        let config = tls::server_config(&cert)?;
        self.shared.with_current(&cert, |e| {
            e.server.get_or_insert_with(|| config.clone());
        });
        Ok(config)
    }

    /// The (cached) HBONE client config for `id`'s current certificate, accepting servers
    /// that prove one of `expected`.
    pub async fn client_config(
        &self,
        id: &SpiffeId,
        expected: &[SpiffeId],
    ) -> Result<Arc<ClientConfig>, ManagerError> {
        let cert = self.fetch(id).await?;
        if let Some(config) = self
            .shared
            .with_current(&cert, |e| e.clients.get(expected).cloned())
            .flatten()
        {
            return Ok(config);
        }
        let config = tls::client_config(&cert, expected)?;
        self.shared.with_current(&cert, |e| {
            if e.clients.len() >= MAX_CLIENT_CONFIGS {
                e.clients.clear();
            }
            e.clients.insert(expected.to_vec(), config.clone());
        });
        Ok(config)
    }

    /// Drops `id`'s certificate and stops renewing it (its last workload left this node).
    /// A queued fetch is cancelled; a running one finishes but is not cached.
    pub fn forget(&self, id: &SpiffeId) {
        let mut st = lock(&self.shared.state);
        if let Some(slot) = st.slots.remove(id) {
            if let Some(f) = slot.fetch.filter(|f| f.queued) {
                st.queue.remove(&(Reverse(f.priority), f.seq));
            }
        }
        drop(st);
        self.shared
            .metrics
            .expiry
            .remove(&CertMetrics::identity_label(id));
    }

    /// The cached certificate of `id` (valid or not) without fetching.
    pub fn cached(&self, id: &SpiffeId) -> Option<Arc<WorkloadCertificate>> {
        let st = lock(&self.shared.state);
        st.slots.get(id)?.current.as_ref().map(|e| e.cert.clone())
    }

    /// Every known identity as shown in `/config_dump`, sorted by identity: cached
    /// certificates as `Available`, others `Initializing` (first fetch running) or
    /// `Unavailable: <error>` (backing off).
    pub fn dump(&self) -> Vec<CertificateDump> {
        let st = lock(&self.shared.state);
        let mut out: Vec<CertificateDump> = st
            .slots
            .iter()
            .filter_map(|(id, slot)| match (&slot.current, &slot.backoff) {
                (Some(e), _) => Some(e.cert.dump()),
                (None, Some(b)) => Some(CertificateDump::pending(
                    id,
                    format!("Unavailable: {}", b.error),
                )),
                (None, None) => slot
                    .fetch
                    .as_ref()
                    .map(|_| CertificateDump::pending(id, "Initializing".into())),
            })
            .collect();
        drop(st);
        out.sort_by(|a, b| a.identity.cmp(&b.identity));
        out
    }

    /// Spawns a task starting the renewal of every cached certificate at its half life and
    /// the retries after failures. The task ends when the manager is dropped.
    pub fn spawn_renewal(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let weak: Weak<Shared> = Arc::downgrade(&self.shared);
        let changed = self.shared.changed.clone();
        tokio::spawn(async move {
            let mut last_pass: Option<tokio::time::Instant> = None;
            loop {
                // A wake-up (a fetch finished) does not make passes come faster than MIN_WAIT.
                if let Some(t) = last_pass {
                    tokio::time::sleep_until(t + MIN_WAIT).await;
                }
                last_pass = Some(tokio::time::Instant::now());
                let Some(shared) = weak.upgrade() else {
                    return;
                };
                // Only the fetch tasks and the manager keep `shared` alive; a manager
                // dropped meanwhile ends the loop at the next wake.
                if Arc::strong_count(&shared) == 1 {
                    return;
                }
                let notified = changed.notified();
                tokio::pin!(notified);
                // Register interest before looking, so a change in between is not missed.
                notified.as_mut().enable();
                let now = (shared.clock)();
                let wait = shared
                    .renew_due()
                    .map(|t| t.duration_since(now).unwrap_or(Duration::ZERO))
                    .unwrap_or(MAX_IDLE)
                    .clamp(MIN_WAIT, MAX_IDLE);
                drop(shared);
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = notified => {}
                }
            }
        })
    }

    /// Starts every fetch that is due (renewals at half life, retries after failures) in
    /// the background; returns when the next one will be due.
    pub fn renew_due(&self) -> Option<SystemTime> {
        self.shared.renew_due()
    }

    /// Waits until no fetch is queued or running (tests, orderly shutdown).
    pub async fn wait_idle(&self) {
        loop {
            let waiting: Vec<watch::Receiver<Option<Outcome>>> = {
                let st = lock(&self.shared.state);
                st.slots
                    .values()
                    .filter_map(|s| s.fetch.as_ref().map(|f| f.rx.clone()))
                    .collect()
            };
            if waiting.is_empty() && lock(&self.shared.state).running == 0 {
                return;
            }
            for mut rx in waiting {
                let _ = rx.wait_for(Option::is_some).await;
            }
            // A forgotten fetch still running holds a place: let it end.
            tokio::task::yield_now().await;
        }
    }

    #[cfg(test)]
    fn queued(&self) -> usize {
        lock(&self.shared.state).queue.len()
    }

    #[cfg(test)]
    fn fetch_priority(&self, id: &SpiffeId) -> Option<Priority> {
        let st = lock(&self.shared.state);
        st.slots.get(id)?.fetch.as_ref().map(|f| f.priority)
    }
}

enum Lookup {
    Ready(Arc<WorkloadCertificate>),
    Failed(Arc<IssueError>),
    Wait(watch::Receiver<Option<Outcome>>),
}

impl Shared {
    fn lookup(self: &Arc<Self>, id: &SpiffeId, priority: Priority) -> Lookup {
        let mut guard = lock(&self.state);
        let st: &mut State = &mut guard;
        let now = (self.clock)();
        let slot = st.slots.entry(id.clone()).or_default();
        if let Some(e) = slot.valid(now) {
            let cert = e.cert.clone();
            if slot.due_at().is_some_and(|t| now >= t) {
                self.start(st, id, Priority::Background);
            }
            return Lookup::Ready(cert);
        }
        if let Some(f) = slot.fetch.as_mut() {
            let rx = f.rx.clone();
            if priority > f.priority {
                let old = (Reverse(f.priority), f.seq);
                f.priority = priority;
                if f.queued {
                    if let Some(q) = st.queue.remove(&old) {
                        st.queue.insert((Reverse(priority), old.1), q);
                    }
                }
            }
            return Lookup::Wait(rx);
        }
        if let Some(b) = slot.backoff.as_ref().filter(|b| now < b.retry_at) {
            return Lookup::Failed(b.error.clone());
        }
        Lookup::Wait(self.start(st, id, priority))
    }

    /// Starts a fetch for `id` (whose slot exists and has none in flight), or queues it
    /// when [`MAX_IN_FLIGHT`] are running.
    fn start(
        self: &Arc<Self>,
        st: &mut State,
        id: &SpiffeId,
        priority: Priority,
    ) -> watch::Receiver<Option<Outcome>> {
        let seq = st.next_seq;
        st.next_seq += 1;
        let (tx, rx) = watch::channel(None);
        let queued = st.running >= MAX_IN_FLIGHT;
        if let Some(slot) = st.slots.get_mut(id) {
            slot.fetch = Some(InFlight {
                seq,
                priority,
                queued,
                rx: rx.clone(),
            });
        }
        if queued {
            st.queue
                .insert((Reverse(priority), seq), Queued { id: id.clone(), tx });
        } else {
            self.spawn_fetch(st, id.clone(), seq, tx);
        }
        rx
    }

    fn spawn_fetch(
        self: &Arc<Self>,
        st: &mut State,
        id: SpiffeId,
        seq: u64,
        tx: watch::Sender<Option<Outcome>>,
    ) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // Nothing can run the fetch: its waiters see it abandoned.
            tracing::error!(identity = %id, "certificate fetch outside a tokio runtime");
            if let Some(slot) = st.slots.get_mut(&id) {
                slot.fetch = None;
            }
            return;
        };
        // Background fetches are never due before their identity's earliest start; a
        // caller without a valid certificate may be, and then this fetch waits for it.
        let now = (self.clock)();
        let begin = st
            .slots
            .get(&id)
            .and_then(Slot::earliest_start)
            .map_or(now, |t| t.max(now));
        if let Some(slot) = st.slots.get_mut(&id) {
            slot.last_start = Some(begin);
        }
        let wait = begin.duration_since(now).unwrap_or(Duration::ZERO);
        st.running += 1;
        let mut done = FetchDone {
            shared: self.clone(),
            id,
            seq,
            tx: Some(tx),
        };
        runtime.spawn(async move {
            if !wait.is_zero() {
                tokio::time::sleep(wait).await;
            }
            let shared = &done.shared;
            // Not before `begin`, even on a clock that did not move while we slept.
            let now = (shared.clock)().max(begin);
            let result = shared.issuer.issue(&done.id, shared.ttl, now).await;
            let checked_at = (shared.clock)().max(now);
            let result =
                result.and_then(|cert| issued::check(&done.id, &cert, checked_at).map(|()| cert));
            done.finish(result);
        });
    }

    fn finish(
        self: &Arc<Self>,
        id: &SpiffeId,
        seq: u64,
        result: Result<WorkloadCertificate, IssueError>,
        tx: watch::Sender<Option<Outcome>>,
    ) {
        let outcome: Outcome = result.map(Arc::new).map_err(Arc::new);
        if let Err(e) = &outcome {
            warn_clock_skew(id, e);
        }
        let mut st = lock(&self.state);
        st.running = st.running.saturating_sub(1);
        let now = (self.clock)();
        let slot = st
            .slots
            .get_mut(id)
            .filter(|s| s.fetch.as_ref().is_some_and(|f| f.seq == seq));
        match (&outcome, slot) {
            (Ok(cert), Some(slot)) => {
                slot.fetch = None;
                slot.backoff = None;
                slot.current = Some(Entry::new(cert.clone()));
                self.metrics.set_expiry(cert);
                tracing::debug!(identity = %id, "workload certificate fetched");
            }
            (Err(error), Some(slot)) => {
                slot.fetch = None;
                let unit: f64 = rand::random();
                let (base, delay) = next_delay(slot.backoff.as_ref().map(|b| b.base), unit);
                let mut retry_at = now + delay;
                let valid = slot.valid(now).map(|e| e.cert.not_after);
                if let Some(not_after) = valid {
                    // The last chance to renew is before the certificate lapses.
                    retry_at = retry_at.min(not_after);
                    tracing::warn!(identity = %id, %error, ?delay, "fetching a workload certificate failed; the current one serves until it expires");
                } else {
                    tracing::warn!(identity = %id, %error, ?delay, "fetching a workload certificate failed");
                }
                slot.backoff = Some(Backoff {
                    retry_at,
                    base,
                    error: error.clone(),
                });
            }
            // Forgotten meanwhile: the waiters get the answer, the cache does not.
            (_, None) => {}
        }
        if let Err(error) = &outcome {
            self.metrics
                .failures
                .get_or_create(&vec![("cause".to_string(), error.cause().to_string())])
                .inc();
        }
        tx.send_replace(Some(outcome));
        // A place is free: start the best queued fetch still wanted.
        while st.running < MAX_IN_FLIGHT {
            let Some((_, q)) = st.queue.pop_first() else {
                break;
            };
            let Some(next_seq) = st
                .slots
                .get_mut(&q.id)
                .and_then(|s| s.fetch.as_mut())
                .map(|f| {
                    f.queued = false;
                    f.seq
                })
            else {
                continue;
            };
            self.spawn_fetch(&mut st, q.id, next_seq, q.tx);
        }
        drop(st);
        self.changed.notify_one();
    }

    fn renew_due(self: &Arc<Self>) -> Option<SystemTime> {
        let mut st = lock(&self.state);
        let now = (self.clock)();
        let due: Vec<SpiffeId> = st
            .slots
            .iter()
            .filter(|(_, s)| s.due_at().is_some_and(|t| now >= t))
            .map(|(id, _)| id.clone())
            .collect();
        for id in &due {
            self.start(&mut st, id, Priority::Background);
        }
        st.slots.values().filter_map(Slot::due_at).min()
    }

    /// Runs `f` on the cache entry of `cert` if it is still its identity's current one.
    fn with_current<R>(
        &self,
        cert: &Arc<WorkloadCertificate>,
        f: impl FnOnce(&mut Entry) -> R,
    ) -> Option<R> {
        let mut st = lock(&self.state);
        let entry = st.slots.get_mut(&cert.identity)?.current.as_mut()?;
        Arc::ptr_eq(&entry.cert, cert).then(|| f(entry))
    }
}

/// A leaf outside its validity by our clock may mean our clock is wrong: say so apart,
/// with the amount, for whoever reads the node's logs.
fn warn_clock_skew(id: &SpiffeId, error: &IssueError) {
    match error {
        IssueError::Expired { by, .. } => tracing::warn!(
            identity = %id,
            skew_seconds = by.as_secs(),
            "the node clock looks skewed: it is {} past the end of the certificate the CA just returned (ahead of the CA's clock, or the CA's is wrong); check the node's time synchronisation",
            human(*by)
        ),
        IssueError::NotYetValid { by, .. } => tracing::warn!(
            identity = %id,
            skew_seconds = by.as_secs(),
            "the node clock looks skewed: it is {} before the start of the certificate the CA just returned (behind the CA's clock, or the CA's is wrong); check the node's time synchronisation",
            human(*by)
        ),
        _ => {}
    }
}

/// Completes a fetch exactly once: with its result, or as abandoned if the task is
/// dropped first (runtime shutdown, a panicking issuer), so its place is never leaked.
struct FetchDone {
    shared: Arc<Shared>,
    id: SpiffeId,
    seq: u64,
    tx: Option<watch::Sender<Option<Outcome>>>,
}

impl FetchDone {
    fn finish(&mut self, result: Result<WorkloadCertificate, IssueError>) {
        if let Some(tx) = self.tx.take() {
            self.shared.finish(&self.id, self.seq, result, tx);
        }
    }
}

impl Drop for FetchDone {
    fn drop(&mut self) {
        let identity = self.id.to_string();
        self.finish(Err(IssueError::Abandoned {
            identity,
            reason: "the fetch task ended without an answer",
        }));
    }
}

impl Drop for CertManager {
    fn drop(&mut self) {
        // Lets the renewal task see that it is no longer needed.
        self.shared.changed.notify_one();
    }
}

impl std::fmt::Debug for CertManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = lock(&self.shared.state);
        f.debug_struct("CertManager")
            .field("ttl", &self.shared.ttl)
            .field("identities", &st.slots.len())
            .field("running", &st.running)
            .field("queued", &st.queue.len())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests;
