//! A DestinationRule's traffic policy at run time, per destination (service and port):
//! the load balancer's state (round robin's turn, requests in flight per endpoint, the
//! consistent-hash table of the current endpoints), outlier detection, and the connection
//! pool's places. The decisions are `ambit_traffic_policy`'s; this module holds their
//! state between requests and is shared by the worker threads.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use ambit_manifests::WaypointDestinationRule;
use ambit_state::Picked;
use ambit_traffic_policy::hash::{hash_of, HashTable, Member};
use ambit_traffic_policy::outlier::{Detector, Outcome, Recorded};
use ambit_traffic_policy::pick::{least_request, RoundRobin};
use ambit_traffic_policy::{CookieKey, HashKey, LoadBalancer, PortPolicy};
use http::header::{HeaderMap, HeaderValue, COOKIE};
use rand::Rng;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::destination_rules::{DestinationRules, Viewer};
use crate::front::Fronted;
use crate::tls_origin::{TlsOrigin, TlsSetupError};

/// The balancers of the destinations, each looked up once per set of rules (not per
/// request): a destination's entry says which rule applies to it under a set, and is
/// looked up again only when the set changes. A rule that reads the same after a change
/// keeps its balancer, and with it its outlier ejections and its turn.
#[derive(Debug, Default)]
pub struct Balancers {
    by_destination: Mutex<HashMap<DestinationKey, Resolved>>,
}

/// A Service (namespace and hostname) and port.
type DestinationKey = (ambit_state::Name, ambit_state::Name, u16);

#[derive(Debug, Clone)]
struct Resolved {
    /// The [`DestinationRules::generation`] it was looked up in.
    generation: u64,
    balancer: Option<Arc<Balancer>>,
}

/// Destinations held at most: past it, the entries of earlier sets are dropped.
const MAX_DESTINATIONS: usize = 65_536;

impl Balancers {
    /// The balancer of `target`, if a rule applies to it.
    pub fn for_target(
        &self,
        rules: &DestinationRules,
        viewer: Viewer<'_>,
        target: &Fronted,
    ) -> Option<Arc<Balancer>> {
        let Fronted::Service { service, port, .. } = target else {
            return None;
        };
        if rules.is_empty() {
            return None;
        }
        let key = (service.namespace.clone(), service.hostname.clone(), *port);
        let mut map = self
            .by_destination
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let held = map.get(&key);
        if let Some(r) = held.filter(|r| r.generation == rules.generation()) {
            return r.balancer.clone();
        }
        let balancer = match (
            rules.for_service(service, viewer),
            held.and_then(|r| r.balancer.clone()),
        ) {
            (Some(rule), Some(b)) if *b.rule == **rule => Some(b),
            (Some(rule), _) => Some(Arc::new(Balancer::new(
                rule.clone(),
                *port,
                service.hostname.to_string(),
            ))),
            (None, _) => None,
        };
        if map.len() >= MAX_DESTINATIONS {
            map.retain(|_, r| r.generation == rules.generation());
        }
        map.insert(
            key,
            Resolved {
                generation: rules.generation(),
                balancer: balancer.clone(),
            },
        );
        balancer
    }

    /// Forgets the balancers whose rule `rules` no longer holds (by value: a rule read
    /// again the same keeps its balancer).
    pub fn retain_rules(&self, rules: &DestinationRules) {
        let mut map = self
            .by_destination
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        map.retain(|_, r| {
            r.balancer
                .as_ref()
                .is_some_and(|b| rules.rules().iter().any(|rule| **rule == *b.rule))
        });
    }
}

/// One destination's state.
#[derive(Debug)]
pub struct Balancer {
    rule: Arc<WaypointDestinationRule>,
    pub policy: PortPolicy,
    /// The service's hostname, for metrics.
    pub host: String,
    round_robin: RoundRobin,
    in_flight: Mutex<HashMap<SocketAddr, u32>>,
    outlier: Option<Mutex<Detector<SocketAddr>>>,
    /// The consistent-hash table and the fingerprint of the endpoints it was built from.
    table: Mutex<Option<(u64, Arc<HashTable>)>>,
    /// The endpoints at the last pick (the pool outlier detection's share is of).
    pool_size: AtomicUsize,
    pool: Option<Pool>,
    retries_in_flight: Arc<AtomicU32>,
    /// The rule's TLS origination, built once (or why it cannot be).
    tls: Option<Result<Arc<TlsOrigin>, TlsSetupError>>,
}

#[derive(Debug)]
struct Pool {
    places: Arc<Semaphore>,
    waiting: AtomicU32,
    max_waiting: u32,
}

/// The pool had no place and no room to wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Overflow;

