use std::time::{Duration, Instant};

use ambit_telemetry::ResponseFlag;

use super::*;
use crate::request_plan::{RetryPolicy, DEFAULT_BACKOFF};

/// An action with its instants as milliseconds after the request's start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum A {
    Connect(Option<u64>),
    Send(Option<u64>),
    Ask,
    Wait(u64),
    Deliver(bool, ResponseFlag),
    Reply(LocalReply),
}

fn relative(action: Action, t0: Instant) -> A {
    let ms = |t: Instant| t.duration_since(t0).as_millis() as u64;
    match action {
        Action::Connect { deadline } => A::Connect(deadline.map(ms)),
        Action::Send { deadline } => A::Send(deadline.map(ms)),
        Action::AskBudget => A::Ask,
        Action::Wait { until } => A::Wait(ms(until)),
        Action::Deliver { join_upgrade, flag } => A::Deliver(join_upgrade, flag),
        Action::Reply(r) => A::Reply(r),
    }
}

struct Case {
    name: &'static str,
    policy: RetryPolicy<'static>,
    timeouts: Timeouts,
    grpc: bool,
    /// The first action.
    first: A,
    /// Each event at its millisecond, the action it must lead to and the note.
    script: Vec<(u64, Event, A, Option<Note>)>,
}

const ROUTE_RETRY: RetryPolicy<'static> = RetryPolicy {
    retries: 2,
    codes: &[503],
    backoff: DEFAULT_BACKOFF,
    on_reset: true,
};
const NO_RETRY: RetryPolicy<'static> = RetryPolicy {
    retries: 0,
    ..ROUTE_RETRY
};
const MESH: RetryPolicy<'static> = RetryPolicy::MESH_DEFAULT;
const NONE: Timeouts = Timeouts {
    request: None,
    per_try: None,
};
fn ms(n: u64) -> Option<Duration> {
    Some(Duration::from_millis(n))
}

const OK: Event = Event::Response {
    status: 200,
    grpc_status: None,
    upgrade_matches: false,
    replayable: true,
};
const S503: Event = Event::Response {
    status: 503,
    grpc_status: None,
    upgrade_matches: false,
    replayable: true,
};
const GRANTED: Event = Event::Budget {
    granted: true,
    random: 0,
};
const RESET: Event = Event::SendFailed {
    cause: SendFailure::Reset,
    replayable: true,
};
const TIMER: Event = Event::TimerFired { replayable: true };
const DELIVER: A = A::Deliver(false, ResponseFlag::None);
#[allow(non_snake_case)]
fn RETRY(c: RetryCause) -> Option<Note> {
    Some(Note::Retrying(c))
}
#[allow(non_snake_case)]
fn REFUSED(r: Refusal) -> Option<Note> {
    Some(Note::RetryRefused(r))
}

