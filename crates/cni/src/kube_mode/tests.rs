use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;

use ambit_k8s::k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::json;

use super::*;

#[derive(Default)]
struct FakeCluster {
    pods: BTreeMap<(String, String), Pod>,
    namespaces: BTreeMap<String, Namespace>,
    /// Fail this many lookups first.
    failures: Cell<u32>,
    calls: Cell<u32>,
}

impl Cluster for &FakeCluster {
    fn pod(&self, namespace: &str, name: &str) -> Result<Pod, String> {
        self.calls.set(self.calls.get() + 1);
        if self.failures.get() > 0 {
            self.failures.set(self.failures.get() - 1);
            return Err("connection refused".into());
        }
        self.pods
            .get(&(namespace.into(), name.into()))
            .cloned()
            .ok_or_else(|| "404 pod not found".into())
    }
    fn namespace(&self, name: &str) -> Result<Namespace, String> {
        self.namespaces
            .get(name)
            .cloned()
            .ok_or_else(|| "404 namespace not found".into())
    }
}

struct FakeAgent {
    seen: RefCell<Vec<CmdAddRequest>>,
    refuse: Option<String>,
}

impl AgentLink for &FakeAgent {
    fn cmd_add(&self, req: &CmdAddRequest) -> Result<(), CmdAddError> {
        self.seen.borrow_mut().push(req.clone());
        match &self.refuse {
            None => Ok(()),
            Some(body) => Err(CmdAddError::Refused {
                socket: "/s".into(),
                status: 500,
                body: body.clone(),
            }),
        }
    }
}

fn meta(ns: Option<&str>, name: &str, labels: &[(&str, &str)]) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: ns.map(str::to_owned),
        labels: Some(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ),
        ..Default::default()
    }
}

fn cluster() -> FakeCluster {
    let mut c = FakeCluster::default();
    let pod = |ns: &str, name: &str, l: &[(&str, &str)]| Pod {
        metadata: meta(Some(ns), name, l),
        ..Default::default()
    };
    for (ns, name, l) in [
        ("shop", "web-0", &[][..]),
        ("plain", "app-0", &[][..]),
        (
            "plain",
            "tagged-0",
            &[("istio.io/dataplane-mode", "ambient")][..],
        ),
        (
            "shop",
            "opted-out",
            &[("istio.io/dataplane-mode", "none")][..],
        ),
    ] {
        c.pods.insert((ns.into(), name.into()), pod(ns, name, l));
    }
    c.namespaces.insert(
        "shop".into(),
        Namespace {
            metadata: meta(None, "shop", &[("istio.io/dataplane-mode", "ambient")]),
            ..Default::default()
        },
    );
    c.namespaces.insert(
        "plain".into(),
        Namespace {
            metadata: meta(None, "plain", &[]),
            ..Default::default()
        },
    );
    c
}

fn conf(extra: Value) -> Vec<u8> {
    let mut v = json!({
        "cniVersion": "1.0.0", "name": "istio-cni", "type": "istio-cni",
        "cni_agent_run_dir": "/run/x", "ambient_enabled": true,
        "enablement_selectors": [
            {"podSelector": {"matchLabels": {"istio.io/dataplane-mode": "ambient"}}},
            {"podSelector": {"matchExpressions": [{"key": "istio.io/dataplane-mode", "operator": "NotIn", "values": ["none"]}]},
             "namespaceSelector": {"matchLabels": {"istio.io/dataplane-mode": "ambient"}}}],
        "exclude_namespaces": ["kube-system"], "pod_namespace": "istio-system",
        "prevResult": {"cniVersion": "1.0.0", "ips": [{"address": "10.1.0.5/24", "interface": 0}]},
    });
    for (k, x) in extra.as_object().unwrap() {
        v[k] = x.clone();
    }
    serde_json::to_vec(&v).unwrap()
}

