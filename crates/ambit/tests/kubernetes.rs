//! ambit on "Kubernetes", as root: the test API server (crates/testing/fake-apiserver) on the first node,
//! the node agents in Kubernetes mode watching it, pods created as the kubelet creates them
//! (the API object first, then the sandbox through a real CNI chain ending with the
//! `istio-cni` plugin in Kubernetes mode, then the pod's IP and phase), ambit's node proxies
//! in shared mode.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::path::Path;
use std::time::Duration;

use ambit_netns_lab::cluster::{counted_packets, rules_kept, Cluster, ClusterSpec, PodSpec};
use ambit_netns_lab::kube::REDIRECTION;
use ambit_netns_lab::mesh::EchoMode;
use ambit_netns_lab::peer::NodeProxy;
use ambit_netns_lab::{http_get, wait_until};

const APP_PORT: u16 = 8080;
const WAIT: Duration = Duration::from_secs(20);

fn ambit() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_ambit"))
}

/// "hello" from `from` to `to`'s app and the doubled echo back.
fn exchange(cluster: &Cluster, from: &str, to: &str) -> anyhow::Result<()> {
    let dst = SocketAddr::from((cluster.pod(to).ip, APP_PORT));
    let mut conn = cluster.connect_from(from, dst)?;
    conn.write_all(b"hello")?;
    conn.shutdown(Shutdown::Write)?;
    let mut back = Vec::new();
    conn.read_to_end(&mut back)?;
    anyhow::ensure!(back == b"hellohello", "{from} -> {to}: got {back:?}");
    Ok(())
}

fn wait_redirection(cluster: &Cluster, pod: &str, want: Option<&str>) {
    let kube = cluster.kube();
    wait_until(
        &format!("{pod}'s {REDIRECTION} to be {want:?}"),
        WAIT,
        || kube.redirection(pod).as_deref() == want,
    )
    .unwrap_or_else(|e| {
        panic!(
            "{e:#}: it is {:?}; agent logs:\n{}",
            kube.redirection(pod),
            agent_logs(cluster)
        )
    });
}