fn cases() -> Vec<Case> {
    use Event::*;
    vec![
        Case {
            name: "a response is delivered",
            policy: MESH,
            timeouts: NONE,
            grpc: false,
            first: A::Connect(None),
            script: vec![(0, Connected, A::Send(None), None), (1, OK, DELIVER, None)],
        },
        Case {
            name: "a failed connect is retried on another endpoint, by the mesh default too",
            policy: MESH,
            timeouts: NONE,
            grpc: false,
            first: A::Connect(None),
            script: vec![
                (0, ConnectFailed, A::Ask, None),
                (
                    0,
                    GRANTED,
                    A::Connect(None),
                    RETRY(RetryCause::ConnectFailure),
                ),
                (0, Connected, A::Send(None), None),
                (1, OK, DELIVER, None),
            ],
        },
        Case {
            name: "connects fail until the limit: 503 UF",
            policy: MESH,
            timeouts: NONE,
            grpc: false,
            first: A::Connect(None),
            script: vec![
                (0, ConnectFailed, A::Ask, None),
                (
                    0,
                    GRANTED,
                    A::Connect(None),
                    RETRY(RetryCause::ConnectFailure),
                ),
                (0, ConnectFailed, A::Ask, None),
                (
                    0,
                    GRANTED,
                    A::Connect(None),
                    RETRY(RetryCause::ConnectFailure),
                ),
                (
                    0,
                    ConnectFailed,
                    A::Reply(LocalReply::CONNECT_FAILURE),
                    REFUSED(Refusal::Limit),
                ),
            ],
        },
        Case {
            name: "the budget refuses: the failure stands",
            policy: MESH,
            timeouts: NONE,
            grpc: false,
            first: A::Connect(None),
            script: vec![
                (0, ConnectFailed, A::Ask, None),
                (
                    0,
                    Budget {
                        granted: false,
                        random: 0,
                    },
                    A::Reply(LocalReply::CONNECT_FAILURE),
                    REFUSED(Refusal::Budget),
                ),
            ],
        },
        Case {
            name: "no endpoint: 503 UH",
            policy: MESH,
            timeouts: NONE,
            grpc: false,
            first: A::Connect(None),
            script: vec![(
                0,
                NoEndpoint,
                A::Reply(LocalReply::NO_HEALTHY_UPSTREAM),
                None,
            )],
        },
        Case {
            name: "a reset after the send is not retried by the mesh default: 503 UC",
            policy: MESH,
            timeouts: NONE,
            grpc: false,
            first: A::Connect(None),
            script: vec![
                (0, Connected, A::Send(None), None),
                (1, RESET, A::Reply(LocalReply::CONNECTION_TERMINATION), None),
            ],
        },
        Case {
            name: "a reset after the send is retried when the route asks for retries",
            policy: ROUTE_RETRY,
            timeouts: NONE,
            grpc: false,
            first: A::Connect(None),
            script: vec![
                (0, Connected, A::Send(None), None),
                (1, RESET, A::Ask, None),
                (1, GRANTED, A::Connect(None), RETRY(RetryCause::Reset)),
                (1, Connected, A::Send(None), None),
                (2, OK, DELIVER, None),
            ],
        },
        Case {
            name: "a reset whose body cannot be sent again is not retried",
            policy: ROUTE_RETRY,
            timeouts: NONE,
            grpc: false,
            first: A::Connect(None),
            script: vec![
                (0, Connected, A::Send(None), None),
                (
                    1,
                    SendFailed {
                        cause: SendFailure::Reset,
                        replayable: false,
                    },
                    A::Reply(LocalReply::CONNECTION_TERMINATION),
                    None,
                ),
            ],
        },
        Case {
            name: "a request the upstream never took is retried by the mesh default",
            policy: MESH,
            timeouts: NONE,
            grpc: false,
            first: A::Connect(None),
            script: vec![
                (0, Connected, A::Send(None), None),
                (
                    0,
                    SendFailed {
                        cause: SendFailure::NotSent,
                        replayable: true,
                    },
                    A::Ask,
                    None,
                ),
                (0, GRANTED, A::Connect(None), RETRY(RetryCause::NotSent)),
            ],
        },
        Case {
            name: "the client's broken body: 400 DPE, never retried",
            policy: ROUTE_RETRY,
            timeouts: NONE,
            grpc: false,
            first: A::Connect(None),
            script: vec![
                (0, Connected, A::Send(None), None),
                (
                    1,
                    SendFailed {
                        cause: SendFailure::ClientBody,
                        replayable: true,
                    },
                    A::Reply(LocalReply::BAD_REQUEST_BODY),
                    None,
                ),
            ],
        },
        Case {
            name: "a listed status is retried; at the limit it is delivered, flagged URX",
            policy: ROUTE_RETRY,
            timeouts: NONE,
            grpc: false,
            first: A::Connect(None),
            script: vec![
                (0, Connected, A::Send(None), None),
                (1, S503, A::Ask, None),
                (1, GRANTED, A::Connect(None), RETRY(RetryCause::Status(503))),
                (1, Connected, A::Send(None), None),
                (2, S503, A::Ask, None),
                (2, GRANTED, A::Connect(None), RETRY(RetryCause::Status(503))),
                (2, Connected, A::Send(None), None),
                (
                    3,
                    S503,
                    A::Deliver(false, ResponseFlag::UpstreamRetryLimitExceeded),
                    REFUSED(Refusal::Limit),
                ),
            ],
        },
        Case {
            name: "an unlisted status is delivered",
            policy: MESH,
            timeouts: NONE,
            grpc: false,
            first: A::Connect(None),
            script: vec![
                (0, Connected, A::Send(None), None),
                (1, S503, DELIVER, None),
            ],
        },
        Case {
            name: "a listed status whose body cannot be sent again is delivered",
            policy: ROUTE_RETRY,
            timeouts: NONE,
            grpc: false,
            first: A::Connect(None),
            script: vec![
                (0, Connected, A::Send(None), None),
                (
                    1,
                    Response {
                        status: 503,
                        grpc_status: None,
                        upgrade_matches: false,
                        replayable: false,
                    },
                    DELIVER,
                    None,
                ),
            ],
        },
        Case {
            name: "no retries: a listed status is delivered and the limit counted",
            policy: NO_RETRY,
            timeouts: NONE,
            grpc: false,
            first: A::Connect(None),
            script: vec![
                (0, Connected, A::Send(None), None),
                (
                    1,
                    S503,
                    A::Deliver(false, ResponseFlag::UpstreamRetryLimitExceeded),
                    REFUSED(Refusal::Limit),
                ),
            ],
        },
        Case {
            name: "gRPC UNAVAILABLE in a trailers-only answer is retried for a gRPC request",
            policy: MESH,
            timeouts: NONE,
            grpc: true,
            first: A::Connect(None),
            script: vec![
                (0, Connected, A::Send(None), None),
                (
                    1,
                    Response {
                        status: 200,
                        grpc_status: Some(14),
                        upgrade_matches: false,
                        replayable: true,
                    },
                    A::Ask,
                    None,
                ),
                (1, GRANTED, A::Connect(None), RETRY(RetryCause::Status(200))),
            ],
        },
        Case {
            name: "gRPC CANCELLED is retried; OK and other codes are not",
            policy: MESH,
            timeouts: NONE,
            grpc: true,
            first: A::Connect(None),
            script: vec![
                (0, Connected, A::Send(None), None),
                (
                    1,
                    Response {
                        status: 200,
                        grpc_status: Some(1),
                        upgrade_matches: false,
                        replayable: true,
                    },
                    A::Ask,
                    None,
                ),
                (1, GRANTED, A::Connect(None), RETRY(RetryCause::Status(200))),
                (1, Connected, A::Send(None), None),
                (
                    2,
                    Response {
                        status: 200,
                        grpc_status: Some(13),
                        upgrade_matches: false,
                        replayable: true,
                    },
                    DELIVER,
                    None,
                ),
            ],
        },
        Case {
            name: "a grpc-status on a request that is not gRPC is not read",
            policy: MESH,
            timeouts: NONE,
            grpc: false,
            first: A::Connect(None),
            script: vec![
                (0, Connected, A::Send(None), None),
                (
                    1,
                    Response {
                        status: 200,
                        grpc_status: Some(14),
                        upgrade_matches: false,
                        replayable: true,
                    },
                    DELIVER,
                    None,
                ),
            ],
        },
        Case {
            name: "the request timeout bounds the connect: 504 UT",
            policy: MESH,
            timeouts: Timeouts {
                request: ms(300),
                per_try: None,
            },
            grpc: false,
            first: A::Connect(Some(300)),
            script: vec![(300, TIMER, A::Reply(LocalReply::TIMEOUT), None)],
        },
        Case {
            name: "a try's deadline is its per-try timeout within the request's",
            policy: MESH,
            timeouts: Timeouts {
                request: ms(300),
                per_try: ms(100),
            },
            grpc: false,
            first: A::Connect(Some(300)),
            script: vec![
                (250, Connected, A::Send(Some(300)), None),
                (300, TIMER, A::Reply(LocalReply::TIMEOUT), None),
            ],
        },
        Case {
            name: "a try that times out is retried when the route retries resets",
            policy: ROUTE_RETRY,
            timeouts: Timeouts {
                request: ms(1000),
                per_try: ms(100),
            },
            grpc: false,
            first: A::Connect(Some(1000)),
            script: vec![
                (0, Connected, A::Send(Some(100)), None),
                (100, TIMER, A::Ask, None),
                (
                    100,
                    GRANTED,
                    A::Connect(Some(1000)),
                    RETRY(RetryCause::TryTimeout),
                ),
                (100, Connected, A::Send(Some(200)), None),
                (150, OK, DELIVER, None),
            ],
        },
        Case {
            name: "a try that times out under the mesh default: 504 UT",
            policy: MESH,
            timeouts: Timeouts {
                request: None,
                per_try: ms(100),
            },
            grpc: false,
            first: A::Connect(None),
            script: vec![
                (0, Connected, A::Send(Some(100)), None),
                (100, TIMER, A::Reply(LocalReply::TIMEOUT), None),
            ],
        },
        Case {
            name: "a try that times out with 504 listed is retried",
            policy: RetryPolicy {
                codes: &[504],
                on_reset: false,
                ..ROUTE_RETRY
            },
            timeouts: Timeouts {
                request: None,
                per_try: ms(100),
            },
            grpc: false,
            first: A::Connect(None),
            script: vec![
                (0, Connected, A::Send(Some(100)), None),
                (100, TIMER, A::Ask, None),
            ],
        },
        Case {
            name: "the backoff waits, then connects",
            policy: ROUTE_RETRY,
            timeouts: NONE,
            grpc: false,
            first: A::Connect(None),
            script: vec![
                (0, ConnectFailed, A::Ask, None),
                (
                    0,
                    Budget {
                        granted: true,
                        random: 10_000,
                    },
                    A::Wait(10),
                    RETRY(RetryCause::ConnectFailure),
                ),
                (10, TIMER, A::Connect(None), None),
            ],
        },
        Case {
            name: "a backoff that would end past the request's deadline: 504 UT",
            policy: ROUTE_RETRY,
            timeouts: Timeouts {
                request: ms(20),
                per_try: None,
            },
            grpc: false,
            first: A::Connect(Some(20)),
            script: vec![
                (5, ConnectFailed, A::Ask, None),
                (
                    5,
                    Budget {
                        granted: true,
                        random: 15_000,
                    },
                    A::Reply(LocalReply::TIMEOUT),
                    RETRY(RetryCause::ConnectFailure),
                ),
            ],
        },
        Case {
            name: "a 101 to the protocol asked for joins the connections",
            policy: MESH,
            timeouts: NONE,
            grpc: false,
            first: A::Connect(None),
            script: vec![
                (0, Connected, A::Send(None), None),
                (
                    1,
                    Response {
                        status: 101,
                        grpc_status: None,
                        upgrade_matches: true,
                        replayable: false,
                    },
                    A::Deliver(true, ResponseFlag::None),
                    None,
                ),
            ],
        },
        Case {
            name: "a 101 to another protocol: 502 UPE",
            policy: MESH,
            timeouts: NONE,
            grpc: false,
            first: A::Connect(None),
            script: vec![
                (0, Connected, A::Send(None), None),
                (
                    1,
                    Response {
                        status: 101,
                        grpc_status: None,
                        upgrade_matches: false,
                        replayable: false,
                    },
                    A::Reply(LocalReply::UPSTREAM_PROTOCOL_ERROR),
                    None,
                ),
            ],
        },
        Case {
            name: "an event nobody asked for fails the request",
            policy: MESH,
            timeouts: NONE,
            grpc: false,
            first: A::Connect(None),
            script: vec![(0, OK, A::Reply(LocalReply::CONNECTION_TERMINATION), None)],
        },
    ]
}

