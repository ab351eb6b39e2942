//! `--help` and `-h` print the usage and exit 0 for every command and for every name the
//! binary answers to (the multi-call names are symlinks to it, as images install them).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A directory of symlinks to the binary under its multi-call names; removed on drop.
struct Names(PathBuf);

impl Names {
    fn new(tag: &str) -> Names {
        let dir = std::env::temp_dir().join(format!("ambit-help-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for name in [
            "ztunnel",
            "waypoint",
            "install-cni",
            "istio-cni",
            "ambit-cni",
        ] {
            std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_ambit"), dir.join(name)).unwrap();
        }
        Names(dir)
    }

    fn path(&self, name: &str) -> PathBuf {
        match name {
            "ambit" => PathBuf::from(env!("CARGO_BIN_EXE_ambit")),
            other => self.0.join(other),
        }
    }
}

impl Drop for Names {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs `program args...` with an empty environment and no stdin: (exit code, stdout,
/// stderr).
fn run(program: &Path, args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let out = Command::new(program)
        .args(args)
        .env_clear()
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", program.display()));
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn every_command_and_name_prints_its_usage_on_help() {
    let names = Names::new("usage");
    let mut cases: Vec<(&str, Vec<&str>, &str)> = vec![
        ("ambit", vec![], "Usage: ambit <COMMAND>"),
        ("ambit", vec!["ztunnel"], "Usage: ambit ztunnel"),
        ("ambit", vec!["proxy"], "Usage: ambit proxy"),
        ("ambit", vec!["agent"], "Usage: ambit agent"),
        (
            "ambit",
            vec!["agent", "enroll"],
            "Usage: ambit agent enroll",
        ),
        ("ambit", vec!["control"], "Usage: ambit control"),
        ("ambit", vec!["version"], "Usage: ambit version"),
        ("ambit", vec!["waypoint"], "Usage: ambit waypoint"),
        ("ztunnel", vec![], "no argument: run the node proxy"),
        ("waypoint", vec![], "no argument: run the waypoint"),
        ("ztunnel", vec!["proxy"], "Usage: ztunnel proxy"),
        (
            "install-cni",
            vec![],
            "Usage: install-cni [--log_output_level",
        ),
        ("istio-cni", vec![], "istio-cni < <network config>"),
        ("ambit-cni", vec![], "ambit-cni < <network config>"),
    ];
    if cfg!(feature = "demo") {
        cases.push(("ambit", vec!["demo"], "Usage: ambit demo"));
    }
    for (name, command, usage) in cases {
        for help in ["--help", "-h"] {
            let mut args = command.clone();
            args.push(help);
            let (code, stdout, stderr) = run(&names.path(name), &args, &[]);
            let what = format!("{name} {}", args.join(" "));
            assert_eq!(code, Some(0), "{what}: {stderr}{stdout}");
            assert!(stdout.contains(usage), "{what} printed:\n{stdout}");
            assert!(stderr.is_empty(), "{what}: {stderr}");
        }
    }
}

/// A runtime's call is never taken for a person's: with CNI_COMMAND set, the plugin speaks
/// CNI whatever its arguments.
#[test]
fn the_cni_plugin_speaks_cni_when_a_runtime_calls_it() {
    let names = Names::new("cni");
    for name in ["istio-cni", "ambit-cni"] {
        let (code, stdout, stderr) = run(
            &names.path(name),
            &["--help"],
            &[("CNI_COMMAND", "VERSION")],
        );
        assert_eq!(code, Some(0), "{name}: {stderr}");
        let v: serde_json::Value = serde_json::from_str(&stdout).expect("a VERSION answer");
        assert!(v["supportedVersions"].is_array(), "{name}: {stdout}");
    }
}

/// `install-cni` names a flag it does not know as it was written (`-x` used to be
/// reported as `--x`), and says where the usage is.
#[test]
fn install_cni_names_an_unknown_flag_as_written() {
    let names = Names::new("unknown");
    let (code, _, stderr) = run(&names.path("install-cni"), &["-x"], &[]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("unknown flag \"-x\"") && stderr.contains("--help"),
        "{stderr}"
    );
}

/// The waypoint refuses to start without the variables that name it, saying which, with
/// exit status 2 (a configuration that does not hold), under each name it answers to.
#[test]
fn the_waypoint_names_a_missing_variable() {
    let names = Names::new("waypoint-env");
    let cases: [(&str, &[&str]); 4] = [
        ("ambit", &["waypoint"]),
        ("ambit", &["proxy", "waypoint"]),
        // As Istio's waypoint template runs its image: pilot-agent's flags are ignored.
        (
            "ambit",
            &[
                "proxy",
                "waypoint",
                "--domain",
                "shop.svc.cluster.local",
                "--proxyLogLevel=warning",
            ],
        ),
        ("waypoint", &[]),
    ];
    for (name, args) in cases {
        let (code, _, stderr) = run(&names.path(name), args, &[]);
        assert_eq!(code, Some(2), "{name} {args:?}: {stderr}");
        assert!(
            stderr.contains("POD_NAMESPACE"),
            "{name} {args:?}: {stderr}"
        );
    }
}
