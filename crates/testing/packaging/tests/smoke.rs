//! The charts and the images together, as a cluster would run them:
//!
//! - the RBAC the charts render, fed to the test API server, grants the agent's service
//!   account what the agent uses and nothing more (kube-rs as that account);
//! - both DaemonSets' containers, run with podman under their rendered settings in one
//!   network namespace with the test API server and `ambit control`, become ready, install
//!   the CNI plugin on the "host" and remove it again only when the DaemonSet is gone.
//!
//! Needs root, helm (scripts/charts tools), umoci, podman and runc (scripts/tools.sh's
//! IMAGE_TOOLS), iproute2 and util-linux (nsenter, unshare), and the ambit binary (built on
//! demand, or AMBIT_BIN). The agent runs with `ambient.shareHostNetworkNamespace=true`: its
//! "host" is the test's namespace, never the machine's.

mod smoke_support;

use std::collections::BTreeMap;

use ambit_fake_apiserver::{pod, ApiServer, Resource, ServerOptions, User};
use ambit_packaging::chart::Rendered;
use ambit_packaging::podman::{Container, PodIdentity, PodmanRun};
use ambit_packaging::spec::ContainerSpec;
use futures_util::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, Node as KubeNode, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, WatchEvent, WatchParams};
use serde_json::{json, Value};

use smoke_support::*;

const NODE: &str = "node-1";
const CNI_TOKEN: &str = "istio-cni-token";
const ZTUNNEL_TOKEN: &str = "ztunnel-token";

/// An API server with RBAC on, the charts' objects applied and a token for each chart's
/// service account.
async fn api_with(objects_yaml: &str) -> ApiServer {
    let api = ApiServer::start(ServerOptions {
        rbac: true,
        ..Default::default()
    })
    .await
    .unwrap();
    prepare_api(&api, objects_yaml);
    api.add_token(
        CNI_TOKEN,
        User::service_account("istio-system", "istio-cni"),
    );
    api.add_token(
        ZTUNNEL_TOKEN,
        User::service_account("istio-system", "ztunnel"),
    );
    api
}

