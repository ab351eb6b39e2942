//! `ambit control --kubernetes`: the waypoints' L7 configuration from the API server.
//!
//! - [`objects`]: the objects read, each kept at its last accepted version (sans IO);
//! - [`waypoints`]: which service accounts run a waypoint Gateway (sans IO);
//! - [`review`]: who a token belongs to (TokenReview), cached and bounded;
//! - [`visibility`]: what each waypoint is served (sans IO);
//! - [`watch`]: the watches, and what is served rebuilt from them;
//! - [`events`]: a Warning Event on each refused object version;
//! - `serve`: the server, its gatekeeper and its certificate from the mesh CA.

pub mod events;
pub mod objects;
pub mod review;
mod serve;
pub mod visibility;
pub mod watch;
pub mod waypoints;

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, RwLock};

/// What the gatekeeper, the sessions and the watches share.
pub(crate) struct KubeShared {
    pub(crate) reviewer: review::Reviewer,
    /// Who runs a waypoint and what each is shown, as of the last publish.
    visibility: RwLock<Arc<visibility::Visibility>>,
    pub(crate) synced: AtomicBool,
}

impl KubeShared {
    pub(crate) fn new(reviewer: review::Reviewer) -> KubeShared {
        KubeShared {
            reviewer,
            visibility: RwLock::default(),
            synced: AtomicBool::new(false),
        }
    }

    pub(crate) fn visibility(&self) -> Arc<visibility::Visibility> {
        self.visibility
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn set_visibility(&self, v: visibility::Visibility) {
        *self.visibility.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(v);
    }
}

/// A waypoint's view: what targets its Gateway, as the watches see it now.
#[derive(Debug)]
pub(crate) struct WaypointView {
    pub(crate) kube: Arc<KubeShared>,
    pub(crate) namespace: String,
    pub(crate) service_account: String,
}

impl crate::session::View for WaypointView {
    fn shows(&self, _type_url: &str, name: &str) -> bool {
        self.kube
            .visibility()
            .shows(&self.namespace, &self.service_account, name)
    }
}

impl std::fmt::Debug for KubeShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeShared").finish_non_exhaustive()
    }
}

/// The view of the waypoint whose token `metadata` carries: the gatekeeper reviewed it just
/// now, so its answer is cached (if it has expired since, the stream is refused and the
/// waypoint reconnects).
pub(crate) fn view_of(
    kube: &Arc<KubeShared>,
    metadata: &tonic::metadata::MetadataMap,
) -> Result<Arc<dyn crate::session::View>, Box<tonic::Status>> {
    let authorization = metadata.get("authorization").and_then(|v| v.to_str().ok());
    let token = crate::bearer::bearer(authorization)
        .map_err(|refusal| Box::new(tonic::Status::from(refusal)))?;
    match kube.reviewer.cached(token) {
        Some(review::Reviewed::Account { namespace, name }) => Ok(Arc::new(WaypointView {
            kube: kube.clone(),
            namespace,
            service_account: name,
        })),
        _ => Err(Box::new(tonic::Status::unavailable(
            "the token's review is no longer at hand; reconnect",
        ))),
    }
}
