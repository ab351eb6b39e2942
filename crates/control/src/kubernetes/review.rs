//! Who a bearer token belongs to, asked of the API server (a TokenReview for the audience
//! `istio-ca`, the audience of the token istiod's waypoint pod mounts), and whether that
//! account may follow the L7 configuration: only the service account of a waypoint
//! Gateway may. Answers are cached by the token's SHA-256 (a minute when the token is
//! good, ten seconds when it is not), the cache is bounded, and the reviews in flight at
//! once are too: beyond that a newcomer is told to come back (`UNAVAILABLE`), never let in.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, TokenReviewStatus};
use tokio::sync::Semaphore;

use super::waypoints::Waypoints;

/// The audience the token must be for.
pub const AUDIENCE: &str = "istio-ca";
/// Answers kept at once.
pub const CACHE_ENTRIES: usize = 4096;
/// How long a good answer is trusted (a deleted service account is noticed within it).
pub const GOOD_FOR: Duration = Duration::from_secs(60);
/// How long a refusal is remembered (so a bad token does not cost a review a request).
pub const BAD_FOR: Duration = Duration::from_secs(10);
/// Reviews in flight at once.
pub const REVIEWS_IN_FLIGHT: usize = 16;

/// What the API server said of a token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reviewed {
    Account { namespace: String, name: String },
    Refused(String),
}

/// Reads a TokenReview's status.
pub fn read_status(status: Option<&TokenReviewStatus>) -> Reviewed {
    let Some(status) = status else {
        return Reviewed::Refused(
            "the API server answered the TokenReview without a status".into(),
        );
    };
    if status.authenticated != Some(true) {
        let why = status
            .error
            .as_deref()
            .filter(|e| !e.is_empty())
            .unwrap_or("not authenticated");
        return Reviewed::Refused(format!("the API server does not accept the token: {why}"));
    }
    // An API server that says which audiences it checked must have checked ours.
    if let Some(audiences) = &status.audiences {
        if !audiences.iter().any(|a| a == AUDIENCE) {
            return Reviewed::Refused(format!(
                "the token is not for the audience {AUDIENCE} (it is for {audiences:?})"
            ));
        }
    }
    let username = status
        .user
        .as_ref()
        .and_then(|u| u.username.as_deref())
        .unwrap_or_default();
    let mut parts = username.split(':');
    match (
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
    ) {
        (Some("system"), Some("serviceaccount"), Some(ns), Some(name), None)
            if !ns.is_empty() && !name.is_empty() =>
        {
            Reviewed::Account {
                namespace: ns.to_string(),
                name: name.to_string(),
            }
        }
        _ => Reviewed::Refused(format!("{username:?} is not a service account")),
    }
}

/// Why a stream is refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The token is not a service account's for `istio-ca`.
    Unauthenticated(String),
    /// A service account that runs no waypoint.
    NotAWaypoint(String),
}

/// Whether what was reviewed may follow the L7 configuration now.
pub fn admit(reviewed: &Reviewed, waypoints: &Waypoints) -> Result<(), Refusal> {
    match reviewed {
        Reviewed::Refused(why) => Err(Refusal::Unauthenticated(why.clone())),
        Reviewed::Account { namespace, name } if waypoints.runs_waypoint(namespace, name) => {
            Ok(())
        }
        Reviewed::Account { namespace, name } => Err(Refusal::NotAWaypoint(format!(
            "the service account {namespace}/{name} runs no waypoint (no Gateway {namespace}/{name} of a waypoint class)"
        ))),
    }
}

/// Answers by token digest, oldest first out.
#[derive(Debug, Default)]
pub struct ReviewCache {
    entries: HashMap<[u8; 32], (Reviewed, Instant)>,
    order: VecDeque<[u8; 32]>,
}

impl ReviewCache {
    pub fn get(&self, digest: &[u8; 32], now: Instant) -> Option<&Reviewed> {
        self.entries
            .get(digest)
            .filter(|(_, until)| now < *until)
            .map(|(r, _)| r)
    }

