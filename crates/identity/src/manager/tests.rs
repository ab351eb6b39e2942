use std::sync::atomic::{AtomicBool, Ordering::SeqCst};

use super::*;
use crate::testutil::rogue_ca::{Defect, RogueCa};
use crate::testutil::{exchange, id, rogue_certificate};

/// A clock tests move by hand.
fn manual_clock() -> (Clock, Arc<Mutex<SystemTime>>) {
    let now = Arc::new(Mutex::new(SystemTime::now()));
    let handle = now.clone();
    (Arc::new(move || *lock(&handle)), now)
}

fn advance(now: &Mutex<SystemTime>, by: Duration) {
    *lock(now) += by;
}

fn at(now: &Mutex<SystemTime>, t: SystemTime) {
    *lock(now) = t;
}

const HOUR: Duration = Duration::from_secs(3600);
/// Failure guard only: no test relies on how long anything takes.
const GUARD: Duration = Duration::from_secs(20);

/// A local CA that fails on demand, records every request in order, and (when gated)
/// answers only once a permit is added.
struct Fake {
    ca: CertificateAuthority,
    failing: AtomicBool,
    calls: Mutex<Vec<SpiffeId>>,
    /// The `now` each request was made at.
    times: Mutex<Vec<SystemTime>>,
    gate: Option<tokio::sync::Semaphore>,
}

impl Fake {
    fn new(gated: bool) -> Arc<Fake> {
        Arc::new(Fake {
            ca: CertificateAuthority::ephemeral("cluster.local").unwrap(),
            failing: false.into(),
            calls: Mutex::new(Vec::new()),
            times: Mutex::new(Vec::new()),
            gate: gated.then(|| tokio::sync::Semaphore::new(0)),
        })
    }

    fn calls(&self) -> Vec<SpiffeId> {
        lock(&self.calls).clone()
    }

    fn release(&self, n: usize) {
        self.gate.as_ref().unwrap().add_permits(n);
    }
}

impl Issuer for Fake {
    fn issue<'a>(&'a self, id: &'a SpiffeId, ttl: Duration, now: SystemTime) -> IssueFuture<'a> {
        Box::pin(async move {
            lock(&self.calls).push(id.clone());
            lock(&self.times).push(now);
            if let Some(gate) = &self.gate {
                gate.acquire().await.unwrap().forget();
            }
            if self.failing.load(SeqCst) {
                Err(IssueError::Unreachable {
                    address: "https://ca.test:15012".into(),
                    reason: "connection refused".into(),
                })
            } else {
                Ok(self.ca.issue_at(id, ttl, now)?)
            }
        })
    }
}

fn fake_manager(gated: bool) -> (Arc<CertManager>, Arc<Fake>, Arc<Mutex<SystemTime>>) {
    let fake = Fake::new(gated);
    let (clock, now) = manual_clock();
    (
        CertManager::with_issuer(fake.clone(), HOUR, clock),
        fake,
        now,
    )
}

