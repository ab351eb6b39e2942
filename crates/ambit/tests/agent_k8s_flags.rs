//! `ambit agent` in Kubernetes mode is configured from istio-cni's environment: a flag of
//! the agent without Kubernetes is refused by name, with the variable that applies
//! instead, and a non-zero exit before anything is created or bound. With ambient mode
//! off, the agent says at start that no pod will be captured.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// A scratch directory with a kubeconfig for an API server that is not there (Kubernetes
/// mode only needs one to exist; nothing here gets as far as calling it); removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let dir =
            std::env::temp_dir().join(format!("ambit-k8s-flags-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("kubeconfig"),
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:1\n    insecure-skip-tls-verify: true\nusers:\n- name: u\n  user:\n    token: t\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\n",
        )
        .unwrap();
        Scratch(dir)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    /// `ambit agent --kubeconfig <kubeconfig> args...` with istio-cni's environment
    /// pointing into the scratch directory, plus `env`.
    fn agent(&self, args: &[&str], env: &[(&str, &str)]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_ambit"));
        cmd.arg("agent")
            .arg("--kubeconfig")
            .arg(self.path("kubeconfig"))
            .args(args)
            .env_clear()
            .env("NODE_NAME", "node-1")
            .env("CNI_AGENT_RUN_DIR", self.path("run"))
            .env("ZTUNNEL_UDS_ADDRESS", self.path("ztunnel/ztunnel.sock"))
            .env("MONITORING_PORT", "0")
            .envs(env.iter().copied())
            .stdin(Stdio::null());
        cmd
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn exists(p: &Path) -> bool {
    std::fs::symlink_metadata(p).is_ok()
}

/// Arguments, environment, the flag named, the variable named instead.
type Case<'a> = (Vec<&'a str>, Vec<(&'a str, &'a str)>, &'a str, &'a str);

#[test]
fn kubernetes_mode_refuses_the_flags_that_do_not_apply() {
    let s = Scratch::new("refuse");
    let other = s.path("elsewhere");
    let other = other.to_str().unwrap();
    let cases: Vec<Case> = vec![
        (
            vec!["--zds-socket", other],
            vec![],
            "--zds-socket",
            "ZTUNNEL_UDS_ADDRESS",
        ),
        (
            vec![],
            vec![("INPOD_UDS", other)],
            "INPOD_UDS",
            "ZTUNNEL_UDS_ADDRESS",
        ),
        (
            vec!["--state-dir", other],
            vec![],
            "--state-dir",
            "CNI_AGENT_RUN_DIR",
        ),
        (vec!["--ipv6", "false"], vec![], "--ipv6", "AMBIENT_IPV6"),
        (
            vec!["--dns-capture=false"],
            vec![],
            "--dns-capture",
            "AMBIENT_DNS_CAPTURE",
        ),
        (
            vec!["--events-socket", other],
            vec![],
            "--events-socket",
            "CNI_AGENT_RUN_DIR",
        ),
    ];
    for (args, env, flag, instead) in cases {
        let out = s
            .agent(&args, &env)
            .env("AMBIENT_ENABLED", "true")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        let what = format!("{args:?} {env:?}");
        assert_eq!(out.status.code(), Some(1), "{what}: {stderr}");
        assert!(
            stderr.contains(flag)
                && stderr.contains("does not apply in Kubernetes mode")
                && stderr.contains(instead),
            "{what}: {stderr}"
        );
        // Refused before anything was made.
        for made in ["run", "ztunnel", "elsewhere"] {
            assert!(!exists(&s.path(made)), "{what}: {made} was created");
        }
    }
}

#[test]
fn ambient_mode_off_says_no_pod_will_be_captured() {
    let s = Scratch::new("off");
    let mut child = s
        .agent(&[], &[])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut seen = Vec::new();
    let warned = loop {
        match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(line) if line.contains("AMBIENT_ENABLED") => break Some(line),
            Ok(line) => seen.push(line),
            Err(_) => break None,
        }
    };
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = child.wait();
    let line = warned.unwrap_or_else(|| panic!("no AMBIENT_ENABLED warning; logged: {seen:?}"));
    assert!(
        line.contains("\twarn\t") && line.contains("no pod will be captured"),
        "{line}"
    );
}
