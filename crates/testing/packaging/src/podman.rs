//! Running the images with podman as the kubelet would run the charts' containers.
//!
//! What makes podman work in a sandbox without systemd or a container engine: vfs storage
//! in a private root (no overlay mounts), `--cgroup-manager=cgroupfs`,
//! `--events-backend=file` (no journald), `--network ns:<path>` into a namespace the test
//! made (no CNI networks), and explicit `--ulimit`s no higher than this process's hard
//! limits: podman's defaults (nofile 1048576 and more) need CAP_SYS_RESOURCE, which a
//! sandbox may not grant, and runc fails with "error setting rlimits".

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::spec::{ContainerSpec, EnvSource, VolumeSource};
use crate::{run, Error, Result};

/// podman with a private store.
#[derive(Debug, Clone)]
pub struct Podman {
    root: PathBuf,
    runroot: PathBuf,
}

impl Podman {
    /// A store under `root`. Its run directory lives in /tmp (podman wants a path under 50
    /// characters), named after `root`.
    pub fn new(root: &Path) -> Result<Self> {
        std::fs::create_dir_all(root)?;
        let root = root.canonicalize()?;
        let mut h = std::collections::hash_map::DefaultHasher::new();
        root.hash(&mut h);
        let runroot = PathBuf::from(format!("/tmp/ambit-podman-{:016x}", h.finish()));
        std::fs::create_dir_all(&runroot)?;
        Ok(Podman { root, runroot })
    }

    /// Forgets every image and container of this store, on disk.
    pub fn reset(root: &Path) -> Result<Self> {
        if root.exists() {
            let old = Podman::new(root)?;
            // Containers that outlived a killed test would hold the store.
            let _ = old.command().args(["rm", "--all", "--force"]).output();
            std::fs::remove_dir_all(&old.runroot)?;
            std::fs::remove_dir_all(&old.root)?;
        }
        Podman::new(root)
    }

    /// `podman` with this store's global flags.
    pub fn command(&self) -> Command {
        let mut c = Command::new("podman");
        c.arg("--root")
            .arg(&self.root)
            .arg("--runroot")
            .arg(&self.runroot)
            .args([
                "--storage-driver=vfs",
                "--cgroup-manager=cgroupfs",
                "--events-backend=file",
            ]);
        c
    }

    /// `podman load` of an OCI archive; returns the image names it loaded.
    pub fn load(&self, archive: &Path) -> Result<Vec<String>> {
        let out = run(
            &format!("podman load -i {}", archive.display()),
            self.command().arg("load").arg("-i").arg(archive),
        )?;
        let text = String::from_utf8_lossy(&out.stdout);
        let names: Vec<String> = text
            .lines()
            .filter_map(|l| l.split_once("Loaded image").map(|(_, rest)| rest))
            .filter_map(|rest| rest.split_once(':').map(|(_, n)| n.trim()))
            .flat_map(|n| n.split(',').map(|s| s.trim().to_string()))
            .filter(|n| !n.is_empty())
            .collect();
        if names.is_empty() {
            return Err(Error::Output {
                what: "podman load".into(),
                detail: format!("no \"Loaded image\" line in {text:?}"),
            });
        }
        Ok(names)
    }
}

/// The values the kubelet would give a pod's downward-API env fields.
#[derive(Debug, Clone)]
pub struct PodIdentity {
    pub name: String,
    pub namespace: String,
    pub node_name: String,
    pub pod_ip: String,
    pub service_account: String,
}

impl Default for PodIdentity {
    fn default() -> Self {
        PodIdentity {
            name: "test-pod".into(),
            namespace: crate::chart::NAMESPACE.into(),
            node_name: "test-node".into(),
            pod_ip: "127.0.0.1".into(),
            service_account: "test".into(),
        }
    }
}

/// One `podman run` of a rendered container: its capabilities, user, read-only root,
/// environment (downward API and `envFrom` ConfigMaps resolved) and mounts, with each
/// hostPath/emptyDir/configMap/projected volume backed by a directory under `host_root`.
#[derive(Debug, Clone)]
pub struct PodmanRun {
    pub image: String,
    pub cap_add: Vec<String>,
    pub cap_drop: Vec<String>,
    pub user: Option<String>,
    pub read_only: bool,
    pub privileged: bool,
    pub no_new_privileges: bool,
    /// (host directory, container path, read-only, propagation)
    pub mounts: Vec<(PathBuf, String, bool, Option<String>)>,
    /// Each volume's host directory.
    pub volume_dirs: BTreeMap<String, PathBuf>,
    pub env: Vec<(String, String)>,
    pub network_ns: Option<PathBuf>,
    pub entrypoint: Option<Vec<String>>,
    pub args: Vec<String>,
    pub name: Option<String>,
}

