//! The delta ADS protocol of ztunnel's xDS client, sans-IO: the initial requests, the
//! handling of each `DeltaDiscoveryResponse` into one [`Batch`] for the store plus the
//! ACK/NACK to send, resource versions kept across streams, and readiness.
//!
//! Nothing here opens a socket or looks at a clock; the IO driver (`crate::client`)
//! feeds responses in and sends what comes out.
//!
//! # Limits
//!
//! A control plane is trusted to describe the mesh, not to exhaust the proxy. Besides the
//! gRPC bound on one decoded message ([`ambit_proto::MAX_XDS_MESSAGE`], 200 MiB), the
//! state machine refuses ([`Limits`]):
//! - a response with more than 1,000,000 entries (resources, removed names, aliases),
//!   counted on the encoded bytes before they are decoded ([`DeltaClient::handle_bytes`]),
//!   refused whole: nothing applied, NACKed;
//! - a resource whose name is longer than 1,024 bytes, or whose version is longer than
//!   1,024 bytes (that resource rejected);
//! - a resource body that breaks a limit of [`crate::shape`] (entries of a repeated field,
//!   bytes of a string), checked on its encoded bytes before it is decoded (rejected);
//! - a resource whose body describes another object than its name: a workload is named
//!   by its uid, a service by `namespace/hostname`, a policy by `namespace/name`
//!   (rejected, so that a removal by name always removes what was announced);
//! - a new resource name when 1,000,000 are already tracked for its type (rejected);
//! - NACK messages list at most 64 rejections, each cut at 512 bytes, then count the rest.

use std::collections::HashMap;

use ambit_proto::istio::security as psec;
use ambit_proto::istio::workload as pw;
use ambit_proto::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, Node, Status, ADDRESS_TYPE, AUTHORIZATION_TYPE,
};
use ambit_state::{Authorization, ProxyState, Service, Workload};
use prost::Message;
use prost_types::{value::Kind, ListValue, Struct, Value};

use crate::convert::{self, AddressResource};
use crate::reject::Rejection;
use crate::shape;

/// Bounds on what one control plane can make the proxy hold (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Resources plus removed names plus aliases in one response.
    pub max_per_response: usize,
    /// Bytes of a resource name.
    pub max_name_len: usize,
    /// Bytes of a resource version.
    pub max_version_len: usize,
    /// Resource names tracked (with their versions) per type.
    pub max_tracked_per_type: usize,
    /// Rejections spelled out in one NACK message.
    pub max_errors_listed: usize,
    /// Bytes of one `<name>: <reason>` entry in a NACK message.
    pub max_error_len: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_per_response: 1_000_000,
            max_name_len: 1024,
            max_version_len: 1024,
            max_tracked_per_type: 1_000_000,
            max_errors_listed: 64,
            max_error_len: 512,
        }
    }
}

// ----- node -----------------------------------------------------------------------------

/// What the proxy says about itself in the `node` of its requests (from `POD_NAME`,
/// `POD_NAMESPACE`, `INSTANCE_IP`, `NODE_NAME`, `ISTIO_META_*`, `ISTIO_METAJSON_*`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeConfig {
    pub pod_name: String,
    pub pod_namespace: String,
    /// `INSTANCE_IP`; `1.1.1.1` when unset, as ztunnel does.
    pub instance_ip: Option<String>,
    pub node_name: String,
    /// `ISTIO_META_<X>` entries with the prefix stripped, in the order to apply them.
    pub proxy_metadata: Vec<(String, String)>,
    /// `ISTIO_METAJSON_<X>` entries with the prefix stripped, already parsed.
    pub json_metadata: Vec<(String, serde_json::Value)>,
}

/// A bad `ISTIO_METAJSON_*` variable.
#[derive(Debug, thiserror::Error)]
#[error("{var}: not valid JSON ({source}); fix or unset the variable")]
pub struct NodeConfigError {
    pub var: String,
    #[source]
    pub source: serde_json::Error,
}

const META_PREFIX: &str = "ISTIO_META_";
const METAJSON_PREFIX: &str = "ISTIO_METAJSON_";

