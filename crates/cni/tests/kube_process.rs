//! The plugin's Kubernetes mode as a real process, against the test API server and a fake
//! agent answering `POST /cmdadd` on `pluginevent.sock`. Like `process.rs`, this binary
//! re-executes itself as the plugin, and reports each check in libtest's format
//! (`harness`).

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

use ambit_fake_apiserver::{ApiServer, ServerOptions};
use serde_json::{json, Value};

const CHILD_MARKER: &str = "AMBIT_CNI_TEST_AS_PLUGIN";

mod harness;

fn main() {
    if std::env::var_os(CHILD_MARKER).is_some() {
        std::process::exit(ambit_cni::entry::main_with_process_env());
    }
    let dir = std::env::temp_dir().join(format!("ambit-cni-kube-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let api = rt
        .block_on(ApiServer::start(ServerOptions::default()))
        .unwrap();
    let t = Setup::new(&dir, &api);
    let outcome = harness::run(&[
        ("ambient_pod", &|| ambient_pod(&t)),
        ("not_ambient_pod", &|| not_ambient_pod(&t)),
        ("own_pod_never_asks_the_api", &|| {
            own_pod_never_asks_the_api(&t)
        }),
        ("agent_refuses", &|| agent_refuses(&t)),
        ("agent_missing", &|| agent_missing(&t)),
        ("api_unreachable", &|| api_unreachable(&t)),
    ]);
    drop(t);
    drop(api);
    drop(rt);
    let _ = std::fs::remove_dir_all(&dir);
    outcome.exit();
}

/// One request the fake agent got.
#[derive(Debug, Clone)]
struct Seen {
    request_line: String,
    headers: Vec<(String, String)>,
    body: Value,
}

struct FakeAgent {
    seen: Arc<Mutex<Vec<Seen>>>,
    reply: Arc<Mutex<(u16, String)>>,
}

impl FakeAgent {
    fn start(socket: &Path) -> FakeAgent {
        let _ = std::fs::remove_file(socket);
        let listener = UnixListener::bind(socket).unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let reply = Arc::new(Mutex::new((200u16, String::new())));
        let (s2, r2) = (seen.clone(), reply.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { return };
                let mut r = BufReader::new(&conn);
                let mut request_line = String::new();
                r.read_line(&mut request_line).unwrap();
                let mut headers = Vec::new();
                loop {
                    let mut l = String::new();
                    r.read_line(&mut l).unwrap();
                    let l = l.trim_end();
                    if l.is_empty() {
                        break;
                    }
                    let (k, v) = l.split_once(':').unwrap();
                    headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
                }
                let len: usize = headers
                    .iter()
                    .find(|(k, _)| k == "content-length")
                    .map(|(_, v)| v.parse().unwrap())
                    .unwrap_or(0);
                let mut body = vec![0u8; len];
                r.read_exact(&mut body).unwrap();
                s2.lock().unwrap().push(Seen {
                    request_line: request_line.trim_end().to_string(),
                    headers,
                    body: serde_json::from_slice(&body).unwrap_or(Value::Null),
                });
                let (status, text) = r2.lock().unwrap().clone();
                let _ = write!(
                    &conn,
                    "HTTP/1.1 {status} X\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
                    text.len()
                );
            }
        });
        FakeAgent { seen, reply }
    }

    fn take(&self) -> Vec<Seen> {
        std::mem::take(&mut *self.seen.lock().unwrap())
    }
}

struct Setup<'a> {
    api: &'a ApiServer,
    run_dir: PathBuf,
    agent: FakeAgent,
}

impl<'a> Setup<'a> {
    fn new(dir: &Path, api: &'a ApiServer) -> Setup<'a> {
        let run_dir = dir.join("run");
        std::fs::create_dir_all(&run_dir).unwrap();
        api.create(ambit_fake_apiserver::namespace(
            "shop",
            &[("istio.io/dataplane-mode", "ambient")],
        ))
        .unwrap();
        api.create(ambit_fake_apiserver::namespace("plain", &[]))
            .unwrap();
        api.create(ambit_fake_apiserver::namespace("istio-system", &[]))
            .unwrap();
        api.create(ambit_fake_apiserver::pod("shop", "web-0", "n1"))
            .unwrap();
        api.create(ambit_fake_apiserver::pod("plain", "app-0", "n1"))
            .unwrap();
        api.write_kubeconfig(&run_dir.join("istio-cni-kubeconfig"), &api.admin_token())
            .unwrap();
        let agent = FakeAgent::start(&run_dir.join("pluginevent.sock"));
        Setup {
            api,
            run_dir,
            agent,
        }
    }

    fn conf(&self) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "cniVersion": "1.0.0", "name": "istio-cni", "type": "istio-cni",
            "plugin_log_level": "info",
            "cni_agent_run_dir": self.run_dir, "ambient_enabled": true,
            "enablement_selectors": [
                {"podSelector": {"matchLabels": {"istio.io/dataplane-mode": "ambient"}}},
                {"podSelector": {"matchExpressions": [{"key": "istio.io/dataplane-mode", "operator": "NotIn", "values": ["none"]}]},
                 "namespaceSelector": {"matchLabels": {"istio.io/dataplane-mode": "ambient"}}}],
            "exclude_namespaces": ["kube-system"], "pod_namespace": "istio-system",
            "native_nftables": false, "enable_ambient_detection_retry": false,
            "prevResult": prev(),
        }))
        .unwrap()
    }
}