#[test]
fn exchanges_follow_envoys_retry_and_timeout_semantics() {
    for case in cases() {
        let t0 = Instant::now();
        let (mut exchange, first) = Exchange::start(case.policy, case.timeouts, case.grpc, t0);
        assert_eq!(
            relative(first.action, t0),
            case.first,
            "{}: first",
            case.name
        );
        for (i, (at, event, want, note)) in case.script.into_iter().enumerate() {
            let now = t0 + Duration::from_millis(at);
            let step = exchange.on(event, now);
            assert_eq!(
                (relative(step.action, t0), step.note),
                (want, note),
                "{}: step {i} ({event:?})",
                case.name
            );
        }
    }
}

#[test]
fn a_finished_exchange_answers_nothing_more() {
    let t0 = Instant::now();
    let (mut exchange, _) = Exchange::start(MESH, NONE, false, t0);
    exchange.on(Event::Connected, t0);
    assert_eq!(
        exchange.on(OK, t0).action,
        Action::Deliver {
            join_upgrade: false,
            flag: ResponseFlag::None
        }
    );
    // A late timer after the answer changes nothing the shell would act on.
    assert_eq!(
        exchange.on(TIMER, t0).action,
        Action::Reply(LocalReply::CONNECTION_TERMINATION)
    );
}