impl Balancer {
    fn new(rule: Arc<WaypointDestinationRule>, port: u16, host: String) -> Balancer {
        let policy = rule.policy.for_port(port).clone();
        let pool = (!policy.connection_pool.is_unlimited()).then(|| Pool {
            places: Arc::new(Semaphore::new(
                (policy.connection_pool.max_in_flight() as usize).min(Semaphore::MAX_PERMITS),
            )),
            waiting: AtomicU32::new(0),
            max_waiting: policy.connection_pool.max_pending_requests,
        });
        let tls = policy.tls.as_ref().map(|t| {
            let origin = TlsOrigin::build(format!("{} port {port}", rule.key()), t);
            if let Err(e) = &origin {
                tracing::error!("{e}: requests to endpoints outside the mesh are not sent");
            }
            origin.map(Arc::new)
        });
        Balancer {
            tls,
            outlier: policy.outlier.map(|o| Mutex::new(Detector::new(o))),
            pool,
            policy,
            rule,
            host,
            round_robin: RoundRobin::default(),
            in_flight: Mutex::new(HashMap::new()),
            table: Mutex::new(None),
            pool_size: AtomicUsize::new(0),
            retries_in_flight: Arc::new(AtomicU32::new(0)),
        }
    }

    /// The rule's TLS origination for endpoints outside the mesh, if it asks for one.
    pub fn tls(&self) -> Result<Option<&Arc<TlsOrigin>>, &TlsSetupError> {
        match &self.tls {
            None => Ok(None),
            Some(Ok(origin)) => Ok(Some(origin)),
            Some(Err(e)) => Err(e),
        }
    }