fn prev() -> Value {
    json!({"cniVersion": "1.0.0",
           "interfaces": [{"name": "eth0", "sandbox": "/var/run/netns/cni-1"}],
           "ips": [{"address": "10.1.0.5/24", "gateway": "10.1.0.1", "interface": 0},
                   {"address": "fd00::5/64", "interface": 0}]})
}

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

fn plugin(command: &str, ns: &str, name: &str, stdin: &[u8]) -> Run {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .env_clear()
        .env(CHILD_MARKER, "1")
        .env("CNI_COMMAND", command)
        .env("CNI_CONTAINERID", "c0ffee")
        .env("CNI_NETNS", "/var/run/netns/cni-1")
        .env("CNI_IFNAME", "eth0")
        .env(
            "CNI_ARGS",
            format!("IgnoreUnknown=1;K8S_POD_NAMESPACE={ns};K8S_POD_NAME={name};K8S_POD_INFRA_CONTAINER_ID=c0ffee;K8S_POD_UID=u1"),
        )
        .env("CNI_PATH", "/opt/cni/bin")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    let out = child.wait_with_output().unwrap();
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}

fn error_msg(r: &Run) -> String {
    assert_eq!(r.code, 1, "{}", r.stdout);
    let v: Value = serde_json::from_str(&r.stdout).unwrap();
    v["msg"].as_str().unwrap().to_string()
}

fn ambient_pod(t: &Setup) {
    t.api.clear_requests();
    let r = plugin("ADD", "shop", "web-0", &t.conf());
    assert_eq!(r.code, 0, "{} {}", r.stdout, r.stderr);
    assert_eq!(serde_json::from_str::<Value>(&r.stdout).unwrap(), prev());
    assert!(r.stderr.is_empty(), "{}", r.stderr);
    let seen = t.agent.take();
    assert_eq!(seen.len(), 1);
    let s = &seen[0];
    assert_eq!(s.request_line, "POST /cmdadd HTTP/1.1");
    let header = |k: &str| {
        s.headers
            .iter()
            .find(|(h, _)| h == k)
            .map(|(_, v)| v.as_str())
    };
    assert_eq!(header("host"), Some("unix"));
    assert_eq!(header("content-type"), Some("application/json"));
    assert_eq!(
        s.body,
        json!({"Netns": "/var/run/netns/cni-1", "PodName": "web-0", "PodNamespace": "shop",
               "IPs": [
                 {"Interface": 0, "Address": {"IP": "10.1.0.5", "Mask": "////AA=="}, "Gateway": "10.1.0.1"},
                 {"Interface": 0, "Address": {"IP": "fd00::5", "Mask": "//////////8AAAAAAAAAAA=="}, "Gateway": ""}]})
    );
    let paths: Vec<String> = t.api.requests().into_iter().map(|r| r.path).collect();
    assert_eq!(
        paths,
        [
            "/api/v1/namespaces/shop/pods/web-0",
            "/api/v1/namespaces/shop"
        ],
        "one GET each"
    );
}

fn not_ambient_pod(t: &Setup) {
    let r = plugin("ADD", "plain", "app-0", &t.conf());
    assert_eq!(r.code, 0, "{}", r.stdout);
    assert_eq!(serde_json::from_str::<Value>(&r.stdout).unwrap(), prev());
    assert!(t.agent.take().is_empty());
}

fn own_pod_never_asks_the_api(t: &Setup) {
    t.api.clear_requests();
    let r = plugin("ADD", "istio-system", "istio-cni-node-abcde", &t.conf());
    assert_eq!(r.code, 0, "{}", r.stdout);
    assert_eq!(serde_json::from_str::<Value>(&r.stdout).unwrap(), prev());
    assert!(t.api.requests().is_empty(), "{:?}", t.api.requests());
    assert!(t.agent.take().is_empty());
}

fn agent_refuses(t: &Setup) {
    *t.agent.reply.lock().unwrap() = (500, "no ztunnel connection".into());
    let r = plugin("ADD", "shop", "web-0", &t.conf());
    *t.agent.reply.lock().unwrap() = (200, String::new());
    let msg = error_msg(&r);
    assert!(
        msg.contains("no ztunnel connection") && msg.contains("500"),
        "{msg}"
    );
    assert_eq!(t.agent.take().len(), 1);
}

fn agent_missing(t: &Setup) {
    let socket = t.run_dir.join("pluginevent.sock");
    let moved = t.run_dir.join("pluginevent.sock.away");
    std::fs::rename(&socket, &moved).unwrap();
    let r = plugin("ADD", "shop", "web-0", &t.conf());
    std::fs::rename(&moved, &socket).unwrap();
    let msg = error_msg(&r);
    assert!(
        msg.contains("cannot connect") && msg.contains(socket.to_str().unwrap()),
        "{msg}"
    );
}

fn api_unreachable(t: &Setup) {
    // A port nobody listens on: bind one, note it, close it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let kubeconfig = t.run_dir.join("istio-cni-kubeconfig");
    let good = std::fs::read_to_string(&kubeconfig).unwrap();
    let url = t.api.url();
    std::fs::write(
        &kubeconfig,
        good.replace(&url, &format!("https://127.0.0.1:{port}")),
    )
    .unwrap();
    let r = plugin("ADD", "shop", "web-0", &t.conf());
    std::fs::write(&kubeconfig, good).unwrap();
    let msg = error_msg(&r);
    assert!(
        msg.contains("cannot tell whether pod shop/web-0 is ambient"),
        "{msg}"
    );
    assert!(t.agent.take().is_empty());
}
