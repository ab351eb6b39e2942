//! What a chosen rule does: redirect, or send to one of its backends picked by weight.
//! The random number is an argument, so the choice is a plain function of it (and
//! testable); a weight of 0 is never picked, and a pick of a backend that cannot be
//! resolved is a 500, so an invalid backend keeps its share of 500s as the specification
//! says.

use crate::model::{Backend, BackendTarget, Filter, Redirect, Rule, ServiceBackend};

/// What to do with a request a rule selected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action<'r> {
    /// Answer with a redirect (the rule's `RequestRedirect`).
    Redirect(&'r Redirect),
    /// Send to this backend (its own filters after the rule's).
    Forward(&'r Backend, &'r ServiceBackend),
    /// Answer 500, for this reason.
    Fail(Failure<'r>),
}

/// Why a selected rule is answered 500.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure<'r> {
    /// The rule has no backends and no redirect.
    NoBackends,
    /// Every backend has weight 0.
    AllWeightsZero,
    /// The backend picked is invalid (the reason), or the caller could not resolve it.
    Unresolvable(&'r Backend),
    /// The rule uses a filter the waypoint does not implement (the reason).
    UnsupportedFilter(&'r str),
}

impl Failure<'_> {
    /// The status to answer: 500 in every case (reference §3.4).
    pub fn status(&self) -> u16 {
        500
    }
}

impl Rule {
    /// What to do with a request this rule selected. `random` is any number (uniform over
    /// `u64` for a fair split); `resolves` says whether a Service backend can be sent to
    /// (it exists and has the port).
    pub fn action(&self, random: u64, resolves: impl Fn(&ServiceBackend) -> bool) -> Action<'_> {
        if let Some(why) = &self.unsupported {
            return Action::Fail(Failure::UnsupportedFilter(why));
        }
        if let Some(r) = self.filters.iter().find_map(|f| match f {
            Filter::Redirect(r) => Some(r),
            _ => None,
        }) {
            return Action::Redirect(r);
        }
        let Some(backend) = pick(&self.backends, random) else {
            return Action::Fail(if self.backends.is_empty() {
                Failure::NoBackends
            } else {
                Failure::AllWeightsZero
            });
        };
        match &backend.target {
            BackendTarget::Service(s) if resolves(s) => Action::Forward(backend, s),
            _ => Action::Fail(Failure::Unresolvable(backend)),
        }
    }
}

/// The backend `random` picks by weight: backend `i` for the `weight[i]` values of
/// `random % total` that fall in its range. `None` when every weight is 0.
pub fn pick(backends: &[Backend], random: u64) -> Option<&Backend> {
    let total: u64 = backends.iter().map(|b| u64::from(b.weight)).sum();
    if total == 0 {
        return None;
    }
    let mut at = random % total;
    for b in backends {
        let w = u64::from(b.weight);
        if at < w {
            return Some(b);
        }
        at -= w;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{RouteMatch, ServiceKey, Timeouts};

    fn svc(name: &str) -> ServiceBackend {
        ServiceBackend {
            service: ServiceKey::new("shop", name),
            port: 8080,
        }
    }

    fn backend(name: &str, weight: u32) -> Backend {
        Backend {
            target: BackendTarget::Service(svc(name)),
            weight,
            filters: vec![],
        }
    }

    fn rule(backends: Vec<Backend>) -> Rule {
        Rule {
            name: None,
            matches: vec![RouteMatch::default()],
            filters: vec![],
            backends,
            timeouts: Timeouts::default(),
            retry: None,
            unsupported: None,
        }
    }

    fn name(a: Action<'_>) -> String {
        match a {
            Action::Forward(_, s) => s.service.name.clone(),
            other => format!("{other:?}"),
        }
    }

    #[test]
    fn weights_split_by_the_random_number_and_zero_is_never_picked() {
        let r = rule(vec![
            backend("v1", 90),
            backend("zero", 0),
            backend("v2", 10),
        ]);
        let all = |_: &ServiceBackend| true;
        let picks: Vec<String> = (0..100).map(|n| name(r.action(n, all))).collect();
        assert_eq!(picks.iter().filter(|p| *p == "v1").count(), 90);
        assert_eq!(picks.iter().filter(|p| *p == "v2").count(), 10);
        assert!(!picks.iter().any(|p| p == "zero"));
        // The ranges are in order: 0..90 is v1, 90..100 is v2, then it wraps.
        assert_eq!(name(r.action(89, all)), "v1");
        assert_eq!(name(r.action(90, all)), "v2");
        assert_eq!(name(r.action(100, all)), "v1");
        assert_eq!(
            name(r.action(u64::MAX, all)),
            name(r.action(u64::MAX % 100, all))
        );
    }

    #[test]
    fn no_backend_is_a_500() {
        let all = |_: &ServiceBackend| true;
        let zero = rule(vec![backend("a", 0), backend("b", 0)]);
        assert_eq!(zero.action(7, all), Action::Fail(Failure::AllWeightsZero));
        assert_eq!(
            rule(vec![]).action(7, all),
            Action::Fail(Failure::NoBackends)
        );
        // An invalid or unresolvable backend keeps its share, as 500s.
        let mut half = rule(vec![
            backend("a", 1),
            Backend {
                target: BackendTarget::Invalid("kind ServiceImport is not supported".into()),
                weight: 1,
                filters: vec![],
            },
        ]);
        assert_eq!(name(half.action(0, all)), "a");
        assert!(matches!(
            half.action(1, all),
            Action::Fail(Failure::Unresolvable(_))
        ));
        let none = |_: &ServiceBackend| false;
        assert!(matches!(
            half.action(0, none),
            Action::Fail(Failure::Unresolvable(_))
        ));
        half.unsupported = Some("ExtensionRef filters are not supported".into());
        assert!(matches!(
            half.action(0, all),
            Action::Fail(Failure::UnsupportedFilter(_))
        ));
    }

    #[test]
    fn a_redirect_answers_without_backends() {
        let mut r = rule(vec![]);
        let redirect = Redirect {
            scheme: Some("https".into()),
            hostname: None,
            path: None,
            port: None,
            status: 301,
        };
        r.filters.push(Filter::Redirect(redirect.clone()));
        assert_eq!(r.action(0, |_| true), Action::Redirect(&redirect));
    }
}