    pub fn insert(&mut self, digest: [u8; 32], reviewed: Reviewed, now: Instant) {
        let ttl = match reviewed {
            Reviewed::Account { .. } => GOOD_FOR,
            Reviewed::Refused(_) => BAD_FOR,
        };
        if self.entries.insert(digest, (reviewed, now + ttl)).is_none() {
            self.order.push_back(digest);
        }
        while self.entries.len() > CACHE_ENTRIES {
            match self.order.pop_front() {
                Some(oldest) => {
                    self.entries.remove(&oldest);
                }
                None => break,
            }
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Reviews tokens with the API server.
pub struct Reviewer {
    client: kube::Client,
    cache: Mutex<ReviewCache>,
    in_flight: Semaphore,
}

impl Reviewer {
    pub fn new(client: kube::Client) -> Reviewer {
        Reviewer {
            client,
            cache: Mutex::default(),
            in_flight: Semaphore::new(REVIEWS_IN_FLIGHT),
        }
    }

    /// The cached answer for `token`, if there is a fresh one.
    pub fn cached(&self, token: &str) -> Option<Reviewed> {
        let digest = crate::tokens::digest(token);
        self.cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&digest, Instant::now())
            .cloned()
    }

    /// Asks the API server (at most [`REVIEWS_IN_FLIGHT`] at once). `Err` is for the API
    /// server's failure, which refuses the request without caching anything.
    pub async fn review(&self, token: &str) -> Result<Reviewed, String> {
        let digest = crate::tokens::digest(token);
        if let Some(r) = self.cached(token) {
            return Ok(r);
        }
        let _permit = self.in_flight.try_acquire().map_err(|_| {
            format!("{REVIEWS_IN_FLIGHT} token reviews are in flight already; retry")
        })?;
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_string()),
                audiences: Some(vec![AUDIENCE.to_string()]),
            },
            ..TokenReview::default()
        };
        let api: kube::Api<TokenReview> = kube::Api::all(self.client.clone());
        let answered = tokio::time::timeout(
            Duration::from_secs(10),
            api.create(&kube::api::PostParams::default(), &review),
        )
        .await
        .map_err(|_| "the TokenReview took more than 10 s".to_string())?
        .map_err(|e| format!("the TokenReview failed: {e}"))?;
        let reviewed = read_status(answered.status.as_ref());
        self.cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(digest, reviewed.clone(), Instant::now());
        Ok(reviewed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::authentication::v1::UserInfo;
    use serde_json::json;

    fn status(authenticated: bool, user: &str, audiences: Option<&[&str]>) -> TokenReviewStatus {
        TokenReviewStatus {
            authenticated: Some(authenticated),
            user: Some(UserInfo {
                username: Some(user.into()),
                ..UserInfo::default()
            }),
            audiences: audiences.map(|a| a.iter().map(|s| s.to_string()).collect()),
            error: (!authenticated).then(|| "token expired".into()),
        }
    }

    #[test]
    fn a_reviews_status_is_read_strictly() {
        let account = |ns: &str, name: &str| Reviewed::Account {
            namespace: ns.into(),
            name: name.into(),
        };
        let cases: Vec<(Option<TokenReviewStatus>, Result<Reviewed, &str>)> = vec![
            (
                Some(status(
                    true,
                    "system:serviceaccount:shop:waypoint",
                    Some(&["istio-ca"]),
                )),
                Ok(account("shop", "waypoint")),
            ),
            // An API server that lists no audiences checked the one asked for.
            (
                Some(status(true, "system:serviceaccount:shop:waypoint", None)),
                Ok(account("shop", "waypoint")),
            ),
            (
                Some(status(
                    true,
                    "system:serviceaccount:shop:waypoint",
                    Some(&["https://kubernetes.default.svc"]),
                )),
                Err("not for the audience istio-ca"),
            ),
            (
                Some(status(false, "", None)),
                Err("does not accept the token: token expired"),
            ),
            (
                Some(status(true, "alice", Some(&["istio-ca"]))),
                Err("\"alice\" is not a service account"),
            ),
            (
                Some(status(
                    true,
                    "system:serviceaccount:shop:waypoint:extra",
                    None,
                )),
                Err("is not a service account"),
            ),
            (
                Some(status(true, "system:serviceaccount::waypoint", None)),
                Err("is not a service account"),
            ),
            (None, Err("without a status")),
        ];
        for (status, want) in cases {
            let got = read_status(status.as_ref());
            match (&got, want) {
                (got, Ok(want)) => assert_eq!(got, &want),
                (Reviewed::Refused(why), Err(part)) => assert!(why.contains(part), "{why}"),
                (got, Err(part)) => panic!("{got:?}, expected a refusal with {part}"),
            }
        }
    }

    #[test]
    fn only_a_waypoints_account_is_admitted() {
        let mut waypoints = Waypoints::default();
        waypoints.apply_gateway(
            &json!({"metadata": {"namespace": "shop", "name": "waypoint"},
                                        "spec": {"gatewayClassName": "istio-waypoint"}}),
        );
        let account = |name: &str| Reviewed::Account {
            namespace: "shop".into(),
            name: name.into(),
        };
        assert_eq!(admit(&account("waypoint"), &waypoints), Ok(()));
        assert!(
            matches!(admit(&account("web"), &waypoints), Err(Refusal::NotAWaypoint(m)) if m.contains("shop/web"))
        );
        assert!(matches!(
            admit(&Reviewed::Refused("x".into()), &waypoints),
            Err(Refusal::Unauthenticated(_))
        ));
    }

    #[test]
    fn the_cache_is_bounded_and_forgets() {
        let mut cache = ReviewCache::default();
        let t0 = Instant::now();
        let good = Reviewed::Account {
            namespace: "a".into(),
            name: "b".into(),
        };
        cache.insert([1; 32], good.clone(), t0);
        cache.insert([2; 32], Reviewed::Refused("no".into()), t0);
        assert_eq!(
            cache.get(&[1; 32], t0 + Duration::from_secs(59)),
            Some(&good)
        );
        assert_eq!(cache.get(&[1; 32], t0 + GOOD_FOR), None);
        assert!(cache.get(&[2; 32], t0 + Duration::from_secs(9)).is_some());
        assert_eq!(cache.get(&[2; 32], t0 + BAD_FOR), None);
        for i in 0..CACHE_ENTRIES + 10 {
            let mut d = [0; 32];
            d[..8].copy_from_slice(&(i as u64 + 10).to_le_bytes());
            cache.insert(d, good.clone(), t0);
        }
        assert_eq!(cache.len(), CACHE_ENTRIES);
        // The oldest went first.
        assert_eq!(cache.get(&[1; 32], t0), None);
    }
}