#[test]
fn the_body_is_copied_only_when_a_retry_could_resend_it() {
    let cases: &[(RetryPolicy<'static>, bool, bool)] = &[
        // The mesh default retries only what never reached the upstream.
        (MESH, false, false),
        // ... and gRPC UNAVAILABLE / CANCELLED answers, which come after the body.
        (MESH, true, true),
        (ROUTE_RETRY, false, true),
        (
            RetryPolicy {
                codes: &[],
                on_reset: true,
                ..ROUTE_RETRY
            },
            false,
            true,
        ),
        (
            RetryPolicy {
                codes: &[504],
                on_reset: false,
                ..ROUTE_RETRY
            },
            false,
            true,
        ),
        (NO_RETRY, true, false),
    ];
    for (policy, grpc, wants) in cases {
        let (exchange, _) = Exchange::start(*policy, NONE, *grpc, Instant::now());
        assert_eq!(exchange.wants_replay(), *wants, "{policy:?} grpc={grpc}");
    }
}

#[test]
fn a_mirrored_copy_is_marked_shadow_on_its_host() {
    let cases = [
        ("reviews:80", "reviews-shadow:80"),
        (
            "reviews.default.svc.cluster.local:9080",
            "reviews.default.svc.cluster.local-shadow:9080",
        ),
        ("reviews", "reviews-shadow"),
        ("[fd00::1]:80", "[fd00::1]-shadow:80"),
        ("[fd00::1]", "[fd00::1]-shadow"),
        ("reviews:", "reviews:-shadow"),
        ("", "-shadow"),
    ];
    for (authority, want) in cases {
        assert_eq!(shadow_authority(authority), want, "{authority}");
    }
}
