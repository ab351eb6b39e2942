//! A retry budget across requests, as Envoy's cluster `retry_budget` with its defaults:
//! the retries in flight to one destination (a Service port, or a pod's port) may be at
//! most 20 % of the requests in flight to it, and never fewer than 3, so a quiet
//! destination still retries and a failing busy one is not sent a storm. A retry the budget
//! refuses is not made: the request ends with the answer or failure it has (counted as
//! `ambit_waypoint_upstream_retries_refused_total{reason="budget"}`).
//!
//! [`allows`] is the decision (sans-IO, table-tested); [`Budgets`] holds the counts, one
//! entry per destination with something in flight, removed when it has none.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use ambit_state::Name;

use crate::front::Fronted;

/// Envoy's default `budget_percent`.
pub const BUDGET_PERCENT: u32 = 20;
/// Envoy's default `min_retry_concurrency`.
pub const MIN_RETRY_CONCURRENCY: u32 = 3;

/// Whether one more retry may start with `requests` and `retries` in flight (the request
/// asking included in `requests`).
pub fn allows(requests: u32, retries: u32) -> bool {
    let share = (u64::from(requests) * u64::from(BUDGET_PERCENT) / 100) as u32;
    retries < share.max(MIN_RETRY_CONCURRENCY)
}

/// A destination, as Envoy's cluster: a Service and port, or a workload and port.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Destination {
    /// The Service's `namespace/hostname` key parts, or the workload's uid.
    scope: Name,
    name: Name,
    port: u16,
}

impl Destination {
    pub fn of(target: &Fronted) -> Destination {
        match target {
            Fronted::Service { service, port, .. } => Destination {
                scope: service.namespace.clone(),
                name: service.hostname.clone(),
                port: *port,
            },
            Fronted::Workload { workload, port } => Destination {
                scope: Name::default(),
                name: workload.uid.clone(),
                port: *port,
            },
        }
    }
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct InFlight {
    requests: u32,
    retries: u32,
}

/// Requests and retries in flight, by destination.
#[derive(Debug, Default)]
pub struct Budgets {
    in_flight: Mutex<HashMap<Destination, InFlight>>,
}

impl Budgets {
    /// A request to `destination` starts; it counts until the guard is dropped.
    pub fn request(self: &Arc<Self>, destination: Destination) -> InFlightRequest {
        self.update(&destination, |f| f.requests += 1);
        InFlightRequest {
            budgets: self.clone(),
            destination,
        }
    }

    fn update(&self, destination: &Destination, change: impl FnOnce(&mut InFlight)) -> InFlight {
        let mut map = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        let entry = map.entry(destination.clone()).or_default();
        change(entry);
        let now = *entry;
        if now == InFlight::default() {
            map.remove(destination);
        }
        now
    }

    /// Destinations with something in flight (for tests and `/config_dump`).
    pub fn destinations(&self) -> usize {
        self.in_flight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }
}

/// A request in flight to a destination.
#[derive(Debug)]
pub struct InFlightRequest {
    budgets: Arc<Budgets>,
    destination: Destination,
}

impl InFlightRequest {
    /// A retry of this request, if the budget allows one now; it counts until dropped.
    pub fn retry(&self) -> Option<InFlightRetry> {
        let mut granted = false;
        self.budgets.update(&self.destination, |f| {
            if allows(f.requests, f.retries) {
                f.retries += 1;
                granted = true;
            }
        });
        granted.then(|| InFlightRetry {
            budgets: self.budgets.clone(),
            destination: self.destination.clone(),
        })
    }
}

impl Drop for InFlightRequest {
    fn drop(&mut self) {
        self.budgets.update(&self.destination, |f| {
            f.requests = f.requests.saturating_sub(1)
        });
    }
}

/// A retry in flight.
#[derive(Debug)]
pub struct InFlightRetry {
    budgets: Arc<Budgets>,
    destination: Destination,
}

impl Drop for InFlightRetry {
    fn drop(&mut self) {
        self.budgets.update(&self.destination, |f| {
            f.retries = f.retries.saturating_sub(1)
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allows_table() {
        // (requests in flight, retries in flight, allowed)
        let cases = [
            (1, 0, true),
            (1, 2, true),
            (1, 3, false),
            (10, 2, true),
            (10, 3, false),
            (15, 2, true),
            (15, 3, false),
            (20, 3, true),
            (20, 4, false),
            (100, 19, true),
            (100, 20, false),
            (1000, 199, true),
            (1000, 200, false),
            (u32::MAX, u32::MAX / 5 - 1, true),
            (u32::MAX, u32::MAX / 5, false),
        ];
        for (requests, retries, want) in cases {
            assert_eq!(allows(requests, retries), want, "{requests} {retries}");
        }
    }

    fn destination(name: &str) -> Destination {
        Destination {
            scope: Name::from("shop"),
            name: Name::from(name),
            port: 80,
        }
    }

    #[test]
    fn retries_are_bounded_per_destination_and_released() {
        let budgets = Arc::new(Budgets::default());
        let requests: Vec<_> = (0..5).map(|_| budgets.request(destination("a"))).collect();
        // Five requests: the floor of three retries, no more.
        let retries: Vec<_> = requests.iter().filter_map(|r| r.retry()).collect();
        assert_eq!(retries.len(), MIN_RETRY_CONCURRENCY as usize);
        assert!(requests[0].retry().is_none());
        // Another destination has a budget of its own.
        let other = budgets.request(destination("b"));
        assert!(other.retry().is_some());
        // A retry that ends gives its place back.
        drop(retries);
        assert!(requests[4].retry().is_some());
        // Nothing in flight: nothing held.
        drop(requests);
        drop(other);
        assert_eq!(budgets.destinations(), 0);
        // A busy destination: a fifth of its requests.
        let many: Vec<_> = (0..50).map(|_| budgets.request(destination("a"))).collect();
        let granted: Vec<_> = many.iter().filter_map(|r| r.retry()).collect();
        assert_eq!(granted.len(), 10);
    }
}
