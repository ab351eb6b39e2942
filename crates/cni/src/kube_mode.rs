//! The plugin's Kubernetes mode: istio-cni's plugin behaviour (istio-cni reference §1.3
//! step 2, §4.1-§4.4), chosen when the plugin config carries Istio's keys (the entry the
//! installer writes, `"type": "istio-cni"`).
//!
//! On ADD: the agent's own pods, non-Kubernetes invocations and excluded namespaces pass
//! through without a word to the API; otherwise, with `ambient_enabled`, the pod and its
//! namespace are read from the API (with the plugin's kubeconfig), the enablement rules
//! decide, and an ambient pod is announced to the agent (`POST /cmdadd`) before the
//! previous result is passed on. DEL and CHECK do nothing.
//!
//! Fail closed, unlike Istio in one corner: when the pod or namespace cannot be read after
//! the retries, Istio treats the pod as not ambient and lets it start uncaptured; here the
//! ADD fails (naming the API error) and the runtime retries the sandbox.
//!
//! The decisions are sans IO ([`run`] over [`Cluster`] and [`AgentLink`]); [`main`] wires
//! the real API client and socket, on a current-thread runtime made only when needed.

use std::path::PathBuf;
use std::time::Duration;

use ambit_k8s::enablement::{validate, PodFacts, RawEnablementSelector};
use ambit_k8s::k8s_openapi::api::core::v1::{Namespace, Pod};
use ambit_k8s::Enablement;
use serde_json::{Map, Value};

use crate::cmdadd::{self, CmdAddError, CmdAddRequest};
use crate::plugin::{
    self, best_effort_version, codes, json_kind, parse_args, passthrough, CniEnv, CniError, Outcome,
};

/// The plugin's kubeconfig in the run dir (written by the installer).
pub const KUBECONFIG_FILE: &str = "istio-cni-kubeconfig";
/// The agent's pods: `istio-cni-node-*` in `pod_namespace`.
pub const AGENT_POD_PREFIX: &str = "istio-cni-node-";
/// Retries of the pod/namespace lookup: by default, and with
/// `enable_ambient_detection_retry`.
pub const DEFAULT_RETRIES: u32 = 1;
pub const DETECTION_RETRIES: u32 = 30;
/// Pause between lookups.
pub const RETRY_PAUSE: Duration = Duration::from_secs(1);
/// One lookup's time limit.
pub const LOOKUP_TIMEOUT: Duration = Duration::from_secs(10);

/// Keys only Istio's plugin config has.
const ISTIO_KEYS: &[&str] = &["cni_agent_run_dir", "ambient_enabled", "pod_namespace"];

/// Whether `stdin` is a config for this mode: `"type": "istio-cni"` or Istio's keys.
pub fn is_istio_conf(stdin: &[u8]) -> bool {
    let Ok(Value::Object(m)) = serde_json::from_slice::<Value>(stdin) else {
        return false;
    };
    m.get("type").and_then(Value::as_str) == Some("istio-cni")
        || ISTIO_KEYS.iter().any(|k| m.contains_key(*k))
}

/// Istio's plugin keys (§4.1).
#[derive(Debug, Clone, PartialEq)]
pub struct IstioConf {
    pub cni_version: String,
    pub prev_result: Option<Map<String, Value>>,
    pub cni_agent_run_dir: PathBuf,
    pub ambient_enabled: bool,
    pub enablement_selectors: Vec<RawEnablementSelector>,
    pub exclude_namespaces: Vec<String>,
    pub pod_namespace: String,
    pub enable_ambient_detection_retry: bool,
}

impl IstioConf {
    pub fn kubeconfig(&self) -> PathBuf {
        self.cni_agent_run_dir.join(KUBECONFIG_FILE)
    }

    pub fn socket(&self) -> PathBuf {
        self.cni_agent_run_dir.join(crate::istio_api::SOCKET_NAME)
    }
}

fn bad(key: &str, want: &str, got: &Value) -> CniError {
    CniError::new(
        codes::INVALID_CONFIG,
        format!("\"{key}\" must be {want}, got {}", json_kind(got)),
    )
}

