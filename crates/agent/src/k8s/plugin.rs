//! The server side of Istio's plugin → agent call (reference §1.3 step 3, §4.2):
//! `POST /cmdadd` on `<CNI_AGENT_RUN_DIR>/pluginevent.sock`. 200 once the pod is enrolled,
//! 400 for a body that is not a request, 500 (with the reason) when the pod is not in the
//! cache, not eligible, or the enrollment failed; the plugin then fails the sandbox and the
//! kubelet retries: the fail-closed gate for new pods.
//!
//! A call installs capture rules in a netns and puts IPs in the host probe ipset, so it is
//! guarded where Istio's is not (Istio: socket 0666, directory 0750 when it creates it):
//! - the directory is 0700, also when it existed (the kubelet makes a hostPath 0755), and
//!   the socket 0600 from the moment it exists;
//! - every caller's uid is checked with `SO_PEERCRED`: root, the agent's own uid, or the
//!   configured plugin uid (`AMBIT_CNI_PLUGIN_UID`); anyone else gets a 403 at once;
//! - the netns a request names must pass [`super::netns_check`]: not the node's own, not
//!   another pod's, holding the pod's IP.

use std::fs;
use std::net::IpAddr;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ambit_cni::istio_api::{self, CMDADD_PATH, MAX_BODY_BYTES};
use ambit_zds::{Netns, NetnsId};
use anyhow::{bail, Context as _};
use bytes::Bytes;
use hyper::{Method, StatusCode};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::Semaphore;

use super::controller::Controller;
use super::http::{self, Answer};
use super::netns_check::{self, Facts};
use super::reconcile::PodView;
use crate::agent::blocking;

/// The run directory's mode: it holds the socket and the plugin's kubeconfig (a token).
const DIR_MODE: u32 = 0o700;
/// Plugin calls served at once (the kubelet starts a few sandboxes in parallel); more are
/// answered 503 at once and the plugin fails the sandbox, which the kubelet retries.
const MAX_CALLS_IN_FLIGHT: usize = 64;
/// How often refused callers are logged: the first, then every this many.
const REFUSAL_LOG_EVERY: u64 = 100;

/// Binds the socket: the directory made 0700 ([`private_dir`]), the socket 0600 with no
/// window in which it has another mode, a stale one replaced.
pub(crate) fn bind(path: &Path) -> anyhow::Result<UnixListener> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        private_dir(dir)?;
    }
    let listener = ambit_zds::sockfile::bind_private(path, |tmp| {
        let l = std::os::unix::net::UnixListener::bind(tmp)?;
        l.set_nonblocking(true)?;
        Ok(l)
    })
    .with_context(|| format!("listen on the plugin socket {}", path.display()))?;
    Ok(UnixListener::from_std(listener)?)
}

/// Creates `dir` 0700, or makes an existing one 0700 (saying so). One that belongs to
/// another uid, or is shared like `/tmp` (sticky bit), is refused: its owner or its other
/// users could replace the socket.
fn private_dir(dir: &Path) -> anyhow::Result<()> {
    let meta = match fs::metadata(dir) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return fs::DirBuilder::new()
                .recursive(true)
                .mode(DIR_MODE)
                .create(dir)
                .with_context(|| format!("create the plugin socket directory {}", dir.display()));
        }
        Err(e) => return Err(e).with_context(|| format!("inspect {}", dir.display())),
    };
    let own = nix::unistd::geteuid().as_raw();
    if !meta.is_dir() {
        bail!("CNI_AGENT_RUN_DIR {} is not a directory", dir.display());
    }
    if meta.uid() != own {
        bail!(
            "CNI_AGENT_RUN_DIR {} belongs to uid {}, not the node agent's ({own}): its owner \
             could replace the plugin socket; use a directory of the agent's own",
            dir.display(),
            meta.uid()
        );
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o1000 != 0 {
        bail!(
            "CNI_AGENT_RUN_DIR {} is a shared directory (sticky bit, mode {mode:o}); use a \
             directory of the node agent's own",
            dir.display()
        );
    }
    if mode != DIR_MODE {
        fs::set_permissions(dir, fs::Permissions::from_mode(DIR_MODE))
            .with_context(|| format!("chmod 0700 {}", dir.display()))?;
        tracing::info!(
            dir = %dir.display(),
            was = %format!("{mode:o}"),
            "made the plugin socket directory 0700: only root and the node agent may reach \
             pluginevent.sock and the plugin's kubeconfig"
        );
    }
    Ok(())
}

/// Who may call the plugin socket: root, the agent's own uid, and the configured one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PluginPeers {
    own: u32,
    configured: Option<u32>,
}

impl PluginPeers {
    pub(crate) fn new(own: u32, configured: Option<u32>) -> PluginPeers {
        PluginPeers { own, configured }
    }