impl PodmanRun {
    /// `image` with nothing added: the image's own user, entrypoint and arguments, a
    /// writable root, podman's default capabilities, no mounts, no network. For a pod no
    /// chart renders (a waypoint's, say): set the fields as its pod spec would.
    pub fn new(image: &str) -> Self {
        PodmanRun {
            image: image.to_string(),
            cap_add: Vec::new(),
            cap_drop: Vec::new(),
            user: None,
            read_only: false,
            privileged: false,
            no_new_privileges: false,
            mounts: Vec::new(),
            volume_dirs: BTreeMap::new(),
            env: Vec::new(),
            network_ns: None,
            entrypoint: None,
            args: Vec::new(),
            name: None,
        }
    }

    /// The container `spec` on `image`. `config_maps` holds the data of the ConfigMaps
    /// `envFrom` names (each must be there); a volume's directory is created as
    /// `host_root/<volume>`.
    pub fn from_spec(
        spec: &ContainerSpec,
        image: &str,
        config_maps: &BTreeMap<String, BTreeMap<String, String>>,
        pod: &PodIdentity,
        host_root: &Path,
    ) -> Result<Self> {
        let mut env = Vec::new();
        for cm in &spec.env_from {
            let data = config_maps
                .get(cm)
                .ok_or_else(|| Error::Spec(format!("envFrom names ConfigMap {cm}, not given")))?;
            env.extend(data.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        for (key, source) in &spec.env {
            let value = match source {
                EnvSource::Value(v) => v.clone(),
                EnvSource::Field(f) => match f.as_str() {
                    "metadata.name" => pod.name.clone(),
                    "metadata.namespace" => pod.namespace.clone(),
                    "spec.nodeName" => pod.node_name.clone(),
                    "status.podIP" => pod.pod_ip.clone(),
                    "spec.serviceAccountName" => pod.service_account.clone(),
                    other => {
                        return Err(Error::Spec(format!(
                            "env {key}: field {other} not modelled"
                        )))
                    }
                },
                // No limits: the kubelet gives the node's allocatable; leave it unset.
                EnvSource::Resource(_) => continue,
            };
            // A later entry wins, as in Kubernetes (env over envFrom).
            env.retain(|(k, _)| k != key);
            env.push((key.clone(), value));
        }
        let mut mounts = Vec::new();
        let mut volume_dirs = BTreeMap::new();
        for m in &spec.mounts {
            let dir = host_root.join(&m.volume);
            std::fs::create_dir_all(&dir)?;
            // ConfigMaps and projections are read-only in Kubernetes.
            let ro = m.read_only
                || matches!(
                    m.source,
                    VolumeSource::ConfigMap(_) | VolumeSource::Projected
                );
            mounts.push((dir.clone(), m.path.clone(), ro, m.propagation.clone()));
            volume_dirs.insert(m.volume.clone(), dir);
        }
        let user = match (spec.run_as_user, spec.run_as_group) {
            (Some(u), Some(g)) => Some(format!("{u}:{g}")),
            (Some(u), None) => Some(u.to_string()),
            (None, Some(g)) => Some(format!("0:{g}")),
            (None, None) => None,
        };
        let entrypoint = (!spec.command.is_empty()).then(|| spec.command.clone());
        Ok(PodmanRun {
            image: image.to_string(),
            cap_add: spec.cap_add.clone(),
            cap_drop: spec.cap_drop.clone(),
            user,
            read_only: spec.read_only_root,
            privileged: spec.privileged,
            no_new_privileges: spec.allow_privilege_escalation == Some(false),
            mounts,
            volume_dirs,
            env,
            network_ns: None,
            entrypoint,
            args: spec.args.clone(),
            name: None,
        })
    }

    /// Runs in this network namespace (`--network ns:<path>`).
    pub fn network_ns(mut self, path: &Path) -> Self {
        self.network_ns = Some(path.to_path_buf());
        self
    }

    /// Replaces the command (Kubernetes' `command`, the image's ENTRYPOINT).
    pub fn entrypoint(mut self, argv: &[&str]) -> Self {
        self.entrypoint = Some(argv.iter().map(|s| s.to_string()).collect());
        self
    }

    /// Replaces the arguments (Kubernetes' `args`).
    pub fn args(mut self, args: &[&str]) -> Self {
        self.args = args.iter().map(|s| s.to_string()).collect();
        self
    }

    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.retain(|(k, _)| k != key);
        self.env.push((key.to_string(), value.to_string()));
        self
    }

    /// Names the container (`--name`).
    pub fn name(mut self, name: &str) -> Self {
        self.name = Some(name.to_string());
        self
    }

    /// Backs `volume` with `host` instead of its directory under the host root (the real
    /// `/proc` for a hostPath `/proc`, say). Its mounts keep their paths and modes.
    pub fn volume_dir(mut self, volume: &str, host: &Path) -> Result<Self> {
        let old = self
            .volume_dirs
            .get(volume)
            .cloned()
            .ok_or_else(|| Error::Spec(format!("the container mounts no volume {volume}")))?;
        for m in &mut self.mounts {
            if m.0 == old {
                m.0 = host.to_path_buf();
            }
        }
        self.volume_dirs
            .insert(volume.to_string(), host.to_path_buf());
        Ok(self)
    }

    /// An extra mount, as the kubelet adds the service account's token directory.
    pub fn mount(mut self, host: &Path, path: &str, read_only: bool) -> Self {
        self.mounts
            .push((host.to_path_buf(), path.to_string(), read_only, None));
        self
    }

    /// `podman run --rm` arguments (after the global flags).
    pub fn run_args(&self) -> Result<Vec<OsString>> {
        self.args_for(&["run", "--rm"])
    }

    fn args_for(&self, head: &[&str]) -> Result<Vec<OsString>> {
        let mut a: Vec<OsString> = head.iter().map(OsString::from).collect();
        if let Some(n) = &self.name {
            a.push(format!("--name={n}").into());
        }
        for (k, v) in ulimits()? {
            a.push(format!("--ulimit={k}={v}:{v}").into());
        }
        for c in &self.cap_drop {
            a.push(format!("--cap-drop={}", c.to_lowercase()).into());
        }
        for c in &self.cap_add {
            a.push(format!("--cap-add={c}").into());
        }
        if let Some(u) = &self.user {
            a.push(format!("--user={u}").into());
            // podman would add the user to the image's /etc/passwd and /etc/group; a
            // kubelet's runtime does not.
            a.push("--passwd=false".into());
        }
        if self.read_only {
            // The kubelet gives a read-only root no writable /tmp, /run or /var/tmp.
            a.push("--read-only".into());
            a.push("--read-only-tmpfs=false".into());
        }
        if self.privileged {
            a.push("--privileged".into());
        }
        if self.no_new_privileges {
            a.push("--security-opt=no-new-privileges".into());
        }
        for (host, path, ro, propagation) in &self.mounts {
            let mut opts = vec![if *ro { "ro" } else { "rw" }.to_string()];
            match propagation.as_deref() {
                Some("HostToContainer") => opts.push("rslave".into()),
                Some("Bidirectional") => opts.push("rshared".into()),
                _ => opts.push("rprivate".into()),
            }
            let mut v = OsString::from("--volume=");
            v.push(host);
            v.push(format!(":{path}:{}", opts.join(",")));
            a.push(v);
        }
        for (k, v) in &self.env {
            a.push(format!("--env={k}={v}").into());
        }
        match &self.network_ns {
            Some(p) => {
                let mut n = OsString::from("--network=ns:");
                n.push(p);
                a.push(n);
            }
            None => a.push("--network=none".into()),
        }
        if let Some(e) = &self.entrypoint {
            let first = e.first().cloned().unwrap_or_default();
            a.push(format!("--entrypoint={first}").into());
            a.push(self.image.clone().into());
            a.extend(e.iter().skip(1).map(OsString::from));
        } else {
            a.push(self.image.clone().into());
        }
        a.extend(self.args.iter().map(OsString::from));
        Ok(a)
    }

    /// Runs to completion; the output whatever the exit status.
    pub fn output(&self, podman: &Podman) -> Result<Output> {
        let args = self.run_args()?;
        podman
            .command()
            .args(&args)
            .output()
            .map_err(|source| Error::Spawn {
                what: "podman run".into(),
                source,
            })
    }
}

impl PodmanRun {
    /// Starts the container in the background (`podman run --detach`, kept after it exits
    /// so its logs and filesystem changes can be read). It needs a name; the returned
    /// handle removes the container when dropped.
    pub fn start(&self, podman: &Podman) -> Result<Container> {
        let name = self
            .name
            .clone()
            .ok_or_else(|| Error::Spec("a detached container needs a name".into()))?;
        // A container of that name left by a killed run would make `run` fail.
        let _ = podman.command().args(["rm", "--force", &name]).output();
        let args = self.args_for(&["run", "--detach"])?;
        run(
            &format!("podman run --detach --name={name}"),
            podman.command().args(&args),
        )?;
        Ok(Container {
            podman: podman.clone(),
            name,
        })
    }
}

/// A container started with [`PodmanRun::start`]; removed (`podman rm --force`) on drop.
#[derive(Debug)]
pub struct Container {
    podman: Podman,
    name: String,
}

/// One line of `podman diff`: what happened to a path of the container's root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// `A` added, `C` changed, `D` deleted.
    pub kind: char,
    pub path: String,
}