impl NodeConfig {
    /// Reads the node's variables from `vars` (e.g. `std::env::vars()`). Metadata
    /// entries are sorted by name, so the result does not depend on the environment's
    /// order.
    pub fn from_vars(
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Result<NodeConfig, NodeConfigError> {
        let mut cfg = NodeConfig::default();
        for (k, v) in vars {
            match k.as_str() {
                "POD_NAME" => cfg.pod_name = v,
                "POD_NAMESPACE" => cfg.pod_namespace = v,
                "INSTANCE_IP" => cfg.instance_ip = Some(v),
                "NODE_NAME" => cfg.node_name = v,
                _ => {
                    if let Some(name) = k.strip_prefix(METAJSON_PREFIX) {
                        let value = serde_json::from_str(&v).map_err(|source| NodeConfigError {
                            var: k.clone(),
                            source,
                        })?;
                        cfg.json_metadata.push((name.to_string(), value));
                    } else if let Some(name) = k.strip_prefix(META_PREFIX) {
                        cfg.proxy_metadata.push((name.to_string(), v));
                    }
                }
            }
        }
        cfg.proxy_metadata.sort();
        cfg.json_metadata.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(cfg)
    }

    fn ip(&self) -> &str {
        match self.instance_ip.as_deref() {
            Some(ip) if !ip.is_empty() => ip,
            _ => "1.1.1.1",
        }
    }

    /// `ztunnel~<ip>~<pod>.<ns>~<ns>.svc.cluster.local`.
    pub fn node_id(&self) -> String {
        format!(
            "ztunnel~{}~{}.{}~{}.svc.cluster.local",
            self.ip(),
            self.pod_name,
            self.pod_namespace,
            self.pod_namespace
        )
    }

    /// The `node` of the initial requests: id and metadata (`NAME`, `NAMESPACE`,
    /// `INSTANCE_IPS`, `NODE_NAME`, then the proxy metadata, then the JSON metadata; a
    /// later entry of the same name wins). `cluster` and `build_version` stay empty.
    pub fn to_node(&self) -> Node {
        let mut fields = std::collections::BTreeMap::new();
        let s = |v: &str| Value {
            kind: Some(Kind::StringValue(v.to_string())),
        };
        fields.insert("NAME".to_string(), s(&self.pod_name));
        fields.insert("NAMESPACE".to_string(), s(&self.pod_namespace));
        fields.insert("INSTANCE_IPS".to_string(), s(self.ip()));
        fields.insert("NODE_NAME".to_string(), s(&self.node_name));
        for (k, v) in &self.proxy_metadata {
            fields.insert(k.clone(), s(v));
        }
        for (k, v) in &self.json_metadata {
            fields.insert(k.clone(), json_to_value(v));
        }
        Node {
            id: self.node_id(),
            cluster: String::new(),
            metadata: Some(Struct { fields }),
            build_version: String::new(),
        }
    }
}

fn json_to_value(v: &serde_json::Value) -> Value {
    use serde_json::Value as J;
    let kind = match v {
        J::Null => Kind::NullValue(0),
        J::Bool(b) => Kind::BoolValue(*b),
        J::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(0.0)),
        J::String(s) => Kind::StringValue(s.clone()),
        J::Array(a) => Kind::ListValue(ListValue {
            values: a.iter().map(json_to_value).collect(),
        }),
        J::Object(o) => Kind::StructValue(Struct {
            fields: o
                .iter()
                .map(|(k, v)| (k.clone(), json_to_value(v)))
                .collect(),
        }),
    };
    Value { kind: Some(kind) }
}

// ----- batches --------------------------------------------------------------------------

/// One change to the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Workload(Box<Workload>),
    Service(Service),
    Policy(Authorization),
    /// An Address resource removed by name (see [`Batch::apply`]).
    RemoveAddress(String),
    /// An Authorization resource removed by `namespace/name`.
    RemovePolicy(String),
}

/// The changes of one response, to apply to a [`ProxyState`] at once (removals first,
/// then insertions, in the response's order).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Batch {
    pub ops: Vec<Op>,
}

