//! The images `scripts/images` builds: what is in them, and that they run under the
//! rendered DaemonSets' security settings (capabilities, user, read-only root, hostPath
//! mounts) with podman, in a network namespace the test makes and deletes; the waypoint's
//! (no chart renders it) as a waypoint pod runs, against `ambit control` as istiod.
//!
//! Needs root, umoci, podman and runc (scripts/tools.sh's IMAGE_TOOLS), and the ambit
//! binary built (`cargo build -p ambit`, or AMBIT_BIN).

mod waypoint_pod;

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::OnceLock;

use ambit_packaging::chart::Render;
use ambit_packaging::image::{self, Entry, Images};
use ambit_packaging::netns::TestNetns;
use ambit_packaging::podman::{PodIdentity, Podman, PodmanRun};
use ambit_packaging::spec::ContainerSpec;
use serde_json::{json, Value};

const TAG: &str = "0.1.0";

struct Fixture {
    images: Images,
    podman: Podman,
    dir: PathBuf,
    /// The binary the images hold (it also runs `ambit control` beside them).
    ambit: PathBuf,
}

/// The images, built once per test process and loaded into a private podman store under
/// target/deploy-tests (replaced on the next run).
fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        ambit_packaging::tools::need("IMAGE_TOOLS").unwrap_or_else(|e| panic!("{e}"));
        let bin = image::ambit_bin().unwrap_or_else(|e| panic!("{e}"));
        let dir = ambit_packaging::workspace().join("target/deploy-tests");
        let podman = Podman::reset(&dir.join("podman")).unwrap_or_else(|e| panic!("{e}"));
        let out = dir.join("images");
        let _ = std::fs::remove_dir_all(&out);
        let images = image::build(&bin, &out, TAG).unwrap_or_else(|e| panic!("{e}"));
        for img in [&images.ztunnel, &images.waypoint, &images.cni] {
            let names = podman.load(&img.archive).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(names, std::slice::from_ref(&img.name));
        }
        Fixture {
            images,
            podman,
            dir,
            ambit: bin,
        }
    })
}

fn top_level(files: &BTreeMap<String, Entry>) -> BTreeSet<String> {
    files
        .keys()
        .map(|p| p.split('/').next().unwrap_or_default().to_string())
        .collect()
}

fn assert_no_shell(files: &BTreeMap<String, Entry>) {
    for sh in [
        "bin/sh",
        "usr/bin/sh",
        "bin/bash",
        "usr/bin/bash",
        "usr/bin/busybox",
    ] {
        assert!(!files.contains_key(sh), "{sh} is in the image");
    }
    assert!(
        !files
            .keys()
            .any(|p| p.starts_with("usr/bin/") || p.starts_with("bin/")),
        "the image has /usr/bin entries: {:?}",
        files
            .keys()
            .filter(|p| p.starts_with("usr/bin/"))
            .collect::<Vec<_>>()
    );
}

const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

#[test]
fn ztunnel_image_holds_the_proxy_its_libraries_and_ca_certificates() {
    let img = &fixture().images.ztunnel;
    let config = img.config().unwrap();
    assert_eq!(config["os"], "linux");
    assert_eq!(config["architecture"], "amd64");
    let c = &config["config"];
    assert_eq!(c["Entrypoint"], json!(["/usr/local/bin/ztunnel"]));
    assert_eq!(c["WorkingDir"], "/");
    assert_eq!(c["Env"], json!([format!("PATH={PATH}")]));
    assert!(c.get("Cmd").is_none_or(Value::is_null), "{c}");
    // No user: the chart sets 0:1337.
    assert!(c.get("User").is_none_or(|u| u == ""), "{c}");

    let files = img.files().unwrap();
    assert_binary_libraries_and_ca_only(&files, "usr/local/bin/ztunnel");
}