impl Container {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `podman stop`: the stop signal (SIGTERM), then SIGKILL after `grace_secs`.
    pub fn stop(&self, grace_secs: u32) -> Result<()> {
        run(
            &format!("podman stop {}", self.name),
            self.podman
                .command()
                .args(["stop", &format!("--time={grace_secs}"), &self.name]),
        )?;
        Ok(())
    }

    /// Whether it runs, and its exit code once it stopped.
    pub fn state(&self) -> Result<(bool, i64)> {
        let out = run(
            &format!("podman inspect {}", self.name),
            self.podman.command().args([
                "inspect",
                "--format={{.State.Running}} {{.State.ExitCode}}",
                &self.name,
            ]),
        )?;
        let text = String::from_utf8_lossy(&out.stdout);
        let mut f = text.split_whitespace();
        match (f.next(), f.next().and_then(|c| c.parse().ok())) {
            (Some(r), Some(code)) => Ok((r == "true", code)),
            _ => Err(Error::Output {
                what: "podman inspect".into(),
                detail: format!("not \"<running> <exit code>\": {text:?}"),
            }),
        }
    }

    /// Its first process's id on the host (0 once it stopped).
    pub fn pid(&self) -> Result<u32> {
        let out = run(
            &format!("podman inspect {}", self.name),
            self.podman
                .command()
                .args(["inspect", "--format={{.State.Pid}}", &self.name]),
        )?;
        let text = String::from_utf8_lossy(&out.stdout);
        text.trim().parse().map_err(|_| Error::Output {
            what: "podman inspect".into(),
            detail: format!("not a process id: {text:?}"),
        })
    }

