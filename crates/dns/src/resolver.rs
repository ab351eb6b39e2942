//! One DNS server's brain: the client it serves, the mesh, and the forwarder. Used by
//! the UDP/TCP servers and, through [`Resolver::lookup`], by SOCKS5.

use std::net::IpAddr;
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use ambit_state::{ProxyState, Workload};
use hickory_proto::op::{Message, Query, ResponseCode};
use hickory_proto::rr::{Name, RData, RecordType};
use tokio::sync::OwnedSemaphorePermit;

use crate::forward::{ForwardError, Forwarder, ResolvConf};
use crate::mesh::{self, Settings};
use crate::message::{
    decide, encode_reply, parse_request, Decision, Parsed, Protocol, ReplyParts, Request,
};
use crate::metrics::{DnsLabels, DnsMetrics};
use crate::sockets::DnsSockets;

/// A snapshot of the mesh state, taken per query.
pub type StateSource = Arc<dyn Fn() -> Arc<ProxyState> + Send + Sync>;

/// The workload a DNS server answers for, as `PROXY_WORKLOAD_INFO` or ZDS name it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientIdentity {
    pub namespace: String,
    pub name: String,
    pub service_account: String,
    /// Only this node's copy of the workload qualifies.
    pub node: Option<String>,
}

/// Everything a DNS server is configured with.
#[derive(Clone, Debug)]
pub struct DnsConfig {
    pub settings: Settings,
    pub upstream: ResolvConf,
}

