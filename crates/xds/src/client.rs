//! The IO driver: one delta ADS bidi stream at a time over a gRPC channel, feeding the
//! [`DeltaClient`] state machine and a sink that applies each [`Batch`] to its type's
//! store, reconnecting with ztunnel's backoff. It serves whichever types the client
//! subscribes to: every stream starts with one request per type, with the versions of
//! that type's resources accepted so far.

use std::sync::Arc;
use std::time::Duration;

use ambit_proto::{DeltaDiscoveryRequest, DeltaDiscoveryResponse, DELTA_ADS_PATH, MAX_XDS_MESSAGE};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use prost::bytes::{Buf, Bytes};
use tokio::sync::mpsc;

use crate::batch::Batch;
use crate::delta::DeltaClient;
use crate::on_demand::OnDemand;

/// Where the stream goes: a channel and the per-request metadata (bearer token,
/// `clusterid`, extra headers). `ambit_grpc::GrpcChannel` in the node proxy; a plain
/// h2c channel in tests.
pub trait XdsTransport: Send + Sync + 'static {
    /// A channel to the control plane (lazy connect is fine).
    fn channel(&self) -> Result<tonic::transport::Channel, String>;
    /// Wraps the request stream with the call's metadata; called once per stream, so a
    /// token file is re-read on every reconnect.
    fn request<T>(&self, message: T) -> Result<tonic::Request<T>, String>;
}

/// A channel to a fixed endpoint without metadata (tests, or a control plane that needs
/// no token).
#[derive(Clone)]
pub struct PlainTransport(pub tonic::transport::Channel);

impl XdsTransport for PlainTransport {
    fn channel(&self) -> Result<tonic::transport::Channel, String> {
        Ok(self.0.clone())
    }
    fn request<T>(&self, message: T) -> Result<tonic::Request<T>, String> {
        Ok(tonic::Request::new(message))
    }
}

// ----- metrics --------------------------------------------------------------------------

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UrlLabel {
    url: String,
}

/// ztunnel's xDS metrics (all "unstable" in its HELP texts).
#[derive(Clone, Default)]
pub struct XdsMetrics {
    terminations: Family<ReasonLabel, Counter>,
    messages: Family<UrlLabel, Counter>,
    message_bytes: Family<UrlLabel, Counter>,
}

impl XdsMetrics {
    /// Registers `istio_xds_connection_terminations_total{reason}`,
    /// `istio_xds_message_total{url}` and `istio_xds_message_bytes_total{url}`.
    pub fn register(registry: &mut Registry) -> XdsMetrics {
        let m = XdsMetrics::default();
        registry.register(
            "istio_xds_connection_terminations",
            "The total number of completed connections to xds server (unstable)",
            m.terminations.clone(),
        );
        registry.register(
            "istio_xds_message",
            "Total number of messages received (unstable)",
            m.messages.clone(),
        );
        registry.register(
            "istio_xds_message_bytes",
            "Total number of bytes received (unstable)",
            m.message_bytes.clone(),
        );
        m
    }
}

// ----- backoff --------------------------------------------------------------------------

/// How a stream ended, as the terminations metric and the backoff tell them apart.
#[derive(Debug, Clone)]
pub enum StreamEnd {
    /// No channel, or the call could not be made.
    ConnectionError(String),
    /// A gRPC error that is not one of the benign ones.
    Error(tonic::Status),
    /// A benign gRPC error: the server went away in an ordinary way.
    Reconnect(tonic::Status),
    /// The server ended the stream cleanly.
    Complete,
}

impl StreamEnd {
    /// Sorts a gRPC status: Unknown, Cancelled, DeadlineExceeded, and Unavailable saying
    /// "transport is closing" or "received prior goaway" are benign.
    pub fn from_status(s: tonic::Status) -> StreamEnd {
        use tonic::Code;
        let benign = match s.code() {
            Code::Unknown | Code::Cancelled | Code::DeadlineExceeded => true,
            Code::Unavailable => {
                let m = s.message();
                m.contains("transport is closing") || m.contains("received prior goaway")
            }
            _ => false,
        };
        if benign {
            StreamEnd::Reconnect(s)
        } else {
            StreamEnd::Error(s)
        }
    }

