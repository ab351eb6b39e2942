//! The chained CNI plugin `ambit-cni` (CNI spec 1.0; configs of 0.3.0, 0.3.1 and 0.4.0
//! are accepted too).
//!
//! It sits last in the pod network's plugin chain. On ADD it tells the node agent about
//! the new pod and waits until the agent has captured the pod's traffic; only then does
//! it pass the previous plugin's result on, unchanged. If the agent cannot be reached
//! or refuses, ADD fails and the runtime retries: a pod never starts uncaptured.
//!
//! Plugin configuration keys (besides `cniVersion`, `name`, `type`, `prevResult`; any
//! other key is ignored, runtimes add their own):
//!
//! | key | type | default |
//! |---|---|---|
//! | `agent_socket` | string | [`DEFAULT_AGENT_SOCKET`] |
//! | `exclude_namespaces` | list of strings | `["kube-system"]` |
//! | `log_level` | string | ignored (the plugin does not log) |
//!
//! Pod identity comes from `CNI_ARGS` (`K8S_POD_NAMESPACE`, `K8S_POD_NAME`,
//! `K8S_POD_UID`, `AMBIT_SERVICE_ACCOUNT`); a pod opts out with `AMBIT_EXCLUDE=true` or
//! `ISTIO_DATAPLANE_MODE=none`.
//!
//! Nothing here writes to stdout or stderr: [`run`] returns what to print.

use std::collections::BTreeSet;

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;
use serde_json::{Map, Value};

use crate::api::{
    self, AgentCallError, AgentRequest, AgentResponse, PodInfo, DEFAULT_AGENT_SOCKET,
    DEFAULT_CALL_TIMEOUT,
};

/// The spec version this plugin implements (and reports for VERSION).
pub const IMPLEMENTED_VERSION: &str = "1.0.0";

/// The spec versions whose configurations the plugin accepts.
pub const SUPPORTED_VERSIONS: &[&str] = &["0.3.0", "0.3.1", "0.4.0", "1.0.0"];

/// Namespaces never enrolled unless the config says otherwise.
pub const DEFAULT_EXCLUDE_NAMESPACES: &[&str] = &["kube-system"];

/// Largest stdin [`main_with_process_env`] reads.
pub const MAX_STDIN_BYTES: usize = 16 * 1024 * 1024;

/// CNI error codes: 1-99 are the spec's well-known codes, 100+ are ambit's own.
pub mod codes {
    /// The configuration's `cniVersion` is not supported (or too old for the command).
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    /// A required environment variable (`CNI_COMMAND`, `CNI_NETNS`, ...) is missing or wrong.
    pub const INVALID_ENV: u32 = 4;
    /// Reading stdin failed.
    pub const IO_FAILURE: u32 = 5;
    /// stdin could not be decoded (not JSON, not an object).
    pub const DECODING_FAILURE: u32 = 6;
    /// The network configuration is invalid (missing `cniVersion`, no `prevResult`, a key
    /// of the wrong type, an unparsable previous result).
    pub const INVALID_CONFIG: u32 = 7;
    /// Transient: the node agent is not reachable or did not answer in time.
    pub const TRY_AGAIN_LATER: u32 = 11;
    /// The node agent refused the request (ADD), or the pod is not enrolled (CHECK).
    pub const AGENT_REFUSED: u32 = 100;
    /// The node agent's answer was not understood (version skew between plugin and agent?).
    pub const AGENT_PROTOCOL: u32 = 101;
    /// A bug in the plugin (a caught panic).
    pub const INTERNAL: u32 = 102;
}

/// The CNI environment of one invocation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CniEnv {
    /// `CNI_COMMAND`: `ADD`, `DEL`, `CHECK` or `VERSION`.
    pub command: String,
    /// `CNI_CONTAINERID`.
    pub container_id: String,
    /// `CNI_NETNS`: path of the container's network namespace (may be empty on DEL).
    pub netns: String,
    /// `CNI_IFNAME`.
    pub ifname: String,
    /// `CNI_ARGS`: `;`-separated `KEY=VALUE` pairs.
    pub args: String,
    /// `CNI_PATH`.
    pub path: String,
}