/// Why [`Resolver::lookup`] found no address.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DnsError {
    #[error("{name:?} is not a valid DNS name: {reason}")]
    BadName { name: String, reason: String },
    #[error("too many DNS lookups in flight for this pod; retry later")]
    Busy,
    #[error("{0}")]
    Upstream(#[from] ForwardError),
    #[error("the upstream resolver answered {code} for {name}")]
    Failed { name: String, code: ResponseCode },
    #[error("{name} has no {family} address")]
    NoAddress { name: String, family: &'static str },
}

/// What the server does with a datagram or TCP message.
pub enum Step {
    Reply(Vec<u8>),
    Drop,
    /// Send upstream (slot taken), then reply.
    Forward(Box<ForwardJob>),
}

pub struct ForwardJob {
    request: Request,
    protocol: Protocol,
    labels: DnsLabels,
    resolver: Arc<Resolver>,
    _slot: OwnedSemaphorePermit,
}

pub struct Resolver {
    settings: Settings,
    state: StateSource,
    identity: ClientIdentity,
    forwarder: Forwarder,
    metrics: DnsMetrics,
    /// The client workload as found in the last state snapshot seen.
    client: Mutex<(Weak<ProxyState>, Option<Arc<Workload>>)>,
}

impl Resolver {
    pub fn new(
        cfg: &DnsConfig,
        state: StateSource,
        identity: ClientIdentity,
        sockets: Arc<dyn DnsSockets>,
        metrics: DnsMetrics,
    ) -> Resolver {
        Resolver {
            settings: cfg.settings.clone(),
            state,
            identity,
            forwarder: Forwarder::new(cfg.upstream.nameservers.clone(), sockets),
            metrics,
            client: Mutex::new((Weak::new(), None)),
        }
    }

    /// The client workload in `state`, looked up again only when the state changed.
    fn client(&self, state: &Arc<ProxyState>) -> Option<Arc<Workload>> {
        let mut cached = self.client.lock().unwrap_or_else(|p| p.into_inner());
        if cached.0.as_ptr() != Arc::as_ptr(state) {
            let id = &self.identity;
            let found = state.find_local_workload(
                &id.namespace,
                &id.name,
                &id.service_account,
                id.node.as_deref(),
            );
            *cached = (Arc::downgrade(state), found);
        }
        cached.1.clone()
    }

    /// Decides what to do with the bytes of one query.
    pub fn prepare(self: &Arc<Self>, bytes: &[u8], protocol: Protocol) -> Step {
        let request = match parse_request(bytes) {
            Parsed::Query(r) => *r,
            Parsed::Reply(b) => return Step::Reply(b),
            Parsed::Drop => return Step::Drop,
        };
        let state = (self.state)();
        let client = self.client(&state);
        let labels = DnsLabels::new(request.query_type(), protocol, client.as_deref());
        self.metrics.requests.get_or_create(&labels).inc();
        let parts = match decide(&state, client.as_deref(), &self.settings, &request) {
            Decision::Answer(a) => {
                tracing::debug!(
                    target: "dns",
                    query = %request.query.query_type(),
                    src.workload = client.as_ref().map(|c| c.name.as_str()).unwrap_or(""),
                    src.namespace = client.as_ref().map(|c| c.namespace.as_str()).unwrap_or(""),
                    domain = %request.name(),
                    result = %a.host,
                    endpoints = ?a.ips,
                    "dns answered from the mesh"
                );
                ReplyParts {
                    authoritative: true,
                    answers: a.records,
                    ..Default::default()
                }
            }
            Decision::Fail(code) => {
                tracing::debug!(
                    target: "dns",
                    domain = %request.name(),
                    src.workload = %self.identity.name,
                    src.namespace = %self.identity.namespace,
                    "dns client workload unknown: {code}"
                );
                ReplyParts {
                    code: Some(code),
                    ..Default::default()
                }
            }
            Decision::Forward => {
                let Some(slot) = self.forwarder.try_slot() else {
                    tracing::debug!(target: "dns", domain = %request.name(), src.workload = %self.identity.name, src.namespace = %self.identity.namespace, "dns query dropped: too many forwards in flight");
                    return Step::Drop;
                };
                return Step::Forward(Box::new(ForwardJob {
                    request,
                    protocol,
                    labels,
                    resolver: self.clone(),
                    _slot: slot,
                }));
            }
        };
        match encode_reply(&request, parts, protocol) {
            Some(b) => Step::Reply(b),
            None => Step::Drop,
        }
    }

    /// Forwards a query, counting it as ztunnel's upstream metrics do.
    async fn forward_counted(
        &self,
        query: &Query,
        labels: &DnsLabels,
    ) -> Result<Message, ForwardError> {
        self.metrics.upstream_requests.get_or_create(labels).inc();
        let start = Instant::now();
        let result = self.forwarder.forward(query).await;
        self.metrics
            .upstream_duration
            .get_or_create(labels)
            .observe(start.elapsed().as_secs_f64());
        if let Err(e) = &result {
            self.metrics.upstream_failures.get_or_create(labels).inc();
            tracing::debug!(target: "dns", domain = %query.name(), src.workload = %self.identity.name, src.namespace = %self.identity.namespace, "dns forward failed: {e}");
        }
        result
    }

    /// The addresses of `name` for `client`: a mesh name from the state, any other
    /// forwarded upstream. `want_v6` asks for AAAA, else A.
    pub async fn lookup(
        &self,
        client: &Workload,
        name: &str,
        want_v6: bool,
    ) -> Result<Vec<IpAddr>, DnsError> {
        let family = if want_v6 { "IPv6" } else { "IPv4" };
        let fqdn = if name.ends_with('.') {
            name.to_string()
        } else {
            format!("{name}.")
        };
        let parsed = Name::from_ascii(&fqdn).map_err(|e| DnsError::BadName {
            name: name.to_string(),
            reason: e.to_string(),
        })?;
        let lower = fqdn.trim_end_matches('.').to_ascii_lowercase();
        let state = (self.state)();
        if let Some(m) = mesh::find_service(&state, client, &self.settings, &lower) {
            let ips = mesh::addresses(&state, client, &self.settings, &m.service, want_v6);
            if ips.is_empty() {
                return Err(DnsError::NoAddress {
                    name: lower,
                    family,
                });
            }
            return Ok(ips);
        }
        let ty = if want_v6 {
            RecordType::AAAA
        } else {
            RecordType::A
        };
        let _slot = self.forwarder.try_slot().ok_or(DnsError::Busy)?;
        let labels = DnsLabels::new(
            ty.to_string().to_ascii_lowercase(),
            Protocol::Tcp,
            Some(client),
        );
        let reply = self
            .forward_counted(&Query::query(parsed, ty), &labels)
            .await?;
        if reply.response_code() != ResponseCode::NoError {
            return Err(DnsError::Failed {
                name: lower,
                code: reply.response_code(),
            });
        }
        let ips: Vec<IpAddr> = reply
            .answers()
            .iter()
            .filter_map(|r| match r.data() {
                RData::A(a) if !want_v6 => Some(IpAddr::V4(a.0)),
                RData::AAAA(a) if want_v6 => Some(IpAddr::V6(a.0)),
                _ => None,
            })
            .collect();
        if ips.is_empty() {
            return Err(DnsError::NoAddress {
                name: lower,
                family,
            });
        }
        Ok(ips)
    }
}

impl ForwardJob {
    /// Asks upstream and encodes the reply: its code and records, not authoritative;
    /// SERVFAIL when no upstream answered.
    pub async fn run(self) -> Option<Vec<u8>> {
        let parts = match self
            .resolver
            .forward_counted(&self.request.query, &self.labels)
            .await
        {
            Ok(mut reply) => ReplyParts {
                code: Some(reply.response_code()),
                authoritative: false,
                answers: reply.take_answers(),
                authority: reply.take_name_servers(),
                additional: reply.take_additionals(),
            },
            Err(_) => ReplyParts {
                code: Some(ResponseCode::ServFail),
                ..Default::default()
            },
        };
        encode_reply(&self.request, parts, self.protocol)
    }
}