    /// Its stdout and stderr so far, interleaved.
    pub fn logs(&self) -> String {
        match self.podman.command().args(["logs", &self.name]).output() {
            Ok(o) => format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            ),
            Err(e) => format!("(podman logs {}: {e})", self.name),
        }
    }

    /// `podman diff`: what changed in its root filesystem (mounts are not part of it).
    pub fn diff(&self) -> Result<Vec<Change>> {
        let out = run(
            &format!("podman diff {}", self.name),
            self.podman.command().args(["diff", &self.name]),
        )?;
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                let mut chars = l.chars();
                match (chars.next(), chars.next()) {
                    (Some(kind @ ('A' | 'C' | 'D')), Some(' ')) => Ok(Change {
                        kind,
                        path: l[2..].to_string(),
                    }),
                    _ => Err(Error::Output {
                        what: "podman diff".into(),
                        detail: format!("a line we cannot read: {l:?}"),
                    }),
                }
            })
            .collect()
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = self
            .podman
            .command()
            .args(["rm", "--force", "--time=0", &self.name])
            .output();
    }
}

/// `nofile` and `nproc` no higher than this process's hard limits (and the kernel's
/// pid_max, to which the runtime clamps nproc).
fn ulimits() -> Result<Vec<(&'static str, u64)>> {
    let limits = std::fs::read_to_string("/proc/self/limits")?;
    let hard = |label: &str| -> Option<u64> {
        let line = limits.lines().find(|l| l.starts_with(label))?;
        let fields: Vec<&str> = line[label.len()..].split_whitespace().collect();
        match fields.get(1) {
            Some(&"unlimited") => Some(u64::MAX),
            Some(v) => v.parse().ok(),
            None => None,
        }
    };
    let pid_max: u64 = std::fs::read_to_string("/proc/sys/kernel/pid_max")?
        .trim()
        .parse()
        .map_err(|_| Error::Spec("/proc/sys/kernel/pid_max is not a number".into()))?;
    let nofile = hard("Max open files").unwrap_or(1024).min(1 << 20);
    let nproc = hard("Max processes").unwrap_or(4096).min(pid_max);
    Ok(vec![("nofile", nofile), ("nproc", nproc)])
}
