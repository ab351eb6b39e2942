//! A test-only Kubernetes API server: enough of kube-apiserver, faithfully, for kube-rs,
//! kubectl and Python's `kubernetes` client to run unmodified against it.
//!
//! It serves, over HTTPS (HTTP/1.1) with bearer-token authentication and RBAC
//! authorization:
//! - core/v1 pods (with `status`), namespaces, nodes, services (with `status`; no
//!   cluster IPs are allocated), config maps and events; apps/v1
//!   daemonsets; the RBAC kinds;
//! - Istio's `security.istio.io` AuthorizationPolicies and RequestAuthentications in two
//!   versions, `v1` (storage, preferred) and `v1beta1`, and Gateway API's
//!   `gateway.networking.k8s.io/v1` Gateways, GatewayClasses, HTTPRoutes and GRPCRoutes,
//!   as kube-apiserver serves their CustomResourceDefinitions: a `status` subresource,
//!   `metadata.generation` bumped by any change but to metadata and status, conversion
//!   `None` (one object, shown in whichever version it is read, listed or watched
//!   through; a body naming another version is refused 400), items of lists keeping
//!   their type, and the default columns of a CRD without printer columns (Name, Age);
//! - `authentication.k8s.io/v1` TokenReviews (create only, never stored), answered from
//!   the server's own tokens and their audiences (see [`authn`]).
//!
//! with list paging, label and field selectors, watches with bookmarks and 410 expiry,
//! server-side Tables for kubectl, and Kubernetes' error bodies. Tests drive it through
//! [`ApiServer`]: objects, tokens, faults (dropped watches, failed requests, compaction)
//! and a log of the requests clients sent.
//!
//! Modules, sans IO except `server` (HTTP, TLS, streaming watches) and `tls`:
//! - [`resource`]: the kinds, their versions, discovery.
//! - [`selector`]: label and field selectors.
//! - [`authn`]: tokens, audiences, TokenReview answers.
//! - [`rbac`]: users and RBAC evaluation, Kubernetes' 403 wording.
//! - [`store`]: objects, the resourceVersion counter, the bounded event history.
//! - [`ops`]: create/update/patch/delete rules (status subresource, generation, type checks,
//!   no-op writes).
//! - [`watch`]: which events a watcher gets, their wire form.
//! - [`handler`]: routing, verbs, versions, lists and paging; plans watches.
//! - [`proto`]: the protobuf request bodies kubectl's generators send (config maps and
//!   namespaces).
//! - [`table`]: server-side printing (the Tables kubectl prints for humans).
//!
//! ```no_run
//! # async fn example() -> anyhow::Result<()> {
//! use ambit_fake_apiserver::{pod, ApiServer, Resource, ServerOptions, User};
//! let api = ApiServer::start(ServerOptions { rbac: true, ..Default::default() }).await?;
//! api.apply_yaml("apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\n...")?;
//! api.add_token("cni-token", User::service_account("istio-system", "istio-cni"));
//! // A pod's projected token for Istio's CA: good in TokenReviews for `istio-ca` only.
//! api.add_token_with_audiences("pod-token", User::service_account("default", "web"), &["istio-ca"]);
//! api.write_kubeconfig(std::path::Path::new("/tmp/kubeconfig"), "cni-token")?;
//! api.create(pod("default", "web", "node-1"))?;
//! // The kubelet's part: status changes bypass the subresource rules.
//! api.update(Resource::Pods, Some("default"), "web", |p| {
//!     p["status"] = serde_json::json!({"phase": "Running", "podIP": "10.0.0.5"});
//! })?;
//! api.faults().drop_watches();
//! let patches = api.requests().into_iter().filter(|r| r.method == "PATCH").count();
//! # let _ = patches; Ok(()) }
//! ```
//!
//! Deliberate gaps: strategic merge patches are applied as merge patches (list merge keys
//! are not implemented; `$` directives are dropped); no apply patches (415); no
//! deletecollection (405); deletion is immediate (no graceful deletion or finalizers;
//! deleting a namespace deletes its objects at once); ClusterRole aggregation is not
//! evaluated; discovery and `/healthz`-style paths are open to any authenticated user
//! (`/healthz`, `/readyz`, `/livez`, `/version` also to anonymous ones); no aggregated
//! discovery (clients fall back to the per-group documents); protobuf request bodies
//! are decoded for config maps and namespaces only (others get 415), and responses are
//! always JSON; no OpenAPI (kubectl needs `--validate=false` for files); no defaulting of
//! pod specs; a watch from a resourceVersion newer than the store's starts after it
//! instead of waiting; objects in a namespace need the namespace to exist (as the
//! NamespaceLifecycle admission says).
//! Custom resources are not checked against the CRDs' schemas, get none of their
//! defaults (a real Gateway's or GatewayClass's status starts with "Waiting for
//! controller" conditions; here it starts empty) and none of their CEL rules, and print
//! the default Name and Age columns, not the printer columns the real CRDs declare
//! (Gateway: Class, Address, Programmed; GatewayClass: Controller, Accepted; HTTPRoute
//! and GRPCRoute: Hostnames; AuthorizationPolicy: Action); only Gateway API's `v1` is
//! served (not `v1beta1`), and `events.k8s.io` is not. Of events' validation only the
//! namespace rule is enforced, of config maps' only immutability. A TokenReview's `error`
//! is the authenticator's own sentence ("invalid bearer token", or the audience
//! mismatch), not the aggregate of every authenticator kube-apiserver runs; tokens carry
//! no `extra` fields. [`ApiServer::get`] and [`ApiServer::update`] see objects in their
//! storage version.
#![forbid(unsafe_code)]