fn forbidden(e: kube::Error) -> String {
    match e {
        kube::Error::Api(s) if s.code == 403 => s.message.clone(),
        other => panic!("expected a 403, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chart_rbac_grants_the_agent_what_it_uses_and_nothing_more() {
    let (cni, ztunnel) = (render_cni(&[]), render_ztunnel(&[]));
    let api = api_with(&format!("{}\n---\n{}", cni.yaml, ztunnel.yaml)).await;
    api.create(pod("default", "web", NODE)).unwrap();
    api.create(pod("default", "elsewhere", "node-2")).unwrap();
    api.create(json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": "other", "namespace": "istio-system"},
        "spec": {"selector": {"matchLabels": {"app": "other"}},
                 "template": {"metadata": {"labels": {"app": "other"}},
                              "spec": {"containers": [{"name": "c", "image": "i"}]}}}}))
        .unwrap();
    let c = client(&api, CNI_TOKEN).await;
    let on_node = format!("spec.nodeName={NODE}");

    // What the agent's watches do: this node's pods, all namespaces, its node.
    let pods: Api<Pod> = Api::all(c.clone());
    let listed = pods
        .list(&ListParams::default().fields(&on_node))
        .await
        .unwrap();
    let names: Vec<_> = listed
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    assert_eq!(names, ["web"]);
    let rv = listed.metadata.resource_version.clone().unwrap_or_default();
    let mut watch = pods
        .watch(&WatchParams::default().fields(&on_node), &rv)
        .await
        .unwrap()
        .boxed();
    api.create(pod("default", "later", NODE)).unwrap();
    match watch.try_next().await.unwrap() {
        Some(WatchEvent::Added(p)) => assert_eq!(p.metadata.name.as_deref(), Some("later")),
        other => panic!("expected the new pod on the watch, got {other:?}"),
    }
    drop(watch);
    let namespaces: Api<Namespace> = Api::all(c.clone());
    let listed = namespaces.list(&ListParams::default()).await.unwrap();
    assert!(listed
        .iter()
        .any(|n| n.metadata.name.as_deref() == Some("istio-system")));
    let rv = listed.metadata.resource_version.clone().unwrap_or_default();
    let mut watch = namespaces
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();
    api.create(ambit_fake_apiserver::namespace("later", &[]))
        .unwrap();
    assert!(matches!(
        watch.try_next().await.unwrap(),
        Some(WatchEvent::Added(n)) if n.metadata.name.as_deref() == Some("later")
    ));
    drop(watch);
    let nodes: Api<KubeNode> = Api::all(c.clone());
    assert_eq!(
        nodes.get(NODE).await.unwrap().metadata.name.as_deref(),
        Some(NODE)
    );

    // The status patch the agent marks captured pods with.
    let in_default: Api<Pod> = Api::namespaced(c.clone(), "default");
    let patch = json!({"status": {"conditions": [{"type": "ZtunnelRedirection",
        "status": "True", "reason": "ZtunnelInpodRedirect"}]}});
    in_default
        .patch_status("web", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();

    // Its own DaemonSet (the safe-upgrade check) and no other.
    let daemonsets: Api<DaemonSet> = Api::namespaced(c.clone(), "istio-system");
    daemonsets.get("istio-cni-node").await.unwrap();
    let msg = forbidden(daemonsets.get("other").await.unwrap_err());
    assert!(msg.contains("cannot get resource \"daemonsets\""), "{msg}");

    // Nothing it does not use: no deleting pods (repair.deletePods is off by default).
    let msg = forbidden(
        in_default
            .delete("web", &DeleteParams::default())
            .await
            .unwrap_err(),
    );
    assert_eq!(
        msg,
        "pods \"web\" is forbidden: User \"system:serviceaccount:istio-system:istio-cni\" \
         cannot delete resource \"pods\" in API group \"\" in the namespace \"default\""
    );

    // The ztunnel chart grants nothing: the node proxy does not talk to the API server.
    let z: Api<Pod> = Api::all(client(&api, ZTUNNEL_TOKEN).await);
    let msg = forbidden(z.list(&ListParams::default()).await.unwrap_err());
    assert!(
        msg.contains(
            "User \"system:serviceaccount:istio-system:ztunnel\" cannot list resource \"pods\""
        ),
        "{msg}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chart_rbac_without_the_pods_status_rule_refuses_the_status_patch() {
    let cni = render_cni(&[]);
    let (yaml, dropped) = without_rule(&cni, "pods/status");
    assert!(dropped > 0, "the chart has no pods/status rule to drop");
    let api = api_with(&yaml).await;
    api.create(pod("default", "web", NODE)).unwrap();
    let pods: Api<Pod> = Api::namespaced(client(&api, CNI_TOKEN).await, "default");
    let patch = json!({"status": {"conditions": [{"type": "ZtunnelRedirection",
        "status": "True"}]}});
    let msg = forbidden(
        pods.patch_status("web", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap_err(),
    );
    assert!(
        msg.contains("cannot patch resource \"pods/status\" in API group \"\""),
        "{msg}"
    );
    // The rest of the role still works.
    pods.get("web").await.unwrap();
}

/// The cni chart's objects with every ClusterRole rule naming `resource` removed (as YAML
/// for `apply_yaml`), and how many rules went.
fn without_rule(rendered: &Rendered, resource: &str) -> (String, usize) {
    let mut dropped = 0;
    let docs: Vec<String> = rendered
        .objects
        .iter()
        .map(|o| {
            let mut o = o.clone();
            if o["kind"] == "ClusterRole" {
                if let Some(rules) = o.get_mut("rules").and_then(Value::as_array_mut) {
                    let before = rules.len();
                    rules.retain(|r| {
                        !r["resources"]
                            .as_array()
                            .is_some_and(|rs| rs.iter().any(|x| x == resource))
                    });
                    dropped += before - rules.len();
                }
            }
            o.to_string()
        })
        .collect();
    (docs.join("\n---\n"), dropped)
}

/// The node's address in the test namespace: the API server, `ambit control` and the pods'
/// `INSTANCE_IP`.
const NODE_IP: &str = "10.250.0.1";
const CONTROL_PORT: u16 = 15012;
/// `ambit control`'s operator port: not 15014, which the agent's metrics use.
const CONTROL_ADMIN: &str = "127.0.0.1:15114";
const SA_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// Both images, together, in one network namespace standing in for a node: the agent
/// installs the plugin and serves ZDS, the proxy connects to it and to `ambit control`,
/// both become ready, and the plugin stays installed across an agent restart and goes only
/// when the DaemonSet is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_images_run_together_on_a_node() {
    let f = fixture();
    let lab = ambit_netns_lab::Lab::new("smoke").unwrap();
    let ns = lab.netns("node").unwrap();
    for cmd in [
        // A veth pair with both ends inside (no dummy module needed): the node's "eth0".
        &[
            "ip",
            "link",
            "add",
            "eth0",
            "type",
            "veth",
            "peer",
            "name",
            "eth0-peer",
        ][..],
        &["ip", "addr", "add", &format!("{NODE_IP}/24"), "dev", "eth0"],
        &["ip", "link", "set", "eth0-peer", "up"],
        &["ip", "link", "set", "eth0", "up"],
    ] {
        lab.exec(&ns, cmd).unwrap();
    }

    // The charts, as a node running the agent in its own network namespace would have them.
    let control_addr = format!("{NODE_IP}:{CONTROL_PORT}");
    let cni = render_cni(&[
        ("profile", "ambient"),
        ("ambient.shareHostNetworkNamespace", "true"),
    ]);
    let ztunnel = render_ztunnel(&[
        ("profile", "ambient"),
        ("xdsAddress", &control_addr),
        ("caAddress", &control_addr),
    ]);
    let cni_spec = ContainerSpec::from_daemonset(
        cni.get("DaemonSet", "istio-cni-node").unwrap(),
        "install-cni",
    )
    .unwrap();
    let zt_spec =
        ContainerSpec::from_daemonset(ztunnel.get("DaemonSet", "ztunnel").unwrap(), "istio-proxy")
            .unwrap();
    // The agent never switches into the real machine's network namespace.
    assert!(
        cni_spec.host_network,
        "shareHostNetworkNamespace sets hostNetwork"
    );
    assert_eq!(cni_spec.env_value("ALLOW_SWITCH_TO_HOST_NS"), None);
    assert!(
        !cni.config_map("istio-cni-config")
            .unwrap()
            .contains_key("ALLOW_SWITCH_TO_HOST_NS"),
        "the ConfigMap would send the agent into the machine's own netns"
    );
    let cms = BTreeMap::from([(
        "istio-cni-config".to_string(),
        cni.config_map("istio-cni-config").unwrap(),
    )]);
    assert_eq!(cms["istio-cni-config"]["AMBIENT_ENABLED"], "true");

    // The API server in the node's namespace, with the charts' objects.
    let listener = ambit_netns_lab::Lab::in_netns(&ns, || {
        std::net::TcpListener::bind((NODE_IP.parse::<std::net::IpAddr>().unwrap(), 0))
    })
    .unwrap();
    let api = ApiServer::start_on(
        listener,
        ServerOptions {
            rbac: true,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    prepare_api(&api, &format!("{}\n---\n{}", cni.yaml, ztunnel.yaml));
    api.add_token(
        CNI_TOKEN,
        User::service_account("istio-system", "istio-cni"),
    );
    api.add_token(
        ZTUNNEL_TOKEN,
        User::service_account("istio-system", "ztunnel"),
    );
    assert!(api
        .get(Resource::DaemonSets, Some("istio-system"), "istio-cni-node")
        .is_some());

    // `ambit control` beside it, as istiod: an empty mesh, a token for this node's proxy.
    let work = tempfile::Builder::new()
        .prefix("smoke")
        .tempdir_in({
            let d = f.dir.join("hosts");
            std::fs::create_dir_all(&d).unwrap();
            d
        })
        .unwrap();
    let (mesh, ca, tokens) = (
        work.path().join("mesh"),
        work.path().join("ca"),
        work.path().join("tokens.yaml"),
    );
    std::fs::create_dir_all(&mesh).unwrap();
    std::fs::create_dir_all(&ca).unwrap();
    std::fs::write(mesh.join("mesh.yaml"), "workloads: []\n").unwrap();
    let proxy_token = format!("smoke-{NODE}-{:016x}", std::process::id());
    std::fs::write(&tokens, format!("- token: {proxy_token}\n  node: {NODE}\n")).unwrap();
    std::fs::set_permissions(&tokens, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let path = |p: &std::path::Path| p.display().to_string();
    let control = lab
        .spawn(
            &ns,
            "control",
            &f.ambit,
            &[
                "control",
                "--mesh",
                &path(&mesh),
                "--ca",
                &path(&ca),
                "--tokens",
                &path(&tokens),
                "--listen",
                &control_addr,
                "--admin",
                CONTROL_ADMIN,
            ],
            &[("RUST_LOG", "info".to_string())],
        )
        .unwrap();
    let admin: std::net::SocketAddr = CONTROL_ADMIN.parse().unwrap();
    wait_for("ambit control to be ready", || {
        if !lab.is_running(control.pid) {
            return Err(std::fs::read_to_string(&control.log).unwrap_or_default());
        }
        Ok(matches!(
            ambit_netns_lab::http_get(&ns, admin, "/ready"),
            Ok((200, _))
        ))
    });

    // The node's directories, and what the kubelet mounts into each pod.
    let host = work.path().join("host");
    let node = Node::new(&host);
    std::fs::write(node.conf_dir().join("10-bridge.conflist"), BRIDGE_CONFLIST).unwrap();
    let cni_sa = node.service_account("istio-cni", CNI_TOKEN, &api.ca_pem());
    let zt_sa = node.service_account("ztunnel", ZTUNNEL_TOKEN, &api.ca_pem());
    let node_proc = NodeProc::start(
        &ambit_netns_lab::Lab::netns_path(&ns),
        &work.path().join("proc"),
    );
    let kubelet_env = [
        ("KUBERNETES_SERVICE_HOST".to_string(), NODE_IP.to_string()),
        (
            "KUBERNETES_SERVICE_PORT".to_string(),
            api.addr().port().to_string(),
        ),
        (
            "KUBERNETES_SERVICE_PORT_HTTPS".to_string(),
            api.addr().port().to_string(),
        ),
    ];
    let cni_run = |n: u32| {
        let pod = PodIdentity {
            name: format!("istio-cni-node-{n}"),
            namespace: "istio-system".into(),
            node_name: NODE.into(),
            pod_ip: NODE_IP.into(),
            service_account: "istio-cni".into(),
        };
        let mut run = PodmanRun::from_spec(&cni_spec, &f.images.cni.name, &cms, &pod, &host)
            .unwrap()
            .name(&format!("{ns}-cni-{n}"))
            .network_ns(&ambit_netns_lab::Lab::netns_path(&ns))
            .volume_dir("cni-host-procfs", node_proc.dir())
            .unwrap()
            .mount(&cni_sa, SA_DIR, true);
        for (k, v) in &kubelet_env {
            run = run.env(k, v);
        }
        run
    };
    let zt_pod = PodIdentity {
        name: "ztunnel-1".into(),
        namespace: "istio-system".into(),
        node_name: NODE.into(),
        pod_ip: NODE_IP.into(),
        service_account: "ztunnel".into(),
    };
    let mut zt_run = PodmanRun::from_spec(&zt_spec, &f.images.ztunnel.name, &cms, &zt_pod, &host)
        .unwrap()
        .name(&format!("{ns}-ztunnel"))
        .network_ns(&ambit_netns_lab::Lab::netns_path(&ns))
        .mount(&zt_sa, SA_DIR, true);
    for (k, v) in &kubelet_env {
        zt_run = zt_run.env(k, v);
    }
    // The projected token ztunnel presents, and istiod's root (the istio-ca-root-cert
    // ConfigMap), from the control server.
    std::fs::write(
        zt_run.volume_dirs["istio-token"].join("istio-token"),
        &proxy_token,
    )
    .unwrap();
    std::fs::copy(
        ca.join("root-cert.pem"),
        zt_run.volume_dirs["istiod-ca-cert"].join("root-cert.pem"),
    )
    .unwrap();
    assert!(
        !cni_run(0)
            .env
            .iter()
            .any(|(k, v)| k == "ALLOW_SWITCH_TO_HOST_NS" && v == "true"),
        "the agent's environment would send it into the machine's own netns"
    );
    // One directory for the ZDS socket, as both charts mount the host's /var/run/ztunnel.
    assert_eq!(
        zt_run.volume_dirs["cni-ztunnel-sock-dir"],
        cni_run(0).volume_dirs["cni-ztunnel-sock-dir"]
    );

    // Both start as the DaemonSets would, in any order.
    let cni_c = cni_run(1).start(&f.podman).unwrap();
    let zt_c = zt_run.start(&f.podman).unwrap();
    let logs = || {
        format!(
            "--- install-cni:\n{}\n--- istio-proxy:\n{}\n--- control:\n{}",
            cni_c.logs(),
            zt_c.logs(),
            std::fs::read_to_string(&control.log).unwrap_or_default()
        )
    };
    let ready = |c: &Container, addr: &str, path: &str| {
        let (running, code) = c.state().map_err(|e| e.to_string())?;
        if !running {
            return Err(format!("{} exited with {code}", c.name()));
        }
        Ok(matches!(
            ambit_netns_lab::http_get(&ns, addr.parse().unwrap(), path),
            Ok((200, _))
        ))
    };
    wait_for_or("the agent to be ready (:8000/readyz)", &logs, || {
        ready(&cni_c, "127.0.0.1:8000", "/readyz")
    });
    wait_for_or(
        "the proxy to be ready (:15021/healthz/ready)",
        &logs,
        || ready(&zt_c, "127.0.0.1:15021", "/healthz/ready"),
    );

    // What the installer put on the host.
    let installed = node.installed();
    assert!(
        installed.plugin_executable,
        "no executable istio-cni in the bin dir\n{}",
        logs()
    );
    let entry = installed
        .conflist_entry
        .unwrap_or_else(|| panic!("no istio-cni entry in 10-bridge.conflist\n{}", logs()));
    for key in [
        "cni_agent_run_dir",
        "ambient_enabled",
        "enablement_selectors",
        "exclude_namespaces",
        "pod_namespace",
    ] {
        assert!(
            entry.get(key).is_some(),
            "the istio-cni entry has no {key}: {entry}"
        );
    }
    assert_eq!(entry["ambient_enabled"], true, "{entry}");
    assert_eq!(entry["pod_namespace"], "istio-system", "{entry}");
    assert_eq!(
        installed.plugins_before,
        ["bridge", "portmap"],
        "the primary plugins kept, in order"
    );
    assert!(
        installed.kubeconfig,
        "no istio-cni-kubeconfig in /var/run/istio-cni\n{}",
        logs()
    );

    // The installed plugin runs as the container runtime calls it.
    let version = std::process::Command::new(host.join("cni-bin-dir/istio-cni"))
        .env("CNI_COMMAND", "VERSION")
        .output()
        .unwrap();
    let version = String::from_utf8_lossy(&version.stdout);
    assert!(
        version.contains("supportedVersions"),
        "istio-cni VERSION: {version}"
    );
    let kubeconfig =
        std::fs::read_to_string(host.join("cni-socket-dir/istio-cni-kubeconfig")).unwrap();
    assert!(
        kubeconfig.contains(&format!("{NODE_IP}:{}", api.addr().port())),
        "the plugin's kubeconfig does not point at the API server: {kubeconfig}"
    );
    // The proxy reached the agent through the shared host directory.
    let sock = host.join("cni-ztunnel-sock-dir/ztunnel.sock");
    assert!(
        std::fs::symlink_metadata(&sock)
            .is_ok_and(|m| { std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()) }),
        "no ZDS socket at {}",
        sock.display()
    );
    // The chart's RBAC was enough for everything the agent and the installer asked.
    let cni_user = "system:serviceaccount:istio-system:istio-cni";
    let denied: Vec<_> = api
        .requests()
        .into_iter()
        .filter(|r| r.user.as_deref() == Some(cni_user) && r.status == 403)
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    assert!(
        denied.is_empty(),
        "the chart's RBAC refused the agent: {denied:?}"
    );

    // Nothing written outside the mounts.
    assert_root_unchanged(&cni_c, &cni_run(0));
    assert_root_unchanged(&zt_c, &zt_run);

    // SIGTERM with the DaemonSet still there: an upgrade, the plugin stays.
    cni_c.stop(30).unwrap();
    let after = node.installed();
    assert!(
        after.plugin_executable && after.kubeconfig && after.conflist_entry.is_some(),
        "an agent stopped while its DaemonSet exists removed the plugin: {after:?}\n{}",
        logs()
    );
    drop(cni_c);

    // The DaemonSet deleted (an uninstall): the next agent to stop removes it all.
    api.delete(Resource::DaemonSets, Some("istio-system"), "istio-cni-node")
        .unwrap();
    let cni_c = cni_run(2).start(&f.podman).unwrap();
    let logs = || format!("--- install-cni:\n{}", cni_c.logs());
    wait_for_or("the second agent to be ready", &logs, || {
        ready(&cni_c, "127.0.0.1:8000", "/readyz")
    });
    cni_c.stop(30).unwrap();
    let gone = node.installed();
    assert!(
        !gone.plugin_present && !gone.kubeconfig && gone.conflist_entry.is_none(),
        "the DaemonSet is gone but the plugin is still installed: {gone:?}\n{}",
        logs()
    );
    assert_eq!(
        gone.plugins_before,
        ["bridge", "portmap"],
        "the primary conflist is restored"
    );
    zt_c.stop(30).unwrap();
}

/// The control chart's RBAC, fed to the test API server with RBAC on, is enough for `ambit
/// control --kubernetes` as that account: its six watches list (it becomes ready), a
/// waypoint's stream is admitted through a TokenReview, a refused object gets its Event;
/// every request it made was allowed. And it grants nothing beyond: no secrets, no writes
/// to the objects it reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_chart_rbac_is_what_control_kubernetes_uses_and_nothing_more() {
    use ambit_packaging::chart::Render;
    let rendered = Render::new("control").run().unwrap();
    let api = ApiServer::start(ServerOptions {
        rbac: true,
        ..Default::default()
    })
    .await
    .unwrap();
    prepare_api(&api, &rendered.yaml);
    api.create(ambit_fake_apiserver::namespace("shop", &[]))
        .unwrap();
    api.create(
        json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "metadata": {"name": "waypoint", "namespace": "shop"},
        "spec": {"gatewayClassName": "istio-waypoint", "listeners": []}}),
    )
    .unwrap();
    api.create(json!({"apiVersion": "security.istio.io/v1", "kind": "AuthorizationPolicy",
        "metadata": {"name": "typo", "namespace": "shop"},
        "spec": {"targetRefs": [{"kind": "Gateway", "group": "gateway.networking.k8s.io", "name": "waypoint"}],
                 "action": "DENY", "rules": [{"to": [{"operation": {"metods": ["DELETE"]}}]}]}}))
        .unwrap();
    const CONTROL_TOKEN: &str = "ambit-control-token";
    let user = "system:serviceaccount:istio-system:ambit-control";
    api.add_token(
        CONTROL_TOKEN,
        User::service_account("istio-system", "ambit-control"),
    );
    api.add_token_with_audiences(
        "waypoint-token",
        User::service_account("shop", "waypoint"),
        &["istio-ca"],
    );
    let c = client(&api, CONTROL_TOKEN).await;

    let dir = tempfile::tempdir().unwrap();
    let ca = ambit_identity::CertificateAuthority::ephemeral("cluster.local").unwrap();
    ca.write_plugin_dir(dir.path()).unwrap();
    let certs = ambit_process::certs::cert_manager(&ambit_process::certs::CertSettings {
        source: &ambit_process::ca::CaSource::LocalDir(dir.path().to_path_buf()),
        trust_domain: "cluster.local",
        cluster_id: "Kubernetes",
        secret_ttl: std::time::Duration::from_secs(3600),
        impersonate: false,
    })
    .unwrap();
    let mut cfg = ambit_control::ControlConfig::new(
        Default::default(),
        Default::default(),
        Default::default(),
    );
    cfg.listen = "127.0.0.1:0".parse().unwrap();
    let control = ambit_control::Control::start_kubernetes(cfg, c.clone(), certs)
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !control.is_ready() {
        assert!(
            std::time::Instant::now() < deadline,
            "never listed: {:?}",
            api.requests()
                .iter()
                .filter(|r| r.status == 403)
                .map(|r| r.path.clone())
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // A waypoint's stream: admitted after a TokenReview.
    let channel = ambit_grpc::GrpcChannel::new(ambit_grpc::ChannelConfig {
        server_identity: Some(
            ambit_identity::SpiffeId::parse(
                "spiffe://cluster.local/ns/istio-system/sa/ambit-control",
            )
            .unwrap(),
        ),
        address: format!("https://{}", control.local_addr()),
        root: ambit_grpc::RootCa::Inline(ca.root_pem()),
        alt_hostname: None,
        token: ambit_grpc::Token::Literal("waypoint-token".into()),
        cluster_id: "Kubernetes".into(),
        headers: Vec::new(),
    })
    .unwrap();
    let mut ads = ambit_proto::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient::new(channel.channel().unwrap());
    let first = ambit_proto::DeltaDiscoveryRequest {
        type_url: ambit_proto::WAYPOINT_POLICY_TYPE.into(),
        ..Default::default()
    };
    let request = channel
        .request(futures_util::stream::iter([first]).chain(futures_util::stream::pending()))
        .unwrap();
    let mut stream = ads
        .delta_aggregated_resources(request)
        .await
        .unwrap()
        .into_inner();
    let served = stream.message().await.unwrap().unwrap();
    // The refused policy stands in as a DENY: served, so the stream was admitted.
    assert_eq!(served.resources.len(), 1, "{served:?}");
    // Its Event was written.
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(c.clone(), "shop");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let admin = client(&api, &api.admin_token()).await;
        let all: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(admin, "shop");
        if !all
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
        {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no Event written");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let denied: Vec<_> = api
        .requests()
        .into_iter()
        .filter(|r| r.user.as_deref() == Some(user) && r.status == 403)
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    assert!(
        denied.is_empty(),
        "the chart's RBAC refused the control server: {denied:?}"
    );
    // Nothing more: no reading events back, no pods, no writes to what it reads.
    forbidden(events.list(&ListParams::default()).await.unwrap_err());
    let pods: Api<Pod> = Api::all(c.clone());
    forbidden(pods.list(&ListParams::default()).await.unwrap_err());
    let policies: Api<kube::api::DynamicObject> = Api::namespaced_with(
        c.clone(),
        "shop",
        &kube::api::ApiResource::from_gvk_with_plural(
            &kube::api::GroupVersionKind::gvk("security.istio.io", "v1", "AuthorizationPolicy"),
            "authorizationpolicies",
        ),
    );
    forbidden(
        policies
            .delete("typo", &DeleteParams::default())
            .await
            .unwrap_err(),
    );
    let config_maps: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(c, "shop");
    forbidden(
        config_maps
            .create(
                &Default::default(),
                &serde_json::from_value(json!({"metadata": {"name": "x"}})).unwrap(),
            )
            .await
            .unwrap_err(),
    );
}