impl CniEnv {
    /// Reads the `CNI_*` variables (unset ⇒ empty; non-UTF-8 bytes are replaced).
    pub fn from_process_env() -> CniEnv {
        let var = |k: &str| {
            std::env::var_os(k)
                .map(|v| v.to_string_lossy().into_owned())
                .unwrap_or_default()
        };
        CniEnv {
            command: var("CNI_COMMAND"),
            container_id: var("CNI_CONTAINERID"),
            netns: var("CNI_NETNS"),
            ifname: var("CNI_IFNAME"),
            args: var("CNI_ARGS"),
            path: var("CNI_PATH"),
        }
    }
}

/// What the plugin process prints on stdout and exits with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub stdout: String,
    pub exit_code: i32,
}

impl Outcome {
    pub(crate) fn success(stdout: String) -> Outcome {
        Outcome {
            stdout,
            exit_code: 0,
        }
    }
}

/// The node agent, as the plugin sees it.
pub trait Agent {
    fn call(&self, req: &AgentRequest) -> Result<AgentResponse, AgentCallError>;
}

/// The real agent: [`api::call`] on a Unix socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SocketAgent {
    pub socket: PathBuf,
    pub timeout: Duration,
}

impl SocketAgent {
    /// An agent at `socket` with [`DEFAULT_CALL_TIMEOUT`].
    pub fn new(socket: impl Into<PathBuf>) -> SocketAgent {
        SocketAgent {
            socket: socket.into(),
            timeout: DEFAULT_CALL_TIMEOUT,
        }
    }
}

impl Agent for SocketAgent {
    fn call(&self, req: &AgentRequest) -> Result<AgentResponse, AgentCallError> {
        api::call(&self.socket, req, self.timeout)
    }
}

/// A CNI error result (spec "Error" object).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CniError {
    pub code: u32,
    pub msg: String,
    pub details: String,
}

impl CniError {
    pub(crate) fn new(code: u32, msg: impl Into<String>) -> CniError {
        CniError {
            code,
            msg: msg.into(),
            details: String::new(),
        }
    }

    pub(crate) fn details(mut self, details: impl Into<String>) -> CniError {
        self.details = details.into();
        self
    }

    /// The error result JSON for a configuration of `cni_version`.
    pub fn to_json(&self, cni_version: &str) -> String {
        #[derive(Serialize)]
        struct Wire<'a> {
            #[serde(rename = "cniVersion")]
            cni_version: &'a str,
            code: u32,
            msg: &'a str,
            #[serde(skip_serializing_if = "str::is_empty")]
            details: &'a str,
        }
        serde_json::to_string(&Wire {
            cni_version,
            code: self.code,
            msg: &self.msg,
            details: &self.details,
        })
        .unwrap_or_else(|_| {
            format!(
                r#"{{"cniVersion":"{IMPLEMENTED_VERSION}","code":{},"msg":"error"}}"#,
                self.code
            )
        })
    }

    pub(crate) fn outcome(&self, cni_version: &str) -> Outcome {
        Outcome {
            stdout: self.to_json(cni_version),
            exit_code: 1,
        }
    }
}

/// Runs one plugin invocation. Never panics, never does I/O other than through `agent`.
pub fn run(env: &CniEnv, stdin: &[u8], agent: &dyn Agent) -> Outcome {
    match env.command.as_str() {
        "VERSION" => Outcome::success(version_json()),
        "ADD" => finish(cmd_add(env, stdin, agent), stdin),
        "DEL" => cmd_del(env, stdin, agent),
        "CHECK" => finish(cmd_check(env, stdin, agent), stdin),
        "" => CniError::new(codes::INVALID_ENV, "CNI_COMMAND is not set")
            .details("ambit-cni is a CNI plugin: a container runtime runs it with CNI_COMMAND=ADD, DEL, CHECK or VERSION")
            .outcome(&best_effort_version(stdin)),
        other => CniError::new(
            codes::INVALID_ENV,
            format!("unsupported CNI_COMMAND {other:?}: ambit-cni implements ADD, DEL, CHECK and VERSION"),
        )
        .outcome(&best_effort_version(stdin)),
    }
}

