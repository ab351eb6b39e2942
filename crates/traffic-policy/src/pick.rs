//! The simple balancers: round robin and least request. The endpoints are given as a
//! slice the caller built (eligible, not ejected); these return an index into it.

use std::sync::atomic::{AtomicUsize, Ordering};

/// `ROUND_ROBIN`: each request takes the next endpoint.
#[derive(Debug, Default)]
pub struct RoundRobin {
    next: AtomicUsize,
}

impl RoundRobin {
    /// The index for the next request among `n` endpoints (`n` > 0).
    pub fn next(&self, n: usize) -> usize {
        self.next.fetch_add(1, Ordering::Relaxed) % n
    }
}

/// `LEAST_REQUEST` as Envoy does it for equal weights: of two endpoints drawn at random
/// (`draws`, each below `n`), the one with fewer requests in flight, the first on a tie;
/// with weights, fewer in flight per unit of weight.
pub fn least_request(
    n: usize,
    in_flight: impl Fn(usize) -> u32,
    weight: impl Fn(usize) -> u32,
    draws: (usize, usize),
) -> usize {
    let (a, b) = (draws.0 % n, draws.1 % n);
    if a == b {
        return a;
    }
    // a is chosen when in_flight(a) / weight(a) <= in_flight(b) / weight(b).
    let load = |i: usize, other: usize| u64::from(in_flight(i)) * u64::from(weight(other).max(1));
    if load(a, b) <= load(b, a) {
        a
    } else {
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_robin_cycles() {
        let rr = RoundRobin::default();
        let got: Vec<usize> = (0..7).map(|_| rr.next(3)).collect();
        assert_eq!(got, [0, 1, 2, 0, 1, 2, 0]);
    }

    #[test]
    fn least_request_takes_the_less_loaded_of_two() {
        let in_flight = [5u32, 1, 3, 0];
        let equal = |_| 1;
        // (draws, expected)
        let table = [
            ((0, 1), 1),
            ((1, 0), 1),
            ((2, 3), 3),
            ((0, 2), 2),
            ((1, 1), 1),
            // A tie goes to the first drawn.
            ((3, 3), 3),
            // Draws past the end wrap.
            ((4, 5), 1),
        ];
        for (draws, expected) in table {
            assert_eq!(
                least_request(4, |i| in_flight[i], equal, draws),
                expected,
                "{draws:?}"
            );
        }
        // Weighted: 4 in flight on weight 4 beats 2 on weight 1.
        let in_flight = [4u32, 2];
        let weights = [4u32, 1];
        assert_eq!(
            least_request(2, |i| in_flight[i], |i| weights[i], (1, 0)),
            0
        );
        let tie = [1u32, 1];
        assert_eq!(least_request(2, |i| tie[i], |_| 1, (1, 0)), 1);
    }
}