    /// `Err` with the text the caller is answered.
    pub(crate) fn admit(&self, uid: u32, pid: Option<i32>) -> Result<(), String> {
        if uid == 0 || uid == self.own || Some(uid) == self.configured {
            return Ok(());
        }
        let pid = pid.map(|p| format!(" (pid {p})")).unwrap_or_default();
        let own = if self.own != 0 {
            format!(", uid {} (the node agent's)", self.own)
        } else {
            String::new()
        };
        let configured = self
            .configured
            .map(|u| format!(", uid {u} (AMBIT_CNI_PLUGIN_UID)"))
            .unwrap_or_default();
        Err(format!(
            "refusing a call from uid {uid}{pid}: only uid 0{own}{configured} may call the \
             node agent's plugin socket; if the CNI plugin runs as uid {uid}, set \
             AMBIT_CNI_PLUGIN_UID"
        ))
    }
}

/// Accepts on the plugin socket until the task is dropped: each caller's uid checked
/// first, at most [`MAX_CALLS_IN_FLIGHT`] calls at once.
pub(crate) async fn serve(listener: UnixListener, ctl: Arc<Controller>) {
    let peers = PluginPeers::new(nix::unistd::geteuid().as_raw(), ctl.config().plugin_uid);
    let handler = handler(ctl.clone());
    let slots = Arc::new(Semaphore::new(MAX_CALLS_IN_FLIGHT));
    let mut refused = 0u64;
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                tracing::warn!(error = %e, "accept on the plugin socket failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let admitted = stream
            .peer_cred()
            .map_err(|e| format!("cannot read the caller's credentials (SO_PEERCRED): {e}"))
            .and_then(|c| peers.admit(c.uid(), c.pid()));
        if let Err(why) = admitted {
            refused += 1;
            if refused == 1 || refused.is_multiple_of(REFUSAL_LOG_EVERY) {
                tracing::warn!(refused_so_far = refused, "plugin socket: {why}");
            }
            answer_at_once(&ctl, stream, StatusCode::FORBIDDEN, &why);
            continue;
        }
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            answer_at_once(
                &ctl,
                stream,
                StatusCode::SERVICE_UNAVAILABLE,
                &format!("the node agent is serving {MAX_CALLS_IN_FLIGHT} plugin calls; retry"),
            );
            continue;
        };
        let handler = handler.clone();
        tokio::spawn(async move {
            http::serve_connection(stream, handler, MAX_BODY_BYTES).await;
            drop(slot);
        });
    }
}

/// Answers without reading the request and closes: nothing is held for the caller. The
/// answer fits an empty socket buffer, so one non-blocking write (a plain `write(2)`: the
/// reactor has not seen the new socket writable yet) takes it whole.
fn answer_at_once(ctl: &Controller, stream: UnixStream, code: StatusCode, text: &str) {
    ctl.metrics.plugin_request(code.as_u16());
    let body = format!("{text}\n");
    let response = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        code.as_u16(),
        code.canonical_reason().unwrap_or(""),
        body.len()
    );
    if let Ok(stream) = stream.into_std() {
        let _ = std::io::Write::write(&mut &stream, response.as_bytes());
    }
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

fn error(code: StatusCode, msg: String) -> Answer {
    (code, "text/plain", msg + "\n")
}