/// Parses the config; the standard keys as the ambit mode does.
pub fn parse(stdin: &[u8]) -> Result<IstioConf, CniError> {
    let base = plugin::parse_conf(stdin)?;
    let m = plugin::decode_object(stdin)?;
    let string = |k: &str, d: &str| match m.get(k) {
        None | Some(Value::Null) => Ok(d.to_owned()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(o) => Err(bad(k, "a string", o)),
    };
    let boolean = |k: &str| match m.get(k) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(o) => Err(bad(k, "a boolean", o)),
    };
    let exclude_namespaces = match m.get("exclude_namespaces") {
        None | Some(Value::Null) => Vec::new(),
        Some(v @ Value::Array(_)) => serde_json::from_value::<Vec<String>>(v.clone())
            .map_err(|_| bad("exclude_namespaces", "a list of namespace names", v))?,
        Some(o) => return Err(bad("exclude_namespaces", "a list of namespace names", o)),
    };
    let enablement_selectors = match m.get("enablement_selectors") {
        None | Some(Value::Null) => Vec::new(),
        Some(v) => serde_json::from_value::<Vec<RawEnablementSelector>>(v.clone()).map_err(|e| {
            CniError::new(
                codes::INVALID_CONFIG,
                format!("\"enablement_selectors\" must be a list of {{podSelector, namespaceSelector}}: {e}"),
            )
        })?,
    };
    let run_dir = string("cni_agent_run_dir", "/var/run/istio-cni")?;
    Ok(IstioConf {
        cni_version: base.cni_version,
        prev_result: base.prev_result,
        cni_agent_run_dir: if run_dir.is_empty() {
            "/var/run/istio-cni".into()
        } else {
            run_dir.into()
        },
        ambient_enabled: boolean("ambient_enabled")?,
        enablement_selectors,
        exclude_namespaces,
        pod_namespace: string("pod_namespace", "")?,
        enable_ambient_detection_retry: boolean("enable_ambient_detection_retry")?,
    })
}

/// Why a pod is passed through without asking the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PassThrough {
    /// The agent's own pod.
    AgentPod,
    /// No `K8S_POD_NAME`/`K8S_POD_NAMESPACE`.
    NotKube,
    ExcludedNamespace,
    AmbientDisabled,
    /// The enablement rules say no.
    NotAmbient(String),
}

/// The decision before any API call.
pub fn early(conf: &IstioConf, namespace: &str, name: &str) -> Option<PassThrough> {
    if name.starts_with(AGENT_POD_PREFIX) && namespace == conf.pod_namespace {
        return Some(PassThrough::AgentPod);
    }
    if name.is_empty() || namespace.is_empty() {
        return Some(PassThrough::NotKube);
    }
    if conf.exclude_namespaces.iter().any(|n| n == namespace) {
        return Some(PassThrough::ExcludedNamespace);
    }
    if !conf.ambient_enabled {
        return Some(PassThrough::AmbientDisabled);
    }
    None
}

/// The API, as the plugin needs it.
pub trait Cluster {
    fn pod(&self, namespace: &str, name: &str) -> Result<Pod, String>;
    fn namespace(&self, name: &str) -> Result<Namespace, String>;
}

/// The agent, as the plugin needs it.
pub trait AgentLink {
    fn cmd_add(&self, req: &CmdAddRequest) -> Result<(), CmdAddError>;
}

/// Builds the API client (called only when the API is needed).
pub type ClusterFactory<'a> = dyn Fn(&IstioConf) -> Result<Box<dyn Cluster + 'a>, String> + 'a;

/// The pod and its namespace, retried `retries` times `pause` apart.
fn lookup(
    cluster: &dyn Cluster,
    namespace: &str,
    name: &str,
    retries: u32,
    pause: &dyn Fn(),
) -> Result<(Pod, Namespace), String> {
    let mut attempt = 0;
    loop {
        let got = cluster
            .pod(namespace, name)
            .and_then(|p| Ok((p, cluster.namespace(namespace)?)));
        match got {
            Ok(x) => return Ok(x),
            Err(e) if attempt >= retries => return Err(e),
            Err(_) => {
                attempt += 1;
                pause();
            }
        }
    }
}

/// One invocation. `cluster` is called (to build the client) only when the API is needed.
pub fn run<'a>(
    env: &CniEnv,
    stdin: &[u8],
    cluster: &ClusterFactory<'a>,
    agent: &dyn Fn(&IstioConf) -> Box<dyn AgentLink + 'a>,
    pause: &dyn Fn(),
) -> Outcome {
    match env.command.as_str() {
        "VERSION" => Outcome::success(plugin::version_json()),
        // Nothing to undo or check: the agent's pod watch handles removal.
        "DEL" => Outcome::success(String::new()),
        "CHECK" => match parse(stdin) {
            Ok(_) => Outcome::success(String::new()),
            Err(e) => e.outcome(&best_effort_version(stdin)),
        },
        "ADD" => plugin::finish(cmd_add(env, stdin, cluster, agent, pause), stdin),
        other => CniError::new(
            codes::INVALID_ENV,
            format!("unsupported CNI_COMMAND {other:?}: istio-cni implements ADD, DEL, CHECK and VERSION"),
        )
        .outcome(&best_effort_version(stdin)),
    }
}

fn pass(prev: Option<Map<String, Value>>, version: &str) -> Outcome {
    let prev = prev.unwrap_or_else(|| {
        Map::from_iter([("cniVersion".to_owned(), Value::String(version.to_owned()))])
    });
    Outcome::success(passthrough(prev, version))
}