/// The image holds `binary` (executable), the loader and libraries it links, the CA bundle
/// behind merged-/usr links, and nothing else: no shell, no other file.
fn assert_binary_libraries_and_ca_only(files: &BTreeMap<String, Entry>, binary: &str) {
    assert_eq!(
        top_level(files),
        ["etc", "lib", "lib64", "usr"].map(String::from).into()
    );
    assert_eq!(files["lib"], Entry::Symlink("usr/lib".into()));
    assert_eq!(files["lib64"], Entry::Symlink("usr/lib64".into()));
    assert!(
        matches!(files[binary], Entry::File { ref mode } if mode.starts_with("-rwx")),
        "{binary}: {:?}",
        files[binary]
    );
    assert!(matches!(
        files["usr/lib64/ld-linux-x86-64.so.2"],
        Entry::File { .. }
    ));
    assert!(matches!(
        files["usr/lib/x86_64-linux-gnu/libc.so.6"],
        Entry::File { .. }
    ));
    assert!(matches!(
        files["etc/ssl/certs/ca-certificates.crt"],
        Entry::File { .. }
    ));
    assert_no_shell(files);
    // Regular files: the binary, its libraries, the CA bundle, nothing else.
    let regular: Vec<&String> = files
        .iter()
        .filter(|(_, e)| matches!(e, Entry::File { .. }))
        .map(|(p, _)| p)
        .collect();
    for p in &regular {
        assert!(
            *p == binary
                || *p == "etc/ssl/certs/ca-certificates.crt"
                || p.starts_with("usr/lib/x86_64-linux-gnu/lib")
                || *p == "usr/lib64/ld-linux-x86-64.so.2",
            "unexpected file {p}"
        );
    }
}

#[test]
fn waypoint_image_holds_the_waypoint_its_libraries_and_ca_certificates() {
    let img = &fixture().images.waypoint;
    let config = img.config().unwrap();
    assert_eq!(config["os"], "linux");
    assert_eq!(config["architecture"], "amd64");
    let c = &config["config"];
    // Run by the name `waypoint`: with no argument, the waypoint.
    assert_eq!(c["Entrypoint"], json!(["/usr/local/bin/waypoint"]));
    assert!(c.get("Cmd").is_none_or(Value::is_null), "{c}");
    assert_eq!(c["WorkingDir"], "/");
    assert_eq!(c["Env"], json!([format!("PATH={PATH}")]));
    // Not root unless a pod spec asks: Istio's proxy user.
    assert_eq!(c["User"], "1337:1337", "{c}");

    let files = img.files().unwrap();
    assert_binary_libraries_and_ca_only(&files, "usr/local/bin/waypoint");
}

#[test]
fn cni_image_holds_the_agent_the_plugin_and_the_netfilter_tools() {
    let img = &fixture().images.cni;
    let config = img.config().unwrap();
    let c = &config["config"];
    assert_eq!(c["Entrypoint"], json!(["install-cni"]));
    assert_eq!(c["WorkingDir"], "/opt/cni/bin");
    assert_eq!(c["Env"], json!([format!("PATH={PATH}:/opt/cni/bin")]));
    assert!(c.get("User").is_none_or(|u| u == ""), "{c}");

    let files = img.files().unwrap();
    assert_eq!(
        top_level(&files),
        ["etc", "lib", "lib64", "opt", "usr"]
            .map(String::from)
            .into()
    );
    // The agent and the plugin are one executable (a hard link), the plugin run by its name.
    let (agent, plugin) = ("usr/local/bin/install-cni", "opt/cni/bin/istio-cni");
    match (&files[agent], &files[plugin]) {
        (Entry::File { mode }, Entry::Link(to)) if to == agent => assert!(mode.starts_with("-rwx")),
        (Entry::Link(to), Entry::File { mode }) if to == plugin => {
            assert!(mode.starts_with("-rwx"))
        }
        other => panic!("{agent} and {plugin}: {other:?}"),
    }
    assert!(matches!(
        files["usr/sbin/xtables-nft-multi"],
        Entry::File { .. }
    ));
    for t in ["iptables", "ip6tables"] {
        for s in ["", "-save", "-restore"] {
            assert_eq!(
                files[&format!("usr/sbin/{t}{s}")],
                Entry::Symlink("xtables-nft-multi".into()),
                "{t}{s}"
            );
        }
    }
    for f in [
        "usr/sbin/ipset",
        "usr/sbin/nft",
        "etc/ssl/certs/ca-certificates.crt",
    ] {
        assert!(matches!(files[f], Entry::File { .. }), "{f}");
    }
    for m in [
        "libxt_mark.so",
        "libxt_tcp.so",
        "libxt_REDIRECT.so",
        "libxt_set.so",
    ] {
        let p = format!("usr/lib/x86_64-linux-gnu/xtables/{m}");
        assert!(matches!(files.get(&p), Some(Entry::File { .. })), "{p}");
    }
    assert_no_shell(&files);
}

