//! What the smoke tests share: renderings, the API server's setup, kube-rs clients.

use ambit_fake_apiserver::ApiServer;
use ambit_packaging::chart::{Render, Rendered};

/// charts/cni with ambient on, plus `sets`.
pub fn render_cni(sets: &[(&str, &str)]) -> Rendered {
    let mut r = Render::new("cni").set("ambient.enabled", "true");
    for (k, v) in sets {
        r = r.set(k, v);
    }
    r.run().unwrap_or_else(|e| panic!("{e}"))
}

/// charts/ztunnel, plus `sets`.
pub fn render_ztunnel(sets: &[(&str, &str)]) -> Rendered {
    let mut r = Render::new("ztunnel");
    for (k, v) in sets {
        r = r.set(k, v);
    }
    r.run().unwrap_or_else(|e| panic!("{e}"))
}

/// The namespace the charts install into, the charts' objects, and the node.
pub fn prepare_api(api: &ApiServer, objects_yaml: &str) {
    api.create(ambit_fake_apiserver::namespace("istio-system", &[]))
        .unwrap();
    api.apply_yaml(objects_yaml).unwrap();
    // The labels the kubelet gives every node; the DaemonSets select `kubernetes.io/os`.
    let mut node = ambit_fake_apiserver::node(super::NODE);
    node["metadata"]["labels"]["kubernetes.io/os"] = "linux".into();
    node["metadata"]["labels"]["kubernetes.io/arch"] = "amd64".into();
    api.create(node).unwrap();
}

/// kube-rs as the holder of `token`.
pub async fn client(api: &ApiServer, token: &str) -> kube::Client {
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&api.kubeconfig(token)).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    kube::Client::try_from(config).unwrap()
}

/// The images, built once per test process and loaded into a private podman store under
/// target/deploy-smoke (replaced on the next run; not the one tests/images.rs uses, so the
/// two test binaries can run at once).
pub struct Fixture {
    pub images: ambit_packaging::image::Images,
    pub podman: ambit_packaging::podman::Podman,
    pub dir: std::path::PathBuf,
    pub ambit: std::path::PathBuf,
}

pub fn fixture() -> &'static Fixture {
    use ambit_packaging::image;
    use ambit_packaging::podman::Podman;
    static F: std::sync::OnceLock<Fixture> = std::sync::OnceLock::new();
    F.get_or_init(|| {
        ambit_packaging::tools::need("IMAGE_TOOLS").unwrap_or_else(|e| panic!("{e}"));
        let ambit = image::ambit_bin().unwrap_or_else(|e| panic!("{e}"));
        let dir = ambit_packaging::workspace().join("target/deploy-smoke");
        let podman = Podman::reset(&dir.join("podman")).unwrap_or_else(|e| panic!("{e}"));
        let out = dir.join("images");
        let _ = std::fs::remove_dir_all(&out);
        let images = image::build(&ambit, &out, "0.1.0").unwrap_or_else(|e| panic!("{e}"));
        for img in [&images.ztunnel, &images.cni] {
            let names = podman.load(&img.archive).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(names, std::slice::from_ref(&img.name));
        }
        Fixture {
            images,
            podman,
            dir,
            ambit,
        }
    })
}

/// A primary network's conflist, as a node's network plugin leaves it.
pub const BRIDGE_CONFLIST: &str = r#"{
  "cniVersion": "1.0.0",
  "name": "bridge-net",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true,
     "ipam": {"type": "host-local", "subnet": "10.88.0.0/16"}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
"#;

/// The node's directories: each hostPath volume is `<root>/<volume name>`, shared by both
/// pods where the charts mount the same host directory under the same volume name.
pub struct Node {
    root: std::path::PathBuf,
}

/// What the installer left on the node.
#[derive(Debug)]
pub struct Installed {
    pub plugin_present: bool,
    pub plugin_executable: bool,
    /// The conflist's `istio-cni` entry, when it is the last plugin.
    pub conflist_entry: Option<serde_json::Value>,
    /// The other plugins' types, in order.
    pub plugins_before: Vec<String>,
    pub kubeconfig: bool,
}

