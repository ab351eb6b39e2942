//! Per-identity certificate cache for the node proxy, with renewal at half life.
//!
//! Each identity has its own slot and lock, so at most one certificate is minted per
//! identity at a time while different identities mint in parallel. TLS configurations are
//! cached with the certificate they were built from, so the data path does not rebuild
//! them per connection; a renewed certificate starts with empty config caches.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, SystemTime};

use rustls::{ClientConfig, ServerConfig};
use tokio::sync::Notify;

use crate::ca::CertificateAuthority;
use crate::cert::{CertificateDump, WorkloadCertificate};
use crate::error::{CaError, ManagerError};
use crate::spiffe::SpiffeId;
use crate::tls;

/// A source of "now" (injectable for tests).
pub type Clock = Arc<dyn Fn() -> SystemTime + Send + Sync>;

/// Something that mints workload certificates. The local [`CertificateAuthority`] is one.
pub trait Issuer: Send + Sync {
    /// A certificate for `id` valid for `ttl` from `now`.
    fn issue_at(
        &self,
        id: &SpiffeId,
        ttl: Duration,
        now: SystemTime,
    ) -> Result<WorkloadCertificate, CaError>;
}

impl Issuer for CertificateAuthority {
    fn issue_at(
        &self,
        id: &SpiffeId,
        ttl: Duration,
        now: SystemTime,
    ) -> Result<WorkloadCertificate, CaError> {
        CertificateAuthority::issue_at(self, id, ttl, now)
    }
}

/// First retry delay after a failed renewal.
const BACKOFF_START: Duration = Duration::from_secs(1);
/// Longest retry delay after failed renewals.
const BACKOFF_MAX: Duration = Duration::from_secs(150);
/// The renewal task wakes at least this often.
const MAX_IDLE: Duration = Duration::from_secs(3600);
/// The renewal task never loops faster than this.
const MIN_WAIT: Duration = Duration::from_millis(250);
/// Client configs cached per certificate (one per distinct expected-identity set).
const MAX_CLIENT_CONFIGS: usize = 256;

/// Mints, caches and renews workload certificates.
pub struct CertManager {
    issuer: Arc<dyn Issuer>,
    ttl: Duration,
    clock: Clock,
    slots: Mutex<HashMap<SpiffeId, Arc<Slot>>>,
    changed: Arc<Notify>,
}

#[derive(Default)]
struct Slot {
    entry: Mutex<Option<Entry>>,
}

struct Entry {
    cert: Arc<WorkloadCertificate>,
    server: Option<Arc<ServerConfig>>,
    clients: HashMap<Vec<SpiffeId>, Arc<ClientConfig>>,
    /// After a failed renewal: when to try again, and the next delay.
    retry: Option<(SystemTime, Duration)>,
}

impl Entry {
    fn new(cert: WorkloadCertificate) -> Entry {
        Entry {
            cert: Arc::new(cert),
            server: None,
            clients: HashMap::new(),
            retry: None,
        }
    }

    /// Schedules the next attempt after a failure; returns the delay used.
    fn back_off(&mut self, now: SystemTime) -> Duration {
        let delay = self.retry.map_or(BACKOFF_START, |(_, d)| d);
        // Never later than the expiry: the last chance to renew is before the cert lapses.
        let retry_at = (now + delay).min(self.cert.not_after.max(now));
        self.retry = Some((retry_at, (delay * 2).min(BACKOFF_MAX)));
        delay
    }