    fn reason(&self) -> &'static str {
        match self {
            StreamEnd::ConnectionError(_) => "ConnectionError",
            StreamEnd::Error(_) => "Error",
            StreamEnd::Reconnect(_) => "Reconnect",
            StreamEnd::Complete => "Complete",
        }
    }
}

/// ztunnel's reconnect delay: 10 ms after a benign end, doubling up to 15 s while
/// errors repeat.
#[derive(Debug, Clone)]
pub struct Backoff {
    next_error: Duration,
}

impl Backoff {
    pub const INITIAL: Duration = Duration::from_millis(10);
    pub const MAX: Duration = Duration::from_secs(15);

    pub fn new() -> Self {
        Backoff {
            next_error: Self::INITIAL,
        }
    }

    /// The delay before the next stream, given how the last one ended.
    pub fn delay(&mut self, end: &StreamEnd) -> Duration {
        match end {
            StreamEnd::Reconnect(_) | StreamEnd::Complete => {
                self.next_error = Self::INITIAL;
                Self::INITIAL
            }
            StreamEnd::ConnectionError(_) | StreamEnd::Error(_) => {
                let d = self.next_error;
                self.next_error = (d * 2).min(Self::MAX);
                d
            }
        }
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new()
    }
}

// ----- the codec ------------------------------------------------------------------------

/// The ADS call's codec: requests encoded by `prost`; responses handed over as their raw
/// bytes, so that [`DeltaClient::handle_bytes`] counts their entries before decoding them
/// (the generated client's codec decodes a whole response first, whatever it holds).
struct RawResponses;

type ProstAds = tonic::codec::ProstCodec<DeltaDiscoveryRequest, DeltaDiscoveryResponse>;

impl tonic::codec::Codec for RawResponses {
    type Encode = DeltaDiscoveryRequest;
    type Decode = Bytes;
    type Encoder = <ProstAds as tonic::codec::Codec>::Encoder;
    type Decoder = RawDecoder;

    fn encoder(&mut self) -> Self::Encoder {
        tonic::codec::Codec::encoder(&mut ProstAds::default())
    }

    fn decoder(&mut self) -> RawDecoder {
        RawDecoder
    }
}

struct RawDecoder;

impl tonic::codec::Decoder for RawDecoder {
    type Item = Bytes;
    type Error = tonic::Status;

    fn decode(
        &mut self,
        buf: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<Bytes>, tonic::Status> {
        Ok(Some(buf.copy_to_bytes(buf.remaining())))
    }
}

// ----- the driver -----------------------------------------------------------------------

type OnStreamEnd = Box<dyn FnMut(&StreamEnd) + Send>;

/// An xDS client: the driver of a [`DeltaClient`] over a transport.
pub struct XdsClient<T: XdsTransport> {
    transport: Arc<T>,
    delta: DeltaClient,
    metrics: Option<XdsMetrics>,
    on_ready: Option<Box<dyn FnOnce() + Send>>,
    on_stream_end: Option<OnStreamEnd>,
    max_message_bytes: usize,
    /// On demand: the Address type's handle.
    on_demand: Option<OnDemand>,
}

impl<T: XdsTransport> XdsClient<T> {
    pub fn new(transport: T, delta: DeltaClient) -> Self {
        XdsClient {
            transport: Arc::new(transport),
            delta,
            metrics: None,
            on_ready: None,
            on_stream_end: None,
            max_message_bytes: MAX_XDS_MESSAGE,
            on_demand: None,
        }
    }

    /// Puts `istio.workload.Address` on demand (`XDS_ON_DEMAND=true`, see
    /// [`crate::on_demand`]): names the askers of `on_demand` ask for are subscribed to on
    /// the live stream, their answers told once applied, and names unused for its idle
    /// time unsubscribed and removed from the store.
    pub fn with_on_demand(mut self, on_demand: OnDemand) -> Self {
        self.delta = self
            .delta
            .with_on_demand(ambit_proto::ADDRESS_TYPE, on_demand.book());
        self.on_demand = Some(on_demand);
        self
    }