pub(crate) fn finish(r: Result<Outcome, CniError>, stdin: &[u8]) -> Outcome {
    r.unwrap_or_else(|e| e.outcome(&best_effort_version(stdin)))
}

/// The VERSION answer.
pub fn version_json() -> String {
    serde_json::json!({
        "cniVersion": IMPLEMENTED_VERSION,
        "supportedVersions": SUPPORTED_VERSIONS,
    })
    .to_string()
}

// ---------------------------------------------------------------------------------
// Configuration

#[derive(Debug)]
pub(crate) struct NetConf {
    pub(crate) cni_version: String,
    pub(crate) prev_result: Option<Map<String, Value>>,
    agent_socket: Option<String>,
    exclude_namespaces: Vec<String>,
}

impl NetConf {
    fn socket(&self) -> &str {
        self.agent_socket.as_deref().unwrap_or(DEFAULT_AGENT_SOCKET)
    }
}

pub(crate) fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

pub(crate) fn decode_object(stdin: &[u8]) -> Result<Map<String, Value>, CniError> {
    if stdin.iter().all(|b| b.is_ascii_whitespace()) {
        return Err(CniError::new(
            codes::DECODING_FAILURE,
            "stdin is empty: expected the network configuration as JSON",
        ));
    }
    match serde_json::from_slice::<Value>(stdin) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(other) => Err(CniError::new(
            codes::DECODING_FAILURE,
            format!(
                "stdin is {} but the network configuration must be a JSON object",
                json_kind(&other)
            ),
        )),
        Err(e) => Err(CniError::new(
            codes::DECODING_FAILURE,
            format!("stdin is not valid JSON: {e}"),
        )),
    }
}

pub(crate) fn parse_conf(stdin: &[u8]) -> Result<NetConf, CniError> {
    let mut m = decode_object(stdin)?;
    let cni_version = match m.get("cniVersion") {
        None | Some(Value::Null) => {
            return Err(CniError::new(
                codes::INVALID_CONFIG,
                "the network configuration has no \"cniVersion\"",
            ))
        }
        Some(Value::String(v)) => v.clone(),
        Some(other) => {
            return Err(CniError::new(
                codes::INVALID_CONFIG,
                format!("\"cniVersion\" must be a string, got {}", json_kind(other)),
            ))
        }
    };
    if !SUPPORTED_VERSIONS.contains(&cni_version.as_str()) {
        return Err(CniError::new(
            codes::INCOMPATIBLE_VERSION,
            format!(
                "incompatible CNI version {cni_version:?}: ambit-cni supports {}",
                SUPPORTED_VERSIONS.join(", ")
            ),
        ));
    }
    let agent_socket = match m.get("agent_socket") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s.is_empty() => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(other) => {
            return Err(CniError::new(
                codes::INVALID_CONFIG,
                format!(
                    "\"agent_socket\" must be a string (a Unix socket path), got {}",
                    json_kind(other)
                ),
            ))
        }
    };
    let exclude_namespaces = match m.get("exclude_namespaces") {
        None | Some(Value::Null) => DEFAULT_EXCLUDE_NAMESPACES
            .iter()
            .map(|s| s.to_string())
            .collect(),
        Some(Value::Array(items)) => {
            let mut out = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                match item {
                    Value::String(s) => out.push(s.clone()),
                    other => {
                        return Err(CniError::new(
                            codes::INVALID_CONFIG,
                            format!(
                            "\"exclude_namespaces\"[{i}] must be a namespace name (string), got {}",
                            json_kind(other)
                        ),
                        ))
                    }
                }
            }
            out
        }
        Some(other) => {
            return Err(CniError::new(
                codes::INVALID_CONFIG,
                format!(
                    "\"exclude_namespaces\" must be a list of namespace names, got {}",
                    json_kind(other)
                ),
            ))
        }
    };
    let prev_result = match m.remove("prevResult") {
        None | Some(Value::Null) => None,
        Some(Value::Object(p)) => Some(p),
        Some(other) => {
            return Err(CniError::new(
                codes::INVALID_CONFIG,
                format!(
                    "\"prevResult\" must be a JSON object, got {}",
                    json_kind(&other)
                ),
            ))
        }
    };
    Ok(NetConf {
        cni_version,
        prev_result,
        agent_socket,
        exclude_namespaces,
    })
}