/// Polls `cond` until true (yielding to the fetch tasks), failing after [`GUARD`].
async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    tokio::time::timeout(GUARD, async {
        while !cond() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out waiting for {what}"));
}

fn a() -> SpiffeId {
    id("spiffe://cluster.local/ns/a/sa/a")
}

#[tokio::test]
async fn fetch_caches_and_rotates_at_half_life() {
    let (m, fake, now) = fake_manager(false);
    let first = m.fetch(&a()).await.unwrap();
    assert!(Arc::ptr_eq(&first, &m.fetch(&a()).await.unwrap()));
    assert_eq!(first.identity, a());
    assert_eq!(fake.calls().len(), 1);
    assert_eq!(m.renew_due(), Some(first.renew_at()));
    // The renewal time is half way through the validity period.
    let half = first.not_before
        + first
            .not_after
            .duration_since(first.not_before)
            .unwrap()
            .div_f64(2.0);
    assert_eq!(first.renew_at(), half);
    // Just before: nothing starts.
    at(&now, first.renew_at() - Duration::from_secs(1));
    assert_eq!(m.renew_due(), Some(first.renew_at()));
    m.wait_idle().await;
    assert_eq!(fake.calls().len(), 1);
    // At the renewal time the (still valid) certificate keeps serving while a
    // background fetch replaces it.
    at(&now, first.renew_at());
    assert!(Arc::ptr_eq(&first, &m.fetch(&a()).await.unwrap()));
    m.wait_idle().await;
    assert_eq!(fake.calls().len(), 2);
    let second = m.fetch(&a()).await.unwrap();
    assert!(!Arc::ptr_eq(&first, &second));
    assert_ne!(first.chain[0], second.chain[0]);
    assert!(second.not_after > first.not_after);
    assert_eq!(m.renew_due(), Some(second.renew_at()));
}

#[tokio::test]
async fn renew_due_rotates_without_a_fetch_and_configs_follow() {
    let (m, _fake, now) = fake_manager(false);
    assert_eq!(m.renew_due(), None);
    let first = m.fetch(&a()).await.unwrap();
    let server = m.server_config(&a()).await.unwrap();
    assert!(Arc::ptr_eq(&server, &m.server_config(&a()).await.unwrap()));
    advance(&now, HOUR / 2);
    assert_eq!(m.renew_due(), None, "the renewal is in flight");
    m.wait_idle().await;
    let renewed = m.cached(&a()).unwrap();
    assert!(!Arc::ptr_eq(&renewed, &first), "renewed without a fetch");
    assert_eq!(m.renew_due(), Some(renewed.renew_at()));
    // New connections get a config built from the new certificate.
    assert!(!Arc::ptr_eq(&server, &m.server_config(&a()).await.unwrap()));
}

#[tokio::test]
async fn configs_are_cached_per_certificate() {
    let (m, _, _) = fake_manager(false);
    let b = id("spiffe://cluster.local/ns/b/sa/b");
    let c1 = m
        .client_config(&a(), std::slice::from_ref(&b))
        .await
        .unwrap();
    assert!(Arc::ptr_eq(
        &c1,
        &m.client_config(&a(), std::slice::from_ref(&b))
            .await
            .unwrap()
    ));
    let c2 = m.client_config(&a(), &[b.clone(), a()]).await.unwrap();
    assert!(!Arc::ptr_eq(&c1, &c2));
    let err = m.client_config(&a(), &[]).await.unwrap_err();
    assert!(
        matches!(&err, ManagerError::Tls(e) if matches!(**e, crate::TlsError::NoExpectedIdentities)),
        "{err:?}"
    );
}

#[tokio::test]
async fn manager_configs_interoperate() {
    let ca = Arc::new(CertificateAuthority::ephemeral("cluster.local").unwrap());
    let m = CertManager::new(ca, HOUR);
    let server = id("spiffe://cluster.local/ns/s/sa/server");
    let client = id("spiffe://cluster.local/ns/c/sa/client");
    let out = exchange(
        m.server_config(&server).await.unwrap(),
        m.client_config(&client, std::slice::from_ref(&server))
            .await
            .unwrap(),
    )
    .await
    .unwrap();
    assert_eq!(out.client_id, Some(client));
    assert_eq!(out.server_id, Some(server));
}

#[test]
fn backoff_doubles_with_jitter_up_to_the_cap() {
    let mut previous = None;
    let mut bases = Vec::new();
    for i in 0..12 {
        let unit = [0.0, 0.5, 1.0][i % 3];
        let (base, delay) = next_delay(previous, unit);
        // Jitter moves the delay by at most 20% either way, never above the cap.
        assert!(
            delay >= base.mul_f64(0.8) && delay <= base.mul_f64(1.2),
            "{delay:?} for {base:?}"
        );
        assert!(delay <= BACKOFF_MAX);
        bases.push(base.as_secs());
        previous = Some(base);
    }
    assert_eq!(bases, [1, 2, 4, 8, 16, 32, 64, 128, 150, 150, 150, 150]);
    assert_eq!(next_delay(None, 0.0).1, Duration::from_millis(800));
    assert_eq!(next_delay(None, 1.0).1, Duration::from_millis(1200));
    assert_eq!(next_delay(Some(BACKOFF_MAX), 1.0).1, BACKOFF_MAX);
}

#[tokio::test]
async fn failures_back_off_per_identity_and_cap() {
    let (m, fake, now) = fake_manager(false);
    fake.failing.store(true, SeqCst);
    let err = m.fetch(&a()).await.unwrap_err();
    assert!(err.to_string().contains("unreachable"), "{err}");
    // Until the retry time callers get the last error without asking the CA again.
    let t0 = *lock(&now);
    let retry = m.renew_due().unwrap();
    let first = retry.duration_since(t0).unwrap();
    assert!(first >= Duration::from_millis(800) && first <= Duration::from_millis(1200));
    assert!(m.fetch(&a()).await.is_err());
    assert_eq!(fake.calls().len(), 1);
    // Each retry at its time fails again and doubles the delay, up to 150 s.
    let mut delays = Vec::new();
    let mut next = retry;
    for _ in 0..10 {
        at(&now, next);
        assert_eq!(m.renew_due(), None, "the retry is in flight");
        m.wait_idle().await;
        let after = m.renew_due().unwrap();
        delays.push(after.duration_since(next).unwrap());
        next = after;
    }
    assert_eq!(fake.calls().len(), 11);
    for (d, base) in delays
        .iter()
        .zip([2u64, 4, 8, 16, 32, 64, 128, 150, 150, 150])
    {
        let base = Duration::from_secs(base);
        assert!(
            *d >= base.mul_f64(0.8) && *d <= base.mul_f64(1.2).min(BACKOFF_MAX),
            "{delays:?}"
        );
    }
    // Another identity is not held back by a's backoff.
    let b = id("spiffe://cluster.local/ns/b/sa/b");
    fake.failing.store(false, SeqCst);
    m.fetch(&b).await.unwrap();
    // Recovery clears the backoff.
    at(&now, next);
    m.renew_due();
    m.wait_idle().await;
    let cert = m.fetch(&a()).await.unwrap();
    assert_eq!(
        m.renew_due(),
        Some(cert.renew_at().min(m.cached(&b).unwrap().renew_at()))
    );
}

#[tokio::test]
async fn a_valid_certificate_keeps_serving_when_renewals_fail() {
    let (m, fake, now) = fake_manager(false);
    let first = m.fetch(&a()).await.unwrap();
    fake.failing.store(true, SeqCst);
    at(&now, first.renew_at());
    assert!(Arc::ptr_eq(&m.fetch(&a()).await.unwrap(), &first));
    m.wait_idle().await;
    assert_eq!(fake.calls().len(), 2, "one renewal attempt");
    // The failure is not seen by connections: the valid certificate still serves, and
    // the CA is not asked again before the retry time.
    assert!(Arc::ptr_eq(&m.fetch(&a()).await.unwrap(), &first));
    assert!(m.server_config(&a()).await.is_ok());
    assert_eq!(fake.calls().len(), 2);
    // Close to expiry the retry is at the expiry, not later.
    at(&now, first.not_after - Duration::from_millis(500));
    m.renew_due();
    m.wait_idle().await;
    assert_eq!(m.renew_due(), Some(first.not_after));
    assert!(Arc::ptr_eq(&m.fetch(&a()).await.unwrap(), &first));
    // Once expired, callers get the error (a fetch at the retry time fails again).
    at(&now, first.not_after);
    let err = m.fetch(&a()).await.unwrap_err();
    assert!(
        matches!(&err, ManagerError::Issue(e) if e.cause() == "unreachable"),
        "{err:?}"
    );
    // The dump still shows the (expired) certificate; metrics count the failures.
    assert_eq!(m.dump().len(), 1);
    let mut registry = Registry::default();
    m.register_metrics(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(
        text.contains("ambit_certificate_fetch_failures_total{cause=\"unreachable\"} 3"),
        "{text}"
    );
    let expiry = first
        .not_after
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(
        text.contains(&format!(
            "ambit_certificate_expiration_timestamp_seconds{{identity=\"{}\"}} {expiry}",
            a()
        )),
        "{text}"
    );
}

#[tokio::test]
async fn concurrent_callers_share_one_request() {
    let (m, fake, _) = fake_manager(true);
    let waiters: Vec<_> = (0..10)
        .map(|_| {
            let m = m.clone();
            tokio::spawn(async move { m.fetch(&a()).await })
        })
        .collect();
    until("the request to start", || !fake.calls().is_empty()).await;
    let pf = m.clone();
    pf.prefetch(&a());
    fake.release(100);
    let mut certs = Vec::new();
    for w in waiters {
        certs.push(
            tokio::time::timeout(GUARD, w)
                .await
                .unwrap()
                .unwrap()
                .unwrap(),
        );
    }
    assert!(certs.windows(2).all(|w| Arc::ptr_eq(&w[0], &w[1])));
    assert_eq!(fake.calls().len(), 1);
}

#[tokio::test]
async fn queued_fetches_start_by_priority() {
    let (m, fake, _) = fake_manager(true);
    // Fill every place with a blocked fetch.
    let mut tasks = Vec::new();
    for i in 0..MAX_IN_FLIGHT {
        let m = m.clone();
        let id = id(&format!("spiffe://cluster.local/ns/busy/sa/s{i}"));
        tasks.push(tokio::spawn(async move { m.fetch(&id).await.map(|_| ()) }));
    }
    until("all places taken", || fake.calls().len() == MAX_IN_FLIGHT).await;
    // Queue a rotation-priority, a prefetch and a connection, worst first.
    let bg = id("spiffe://cluster.local/ns/q/sa/background");
    let wu = id("spiffe://cluster.local/ns/q/sa/warmup");
    let rt = id("spiffe://cluster.local/ns/q/sa/realtime");
    {
        let (m, bg) = (m.clone(), bg.clone());
        tasks.push(tokio::spawn(async move {
            m.fetch_with(&bg, Priority::Background).await.map(|_| ())
        }));
    }
    until("background queued", || m.queued() == 1).await;
    m.prefetch(&wu);
    assert_eq!(m.queued(), 2);
    {
        let (m, rt) = (m.clone(), rt.clone());
        tasks.push(tokio::spawn(async move { m.fetch(&rt).await.map(|_| ()) }));
    }
    until("realtime queued", || m.queued() == 3).await;
    assert_eq!(
        fake.calls().len(),
        MAX_IN_FLIGHT,
        "nothing beyond the limit started"
    );
    // Free places one at a time: the queue starts best first.
    for started in 1..=3 {
        fake.release(1);
        until("a queued fetch to start", || {
            fake.calls().len() == MAX_IN_FLIGHT + started
        })
        .await;
    }
    assert_eq!(fake.calls()[MAX_IN_FLIGHT..], [rt, wu.clone(), bg]);
    fake.release(100);
    for t in tasks {
        tokio::time::timeout(GUARD, t)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
    }
    m.wait_idle().await;
    assert!(m.cached(&wu).is_some(), "the prefetch was cached");
}

#[tokio::test]
async fn a_waiting_connection_raises_a_queued_prefetch() {
    let (m, fake, _) = fake_manager(true);
    for i in 0..MAX_IN_FLIGHT {
        m.prefetch(&id(&format!("spiffe://cluster.local/ns/busy/sa/s{i}")));
    }
    until("all places taken", || fake.calls().len() == MAX_IN_FLIGHT).await;
    let bg = id("spiffe://cluster.local/ns/q/sa/bg");
    let wu = id("spiffe://cluster.local/ns/q/sa/wu");
    let (m2, bg2) = (m.clone(), bg.clone());
    tokio::spawn(async move { m2.fetch_with(&bg2, Priority::Background).await });
    until("queued", || m.queued() == 1).await;
    m.prefetch(&wu);
    // A connection now waits for bg's certificate: it goes ahead of the prefetch.
    let (m3, bg3) = (m.clone(), bg.clone());
    let conn = tokio::spawn(async move { m3.fetch(&bg3).await });
    until("the connection joined", || {
        m.fetch_priority(&bg) == Some(Priority::RealTime)
    })
    .await;
    assert_eq!(m.queued(), 2);
    fake.release(1);
    until("one queued start", || {
        fake.calls().len() == MAX_IN_FLIGHT + 1
    })
    .await;
    assert_eq!(fake.calls()[MAX_IN_FLIGHT], bg);
    fake.release(100);
    tokio::time::timeout(GUARD, conn)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn forget_drops_the_certificate_and_a_queued_fetch() {
    let (m, fake, _) = fake_manager(true);
    fake.release(1);
    m.fetch(&a()).await.unwrap();
    let mut registry = Registry::default();
    m.register_metrics(&mut registry);
    m.forget(&a());
    assert!(m.cached(&a()).is_none());
    assert!(m.dump().is_empty());
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(!text.contains("identity=\""), "{text}");
    // A queued fetch is cancelled: its waiter hears so, the cache stays empty.
    for i in 0..MAX_IN_FLIGHT {
        m.prefetch(&id(&format!("spiffe://cluster.local/ns/busy/sa/s{i}")));
    }
    let (m2, a2) = (m.clone(), a());
    let waiter = tokio::spawn(async move { m2.fetch(&a2).await });
    until("queued", || m.queued() == 1).await;
    m.forget(&a());
    assert_eq!(m.queued(), 0);
    let err = tokio::time::timeout(GUARD, waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap_err();
    assert!(
        matches!(&err, ManagerError::Issue(e) if e.cause() == "abandoned"),
        "{err:?}"
    );
    fake.release(100);
    m.wait_idle().await;
    assert!(m.cached(&a()).is_none());
    assert_eq!(m.dump().len(), MAX_IN_FLIGHT);
}

#[tokio::test]
async fn dump_is_sorted_and_shows_pending_identities() {
    let (m, fake, _) = fake_manager(false);
    for s in [
        "spiffe://cluster.local/ns/z/sa/z",
        "spiffe://cluster.local/ns/a/sa/b",
        "spiffe://cluster.local/ns/a/sa/a",
    ] {
        m.fetch(&id(s)).await.unwrap();
    }
    fake.failing.store(true, SeqCst);
    let _ = m.fetch(&id("spiffe://cluster.local/ns/f/sa/f")).await;
    let dump = m.dump();
    let ids: Vec<&str> = dump.iter().map(|d| d.identity.as_str()).collect();
    assert_eq!(
        ids,
        [
            "spiffe://cluster.local/ns/a/sa/a",
            "spiffe://cluster.local/ns/a/sa/b",
            "spiffe://cluster.local/ns/f/sa/f",
            "spiffe://cluster.local/ns/z/sa/z"
        ]
    );
    assert_eq!(dump[0].state, "Available");
    assert!(
        dump[2].state.starts_with("Unavailable: "),
        "{}",
        dump[2].state
    );
    assert!(dump[2].cert_chain.is_empty());
}

/// Answers with a certificate for another identity.
struct Liar(CertificateAuthority);

impl Issuer for Liar {
    fn issue<'a>(&'a self, _: &'a SpiffeId, ttl: Duration, now: SystemTime) -> IssueFuture<'a> {
        let other = id("spiffe://cluster.local/ns/other/sa/other");
        Box::pin(std::future::ready(
            self.0.issue_at(&other, ttl, now).map_err(IssueError::from),
        ))
    }
}

#[tokio::test]
async fn a_certificate_for_another_identity_is_never_cached() {
    let liar = Arc::new(Liar(
        CertificateAuthority::ephemeral("cluster.local").unwrap(),
    ));
    let m = CertManager::with_issuer(liar, HOUR, Arc::new(SystemTime::now));
    let err = m.fetch(&a()).await.unwrap_err();
    assert!(
        matches!(&err, ManagerError::Issue(e) if e.cause() == "wrong_identity"),
        "{err:?}"
    );
    assert!(m.cached(&a()).is_none());
}

#[tokio::test]
async fn renewal_task_renews_in_real_time() {
    let ca = Arc::new(CertificateAuthority::ephemeral("cluster.local").unwrap());
    // 4 s lifetime, 2 s backdate: renewal due within about a second of issue.
    let m = CertManager::new(ca, Duration::from_secs(4));
    let task = m.spawn_renewal();
    let first = m.fetch(&a()).await.unwrap();
    let deadline = tokio::time::Instant::now() + GUARD;
    loop {
        let current = m.cached(&a()).unwrap();
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
    tokio::time::timeout(GUARD, task)
        .await
        .expect("renewal task did not stop")
        .unwrap();
}

/// A CA whose leaves have the defect of the moment; records when it was asked, and stops
/// answering after `cap` requests (so a manager that loops ends the test instead of
/// spinning it).
struct RogueIssuer {
    ca: RogueCa,
    defect: Mutex<Defect>,
    times: Mutex<Vec<SystemTime>>,
    cap: usize,
}

impl RogueIssuer {
    fn new(defect: Defect) -> Arc<RogueIssuer> {
        Arc::new(RogueIssuer {
            ca: RogueCa::new(),
            defect: Mutex::new(defect),
            times: Mutex::new(Vec::new()),
            cap: 100,
        })
    }

    fn calls(&self) -> usize {
        lock(&self.times).len()
    }

    fn set(&self, defect: Defect) {
        *lock(&self.defect) = defect;
    }
}

impl Issuer for RogueIssuer {
    fn issue<'a>(&'a self, id: &'a SpiffeId, _: Duration, now: SystemTime) -> IssueFuture<'a> {
        Box::pin(async move {
            let n = {
                let mut times = lock(&self.times);
                times.push(now);
                times.len()
            };
            if n > self.cap {
                std::future::pending::<()>().await;
            }
            let defect = *lock(&self.defect);
            Ok(rogue_certificate(&self.ca, id, defect, now))
        })
    }
}

/// `ambit_certificate_fetch_failures_total` by cause, as `/metrics` shows it.
fn failures(m: &CertManager) -> Vec<(String, u64)> {
    let mut registry = Registry::default();
    m.register_metrics(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    let mut out: Vec<(String, u64)> = text
        .lines()
        .filter_map(|l| l.strip_prefix("ambit_certificate_fetch_failures_total{cause=\""))
        .filter_map(|l| {
            let (cause, n) = l.split_once("\"} ")?;
            Some((cause.to_string(), n.parse().ok()?))
        })
        .collect();
    out.sort();
    out
}

fn cause_of(err: &ManagerError) -> &'static str {
    match err {
        ManagerError::Issue(e) => e.cause(),
        other => panic!("not an issue error: {other:?}"),
    }
}

const BAD: [(Defect, &str); 6] = [
    (Defect::Expired, "expired"),
    (Defect::NotYetValid, "not_yet_valid"),
    (Defect::CaTrue, "ca_leaf"),
    (Defect::KeyCertSign, "ca_leaf"),
    (Defect::ForeignRoot, "does_not_chain"),
    (Defect::ExpiredIntermediate, "does_not_chain"),
];

#[tokio::test]
async fn each_bad_leaf_is_refused_and_retried_on_the_backoff_schedule() {
    assert_eq!(BAD.map(|(d, _)| d), Defect::ALL_BAD);
    for (defect, cause) in BAD {
        let rogue = RogueIssuer::new(defect);
        let (clock, now) = manual_clock();
        let m = CertManager::with_issuer(rogue.clone(), HOUR, clock);
        let err = m.fetch(&a()).await.unwrap_err();
        assert_eq!(cause_of(&err), cause, "{defect:?}: {err}");
        // Never cached, never shown as available.
        assert!(m.cached(&a()).is_none(), "{defect:?}");
        let dump = m.dump();
        assert_eq!(dump.len(), 1);
        assert_eq!(dump[0].state, format!("Unavailable: {err}"), "{defect:?}");
        // Until the retry time callers get the error without a request.
        let t0 = *lock(&now);
        let first = m.renew_due().unwrap().duration_since(t0).unwrap();
        assert!(
            first >= Duration::from_millis(800) && first <= Duration::from_millis(1200),
            "{defect:?}: {first:?}"
        );
        advance(&now, first - Duration::from_millis(1));
        assert_eq!(cause_of(&m.fetch(&a()).await.unwrap_err()), cause);
        m.prefetch(&a());
        m.wait_idle().await;
        assert_eq!(rogue.calls(), 1, "{defect:?}");
        // Each retry is refused again and doubles the delay up to 150 s.
        let mut next = t0 + first;
        let mut delays = Vec::new();
        for _ in 0..10 {
            at(&now, next);
            assert_eq!(m.renew_due(), None, "{defect:?}: the retry is in flight");
            m.wait_idle().await;
            let after = m.renew_due().unwrap();
            delays.push(after.duration_since(next).unwrap());
            next = after;
        }
        assert_eq!(rogue.calls(), 11, "{defect:?}");
        for (d, base) in delays
            .iter()
            .zip([2u64, 4, 8, 16, 32, 64, 128, 150, 150, 150])
        {
            let base = Duration::from_secs(base);
            assert!(
                *d >= base.mul_f64(0.8) && *d <= base.mul_f64(1.2).min(BACKOFF_MAX),
                "{defect:?}: {delays:?}"
            );
        }
        assert_eq!(failures(&m), [(cause.to_string(), 11)], "{defect:?}");
        assert!(m.cached(&a()).is_none(), "{defect:?}");
        // A good answer at the next retry is cached and clears the backoff.
        rogue.set(Defect::None);
        at(&now, next);
        m.renew_due();
        m.wait_idle().await;
        let cert = m.fetch(&a()).await.unwrap();
        assert_eq!(m.renew_due(), Some(cert.renew_at()), "{defect:?}");
    }
}

#[tokio::test]
async fn a_bad_renewal_leaves_the_valid_certificate_serving() {
    for (defect, cause) in BAD {
        let rogue = RogueIssuer::new(Defect::None);
        let (clock, now) = manual_clock();
        let m = CertManager::with_issuer(rogue.clone(), HOUR, clock);
        let first = m.fetch(&a()).await.unwrap();
        rogue.set(defect);
        at(&now, first.renew_at());
        assert!(Arc::ptr_eq(&m.fetch(&a()).await.unwrap(), &first));
        m.wait_idle().await;
        assert_eq!(rogue.calls(), 2, "{defect:?}: one renewal");
        assert_eq!(failures(&m), [(cause.to_string(), 1)], "{defect:?}");
        // The refused leaf replaced nothing: the first certificate serves and shows.
        assert!(Arc::ptr_eq(&m.fetch(&a()).await.unwrap(), &first));
        assert!(Arc::ptr_eq(&m.cached(&a()).unwrap(), &first));
        assert_eq!(m.dump()[0].state, "Available");
        assert_eq!(m.dump()[0].cert_chain[0], first.dump().cert_chain[0]);
        let retry = m.renew_due().unwrap();
        let delay = retry.duration_since(first.renew_at()).unwrap();
        assert!(
            delay >= Duration::from_millis(800) && delay <= Duration::from_millis(1200),
            "{defect:?}: {delay:?}"
        );
        assert_eq!(rogue.calls(), 2, "{defect:?}");
    }
}

#[tokio::test]
async fn renewals_of_one_identity_are_spaced_by_the_minimum_interval() {
    let rogue = RogueIssuer::new(Defect::ShortLived);
    let (clock, now) = manual_clock();
    // A whole second, so that the leaf's whole-second validity is as asked.
    let t0 = SystemTime::UNIX_EPOCH
        + Duration::from_secs(
            lock(&now)
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap()
                .as_secs(),
        );
    at(&now, t0);
    let m = CertManager::with_issuer(rogue.clone(), HOUR, clock);
    let cert = m.fetch(&a()).await.unwrap();
    // Valid [t0-1, t0+1]: its renewal is due at once, but not before the interval.
    assert!(cert.renew_at() <= t0, "{:?}", cert.renew_at());
    assert_eq!(m.renew_due(), Some(t0 + MIN_FETCH_INTERVAL));
    at(&now, t0 + MIN_FETCH_INTERVAL - Duration::from_millis(1));
    assert_eq!(m.renew_due(), Some(t0 + MIN_FETCH_INTERVAL));
    assert!(Arc::ptr_eq(&m.fetch(&a()).await.unwrap(), &cert));
    m.wait_idle().await;
    assert_eq!(rogue.calls(), 1);
    at(&now, t0 + MIN_FETCH_INTERVAL);
    assert_eq!(m.renew_due(), None, "the renewal is in flight");
    m.wait_idle().await;
    assert_eq!(rogue.calls(), 2);
}

#[tokio::test]
async fn a_caller_without_a_certificate_does_not_bring_a_fetch_forward() {
    let fake = Fake::new(false);
    let (clock, now) = manual_clock();
    // One-second lifetimes: a certificate can lapse before the interval is over.
    let m = CertManager::with_issuer(fake.clone(), Duration::from_secs(1), clock);
    let whole = lock(&now)
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(whole) + Duration::from_millis(900);
    at(&now, t0);
    let first = m.fetch(&a()).await.unwrap();
    // Whole seconds: valid until t0 + 0.1 s.
    assert_eq!(first.not_after, t0 + Duration::from_millis(100));
    at(&now, first.not_after);
    let second = m.fetch(&a()).await.unwrap();
    assert!(!Arc::ptr_eq(&first, &second));
    let times = lock(&fake.times).clone();
    assert_eq!(times.len(), 2);
    assert!(
        times[1].duration_since(times[0]).unwrap() >= MIN_FETCH_INTERVAL,
        "{times:?}"
    );
}

/// A clock that follows tokio's (paused) time from now on.
fn tokio_clock() -> Clock {
    let start = tokio::time::Instant::now();
    let base = SystemTime::now();
    Arc::new(move || base + start.elapsed())
}

/// Runs the renewal task for ten virtual seconds while a connection asks for `a`'s
/// certificate every 10 ms; returns the issuer's request count.
async fn ten_seconds_of_demand(m: &Arc<CertManager>, rogue: &RogueIssuer) -> usize {
    let task = m.spawn_renewal();
    let asker = {
        let m = m.clone();
        tokio::spawn(async move {
            loop {
                let _ = tokio::time::timeout(Duration::from_millis(10), m.fetch(&a())).await;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_secs(10)).await;
    asker.abort();
    task.abort();
    rogue.calls()
}

#[tokio::test(start_paused = true)]
async fn the_renewal_task_retries_a_refused_leaf_on_the_backoff_schedule() {
    for (defect, cause) in BAD {
        let rogue = RogueIssuer::new(defect);
        let m = CertManager::with_issuer(rogue.clone(), HOUR, tokio_clock());
        let calls = ten_seconds_of_demand(&m, &rogue).await;
        // At 0 s, then after 0.8-1.2 s, 1.6-2.4 s more, 3.2-4.8 s more (by 8.4 s at the
        // latest); the next is at least 6.4 s later, past 10 s.
        assert_eq!(calls, 4, "{defect:?}");
        assert_eq!(failures(&m), [(cause.to_string(), 4)], "{defect:?}");
        assert!(m.cached(&a()).is_none());
    }
}

#[tokio::test(start_paused = true)]
async fn a_wake_up_does_not_bring_a_renewal_before_the_minimum_interval() {
    // Every answer is due for renewal at once.
    let rogue = RogueIssuer::new(Defect::ShortLived);
    let m = CertManager::with_issuer(rogue.clone(), HOUR, tokio_clock());
    let calls = ten_seconds_of_demand(&m, &rogue).await;
    let most = (Duration::from_secs(10).as_millis() / MIN_FETCH_INTERVAL.as_millis()) as usize + 1;
    assert!(calls >= 2 && calls <= most, "{calls} requests in 10 s");
    assert!(failures(&m).is_empty(), "{:?}", failures(&m));
    // Consecutive requests are at least the interval apart.
    let times = lock(&rogue.times).clone();
    for w in times.windows(2) {
        assert!(
            w[1].duration_since(w[0]).unwrap() >= MIN_FETCH_INTERVAL,
            "{times:?}"
        );
    }
}