/// The rendered DaemonSet's container `name` of `chart` (rendered with `sets`).
fn rendered(
    chart: &str,
    ds: &str,
    container: &str,
    sets: &[(&str, &str)],
) -> (ContainerSpec, BTreeMap<String, BTreeMap<String, String>>) {
    let mut r = Render::new(chart);
    for (k, v) in sets {
        r = r.set(k, v);
    }
    let out = r.run().unwrap_or_else(|e| panic!("{e}"));
    let spec = ContainerSpec::from_daemonset(out.get("DaemonSet", ds).unwrap(), container).unwrap();
    let mut cms = BTreeMap::new();
    if let Some(cm) = out.find("ConfigMap", "istio-cni-config") {
        let name = cm["metadata"]["name"].as_str().unwrap().to_string();
        cms.insert(name.clone(), out.config_map(&name).unwrap());
    }
    (spec, cms)
}

fn host_dirs(name: &str) -> tempfile::TempDir {
    let base = fixture().dir.join("hosts");
    std::fs::create_dir_all(&base).unwrap();
    tempfile::Builder::new()
        .prefix(name)
        .tempdir_in(base)
        .unwrap()
}

#[test]
fn ztunnel_image_runs_under_the_charts_security_settings() {
    let f = fixture();
    let (spec, cms) = rendered(
        "ztunnel",
        "ztunnel",
        "istio-proxy",
        &[("profile", "ambient")],
    );
    assert_eq!(spec.image, f.images.ztunnel.name);
    let hosts = host_dirs("ztunnel");
    let netns = TestNetns::new("ambit-img").unwrap();
    let run = PodmanRun::from_spec(
        &spec,
        &spec.image,
        &cms,
        &PodIdentity::default(),
        hosts.path(),
    )
    .unwrap()
    .network_ns(&netns.path());
    assert_eq!(run.cap_drop, ["ALL"]);
    assert_eq!(run.cap_add, ["NET_ADMIN", "SYS_ADMIN", "NET_RAW"]);
    assert_eq!(run.user.as_deref(), Some("0:1337"));
    assert!(run.read_only);
    let mounted: Vec<&str> = run.mounts.iter().map(|m| m.1.as_str()).collect();
    assert_eq!(
        mounted,
        [
            "/var/run/secrets/istio",
            "/var/run/secrets/tokens",
            "/var/run/ztunnel",
            "/tmp"
        ]
    );
    // `ztunnel version` (the chart's `proxy ztunnel` would start the proxy).
    let out = run.clone().args(&["version"]).output(&f.podman).unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.starts_with("version.BuildInfo{Version:\"0.1.0\""),
        "{stdout}"
    );
}