pub mod authn;
pub mod error;
pub mod handler;
pub mod ops;
pub mod proto;
pub mod rbac;
pub mod resource;
pub mod selector;
mod server;
pub mod store;
pub mod table;
mod tls;
pub mod watch;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use serde_json::{json, Value};
use tokio::sync::watch as tokio_watch;

pub use authn::API_AUDIENCE;
pub use error::ApiError;
pub use rbac::User;
pub use resource::Resource;

use ops::CreateStatus;
use server::{lock, Inner};
use store::key_of;

/// How a server behaves.
#[derive(Clone, Debug)]
pub struct ServerOptions {
    /// Authorize requests with RBAC from the stored roles and bindings (else any
    /// authenticated user may do anything).
    pub rbac: bool,
    /// How often watches that allow bookmarks get one.
    pub bookmark_interval: Duration,
    /// Events kept for watches to resume from.
    pub history: usize,
}

impl Default for ServerOptions {
    fn default() -> ServerOptions {
        ServerOptions {
            rbac: false,
            bookmark_interval: Duration::from_secs(1),
            history: 1000,
        }
    }
}

/// One request as the server received it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordedRequest {
    pub method: String,
    /// Path and query, as sent.
    pub path: String,
    pub content_type: Option<String>,
    /// The authenticated user's name.
    pub user: Option<String>,
    /// The body of POST, PUT and PATCH requests (the first 64 KiB).
    pub body: Option<String>,
    pub status: u16,
}

/// A running API server; dropping it stops it.
pub struct ApiServer {
    inner: Arc<Inner>,
    addr: SocketAddr,
    ca_pem: String,
    admin_token: String,
    shutdown: tokio_watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
        self.task.abort();
    }
}

/// Handle for injecting faults.
#[derive(Clone)]
pub struct Faults {
    inner: Arc<Inner>,
}

impl Faults {
    /// Cuts every open watch's connection mid-stream.
    pub fn drop_watches(&self) {
        self.inner.kill.send_modify(|g| *g += 1);
    }

    /// Fails the next `n` requests matching `method` and `path_contains` (path and query)
    /// with `status` (429 comes with `Retry-After: 1`, 500 as an InternalError).
    pub fn fail_next(
        &self,
        n: usize,
        status: u16,
        method: Option<&str>,
        path_contains: Option<&str>,
    ) {
        self.inner.fail_next(n, status, method, path_contains);
    }

    /// Delays the next `n` matching requests by `delay` before handling them.
    pub fn delay_next(
        &self,
        n: usize,
        delay: Duration,
        method: Option<&str>,
        path_contains: Option<&str>,
    ) {
        self.inner.delay_next(n, delay, method, path_contains);
    }

    /// Removes every pending failure and delay.
    pub fn clear(&self) {
        self.inner.clear_faults();
    }

    /// Forgets the event history: watches and exact lists from older versions get 410.
    pub fn compact(&self) {
        lock(&self.inner.store).compact();
    }
}

fn random_token() -> String {
    let b: [u8; 24] = rand::random();
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
}

fn namespace_of(obj: &Value) -> Option<&str> {
    obj.pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
}

impl ApiServer {
    /// Starts a server on 127.0.0.1 on a free port.
    pub async fn start(opts: ServerOptions) -> anyhow::Result<ApiServer> {
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        ApiServer::start_on(listener, opts).await
    }

