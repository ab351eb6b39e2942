//! Who may enroll a pod through the plugin socket, and which netns a `/cmdadd` may name
//! (root only; the setting of [`common::k8s`]). A caller run by another uid is a child
//! process forked and switched to uid/gid 65534 (`nobody`); everything else is called as
//! root from the test.

// The caller run as another uid is a forked child (fork and the calls after it are
// `unsafe`: only async-signal-safe calls are made between fork and _exit).
#![allow(unsafe_code)]

mod common;

use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use ambit_cni::istio_api::{CmdAddRequest, IpConfig};
use ambit_fake_apiserver::{namespace, pod, Resource, ServerOptions};
use common::k8s::{get_body, http, Env, AMBIENT, NODE};
use common::{ip, require_root, TestNetns};
use serde_json::json;

const NOBODY: u32 = 65534;

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

fn with_ip(ns: &TestNetns, addr: &str) {
    ip(&[
        "-n",
        &ns.name,
        "addr",
        "add",
        &format!("{addr}/32"),
        "dev",
        "lo",
    ]);
}

fn cmdadd_body(netns: &Path, name: &str, namespace: &str, ips: &[&str]) -> String {
    let request = CmdAddRequest {
        netns: netns.display().to_string(),
        pod_name: name.into(),
        pod_namespace: namespace.into(),
        ips: ips
            .iter()
            .map(|a| IpConfig::new(a.parse().unwrap(), 32))
            .collect(),
    };
    String::from_utf8(request.encode()).unwrap()
}

/// `POST /cmdadd` as root (the test's own uid).
async fn cmdadd(env: &Env, body: &str) -> (u16, String) {
    let s = tokio::net::UnixStream::connect(env.cfg.plugin_socket())
        .await
        .unwrap();
    http(s, "POST", "/cmdadd", body).await
}

/// The in-pod capture rules (the host's own rules have no such redirect).
fn captured(ns: &TestNetns) -> bool {
    ns.saved(false).contains("--to-ports 15001")
}

async fn metrics(env: &Env) -> String {
    get_body(env.cfg.metrics_addr, "/metrics").await
}

/// The raw HTTP request a plugin sends.
fn raw_request(body: &str) -> Vec<u8> {
    format!(
        "POST /cmdadd HTTP/1.1\r\nHost: unix\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Sends `request` on the Unix socket `path` from a forked child running as uid and gid
/// 65534, and returns what it read back. The child makes only async-signal-safe calls
/// (the test process has other threads): everything it needs is prepared before the fork.
/// Panics, naming the step, if the child could not get that far.
async fn call_as_nobody(path: &Path, request: Vec<u8>) -> String {
    let path = path.to_owned();
    tokio::task::spawn_blocking(move || {
        let addr = nix::sys::socket::UnixAddr::new(&path).unwrap();
        let (read_end, write_end) = nix::unistd::pipe().unwrap();
        // SAFETY: the child calls only async-signal-safe functions (setgroups, setgid,
        // setuid, socket, connect, send, read, write, _exit) on memory prepared before.
        match unsafe { nix::unistd::fork() }.unwrap() {
            nix::unistd::ForkResult::Child => {
                let code = unsafe { child_call(&addr, &request, write_end.as_raw_fd()) };
                unsafe { libc::_exit(code) }
            }
            nix::unistd::ForkResult::Parent { child } => {
                drop(write_end);
                let mut out = Vec::new();
                std::io::Read::read_to_end(&mut std::fs::File::from(read_end), &mut out).unwrap();
                let status = nix::sys::wait::waitpid(child, None).unwrap();
                let step = match status {
                    nix::sys::wait::WaitStatus::Exited(_, 0) => None,
                    nix::sys::wait::WaitStatus::Exited(_, 10) => Some("setgroups"),
                    nix::sys::wait::WaitStatus::Exited(_, 11) => Some("setgid 65534"),
                    nix::sys::wait::WaitStatus::Exited(_, 12) => Some("setuid 65534"),
                    nix::sys::wait::WaitStatus::Exited(_, 13) => Some("socket"),
                    nix::sys::wait::WaitStatus::Exited(_, 14) => Some("connect"),
                    _ => Some("an unexpected end"),
                };
                if let Some(step) = step {
                    panic!("the uid 65534 caller failed at {step} ({status:?})");
                }
                String::from_utf8_lossy(&out).into_owned()
            }
        }
    })
    .await
    .unwrap()
}

/// The forked child's work; returns its exit code.
///
/// # Safety
/// Only in a freshly forked child.
unsafe fn child_call(addr: &nix::sys::socket::UnixAddr, request: &[u8], out: i32) -> i32 {
    use nix::sys::socket::SockaddrLike;
    if libc::setgroups(0, std::ptr::null()) != 0 {
        return 10;
    }
    if libc::setgid(NOBODY) != 0 {
        return 11;
    }
    if libc::setuid(NOBODY) != 0 {
        return 12;
    }
    let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
    if fd < 0 {
        return 13;
    }
    if libc::connect(fd, addr.as_ptr().cast(), addr.len()) != 0 {
        return 14;
    }
    // The agent may answer and close before the request is all out: a failed send is
    // fine, the answer is read all the same.
    let mut sent = 0;
    while sent < request.len() {
        let n = libc::send(
            fd,
            request[sent..].as_ptr().cast(),
            request.len() - sent,
            libc::MSG_NOSIGNAL,
        );
        if n <= 0 {
            break;
        }
        sent += n as usize;
    }
    let mut buf = [0u8; 4096];
    loop {
        let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
        if n <= 0 {
            return 0;
        }
        libc::write(out, buf.as_ptr().cast(), n as usize);
    }
}

/// Loosens the modes that keep `nobody` from the socket, as a misconfiguration would, to
/// reach the second fence: the caller's uid.
fn loosen(env: &Env) {
    let socket = env.cfg.plugin_socket();
    let mut dir = socket.parent().unwrap();
    loop {
        let m = mode(dir);
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(m | 0o011)).unwrap();
        if dir == env.dir.path() {
            break;
        }
        dir = dir.parent().unwrap();
    }
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666)).unwrap();
}