impl Node {
    pub fn new(root: &std::path::Path) -> Node {
        for d in ["cni-bin-dir", "cni-net-dir", "cni-socket-dir"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        Node {
            root: root.to_path_buf(),
        }
    }

    /// The host's /etc/cni/net.d.
    pub fn conf_dir(&self) -> std::path::PathBuf {
        self.root.join("cni-net-dir")
    }

    /// A service account's token directory as the kubelet projects it.
    pub fn service_account(&self, name: &str, token: &str, ca_pem: &str) -> std::path::PathBuf {
        let dir = self.root.join(format!("serviceaccount-{name}"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("token"), token).unwrap();
        std::fs::write(dir.join("ca.crt"), ca_pem).unwrap();
        std::fs::write(dir.join("namespace"), "istio-system").unwrap();
        dir
    }

    pub fn installed(&self) -> Installed {
        use std::os::unix::fs::PermissionsExt;
        let plugin = std::fs::metadata(self.root.join("cni-bin-dir/istio-cni")).ok();
        let conflist: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(self.conf_dir().join("10-bridge.conflist"))
                .unwrap_or_else(|e| panic!("10-bridge.conflist: {e}")),
        )
        .unwrap_or_else(|e| panic!("10-bridge.conflist is not JSON: {e}"));
        let plugins = conflist["plugins"].as_array().cloned().unwrap_or_default();
        let conflist_entry = plugins.last().filter(|p| p["type"] == "istio-cni").cloned();
        Installed {
            plugin_present: plugin.is_some(),
            plugin_executable: plugin
                .is_some_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0),
            conflist_entry,
            plugins_before: plugins
                .iter()
                .filter(|p| p["type"] != "istio-cni")
                .filter_map(|p| p["type"].as_str().map(str::to_string))
                .collect(),
            kubeconfig: self
                .root
                .join("cni-socket-dir/istio-cni-kubeconfig")
                .is_file(),
        }
    }
}

/// Polls `check` (Err: give up with that message) until it is true; a minute at most.
pub fn wait_for(what: &str, check: impl FnMut() -> Result<bool, String>) {
    wait_for_or(what, &String::new, check)
}

/// [`wait_for`], with `logs` in the failure message.
pub fn wait_for_or(
    what: &str,
    logs: &dyn Fn() -> String,
    mut check: impl FnMut() -> Result<bool, String>,
) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        match check() {
            Ok(true) => return,
            Ok(false) if std::time::Instant::now() < deadline => {}
            Ok(false) => panic!("timed out waiting for {what}\n{}", logs()),
            Err(e) => panic!("waiting for {what}: {e}\n{}", logs()),
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Files podman itself writes into every container's root.
const PODMAN_FILES: &[&str] = &[
    "/etc/hosts",
    "/etc/hostname",
    "/etc/resolv.conf",
    "/run/.containerenv",
];

/// `podman diff` shows nothing but the mount points (created for the mounts) and podman's
/// own files: the container wrote only to its volumes.
pub fn assert_root_unchanged(
    c: &ambit_packaging::podman::Container,
    run: &ambit_packaging::podman::PodmanRun,
) {
    let targets: Vec<&str> = run.mounts.iter().map(|m| m.1.as_str()).collect();
    let allowed = |p: &str| {
        PODMAN_FILES.contains(&p)
            || ["/etc", "/run"].contains(&p)
            || targets
                .iter()
                .any(|t| *t == p || t.starts_with(&format!("{p}/")))
    };
    let changes = c.diff().unwrap();
    let outside: Vec<_> = changes.iter().filter(|ch| !allowed(&ch.path)).collect();
    assert!(
        outside.is_empty(),
        "{} changed its root filesystem outside its mounts: {outside:?}\n{}",
        c.name(),
        c.logs()
    );
}

/// The node's `/proc` for the agent's `/host/proc`: a procfs of a PID namespace whose PID 1
/// (a `sleep`) lives in the node's network namespace, as a node's init lives in the host's.
/// The machine's own /proc will not do: a sandbox may refuse even root its PID 1's
/// `ns/net` (the agent stats `/host/proc/1/ns/net` to tell host processes from pods), and
/// its PID 1 is not in the test's namespace anyway. Unmounted and killed on drop.
pub struct NodeProc {
    child: std::process::Child,
    dir: std::path::PathBuf,
}

impl NodeProc {
    pub fn start(netns: &std::path::Path, dir: &std::path::Path) -> NodeProc {
        std::fs::create_dir_all(dir).unwrap();
        // nsenter, not `ip netns exec`: the mount must land in this mount namespace, where
        // podman sees it.
        let child = std::process::Command::new("nsenter")
            .arg(format!("--net={}", netns.display()))
            .args(["unshare", "--pid", "--fork", "--kill-child", "sh", "-c"])
            .arg(format!(
                "mount -t proc proc '{}' && exec sleep infinity",
                dir.display()
            ))
            .stdin(std::process::Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("nsenter/unshare (util-linux): {e}"));
        let p = NodeProc {
            child,
            dir: dir.to_path_buf(),
        };
        wait_for("the node's /proc", || {
            Ok(std::fs::read_link(p.dir.join("1/exe")).is_ok_and(|e| e.ends_with("sleep")))
        });
        p
    }

    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }
}

impl Drop for NodeProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::process::Command::new("umount")
            .arg("--lazy")
            .arg(&self.dir)
            .status();
    }
}
