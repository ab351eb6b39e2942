//! One forwarded request's life after its route is chosen, without IO: tries, retries
//! with Envoy's semantics, the per-try and the request timeout, the backoff between tries,
//! an upgrade's answer, and the local reply when it all fails. The shell (`http.rs`) opens
//! connections, sends and sleeps as told, and reports what happened; time and randomness
//! are passed in, so every path is table-tested (`exchange/tests.rs`).
//!
//! What is retried (Istio 1.31's waypoint; reference waypoint.md §3.3):
//! - a failed connect, and a request the upstream never took (its connection closed
//!   before the request was written, an HTTP/2 stream refused): always, within the limit;
//! - a connection reset after the request was sent, and a try's timeout: when the route
//!   asks for it (an HTTPRoute `retry`, as the Gateway API's `HTTPRouteRetryConnectionError`
//!   case requires: Envoy's `reset`), or when 504 is a listed code;
//! - a response with a listed status, or gRPC UNAVAILABLE / CANCELLED;
//! - a try that sent the body only when the body can be sent again.
//!
//! A client whose body broke gets 400 and is never retried.

use std::time::{Duration, Instant};

use ambit_telemetry::ResponseFlag;

use crate::local_reply::LocalReply;
use crate::request_plan::RetryPolicy;

/// What the shell is told to do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Choose an endpoint not yet tried and open a connection to it; report
    /// [`Event::Connected`], [`Event::ConnectFailed`] or [`Event::NoEndpoint`], or
    /// [`Event::TimerFired`] if `deadline` passes first.
    Connect { deadline: Option<Instant> },
    /// Send the request on the open connection (the body as it comes on the first send,
    /// else again); report [`Event::Response`] or [`Event::SendFailed`], or
    /// [`Event::TimerFired`] if `deadline` (the try's) passes first.
    Send { deadline: Option<Instant> },
    /// Ask the destination's retry budget; report [`Event::Budget`].
    AskBudget,
    /// Sleep until `until`, then report [`Event::TimerFired`].
    Wait { until: Instant },
    /// Give the upstream's response to the client; `join_upgrade`: it switched to the
    /// protocol the client asked for, and the two connections are joined. `flag`: `URX`
    /// when the response was one to retry and the retry limit was reached (as Envoy).
    Deliver {
        join_upgrade: bool,
        flag: ResponseFlag,
    },
    /// Answer the client from here.
    Reply(LocalReply),
}

/// What happened, reported by the shell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    Connected,
    ConnectFailed,
    /// No endpoint is left to try.
    NoEndpoint,
    /// The try's request failed before a response began.
    SendFailed {
        cause: SendFailure,
        /// The body can be sent again (it came back unsent, or its copy is whole).
        replayable: bool,
    },
    Response {
        status: u16,
        /// `grpc-status` in the response head (a trailers-only answer).
        grpc_status: Option<u32>,
        /// A 101 switched to the protocol the client asked to upgrade to.
        upgrade_matches: bool,
        replayable: bool,
    },
    /// The deadline the last action named passed, or the backoff ended.
    TimerFired {
        replayable: bool,
    },
    /// The retry budget's answer; `random` chooses the backoff.
    Budget {
        granted: bool,
        random: u64,
    },
}

/// Why a send failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendFailure {
    /// The upstream never took the request: its connection closed before it was written,
    /// or an HTTP/2 stream was refused. Safe to send elsewhere.
    NotSent,
    /// The connection closed or was reset after the request was sent.
    Reset,
    /// The client's own body broke its framing.
    ClientBody,
}

/// What an event led to, for metrics and the debug log, beside the next action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Note {
    /// A retry was granted; its cause.
    Retrying(RetryCause),
    /// A retry was wanted and refused.
    RetryRefused(Refusal),
}

/// Why a try is retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryCause {
    ConnectFailure,
    NotSent,
    Reset,
    TryTimeout,
    Status(u16),
}

/// Why a wanted retry was not made (the `reason` label of
/// `ambit_waypoint_upstream_retries_refused_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The route's retry count was used up.
    Limit,
    /// The destination's retry budget was spent.
    Budget,
}

