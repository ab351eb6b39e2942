use super::*;

const S: Duration = Duration::from_secs(1);

/// One scripted step: at `at_ms`, what a try at `host` came to, and what the detector
/// should say.
struct Step {
    at_ms: u64,
    host: &'static str,
    outcome: Outcome,
    expect: Recorded,
}

enum Check {
    Step(Step),
    /// At `at_ms`, exactly these hosts are out.
    Out(u64, &'static [&'static str]),
}

use Check::{Out, Step as S_};
use Outcome::{LocalFailure as Lf, Status};

fn ejected(reason: Reason, secs: u64) -> Recorded {
    Recorded::Ejected(Ejection {
        reason,
        duration: Duration::from_secs(secs),
    })
}

const N: Recorded = Recorded::Nothing;

fn step(at_ms: u64, host: &'static str, outcome: Outcome, expect: Recorded) -> Check {
    S_(Step {
        at_ms,
        host,
        outcome,
        expect,
    })
}

fn run(name: &str, config: OutlierDetection, pool: &[&str], script: &[Check]) {
    let start = Instant::now();
    let at = |ms: u64| start + Duration::from_millis(ms);
    let mut d: Detector<&str> = Detector::new(config);
    for (i, check) in script.iter().enumerate() {
        match check {
            S_(s) => {
                let got = d.record(&s.host, s.outcome, pool.len(), at(s.at_ms));
                assert_eq!(got, s.expect, "{name}: step {i} at {} ms", s.at_ms);
            }
            Out(ms, expected) => {
                let out: Vec<&str> = pool
                    .iter()
                    .copied()
                    .filter(|h| d.is_ejected(h, at(*ms)))
                    .collect();
                assert_eq!(&out, expected, "{name}: check {i} at {ms} ms");
                assert_eq!(d.ejected(at(*ms)), expected.len(), "{name}: check {i}");
            }
        }
    }
}

fn cfg(f: impl FnOnce(&mut OutlierDetection)) -> OutlierDetection {
    let mut c = OutlierDetection {
        consecutive_5xx: 3,
        interval: 10 * S,
        base_ejection_time: 30 * S,
        max_ejection_percent: 100,
        ..OutlierDetection::default()
    };
    f(&mut c);
    c
}

#[test]
fn consecutive_5xx_eject_and_a_success_resets_the_run() {
    run(
        "5xx",
        cfg(|_| {}),
        &["a", "b"],
        &[
            step(0, "a", Status(500), N),
            step(1, "a", Status(503), N),
            // A success in between: the run starts again.
            step(2, "a", Status(200), N),
            step(3, "a", Status(500), N),
            step(4, "a", Status(501), N),
            // 4xx is not an error of the endpoint's: it ends the run too.
            step(5, "a", Status(404), N),
            step(6, "a", Status(500), N),
            step(7, "a", Status(500), N),
            step(8, "a", Status(500), ejected(Reason::Consecutive5xx, 30)),
            Out(9, &["a"]),
            // Still out 30 s later less a millisecond; back at 30 s.
            Out(30_007, &["a"]),
            Out(30_008, &[]),
            // A try that was in flight when it was ejected changes nothing.
            step(100, "a", Status(500), N),
        ],
    );
}

#[test]
fn the_ejection_grows_with_each_and_shrinks_with_healthy_intervals() {
    run(
        "multiplier",
        cfg(|c| c.consecutive_5xx = 1),
        &["a", "b"],
        &[
            step(0, "a", Status(500), ejected(Reason::Consecutive5xx, 30)),
            // Back at 30 s and failing at once: twice as long.
            step(
                30_000,
                "a",
                Status(500),
                ejected(Reason::Consecutive5xx, 60),
            ),
            Out(89_999, &["a"]),
            Out(90_000, &[]),
            // Back at 90 s; 25 s later (two whole intervals of 10 s) the multiplier is 0,
            // so the next ejection is 1 × 30 s again.
            step(
                115_000,
                "a",
                Status(502),
                ejected(Reason::Consecutive5xx, 30),
            ),
        ],
    );
    // The multiplier is capped at 300 s (base 200 s: the base itself).
    run(
        "cap",
        cfg(|c| {
            c.consecutive_5xx = 1;
            c.base_ejection_time = 120 * S;
        }),
        &["a", "b"],
        &[
            step(0, "a", Status(500), ejected(Reason::Consecutive5xx, 120)),
            step(
                120_000,
                "a",
                Status(500),
                ejected(Reason::Consecutive5xx, 240),
            ),
            step(
                360_000,
                "a",
                Status(500),
                ejected(Reason::Consecutive5xx, 300),
            ),
        ],
    );
}