fn agent_logs(cluster: &Cluster) -> String {
    cluster
        .nodes
        .iter()
        .filter_map(|n| n.agent.as_ref())
        .map(|p| std::fs::read_to_string(&p.log).unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n----\n")
}

fn captured(cluster: &Cluster, pod: &str) -> bool {
    cluster
        .iptables_save(pod)
        .unwrap()
        .contains("-A OUTPUT -j ISTIO_OUTPUT")
}

/// The value of the sample `name` (labels included, as exposed) in a metrics text.
fn sample(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Waits until `node`'s agent has counted at least `n` pod watch events of `kind`
/// (`nodeagent_reconcile_events_total{type}`) and finished acting on all of them: one
/// scrape shows them and no pod pending. The agent counts an event only once its pod is
/// queued and renders the pending gauge after the counters, so that scrape comes after the
/// reconcile of the event's pod ended.
fn settled(cluster: &Cluster, node: usize, kind: &str, n: u64) {
    let events = format!("nodeagent_reconcile_events_total{{type=\"{kind}\"}}");
    let mut last = String::new();
    wait_until(
        &format!("node {node}'s agent to act on {n} {kind} event(s)"),
        WAIT,
        || {
            last = http_get(
                &cluster.nodes[node].ns,
                "127.0.0.1:15014".parse().unwrap(),
                "/metrics",
            )
            .map(|(_, m)| m)
            .unwrap_or_default();
            sample(&last, &events).unwrap_or(0) >= n
                && sample(&last, "ambit_agent_reconcile_pending_pods") == Some(0)
        },
    )
    .unwrap_or_else(|e| {
        panic!(
            "{e:#}; its metrics:\n{last}\nagent logs:\n{}",
            agent_logs(cluster)
        )
    });
}

fn patches(cluster: &Cluster) -> Vec<String> {
    cluster
        .kube()
        .api
        .requests()
        .into_iter()
        .filter(|r| r.method == "PATCH" || r.method == "PUT")
        .map(|r| format!("{} {}", r.method, r.path))
        .collect()
}

#[test]
fn pods_on_kubernetes_are_captured_through_cni_annotated_released_and_survive_an_agent_restart() {
    let pods = [PodSpec::new("a", 0), PodSpec::new("b", 1)];
    let mut cluster = Cluster::launch_kubernetes(ClusterSpec {
        ambit: ambit(),
        tag: "k8s",
        node_proxies: vec![NodeProxy::Ambit(ambit().to_path_buf()); 2],
        pods: &pods,
        create: pods.len(),
        extra_yaml: "",
        proxy_env: &[],
        control: None,
    })
    .unwrap();
    let _b_app = cluster.serve_app("b", APP_PORT, EchoMode::Double).unwrap();
    let _a_app = cluster.serve_app("a", APP_PORT, EchoMode::Double).unwrap();

    // Through CNI: annotated, captured, and meshed across the two nodes.
    for pod in ["a", "b"] {
        wait_redirection(&cluster, pod, Some("enabled"));
        assert!(captured(&cluster, pod), "{pod} has no in-pod rules");
    }
    exchange(&cluster, "a", "b").unwrap();
    exchange(&cluster, "b", "a").unwrap();
    let pod_a = cluster.kube().pod("a").unwrap();
    let patch = cluster
        .kube()
        .api
        .requests()
        .into_iter()
        .find(|r| r.method == "PATCH" && r.path.contains("/pods/a/status"))
        .expect("the agent patched a's status");
    assert_eq!(patch.path, "/api/v1/namespaces/default/pods/a/status");
    assert_eq!(
        patch.content_type.as_deref(),
        Some("application/merge-patch+json")
    );
    assert_eq!(pod_a["metadata"]["annotations"][REDIRECTION], "enabled");
    let (status, metrics) = http_get(
        &cluster.nodes[0].ns,
        "127.0.0.1:15014".parse().unwrap(),
        "/metrics",
    )
    .unwrap();
    assert_eq!(status, 200);
    assert!(
        metrics.contains("istio_cni_plugin_requests_total{response_code=\"200\"} 1"),
        "{metrics}"
    );

    // The agent restarts: nothing in the running pod changes, no annotation is written.
    // The exchanges went through b's rules: a rule deleted and added again from now on
    // shows as its counters gone back.
    let rules_before = cluster.iptables_counted("b").unwrap();
    assert!(
        counted_packets(&rules_before, "-j ISTIO_PRERT") > 0,
        "no packet counted by b's rules:\n{rules_before}"
    );
    cluster.kube().api.clear_requests();
    cluster.stop_agent(1).unwrap();
    cluster.start_agent(1).unwrap();
    // Ready: every pod listed is queued; once none is pending, the re-list was acted on.
    settled(&cluster, 1, "update", 0);
    // Make the new agent reconcile b again: an unrelated label change is an update it must
    // look at, to the end, and leave alone.
    cluster
        .kube()
        .api
        .update(
            ambit_fake_apiserver::Resource::Pods,
            Some("default"),
            "b",
            |p| {
                p["metadata"]["labels"]["touched"] = serde_json::json!("yes");
            },
        )
        .unwrap();
    settled(&cluster, 1, "update", 1);
    if let Err(e) = rules_kept(&rules_before, &cluster.iptables_counted("b").unwrap()) {
        panic!("b's rules after the agent's restart and b's update: {e:#}");
    }
    assert_eq!(patches(&cluster), Vec::<String>::new());
    assert_eq!(cluster.kube().redirection("b").as_deref(), Some("enabled"));
    exchange(&cluster, "a", "b").unwrap();

    // The namespace loses its label: both pods are released (rules and annotation gone).
    cluster.kube().label_namespace("default", None).unwrap();
    for pod in ["a", "b"] {
        wait_redirection(&cluster, pod, None);
        assert!(!captured(&cluster, pod), "{pod} still has in-pod rules");
    }
    // Labelled again: the running pods are found in /proc and captured live.
    cluster
        .kube()
        .label_namespace("default", Some("ambient"))
        .unwrap();
    for pod in ["a", "b"] {
        wait_redirection(&cluster, pod, Some("enabled"));
        assert!(captured(&cluster, pod), "{pod} has no in-pod rules");
    }
    wait_until("a to reach b again", WAIT, || {
        exchange(&cluster, "a", "b").is_ok()
    })
    .unwrap();

    // The pod is deleted: the agent counts the delete and forgets it.
    let a = cluster.pods.iter().position(|p| p.name == "a").unwrap();
    cluster.del_pod(a).unwrap();
    wait_until("the agent to see a's deletion", WAIT, || {
        http_get(
            &cluster.nodes[0].ns,
            "127.0.0.1:15014".parse().unwrap(),
            "/metrics",
        )
        .is_ok_and(|(_, m)| m.contains("nodeagent_reconcile_events_total{type=\"delete\"} 1"))
    })
    .unwrap();
}