fn env(command: &str, ns: &str, name: &str) -> CniEnv {
    CniEnv {
        command: command.into(),
        container_id: "c1".into(),
        netns: "/var/run/netns/cni-1".into(),
        ifname: "eth0".into(),
        args: format!("K8S_POD_NAMESPACE={ns};K8S_POD_NAME={name}"),
        path: "/opt/cni/bin".into(),
    }
}

struct Run {
    out: Outcome,
    clients: u32,
    lookups: u32,
    agent: Vec<CmdAddRequest>,
    pauses: u32,
}

fn go(c: &FakeCluster, refuse: Option<&str>, e: CniEnv, stdin: &[u8]) -> Run {
    let agent = FakeAgent {
        seen: RefCell::new(Vec::new()),
        refuse: refuse.map(str::to_owned),
    };
    let clients = Cell::new(0);
    let pauses = Cell::new(0);
    let out = run(
        &e,
        stdin,
        &|_| {
            clients.set(clients.get() + 1);
            Ok(Box::new(c) as Box<dyn Cluster + '_>)
        },
        &|_| Box::new(&agent) as Box<dyn AgentLink + '_>,
        &|| pauses.set(pauses.get() + 1),
    );
    Run {
        out,
        clients: clients.get(),
        lookups: c.calls.get(),
        agent: agent.seen.into_inner(),
        pauses: pauses.get(),
    }
}

fn prev() -> Value {
    json!({"cniVersion": "1.0.0", "ips": [{"address": "10.1.0.5/24", "interface": 0}]})
}

#[test]
fn who_is_asked_about_which_pod() {
    // (what, namespace, name, extra config, API used, agent called)
    let cases: Vec<(&str, &str, &str, Value, bool, bool)> = vec![
        ("ambient namespace", "shop", "web-0", json!({}), true, true),
        ("pod label", "plain", "tagged-0", json!({}), true, true),
        ("not selected", "plain", "app-0", json!({}), true, false),
        ("opted out", "shop", "opted-out", json!({}), true, false),
        (
            "the agent's own pod",
            "istio-system",
            "istio-cni-node-x7",
            json!({}),
            false,
            false,
        ),
        (
            "excluded namespace",
            "kube-system",
            "coredns-1",
            json!({}),
            false,
            false,
        ),
        ("not a kube pod", "", "", json!({}), false, false),
        (
            "ambient disabled",
            "shop",
            "web-0",
            json!({"ambient_enabled": false}),
            false,
            false,
        ),
    ];
    for (what, ns, name, extra, api, called) in cases {
        let c = cluster();
        let r = go(&c, None, env("ADD", ns, name), &conf(extra));
        assert_eq!(r.out.exit_code, 0, "{what}: {}", r.out.stdout);
        assert_eq!(
            serde_json::from_str::<Value>(&r.out.stdout).unwrap(),
            prev(),
            "{what}"
        );
        assert_eq!(r.clients > 0, api, "{what}: client built");
        assert_eq!(r.lookups > 0, api, "{what}: API asked");
        assert_eq!(!r.agent.is_empty(), called, "{what}: agent called");
    }
}

#[test]
fn an_ambient_pod_is_announced_with_its_ips_and_netns() {
    let c = cluster();
    let r = go(&c, None, env("ADD", "shop", "web-0"), &conf(json!({})));
    assert_eq!(r.agent.len(), 1);
    let req = &r.agent[0];
    assert_eq!(req.netns, "/var/run/netns/cni-1");
    assert_eq!(
        (req.pod_namespace.as_str(), req.pod_name.as_str()),
        ("shop", "web-0")
    );
    assert_eq!(req.ips[0].address.ip, "10.1.0.5");
    assert_eq!(req.ips[0].interface, Some(0));
}

#[test]
fn failures_fail_closed() {
    // The agent refuses: the CNI error carries its text.
    let c = cluster();
    let r = go(
        &c,
        Some("no ztunnel connection"),
        env("ADD", "shop", "web-0"),
        &conf(json!({})),
    );
    assert_eq!(r.out.exit_code, 1);
    let v: Value = serde_json::from_str(&r.out.stdout).unwrap();
    assert_eq!(v["code"], codes::AGENT_REFUSED);
    assert!(
        v["msg"].as_str().unwrap().contains("no ztunnel connection"),
        "{v}"
    );

    // The API fails once: the retry succeeds.
    let c = cluster();
    c.failures.set(1);
    let r = go(&c, None, env("ADD", "shop", "web-0"), &conf(json!({})));
    assert_eq!(r.out.exit_code, 0, "{}", r.out.stdout);
    assert_eq!((r.lookups, r.pauses), (2, 1));

    // The API keeps failing: one retry by default, then a CNI error (Istio would let the
    // pod start uncaptured here).
    let c = cluster();
    c.failures.set(100);
    let r = go(&c, None, env("ADD", "shop", "web-0"), &conf(json!({})));
    assert_eq!(r.out.exit_code, 1);
    assert_eq!((r.lookups, r.pauses), (2, 1));
    let v: Value = serde_json::from_str(&r.out.stdout).unwrap();
    assert_eq!(v["code"], codes::TRY_AGAIN_LATER);
    assert!(
        v["msg"].as_str().unwrap().contains("connection refused"),
        "{v}"
    );
    assert!(r.agent.is_empty());

    // With enable_ambient_detection_retry: 30 retries.
    let c = cluster();
    c.failures.set(100);
    let r = go(
        &c,
        None,
        env("ADD", "shop", "web-0"),
        &conf(json!({"enable_ambient_detection_retry": true})),
    );
    assert_eq!((r.out.exit_code, r.lookups, r.pauses), (1, 31, 30));

    // A pod the API does not know (yet): error too.
    let c = cluster();
    let r = go(&c, None, env("ADD", "shop", "ghost"), &conf(json!({})));
    assert_eq!(r.out.exit_code, 1);
    assert!(r.out.stdout.contains("404"), "{}", r.out.stdout);
}

#[test]
fn del_and_check_do_nothing_and_bad_configs_are_named() {
    let c = cluster();
    for cmd in ["DEL", "CHECK"] {
        let r = go(&c, None, env(cmd, "shop", "web-0"), &conf(json!({})));
        assert_eq!((r.out.exit_code, r.out.stdout.as_str()), (0, ""), "{cmd}");
        assert_eq!((r.clients, r.agent.len()), (0, 0), "{cmd}");
    }
    for (extra, key) in [
        (json!({"ambient_enabled": "yes"}), "ambient_enabled"),
        (json!({"exclude_namespaces": [1]}), "exclude_namespaces"),
        (
            json!({"enablement_selectors": [{"podSelectr": {}}]}),
            "enablement_selectors",
        ),
        (json!({"pod_namespace": 3}), "pod_namespace"),
    ] {
        let r = go(&c, None, env("ADD", "shop", "web-0"), &conf(extra));
        assert_eq!(r.out.exit_code, 1);
        assert!(r.out.stdout.contains(key), "{}", r.out.stdout);
    }
    // No prevResult: an empty result of the config's version.
    let mut v: Value = serde_json::from_slice(&conf(json!({}))).unwrap();
    v.as_object_mut().unwrap().remove("prevResult");
    let r = go(
        &c,
        None,
        env("ADD", "kube-system", "x"),
        &serde_json::to_vec(&v).unwrap(),
    );
    assert_eq!(r.out.stdout, r#"{"cniVersion":"1.0.0"}"#);
}

#[test]
fn the_mode_is_chosen_by_istios_keys() {
    assert!(is_istio_conf(&conf(json!({}))));
    assert!(is_istio_conf(br#"{"type":"istio-cni"}"#));
    assert!(is_istio_conf(br#"{"type":"x","cni_agent_run_dir":"/r"}"#));
    assert!(!is_istio_conf(
        br#"{"type":"ambit-cni","agent_socket":"/s"}"#
    ));
    assert!(!is_istio_conf(b"garbage"));
}