/// The waypoint image run as istiod's waypoint pod runs, translated from the pod istiod
/// renders: its arguments (`proxy waypoint --domain … --serviceCluster …`), its
/// environment (`CA_ADDR` without a scheme, `PROXY_CONFIG: {}`, `ISTIO_META_*`), the
/// image's own user and entrypoint, no capabilities, no privilege escalation, a read-only
/// root with the pod's emptyDirs; the projected token, istiod's root certificate and the
/// pod's labels mounted read-only where Istio mounts them (found there by default).
/// `ambit control` stands in for istiod (xDS and the CA at `CA_ADDR`) and serves the L7
/// policy on the waypoint's second stream (`AMBIT_CONTROL_ADDRESS`, the one variable of
/// ambit's: in a cluster its default names the chart's Service). It becomes ready, holds a certificate for its identity from that CA
/// (the client's handshake checks it; the pod never sees a CA key), carries a request from
/// the client to the app, refuses one by its policy, counts both, and stops cleanly on
/// SIGTERM as PID 1.
#[test]
fn waypoint_image_runs_as_a_waypoint_pod() {
    use waypoint_pod::*;
    let f = fixture();
    let hosts = host_dirs("waypoint");
    let node =
        Node::start(&f.ambit, &hosts.path().join("node")).unwrap_or_else(|e| panic!("{e:#}"));
    // The pod's volumes, readable by its user (1337) and no more writable than a
    // kubelet's projections.
    let volume = |name: &str, files: &[(&str, &str)]| {
        let dir = hosts.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        for (file, text) in files {
            std::fs::write(dir.join(file), text).unwrap();
            std::fs::set_permissions(dir.join(file), PermissionsExt::from_mode(0o644)).unwrap();
        }
        std::fs::set_permissions(&dir, PermissionsExt::from_mode(0o755)).unwrap();
        dir
    };
    let tokens = volume("istio-token", &[("istio-token", &node.waypoint_token)]);
    let root = std::fs::read_to_string(&node.root_cert).unwrap();
    let ca_cert = volume("istiod-ca-cert", &[("root-cert.pem", &root)]);
    let labels = volume(
        "istio-podinfo",
        &[(
            "labels",
            "gateway.istio.io/managed=\"istio.io-mesh-controller\"\n\
             gateway.networking.k8s.io/gateway-class-name=\"istio-waypoint\"\n\
             gateway.networking.k8s.io/gateway-name=\"waypoint\"\n\
             istio.io/dataplane-mode=\"none\"\n",
        )],
    );
    node.serve_policy("no-delete.yaml", NO_DELETE).unwrap();
    // istiod's emptyDirs: the only places the pod could write.
    let empty = |name: &str| {
        let dir = hosts.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, PermissionsExt::from_mode(0o777)).unwrap();
        dir
    };
    let mut run = PodmanRun::new(&f.images.waypoint.name)
        .name(&format!("{}-waypoint", node.ns))
        .network_ns(&ambit_netns_lab::Lab::netns_path(&node.ns))
        .mount(
            &empty("workload-socket"),
            "/var/run/secrets/workload-spiffe-uds",
            false,
        )
        .mount(&ca_cert, "/var/run/secrets/istio", true)
        .mount(&empty("istio-data"), "/var/lib/istio/data", false)
        .mount(&empty("istio-envoy"), "/etc/istio/proxy", false)
        .mount(&tokens, "/var/run/secrets/tokens", true)
        .mount(&labels, "/etc/istio/pod", true)
        .args(&[
            "proxy",
            "waypoint",
            "--domain",
            "default.svc.cluster.local",
            "--serviceCluster",
            "waypoint.default",
            "--proxyLogLevel",
            "warning",
            "--proxyComponentLogLevel",
            "misc:error",
            "--log_output_level",
            "default:info",
        ]);
    run.cap_drop = vec!["ALL".into()];
    run.read_only = true;
    run.no_new_privileges = true;
    let instance_ip = WAYPOINT_IP.to_string();
    for (k, v) in [
        ("ISTIO_META_SERVICE_ACCOUNT", "waypoint"),
        ("ISTIO_META_NODE_NAME", "node1"),
        ("PILOT_CERT_PROVIDER", "istiod"),
        ("CA_ADDR", CONTROL_ADDR),
        ("POD_NAME", WAYPOINT_POD),
        ("POD_NAMESPACE", "default"),
        ("INSTANCE_IP", &instance_ip),
        ("SERVICE_ACCOUNT", "waypoint"),
        ("HOST_IP", &instance_ip),
        ("ISTIO_CPU_LIMIT", "0"),
        ("PROXY_CONFIG", "{}\n"),
        ("GOMEMLIMIT", "1073741824"),
        ("ISTIO_META_CLUSTER_ID", "cluster1"),
        ("ISTIO_META_INTERCEPTION_MODE", "REDIRECT"),
        ("ISTIO_META_WORKLOAD_NAME", "waypoint"),
        (
            "ISTIO_META_OWNER",
            "kubernetes://apis/apps/v1/namespaces/default/deployments/waypoint",
        ),
        ("ISTIO_META_MESH_ID", "cluster.local"),
        ("TRUST_DOMAIN", "cluster.local"),
        ("AMBIT_CONTROL_ADDRESS", CONTROL_ADDR),
        ("TERMINATION_GRACE_PERIOD_SECONDS", "10"),
    ] {
        run = run.env(k, v);
    }
    let c = run.start(&f.podman).unwrap();
    let logs = || {
        format!(
            "--- waypoint:\n{}\n--- control:\n{}",
            c.logs(),
            node.control_log()
        )
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let (running, code) = c.state().unwrap();
        assert!(running, "the waypoint exited with {code}\n{}", logs());
        if matches!(node.get(15021, "/healthz/ready"), Ok((200, _))) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the waypoint did not become ready (:15021/healthz/ready)\n{}",
            logs()
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }

    // A read-only root, the image's user (Istio's proxy user), no capability at all.
    let pid = c.pid().unwrap();
    let mounts = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    let root_options = mounts
        .lines()
        .map(|l| l.split(' ').collect::<Vec<_>>())
        .find(|f| f.get(4) == Some(&"/"))
        .map(|f| f[5].to_string())
        .unwrap_or_default();
    assert!(
        root_options.split(',').any(|o| o == "ro"),
        "the root is not read-only: {root_options:?}\n{mounts}"
    );
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.split_whitespace().collect::<Vec<_>>())
            .unwrap_or_default()
    };
    assert_eq!(field("Uid:"), ["1337"; 4], "{status}");
    assert_eq!(field("Gid:"), ["1337"; 4], "{status}");
    for caps in ["CapPrm:", "CapEff:", "CapBnd:"] {
        assert_eq!(field(caps), ["0000000000000000"], "{caps} {status}");
    }
    assert_eq!(field("NoNewPrivs:"), ["1"], "{status}");

    let (status, body) = node
        .request("GET", "/items")
        .unwrap_or_else(|e| panic!("{e:#}\n{}", logs()));
    assert_eq!(
        (status, body.as_str()),
        (200, "app GET /items"),
        "{}",
        logs()
    );
    let (status, body) = node
        .request("DELETE", "/items")
        .unwrap_or_else(|e| panic!("{e:#}\n{}", logs()));
    assert_eq!(
        (status, body.as_str()),
        (403, "RBAC: access denied"),
        "{}",
        logs()
    );
    let control_metrics = node.control_metrics().unwrap();
    let signed: f64 = control_metrics
        .lines()
        .filter_map(|l| l.strip_prefix("ambit_control_csr_signed_total"))
        .filter_map(|rest| rest.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    // The waypoint's certificate (the client's certificate is the test's own).
    assert!(signed >= 1.0, "{control_metrics}\n{}", logs());
    let (status, metrics) = node.get(15020, "/stats/prometheus").unwrap();
    assert_eq!(status, 200);
    let counted = |more: &[(&str, &str)]| {
        let labels = [
            ("reporter", "waypoint"),
            ("source_principal", CLIENT_ID),
            ("destination_service", SERVICE_HOST),
        ];
        ambit_netns_lab::mesh::metric_sum(
            &metrics,
            "istio_requests_total",
            &[&labels[..], more].concat(),
        )
    };
    assert_eq!(
        (
            counted(&[("response_code", "200"), ("destination_workload", "app")]),
            counted(&[("response_code", "403")])
        ),
        (1, 1),
        "{metrics}"
    );

    // SIGTERM to PID 1: it drains and exits 0 (PID 1 ignores a signal it has no handler for).
    c.stop(30).unwrap();
    assert_eq!(c.state().unwrap(), (false, 0), "{}", logs());
}

