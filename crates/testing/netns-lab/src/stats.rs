//! The suite's and the benchmarks' statistics.
//!
//! The sizing of the suite's statistical checks: a share of random draws (a weighted
//! route, a load-balancing spread) is checked by counting the draws that land on one side
//! and accepting a range of counts. Each check is sized so that a correct share passes
//! with probability at least 0.999 and a share 5 points off, either way, fails with
//! probability at least 0.999; the exact binomial probabilities are written beside each
//! check and verified by this module's tests.
//!
//! The benchmarks' summaries ([`median`], [`percentile`], [`spread`]): one definition for
//! every driver, so that a median of two rounds is their mean, not their maximum.

use std::ops::RangeInclusive;

/// A check that of `samples` draws, each landing on one side with probability
/// `percent` %, the count on that side is in `accept`.
#[derive(Debug, Clone)]
pub struct ShareCheck {
    pub samples: usize,
    pub percent: u32,
    pub accept: RangeInclusive<usize>,
}

impl ShareCheck {
    /// `Ok` when `hits` of [`ShareCheck::samples`] draws is in the accepted range.
    pub fn check(&self, hits: usize) -> Result<(), String> {
        if self.accept.contains(&hits) {
            return Ok(());
        }
        Err(format!(
            "{hits} of {} draws where {} % were due: outside {}..={}, which a correct share \
             leaves with probability below 0.001",
            self.samples,
            self.percent,
            self.accept.start(),
            self.accept.end()
        ))
    }

    /// The probability that a share of `percent` % passes this check.
    pub fn passes_with(&self, percent: f64) -> f64 {
        binomial_between(
            self.samples as u64,
            percent / 100.0,
            *self.accept.start() as u64,
            *self.accept.end() as u64,
        )
    }
}

/// A 90/10 weighted route, counting the answers of the 10 % backend: a correct 10 %
/// passes with p = 0.99962; 5 % fails with p = 0.99964, 15 % with p = 0.99970.
pub const TEN_PERCENT: ShareCheck = ShareCheck {
    samples: 2000,
    percent: 10,
    accept: 135..=246,
};

/// `P(lo <= X <= hi)` for `X ~ Binomial(n, p)`, `0 < p < 1`: each term computed in log
/// space, so that thousands of draws neither overflow nor underflow.
pub fn binomial_between(n: u64, p: f64, lo: u64, hi: u64) -> f64 {
    let (lp, lq) = (p.ln(), (-p).ln_1p());
    // ln(k!) for every k up to n.
    let ln_fact: Vec<f64> = std::iter::once(0.0)
        .chain((1..=n).scan(0.0, |acc, i| {
            *acc += (i as f64).ln();
            Some(*acc)
        }))
        .collect();
    let at = |k: u64| ln_fact[k as usize];
    (lo..=hi.min(n))
        .map(|k| (at(n) - at(k) - at(n - k) + k as f64 * lp + (n - k) as f64 * lq).exp())
        .sum()
}

/// The median of `values` in any order: the middle value of an odd count, the mean of the
/// two middle values of an even count (so two rounds give their mean); NaN for none.
pub fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => v[n / 2],
        _ => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// The nearest-rank `p`-th percentile (`0 < p <= 100`) of `values` in any order: the
/// smallest value with at least `p` % of the values at or below it (for a p99 of 100
/// values, the 99th; of fewer than 100, the highest); NaN for none. A p50 is a
/// [`median`].
pub fn percentile(values: &[f64], p: f64) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        return f64::NAN;
    }
    // Less a hair, so that a rank the decimal `p` makes whole (99.9 % of 1,000) is not
    // pushed to the next one by the float's rounding.
    let rank = (p * n as f64 / 100.0 - 1e-9).ceil() as usize;
    v[rank.clamp(1, n) - 1]
}