    /// A place in the connection pool: at once, after waiting among the
    /// `http1MaxPendingRequests`, or [`Overflow`]. `None` when the pool has no limit.
    pub async fn admit(&self) -> Result<Option<OwnedSemaphorePermit>, Overflow> {
        let Some(pool) = &self.pool else {
            return Ok(None);
        };
        if let Ok(place) = pool.places.clone().try_acquire_owned() {
            return Ok(Some(place));
        }
        if pool.waiting.fetch_add(1, Ordering::AcqRel) >= pool.max_waiting {
            pool.waiting.fetch_sub(1, Ordering::AcqRel);
            return Err(Overflow);
        }
        // Counted as waiting until this returns or is dropped (a request that gives up).
        struct Waiting<'a>(&'a AtomicU32);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::AcqRel);
            }
        }
        let _waiting = Waiting(&pool.waiting);
        match pool.places.clone().acquire_owned().await {
            Ok(place) => Ok(Some(place)),
            Err(_) => Err(Overflow),
        }
    }

    /// A place in the connection pool now, for an opaque tunnel (which never waits, as
    /// Envoy's TCP proxy does not). `None` when the pool has no limit.
    pub fn try_place(&self) -> Result<Option<OwnedSemaphorePermit>, Overflow> {
        match &self.pool {
            None => Ok(None),
            Some(pool) => pool
                .places
                .clone()
                .try_acquire_owned()
                .map(Some)
                .map_err(|_| Overflow),
        }
    }

    /// A retry's place under `maxRetries`; `None` when as many are in flight.
    pub fn retry_place(&self) -> Option<RetryPlace> {
        let max = self.policy.connection_pool.max_retries;
        let counter = self.retries_in_flight.clone();
        counter
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()
            .map(|_| RetryPlace(counter))
    }

    /// Chooses among `candidates` (the eligible endpoints, in a stable order): ejected
    /// endpoints left out (unless too few would be left), then the rule's balancer;
    /// `tried` avoided where another is left, except under consistent hashing (a retry
    /// goes to the same endpoint, as Envoy's does). `hash`: the request's, if the
    /// balancer hashes and the request has the key.
    pub fn pick(
        &self,
        mut candidates: Vec<Picked>,
        tried: &[SocketAddr],
        hash: Option<u64>,
        now: Instant,
        rng: &mut impl Rng,
    ) -> Option<Picked> {
        self.pool_size.store(candidates.len(), Ordering::Relaxed);
        if let Some(outlier) = &self.outlier {
            let mut d = outlier.lock().unwrap_or_else(|p| p.into_inner());
            if d.len() > candidates.len() {
                let present: Vec<SocketAddr> = candidates.iter().map(target).collect();
                d.retain(|a| present.contains(a));
            }
            if d.ejected(now) > 0 && !d.below_min_health(candidates.len(), now) {
                let available: Vec<Picked> = candidates
                    .iter()
                    .filter(|c| !d.is_ejected(&target(c), now))
                    .cloned()
                    .collect();
                if !available.is_empty() {
                    candidates = available;
                }
            }
        }
        if candidates.is_empty() {
            return None;
        }
        if let (LoadBalancer::ConsistentHash(ch), Some(hash)) = (&self.policy.load_balancer, hash) {
            let table = self.table_for(&candidates, ch.algorithm)?;
            let index = table.lookup(hash);
            return candidates.into_iter().nth(index);
        }
        if candidates.len() > 1 && !tried.is_empty() {
            let fresh: Vec<Picked> = candidates
                .iter()
                .filter(|c| !tried.contains(&target(c)))
                .cloned()
                .collect();
            if !fresh.is_empty() {
                candidates = fresh;
            }
        }
        let n = candidates.len();
        let index = match &self.policy.load_balancer {
            LoadBalancer::RoundRobin => self.round_robin.next(n),
            LoadBalancer::LeastRequest => {
                let in_flight = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
                let of = |i: usize| in_flight.get(&target(&candidates[i])).copied().unwrap_or(0);
                // Two different endpoints (when there are two): drawn without
                // replacement, the busier one is never chosen against itself.
                let first = rng.gen_range(0..n);
                let second = match n {
                    1 => first,
                    _ => (first + 1 + rng.gen_range(0..n - 1)) % n,
                };
                least_request(n, of, |i| candidates[i].workload.capacity, (first, second))
            }
            // RANDOM, and a hashing balancer for a request without the key.
            _ => ambit_state::weighted_index(&candidates, rng).unwrap_or(0),
        };
        candidates.into_iter().nth(index)
    }

    fn table_for(
        &self,
        candidates: &[Picked],
        algorithm: ambit_traffic_policy::HashAlgorithm,
    ) -> Option<Arc<HashTable>> {
        // Which endpoints, in which order, with which weights: checked on every request,
        // so a few multiplications per endpoint, no text.
        let mut fingerprint = 0xcbf2_9ce4_8422_2325u64;
        for c in candidates {
            let ip = match c.ip {
                IpAddr::V4(v4) => u64::from(u32::from(v4)),
                IpAddr::V6(v6) => {
                    let bits = u128::from(v6);
                    (bits as u64) ^ ((bits >> 64) as u64)
                }
            };
            for word in [ip, u64::from(c.port) << 32 | u64::from(c.workload.capacity)] {
                fingerprint = (fingerprint ^ word).wrapping_mul(0x0000_0100_0000_01b3);
            }
        }
        let mut cached = self.table.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((f, t)) = cached.as_ref() {
            if *f == fingerprint {
                return Some(t.clone());
            }
        }
        let members: Vec<Member> = candidates
            .iter()
            .map(|c| Member {
                name: target(c).to_string(),
                weight: c.workload.capacity,
            })
            .collect();
        let table = Arc::new(HashTable::build(algorithm, &members)?);
        *cached = Some((fingerprint, table.clone()));
        Some(table)
    }

    /// Counts a request to `endpoint` in flight until the guard is dropped.
    pub fn start(self: &Arc<Self>, endpoint: SocketAddr) -> InFlight {
        *self
            .in_flight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(endpoint)
            .or_default() += 1;
        InFlight {
            balancer: self.clone(),
            endpoint,
        }
    }

    /// Records what a try at `endpoint` came to; an ejection it caused is returned.
    pub fn record(&self, endpoint: SocketAddr, outcome: Outcome, now: Instant) -> Recorded {
        let Some(outlier) = &self.outlier else {
            return Recorded::Nothing;
        };
        let pool = self.pool_size.load(Ordering::Relaxed).max(1);
        outlier
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .record(&endpoint, outcome, pool, now)
    }

    /// [`Balancer::record`], an ejection logged and counted in `metrics`.
    pub fn report(
        &self,
        endpoint: SocketAddr,
        outcome: Outcome,
        metrics: &crate::metrics::Metrics,
    ) {
        if let Recorded::Ejected(e) = self.record(endpoint, outcome, Instant::now()) {
            tracing::info!(%endpoint, destination = %self.host, reason = e.reason.as_str(), duration = ?e.duration, "endpoint ejected");
            metrics.ejection(&self.host, e.reason.as_str());
        }
    }

    /// What a request is hashed on under this rule ([`request_hash`]); nothing when the
    /// rule does not hash.
    pub fn request_hash(
        &self,
        headers: &HeaderMap,
        query: Option<&str>,
        source: IpAddr,
    ) -> HashInput {
        match &self.policy.load_balancer {
            LoadBalancer::ConsistentHash(ch) => {
                request_hash(&ch.key, headers, query, source, rand::random)
            }
            _ => HashInput {
                hash: None,
                set_cookie: None,
            },
        }
    }

    /// An opaque tunnel's hash: its source address, the only key a tunnel has.
    pub fn tunnel_hash(&self, source: IpAddr) -> Option<u64> {
        match &self.policy.load_balancer {
            LoadBalancer::ConsistentHash(ch) if ch.key == HashKey::SourceIp => {
                Some(source_hash(source))
            }
            _ => None,
        }
    }

    /// Endpoints ejected now.
    pub fn ejected(&self, now: Instant) -> usize {
        self.outlier.as_ref().map_or(0, |o| {
            o.lock().unwrap_or_else(|p| p.into_inner()).ejected(now)
        })
    }
}