/// The `cniVersion` to put in an error result: the config's when it is a supported
/// version, else the implemented one.
pub(crate) fn best_effort_version(stdin: &[u8]) -> String {
    serde_json::from_slice::<Value>(stdin)
        .ok()
        .and_then(|v| match v.get("cniVersion") {
            Some(Value::String(s)) if SUPPORTED_VERSIONS.contains(&s.as_str()) => Some(s.clone()),
            _ => None,
        })
        .unwrap_or_else(|| IMPLEMENTED_VERSION.to_string())
}

/// The agent socket named by the config on stdin (best effort), else the default.
pub fn agent_socket_of(stdin: &[u8]) -> PathBuf {
    serde_json::from_slice::<Value>(stdin)
        .ok()
        .and_then(|v| match v.get("agent_socket") {
            Some(Value::String(s)) if !s.is_empty() => Some(PathBuf::from(s)),
            _ => None,
        })
        .unwrap_or_else(|| PathBuf::from(DEFAULT_AGENT_SOCKET))
}

// ---------------------------------------------------------------------------------
// CNI_ARGS and the enrollment decision

#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct PodArgs {
    pub(crate) namespace: String,
    pub(crate) name: String,
    uid: String,
    service_account: String,
    opt_out: bool,
}

/// Parses `CNI_ARGS` (`K=V;K=V`). Unknown keys, empty items and items without `=` are
/// ignored; the last value of a key wins; a value may contain `=`.
pub(crate) fn parse_args(args: &str) -> PodArgs {
    let mut p = PodArgs::default();
    for item in args.split(';') {
        let Some((k, v)) = item.split_once('=') else {
            continue;
        };
        match k.trim() {
            "K8S_POD_NAMESPACE" => p.namespace = v.trim().to_string(),
            "K8S_POD_NAME" => p.name = v.trim().to_string(),
            "K8S_POD_UID" => p.uid = v.trim().to_string(),
            "AMBIT_SERVICE_ACCOUNT" => p.service_account = v.trim().to_string(),
            "AMBIT_EXCLUDE" => p.opt_out = is_true(v),
            "ISTIO_DATAPLANE_MODE" => p.opt_out = v.trim().eq_ignore_ascii_case("none"),
            _ => {}
        }
    }
    p
}

fn is_true(v: &str) -> bool {
    let v = v.trim();
    v.eq_ignore_ascii_case("true") || v == "1" || v.eq_ignore_ascii_case("yes")
}

#[derive(Debug, PartialEq, Eq)]
enum Decision {
    /// No `K8S_POD_NAME`/`K8S_POD_NAMESPACE`: not a Kubernetes pod.
    NotKube,
    ExcludedNamespace,
    OptedOut,
    /// Enroll the pod with this uid and service account.
    Enroll {
        uid: String,
        service_account: String,
    },
}

fn decide(p: &PodArgs, container_id: &str, conf: &NetConf) -> Decision {
    if p.name.is_empty() || p.namespace.is_empty() {
        return Decision::NotKube;
    }
    if conf.exclude_namespaces.contains(&p.namespace) {
        return Decision::ExcludedNamespace;
    }
    if p.opt_out {
        return Decision::OptedOut;
    }
    Decision::Enroll {
        uid: pod_uid(p, container_id),
        service_account: if p.service_account.is_empty() {
            "default".into()
        } else {
            p.service_account.clone()
        },
    }
}

fn pod_uid(p: &PodArgs, container_id: &str) -> String {
    if p.uid.is_empty() {
        container_id.to_string()
    } else {
        p.uid.clone()
    }
}

