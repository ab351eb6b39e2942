//! The server side of Istio's plugin → agent call (reference §1.3 step 3, §4.2):
//! `POST /cmdadd` on `<CNI_AGENT_RUN_DIR>/pluginevent.sock`. 200 once the pod is enrolled,
//! 400 for a body that is not a request, 500 (with the reason) when the pod is not in the
//! cache, not eligible, or the enrollment failed; the plugin then fails the sandbox and the
//! kubelet retries: the fail-closed gate for new pods.

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;

use ambit_cni::istio_api::{self, CMDADD_PATH};
use anyhow::Context as _;
use bytes::Bytes;
use hyper::{Method, StatusCode};

use super::controller::Controller;
use super::http::{self, Answer};

/// Istio's modes: anyone on the node may connect (the plugin runs as the runtime's user);
/// the directory keeps others from listing or replacing it.
const SOCKET_MODE: u32 = 0o666;
const DIR_MODE: u32 = 0o750;

/// Binds the socket (a stale one is replaced; the directory is created 0750 if missing).
pub(crate) fn bind(path: &Path) -> anyhow::Result<tokio::net::UnixListener> {
    if let Some(dir) = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty() && !d.is_dir())
    {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(DIR_MODE)
            .create(dir)
            .with_context(|| format!("create {}", dir.display()))?;
    }
    ambit_inpod::sockfile::remove_stale_socket(path)?;
    let listener = std::os::unix::net::UnixListener::bind(path)
        .with_context(|| format!("listen on {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(SOCKET_MODE))
        .with_context(|| format!("chmod {}", path.display()))?;
    listener.set_nonblocking(true)?;
    Ok(tokio::net::UnixListener::from_std(listener)?)
}

pub(crate) fn handler(ctl: Arc<Controller>) -> http::Handler {
    http::handler(move |method: Method, path: String, body: Bytes| {
        let ctl = ctl.clone();
        async move {
            let answer = if method != Method::POST || path != CMDADD_PATH {
                (
                    StatusCode::NOT_FOUND,
                    "text/plain",
                    format!("no {method} {path}; POST {CMDADD_PATH}\n"),
                )
            } else {
                cmdadd(&ctl, &body).await
            };
            ctl.metrics.plugin_request(answer.0.as_u16());
            if answer.0 != StatusCode::OK {
                tracing::warn!(status = %answer.0, error = %answer.2.trim_end(), "cmdadd refused");
            }
            answer
        }
    })
}

async fn cmdadd(ctl: &Controller, body: &[u8]) -> Answer {
    let error = |code, msg: String| (code, "text/plain", msg + "\n");
    let req = match istio_api::parse(body) {
        Ok(r) => r,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.to_string()),
    };
    let pod = format!("{}/{}", req.pod_namespace, req.pod_name);
    let Some((view, ns)) = ctl.wait_for_pod(&req.pod_namespace, &req.pod_name).await else {
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!(
                "pod {pod} is not in the node agent's cache (not on this node, or the watch lags)"
            ),
        );
    };
    let verdict = ctl
        .enablement()
        .evaluate(&view.facts, &ns.unwrap_or_default());
    if let ambit_k8s::Verdict::Excluded(why) = verdict {
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("pod {pod} is not eligible for ambient capture: {why}"),
        );
    }
    if view.ztunnel {
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("pod {pod} is a ztunnel pod"),
        );
    }
    // The CNI result's IPs are fresher than the pod status (not written yet at ADD time).
    let ips = match req.addresses() {
        ips if !ips.is_empty() => ips,
        _ => view.ips.clone(),
    };
    let netns = (!req.netns.is_empty()).then(|| ctl.host_path(&req.netns));
    match ctl.enroll(&view, ips, netns).await {
        Ok(()) => (StatusCode::OK, "text/plain", String::new()),
        Err(e) => {
            if e.retryable {
                ctl.requeue(&view.uid);
            }
            error(StatusCode::INTERNAL_SERVER_ERROR, e.message)
        }
    }
}