impl Refusal {
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::Limit => "limit",
            Refusal::Budget => "budget",
        }
    }
}

/// The next action, and what the event led to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    pub action: Action,
    pub note: Option<Note>,
}

impl From<Action> for Step {
    fn from(action: Action) -> Step {
        Step { action, note: None }
    }
}

/// The route's timeouts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Timeouts {
    /// From the request's start to the response's head (and, in the shell, its end).
    pub request: Option<Duration>,
    /// Each try, from its send to the response's head.
    pub per_try: Option<Duration>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Connecting,
    Sending,
    /// A retry is wanted; the budget is asked. What ends the request if it says no.
    AskingBudget {
        cause: RetryCause,
        otherwise: Action,
    },
    BackingOff,
    Done,
}

/// One forwarded request's tries.
#[derive(Debug)]
pub struct Exchange<'p> {
    policy: RetryPolicy<'p>,
    per_try: Option<Duration>,
    grpc: bool,
    deadline: Option<Instant>,
    /// Tries started (a connect counts), the first included.
    tries: u32,
    phase: Phase,
}

impl<'p> Exchange<'p> {
    /// A request starting at `now`, and its first action.
    pub fn start(
        policy: RetryPolicy<'p>,
        timeouts: Timeouts,
        grpc: bool,
        now: Instant,
    ) -> (Exchange<'p>, Step) {
        let deadline = timeouts.request.map(|d| now + d);
        let exchange = Exchange {
            policy,
            per_try: timeouts.per_try,
            grpc,
            deadline,
            tries: 1,
            phase: Phase::Connecting,
        };
        (exchange, Action::Connect { deadline }.into())
    }

    /// The request's overall deadline.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// Whether the body must be copied as it is sent, so a retry can send it again.
    pub fn wants_replay(&self) -> bool {
        self.policy.retries > 0
            && (!self.policy.codes.is_empty() || self.grpc || self.retries_after_send())
    }

    /// Whether a failure after the request was sent is retried (Envoy's `reset`).
    fn retries_after_send(&self) -> bool {
        self.policy.on_reset || self.policy.codes.contains(&504)
    }

    /// The next action after `event`, at `now`.
    pub fn on(&mut self, event: Event, now: Instant) -> Step {
        let step = self.next(event, now);
        if matches!(step.action, Action::Deliver { .. } | Action::Reply(_)) {
            self.phase = Phase::Done;
        }
        step
    }