pub(crate) fn require_env(env: &CniEnv, command: &str) -> Result<(), CniError> {
    let missing: Vec<&str> = [
        ("CNI_CONTAINERID", &env.container_id),
        ("CNI_NETNS", &env.netns),
        ("CNI_IFNAME", &env.ifname),
    ]
    .iter()
    .filter(|(_, v)| v.is_empty())
    .map(|(k, _)| *k)
    .collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(CniError::new(
        codes::INVALID_ENV,
        format!(
            "missing required environment variable{} for {command}: {}",
            if missing.len() > 1 { "s" } else { "" },
            missing.join(", ")
        ),
    ))
}

// ---------------------------------------------------------------------------------
// The previous result

/// The pod addresses in `prevResult.ips[].address` (CIDR, e.g. `10.1.0.5/24`; a bare
/// address is accepted too). IPv4-mapped IPv6 is unmapped; duplicates are dropped.
fn result_ips(prev: &Map<String, Value>) -> Result<Vec<IpAddr>, CniError> {
    let ips = match prev.get("ips") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(a)) => a,
        Some(other) => {
            return Err(CniError::new(
                codes::INVALID_CONFIG,
                format!("prevResult.ips must be a list, got {}", json_kind(other)),
            ))
        }
    };
    let mut out = Vec::with_capacity(ips.len());
    let mut seen = BTreeSet::new();
    for (i, entry) in ips.iter().enumerate() {
        let addr = match entry.get("address") {
            Some(Value::String(s)) => s,
            Some(other) => {
                return Err(CniError::new(
                    codes::INVALID_CONFIG,
                    format!(
                        "prevResult.ips[{i}].address must be a string, got {}",
                        json_kind(other)
                    ),
                ))
            }
            None => {
                return Err(CniError::new(
                    codes::INVALID_CONFIG,
                    format!("prevResult.ips[{i}] has no \"address\""),
                ))
            }
        };
        let ip = parse_cidr_ip(addr).ok_or_else(|| {
            CniError::new(
                codes::INVALID_CONFIG,
                format!(
                    "prevResult.ips[{i}].address {addr:?} is not an IP address in CIDR notation"
                ),
            )
        })?;
        if seen.insert(ip) {
            out.push(ip);
        }
    }
    Ok(out)
}

fn parse_cidr_ip(s: &str) -> Option<IpAddr> {
    let s = s.trim();
    let ip = match s.parse::<ipnet::IpNet>() {
        Ok(net) => net.addr(),
        Err(_) => s.parse::<IpAddr>().ok()?,
    };
    Some(ip.to_canonical())
}

/// `prevResult`, expressed for a configuration of `version`: unchanged when it already
/// has that `cniVersion`; otherwise `cniVersion` is set, and the per-IP `version` field
/// (present in 0.3.x/0.4.0 results, gone in 1.0.0) is dropped or filled in.
pub(crate) fn passthrough(mut prev: Map<String, Value>, version: &str) -> String {
    let same = matches!(prev.get("cniVersion"), Some(Value::String(v)) if v == version);
    if !same {
        prev.insert("cniVersion".into(), Value::String(version.into()));
        let legacy = version.starts_with("0.");
        if let Some(Value::Array(ips)) = prev.get_mut("ips") {
            for entry in ips.iter_mut() {
                let Value::Object(e) = entry else { continue };
                if !legacy {
                    e.remove("version");
                } else if !e.contains_key("version") {
                    let family = match e.get("address") {
                        Some(Value::String(a)) => parse_cidr_ip(a),
                        _ => None,
                    };
                    if let Some(ip) = family {
                        let v = if ip.is_ipv4() { "4" } else { "6" };
                        e.insert("version".into(), Value::String(v.into()));
                    }
                }
            }
        }
    }
    Value::Object(prev).to_string()
}

// ---------------------------------------------------------------------------------
// Commands