async fn cmdadd(ctl: &Controller, body: &[u8]) -> Answer {
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
    let request_ips: Vec<IpAddr> = req
        .addresses()
        .into_iter()
        .map(|ip| ip.to_canonical())
        .collect();
    let owner_of = |ip| ctl.ip_owner(ip, &view.uid);
    let (ips, netns) = if req.netns.is_empty() {
        // No netns named: the /proc scan finds the pod's (its cgroup, holding these IPs).
        match netns_check::ips_without_netns(&view.ips, &request_ips, owner_of) {
            Ok(ips) => (ips, None),
            Err(why) => {
                return error(
                    StatusCode::FORBIDDEN,
                    format!("pod {pod}: refusing the request's IPs: {why}"),
                )
            }
        }
    } else {
        let path = ctl.host_path(&req.netns);
        let refuse = |code, why: String| {
            error(
                code,
                format!("pod {pod}: refusing netns {} ({path}): {why}", req.netns),
            )
        };
        let seen = match inspect(ctl, &view, &path).await {
            Ok(seen) => seen,
            Err((code, why)) => return refuse(code, why),
        };
        let facts = Facts {
            pod_ips: &view.ips,
            request_ips: &request_ips,
            is_host: seen.is_host,
            captured_for: seen.captured_for.as_deref(),
            addresses: &seen.addresses,
        };
        match netns_check::check(&facts, owner_of) {
            Ok(ips) => (ips, Some(path.clone())),
            Err(why) => return refuse(StatusCode::FORBIDDEN, why.to_string()),
        }
    };
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

/// What the agent sees of the netns a request names.
struct Seen {
    is_host: bool,
    captured_for: Option<String>,
    addresses: Vec<IpAddr>,
}

/// Opens the netns at `path` and gathers [`Seen`]: its identity against the node's netns
/// (the agent's own, the host `/proc`'s init's, the configured host netns) and against the
/// netns of the other pods the agent holds, and its addresses.
async fn inspect(
    ctl: &Controller,
    view: &PodView,
    path: &str,
) -> Result<Seen, (StatusCode, String)> {
    let cfg = ctl.config();
    let mut host_paths: Vec<PathBuf> = vec![cfg.proc_root.join("1/ns/net")];
    host_paths.extend(cfg.host_netns.clone());
    let others: Vec<(String, String)> = ctl
        .agent
        .held_pods()
        .into_iter()
        .filter(|p| p.uid != view.uid)
        .map(|p| (format!("{}/{}", p.namespace, p.name), p.netns))
        .collect();
    let path = path.to_owned();
    let inspected = blocking(move || Ok(inspect_blocking(&path, &host_paths, &others))).await;
    match inspected {
        Ok(r) => r,
        Err(e) => Err((StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}"))),
    }
}

fn inspect_blocking(
    path: &str,
    host_paths: &[PathBuf],
    others: &[(String, String)],
) -> Result<Seen, (StatusCode, String)> {
    let bad = |why: String| (StatusCode::BAD_REQUEST, why);
    // A FIFO would block the open; a netns file is an nsfs inode, a regular file to stat.
    match fs::metadata(path) {
        Ok(m) if m.is_file() => {}
        Ok(_) => return Err(bad("not a network namespace file".into())),
        Err(e) => return Err(bad(format!("cannot inspect it: {e}"))),
    }
    let ns = Netns::open(path).map_err(|e| bad(e.to_string()))?;
    if !ns.is_net_namespace() {
        return Err(bad("not a network namespace".into()));
    }
    let own = Netns::current().map_err(|e| {
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot open the node agent's own netns to compare: {e}"),
        )
    })?;
    let id_of = |p: &Path| -> Option<NetnsId> {
        Netns::open(p)
            .ok()
            .filter(Netns::is_net_namespace)
            .map(|n| n.id())
    };
    let is_host = ns.id() == own.id() || host_paths.iter().any(|p| id_of(p) == Some(ns.id()));
    let captured_for = others
        .iter()
        .find(|(_, netns)| id_of(Path::new(netns)) == Some(ns.id()))
        .map(|(who, _)| who.clone());
    let addresses = crate::netlink::RouteSocket::open_in(&ns, path.to_owned())
        .and_then(|mut s| s.addresses())
        .map_err(|e| {
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("cannot list its addresses: {e}"),
            )
        })?;
    Ok(Seen {
        is_host,
        captured_for,
        addresses,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_own_and_configured_uids_are_admitted() {
        let peers = PluginPeers::new(0, Some(1337));
        for (uid, ok) in [(0, true), (1337, true), (65534, false), (1, false)] {
            assert_eq!(peers.admit(uid, Some(9)).is_ok(), ok, "uid {uid}");
        }
        let why = peers.admit(65534, Some(9)).unwrap_err();
        assert!(
            why.contains("uid 65534 (pid 9)") && why.contains("uid 1337 (AMBIT_CNI_PLUGIN_UID)"),
            "{why}"
        );
        assert!(!why.contains("node agent's)"), "{why}");
        let unprivileged = PluginPeers::new(500, None);
        assert!(unprivileged.admit(500, None).is_ok());
        let why = unprivileged.admit(7, None).unwrap_err();
        assert!(
            why.contains("uid 500 (the node agent's)") && !why.contains("AMBIT_CNI_PLUGIN_UID)"),
            "{why}"
        );
    }

    #[test]
    fn the_directory_is_made_private_and_shared_ones_are_refused() {
        let root = tempfile::tempdir().unwrap();
        let mode = |p: &Path| fs::metadata(p).unwrap().mode() & 0o7777;
        let fresh = root.path().join("a/b");
        private_dir(&fresh).unwrap();
        assert_eq!(mode(&fresh), 0o700);
        let loose = root.path().join("loose");
        fs::create_dir(&loose).unwrap();
        fs::set_permissions(&loose, fs::Permissions::from_mode(0o755)).unwrap();
        private_dir(&loose).unwrap();
        assert_eq!(mode(&loose), 0o700);
        let shared = root.path().join("tmp");
        fs::create_dir(&shared).unwrap();
        fs::set_permissions(&shared, fs::Permissions::from_mode(0o1777)).unwrap();
        let e = private_dir(&shared).unwrap_err().to_string();
        assert!(
            e.contains("sticky") && e.contains("CNI_AGENT_RUN_DIR"),
            "{e}"
        );
        assert_eq!(mode(&shared), 0o1777, "left alone");
        let file = root.path().join("file");
        fs::write(&file, b"").unwrap();
        let e = private_dir(&file).unwrap_err().to_string();
        assert!(e.contains("not a directory"), "{e}");
    }
}