/// The waypoint's policy: DELETE refused on `echo`.
const NO_DELETE: &str = r#"apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: no-delete, namespace: default}
spec:
  targetRefs: [{kind: Service, group: "", name: echo}]
  action: DENY
  rules: [{to: [{operation: {methods: ["DELETE"]}}]}]
"#;

#[test]
fn cni_image_runs_the_plugin_as_the_container_runtime_calls_it() {
    let f = fixture();
    let (spec, cms) = rendered(
        "cni",
        "istio-cni-node",
        "install-cni",
        &[("profile", "ambient")],
    );
    assert_eq!(spec.image, f.images.cni.name);
    let hosts = host_dirs("cni");
    let netns = TestNetns::new("ambit-img").unwrap();
    let run = PodmanRun::from_spec(
        &spec,
        &spec.image,
        &cms,
        &PodIdentity::default(),
        hosts.path(),
    )
    .unwrap()
    .network_ns(&netns.path());
    assert_eq!(
        run.cap_add,
        [
            "NET_ADMIN",
            "NET_RAW",
            "SYS_PTRACE",
            "SYS_ADMIN",
            "DAC_OVERRIDE"
        ]
    );
    assert_eq!(run.user.as_deref(), Some("0:0"));
    assert!(!run.read_only);
    assert_eq!(
        run.entrypoint.as_deref(),
        Some(&["install-cni".to_string()][..])
    );
    let ambient = run.env.iter().find(|(k, _)| k == "AMBIENT_ENABLED");
    assert_eq!(ambient.map(|(_, v)| v.as_str()), Some("true"));
    let netns_mount = run
        .mounts
        .iter()
        .find(|m| m.1 == "/host/var/run/netns")
        .unwrap();
    assert_eq!(netns_mount.3.as_deref(), Some("HostToContainer"));

    let out = run
        .clone()
        .entrypoint(&["/opt/cni/bin/istio-cni"])
        .args(&[])
        .env("CNI_COMMAND", "VERSION")
        .output(&f.podman)
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the plugin, run as /opt/cni/bin/istio-cni: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    assert!(v["cniVersion"].is_string(), "{v}");
    let supported = v["supportedVersions"].as_array().unwrap();
    assert!(supported.iter().any(|s| s == "1.0.0"), "{v}");
}

