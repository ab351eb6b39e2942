//! Route status for users: per Service and port, the routes attached, every match in the
//! order it is evaluated, and what is not honoured and why (a backend that cannot be
//! resolved, a match that another evaluated first always wins over, a route of the other
//! kind, a part of a route the waypoint does not serve). What can be resolved is the
//! caller's to say, so this stays a function of the table.

use std::collections::BTreeSet;

use crate::model::{BackendTarget, Frontend, Route, ServiceBackend, ServiceKey};
use crate::select::{Matched, Refusal, RouteTable};

/// One frontend's routes.
#[derive(Debug, Clone)]
pub struct FrontendStatus<'t> {
    pub frontend: Frontend,
    /// Each route used, once, in the order its first match is evaluated.
    pub attached: Vec<&'t Route>,
    /// Every match, in evaluation order.
    pub evaluation: Vec<Matched<'t>>,
    pub refused: Vec<Refusal>,
}

/// The status of every frontend with routes. `ports_of` gives a Service's ports as the
/// mesh knows them (routes attached to every port are shown on each; empty for a Service
/// the mesh lacks); `backend_problem` says why a backend cannot be sent to, if it cannot.
pub fn status<'t>(
    table: &'t RouteTable,
    ports_of: impl Fn(&ServiceKey) -> Vec<u16>,
    backend_problem: impl Fn(&ServiceBackend) -> Option<String>,
) -> Vec<FrontendStatus<'t>> {
    let services: BTreeSet<&ServiceKey> = table.services().collect();
    let mut out = Vec::new();
    for key in services {
        let mut ports: BTreeSet<u16> = table.ports_named(key).into_iter().collect();
        ports.extend(ports_of(key));
        for port in ports {
            let frontend = Frontend {
                service: key.clone(),
                port,
                gateway: None,
            };
            let evaluation = table.evaluation(&frontend);
            if evaluation.is_empty() {
                continue;
            }
            let mut refused = table.refusals(&frontend);
            let mut attached: Vec<&Route> = Vec::new();
            for m in &evaluation {
                if attached.iter().any(|r| std::ptr::eq(*r, m.route)) {
                    continue;
                }
                attached.push(m.route);
                let refuse = |why: String| Refusal {
                    route: m.route.key(),
                    kind: m.route.kind,
                    why,
                };
                refused.extend(m.route.notes.iter().cloned().map(refuse));
                for (i, rule) in m.route.rules.iter().enumerate() {
                    for b in &rule.backends {
                        let why = match &b.target {
                            BackendTarget::Invalid(why) => Some(why.clone()),
                            BackendTarget::Service(s) => backend_problem(s),
                        };
                        if let Some(why) = why {
                            refused.push(refuse(format!(
                                "rule {i}: {why}: its share of requests is answered 500"
                            )));
                        }
                    }
                }
            }
            out.push(FrontendStatus {
                frontend,
                attached,
                evaluation,
                refused,
            });
        }
    }
    out
}

impl FrontendStatus<'_> {
    /// One log line per refusal: `<namespace/service>:<port>: <kind> <route>: <why>`.
    pub fn log_lines(&self) -> Vec<String> {
        self.refused
            .iter()
            .map(|r| {
                format!(
                    "{}:{}: {} {}: {}",
                    self.frontend.service, self.frontend.port, r.kind, r.route, r.why
                )
            })
            .collect()
    }
}
