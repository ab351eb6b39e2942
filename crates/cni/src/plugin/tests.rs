use std::cell::RefCell;
use std::io;

use serde_json::json;

use super::*;

type Answer = Box<dyn Fn(&AgentRequest) -> Result<AgentResponse, AgentCallError>>;

/// A scripted agent that records what it was asked.
struct FakeAgent {
    calls: RefCell<Vec<AgentRequest>>,
    answer: Answer,
}

impl FakeAgent {
    fn new(
        answer: impl Fn(&AgentRequest) -> Result<AgentResponse, AgentCallError> + 'static,
    ) -> Self {
        FakeAgent {
            calls: RefCell::new(Vec::new()),
            answer: Box::new(answer),
        }
    }
    fn ok() -> Self {
        Self::new(|_| Ok(AgentResponse::ok()))
    }
    fn down() -> Self {
        Self::new(|_| {
            Err(AgentCallError::Unreachable(io::Error::new(
                io::ErrorKind::NotFound,
                "No such file or directory (os error 2)",
            )))
        })
    }
    fn calls(&self) -> Vec<AgentRequest> {
        self.calls.borrow().clone()
    }
}

impl Agent for FakeAgent {
    fn call(&self, req: &AgentRequest) -> Result<AgentResponse, AgentCallError> {
        self.calls.borrow_mut().push(req.clone());
        (self.answer)(req)
    }
}

const KUBE_ARGS: &str = "IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME=web-0;\
     K8S_POD_INFRA_CONTAINER_ID=c0ffee;K8S_POD_UID=7d3c-uid;AMBIT_SERVICE_ACCOUNT=web";

fn env(command: &str, args: &str) -> CniEnv {
    CniEnv {
        command: command.into(),
        container_id: "c0ffee".into(),
        netns: "/var/run/netns/cni-1234".into(),
        ifname: "eth0".into(),
        args: args.into(),
        path: "/opt/cni/bin".into(),
    }
}

fn prev_result() -> Value {
    json!({
        "cniVersion": "1.0.0",
        "interfaces": [
            {"name": "cni0", "mac": "aa:bb:cc:dd:ee:ff"},
            {"name": "eth0", "mac": "11:22:33:44:55:66", "sandbox": "/var/run/netns/cni-1234"}
        ],
        "ips": [
            {"address": "10.1.0.5/24", "gateway": "10.1.0.1", "interface": 1},
            {"address": "fd00:10:1::5/64", "gateway": "fd00:10:1::1", "interface": 1}
        ],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dns": {"nameservers": ["10.96.0.10"], "search": ["svc.cluster.local"]}
    })
}

fn conf(extra: Value) -> Vec<u8> {
    let mut c = json!({
        "cniVersion": "1.0.0",
        "name": "k8s-pod-network",
        "type": "ambit-cni",
        "log_level": "debug",
        "runtimeConfig": {"portMappings": []},
        "prevResult": prev_result(),
    });
    if let (Value::Object(c), Value::Object(e)) = (&mut c, extra) {
        for (k, v) in e {
            c.insert(k, v);
        }
    }
    serde_json::to_vec(&c).unwrap()
}

fn stdout_json(o: &Outcome) -> Value {
    serde_json::from_str(&o.stdout).unwrap_or_else(|e| panic!("stdout {:?}: {e}", o.stdout))
}

fn assert_error(o: &Outcome, code: u64, needle: &str) -> Value {
    assert_eq!(o.exit_code, 1, "{o:?}");
    let v = stdout_json(o);
    assert_eq!(v["code"], json!(code), "{v}");
    let msg = v["msg"].as_str().unwrap();
    assert!(msg.contains(needle), "msg {msg:?} lacks {needle:?}");
    assert!(v["cniVersion"].is_string());
    v
}