impl Batch {
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Applies the batch. Resources were checked when the batch was made, so the store
    /// refuses none in practice; any it does refuse is logged and skipped.
    ///
    /// An Address removal follows ztunnel: the name is first tried as a workload uid;
    /// else, split at the first `/` as `namespace/hostname`, it names a service unless
    /// the hostname part still holds a `/` (then it was a workload uid we did not have).
    pub fn apply(self, state: &mut ProxyState) {
        for op in self.ops {
            let refused = match op {
                Op::RemoveAddress(name) => {
                    if state.remove_workload(&name).is_none() {
                        if let Some((_, host)) = name.split_once('/') {
                            if !host.contains('/') {
                                state.remove_service(&name);
                            }
                        }
                    }
                    None
                }
                Op::RemovePolicy(name) => {
                    state.remove_policy(&name);
                    None
                }
                Op::Workload(w) => {
                    let uid = w.uid.clone();
                    state.insert_workload(*w).err().map(|e| (uid, e))
                }
                Op::Service(s) => {
                    let key = s.key();
                    state.insert_service(s).err().map(|e| (key, e))
                }
                Op::Policy(p) => {
                    let key = p.key();
                    state.insert_policy(p).err().map(|e| (key, e))
                }
            };
            if let Some((name, reason)) = refused {
                tracing::warn!(resource = %name, %reason, "xDS resource refused by the store");
            }
        }
    }
}

// ----- the state machine ----------------------------------------------------------------

/// What handling one response produced.
#[derive(Debug, Clone, PartialEq)]
pub struct Handled {
    /// The response's type URL.
    pub type_url: String,
    /// False for a type this client did not subscribe to (ACKed, nothing applied).
    pub known_type: bool,
    /// The changes to apply.
    pub batch: Batch,
    /// The ACK, or the NACK when `rejected` is not empty.
    pub reply: DeltaDiscoveryRequest,
    /// `(resource name, reason)` of each rejected resource (`response` for a response
    /// refused whole).
    pub rejected: Vec<(String, Rejection)>,
    /// Sum of the resources' payload bytes (the `istio_xds_message_bytes` metric).
    pub payload_bytes: u64,
}

#[derive(Debug)]
struct TypeState {
    type_url: &'static str,
    /// Accepted resource name → version.
    versions: HashMap<String, String>,
    /// A response of this type was answered (ACK or NACK) at least once.
    answered: bool,
}

/// The delta ADS client state: what was accepted (for `initial_resource_versions`) and
/// what was answered (for readiness). Kept across streams.
#[derive(Debug)]
pub struct DeltaClient {
    node: Node,
    limits: Limits,
    types: Vec<TypeState>,
}

impl DeltaClient {
    /// A wildcard client for ADDRESS_TYPE and AUTHORIZATION_TYPE.
    pub fn new(node: Node) -> Self {
        Self::with_limits(node, Limits::default())
    }

    pub fn with_limits(node: Node, limits: Limits) -> Self {
        let ty = |type_url| TypeState {
            type_url,
            versions: HashMap::new(),
            answered: false,
        };
        DeltaClient {
            node,
            limits,
            types: vec![ty(ADDRESS_TYPE), ty(AUTHORIZATION_TYPE)],
        }
    }

    /// The requests to send first on every stream: one wildcard subscription per type,
    /// with the node and the versions of the resources accepted so far.
    pub fn initial_requests(&self) -> Vec<DeltaDiscoveryRequest> {
        self.types
            .iter()
            .map(|t| DeltaDiscoveryRequest {
                node: Some(self.node.clone()),
                type_url: t.type_url.to_string(),
                initial_resource_versions: t
                    .versions
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
                ..Default::default()
            })
            .collect()
    }

    /// True once a response of every type was answered ([`DeltaClient::answered`]).
    pub fn is_ready(&self) -> bool {
        self.types.iter().all(|t| t.answered)
    }

    /// Records that the reply to a response of `type_url` was sent. Returns true if that
    /// made the client ready just now.
    pub fn answered(&mut self, type_url: &str) -> bool {
        let was = self.is_ready();
        if let Some(t) = self.types.iter_mut().find(|t| t.type_url == type_url) {
            t.answered = true;
        }
        !was && self.is_ready()
    }