/// The lowest and the highest of `values` (infinities when there are none).
pub fn spread(values: &[f64]) -> (f64, f64) {
    let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (lo, hi)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(got: f64, want: f64, within: f64) {
        assert!(
            (got - want).abs() <= within,
            "{got} is not {want} ±{within}"
        );
    }

    #[test]
    fn binomial_probabilities_match_the_closed_forms() {
        // n = 4, p = 1/2: 1, 4, 6, 4, 1 of 16.
        close(binomial_between(4, 0.5, 2, 2), 6.0 / 16.0, 1e-12);
        close(binomial_between(4, 0.5, 0, 4), 1.0, 1e-12);
        close(binomial_between(4, 0.5, 1, 3), 14.0 / 16.0, 1e-12);
        // n = 10, p = 0.3, X <= 3 (0.6496107184, from the table).
        close(binomial_between(10, 0.3, 0, 3), 0.649_610_718_4, 1e-9);
        // Thousands of draws: every term adds up to 1.
        close(binomial_between(4000, 0.75, 0, 4000), 1.0, 1e-9);
    }

    /// Every statistical check of the suite, as its comment states it: a correct share
    /// passes, one 5 points off either way fails, each with probability at least 0.999, at
    /// the probabilities written beside the check (rounded to five places).
    #[test]
    fn every_share_check_in_the_suite_is_sized() {
        let check = |c: &ShareCheck, correct: f64, low_fails: f64, high_fails: f64| {
            let p = c.percent as f64;
            let pass = c.passes_with(p);
            let low = 1.0 - c.passes_with(p - 5.0);
            let high = 1.0 - c.passes_with(p + 5.0);
            assert!(pass >= 0.999 && low >= 0.999 && high >= 0.999, "{c:?}");
            close(pass, correct, 5e-6);
            close(low, low_fails, 5e-6);
            close(high, high_fails, 5e-6);
        };
        // The waypoint's 90/10 split (crates/ambit/tests/waypoint_routes.rs, the demo).
        check(&TEN_PERCENT, 0.99962, 0.99964, 0.99970);
        // The node proxy's draw by capacity, 9:1 (crates/state/src/route.rs,
        // weighted_by_capacity).
        let nine_to_one = ShareCheck {
            samples: 2000,
            percent: 90,
            accept: 1754..=1865,
        };
        check(&nine_to_one, 0.99962, 0.99970, 0.99964);
        // The node proxy's draw by capacity, 3:1 past an ineligible endpoint
        // (crates/state/src/route.rs, draws_fall_back_to_the_exact_scan).
        let three_to_one = ShareCheck {
            samples: 4000,
            percent: 75,
            accept: 2902..=3109,
        };
        check(&three_to_one, 0.99979, 0.99979, 0.99979);
        // The waypoint's draw over two healthy endpoints (crates/waypoint/src/balance.rs,
        // every_request_draws_again_over_healthy_endpoints).
        let even = ShareCheck {
            samples: 5000,
            percent: 50,
            accept: 2372..=2628,
        };
        check(&even, 0.99972, 0.99972, 0.99972);
    }

    #[test]
    fn the_median_of_an_even_count_is_the_mean_of_the_middle_two() {
        // Unsorted on purpose; two rounds give their mean, not their maximum.
        assert_eq!(median(&[9.0, 1.0, 4.0, 3.0]), 3.5);
        assert_eq!(median(&[200.0, 100.0]), 150.0);
        assert_eq!(median(&[5.0, 1.0, 3.0]), 3.0);
        assert_eq!(median(&[7.0]), 7.0);
        assert!(median(&[]).is_nan());
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let hundred: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        assert_eq!(percentile(&hundred, 99.0), 99.0);
        assert_eq!(percentile(&hundred, 90.0), 90.0);
        assert_eq!(percentile(&hundred, 100.0), 100.0);
        assert_eq!(percentile(&hundred, 0.1), 1.0);
        assert_eq!(percentile(&hundred, 99.9), 100.0);
        let thousand: Vec<f64> = (1..=1000).map(f64::from).collect();
        assert_eq!(percentile(&thousand, 99.9), 999.0);
        // Fewer than 100 values: the p99 is the highest.
        assert_eq!(percentile(&[3.0, 1.0, 2.0], 99.0), 3.0);
        assert_eq!(percentile(&[3.0, 1.0, 2.0, 4.0], 50.0), 2.0);
        assert!(percentile(&[], 99.0).is_nan());
    }

    #[test]
    fn spread_is_the_lowest_and_highest() {
        assert_eq!(spread(&[2.0, -1.0, 5.0]), (-1.0, 5.0));
    }

    #[test]
    fn a_count_outside_the_range_is_refused_with_the_numbers() {
        assert!(TEN_PERCENT.check(200).is_ok());
        assert!(TEN_PERCENT.check(135).is_ok() && TEN_PERCENT.check(246).is_ok());
        let e = TEN_PERCENT.check(134).unwrap_err();
        assert!(e.contains("134 of 2000 draws where 10 % were due"), "{e}");
        assert!(TEN_PERCENT.check(247).is_err());
    }
}