fn cmd_add<'a>(
    env: &CniEnv,
    stdin: &[u8],
    cluster: &ClusterFactory<'a>,
    agent: &dyn Fn(&IstioConf) -> Box<dyn AgentLink + 'a>,
    pause: &dyn Fn(),
) -> Result<Outcome, CniError> {
    let conf = parse(stdin)?;
    plugin::require_env(env, "ADD")?;
    let args = parse_args(&env.args);
    if early(&conf, &args.namespace, &args.name).is_some() {
        return Ok(pass(conf.prev_result, &conf.cni_version));
    }
    let who = format!("{}/{}", args.namespace, args.name);
    let rules = Enablement {
        selectors: validate(&conf.enablement_selectors).map_err(|e| {
            CniError::new(
                codes::INVALID_CONFIG,
                format!("\"enablement_selectors\": {e}"),
            )
        })?,
        exclude_namespaces: conf.exclude_namespaces.iter().cloned().collect(),
    };
    let retries = if conf.enable_ambient_detection_retry {
        DETECTION_RETRIES
    } else {
        DEFAULT_RETRIES
    };
    let api_error = |e: String| {
        CniError::new(
            codes::TRY_AGAIN_LATER,
            format!("cannot tell whether pod {who} is ambient: {e}"),
        )
        .details(format!(
            "the pod is not started until its capture is decided; the runtime retries. The plugin reads the API with {}",
            conf.kubeconfig().display()
        ))
    };
    let client = cluster(&conf).map_err(api_error)?;
    let (pod, ns) =
        lookup(&*client, &args.namespace, &args.name, retries, pause).map_err(api_error)?;
    let labels = ambit_k8s::enablement::namespace_labels(&ns);
    if !rules.evaluate(&PodFacts::of(&pod), &labels).is_ambient() {
        return Ok(pass(conf.prev_result, &conf.cni_version));
    }
    let ips = match &conf.prev_result {
        Some(prev) => cmdadd::ips_of(prev).map_err(|e| CniError::new(codes::INVALID_CONFIG, e))?,
        None => Vec::new(),
    };
    let req = CmdAddRequest {
        netns: env.netns.clone(),
        pod_name: args.name.clone(),
        pod_namespace: args.namespace.clone(),
        ips,
    };
    agent(&conf).cmd_add(&req).map_err(|e| {
        let code = if e.is_refusal() {
            codes::AGENT_REFUSED
        } else {
            codes::TRY_AGAIN_LATER
        };
        CniError::new(
            code,
            format!("istio-cni cmdAdd failed to contact node Istio CNI agent for pod {who}: {e}"),
        )
        .details("the pod is not started without traffic capture; the runtime retries the sandbox")
    })?;
    Ok(pass(conf.prev_result, &conf.cni_version))
}

/// The API through kube-rs, on a runtime of its own.
struct KubeCluster {
    rt: tokio::runtime::Runtime,
    client: ambit_k8s::kube::Client,
}

impl KubeCluster {
    fn new(conf: &IstioConf) -> Result<KubeCluster, String> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start a runtime: {e}"))?;
        let source = ambit_k8s::client::ClientSource::Kubeconfig(conf.kubeconfig());
        let client = rt
            .block_on(ambit_k8s::client::connect(&source))
            .map_err(|e| e.to_string())?;
        Ok(KubeCluster { rt, client })
    }

    fn get<K>(&self, api: ambit_k8s::kube::Api<K>, name: &str, what: &str) -> Result<K, String>
    where
        K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        match self
            .rt
            .block_on(async { tokio::time::timeout(LOOKUP_TIMEOUT, api.get(name)).await })
        {
            Ok(Ok(k)) => Ok(k),
            Ok(Err(e)) => Err(format!("GET {what}: {e}")),
            Err(_) => Err(format!("GET {what}: no answer within {LOOKUP_TIMEOUT:?}")),
        }
    }
}

impl Cluster for KubeCluster {
    fn pod(&self, namespace: &str, name: &str) -> Result<Pod, String> {
        let api = ambit_k8s::kube::Api::namespaced(self.client.clone(), namespace);
        self.get(api, name, &format!("pod {namespace}/{name}"))
    }

    fn namespace(&self, name: &str) -> Result<Namespace, String> {
        let api = ambit_k8s::kube::Api::all(self.client.clone());
        self.get(api, name, &format!("namespace {name}"))
    }
}

/// The agent's socket, called on a runtime of its own.
struct SocketLink {
    socket: PathBuf,
}

impl AgentLink for SocketLink {
    fn cmd_add(&self, req: &CmdAddRequest) -> Result<(), CmdAddError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|error| CmdAddError::Connect {
                socket: self.socket.clone(),
                error,
            })?;
        rt.block_on(cmdadd::call(&self.socket, req))
    }
}

/// The process entry for this mode (stdin already read).
pub fn main(env: &CniEnv, stdin: &[u8]) -> Outcome {
    run(
        env,
        stdin,
        &|conf| KubeCluster::new(conf).map(|c| Box::new(c) as Box<dyn Cluster>),
        &|conf| {
            Box::new(SocketLink {
                socket: conf.socket(),
            })
        },
        &|| std::thread::sleep(RETRY_PAUSE),
    )
}

#[cfg(test)]
mod tests;