    /// Starts a server on `listener` (for instance one bound inside a test's netns).
    pub async fn start_on(
        listener: std::net::TcpListener,
        opts: ServerOptions,
    ) -> anyhow::Result<ApiServer> {
        listener.set_nonblocking(true)?;
        let mut addr = listener.local_addr()?;
        if addr.ip().is_unspecified() {
            addr.set_ip(IpAddr::V4(Ipv4Addr::LOCALHOST));
        }
        let pki = tls::mint(addr.ip())?;
        let inner = Arc::new(Inner::new(opts, addr.to_string()));
        {
            let mut store = lock(&inner.store);
            for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
                ops::create(
                    &mut store,
                    Resource::Namespaces,
                    "v1",
                    None,
                    json!({"metadata": {"name": ns}}),
                    CreateStatus::Reset,
                )?;
            }
        }
        let admin_token = random_token();
        lock(&inner.tokens).insert(&admin_token, User::admin(), &[API_AUDIENCE]);
        let listener = tokio::net::TcpListener::from_std(listener)?;
        let (shutdown, shutdown_rx) = tokio_watch::channel(false);
        let task = tokio::spawn(server::serve(
            inner.clone(),
            listener,
            pki.acceptor,
            shutdown_rx,
        ));
        Ok(ApiServer {
            inner,
            addr,
            ca_pem: pki.ca_pem,
            admin_token,
            shutdown,
            task,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `https://<addr>`.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// The CA that signed the serving certificate, PEM.
    pub fn ca_pem(&self) -> String {
        self.ca_pem.clone()
    }

    /// Makes `token` authenticate as `user`, bound to the API server's own audience
    /// ([`API_AUDIENCE`]): it works for requests and in TokenReviews for that audience.
    pub fn add_token(&self, token: &str, user: User) {
        self.add_token_with_audiences(token, user, &[API_AUDIENCE]);
    }

    /// Makes `token` authenticate as `user` for `audiences` only, as a projected
    /// service-account token bound to them (Istio's `istio-ca` one): a TokenReview asking
    /// for one of them accepts it; requests to the API need [`API_AUDIENCE`] among them.
    pub fn add_token_with_audiences(&self, token: &str, user: User, audiences: &[&str]) {
        lock(&self.inner.tokens).insert(token, user, audiences);
    }

    /// A token for a `system:masters` user.
    pub fn admin_token(&self) -> String {
        self.admin_token.clone()
    }

    /// A kubeconfig for `token`: cluster "local" with the CA inline, one context.
    pub fn kubeconfig(&self, token: &str) -> String {
        let ca = base64::engine::general_purpose::STANDARD.encode(&self.ca_pem);
        let quote = |s: &str| serde_json::to_string(s).unwrap_or_default();
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: local\n  cluster:\n    server: {}\n    certificate-authority-data: {ca}\nusers:\n- name: local\n  user:\n    token: {}\ncontexts:\n- name: local\n  context:\n    cluster: local\n    user: local\n    namespace: default\ncurrent-context: local\n",
            quote(&self.url()),
            quote(token),
        )
    }

    pub fn write_kubeconfig(&self, path: &Path, token: &str) -> std::io::Result<()> {
        std::fs::write(path, self.kubeconfig(token))
    }

    /// Creates or replaces every object of a stored kind (in any version it is served in)
    /// in a multi-document YAML stream (a rendered chart, say); other kinds are skipped.
    /// Returns `Kind/name` or `Kind/namespace/name` of each object applied.
    pub fn apply_yaml(&self, multi_doc_yaml: &str) -> anyhow::Result<Vec<String>> {
        use serde::Deserialize;
        let mut applied = Vec::new();
        let mut objects = Vec::new();
        for doc in yaml_serde::Deserializer::from_str(multi_doc_yaml) {
            let v = Value::deserialize(doc)?;
            match v.get("kind").and_then(Value::as_str) {
                None => continue,
                Some(k) if k.ends_with("List") => objects.extend(
                    v.get("items")
                        .and_then(Value::as_array)
                        .cloned()
                        .unwrap_or_default(),
                ),
                Some(_) => objects.push(v),
            }
        }
        for obj in objects {
            let api_version = obj
                .get("apiVersion")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let kind = obj
                .get("kind")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            let name = obj
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            let Some(r) = Resource::from_kind(api_version, &kind).filter(|r| r.stored()) else {
                tracing::debug!(
                    api_version,
                    kind,
                    name,
                    "apply_yaml: kind not served, skipped"
                );
                continue;
            };
            let version = resource::split_api_version(api_version).1.to_string();
            let ns = r
                .namespaced()
                .then(|| namespace_of(&obj).unwrap_or("default").to_string());
            let mut store = lock(&self.inner.store);
            let key = key_of(r, ns.as_deref(), &name);
            let outcome = if store.get(&key).is_some() {
                let sub = ops::Sub::Main;
                ops::update(&mut store, r, &version, ns.as_deref(), &name, sub, obj)
            } else {
                ops::create(
                    &mut store,
                    r,
                    &version,
                    ns.as_deref(),
                    obj,
                    CreateStatus::Keep,
                )
            }
            .map_err(|e| anyhow::anyhow!("applying {kind} {name}: {e}"))?;
            self.inner.publish(outcome.1);
            applied.push(match &ns {
                Some(ns) => format!("{kind}/{ns}/{name}"),
                None => format!("{kind}/{name}"),
            });
        }
        Ok(applied)
    }

    /// Creates `obj` (its kind from `apiVersion`/`kind`, in any version it is served in,
    /// its namespace from `metadata.namespace`, default "default"). A given status is
    /// kept. Returns the object as that version shows it.
    pub fn create(&self, obj: Value) -> anyhow::Result<Value> {
        let api_version = obj
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let kind = obj.get("kind").and_then(Value::as_str).unwrap_or_default();
        let r = Resource::from_kind(&api_version, kind)
            .filter(|r| r.stored())
            .ok_or_else(|| {
                anyhow::anyhow!("{api_version} {kind} is not a kind this server stores")
            })?;
        let version = resource::split_api_version(&api_version).1;
        let ns = r
            .namespaced()
            .then(|| namespace_of(&obj).unwrap_or("default").to_string());
        let mut store = lock(&self.inner.store);
        let (o, events) = ops::create(
            &mut store,
            r,
            version,
            ns.as_deref(),
            obj,
            CreateStatus::Keep,
        )?;
        self.inner.publish(events);
        Ok(resource::served_as(r, version, &o).into_owned())
    }

    /// The stored object (in its storage version).
    pub fn get(&self, resource: Resource, namespace: Option<&str>, name: &str) -> Option<Value> {
        lock(&self.inner.store)
            .get(&key_of(resource, namespace, name))
            .map(|o| (**o).clone())
    }

    /// Changes an object with `f`, bypassing the subresource rules (as the kubelet sets
    /// `status.podIPs` and `phase`). A change that changes nothing bumps nothing.
    pub fn update<F: FnOnce(&mut Value)>(
        &self,
        resource: Resource,
        namespace: Option<&str>,
        name: &str,
        f: F,
    ) -> anyhow::Result<Value> {
        let mut store = lock(&self.inner.store);
        let (o, events) = ops::modify(&mut store, resource, namespace, name, f)?;
        self.inner.publish(events);
        Ok((*o).clone())
    }

    pub fn delete(
        &self,
        resource: Resource,
        namespace: Option<&str>,
        name: &str,
    ) -> anyhow::Result<()> {
        let mut store = lock(&self.inner.store);
        let (_, events) = ops::delete(&mut store, resource, namespace, name, None)?;
        self.inner.publish(events);
        Ok(())
    }

    /// The current resourceVersion.
    pub fn resource_version(&self) -> u64 {
        lock(&self.inner.store).rv()
    }

    pub fn faults(&self) -> Faults {
        Faults {
            inner: self.inner.clone(),
        }
    }

    /// The requests received so far, oldest first.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        lock(&self.inner.log).iter().cloned().collect()
    }

    pub fn clear_requests(&self) {
        lock(&self.inner.log).clear();
    }

    /// Watches currently streaming.
    pub fn open_watches(&self) -> usize {
        self.inner.open_watches.load(Ordering::SeqCst)
    }
}

/// A pod in `ns` named `name` scheduled on `node` (one container, `app: <name>` label).
pub fn pod(ns: &str, name: &str, node: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": name}},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "app", "image": "registry.example/app:1"}],
        },
    })
}

/// A namespace with `labels`.
pub fn namespace(name: &str, labels: &[(&str, &str)]) -> Value {
    let labels: serde_json::Map<String, Value> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}})
}

/// A Ready node.
pub fn node(name: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
            "nodeInfo": {"kubeletVersion": "v1.33.0"},
        },
    })
}
