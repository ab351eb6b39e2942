//! The delta ADS service: each client's stream, registered, bounded and driven by its
//! session.

use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use ambit_proto::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use ambit_proto::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use ambit_proto::{DeltaDiscoveryRequest, DeltaDiscoveryResponse};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::config::CLIENT_QUEUE;
use crate::session::Session;
use crate::shared::{lock, Shared};
use crate::shared::{ClientEntry, ReasonLabel, TypeLabel};

pub(crate) fn sotw_unimplemented() -> Status {
    Status::unimplemented("ambit control serves incremental xDS only: use DeltaAggregatedResources")
}

/// The delta ADS service.
pub(crate) struct Ads {
    pub(crate) shared: Arc<Shared>,
}

impl Ads {
    /// The delta ADS service over `shared`, with the message bounds of both modes.
    pub(crate) fn service(shared: &Arc<Shared>) -> AggregatedDiscoveryServiceServer<Ads> {
        AggregatedDiscoveryServiceServer::new(Ads {
            shared: shared.clone(),
        })
        .max_decoding_message_size(crate::config::MAX_REQUEST_BYTES)
        .max_encoding_message_size(ambit_proto::MAX_XDS_MESSAGE)
    }
}

pub(crate) type SotwStream =
    Pin<Box<dyn futures_util::Stream<Item = Result<DiscoveryResponse, Status>> + Send>>;

#[tonic::async_trait]
impl AggregatedDiscoveryService for Ads {
    type StreamAggregatedResourcesStream = SotwStream;
    type DeltaAggregatedResourcesStream = ReceiverStream<Result<DeltaDiscoveryResponse, Status>>;

    async fn stream_aggregated_resources(
        &self,
        _request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<SotwStream>, Status> {
        Err(sotw_unimplemented())
    }

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        let shared = self.shared.clone();
        let Ok(slot) = shared.client_slots.clone().try_acquire_owned() else {
            return Err(Status::resource_exhausted(format!(
                "ambit control already serves {} xDS clients (raise --max-clients)",
                shared.config.max_clients
            )));
        };
        let peer = request.remote_addr();
        let id = shared.next_session.fetch_add(1, Ordering::Relaxed);
        let mut new_session = Session::new(id, shared.config.limits);
        if let Some(kube) = &shared.kube {
            new_session
                .set_view(crate::kubernetes::view_of(kube, request.metadata()).map_err(|s| *s)?);
        }
        let session = Arc::new(Mutex::new(new_session));
        lock(&shared.clients).insert(
            id,
            ClientEntry {
                peer,
                session: session.clone(),
            },
        );
        shared.metrics.clients.inc();
        let (tx, rx) = mpsc::channel(CLIENT_QUEUE);
        let stream = request.into_inner();
        tokio::spawn(async move {
            let _slot = slot;
            let _registered = Registered {
                shared: shared.clone(),
                id,
            };
            serve_client(&shared, &session, stream, tx).await;
            let node = lock(&session).node_id().map(str::to_string);
            tracing::info!(id, ?peer, ?node, "xDS client gone");
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// Removes a client from the registry however its task ends.
pub(crate) struct Registered {
    pub(crate) shared: Arc<Shared>,
    pub(crate) id: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        lock(&self.shared.clients).remove(&self.id);
        self.shared.metrics.clients.dec();
    }
}

pub(crate) async fn serve_client(
    shared: &Shared,
    session: &Mutex<Session>,
    mut requests: Streaming<DeltaDiscoveryRequest>,
    tx: mpsc::Sender<Result<DeltaDiscoveryResponse, Status>>,
) {
    let mut mesh_rx = shared.mesh_tx.subscribe();
    loop {
        let responses = tokio::select! {
            msg = requests.message() => match msg {
                Ok(Some(req)) => {
                    // Not `borrow_and_update`: a request (an ACK, say) that arrives just
                    // after a publish must not mark that snapshot seen, or its changes
                    // would never be pushed to this client.
                    let mesh = mesh_rx.borrow().clone();
                    let type_url = req.type_url.clone();
                    let step = {
                        let mut s = lock(session);
                        let step = s.on_request(req, &mesh.snapshot);
                        shared.metrics.account(&mut s);
                        step
                    };
                    match step {
                        Ok(step) => {
                            if step.subscribed > 0 {
                                shared
                                    .metrics
                                    .names_subscribed
                                    .get_or_create(&TypeLabel { type_url })
                                    .inc_by(step.subscribed);
                            }
                            if step.acked {
                                shared.metrics.acks.inc();
                            }
                            if step.nacked {
                                shared.metrics.nacks.inc();
                                let s = lock(session);
                                tracing::warn!(node = ?s.node_id(), "a client rejected resources (see /debug)");
                            }
                            step.responses
                        }
                        Err(e) => {
                            shared
                                .metrics
                                .requests_refused
                                .get_or_create(&ReasonLabel { reason: e.reason() })
                                .inc();
                            let node = lock(session).node_id().map(str::to_string);
                            tracing::warn!(?node, "xDS stream refused: {e}");
                            let _ = tx.send(Err(Status::invalid_argument(e.to_string()))).await;
                            return;
                        }
                    }
                }
                Ok(None) => return,
                Err(status) => {
                    if status.code() == tonic::Code::OutOfRange {
                        // Over MAX_REQUEST_BYTES: tell the client why its stream ends.
                        tracing::warn!("xDS request refused: {}", status.message());
                        shared
                            .metrics
                            .requests_refused
                            .get_or_create(&ReasonLabel { reason: "too_large" })
                            .inc();
                        let _ = tx.send(Err(status)).await;
                    } else {
                        tracing::debug!("xDS stream ended: {status}");
                    }
                    return;
                }
            },
            changed = mesh_rx.changed() => {
                if changed.is_err() {
                    return;
                }
                let mesh = mesh_rx.borrow_and_update().clone();
                let mut s = lock(session);
                let out = s.on_snapshot(&mesh.snapshot);
                shared.metrics.account(&mut s);
                out
            }
            _ = tx.closed() => return,
        };
        for r in responses {
            shared.metrics.pushes.inc();
            if tx.send(Ok(r)).await.is_err() {
                return;
            }
        }
    }
}
