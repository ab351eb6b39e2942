//! The installer on temp dirs standing in for the host's CNI dirs and the service account
//! mount; the safe-upgrade lookups against the test API server with RBAC on.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ambit_agent::install::{conflist, InstallConfig, Installer, ShutdownAction};
use serde_json::{json, Value};

const BRIDGE: &str = r#"{
  "cniVersion": "1.0.0",
  "name": "bridge",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.1.0.0/24"}]]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
"#;

struct Node {
    _dir: tempfile::TempDir,
    net: PathBuf,
    bin: PathBuf,
    run: PathBuf,
    sa: PathBuf,
}

impl Node {
    fn new() -> Node {
        let dir = tempfile::tempdir().unwrap();
        let p = |s: &str| {
            let d = dir.path().join(s);
            fs::create_dir_all(&d).unwrap();
            d
        };
        let (net, bin, run, sa) = (p("net.d"), p("bin"), p("run"), p("sa"));
        fs::write(sa.join("token"), "token-1\n").unwrap();
        fs::write(sa.join("ca.crt"), "-----BEGIN CERTIFICATE-----\nCA\n").unwrap();
        fs::write(dir.path().join("ambit"), b"\x7fELF plugin v1").unwrap();
        Node {
            _dir: dir,
            net,
            bin,
            run,
            sa,
        }
    }

    fn config(&self, env: &[(&str, &str)]) -> InstallConfig {
        let mut map: BTreeMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        map.insert("MOUNTED_CNI_NET_DIR".into(), self.net.display().to_string());
        map.insert("CNI_AGENT_RUN_DIR".into(), self.run.display().to_string());
        map.insert("KUBERNETES_SERVICE_HOST".into(), "10.96.0.1".into());
        map.insert("AMBIENT_ENABLED".into(), "true".into());
        map.insert("POD_NAMESPACE".into(), "istio-system".into());
        map.insert("EXCLUDE_NAMESPACES".into(), "kube-system".into());
        let mut c = InstallConfig::from_env(&map).unwrap();
        c.cni_bin_dir = self.bin.clone();
        c.service_account_dir = self.sa.clone();
        c.plugin_source = self._dir.path().join("ambit");
        c
    }

    fn read(&self, name: &str) -> Value {
        serde_json::from_slice(&fs::read(self.net.join(name)).unwrap()).unwrap()
    }
}