fn target(p: &Picked) -> SocketAddr {
    SocketAddr::new(p.ip, p.port)
}

/// A request in flight to an endpoint (for `LEAST_REQUEST`).
#[derive(Debug)]
pub struct InFlight {
    balancer: Arc<Balancer>,
    endpoint: SocketAddr,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut map = self
            .balancer
            .in_flight
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(n) = map.get_mut(&self.endpoint) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.endpoint);
            }
        }
    }
}

/// A retry in flight under `maxRetries`.
#[derive(Debug)]
pub struct RetryPlace(Arc<AtomicU32>);

impl Drop for RetryPlace {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What a request is hashed on, and the cookie to set when one was made for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HashInput {
    pub hash: Option<u64>,
    /// A `Set-Cookie` for the response: the cookie generated for this request.
    pub set_cookie: Option<HeaderValue>,
}

/// The request's hash under `key`: a header's values, a cookie (generated from `fresh`
/// when absent and the rule has a TTL), the source address, or a query parameter.
pub fn request_hash(
    key: &HashKey,
    headers: &HeaderMap,
    query: Option<&str>,
    source: IpAddr,
    fresh: impl FnOnce() -> u64,
) -> HashInput {
    let hashed = |bytes: &[u8]| HashInput {
        hash: Some(hash_of(bytes)),
        set_cookie: None,
    };
    let none = HashInput {
        hash: None,
        set_cookie: None,
    };
    match key {
        HashKey::Header(name) => {
            let mut values = headers.get_all(name).iter();
            let Some(first) = values.next() else {
                return none;
            };
            let mut joined = first.as_bytes().to_vec();
            for v in values {
                joined.push(b',');
                joined.extend_from_slice(v.as_bytes());
            }
            hashed(&joined)
        }
        HashKey::SourceIp => HashInput {
            hash: Some(source_hash(source)),
            set_cookie: None,
        },
        HashKey::QueryParameter(name) => query
            .and_then(|q| {
                q.split('&').find_map(|pair| {
                    let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                    (k == name).then_some(v)
                })
            })
            .map_or(none, |v| hashed(v.as_bytes())),
        HashKey::Cookie(cookie) => match cookie_value(headers, &cookie.name) {
            Some(v) => hashed(v.as_bytes()),
            None => match cookie.ttl {
                Some(_) => {
                    let value = format!("{:016x}", fresh());
                    HashInput {
                        hash: Some(hash_of(value.as_bytes())),
                        set_cookie: set_cookie(cookie, &value),
                    }
                }
                None => none,
            },
        },
    }
}

/// The hash of a source address (its text, as a header's value would be hashed).
fn source_hash(source: IpAddr) -> u64 {
    hash_of(source.to_string().as_bytes())
}

/// What a request or tunnel holds of its destination's rule until it ends: its place in
/// the connection pool, and its count on the endpoint it went to (`LEAST_REQUEST`).
#[derive(Debug, Default)]
pub struct Held {
    #[allow(dead_code)] // held only to be dropped when the request ends
    pub place: Option<OwnedSemaphorePermit>,
    #[allow(dead_code)]
    pub in_flight: Option<InFlight>,
}

/// The value of cookie `name` in the request's `Cookie` headers (quotes around it
/// dropped).
fn cookie_value<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|pair| {
            let (k, v) = pair.trim().split_once('=')?;
            (k == name).then(|| {
                v.strip_prefix('"')
                    .and_then(|v| v.strip_suffix('"'))
                    .unwrap_or(v)
            })
        })
}

/// `name=value; Max-Age=<ttl>; Path=<path>; HttpOnly` (no `Max-Age` for a TTL of 0s: a
/// session cookie).
fn set_cookie(cookie: &CookieKey, value: &str) -> Option<HeaderValue> {
    let mut text = format!("{}={value}", cookie.name);
    if let Some(ttl) = cookie.ttl.filter(|t| !t.is_zero()) {
        text.push_str(&format!("; Max-Age={}", ttl.as_secs().max(1)));
    }
    if let Some(path) = &cookie.path {
        text.push_str(&format!("; Path={path}"));
    }
    text.push_str("; HttpOnly");
    HeaderValue::from_str(&text).ok()
}

#[cfg(test)]
mod tests;