/// A pod as the agent sees it at CNI ADD time: created, its status without IPs yet, its
/// namespace ambient; its sandbox netns holding `addr`.
fn new_pod(env: &Env, ns: &str, name: &str, addr: &str) -> TestNetns {
    let netns = TestNetns::new();
    with_ip(&netns, addr);
    env.api.create(pod(ns, name, NODE)).unwrap();
    netns
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_run_directory_is_made_private_even_when_it_existed() {
    require_root("the_run_directory_is_made_private_even_when_it_existed");
    let env = Env::new(ServerOptions::default(), None).await;
    let run = env.cfg.run_dir.clone();
    std::fs::create_dir(&run).unwrap();
    std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o755)).unwrap();
    let agent = env.start().await;
    env.wait_ready().await;
    assert_eq!(mode(&run), 0o700, "the existing directory is made 0700");
    assert_eq!(mode(&env.cfg.plugin_socket()), 0o600);
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_run_by_another_uid_is_refused() {
    require_root("a_caller_run_by_another_uid_is_refused");
    let env = Env::new(ServerOptions::default(), None).await;
    env.api.create(namespace("shop", &[AMBIENT])).unwrap();
    let web = new_pod(&env, "shop", "web", "10.56.1.5");
    let body = cmdadd_body(&web.path(), "web", "shop", &["10.56.1.5"]);
    let agent = env.start().await;
    env.wait_ready().await;
    loosen(&env);

    let answer = call_as_nobody(&env.cfg.plugin_socket(), raw_request(&body)).await;
    assert!(
        answer.starts_with("HTTP/1.1 403") && answer.contains("uid 65534"),
        "{answer}"
    );
    assert!(!captured(&web), "no rules for nobody's call");
    assert!(env.probes().is_empty(), "{}", env.probes());
    let m = metrics(&env).await;
    assert!(
        m.contains("istio_cni_plugin_requests_total{response_code=\"403\"} 1"),
        "{m}"
    );

    // The same call from root (the plugin) is served: it was refused for its uid alone.
    let (code, text) = cmdadd(&env, &body).await;
    assert_eq!(code, 500, "no node proxy yet, so pending: {text}");
    assert!(captured(&web));
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_configured_plugin_uid_is_served() {
    require_root("the_configured_plugin_uid_is_served");
    let mut env = Env::new(ServerOptions::default(), None).await;
    env.cfg.plugin_uid = Some(NOBODY);
    env.api.create(namespace("shop", &[AMBIENT])).unwrap();
    let web = new_pod(&env, "shop", "web", "10.56.4.5");
    let body = cmdadd_body(&web.path(), "web", "shop", &["10.56.4.5"]);
    let agent = env.start().await;
    env.wait_ready().await;
    loosen(&env);
    let answer = call_as_nobody(&env.cfg.plugin_socket(), raw_request(&body)).await;
    // Served: captured, and pending for want of a node proxy.
    assert!(answer.starts_with("HTTP/1.1 500"), "{answer}");
    assert!(answer.contains("no node proxy"), "{answer}");
    assert!(captured(&web));
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_naming_the_nodes_netns_is_refused() {
    require_root("a_request_naming_the_nodes_netns_is_refused");
    let env = Env::new(ServerOptions::default(), None).await;
    env.api.create(namespace("shop", &[AMBIENT])).unwrap();
    env.api.create(pod("shop", "web", NODE)).unwrap();
    // The node holds the address the request claims, so only the netns's identity tells.
    with_ip(&env.host, "10.56.2.5");
    let agent = env.start().await;
    env.wait_ready().await;

    let body = cmdadd_body(&env.host.path(), "web", "shop", &["10.56.2.5"]);
    let (code, text) = cmdadd(&env, &body).await;
    assert_eq!(code, 403, "{text}");
    assert!(
        text.contains("shop/web") && text.contains("node's own network namespace"),
        "{text}"
    );
    assert!(!captured(&env.host), "{}", env.host.saved(false));
    assert!(env.probes().is_empty(), "{}", env.probes());
    let m = metrics(&env).await;
    assert!(
        m.contains("istio_cni_plugin_requests_total{response_code=\"403\"} 1"),
        "{m}"
    );
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_naming_another_pods_netns_is_refused() {
    require_root("a_request_naming_another_pods_netns_is_refused");
    let env = Env::new(ServerOptions::default(), None).await;
    env.api.create(namespace("shop", &[AMBIENT])).unwrap();
    env.api.create(namespace("plain", &[])).unwrap();
    // db: another pod (not in the mesh), running with its IP.
    let db = TestNetns::new();
    with_ip(&db, "10.56.3.9");
    env.kubelet_pod("plain", "db", &db, "10.56.3.9", 300);
    // web: the API server has its IP; its sandbox is not in /proc, so the informer cannot
    // capture it on its own.
    let web = new_pod(&env, "shop", "web", "10.56.3.5");
    env.api
        .update(Resource::Pods, Some("shop"), "web", |p| {
            p["status"] =
                json!({"phase": "Pending", "podIP": "10.56.3.5", "podIPs": [{"ip": "10.56.3.5"}]});
        })
        .unwrap();
    // api: at its first ADD, no IP in the API server yet.
    env.api.create(pod("shop", "api", NODE)).unwrap();
    let agent = env.start().await;
    env.wait_ready().await;

    // web's request names db's netns (and db's IP): db's netns holds none of web's IPs.
    let (code, text) = cmdadd(
        &env,
        &cmdadd_body(&db.path(), "web", "shop", &["10.56.3.9"]),
    )
    .await;
    assert_eq!(code, 403, "{text}");
    assert!(
        text.contains("shop/web") && text.contains("none of the pod's IPs [10.56.3.5]"),
        "{text}"
    );
    // api has no IP in the API server: the request's IP must be no other pod's.
    let (code, text) = cmdadd(
        &env,
        &cmdadd_body(&db.path(), "api", "shop", &["10.56.3.9"]),
    )
    .await;
    assert_eq!(code, 403, "{text}");
    assert!(text.contains("10.56.3.9 is pod plain/db's"), "{text}");
    assert!(!captured(&db), "{}", db.saved(false));
    assert!(env.probes().is_empty(), "{}", env.probes());

    // web's own netns is accepted; the request's other IPs do not reach the probe set.
    let (code, text) = cmdadd(
        &env,
        &cmdadd_body(&web.path(), "web", "shop", &["10.56.3.5", "10.56.3.77"]),
    )
    .await;
    assert_eq!(
        code, 500,
        "captured, pending for want of a node proxy: {text}"
    );
    assert!(captured(&web));
    let probes = env.probes();
    assert!(
        probes.contains("10.56.3.5 ") && !probes.contains("10.56.3.77"),
        "{probes}"
    );
    agent.stop().await;
}