    /// The largest response decoded, in bytes (default [`MAX_XDS_MESSAGE`], 200 MiB). A
    /// larger one is refused by gRPC before it is read: nothing of it is applied or
    /// answered, the stream ends with `OutOfRange` ("decoded message length too large")
    /// as a [`StreamEnd::Error`], and the client reconnects after the error backoff.
    pub fn with_max_message_bytes(mut self, bytes: usize) -> Self {
        self.max_message_bytes = bytes;
        self
    }

    pub fn with_metrics(mut self, metrics: XdsMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Called once, when the client is ready ([`DeltaClient::is_ready`]): by default when
    /// a response of every type was received, applied and answered.
    pub fn on_ready(mut self, f: impl FnOnce() + Send + 'static) -> Self {
        self.on_ready = Some(Box::new(f));
        self
    }

    /// Called by [`XdsClient::run`] each time a stream ends, with how it ended, before the
    /// backoff delay (the same end the terminations metric counts and the log tells).
    pub fn on_stream_end(mut self, f: impl FnMut(&StreamEnd) + Send + 'static) -> Self {
        self.on_stream_end = Some(Box::new(f));
        self
    }

    /// Runs forever: one stream after another. `sink` applies each batch to its type's
    /// store atomically, before the batch is answered (in the node proxy, whose types
    /// share one store: `SharedState::update(|s| batch.apply(s))`; a process with a store
    /// per type takes each type's batch with [`Batch::downcast`]).
    pub async fn run(mut self, mut sink: impl FnMut(Batch) + Send) {
        let mut backoff = Backoff::new();
        loop {
            let end = self.stream_once(&mut sink).await;
            if let Some(m) = &self.metrics {
                m.terminations
                    .get_or_create(&ReasonLabel {
                        reason: end.reason(),
                    })
                    .inc();
            }
            if let Some(f) = &mut self.on_stream_end {
                f(&end);
            }
            let delay = backoff.delay(&end);
            match &end {
                StreamEnd::ConnectionError(e) => {
                    tracing::warn!(error = %e, retry_in = ?delay, "xDS: cannot connect to the control plane (check XDS_ADDRESS, XDS_ROOT_CA and the token)")
                }
                StreamEnd::Error(s) => {
                    tracing::warn!(code = ?s.code(), message = %s.message(), retry_in = ?delay, "xDS stream failed")
                }
                StreamEnd::Reconnect(s) => {
                    tracing::debug!(code = ?s.code(), message = %s.message(), "xDS stream closed; reconnecting")
                }
                StreamEnd::Complete => tracing::debug!("xDS stream ended; reconnecting"),
            }
            tokio::time::sleep(delay).await;
        }
    }

    /// One stream: initial requests, then responses until it ends.
    pub async fn stream_once(&mut self, sink: &mut (impl FnMut(Batch) + Send)) -> StreamEnd {
        let channel = match self.transport.channel() {
            Ok(c) => c,
            Err(e) => return StreamEnd::ConnectionError(e),
        };
        let mut grpc =
            tonic::client::Grpc::new(channel).max_decoding_message_size(self.max_message_bytes);
        // Replies are one per response, so a small buffer never fills while we wait.
        let (tx, rx) = mpsc::channel::<DeltaDiscoveryRequest>(8);
        let initial = self.delta.initial_requests();
        let outgoing = futures_util::stream::iter(initial)
            .chain(futures_util::stream::unfold(rx, |mut rx| async move {
                rx.recv().await.map(|m| (m, rx))
            }));
        let request = match self.transport.request(outgoing) {
            Ok(r) => r,
            Err(e) => return StreamEnd::ConnectionError(e),
        };
        // As the generated client does: a channel that is not ready is an Unknown status.
        if let Err(e) = grpc.ready().await {
            return StreamEnd::from_status(tonic::Status::unknown(format!(
                "Service was not ready: {e}"
            )));
        }
        let path = tonic::codegen::http::uri::PathAndQuery::from_static(DELTA_ADS_PATH);
        let mut incoming = match grpc.streaming(request, path, RawResponses).await {
            Ok(r) => r.into_inner(),
            Err(s) => return StreamEnd::from_status(s),
        };
        tracing::info!("xDS stream established");
        let on_demand = self.on_demand.clone();
        let sweep_every = on_demand.as_ref().map_or(Duration::from_secs(3600), |od| {
            (od.config().idle / 4).clamp(Duration::from_millis(100), Duration::from_secs(60))
        });
        let mut sweep = tokio::time::interval(sweep_every);
        sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let bytes = tokio::select! {
                message = incoming.message() => match message {
                    Ok(Some(r)) => r,
                    Ok(None) => return StreamEnd::Complete,
                    Err(s) => return StreamEnd::from_status(s),
                },
                _ = woken(on_demand.as_ref()) => {
                    let Some(od) = &on_demand else { continue };
                    let names = od.take_outbox();
                    if names.is_empty() {
                        continue;
                    }
                    let request = DeltaDiscoveryRequest {
                        type_url: ambit_proto::ADDRESS_TYPE.to_string(),
                        resource_names_subscribe: names,
                        ..Default::default()
                    };
                    if tx.send(request).await.is_err() {
                        return StreamEnd::ConnectionError("the request stream closed".into());
                    }
                    continue;
                }
                _ = sweep.tick(), if on_demand.is_some() => {
                    let Some(od) = &on_demand else { continue };
                    let (mut unsubscribe, freed) = od.sweep();
                    if unsubscribe.is_empty() {
                        continue;
                    }
                    // After a reconnect the server also follows what we reported holding
                    // by the resources' own names (initial_resource_versions, as istiod):
                    // those no name resolves to any more are unsubscribed too.
                    for r in &freed {
                        if !unsubscribe.contains(r) {
                            unsubscribe.push(r.clone());
                        }
                    }
                    tracing::debug!(names = unsubscribe.len(), removed = freed.len(), "xDS on-demand: unsubscribing names unused for the idle time");
                    let batch = self.delta.forget(ambit_proto::ADDRESS_TYPE, freed);
                    if !batch.is_empty() {
                        sink(batch);
                    }
                    let request = DeltaDiscoveryRequest {
                        type_url: ambit_proto::ADDRESS_TYPE.to_string(),
                        resource_names_unsubscribe: unsubscribe,
                        ..Default::default()
                    };
                    if tx.send(request).await.is_err() {
                        return StreamEnd::ConnectionError("the request stream closed".into());
                    }
                    continue;
                }
            };
            // Not a DeltaDiscoveryResponse: the Internal status prost's codec would give.
            let handled = match self.delta.handle_bytes(&bytes) {
                Ok(h) => h,
                Err(e) => return StreamEnd::from_status(tonic::Status::internal(e.to_string())),
            };
            drop(bytes);
            if let Some(m) = &self.metrics {
                let url = UrlLabel {
                    url: handled.type_url.clone(),
                };
                m.messages.get_or_create(&url).inc();
                m.message_bytes
                    .get_or_create(&url)
                    .inc_by(handled.payload_bytes);
            }
            if handled.known_type && !handled.batch.is_empty() {
                sink(handled.batch);
            }
            // Applied: the askers waiting on these names may look again.
            if let Some(od) = &on_demand {
                od.applied(&handled.answers);
            }
            if tx.send(handled.reply).await.is_err() {
                return StreamEnd::ConnectionError("the request stream closed".into());
            }
            if handled.known_type {
                self.delta.answered(&handled.type_url);
            }
            if self.on_ready.is_some() && self.delta.is_ready() {
                tracing::info!(
                    "xDS: ready (a response of every awaited type applied and answered)"
                );
                if let Some(f) = self.on_ready.take() {
                    f();
                }
            }
        }
    }

    /// The state machine (for versions and readiness).
    pub fn delta(&self) -> &DeltaClient {
        &self.delta
    }
}

use futures_util::StreamExt as _;

/// The on-demand handle's wake-up; never, without one.
async fn woken(on_demand: Option<&OnDemand>) {
    match on_demand {
        Some(od) => od.woken().await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests;

impl XdsTransport for ambit_grpc::GrpcChannel {
    fn channel(&self) -> Result<tonic::transport::Channel, String> {
        ambit_grpc::GrpcChannel::channel(self).map_err(|e| e.to_string())
    }
    fn request<T>(&self, message: T) -> Result<tonic::Request<T>, String> {
        ambit_grpc::GrpcChannel::request(self, message).map_err(|e| e.to_string())
    }
}