#[test]
fn cni_images_netfilter_tools_work_under_the_charts_capabilities() {
    let f = fixture();
    let (spec, cms) = rendered(
        "cni",
        "istio-cni-node",
        "install-cni",
        &[("profile", "ambient")],
    );
    let hosts = host_dirs("cni-tools");
    let netns = TestNetns::new("ambit-img").unwrap();
    let run = PodmanRun::from_spec(
        &spec,
        &spec.image,
        &cms,
        &PodIdentity::default(),
        hosts.path(),
    )
    .unwrap()
    .network_ns(&netns.path());
    let exec = |argv: &[&str]| {
        let out = run
            .clone()
            .entrypoint(&argv[..1])
            .args(&argv[1..])
            .output(&f.podman)
            .unwrap();
        assert!(
            out.status.success(),
            "{argv:?}: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // Rules and sets land in the test's namespace: each run is a fresh container in it.
    exec(&[
        "iptables",
        "-t",
        "nat",
        "-A",
        "OUTPUT",
        "-p",
        "tcp",
        "-m",
        "mark",
        "!",
        "--mark",
        "0x539/0xfff",
        "-j",
        "REDIRECT",
        "--to-ports",
        "15001",
    ]);
    let saved = exec(&["iptables-save", "-t", "nat"]);
    assert!(
        saved
            .contains("-A OUTPUT -p tcp -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15001"),
        "{saved}"
    );
    assert!(
        saved.contains("(nf_tables)"),
        "not the nft variant: {saved}"
    );
    exec(&["ip6tables", "-t", "mangle", "-N", "ISTIO_TEST"]);
    assert!(exec(&["ip6tables-save"]).contains(":ISTIO_TEST - [0:0]"));
    let tables: Value = serde_json::from_str(&exec(&["nft", "-j", "list", "tables"])).unwrap();
    let names: Vec<&str> = tables["nftables"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|o| o.pointer("/table/name").and_then(Value::as_str))
        .collect();
    assert!(
        names.contains(&"nat") && names.contains(&"mangle"),
        "{tables}"
    );
    exec(&["ipset", "create", "istio-inpod-probes-v4", "hash:ip"]);
    assert_eq!(
        exec(&["ipset", "list", "-n"]).trim(),
        "istio-inpod-probes-v4"
    );
}