fn types(v: &Value) -> Vec<String> {
    v["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["type"].as_str().unwrap().to_string())
        .collect()
}

fn mode(p: &Path) -> u32 {
    fs::metadata(p).unwrap().permissions().mode() & 0o777
}

#[test]
fn install_is_idempotent_repairs_drift_and_uninstalls_cleanly() {
    let node = Node::new();
    let primary = node.net.join("10-bridge.conflist");
    fs::write(&primary, BRIDGE).unwrap();
    fs::set_permissions(&primary, fs::Permissions::from_mode(0o640)).unwrap();
    let inst = Installer::new(node.config(&[]));

    let ch = inst.install_once().unwrap();
    assert!(ch.binary && ch.kubeconfig, "{ch:?}");
    assert_eq!(ch.conf_written, vec![primary.clone()]);
    let v = node.read("10-bridge.conflist");
    assert_eq!(types(&v), ["bridge", "portmap", "istio-cni"]);
    let ours = &v["plugins"][2];
    assert_eq!(ours["name"], "istio-cni");
    assert_eq!(ours["cni_agent_run_dir"], node.run.display().to_string());
    assert_eq!(ours["ambient_enabled"], true);
    assert_eq!(ours["exclude_namespaces"], json!(["kube-system"]));
    assert_eq!(ours["pod_namespace"], "istio-system");
    assert_eq!(mode(&primary), 0o640, "the primary's mode is kept");
    assert_eq!(
        fs::read(node.bin.join("istio-cni")).unwrap(),
        b"\x7fELF plugin v1"
    );
    let kc = node.run.join("istio-cni-kubeconfig");
    assert_eq!(mode(&kc), 0o600);
    let kv: Value = yaml_serde::from_str(&fs::read_to_string(&kc).unwrap()).unwrap();
    assert_eq!(
        kv["clusters"][0]["cluster"]["server"],
        "https://10.96.0.1:443"
    );
    assert_eq!(kv["users"][0]["user"]["token"], "token-1");

    // Twice: nothing to do.
    let before = fs::read(&primary).unwrap();
    assert!(inst.install_once().unwrap().is_empty());
    assert_eq!(fs::read(&primary).unwrap(), before);
    assert_eq!(inst.drift(), None);

    // Another component rewrites the primary without us.
    fs::write(&primary, BRIDGE).unwrap();
    assert!(inst.drift().unwrap().contains("CNI config"));
    assert_eq!(
        inst.install_once().unwrap().conf_written,
        vec![primary.clone()]
    );
    assert_eq!(types(&node.read("10-bridge.conflist")).len(), 3);

    // The token rotates.
    fs::write(node.sa.join("token"), "token-2\n").unwrap();
    assert!(inst.drift().unwrap().contains("token"));
    let ch = inst.install_once().unwrap();
    assert!(
        ch.kubeconfig && !ch.binary && ch.conf_written.is_empty(),
        "{ch:?}"
    );
    assert!(fs::read_to_string(&kc).unwrap().contains("token-2"));

    // The binary is deleted.
    fs::remove_file(node.bin.join("istio-cni")).unwrap();
    assert!(inst.drift().unwrap().contains("binary"));
    assert!(inst.install_once().unwrap().binary);
    assert_eq!(inst.drift(), None);

    // Uninstall: the primary is the bridge chain again; ours is gone.
    let ch = inst.uninstall().unwrap();
    assert_eq!(ch.conf_written, vec![primary.clone()]);
    assert_eq!(
        node.read("10-bridge.conflist"),
        serde_json::from_str::<Value>(BRIDGE).unwrap()
    );
    assert_eq!(mode(&primary), 0o640);
    assert!(!kc.exists() && !node.bin.join("istio-cni").exists());
    assert_eq!(fs::read_dir(&node.net).unwrap().count(), 1, "no temp files");
}

/// The installer used to write through `.<name>.tmp-<pid>` beside each target, opened
/// without `O_EXCL`: whoever could write the directory planted a symlink there and had
/// the token (or the plugin binary) written wherever it pointed. Files planted at those
/// names are neither followed nor clobbered now, and the kubeconfig has its mode.
#[test]
fn files_planted_at_the_old_temp_names_are_not_followed() {
    let node = Node::new();
    let primary = node.net.join("10-bridge.conflist");
    fs::write(&primary, BRIDGE).unwrap();
    let outside = tempfile::tempdir().unwrap();
    let pid = std::process::id();
    let mut planted = Vec::new();
    for (dir, name) in [
        (&node.run, "istio-cni-kubeconfig"),
        (&node.bin, "istio-cni"),
        (&node.net, "10-bridge.conflist"),
    ] {
        let victim = outside.path().join(name);
        fs::write(&victim, "precious").unwrap();
        let trap = dir.join(format!(".{name}.tmp-{pid}"));
        std::os::unix::fs::symlink(&victim, &trap).unwrap();
        planted.push((victim, trap));
    }
    let inst = Installer::new(node.config(&[("KUBECONFIG_MODE", "0640")]));
    let ch = inst.install_once().unwrap();
    assert!(
        ch.binary && ch.kubeconfig && ch.conf_written == [primary.clone()],
        "{ch:?}"
    );

    for (victim, trap) in &planted {
        assert_eq!(
            fs::read_to_string(victim).unwrap(),
            "precious",
            "{} followed",
            trap.display()
        );
        assert_eq!(
            fs::read_link(trap).unwrap(),
            *victim,
            "{} replaced",
            trap.display()
        );
    }
    let kc = node.run.join("istio-cni-kubeconfig");
    let meta = fs::symlink_metadata(&kc).unwrap();
    assert!(
        meta.file_type().is_file(),
        "the kubeconfig is a file of its own"
    );
    assert_eq!(mode(&kc), 0o640, "KUBECONFIG_MODE");
    assert!(fs::read_to_string(&kc).unwrap().contains("token-1"));
    assert!(fs::symlink_metadata(node.bin.join("istio-cni"))
        .unwrap()
        .file_type()
        .is_file());
    assert_eq!(mode(&node.bin.join("istio-cni")), 0o755);
    assert_eq!(
        types(&node.read("10-bridge.conflist")),
        ["bridge", "portmap", "istio-cni"]
    );
    // Only the targets and the traps: no temp file left behind.
    for dir in [&node.run, &node.bin, &node.net] {
        assert_eq!(fs::read_dir(dir).unwrap().count(), 2, "{}", dir.display());
    }
}

#[test]
fn a_single_conf_is_wrapped_and_a_later_file_does_not_win() {
    let node = Node::new();
    fs::write(
        node.net.join("10-flannel.conf"),
        r#"{"cniVersion":"0.3.1","name":"cbr0","type":"flannel"}"#,
    )
    .unwrap();
    fs::write(
        node.net.join("99-loopback.conf"),
        r#"{"name":"lo","type":"loopback"}"#,
    )
    .unwrap();
    fs::write(node.net.join("00-broken.conflist"), "{ nope").unwrap();
    let inst = Installer::new(node.config(&[]));
    let ch = inst.install_once().unwrap();
    assert_eq!(ch.conf_written, vec![node.net.join("10-flannel.conflist")]);
    assert_eq!(ch.removed, vec![node.net.join("10-flannel.conf")]);
    let v = node.read("10-flannel.conflist");
    assert_eq!(v["name"], "k8s-pod-network");
    assert_eq!(types(&v), ["flannel", "istio-cni"]);
    assert!(inst.install_once().unwrap().is_empty());
    assert!(node.read("99-loopback.conf").get("plugins").is_none());
}

#[test]
fn the_owned_file_leaves_the_primary_alone() {
    let node = Node::new();
    let primary = node.net.join("10-bridge.conflist");
    fs::write(&primary, BRIDGE).unwrap();
    fs::write(
        node.net.join("01-first.conf"),
        r#"{"name":"x","type":"bridge"}"#,
    )
    .unwrap();
    let inst = Installer::new(node.config(&[
        ("ISTIO_OWNED_CNI_CONFIG", "true"),
        ("CNI_CONF_NAME", "10-bridge.conflist"),
    ]));
    let ch = inst.install_once().unwrap();
    let owned = node.net.join(conflist::DEFAULT_OWNED_FILE);
    assert_eq!(ch.conf_written, vec![owned.clone()]);
    assert_eq!(fs::read_to_string(&primary).unwrap(), BRIDGE);
    assert_eq!(mode(&owned), 0o600);
    assert_eq!(
        types(&node.read(conflist::DEFAULT_OWNED_FILE)),
        ["bridge", "portmap", "istio-cni"]
    );
    assert!(
        ch.warnings.iter().any(|w| w.contains("01-first.conf")),
        "{ch:?}"
    );
    assert!(inst.install_once().unwrap().is_empty());
    inst.uninstall().unwrap();
    assert!(!owned.exists());
    assert_eq!(fs::read_to_string(&primary).unwrap(), BRIDGE);
}

#[test]
fn not_chained_writes_a_standalone_file_and_no_primary_is_an_error_to_wait_on() {
    let node = Node::new();
    let inst = Installer::new(node.config(&[("CHAINED_CNI_PLUGIN", "false")]));
    inst.install_once().unwrap();
    let v = node.read("YYY-istio-cni.conf");
    assert_eq!(
        (v["type"].as_str(), v["cniVersion"].as_str()),
        (Some("istio-cni"), Some("0.3.1"))
    );
    inst.uninstall().unwrap();
    assert_eq!(fs::read_dir(&node.net).unwrap().count(), 0);

    let node = Node::new();
    let err = Installer::new(node.config(&[])).install_once().unwrap_err();
    assert!(
        err.to_string()
            .contains("waiting for the primary CNI plugin"),
        "{err}"
    );
}

async fn until(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..2000 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("timed out waiting until {what}");
}

#[tokio::test]
async fn run_waits_for_the_primary_then_repairs_and_stops() {
    let node = Node::new();
    let inst = Arc::new(Installer::with_timing(
        node.config(&[]),
        Duration::from_millis(5),
        Duration::from_millis(20),
    ));
    let ready = Arc::new(AtomicBool::new(false));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(inst.clone().run(ready.clone(), async move {
        let _ = stopped.await;
    }));
    // No primary yet: not ready.
    tokio::time::sleep(Duration::from_millis(30)).await;
    assert!(!ready.load(Ordering::SeqCst));
    let primary = node.net.join("10-bridge.conflist");
    fs::write(&primary, BRIDGE).unwrap();
    until("ready", || ready.load(Ordering::SeqCst)).await;
    let has_entry = || {
        conflist::has_entry(
            "10-bridge.conflist",
            &fs::read(&primary).unwrap_or_default(),
        )
    };
    assert!(has_entry());
    fs::write(&primary, BRIDGE).unwrap();
    until("repaired", || has_entry() && ready.load(Ordering::SeqCst)).await;
    stop.send(()).unwrap();
    task.await.unwrap();
}

mod upgrade {
    use super::*;
    use ambit_fake_apiserver::{ApiServer, Resource, ServerOptions, User};

    fn rbac(api: &ApiServer) {
        // The chart's rules: get on the DaemonSet named istio-cni-node only; nodes get.
        for obj in [
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                   "metadata": {"name": "istio-cni-ambient"},
                   "rules": [{"apiGroups": ["apps"], "resources": ["daemonsets"],
                              "resourceNames": ["istio-cni-node"], "verbs": ["get"]}]}),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                   "metadata": {"name": "istio-cni"},
                   "rules": [{"apiGroups": [""], "resources": ["pods", "nodes", "namespaces"],
                              "verbs": ["get", "list", "watch"]}]}),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                   "metadata": {"name": "istio-cni-ambient"},
                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "istio-cni-ambient"},
                   "subjects": [{"kind": "ServiceAccount", "name": "istio-cni", "namespace": "istio-system"}]}),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                   "metadata": {"name": "istio-cni"},
                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "istio-cni"},
                   "subjects": [{"kind": "ServiceAccount", "name": "istio-cni", "namespace": "istio-system"}]}),
        ] {
            api.create(obj).unwrap();
        }
    }

    fn daemonset(affinity_pool: Option<&str>) -> Value {
        let mut spec = json!({"containers": [{"name": "install-cni", "image": "x"}]});
        if let Some(pool) = affinity_pool {
            spec["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                {"nodeSelectorTerms": [{"matchExpressions": [{"key": "pool", "operator": "In", "values": [pool]}]}]}}});
        }
        json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
               "metadata": {"name": "istio-cni-node", "namespace": "istio-system"},
               "spec": {"selector": {"matchLabels": {"k8s-app": "istio-cni-node"}},
                        "template": {"metadata": {"labels": {"k8s-app": "istio-cni-node"}}, "spec": spec}}})
    }

    async fn client(api: &ApiServer, dir: &Path, token: &str) -> ambit_k8s::kube::Client {
        let path = dir.join(format!("kubeconfig-{token}"));
        api.write_kubeconfig(&path, token).unwrap();
        ambit_k8s::client::connect(&ambit_k8s::client::ClientSource::Kubeconfig(path))
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn the_shutdown_decision_against_the_api() {
        let api = ApiServer::start(ServerOptions {
            rbac: true,
            ..Default::default()
        })
        .await
        .unwrap();
        rbac(&api);
        api.create(
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "istio-system"}}),
        )
        .unwrap();
        api.create(json!({"apiVersion": "v1", "kind": "Node",
                          "metadata": {"name": "n1", "labels": {"pool": "mesh"}}}))
            .unwrap();
        api.add_token(
            "sa-token",
            User::service_account("istio-system", "istio-cni"),
        );
        api.add_token("other-token", User::service_account("default", "default"));

        let node = Node::new();
        let primary = node.net.join("10-bridge.conflist");
        fs::write(&primary, BRIDGE).unwrap();
        let mut cfg = node.config(&[("NODE_NAME", "n1")]);
        cfg.node_name = "n1".into();
        let inst = Arc::new(Installer::new(cfg.clone()));
        let sa = client(&api, node.sa.as_path(), "sa-token").await;

        let decide = |inst: Arc<Installer>, c: ambit_k8s::kube::Client| async move {
            inst.install_once().unwrap();
            let (d, r) = inst.shutdown(Some(&c)).await;
            r.unwrap();
            d
        };

        // Absent → cleanup (a real uninstall).
        let d = decide(inst.clone(), sa.clone()).await;
        assert_eq!(d.action, ShutdownAction::Cleanup, "{}", d.reason);
        assert!(!conflist::has_entry(
            "10-bridge.conflist",
            &fs::read(&primary).unwrap()
        ));
        assert!(!node.bin.join("istio-cni").exists());

        // Present, affinity matches → upgrade, everything stays.
        api.create(daemonset(Some("mesh"))).unwrap();
        let d = decide(inst.clone(), sa.clone()).await;
        assert_eq!(d.action, ShutdownAction::Upgrade, "{}", d.reason);
        assert!(conflist::has_entry(
            "10-bridge.conflist",
            &fs::read(&primary).unwrap()
        ));
        assert!(node.bin.join("istio-cni").exists());
        let paths: Vec<String> = api
            .requests()
            .iter()
            .map(|r| format!("{} {} {}", r.method, r.path, r.status))
            .collect();
        assert!(
            paths
                .iter()
                .any(|p| p
                    == "GET /apis/apps/v1/namespaces/istio-system/daemonsets/istio-cni-node 200")
                && paths.iter().any(|p| p == "GET /api/v1/nodes/n1 200"),
            "{paths:?}"
        );

        // The node no longer matches the affinity → cleanup.
        api.update(Resource::Nodes, None, "n1", |n| {
            n["metadata"]["labels"]["pool"] = json!("other")
        })
        .unwrap();
        let d = decide(inst.clone(), sa.clone()).await;
        assert_eq!(d.action, ShutdownAction::Cleanup, "{}", d.reason);

        // Being deleted → cleanup.
        api.update(
            Resource::DaemonSets,
            Some("istio-system"),
            "istio-cni-node",
            |d| {
                d["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
                d["spec"]["template"]["spec"]
                    .as_object_mut()
                    .unwrap()
                    .remove("affinity");
            },
        )
        .unwrap();
        let d = decide(inst.clone(), sa.clone()).await;
        assert_eq!(d.action, ShutdownAction::Cleanup, "{}", d.reason);
        assert!(d.reason.contains("deleted"), "{}", d.reason);

        // 403 (not allowed to read it) and 401 (token gone) → cleanup.
        let other = client(&api, node.sa.as_path(), "other-token").await;
        let d = decide(inst.clone(), other).await;
        assert_eq!(d.action, ShutdownAction::Cleanup, "{}", d.reason);
        assert!(d.reason.contains("403"), "{}", d.reason);
        let unknown = client(&api, node.sa.as_path(), "revoked").await;
        let d = decide(inst.clone(), unknown).await;
        assert_eq!(d.action, ShutdownAction::Cleanup, "{}", d.reason);
        assert!(d.reason.contains("401"), "{}", d.reason);

        // Any other failure → keep everything (fail closed).
        api.faults()
            .fail_next(1, 500, Some("GET"), Some("daemonsets"));
        let d = decide(inst.clone(), sa.clone()).await;
        assert_eq!(d.action, ShutdownAction::Upgrade, "{}", d.reason);
        assert!(node.bin.join("istio-cni").exists());

        // AMBIENT_DISABLE_SAFE_UPGRADE forces cleanup without asking.
        let mut cfg2 = cfg.clone();
        cfg2.disable_safe_upgrade = true;
        api.clear_requests();
        let d = decide(Arc::new(Installer::new(cfg2)), sa.clone()).await;
        assert_eq!(d.action, ShutdownAction::Cleanup);
        assert!(api.requests().is_empty());
    }
}