#[test]
fn version() {
    let o = run(
        &env("VERSION", ""),
        b"{\"cniVersion\":\"1.0.0\"}",
        &FakeAgent::ok(),
    );
    assert_eq!(o.exit_code, 0);
    assert_eq!(
        o.stdout,
        r#"{"cniVersion":"1.0.0","supportedVersions":["0.3.0","0.3.1","0.4.0","1.0.0"]}"#
    );
    // Stdin is irrelevant for VERSION.
    let o = run(&env("VERSION", ""), b"garbage", &FakeAgent::ok());
    assert_eq!(o.exit_code, 0);
}

#[test]
fn add_enrolls_and_passes_prev_result_through() {
    let agent = FakeAgent::ok();
    let o = run(&env("ADD", KUBE_ARGS), &conf(json!({})), &agent);
    assert_eq!(o.exit_code, 0, "{o:?}");
    assert_eq!(stdout_json(&o), prev_result());
    assert_eq!(
        agent.calls(),
        vec![AgentRequest::Add(PodInfo {
            uid: "7d3c-uid".into(),
            name: "web-0".into(),
            namespace: "shop".into(),
            service_account: "web".into(),
            netns: "/var/run/netns/cni-1234".into(),
            ips: vec!["10.1.0.5".parse().unwrap(), "fd00:10:1::5".parse().unwrap()],
            container_id: "c0ffee".into(),
        })]
    );
}