#[test]
fn gateway_errors_and_local_failures() {
    run(
        "gateway",
        cfg(|c| {
            c.consecutive_5xx = 0;
            c.consecutive_gateway = 2;
        }),
        &["a", "b"],
        &[
            // 500 is not a gateway error: it ends the gateway run.
            step(0, "a", Status(502), N),
            step(1, "a", Status(500), N),
            step(2, "a", Status(504), N),
            // Not split: a connection failure counts as a gateway error.
            step(3, "a", Lf, ejected(Reason::ConsecutiveGateway, 30)),
            // An opaque connection that opens ends a run as an answer does.
            step(40_000, "b", Lf, N),
            step(40_001, "b", Outcome::Reached, N),
            step(40_002, "b", Lf, N),
        ],
    );
    run(
        "split",
        cfg(|c| {
            c.consecutive_5xx = 2;
            c.split_local_origin = true;
            c.consecutive_local_origin = 3;
        }),
        &["a", "b"],
        &[
            // Split: local failures do not count as 5xx, and an answer ends their run.
            step(0, "a", Lf, N),
            step(1, "a", Status(500), N),
            step(2, "a", Lf, N),
            step(3, "a", Lf, N),
            step(4, "a", Status(200), N),
            step(5, "a", Lf, N),
            step(6, "a", Lf, N),
            step(7, "a", Lf, ejected(Reason::ConsecutiveLocalOrigin, 30)),
        ],
    );
    run(
        "off",
        cfg(|c| c.consecutive_5xx = 0),
        &["a", "b"],
        &[
            step(0, "a", Status(500), N),
            step(1, "a", Status(503), N),
            step(2, "a", Lf, N),
            step(3, "a", Status(500), N),
        ],
    );
}

#[test]
fn no_more_than_max_ejection_percent_is_out() {
    let pool = &["a", "b", "c", "d"];
    run(
        "max percent",
        cfg(|c| {
            c.consecutive_5xx = 1;
            c.max_ejection_percent = 50;
        }),
        pool,
        &[
            step(0, "a", Status(500), ejected(Reason::Consecutive5xx, 30)),
            step(1, "b", Status(500), ejected(Reason::Consecutive5xx, 30)),
            // Half the pool is out: no more.
            step(
                2,
                "c",
                Status(500),
                Recorded::OverMaxEjection(Reason::Consecutive5xx),
            ),
            Out(3, &["a", "b"]),
            // Once one is back, another may go.
            step(
                30_000,
                "c",
                Status(500),
                ejected(Reason::Consecutive5xx, 30),
            ),
            Out(30_000, &["b", "c"]),
            Out(30_001, &["c"]),
        ],
    );
    // Istio's default of 10 % still ejects one of two (0 % out is below 10 %).
    run(
        "default percent",
        cfg(|c| {
            c.consecutive_5xx = 1;
            c.max_ejection_percent = 10;
        }),
        &["a", "b"],
        &[
            step(0, "a", Status(500), ejected(Reason::Consecutive5xx, 30)),
            step(
                1,
                "b",
                Status(500),
                Recorded::OverMaxEjection(Reason::Consecutive5xx),
            ),
        ],
    );
}

#[test]
fn min_health_percent_and_forgetting() {
    let start = Instant::now();
    let mut d: Detector<&str> = Detector::new(cfg(|c| {
        c.consecutive_5xx = 1;
        c.min_health_percent = 60;
    }));
    assert!(!d.below_min_health(2, start));
    d.record(&"a", Status(500), 2, start);
    // One of two left: 50 % < 60 %, so ejections are to be ignored.
    assert!(d.below_min_health(2, start));
    assert!(!d.below_min_health(3, start));
    assert_eq!(d.len(), 1);
    d.retain(|h| *h != "a");
    assert!(d.is_empty() && !d.is_ejected(&"a", start));
}
