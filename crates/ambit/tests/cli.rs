//! The binary's start-up contract: bad configuration is a clear error naming what was
//! wrong and where, with a non-zero exit, before anything is bound.

use std::process::Command;

fn ztunnel(env: &[(&str, &str)]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ambit"))
        .arg("ztunnel")
        .env_clear()
        .envs(env.iter().copied())
        .output()
        .expect("run ambit");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status.code().unwrap_or(-1), stderr)
}

#[test]
fn invalid_environment_names_the_variable() {
    let (code, err) = ztunnel(&[
        ("PROXY_MODE", "dedicated"),
        ("PROXY_WORKLOAD_INFO", "default/client/client"),
        ("LOCAL_XDS", "{}"),
        ("HTTP2_FRAME_SIZE", "12"),
    ]);
    assert_ne!(code, 0);
    assert!(
        err.contains("HTTP2_FRAME_SIZE=\"12\" is not valid"),
        "{err}"
    );
    assert!(err.contains("16384 to 16777215"), "{err}");
}

/// A value that is not UTF-8 is refused by name in a variable we read (a path must not
/// silently become another), and ignored in any other; it never panics the binary.
#[test]
fn non_utf8_environment_values_are_named_not_fatal() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let not_utf8 = OsStr::from_bytes(b"/etc/mesh\xff.yaml");
    for var in ["PROXY_MODE", "LOCAL_XDS_PATH"] {
        let out = Command::new(env!("CARGO_BIN_EXE_ambit"))
            .arg("ztunnel")
            .env_clear()
            .env("UNRELATED", not_utf8)
            .env(var, not_utf8)
            .output()
            .expect("run ambit");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{var}: {stderr}");
        assert!(
            stderr.contains(&format!(
                "{var}=\"(not UTF-8)\" is not valid: expected a UTF-8 value"
            )),
            "{var}: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

/// Runs the node proxy the way Istio's chart runs ztunnel's image (`proxy ztunnel`, or no
/// argument when installed as `ztunnel`): an empty environment must reach the node
/// proxy's configuration check, not a command-line error.
#[test]
fn ztunnel_command_lines_run_the_node_proxy() {
    let dir = std::env::temp_dir().join(format!("ambit-cli-ztunnel-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let as_ztunnel = dir.join("ztunnel");
    let _ = std::fs::remove_file(&as_ztunnel);
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_ambit"), &as_ztunnel).unwrap();
    let ambit = std::path::PathBuf::from(env!("CARGO_BIN_EXE_ambit"));
    let runs: [(&std::path::Path, &[&str]); 4] = [
        (&ambit, &["proxy", "ztunnel"]),
        (&ambit, &["proxy"]),
        (&as_ztunnel, &["proxy", "ztunnel"]),
        (&as_ztunnel, &[]),
    ];
    for (program, args) in runs {
        let out = Command::new(program)
            .args(args)
            .env_clear()
            .output()
            .expect("run the binary");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{program:?} {args:?}: {stderr}");
        // With no local config ztunnel's default xDS server applies; shared mode then
        // needs the node name.
        assert!(
            stderr.contains("NODE_NAME is required when PROXY_MODE=shared"),
            "{program:?} {args:?}: {stderr}"
        );
    }
    let other = Command::new(&ambit)
        .args(["proxy", "router"])
        .env_clear()
        .output()
        .unwrap();
    assert_ne!(other.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&other.stderr).contains("invalid value 'router'"));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bad_local_config_names_file_position_and_field() {
    let dir = std::env::temp_dir().join(format!("ambit-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("mesh.yaml");
    std::fs::write(
        &path,
        "workloads:\n- name: client\n  namespace: default\n  workloadIps: [\"10.0.0.1\"]\n  protocol: HBONEE\n",
    )
    .unwrap();
    let (code, err) = ztunnel(&[
        ("PROXY_MODE", "dedicated"),
        ("PROXY_WORKLOAD_INFO", "default/client/default"),
        ("LOCAL_XDS_PATH", path.to_str().unwrap()),
        // Ports that would fail to bind if start-up got that far.
        ("AMBIT_ADMIN_ADDR", "127.0.0.1:1"),
    ]);
    std::fs::remove_dir_all(&dir).ok();
    assert_ne!(code, 0);
    assert!(err.contains("mesh.yaml"), "{err}");
    assert!(err.contains("line 5"), "{err}");
    assert!(err.contains("workloads[0].protocol"), "{err}");
    assert!(err.contains("HBONEE"), "{err}");
}

#[test]
fn dangling_policy_reference_names_its_line_and_column() {
    let (code, err) = ztunnel(&[
        ("PROXY_MODE", "dedicated"),
        ("PROXY_WORKLOAD_INFO", "default/client/default"),
        (
            "LOCAL_XDS",
            "workloads:\n- name: client\n  namespace: default\n  authorizationPolicies: [default/nope]\n",
        ),
        ("AMBIT_ADMIN_ADDR", "127.0.0.1:1"),
    ]);
    assert_ne!(code, 0);
    assert!(
        err.contains("LOCAL_XDS: line 4, column 27: workloads[0].authorizationPolicies[0]"),
        "{err}"
    );
}

#[test]
fn ca_key_readable_by_others_is_refused_at_start() {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("ambit-cli-ca-{}", std::process::id()));
    ambit_identity::CertificateAuthority::ephemeral("cluster.local")
        .unwrap()
        .write_plugin_dir(&dir)
        .unwrap();
    let key = dir.join(ambit_identity::ca::CA_KEY_FILE);
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (code, err) = ztunnel(&[
        ("PROXY_MODE", "dedicated"),
        ("PROXY_WORKLOAD_INFO", "default/client/default"),
        (
            "LOCAL_XDS",
            "workloads:\n- {name: client, namespace: default, workloadIps: [\"127.0.0.1\"]}\n",
        ),
        ("LOCAL_CA_DIR", dir.to_str().unwrap()),
        ("AMBIT_ADMIN_ADDR", "127.0.0.1:1"),
    ]);
    std::fs::remove_dir_all(&dir).ok();
    assert_ne!(code, 0);
    assert!(
        err.contains(&format!("{} has mode 0644", key.display())),
        "{err}"
    );
    assert!(
        err.contains(&format!("chmod 600 {}", key.display())),
        "{err}"
    );
}

#[test]
fn a_ca_root_that_cannot_be_used_is_refused_at_start() {
    let base = [
        ("PROXY_MODE", "dedicated"),
        ("PROXY_WORKLOAD_INFO", "default/client/default"),
        (
            "LOCAL_XDS",
            "workloads:\n- {name: client, namespace: default, workloadIps: [\"127.0.0.1\"]}\n",
        ),
        ("CA_ADDRESS", "127.0.0.1:15012"),
        ("AMBIT_ADMIN_ADDR", "127.0.0.1:1"),
    ];
    // Unset CA_ROOT_CA: the chart's root file, absent here.
    let (code, err) = ztunnel(&base);
    assert_ne!(code, 0);
    assert!(
        err.contains("the CA channel to https://127.0.0.1:15012"),
        "{err}"
    );
    assert!(err.contains("root-cert.pem"), "{err}");
    let mut bad = base.to_vec();
    bad.push(("CA_ROOT_CA", "not a certificate"));
    let (code, err) = ztunnel(&bad);
    assert_ne!(code, 0);
    assert!(err.contains("CA_ROOT_CA"), "{err}");
}

#[test]
fn unknown_workload_in_proxy_workload_info_is_refused() {
    let (code, err) = ztunnel(&[
        ("PROXY_MODE", "dedicated"),
        ("PROXY_WORKLOAD_INFO", "default/ghost/ghost"),
        ("LOCAL_XDS", "workloads: []"),
    ]);
    assert_ne!(code, 0);
    assert!(
        err.contains("default/ghost/ghost matches no workload"),
        "{err}"
    );
}

/// The xDS variables reach the client: a root that is no PEM stops start-up, naming the
/// server; and under xDS a `PROXY_WORKLOAD_INFO` not (yet) known is not refused at start.
#[test]
fn xds_settings_are_read_and_checked_at_start() {
    let (code, err) = ztunnel(&[
        ("PROXY_MODE", "dedicated"),
        ("PROXY_WORKLOAD_INFO", "default/ghost/ghost"),
        ("LOCAL_XDS", "workloads: []"),
        ("XDS_ADDRESS", "localhost:1"),
        ("XDS_ROOT_CA", "not a certificate"),
        ("AMBIT_ADMIN_ADDR", "127.0.0.1:0"),
        ("AMBIT_STATS_ADDR", "127.0.0.1:0"),
        ("AMBIT_READINESS_ADDR", "127.0.0.1:0"),
    ]);
    assert_ne!(code, 0);
    assert!(err.contains("XDS_ADDRESS=https://localhost:1"), "{err}");
    assert!(err.contains("root certificate"), "{err}");
    assert!(!err.contains("matches no workload"), "{err}");
}

#[test]
fn version_and_help() {
    let out = Command::new(env!("CARGO_BIN_EXE_ambit"))
        .arg("version")
        .output()
        .unwrap();
    assert!(out.status.success());
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        printed.starts_with(&format!(
            "version.BuildInfo{{Version:\"{}\", GitRevision:",
            env!("CARGO_PKG_VERSION")
        )),
        "{printed}"
    );
    let help = Command::new(env!("CARGO_BIN_EXE_ambit"))
        .arg("--help")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&help.stdout);
    for sub in ["ztunnel", "demo", "version"] {
        assert!(text.contains(sub), "{text}");
    }
}

/// The binary acts as the CNI plugin when called `ambit-cni`, as runtimes do.
fn cni(command: &str, stdin: &str) -> (i32, String) {
    use std::io::Write;
    let dir = std::env::temp_dir().join(format!("ambit-cni-{}-{command}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let plugin = dir.join("ambit-cni");
    let _ = std::fs::remove_file(&plugin);
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_ambit"), &plugin).unwrap();
    let mut child = Command::new(&plugin)
        .env_clear()
        .env("CNI_COMMAND", command)
        .env("CNI_CONTAINERID", "c1")
        .env("CNI_NETNS", "/var/run/netns/none")
        .env("CNI_IFNAME", "eth0")
        .env("CNI_ARGS", "K8S_POD_NAMESPACE=default;K8S_POD_NAME=web")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    std::fs::remove_dir_all(&dir).ok();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn cni_plugin_answers_bad_json_with_a_cni_error() {
    let (code, stdout) = cni("ADD", "{not json");
    assert_ne!(code, 0);
    let err: serde_json::Value = serde_json::from_str(&stdout).expect("a JSON error result");
    assert!(err["code"].as_u64().is_some(), "{stdout}");
    assert!(err["msg"].as_str().unwrap().contains("JSON"), "{stdout}");
}

#[test]
fn cni_plugin_add_fails_closed_when_the_agent_is_unreachable() {
    let conf = r#"{"cniVersion":"1.0.0","name":"net","type":"ambit-cni",
        "agent_socket":"/nonexistent/ambit-cni.sock",
        "prevResult":{"cniVersion":"1.0.0","ips":[{"address":"10.1.0.5/24"}]}}"#;
    let (code, stdout) = cni("ADD", conf);
    assert_ne!(code, 0, "{stdout}");
    let err: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(err["code"], 11, "{stdout}");
    assert!(
        err["msg"]
            .as_str()
            .unwrap_or_default()
            .contains("/nonexistent/ambit-cni.sock")
            || err["details"]
                .as_str()
                .unwrap_or_default()
                .contains("/nonexistent/ambit-cni.sock"),
        "{stdout}"
    );
    let (code, version) = cni("VERSION", "");
    assert_eq!(code, 0);
    assert!(version.contains("1.0.0"));
}