    /// Accepted resources of a type (name → version).
    pub fn versions(&self, type_url: &str) -> Option<&HashMap<String, String>> {
        self.types
            .iter()
            .find(|t| t.type_url == type_url)
            .map(|t| &t.versions)
    }

    /// Decodes `bytes` as a `DeltaDiscoveryResponse` and handles it. The entries of its
    /// repeated fields are counted on the bytes first: a response over
    /// [`Limits::max_per_response`] is NACKed whole from its type and nonce alone, without
    /// decoding the rest (an empty resource is 2 bytes on the wire and ~150 once decoded).
    pub fn handle_bytes(&mut self, bytes: &[u8]) -> Result<Handled, prost::DecodeError> {
        let count = shape::count_response_entries(bytes);
        if count > self.limits.max_per_response {
            let head = shape::ResponseHead::decode(bytes)?;
            let payload_bytes = bytes.len() as u64;
            return Ok(self.refuse_whole(head.type_url, head.nonce, count, payload_bytes));
        }
        Ok(self.handle(DeltaDiscoveryResponse::decode(bytes)?))
    }

    /// The answer to a response with `count` entries, over the limit: nothing applied.
    fn refuse_whole(
        &mut self,
        type_url: String,
        nonce: String,
        count: usize,
        payload_bytes: u64,
    ) -> Handled {
        let limits = self.limits;
        let Some(ty) = self.types.iter().find(|t| t.type_url == type_url) else {
            return Handled {
                reply: reply(&type_url, nonce, &[], &limits),
                type_url,
                known_type: false,
                batch: Batch::default(),
                rejected: Vec::new(),
                payload_bytes,
            };
        };
        let rejected = vec![(
            "response".to_string(),
            Rejection::ResponseTooLarge {
                count,
                limit: limits.max_per_response,
            },
        )];
        tracing::warn!(
            type_url = ty.type_url,
            count,
            limit = limits.max_per_response,
            "xDS response refused whole (NACK): too many entries"
        );
        Handled {
            reply: reply(ty.type_url, nonce, &rejected, &limits),
            type_url,
            known_type: true,
            batch: Batch::default(),
            rejected,
            payload_bytes,
        }
    }

    /// Handles one response: each resource decoded and checked on its own (a bad one is
    /// rejected, the rest applies), removals, versions, and the reply.
    pub fn handle(&mut self, resp: DeltaDiscoveryResponse) -> Handled {
        let limits = self.limits;
        let payload_bytes = resp
            .resources
            .iter()
            .filter_map(|r| r.resource.as_ref())
            .map(|a| a.value.len() as u64)
            .sum();
        let Some(ty) = self.types.iter_mut().find(|t| t.type_url == resp.type_url) else {
            tracing::info!(type_url = %cut(&resp.type_url, 256), "xDS response of a type we did not ask for: ACKed and ignored");
            return Handled {
                reply: reply(&resp.type_url, resp.nonce, &[], &limits),
                type_url: resp.type_url,
                known_type: false,
                batch: Batch::default(),
                rejected: Vec::new(),
                payload_bytes,
            };
        };
        let type_url = ty.type_url;
        let mut batch = Batch::default();
        let mut rejected = Vec::new();
        let count = resp
            .resources
            .iter()
            .map(|r| r.aliases.len())
            .fold(resp.resources.len(), usize::saturating_add)
            .saturating_add(resp.removed_resources.len());
        if count > limits.max_per_response {
            return self.refuse_whole(resp.type_url, resp.nonce, count, payload_bytes);
        }
        for name in resp.removed_resources {
            if name.len() > limits.max_name_len {
                // Never accepted, so nothing to remove.
                continue;
            }
            ty.versions.remove(&name);
            batch.ops.push(if type_url == ADDRESS_TYPE {
                Op::RemoveAddress(name)
            } else {
                Op::RemovePolicy(name)
            });
        }
        for r in resp.resources {
            let name = r.name;
            let checked = check_resource(type_url, &name, &r.version, r.resource, &limits)
                .and_then(|op| {
                    let tracked = ty.versions.contains_key(&name);
                    if !tracked && ty.versions.len() >= limits.max_tracked_per_type {
                        Err(Rejection::TooManyTracked {
                            limit: limits.max_tracked_per_type,
                        })
                    } else {
                        Ok(op)
                    }
                });
            match checked {
                Ok(op) => {
                    ty.versions.insert(name, r.version);
                    batch.ops.push(op);
                }
                Err(reason) => {
                    // Left out of the versions, so the control plane sends it again.
                    ty.versions.remove(&name);
                    rejected.push((name, reason));
                }
            }
        }
        if !rejected.is_empty() {
            tracing::warn!(
                type_url,
                rejected = rejected.len(),
                first = %format!("{}: {}", cut(&rejected[0].0, 256), cut(&rejected[0].1.to_string(), 512)),
                "xDS resources rejected (NACK); the rest of the response applies"
            );
        }
        Handled {
            reply: reply(type_url, resp.nonce, &rejected, &limits),
            type_url: resp.type_url,
            known_type: true,
            batch,
            rejected,
            payload_bytes,
        }
    }
}