#[test]
fn add_defaults_uid_and_service_account() {
    let agent = FakeAgent::ok();
    let o = run(
        &env("ADD", "K8S_POD_NAMESPACE=shop;K8S_POD_NAME=web-0"),
        &conf(json!({})),
        &agent,
    );
    assert_eq!(o.exit_code, 0, "{o:?}");
    match &agent.calls()[..] {
        [AgentRequest::Add(p)] => {
            assert_eq!(p.uid, "c0ffee");
            assert_eq!(p.service_account, "default");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn add_converts_legacy_results() {
    // A 0.3.1 chain: the per-IP "version" field, no top-level change needed.
    let prev = json!({
        "cniVersion": "0.3.1",
        "interfaces": [{"name": "eth0", "sandbox": "/var/run/netns/x"}],
        "ips": [
            {"version": "4", "address": "10.2.0.7/16", "gateway": "10.2.0.1", "interface": 0},
            {"version": "6", "address": "::ffff:10.2.0.8/120", "interface": 0},
            {"version": "4", "address": "10.2.0.7/16", "interface": 0}
        ]
    });
    let stdin = serde_json::to_vec(&json!({
        "cniVersion": "0.3.1", "name": "n", "type": "ambit-cni", "prevResult": prev.clone()
    }))
    .unwrap();
    let agent = FakeAgent::ok();
    let o = run(&env("ADD", KUBE_ARGS), &stdin, &agent);
    assert_eq!(o.exit_code, 0, "{o:?}");
    assert_eq!(stdout_json(&o), prev);
    match &agent.calls()[..] {
        [AgentRequest::Add(p)] => assert_eq!(
            p.ips,
            vec![
                "10.2.0.7".parse::<IpAddr>().unwrap(),
                "10.2.0.8".parse().unwrap()
            ]
        ),
        other => panic!("{other:?}"),
    }

    // prevResult in another version than the config: cniVersion follows the config.
    let mut prev10 = prev_result();
    let stdin = serde_json::to_vec(&json!({
        "cniVersion": "0.4.0", "name": "n", "type": "ambit-cni", "prevResult": prev10.clone()
    }))
    .unwrap();
    let o = run(&env("ADD", KUBE_ARGS), &stdin, &FakeAgent::ok());
    assert_eq!(o.exit_code, 0, "{o:?}");
    prev10["cniVersion"] = json!("0.4.0");
    prev10["ips"][0]["version"] = json!("4");
    prev10["ips"][1]["version"] = json!("6");
    assert_eq!(stdout_json(&o), prev10);

    // 0.4.0 result under a 1.0.0 config: "version" dropped.
    let stdin = conf(json!({"prevResult": prev10}));
    let o = run(&env("ADD", KUBE_ARGS), &stdin, &FakeAgent::ok());
    assert_eq!(stdout_json(&o), prev_result());
}

#[test]
fn add_not_enrolled_passes_through_without_agent() {
    let cases = [
        // excluded namespace (default list)
        "K8S_POD_NAMESPACE=kube-system;K8S_POD_NAME=coredns-1;K8S_POD_UID=u",
        // opt-outs
        "K8S_POD_NAMESPACE=shop;K8S_POD_NAME=web-0;AMBIT_EXCLUDE=true",
        "K8S_POD_NAMESPACE=shop;K8S_POD_NAME=web-0;AMBIT_EXCLUDE=TRUE",
        "K8S_POD_NAMESPACE=shop;K8S_POD_NAME=web-0;ISTIO_DATAPLANE_MODE=none",
        // not Kubernetes
        "",
        "K8S_POD_NAME=web-0",
        "K8S_POD_NAMESPACE=shop;K8S_POD_NAME=",
        "IgnoreUnknown=1",
    ];
    for args in cases {
        let agent = FakeAgent::down();
        let o = run(&env("ADD", args), &conf(json!({})), &agent);
        assert_eq!(o.exit_code, 0, "{args}: {o:?}");
        assert_eq!(stdout_json(&o), prev_result(), "{args}");
        assert!(agent.calls().is_empty(), "{args}");
    }
    // A configured exclude list replaces the default one.
    let agent = FakeAgent::ok();
    let stdin = conf(json!({"exclude_namespaces": ["shop"]}));
    let o = run(&env("ADD", KUBE_ARGS), &stdin, &agent);
    assert_eq!(o.exit_code, 0);
    assert!(agent.calls().is_empty());
    let o = run(
        &env("ADD", "K8S_POD_NAMESPACE=kube-system;K8S_POD_NAME=x"),
        &stdin,
        &agent,
    );
    assert_eq!(o.exit_code, 0);
    assert_eq!(agent.calls().len(), 1);
    // AMBIT_EXCLUDE=false does not opt out.
    let agent = FakeAgent::ok();
    let o = run(
        &env("ADD", &format!("{KUBE_ARGS};AMBIT_EXCLUDE=false")),
        &conf(json!({})),
        &agent,
    );
    assert_eq!(o.exit_code, 0);
    assert_eq!(agent.calls().len(), 1);
}

#[test]
fn add_agent_unreachable_is_try_again_later() {
    let o = run(
        &env("ADD", KUBE_ARGS),
        &conf(json!({"agent_socket": "/run/test/agent.sock"})),
        &FakeAgent::down(),
    );
    let v = assert_error(&o, 11, "/run/test/agent.sock");
    let msg = v["msg"].as_str().unwrap();
    assert!(msg.contains("shop/web-0"), "{msg}");
    assert!(msg.contains("No such file"), "{msg}");
    assert_eq!(v["cniVersion"], "1.0.0");

    // Default socket named when none is configured; timeouts are transient too.
    let agent = FakeAgent::new(|_| {
        Err(AgentCallError::Timeout {
            after: Duration::from_secs(5),
            stage: "waiting for the answer",
        })
    });
    let o = run(&env("ADD", KUBE_ARGS), &conf(json!({})), &agent);
    assert_error(&o, 11, DEFAULT_AGENT_SOCKET);
}

#[test]
fn add_agent_rejection_carries_its_message() {
    let agent = FakeAgent::new(|_| {
        Err(AgentCallError::Rejected(
            "cannot enter netns /var/run/netns/cni-1234: no such file".into(),
        ))
    });
    let o = run(&env("ADD", KUBE_ARGS), &conf(json!({})), &agent);
    assert_error(&o, 100, "cannot enter netns /var/run/netns/cni-1234");

    let agent = FakeAgent::new(|_| Err(AgentCallError::Protocol("expected value".into())));
    let o = run(&env("ADD", KUBE_ARGS), &conf(json!({})), &agent);
    assert_error(&o, 101, "expected value");
}

#[test]
fn add_requires_chaining_and_env() {
    let mut c: Value = serde_json::from_slice(&conf(json!({}))).unwrap();
    c.as_object_mut().unwrap().remove("prevResult");
    let stdin = serde_json::to_vec(&c).unwrap();
    let agent = FakeAgent::ok();
    let o = run(&env("ADD", KUBE_ARGS), &stdin, &agent);
    assert_error(
        &o,
        7,
        "ambit-cni must be chained after a plugin that assigns IPs",
    );
    assert!(agent.calls().is_empty());

    let mut e = env("ADD", KUBE_ARGS);
    e.netns.clear();
    let o = run(&e, &conf(json!({})), &agent);
    let v = assert_error(&o, 4, "CNI_NETNS");
    assert!(!v["msg"].as_str().unwrap().contains("CNI_IFNAME"));
    e.ifname.clear();
    e.container_id.clear();
    let o = run(&e, &conf(json!({})), &agent);
    assert_error(&o, 4, "CNI_CONTAINERID, CNI_NETNS, CNI_IFNAME");
    assert!(agent.calls().is_empty());
}

#[test]
fn bad_configs_are_explained() {
    let agent = FakeAgent::ok();
    let e = env("ADD", KUBE_ARGS);
    let o = run(&e, b"", &agent);
    assert_error(&o, 6, "stdin is empty");
    let o = run(&e, b"garbage", &agent);
    let v = assert_error(
        &o,
        6,
        "stdin is not valid JSON: expected value at line 1 column 1",
    );
    assert_eq!(v["cniVersion"], "1.0.0");
    let o = run(&e, b"[1,2]", &agent);
    assert_error(&o, 6, "must be a JSON object");
    let o = run(&e, br#"{"name":"n","type":"ambit-cni"}"#, &agent);
    assert_error(&o, 7, "no \"cniVersion\"");
    let o = run(&e, br#"{"cniVersion":1}"#, &agent);
    assert_error(&o, 7, "\"cniVersion\" must be a string");
    let o = run(&e, br#"{"cniVersion":"0.2.0"}"#, &agent);
    assert_error(&o, 1, "incompatible CNI version \"0.2.0\"");
    let o = run(
        &e,
        &conf(json!({"exclude_namespaces": "kube-system"})),
        &agent,
    );
    assert_error(&o, 7, "exclude_namespaces");
    let o = run(&e, &conf(json!({"exclude_namespaces": ["a", 3]})), &agent);
    assert_error(&o, 7, "\"exclude_namespaces\"[1]");
    let o = run(&e, &conf(json!({"agent_socket": 5})), &agent);
    assert_error(&o, 7, "agent_socket");
    let o = run(&e, &conf(json!({"prevResult": [1]})), &agent);
    assert_error(&o, 7, "prevResult");
    let o = run(
        &e,
        &conf(json!({"prevResult": {"cniVersion":"1.0.0","ips":[{"address":"bogus/24"}]}})),
        &agent,
    );
    assert_error(&o, 7, "prevResult.ips[0].address \"bogus/24\"");
    assert!(agent.calls().is_empty());
    // Errors echo a supported config version.
    let mut c: Value = serde_json::from_slice(&conf(json!({"agent_socket": 5}))).unwrap();
    c["cniVersion"] = json!("0.4.0");
    let o = run(&e, &serde_json::to_vec(&c).unwrap(), &agent);
    assert_eq!(stdout_json(&o)["cniVersion"], "0.4.0");
}

#[test]
fn unknown_or_missing_command() {
    let o = run(&env("FROB", ""), &conf(json!({})), &FakeAgent::ok());
    assert_error(&o, 4, "unsupported CNI_COMMAND \"FROB\"");
    let o = run(&env("", ""), &conf(json!({})), &FakeAgent::ok());
    assert_error(&o, 4, "CNI_COMMAND is not set");
}

#[test]
fn del_never_fails() {
    // Agent down, netns gone, garbage config: still success, nothing printed.
    for (stdin, args) in [
        (conf(json!({})), KUBE_ARGS),
        (b"not json".to_vec(), KUBE_ARGS),
        (Vec::new(), ""),
    ] {
        let mut e = env("DEL", args);
        e.netns.clear();
        let agent = FakeAgent::down();
        let o = run(&e, &stdin, &agent);
        assert_eq!(
            o,
            Outcome {
                stdout: String::new(),
                exit_code: 0
            }
        );
    }
    // Remove is sent, best effort, with the pod uid; unknown pods are fine.
    let agent = FakeAgent::new(|_| Err(AgentCallError::Rejected("unknown pod".into())));
    let o = run(&env("DEL", KUBE_ARGS), &conf(json!({})), &agent);
    assert_eq!(o.exit_code, 0);
    assert_eq!(
        agent.calls(),
        vec![AgentRequest::Remove {
            uid: "7d3c-uid".into()
        }]
    );
    // Non-kube: nothing to tell the agent.
    let agent = FakeAgent::ok();
    let o = run(&env("DEL", ""), &conf(json!({})), &agent);
    assert_eq!(o.exit_code, 0);
    assert!(agent.calls().is_empty());
}

#[test]
fn check() {
    let ok = Outcome {
        stdout: String::new(),
        exit_code: 0,
    };
    // Enrolled.
    let agent = FakeAgent::ok();
    assert_eq!(run(&env("CHECK", KUBE_ARGS), &conf(json!({})), &agent), ok);
    assert_eq!(
        agent.calls(),
        vec![AgentRequest::Check {
            uid: "7d3c-uid".into()
        }]
    );
    // Not enrolled.
    let agent = FakeAgent::new(|_| Err(AgentCallError::Rejected("unknown uid 7d3c-uid".into())));
    let o = run(&env("CHECK", KUBE_ARGS), &conf(json!({})), &agent);
    let v = assert_error(&o, 100, "is not enrolled");
    assert!(v["msg"].as_str().unwrap().contains("unknown uid 7d3c-uid"));
    // Agent down.
    let o = run(
        &env("CHECK", KUBE_ARGS),
        &conf(json!({})),
        &FakeAgent::down(),
    );
    assert_error(&o, 11, DEFAULT_AGENT_SOCKET);
    // Excluded / opted-out / non-kube: fine without asking.
    for args in [
        "K8S_POD_NAMESPACE=kube-system;K8S_POD_NAME=x",
        "K8S_POD_NAMESPACE=shop;K8S_POD_NAME=x;ISTIO_DATAPLANE_MODE=NONE",
        "",
    ] {
        let agent = FakeAgent::down();
        assert_eq!(run(&env("CHECK", args), &conf(json!({})), &agent), ok);
        assert!(agent.calls().is_empty());
    }
    // CHECK does not exist before 0.4.0.
    let mut c: Value = serde_json::from_slice(&conf(json!({}))).unwrap();
    c["cniVersion"] = json!("0.3.1");
    let o = run(
        &env("CHECK", KUBE_ARGS),
        &serde_json::to_vec(&c).unwrap(),
        &FakeAgent::ok(),
    );
    assert_error(&o, 1, "0.4.0");
}

#[test]
fn cni_args_parsing() {
    let p = parse_args(
        "K8S_POD_NAMESPACE=a;;junk;K8S_POD_NAME=b=c;K8S_POD_UID=;X=Y;K8S_POD_NAMESPACE=z",
    );
    assert_eq!(
        p,
        PodArgs {
            namespace: "z".into(),
            name: "b=c".into(),
            uid: String::new(),
            service_account: String::new(),
            opt_out: false,
        }
    );
    assert!(parse_args("AMBIT_EXCLUDE=1").opt_out);
    assert!(!parse_args("AMBIT_EXCLUDE=no").opt_out);
    assert!(!parse_args("ISTIO_DATAPLANE_MODE=ambient").opt_out);
}

#[test]
fn agent_socket_from_config() {
    assert_eq!(
        agent_socket_of(&conf(json!({"agent_socket": "/tmp/a.sock"}))),
        PathBuf::from("/tmp/a.sock")
    );
    assert_eq!(
        agent_socket_of(b"junk"),
        PathBuf::from(DEFAULT_AGENT_SOCKET)
    );
    assert_eq!(
        agent_socket_of(&conf(json!({"agent_socket": ""}))),
        PathBuf::from(DEFAULT_AGENT_SOCKET)
    );
}

/// End to end through a real socket: the plugin's ADD reaches a std-thread agent.
#[test]
fn add_through_socket_agent() {
    use std::os::unix::net::UnixListener;
    let dir = std::env::temp_dir().join(format!("ambit-cni-plugin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("agent.sock");
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path).unwrap();
    let server = std::thread::spawn(move || {
        let (s, _) = listener.accept().unwrap();
        let req = api::read_request(&mut std::io::BufReader::new(&s)).unwrap();
        api::write_response(&mut &s, &AgentResponse::ok()).unwrap();
        req
    });
    let stdin = conf(json!({"agent_socket": path.to_str().unwrap()}));
    let agent = SocketAgent::new(agent_socket_of(&stdin));
    let o = run(&env("ADD", KUBE_ARGS), &stdin, &agent);
    assert_eq!(o.exit_code, 0, "{o:?}");
    assert_eq!(stdout_json(&o), prev_result());
    match server.join().unwrap() {
        AgentRequest::Add(p) => assert_eq!(p.uid, "7d3c-uid"),
        other => panic!("{other:?}"),
    }
    // Now nobody listens: try again later.
    drop(std::fs::remove_file(&path));
    let o = run(&env("ADD", KUBE_ARGS), &stdin, &agent);
    assert_error(&o, 11, path.to_str().unwrap());
    let _ = std::fs::remove_dir_all(&dir);
}

// ---------------------------------------------------------------------------------
// Deterministic fuzzing: run() must never panic and must always speak CNI.

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }
}

fn random_args(rng: &mut Rng) -> String {
    const KEYS: &[&str] = &[
        "K8S_POD_NAMESPACE",
        "K8S_POD_NAME",
        "K8S_POD_UID",
        "AMBIT_SERVICE_ACCOUNT",
        "AMBIT_EXCLUDE",
        "ISTIO_DATAPLANE_MODE",
        "IgnoreUnknown",
        "",
        "K8S",
        "é=",
    ];
    const VALUES: &[&str] = &[
        "",
        "shop",
        "kube-system",
        "web-0",
        "true",
        "none",
        "=",
        ";",
        "\u{0}",
        "ü🙂",
        " x ",
        "a=b=c",
    ];
    let mut s = String::new();
    for _ in 0..rng.below(8) {
        match rng.below(6) {
            0 => s.push(';'),
            1 => s.push_str(rng.pick(KEYS)),
            2 => {
                // raw random chars
                for _ in 0..rng.below(6) {
                    s.push(char::from_u32(rng.below(0x250) as u32).unwrap_or('?'));
                }
            }
            _ => {
                s.push_str(rng.pick(KEYS));
                s.push('=');
                s.push_str(rng.pick(VALUES));
                s.push(';');
            }
        }
    }
    s
}

fn mutate(rng: &mut Rng, mut b: Vec<u8>) -> Vec<u8> {
    const TOKENS: &[&[u8]] = &[
        b"{",
        b"}",
        b"[",
        b"]",
        b"\"",
        b":",
        b",",
        b"null",
        b"1e999",
        b"-0",
        b"\\u0000",
        b"\"ips\":",
        b"\"address\":\"::ffff:1.2.3.4/200\"",
        b"\"prevResult\":",
        b"\"cniVersion\":\"0.3.1\"",
        b"\xff\xfe",
    ];
    for _ in 0..1 + rng.below(6) {
        if b.is_empty() {
            b.push(b'{');
        }
        let i = rng.below(b.len());
        match rng.below(4) {
            0 => b[i] = rng.next() as u8,
            1 => {
                let end = (i + rng.below(16)).min(b.len());
                b.drain(i..end);
            }
            2 => {
                let t = rng.pick(TOKENS);
                b.splice(i..i, t.iter().copied());
            }
            _ => b.truncate(i),
        }
    }
    b
}

/// Structured but type-confused configs that parse as JSON.
fn random_json(rng: &mut Rng, depth: u32) -> Value {
    match rng.below(if depth > 3 { 5 } else { 8 }) {
        0 => Value::Null,
        1 => json!(rng.below(2) == 0),
        2 => json!(rng.next() as i64),
        3 => json!(rng.pick(&["1.0.0", "0.3.1", "10.1.0.5/24", "fd00::1/64", "", "x"])),
        4 => json!(rng.next() as f64 / 7.0),
        5 => Value::Array(
            (0..rng.below(4))
                .map(|_| random_json(rng, depth + 1))
                .collect(),
        ),
        _ => {
            let keys = [
                "cniVersion",
                "prevResult",
                "ips",
                "address",
                "version",
                "agent_socket",
                "exclude_namespaces",
                "name",
                "interfaces",
            ];
            let mut m = Map::new();
            for _ in 0..rng.below(5) {
                m.insert(rng.pick(&keys).to_string(), random_json(rng, depth + 1));
            }
            Value::Object(m)
        }
    }
}

#[test]
fn fuzz_run_never_panics_and_speaks_cni() {
    let mut rng = Rng(0x0123_4567_89ab_cdef);
    let seeds: Vec<Vec<u8>> = vec![
        conf(json!({})),
        conf(json!({"exclude_namespaces": ["shop"], "agent_socket": "/x"})),
        serde_json::to_vec(&json!({
            "cniVersion": "0.3.1",
            "prevResult": {"cniVersion": "0.3.1", "ips": [{"version": "4", "address": "10.0.0.1/8"}]}
        }))
        .unwrap(),
    ];
    let commands = ["ADD", "DEL", "CHECK", "VERSION", "", "GC", "add", "ADD\0"];
    for i in 0..6000 {
        let stdin = match rng.below(4) {
            0 => (0..rng.below(64)).map(|_| rng.next() as u8).collect(),
            1 => {
                let mut v = random_json(&mut rng, 0);
                if let Value::Object(m) = &mut v {
                    if rng.below(2) == 0 {
                        m.insert("cniVersion".into(), json!("1.0.0"));
                    }
                }
                serde_json::to_vec(&v).unwrap()
            }
            _ => {
                let seed = seeds[rng.below(seeds.len())].clone();
                mutate(&mut rng, seed)
            }
        };
        let mut e = env(rng.pick(&commands), &random_args(&mut rng));
        if rng.below(4) == 0 {
            e.netns.clear();
        }
        if rng.below(8) == 0 {
            e.container_id.clear();
        }
        let mode = rng.below(4);
        let agent = FakeAgent::new(move |_| match mode {
            0 => Ok(AgentResponse::ok()),
            1 => Err(AgentCallError::Rejected("no".into())),
            2 => Err(AgentCallError::Protocol("bad".into())),
            _ => Err(AgentCallError::Unreachable(io::Error::other("down"))),
        });
        let o = run(&e, &stdin, &agent);
        match o.exit_code {
            0 => {
                if !o.stdout.is_empty() {
                    let v = stdout_json(&o);
                    assert!(v["cniVersion"].is_string(), "case {i}: {v}");
                }
            }
            1 => {
                let v = stdout_json(&o);
                assert!(v["code"].is_u64(), "case {i}: {v}");
                assert!(!v["msg"].as_str().unwrap_or("").is_empty(), "case {i}: {v}");
            }
            other => panic!("case {i}: exit code {other}"),
        }
        if e.command == "DEL" {
            assert_eq!(o.exit_code, 0, "case {i}: DEL failed");
            assert!(o.stdout.is_empty());
        }
        if e.command == "ADD" && o.exit_code == 0 && !o.stdout.is_empty() {
            // A successful ADD prints an object with the config's version.
            assert!(stdout_json(&o).is_object());
        }
    }
}
