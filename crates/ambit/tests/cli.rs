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

#[test]
fn version_and_help() {
    let out = Command::new(env!("CARGO_BIN_EXE_ambit"))
        .arg("version")
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("ambit "));
    let help = Command::new(env!("CARGO_BIN_EXE_ambit"))
        .arg("--help")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&help.stdout);
    for sub in ["ztunnel", "demo", "version"] {
        assert!(text.contains(sub), "{text}");
    }
}