    /// When the renewal task should look at this entry next.
    fn due_at(&self) -> SystemTime {
        match self.retry {
            Some((at, _)) => at,
            None => self.cert.renew_at(),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl CertManager {
    /// A manager minting certificates valid for `ttl` from `ca`.
    pub fn new(ca: Arc<CertificateAuthority>, ttl: Duration) -> Arc<Self> {
        Self::with_issuer(ca, ttl, Arc::new(SystemTime::now))
    }

    /// Like [`CertManager::new`] with any issuer and an injected clock.
    pub fn with_issuer(issuer: Arc<dyn Issuer>, ttl: Duration, clock: Clock) -> Arc<Self> {
        Arc::new(CertManager {
            issuer,
            ttl,
            clock,
            slots: Mutex::new(HashMap::new()),
            changed: Arc::new(Notify::new()),
        })
    }

    /// The certificate lifetime requested for new certificates.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The cached certificate if it is before its renewal time, else a newly minted one.
    /// When minting fails but the cached certificate is still valid, the cached one is kept.
    pub fn fetch(&self, id: &SpiffeId) -> Result<Arc<WorkloadCertificate>, CaError> {
        self.with_entry(id, |e| Ok::<_, CaError>(e.cert.clone()))
    }

    /// The (cached) HBONE server config for `id`'s current certificate.
    pub fn server_config(&self, id: &SpiffeId) -> Result<Arc<ServerConfig>, ManagerError> {
        self.with_entry(id, |e| {
            if let Some(config) = &e.server {
                return Ok(config.clone());
            }
            let config = tls::server_config(&e.cert)?;
            e.server = Some(config.clone());
            Ok(config)
        })
    }

    /// The (cached) HBONE client config for `id`'s current certificate, accepting servers
    /// that prove one of `expected`.
    pub fn client_config(
        &self,
        id: &SpiffeId,
        expected: &[SpiffeId],
    ) -> Result<Arc<ClientConfig>, ManagerError> {
        self.with_entry(id, |e| {
            if let Some(config) = e.clients.get(expected) {
                return Ok(config.clone());
            }
            let config = tls::client_config(&e.cert, expected)?;
            if e.clients.len() >= MAX_CLIENT_CONFIGS {
                e.clients.clear();
            }
            e.clients.insert(expected.to_vec(), config.clone());
            Ok(config)
        })
    }

    /// Drops `id`'s certificate (its last workload left this node).
    pub fn forget(&self, id: &SpiffeId) {
        lock(&self.slots).remove(id);
    }

    /// The cached certificate of `id` without minting.
    pub fn cached(&self, id: &SpiffeId) -> Option<Arc<WorkloadCertificate>> {
        let slot = lock(&self.slots).get(id).cloned()?;
        let entry = lock(&slot.entry);
        entry.as_ref().map(|e| e.cert.clone())
    }

    /// Every cached certificate as shown in `/config_dump`, sorted by identity.
    pub fn dump(&self) -> Vec<CertificateDump> {
        let mut certs: Vec<Arc<WorkloadCertificate>> = self
            .slots()
            .into_iter()
            .filter_map(|(_, slot)| lock(&slot.entry).as_ref().map(|e| e.cert.clone()))
            .collect();
        certs.sort_by(|a, b| a.identity.cmp(&b.identity));
        certs.iter().map(|c| c.dump()).collect()
    }

    /// Spawns a task renewing every cached certificate at its half life (failed renewals
    /// are retried with exponential backoff, the old certificate kept while valid). The
    /// task ends when the manager is dropped.
    pub fn spawn_renewal(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let weak: Weak<Self> = Arc::downgrade(self);
        let changed = self.changed.clone();
        tokio::spawn(async move {
            loop {
                let notified = changed.notified();
                tokio::pin!(notified);
                // Register interest before looking, so an insert in between is not missed.
                notified.as_mut().enable();
                let wait = match weak.upgrade() {
                    Some(this) => {
                        let now = (this.clock)();
                        this.renew_due()
                            .map(|t| t.duration_since(now).unwrap_or(Duration::ZERO))
                            .unwrap_or(MAX_IDLE)
                            .clamp(MIN_WAIT, MAX_IDLE)
                    }
                    None => return,
                };
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = notified => {}
                }
            }
        })
    }

    /// Renews every certificate that is due; returns when the next one will be due.
    pub fn renew_due(&self) -> Option<SystemTime> {
        let mut next: Option<SystemTime> = None;
        for (id, slot) in self.slots() {
            let mut guard = lock(&slot.entry);
            let Some(entry) = guard.as_mut() else {
                continue;
            };
            let now = (self.clock)();
            if now >= entry.due_at() {
                match self.issuer.issue_at(&id, self.ttl, now) {
                    Ok(cert) => {
                        tracing::debug!(identity = %id, "renewed workload certificate");
                        *entry = Entry::new(cert);
                    }
                    Err(error) => {
                        let delay = entry.back_off(now);
                        tracing::warn!(identity = %id, %error, ?delay, "renewing workload certificate failed; keeping the current one while it is valid");
                    }
                }
            }
            let due = entry.due_at();
            next = Some(next.map_or(due, |n| n.min(due)));
        }
        next
    }

    fn slots(&self) -> Vec<(SpiffeId, Arc<Slot>)> {
        lock(&self.slots)
            .iter()
            .map(|(id, s)| (id.clone(), s.clone()))
            .collect()
    }

    /// Runs `f` on `id`'s entry after making sure it holds a certificate before its
    /// renewal time (minting under the slot's lock).
    fn with_entry<R, E: From<CaError>>(
        &self,
        id: &SpiffeId,
        f: impl FnOnce(&mut Entry) -> Result<R, E>,
    ) -> Result<R, E> {
        let slot = lock(&self.slots).entry(id.clone()).or_default().clone();
        let mut guard = lock(&slot.entry);
        let now = (self.clock)();
        if let Some(entry) = guard.as_mut() {
            // Before the renewal time, or backing off after a failure while still valid.
            if now < entry.due_at() && !entry.cert.is_expired_at(now) {
                return f(entry);
            }
        }
        match self.issuer.issue_at(id, self.ttl, now) {
            Ok(cert) => {
                if guard.is_none() {
                    self.changed.notify_one();
                }
                f(guard.insert(Entry::new(cert)))
            }
            Err(error) => match guard.as_mut() {
                Some(entry) if !entry.cert.is_expired_at(now) => {
                    let delay = entry.back_off(now);
                    tracing::warn!(identity = %id, %error, ?delay, "minting a workload certificate failed; using the current one");
                    f(entry)
                }
                _ => Err(error.into()),
            },
        }
    }
}

impl std::fmt::Debug for CertManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertManager")
            .field("ttl", &self.ttl)
            .field("identities", &lock(&self.slots).len())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{exchange, id};

    /// A clock tests move by hand.
    fn manual_clock() -> (Clock, Arc<Mutex<SystemTime>>) {
        let now = Arc::new(Mutex::new(SystemTime::now()));
        let handle = now.clone();
        (Arc::new(move || *lock(&handle)), now)
    }

    fn advance(now: &Mutex<SystemTime>, by: Duration) {
        *lock(now) += by;
    }

    const HOUR: Duration = Duration::from_secs(3600);

    fn manager(ttl: Duration) -> (Arc<CertManager>, Arc<Mutex<SystemTime>>) {
        let ca = Arc::new(CertificateAuthority::ephemeral("cluster.local").unwrap());
        let (clock, now) = manual_clock();
        (CertManager::with_issuer(ca, ttl, clock), now)
    }

    #[test]
    fn fetch_caches_until_half_life() {
        let (m, now) = manager(HOUR);
        let a = id("spiffe://cluster.local/ns/a/sa/a");
        let first = m.fetch(&a).unwrap();
        assert!(Arc::ptr_eq(&first, &m.fetch(&a).unwrap()));
        assert_eq!(first.identity, a);
        // Just before the renewal time: still cached.
        let until_renew = first.renew_at().duration_since(*lock(&now)).unwrap();
        advance(&now, until_renew - Duration::from_secs(1));
        assert!(Arc::ptr_eq(&first, &m.fetch(&a).unwrap()));
        // At the renewal time: a new certificate.
        advance(&now, Duration::from_secs(1));
        let second = m.fetch(&a).unwrap();
        assert!(!Arc::ptr_eq(&first, &second));
        assert_ne!(first.chain[0], second.chain[0]);
        assert!(second.not_after > first.not_after);
        // Different identities have different certificates.
        let b = m.fetch(&id("spiffe://cluster.local/ns/b/sa/b")).unwrap();
        assert_ne!(b.chain[0], second.chain[0]);
    }

    #[test]
    fn renew_due_replaces_certificates_at_half_life() {
        let (m, now) = manager(HOUR);
        assert_eq!(m.renew_due(), None);
        let a = id("spiffe://cluster.local/ns/a/sa/a");
        let first = m.fetch(&a).unwrap();
        let server = m.server_config(&a).unwrap();
        assert_eq!(m.renew_due(), Some(first.renew_at()));
        assert!(Arc::ptr_eq(&m.cached(&a).unwrap(), &first));
        advance(&now, HOUR / 2);
        let next = m.renew_due().unwrap();
        let renewed = m.cached(&a).unwrap();
        assert!(!Arc::ptr_eq(&renewed, &first), "renewed without a fetch");
        assert_eq!(next, renewed.renew_at());
        assert!(!Arc::ptr_eq(&server, &m.server_config(&a).unwrap()));
    }

    #[test]
    fn configs_are_cached_per_certificate() {
        let (m, _) = manager(HOUR);
        let a = id("spiffe://cluster.local/ns/a/sa/a");
        let b = id("spiffe://cluster.local/ns/b/sa/b");
        let s1 = m.server_config(&a).unwrap();
        assert!(Arc::ptr_eq(&s1, &m.server_config(&a).unwrap()));
        let c1 = m.client_config(&a, std::slice::from_ref(&b)).unwrap();
        assert!(Arc::ptr_eq(
            &c1,
            &m.client_config(&a, std::slice::from_ref(&b)).unwrap()
        ));
        let c2 = m.client_config(&a, &[b.clone(), a.clone()]).unwrap();
        assert!(!Arc::ptr_eq(&c1, &c2));
        assert!(matches!(
            m.client_config(&a, &[]),
            Err(ManagerError::Tls(crate::TlsError::NoExpectedIdentities))
        ));
    }

    #[tokio::test]
    async fn manager_configs_interoperate() {
        let ca = Arc::new(CertificateAuthority::ephemeral("cluster.local").unwrap());
        let m = CertManager::new(ca, HOUR);
        let server = id("spiffe://cluster.local/ns/s/sa/server");
        let client = id("spiffe://cluster.local/ns/c/sa/client");
        let out = exchange(
            m.server_config(&server).unwrap(),
            m.client_config(&client, std::slice::from_ref(&server))
                .unwrap(),
        )
        .await
        .unwrap();
        assert_eq!(out.client_id, Some(client));
        assert_eq!(out.server_id, Some(server));
    }

    /// Fails on demand.
    struct Flaky {
        ca: CertificateAuthority,
        failing: std::sync::atomic::AtomicBool,
        calls: std::sync::atomic::AtomicUsize,
    }

    impl Issuer for Flaky {
        fn issue_at(
            &self,
            id: &SpiffeId,
            ttl: Duration,
            now: SystemTime,
        ) -> Result<WorkloadCertificate, CaError> {
            use std::sync::atomic::Ordering::SeqCst;
            self.calls.fetch_add(1, SeqCst);
            if self.failing.load(SeqCst) {
                Err(CaError::InvalidTtl { ttl })
            } else {
                self.ca.issue_at(id, ttl, now)
            }
        }
    }

    #[test]
    fn failed_renewal_keeps_the_valid_certificate_and_backs_off() {
        use std::sync::atomic::Ordering::SeqCst;
        let flaky = Arc::new(Flaky {
            ca: CertificateAuthority::ephemeral("cluster.local").unwrap(),
            failing: false.into(),
            calls: 0.into(),
        });
        let (clock, now) = manual_clock();
        let m = CertManager::with_issuer(flaky.clone(), HOUR, clock);
        let a = id("spiffe://cluster.local/ns/a/sa/a");
        let first = m.fetch(&a).unwrap();
        flaky.failing.store(true, SeqCst);
        advance(&now, HOUR / 2 + Duration::from_secs(1));
        // Due but the issuer fails: the still valid certificate is kept, and the issuer
        // is not asked again before the retry time.
        let calls = flaky.calls.load(SeqCst);
        assert!(Arc::ptr_eq(&m.fetch(&a).unwrap(), &first));
        assert!(Arc::ptr_eq(&m.fetch(&a).unwrap(), &first));
        assert_eq!(flaky.calls.load(SeqCst), calls + 1);
        let t = *lock(&now);
        // Retries after 1 s, then 2 s, 4 s...
        assert_eq!(m.renew_due(), Some(t + Duration::from_secs(1)));
        let calls = flaky.calls.load(SeqCst);
        assert_eq!(
            m.renew_due(),
            Some(t + Duration::from_secs(1)),
            "not before the retry time"
        );
        assert_eq!(flaky.calls.load(SeqCst), calls);
        advance(&now, Duration::from_secs(1));
        assert_eq!(m.renew_due(), Some(t + Duration::from_secs(3)));
        advance(&now, Duration::from_secs(2));
        assert_eq!(m.renew_due(), Some(t + Duration::from_secs(7)));
        assert!(Arc::ptr_eq(&m.cached(&a).unwrap(), &first));
        // The issuer recovers: the next retry renews and clears the backoff.
        flaky.failing.store(false, SeqCst);
        advance(&now, Duration::from_secs(4));
        let next = m.renew_due().unwrap();
        let renewed = m.cached(&a).unwrap();
        assert!(!Arc::ptr_eq(&renewed, &first));
        assert_eq!(next, renewed.renew_at());
        // Once the old certificate has expired, a failing issuer is an error.
        flaky.failing.store(true, SeqCst);
        advance(&now, 2 * HOUR);
        assert!(m.fetch(&a).is_err());
    }

    #[test]
    fn dump_is_sorted_and_forget_removes() {
        let (m, _) = manager(HOUR);
        for s in [
            "spiffe://cluster.local/ns/z/sa/z",
            "spiffe://cluster.local/ns/a/sa/b",
            "spiffe://cluster.local/ns/a/sa/a",
        ] {
            m.fetch(&id(s)).unwrap();
        }
        let ids: Vec<String> = m.dump().into_iter().map(|d| d.identity).collect();
        assert_eq!(
            ids,
            [
                "spiffe://cluster.local/ns/a/sa/a",
                "spiffe://cluster.local/ns/a/sa/b",
                "spiffe://cluster.local/ns/z/sa/z"
            ]
        );
        m.forget(&id("spiffe://cluster.local/ns/a/sa/b"));
        assert_eq!(m.dump().len(), 2);
        assert!(m.cached(&id("spiffe://cluster.local/ns/a/sa/b")).is_none());
    }

    #[test]
    fn one_mint_per_identity_under_concurrency() {
        let (m, _) = manager(HOUR);
        let a = id("spiffe://cluster.local/ns/a/sa/a");
        let certs: Vec<Arc<WorkloadCertificate>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8).map(|_| s.spawn(|| m.fetch(&a).unwrap())).collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(certs.windows(2).all(|w| Arc::ptr_eq(&w[0], &w[1])));
    }

    #[tokio::test]
    async fn renewal_task_renews_in_real_time() {
        let ca = Arc::new(CertificateAuthority::ephemeral("cluster.local").unwrap());
        // 4 s lifetime, 2 s backdate: renewal due within about a second of issue.
        let m = CertManager::new(ca, Duration::from_secs(4));
        let task = m.spawn_renewal();
        let a = id("spiffe://cluster.local/ns/a/sa/a");
        let first = m.fetch(&a).unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(8);
        loop {
            let current = m.cached(&a).unwrap();
            if !Arc::ptr_eq(&current, &first) {
                assert!(current.not_after >= first.not_after);
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "not renewed in time"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // The task ends once the manager is gone.
        drop(m);
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("renewal task did not stop")
            .unwrap();
    }
}