fn check_resource(
    type_url: &'static str,
    name: &str,
    version: &str,
    any: Option<prost_types::Any>,
    limits: &Limits,
) -> Result<Op, Rejection> {
    if name.len() > limits.max_name_len {
        return Err(Rejection::NameTooLong {
            len: name.len(),
            limit: limits.max_name_len,
        });
    }
    if version.len() > limits.max_version_len {
        return Err(Rejection::VersionTooLong {
            len: version.len(),
            limit: limits.max_version_len,
        });
    }
    let any = any.ok_or(Rejection::NoPayload)?;
    if any.type_url != type_url {
        return Err(Rejection::WrongType {
            got: cut(&any.type_url, 256).to_string(),
            want: type_url,
        });
    }
    // The shape first, on the bytes: only a body within the limits is decoded.
    let bytes = any.value.as_slice();
    let (op, what, body) = if type_url == ADDRESS_TYPE {
        const MESSAGE: &str = "istio.workload.Address";
        shape::check_address(bytes).map_err(|e| Rejection::shape(MESSAGE, e))?;
        let a = pw::Address::decode(bytes).map_err(|e| Rejection::Decode {
            message: MESSAGE,
            reason: e.to_string(),
        })?;
        match convert::address_from_proto(a)? {
            AddressResource::Workload(w) => {
                let uid = w.uid.clone();
                (Op::Workload(w), "workload uid", uid)
            }
            AddressResource::Service(s) => {
                let key = s.key();
                (Op::Service(*s), "service namespace/hostname", key)
            }
        }
    } else {
        const MESSAGE: &str = "istio.security.Authorization";
        shape::check_authorization(bytes).map_err(|e| Rejection::shape(MESSAGE, e))?;
        let a = psec::Authorization::decode(bytes).map_err(|e| Rejection::Decode {
            message: MESSAGE,
            reason: e.to_string(),
        })?;
        let p = convert::authorization_from_proto(a)?;
        let key = p.key();
        (Op::Policy(p), "policy namespace/name", key)
    };
    if body != name {
        return Err(Rejection::NameMismatch {
            what,
            body: cut(&body, 256).to_string(),
        });
    }
    Ok(op)
}

/// At most `max` bytes of `s`, cut at a character boundary.
fn cut(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

fn reply(
    type_url: &str,
    nonce: String,
    rejected: &[(String, Rejection)],
    limits: &Limits,
) -> DeltaDiscoveryRequest {
    let error_detail = (!rejected.is_empty()).then(|| {
        let mut parts: Vec<String> = rejected
            .iter()
            .take(limits.max_errors_listed)
            .map(|(n, r)| cut(&format!("{n}: {r}"), limits.max_error_len).to_string())
            .collect();
        if rejected.len() > limits.max_errors_listed {
            parts.push(format!(
                "and {} more",
                rejected.len() - limits.max_errors_listed
            ));
        }
        Status {
            code: 0,
            message: parts.join("; "),
            details: Vec::new(),
        }
    });
    DeltaDiscoveryRequest {
        type_url: type_url.to_string(),
        response_nonce: nonce,
        error_detail,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests;