    fn next(&mut self, event: Event, now: Instant) -> Step {
        let past_deadline = self.deadline.is_some_and(|d| now >= d);
        match (self.phase, event) {
            (Phase::Connecting, Event::Connected) => {
                self.phase = Phase::Sending;
                Action::Send {
                    deadline: self.try_deadline(now),
                }
                .into()
            }
            (Phase::Connecting, Event::ConnectFailed) => self.retry(
                RetryCause::ConnectFailure,
                true,
                Action::Reply(LocalReply::CONNECT_FAILURE),
            ),
            (Phase::Connecting, Event::NoEndpoint) => {
                Action::Reply(LocalReply::NO_HEALTHY_UPSTREAM).into()
            }
            (Phase::Connecting, Event::TimerFired { .. }) => {
                Action::Reply(LocalReply::TIMEOUT).into()
            }
            (Phase::Sending, Event::SendFailed { cause, replayable }) => match cause {
                SendFailure::ClientBody => Action::Reply(LocalReply::BAD_REQUEST_BODY).into(),
                SendFailure::NotSent => self.retry(
                    RetryCause::NotSent,
                    replayable,
                    Action::Reply(LocalReply::CONNECTION_TERMINATION),
                ),
                SendFailure::Reset if self.retries_after_send() => self.retry(
                    RetryCause::Reset,
                    replayable,
                    Action::Reply(LocalReply::CONNECTION_TERMINATION),
                ),
                SendFailure::Reset => Action::Reply(LocalReply::CONNECTION_TERMINATION).into(),
            },
            (Phase::Sending, Event::TimerFired { replayable }) => {
                if past_deadline || !self.retries_after_send() {
                    return Action::Reply(LocalReply::TIMEOUT).into();
                }
                self.retry(
                    RetryCause::TryTimeout,
                    replayable,
                    Action::Reply(LocalReply::TIMEOUT),
                )
            }
            (
                Phase::Sending,
                Event::Response {
                    status,
                    grpc_status,
                    upgrade_matches,
                    replayable,
                },
            ) => {
                let deliver = match status {
                    101 if upgrade_matches => Action::Deliver {
                        join_upgrade: true,
                        flag: ResponseFlag::None,
                    },
                    // A switch the client did not ask for would take the connection
                    // past every check.
                    101 => Action::Reply(LocalReply::UPSTREAM_PROTOCOL_ERROR),
                    _ => Action::Deliver {
                        join_upgrade: false,
                        flag: ResponseFlag::None,
                    },
                };
                let retriable = self.policy.codes.contains(&status)
                    || (self.grpc && matches!(grpc_status, Some(1 | 14)));
                match retriable {
                    true => self.retry(RetryCause::Status(status), replayable, deliver),
                    false => deliver.into(),
                }
            }
            (Phase::AskingBudget { cause, otherwise }, Event::Budget { granted, random }) => {
                if !granted {
                    return Step {
                        action: otherwise,
                        note: Some(Note::RetryRefused(Refusal::Budget)),
                    };
                }
                let wait = self.policy.backoff_before(self.tries, random);
                self.tries += 1;
                let action = if self.deadline.is_some_and(|d| now + wait >= d) {
                    Action::Reply(LocalReply::TIMEOUT)
                } else if wait.is_zero() {
                    self.phase = Phase::Connecting;
                    Action::Connect {
                        deadline: self.deadline,
                    }
                } else {
                    self.phase = Phase::BackingOff;
                    Action::Wait { until: now + wait }
                };
                Step {
                    action,
                    note: Some(Note::Retrying(cause)),
                }
            }
            (Phase::BackingOff, Event::TimerFired { .. }) => {
                if past_deadline {
                    return Action::Reply(LocalReply::TIMEOUT).into();
                }
                self.phase = Phase::Connecting;
                Action::Connect {
                    deadline: self.deadline,
                }
                .into()
            }
            // An event the last action did not ask for: the shell's bug. Fail the request
            // rather than guess.
            (phase, event) => {
                tracing::warn!(?phase, ?event, "request exchange: unexpected event");
                Action::Reply(LocalReply::CONNECTION_TERMINATION).into()
            }
        }
    }

    /// A retry for `cause` if one is left and the body allows it; else `otherwise`.
    fn retry(&mut self, cause: RetryCause, replayable: bool, otherwise: Action) -> Step {
        if !replayable {
            return otherwise.into();
        }
        if self.tries > self.policy.retries {
            let action = match otherwise {
                Action::Deliver { join_upgrade, .. } => Action::Deliver {
                    join_upgrade,
                    flag: ResponseFlag::UpstreamRetryLimitExceeded,
                },
                other => other,
            };
            return Step {
                action,
                note: Some(Note::RetryRefused(Refusal::Limit)),
            };
        }
        self.phase = Phase::AskingBudget { cause, otherwise };
        Action::AskBudget.into()
    }

    /// This try's deadline: the per-try timeout from `now`, within the request's.
    fn try_deadline(&self, now: Instant) -> Option<Instant> {
        match (self.per_try.map(|t| now + t), self.deadline) {
            (Some(t), Some(d)) => Some(t.min(d)),
            (t, d) => t.or(d),
        }
    }
}

/// The authority a mirrored copy carries: `-shadow` added to the host, as Envoy marks
/// mirrored requests (`reviews:80` → `reviews-shadow:80`).
pub fn shadow_authority(authority: &str) -> String {
    match authority.rsplit_once(':') {
        Some((host, port)) if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => {
            format!("{host}-shadow:{port}")
        }
        _ => format!("{authority}-shadow"),
    }
}

#[cfg(test)]
mod tests;
