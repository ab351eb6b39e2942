//! Protobuf messages of the ZDS protocol (package `istio.workload.zds`).
//!
//! Written by hand with the `prost` derive macros (no `protoc` at build time). The field
//! numbers are the wire contract with Istio's node agent and node proxy; they are pinned by
//! hand-built byte tests in [`crate::protocol`]. Note the two irregular numbers:
//! `DelWorkload.uid` is field **2**, and `WorkloadRequest.keep` is field **5**.

/// Protocol version announced in [`ZdsHello`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum Version {
    /// Proto3 default; never sent on purpose.
    NotUsed = 0,
    /// The only version so far.
    V1 = 1,
}

/// Sent once by the node proxy right after it connects.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ZdsHello {
    #[prost(enumeration = "Version", tag = "1")]
    pub version: i32,
}

/// Who the pod is. Field 4 (`trust_domain`) is reserved: the trust domain comes from xDS.
#[derive(Clone, PartialEq, Eq, Hash, prost::Message)]
pub struct WorkloadInfo {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub namespace: String,
    #[prost(string, tag = "3")]
    pub service_account: String,
}

/// Start proxying for a pod; the datagram carries the pod's netns fd (SCM_RIGHTS).
#[derive(Clone, PartialEq, prost::Message)]
pub struct AddWorkload {
    #[prost(string, tag = "1")]
    pub uid: String,
    #[prost(message, optional, tag = "2")]
    pub workload_info: Option<WorkloadInfo>,
}

/// Snapshot only: keep this pod even though its netns cannot be provided.
#[derive(Clone, PartialEq, prost::Message)]
pub struct KeepWorkload {
    #[prost(string, tag = "1")]
    pub uid: String,
}

/// The pod is gone. The uid is field **2**.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DelWorkload {
    #[prost(string, tag = "2")]
    pub uid: String,
}

/// End of the snapshot replayed after every (re)connection.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SnapshotSent {}

/// Reply to every request: empty `error` = ACK, non-empty = NACK.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Ack {
    #[prost(string, tag = "1")]
    pub error: String,
}

/// Node agent → node proxy.
#[derive(Clone, PartialEq, prost::Message)]
pub struct WorkloadRequest {
    #[prost(oneof = "workload_request::Payload", tags = "1, 5, 2, 3")]
    pub payload: Option<workload_request::Payload>,
}

/// The oneof of [`WorkloadRequest`].
pub mod workload_request {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Payload {
        #[prost(message, tag = "1")]
        Add(super::AddWorkload),
        #[prost(message, tag = "5")]
        Keep(super::KeepWorkload),
        #[prost(message, tag = "2")]
        Del(super::DelWorkload),
        #[prost(message, tag = "3")]
        SnapshotSent(super::SnapshotSent),
    }
}

/// Node proxy → node agent.
#[derive(Clone, PartialEq, prost::Message)]
pub struct WorkloadResponse {
    #[prost(oneof = "workload_response::Payload", tags = "1")]
    pub payload: Option<workload_response::Payload>,
}

/// The oneof of [`WorkloadResponse`].
pub mod workload_response {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Payload {
        #[prost(message, tag = "1")]
        Ack(super::Ack),
    }
}
