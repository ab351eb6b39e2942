//! `main_with_process_env` as a real process: this test binary re-executes itself with
//! `AMBIT_CNI_TEST_AS_PLUGIN=1` to act as the plugin, with CNI variables and stdin set
//! the way a container runtime does. Its own `main` (no libtest, whose lines would reach
//! the plugin's stdout) reports each check in libtest's format (`harness`).

use std::io::{BufReader, Write};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use ambit_cni::api::{self, AgentRequest, AgentResponse};
use serde_json::{json, Value};

const CHILD_MARKER: &str = "AMBIT_CNI_TEST_AS_PLUGIN";

mod harness;

fn main() {
    if std::env::var_os(CHILD_MARKER).is_some() {
        std::process::exit(ambit_cni::entry::main_with_process_env());
    }
    let dir = std::env::temp_dir().join(format!("ambit-cni-process-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let outcome = harness::run(&[
        ("version", &version),
        ("add_with_agent", &|| add_with_agent(&dir)),
        ("add_without_agent", &|| add_without_agent(&dir)),
        ("del_without_agent", &|| del_without_agent(&dir)),
        ("garbage_stdin", &garbage_stdin),
    ]);
    let _ = std::fs::remove_dir_all(&dir);
    outcome.exit();
}

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

fn plugin(command: &str, args: &str, stdin: &[u8]) -> Run {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .env_clear()
        .env(CHILD_MARKER, "1")
        .env("CNI_COMMAND", command)
        .env("CNI_CONTAINERID", "c0ffee")
        .env("CNI_NETNS", "/var/run/netns/cni-1")
        .env("CNI_IFNAME", "eth0")
        .env("CNI_ARGS", args)
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

const ARGS: &str = "K8S_POD_NAMESPACE=shop;K8S_POD_NAME=web-0;K8S_POD_UID=uid-1";

fn prev() -> Value {
    json!({"cniVersion": "1.0.0", "ips": [{"address": "10.1.0.5/24", "interface": 0}],
           "interfaces": [{"name": "eth0", "sandbox": "/var/run/netns/cni-1"}]})
}

fn conf(socket: &Path) -> Vec<u8> {
    serde_json::to_vec(
        &json!({"cniVersion": "1.0.0", "name": "k8s", "type": "ambit-cni",
        "agent_socket": socket, "prevResult": prev()}),
    )
    .unwrap()
}

fn version() {
    let r = plugin("VERSION", "", br#"{"cniVersion":"1.0.0"}"#);
    assert_eq!(r.code, 0);
    let v: Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(
        v["supportedVersions"],
        json!(["0.3.0", "0.3.1", "0.4.0", "1.0.0"])
    );
    assert!(r.stderr.is_empty(), "{}", r.stderr);
}

fn add_with_agent(dir: &Path) {
    let socket: PathBuf = dir.join("agent.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    let server = std::thread::spawn(move || {
        let (s, _) = listener.accept().unwrap();
        let req = api::read_request(&mut BufReader::new(&s)).unwrap();
        api::write_response(&mut &s, &AgentResponse::ok()).unwrap();
        req
    });
    let r = plugin("ADD", ARGS, &conf(&socket));
    assert_eq!(r.code, 0, "{}", r.stdout);
    assert_eq!(serde_json::from_str::<Value>(&r.stdout).unwrap(), prev());
    assert!(r.stderr.is_empty(), "{}", r.stderr);
    match server.join().unwrap() {
        AgentRequest::Add(p) => {
            assert_eq!(p.uid, "uid-1");
            assert_eq!(p.netns, "/var/run/netns/cni-1");
            assert_eq!(p.ips, vec!["10.1.0.5".parse::<std::net::IpAddr>().unwrap()]);
        }
        other => panic!("{other:?}"),
    }
    let _ = std::fs::remove_file(&socket);
}

fn add_without_agent(dir: &Path) {
    let socket = dir.join("nobody.sock");
    let r = plugin("ADD", ARGS, &conf(&socket));
    assert_eq!(r.code, 1);
    let v: Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["code"], 11);
    assert!(
        v["msg"]
            .as_str()
            .unwrap()
            .contains(socket.to_str().unwrap()),
        "{v}"
    );
}

fn del_without_agent(dir: &Path) {
    let r = plugin("DEL", ARGS, &conf(&dir.join("nobody.sock")));
    assert_eq!((r.code, r.stdout.as_str()), (0, ""));
}

fn garbage_stdin() {
    let r = plugin("ADD", ARGS, b"\x00garbage");
    assert_eq!(r.code, 1);
    let v: Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["code"], 6);
    assert!(
        v["msg"]
            .as_str()
            .unwrap()
            .starts_with("stdin is not valid JSON"),
        "{v}"
    );
}