fn cmd_add(env: &CniEnv, stdin: &[u8], agent: &dyn Agent) -> Result<Outcome, CniError> {
    let mut conf = parse_conf(stdin)?;
    require_env(env, "ADD")?;
    let Some(prev) = conf.prev_result.take() else {
        return Err(CniError::new(
            codes::INVALID_CONFIG,
            "ambit-cni must be chained after a plugin that assigns IPs: the configuration has no prevResult",
        )
        .details("list ambit-cni after the interface/IPAM plugin (last) in the \"plugins\" of the network's .conflist"));
    };
    let args = parse_args(&env.args);
    let (uid, service_account) = match decide(&args, &env.container_id, &conf) {
        Decision::Enroll {
            uid,
            service_account,
        } => (uid, service_account),
        Decision::NotKube | Decision::ExcludedNamespace | Decision::OptedOut => {
            return Ok(Outcome::success(passthrough(prev, &conf.cni_version)));
        }
    };
    let ips = result_ips(&prev)?;
    let pod = PodInfo {
        uid: uid.clone(),
        name: args.name.clone(),
        namespace: args.namespace.clone(),
        service_account,
        netns: env.netns.clone(),
        ips,
        container_id: env.container_id.clone(),
    };
    let who = format!("{}/{} (uid {uid})", args.namespace, args.name);
    match agent.call(&AgentRequest::Add(pod)) {
        Ok(_) => Ok(Outcome::success(passthrough(prev, &conf.cni_version))),
        Err(e) => Err(agent_error(&e, conf.socket(), &format!("enroll pod {who}"))),
    }
}

fn cmd_check(env: &CniEnv, stdin: &[u8], agent: &dyn Agent) -> Result<Outcome, CniError> {
    let conf = parse_conf(stdin)?;
    if conf.cni_version.starts_with("0.3.") {
        return Err(CniError::new(
            codes::INCOMPATIBLE_VERSION,
            format!(
                "CHECK needs a configuration of cniVersion 0.4.0 or later, this one is {}",
                conf.cni_version
            ),
        ));
    }
    require_env(env, "CHECK")?;
    let args = parse_args(&env.args);
    let uid = match decide(&args, &env.container_id, &conf) {
        Decision::Enroll { uid, .. } => uid,
        _ => return Ok(Outcome::success(String::new())),
    };
    let who = format!("{}/{} (uid {uid})", args.namespace, args.name);
    match agent.call(&AgentRequest::Check { uid }) {
        Ok(_) => Ok(Outcome::success(String::new())),
        Err(AgentCallError::Rejected(why)) => Err(CniError::new(
            codes::AGENT_REFUSED,
            format!("pod {who} is not enrolled in the ambient mesh: {why}"),
        )
        .details(format!("asked the ambit node agent at {}", conf.socket()))),
        Err(e) => Err(agent_error(&e, conf.socket(), &format!("check pod {who}"))),
    }
}

/// DEL never fails: cleanup is idempotent and best effort, the agent's pod watch does
/// the rest. It prints nothing.
fn cmd_del(env: &CniEnv, stdin: &[u8], agent: &dyn Agent) -> Outcome {
    let args = parse_args(&env.args);
    let _ = stdin; // the config has nothing DEL needs
    if !args.name.is_empty() && !args.namespace.is_empty() {
        let uid = pod_uid(&args, &env.container_id);
        if !uid.is_empty() {
            // Sent for excluded pods too: the config may have changed since ADD, and
            // removing an unknown uid is a no-op for the agent.
            let _ = agent.call(&AgentRequest::Remove { uid });
        }
    }
    Outcome::success(String::new())
}

fn agent_error(e: &AgentCallError, socket: &str, what: &str) -> CniError {
    match e {
        AgentCallError::Rejected(why) => CniError::new(
            codes::AGENT_REFUSED,
            format!("the ambit node agent at {socket} refused to {what}: {why}"),
        )
        .details("the pod is not started without traffic capture; the runtime retries the sandbox"),
        AgentCallError::Protocol(_) => CniError::new(
            codes::AGENT_PROTOCOL,
            format!("cannot {what}: bad answer from the ambit node agent at {socket}: {e}"),
        )
        .details("are ambit-cni and the ambit agent the same version?"),
        _ => CniError::new(
            codes::TRY_AGAIN_LATER,
            format!("cannot {what}: the ambit node agent at {socket} is not reachable: {e}"),
        )
        .details(format!(
            "the pod is not started without traffic capture; the runtime retries. Is the ambit agent running on this node and listening on {socket}?"
        )),
    }
}

#[cfg(test)]
mod tests;
