//! The charts render what Istio's do (names, labels, env, security, volumes, RBAC), for
//! Istio's documented values, and every rendering passes Kubernetes' schemas (strict) at
//! the oldest and newest versions the charts support.

use std::collections::BTreeMap;

use ambit_packaging::chart::{validate, Render, Rendered};
use ambit_packaging::spec::{ContainerSpec, EnvSource, VolumeSource};
use ambit_packaging::tools::tools;
use serde_json::{json, Value};

/// Renders charts and, when dropped, validates everything it rendered at every supported
/// Kubernetes version (one kubernetes-validate run per version, not per rendering).
#[derive(Default)]
struct Check(Vec<String>);

impl Check {
    fn render(&mut self, r: Render) -> Rendered {
        let out = r.run().unwrap_or_else(|e| panic!("{e}"));
        self.0.push(out.yaml.clone());
        out
    }

    fn chart(&mut self, chart: &str, sets: &[(&str, &str)]) -> Rendered {
        let mut r = Render::new(chart);
        for (k, v) in sets {
            r = r.set(k, v);
        }
        self.render(r)
    }

    fn cni(&mut self, sets: &[(&str, &str)]) -> Rendered {
        self.chart("cni", sets)
    }

    fn ztunnel(&mut self, sets: &[(&str, &str)]) -> Rendered {
        self.chart("ztunnel", sets)
    }
}

impl Drop for Check {
    fn drop(&mut self) {
        if std::thread::panicking() || self.0.is_empty() {
            return;
        }
        let all = self
            .0
            .iter()
            .map(|y| match y.starts_with("---") {
                true => format!("{y}\n"),
                false => format!("---\n{y}\n"),
            })
            .collect::<String>();
        for v in &tools().expect("tools").kube_versions {
            validate(&all, v).unwrap_or_else(|e| panic!("{e}"));
        }
    }
}

fn cni_ds(r: &Rendered) -> &Value {
    r.get("DaemonSet", "istio-cni-node").unwrap()
}

fn cni_container(r: &Rendered) -> ContainerSpec {
    ContainerSpec::from_daemonset(cni_ds(r), "install-cni").unwrap()
}

fn config(r: &Rendered) -> BTreeMap<String, String> {
    r.config_map("istio-cni-config").unwrap()
}

fn names(r: &Rendered) -> Vec<(String, String)> {
    let mut n = r.kinds_and_names();
    n.sort();
    n
}

fn kn(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut v: Vec<_> = pairs
        .iter()
        .map(|(k, n)| (k.to_string(), n.to_string()))
        .collect();
    v.sort();
    v
}

fn host_path(c: &ContainerSpec, volume: &str) -> String {
    match &c
        .mount(volume)
        .unwrap_or_else(|| panic!("no mount {volume}"))
        .source
    {
        VolumeSource::HostPath { path, .. } => path.clone(),
        other => panic!("{volume} is {other:?}"),
    }
}

const DEFAULT_SELECTOR: &str = "- podSelector:
    matchLabels:
      istio.io/dataplane-mode: ambient
- namespaceSelector:
    matchLabels:
      istio.io/dataplane-mode: ambient
  podSelector:
    matchExpressions:
    - key: istio.io/dataplane-mode
      operator: NotIn
      values:
      - none
";

#[test]
fn cni_defaults_render_istios_objects() {
    let mut k = Check::default();
    let r = k.cni(&[]);
    assert_eq!(
        names(&r),
        kn(&[
            ("ServiceAccount", "istio-cni"),
            ("ConfigMap", "istio-cni-config"),
            ("ClusterRole", "istio-cni"),
            ("ClusterRole", "istio-cni-repair-role"),
            ("ClusterRoleBinding", "istio-cni"),
            ("ClusterRoleBinding", "istio-cni-repair-rolebinding"),
            ("DaemonSet", "istio-cni-node"),
        ])
    );
    let want: BTreeMap<String, String> = [
        ("CURRENT_AGENT_VERSION", "0.1.0"),
        ("AMBIENT_ENABLED", "false"),
        ("AMBIENT_ENABLEMENT_SELECTOR", DEFAULT_SELECTOR),
        ("AMBIENT_DNS_CAPTURE", "true"),
        ("AMBIENT_IPV6", "true"),
        ("AMBIENT_RECONCILE_POD_RULES_ON_STARTUP", "true"),
        ("ENABLE_AMBIENT_DETECTION_RETRY", "false"),
        ("ISTIO_OWNED_CNI_CONFIG", "false"),
        ("CHAINED_CNI_PLUGIN", "true"),
        ("EXCLUDE_NAMESPACES", "kube-system"),
        ("REPAIR_ENABLED", "true"),
        ("REPAIR_LABEL_PODS", "false"),
        ("REPAIR_DELETE_PODS", "false"),
        ("REPAIR_REPAIR_PODS", "true"),
        ("REPAIR_INIT_CONTAINER_NAME", "istio-validation"),
        ("REPAIR_BROKEN_POD_LABEL_KEY", "cni.istio.io/uninitialized"),
        ("REPAIR_BROKEN_POD_LABEL_VALUE", "true"),
        ("NATIVE_NFTABLES", "false"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    assert_eq!(config(&r), want);
    // The selector YAML parses back to the two selectors of the chart's values.
    let sel: Value = yaml_serde::from_str(&want["AMBIENT_ENABLEMENT_SELECTOR"]).unwrap();
    assert_eq!(
        sel,
        json!([
            {"podSelector": {"matchLabels": {"istio.io/dataplane-mode": "ambient"}}},
            {"podSelector": {"matchExpressions": [{"key": "istio.io/dataplane-mode", "operator": "NotIn", "values": ["none"]}]},
             "namespaceSelector": {"matchLabels": {"istio.io/dataplane-mode": "ambient"}}}
        ])
    );

    let ds = cni_ds(&r);
    assert_eq!(ds["metadata"]["namespace"], "istio-system");
    assert_eq!(
        ds["spec"]["selector"],
        json!({"matchLabels": {"k8s-app": "istio-cni-node"}})
    );
    assert_eq!(
        ds["spec"]["updateStrategy"],
        json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}})
    );
    let tpl = &ds["spec"]["template"];
    assert_eq!(
        tpl["metadata"]["labels"],
        json!({"k8s-app": "istio-cni-node", "sidecar.istio.io/inject": "false", "istio.io/dataplane-mode": "none"})
    );
    assert_eq!(
        tpl["metadata"]["annotations"],
        json!({
            "sidecar.istio.io/inject": "false",
            "prometheus.io/scrape": "true",
            "prometheus.io/port": "15014",
            "prometheus.io/path": "/metrics",
            "container.apparmor.security.beta.kubernetes.io/install-cni": "unconfined"
        })
    );
    let pod = &tpl["spec"];
    assert_eq!(pod["nodeSelector"], json!({"kubernetes.io/os": "linux"}));
    assert_eq!(pod["priorityClassName"], "system-node-critical");
    assert_eq!(pod["serviceAccountName"], "istio-cni");
    assert_eq!(pod["terminationGracePeriodSeconds"], 30);
    assert!(pod.get("hostNetwork").is_none());
    assert_eq!(
        pod["tolerations"],
        json!([
            {"effect": "NoSchedule", "operator": "Exists"},
            {"key": "CriticalAddonsOnly", "operator": "Exists"},
            {"effect": "NoExecute", "operator": "Exists"}
        ])
    );
    let c = &pod["containers"][0];
    assert_eq!(pod["containers"].as_array().unwrap().len(), 1);
    assert_eq!(c["name"], "install-cni");
    assert_eq!(c["image"], "localhost/ambit/ambit-cni:0.1.0");
    assert!(c.get("imagePullPolicy").is_none());
    assert_eq!(c["command"], json!(["install-cni"]));
    assert_eq!(c["args"], json!(["--log_output_level=info"]));
    assert_eq!(
        c["ports"],
        json!([{"containerPort": 15014, "name": "metrics", "protocol": "TCP"}])
    );
    assert_eq!(
        c["readinessProbe"],
        json!({"httpGet": {"path": "/readyz", "port": 8000}})
    );
    assert_eq!(
        c["securityContext"],
        json!({
            "privileged": false,
            "runAsGroup": 0,
            "runAsUser": 0,
            "runAsNonRoot": false,
            "capabilities": {
                "drop": ["ALL"],
                "add": ["NET_ADMIN", "NET_RAW", "SYS_PTRACE", "SYS_ADMIN", "DAC_OVERRIDE"]
            }
        })
    );
    assert_eq!(
        c["envFrom"],
        json!([{"configMapRef": {"name": "istio-cni-config"}}])
    );
    assert_eq!(
        c["resources"],
        json!({"requests": {"cpu": "100m", "memory": "100Mi"}})
    );
    let spec = cni_container(&r);
    let field = |f: &str| EnvSource::Field(f.into());
    let value = |v: &str| EnvSource::Value(v.into());
    assert_eq!(
        spec.env,
        vec![
            ("REPAIR_NODE_NAME".into(), field("spec.nodeName")),
            ("REPAIR_RUN_AS_DAEMON".into(), value("true")),
            (
                "REPAIR_SIDECAR_ANNOTATION".into(),
                value("sidecar.istio.io/status")
            ),
            ("ALLOW_SWITCH_TO_HOST_NS".into(), value("true")),
            ("NODE_NAME".into(), field("spec.nodeName")),
            (
                "GOMEMLIMIT".into(),
                EnvSource::Resource("limits.memory".into())
            ),
            ("POD_NAME".into(), field("metadata.name")),
            ("POD_NAMESPACE".into(), field("metadata.namespace")),
        ]
    );
    // Without ambient: no netns or ztunnel socket mounts; procfs for the repair controller.
    assert_eq!(
        c["volumeMounts"],
        json!([
            {"name": "cni-bin-dir", "mountPath": "/host/opt/cni/bin"},
            {"name": "cni-host-procfs", "mountPath": "/host/proc", "readOnly": true},
            {"name": "cni-net-dir", "mountPath": "/host/etc/cni/net.d"},
            {"name": "cni-socket-dir", "mountPath": "/var/run/istio-cni"}
        ])
    );
    assert_eq!(
        pod["volumes"],
        json!([
            {"name": "cni-bin-dir", "hostPath": {"path": "/opt/cni/bin"}},
            {"name": "cni-host-procfs", "hostPath": {"path": "/proc", "type": "Directory"}},
            {"name": "cni-net-dir", "hostPath": {"path": "/etc/cni/net.d"}},
            {"name": "cni-socket-dir", "hostPath": {"path": "/var/run/istio-cni"}}
        ])
    );

    // RBAC, exactly.
    assert_eq!(
        r.get("ClusterRole", "istio-cni").unwrap()["rules"],
        json!([{"apiGroups": [""], "resources": ["pods", "nodes", "namespaces"], "verbs": ["get", "list", "watch"]}])
    );
    assert_eq!(
        r.get("ClusterRole", "istio-cni-repair-role").unwrap()["rules"],
        json!([
            {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["watch", "get", "list"]}
        ])
    );
    for (binding, role) in [
        ("istio-cni", "istio-cni"),
        ("istio-cni-repair-rolebinding", "istio-cni-repair-role"),
    ] {
        let b = r.get("ClusterRoleBinding", binding).unwrap();
        assert_eq!(
            b["roleRef"],
            json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role})
        );
        assert_eq!(
            b["subjects"],
            json!([{"kind": "ServiceAccount", "name": "istio-cni", "namespace": "istio-system"}])
        );
    }
}

#[test]
fn cni_ambient_by_profile_global_profile_value_and_prefix() {
    let mut k = Check::default();
    for sets in [
        &[("profile", "ambient")][..],
        &[("global.profile", "ambient")],
        &[("ambient.enabled", "true")],
        &[("cni.ambient.enabled", "true")],
    ] {
        let r = k.cni(sets);
        assert_eq!(config(&r)["AMBIENT_ENABLED"], "true", "{sets:?}");
        assert_eq!(
            r.get("ClusterRole", "istio-cni-ambient").unwrap()["rules"],
            json!([
                {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch", "update"]},
                {"apiGroups": ["apps"], "resources": ["daemonsets"], "resourceNames": ["istio-cni-node"], "verbs": ["get"]}
            ]),
            "{sets:?}"
        );
        let b = r.get("ClusterRoleBinding", "istio-cni-ambient").unwrap();
        assert_eq!(b["roleRef"]["name"], "istio-cni-ambient");
        assert_eq!(b["subjects"][0]["name"], "istio-cni");
        let pod = &cni_ds(&r)["spec"]["template"]["spec"];
        let mounts = pod["containers"][0]["volumeMounts"].as_array().unwrap();
        assert_eq!(
            mounts[4..],
            [
                json!({"name": "cni-netns-dir", "mountPath": "/host/var/run/netns", "mountPropagation": "HostToContainer"}),
                json!({"name": "cni-ztunnel-sock-dir", "mountPath": "/var/run/ztunnel"}),
            ]
        );
        let volumes = pod["volumes"].as_array().unwrap();
        assert_eq!(
            volumes[4..],
            [
                json!({"name": "cni-netns-dir", "hostPath": {"path": "/var/run/netns", "type": "DirectoryOrCreate"}}),
                json!({"name": "cni-ztunnel-sock-dir", "hostPath": {"path": "/var/run/ztunnel", "type": "DirectoryOrCreate"}}),
            ]
        );
    }
}

#[test]
fn cni_users_values_outrank_the_profile_even_when_false() {
    let mut k = Check::default();
    let r = k.cni(&[("profile", "ambient"), ("ambient.enabled", "false")]);
    assert_eq!(config(&r)["AMBIENT_ENABLED"], "false");
    assert!(r.find("ClusterRole", "istio-cni-ambient").is_none());
    // A `cni.` value outranks the same value at the top level.
    let r = k.cni(&[("cniConfDir", "/a"), ("cni.cniConfDir", "/b")]);
    assert_eq!(host_path(&cni_container(&r), "cni-net-dir"), "/b");
}

#[test]
fn cni_prefixed_values_are_descoped() {
    let mut k = Check::default();
    let r = k.cni(&[
        ("cni.cniBinDir", "/custom/bin"),
        ("cni.excludeNamespaces", "{kube-system,istio-system}"),
        ("cni.logging.level", "debug"),
        ("cni.repair.enabled", "false"),
    ]);
    let c = cni_container(&r);
    assert_eq!(host_path(&c, "cni-bin-dir"), "/custom/bin");
    assert_eq!(config(&r)["EXCLUDE_NAMESPACES"], "kube-system,istio-system");
    assert_eq!(config(&r)["REPAIR_ENABLED"], "false");
    assert_eq!(c.args, ["--log_output_level=debug"]);
    assert!(r.find("ClusterRole", "istio-cni-repair-role").is_none());
}

#[test]
fn cni_platforms_set_their_directories() {
    let mut k = Check::default();
    // (platform, bin, conf, netns)
    let cases = [
        (
            "k3s",
            "/var/lib/rancher/k3s/data/cni",
            "/var/lib/rancher/k3s/agent/etc/cni/net.d",
            "/var/run/netns",
        ),
        (
            "k3d",
            "/bin",
            "/var/lib/rancher/k3s/agent/etc/cni/net.d",
            "/var/run/netns",
        ),
        (
            "microk8s",
            "/var/snap/microk8s/current/opt/cni/bin",
            "/var/snap/microk8s/current/args/cni-network",
            "/var/run/netns",
        ),
        (
            "minikube",
            "/opt/cni/bin",
            "/etc/cni/net.d",
            "/var/run/docker/netns",
        ),
        (
            "openshift",
            "/var/lib/cni/bin",
            "/etc/cni/multus/net.d",
            "/var/run/netns",
        ),
        // Not a GKE version: the empty cniBinDir falls back to the default.
        ("gke", "/opt/cni/bin", "/etc/cni/net.d", "/var/run/netns"),
    ];
    for (platform, bin, conf, netns) in cases {
        for key in ["platform", "global.platform"] {
            let r = k.cni(&[(key, platform), ("profile", "ambient")]);
            let c = cni_container(&r);
            assert_eq!(host_path(&c, "cni-bin-dir"), bin, "{key}={platform}");
            assert_eq!(host_path(&c, "cni-net-dir"), conf, "{key}={platform}");
            assert_eq!(host_path(&c, "cni-netns-dir"), netns, "{key}={platform}");
        }
    }
    let r = k.render(
        Render::new("cni")
            .set("platform", "gke")
            .kube_version("v1.33.5-gke.1200"),
    );
    assert_eq!(
        host_path(&cni_container(&r), "cni-bin-dir"),
        "/home/kubernetes/bin"
    );

    let r = k.cni(&[("platform", "openshift")]);
    let cm = config(&r);
    assert_eq!(cm["CHAINED_CNI_PLUGIN"], "false");
    assert_eq!(cm["CNI_CONF_NAME"], "istio-cni.conf");
    let c = &cni_ds(&r)["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        c["securityContext"]["seLinuxOptions"],
        json!({"type": "spc_t"})
    );
    assert_eq!(
        r.get("ClusterRole", "istio-cni").unwrap()["rules"][1],
        json!({"apiGroups": ["security.openshift.io"], "resources": ["securitycontextconstraints"], "resourceNames": ["privileged"], "verbs": ["use"]})
    );
    let nad = r.get("NetworkAttachmentDefinition", "istio-cni").unwrap();
    assert_eq!(nad["apiVersion"], "k8s.cni.cncf.io/v1");
    assert_eq!(nad["metadata"]["namespace"], "default");
}

#[test]
fn cni_native_nftables_owned_config_and_logging() {
    let mut k = Check::default();
    let r = k.cni(&[("global.nativeNftables", "true")]);
    assert_eq!(config(&r)["NATIVE_NFTABLES"], "true");

    let r = k.cni(&[("istioOwnedCNIConfig", "true")]);
    assert_eq!(config(&r)["ISTIO_OWNED_CNI_CONFIG"], "true");
    assert_eq!(
        config(&r)["ISTIO_OWNED_CNI_CONF_FILENAME"],
        "02-istio-cni.conflist"
    );
    let r = k.cni(&[
        ("istioOwnedCNIConfig", "true"),
        ("istioOwnedCNIConfigFileName", "01-mine.conflist"),
    ]);
    assert_eq!(
        config(&r)["ISTIO_OWNED_CNI_CONF_FILENAME"],
        "01-mine.conflist"
    );
    let r = k.cni(&[("cniConfFileName", "10-calico.conflist")]);
    assert_eq!(config(&r)["CNI_CONF_NAME"], "10-calico.conflist");
    assert!(!config(&r).contains_key("ISTIO_OWNED_CNI_CONF_FILENAME"));

    let r = k.cni(&[
        ("global.logAsJson", "true"),
        ("global.logging.level", "warn"),
    ]);
    assert_eq!(
        cni_container(&r).args,
        ["--log_output_level=warn", "--log_as_json"]
    );
}

#[test]
fn cni_env_lands_in_the_config_map_and_the_container() {
    let mut k = Check::default();
    let r = k.render(
        Render::new("cni")
            .set_string("env.FOO", "bar")
            .set_string("env.AMBIENT_IPV6", "false"),
    );
    let cm = config(&r);
    assert_eq!(cm["FOO"], "bar");
    let c = cni_container(&r);
    assert_eq!(c.env_value("FOO"), Some("bar"));
    assert_eq!(c.env_value("AMBIENT_IPV6"), Some("false"));
}

#[test]
fn cni_host_network_repair_modes_images_and_scheduling() {
    let mut k = Check::default();
    let r = k.cni(&[
        ("ambient.enabled", "true"),
        ("ambient.shareHostNetworkNamespace", "true"),
    ]);
    let pod = &cni_ds(&r)["spec"]["template"]["spec"];
    assert_eq!(pod["hostNetwork"], true);
    assert_eq!(pod["dnsPolicy"], "ClusterFirstWithHostNet");
    assert_eq!(cni_container(&r).env_value("ALLOW_SWITCH_TO_HOST_NS"), None);

    let r = k.cni(&[("repair.deletePods", "true"), ("repair.labelPods", "true")]);
    assert_eq!(
        r.get("ClusterRole", "istio-cni-repair-role").unwrap()["rules"],
        json!([
            {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["watch", "get", "list"]},
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["delete"]},
            {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch", "update"]}
        ])
    );
    // Neither repair nor ambient: no /proc.
    let r = k.cni(&[("repair.repairPods", "false")]);
    assert!(cni_container(&r).mount("cni-host-procfs").is_none());

    let r = k.cni(&[
        ("global.hub", "registry.example/mesh"),
        ("tag", "1.2.3"),
        ("pullPolicy", "Always"),
    ]);
    let c = &cni_ds(&r)["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["image"], "registry.example/mesh/ambit-cni:1.2.3");
    assert_eq!(c["imagePullPolicy"], "Always");
    assert_eq!(config(&r)["CURRENT_AGENT_VERSION"], "1.2.3");
    let r = k.cni(&[("image", "other.example/x/agent:9")]);
    assert_eq!(
        cni_ds(&r)["spec"]["template"]["spec"]["containers"][0]["image"],
        "other.example/x/agent:9"
    );

    let r = k.cni(&[("useAppArmorAnnotation", "false")]);
    let tpl = &cni_ds(&r)["spec"]["template"];
    assert!(tpl["metadata"]["annotations"]
        .get("container.apparmor.security.beta.kubernetes.io/install-cni")
        .is_none());
    assert_eq!(
        tpl["spec"]["containers"][0]["securityContext"]["appArmorProfile"],
        json!({"type": "Unconfined"})
    );

    let r = k.cni(&[
        ("global.networkPolicy.enabled", "true"),
        ("resourceQuotas.enabled", "true"),
    ]);
    let np = r.get("NetworkPolicy", "istio-cni-node").unwrap();
    assert_eq!(
        np["spec"]["ingress"],
        json!([{"ports": [{"port": 15014, "protocol": "TCP"}, {"port": 8000, "protocol": "TCP"}]}])
    );
    assert_eq!(np["spec"]["egress"], json!([{}]));
    let rq = r.get("ResourceQuota", "istio-cni-resource-quota").unwrap();
    assert_eq!(rq["spec"]["hard"], json!({"pods": "5000"}));

    let r = k.cni(&[("global.resourceScope", "cluster")]);
    assert!(r
        .kinds_and_names()
        .iter()
        .all(|(k, _)| k.starts_with("Cluster")));
    let r = k.cni(&[("global.resourceScope", "namespace")]);
    assert!(r
        .kinds_and_names()
        .iter()
        .all(|(k, _)| !k.starts_with("Cluster")));
}

fn zt_ds<'a>(r: &'a Rendered, name: &str) -> &'a Value {
    r.get("DaemonSet", name).unwrap()
}

fn zt_container(r: &Rendered) -> ContainerSpec {
    ContainerSpec::from_daemonset(zt_ds(r, "ztunnel"), "istio-proxy").unwrap()
}

#[test]
fn ztunnel_defaults_render_istios_daemonset() {
    let mut k = Check::default();
    let r = k.ztunnel(&[]);
    assert_eq!(
        names(&r),
        kn(&[("ServiceAccount", "ztunnel"), ("DaemonSet", "ztunnel")])
    );
    let ds = zt_ds(&r, "ztunnel");
    assert_eq!(
        ds["spec"]["selector"],
        json!({"matchLabels": {"app": "ztunnel"}})
    );
    assert_eq!(
        ds["spec"]["updateStrategy"],
        json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}})
    );
    let tpl = &ds["spec"]["template"];
    assert_eq!(
        tpl["metadata"]["labels"],
        json!({"sidecar.istio.io/inject": "false", "istio.io/dataplane-mode": "none", "app": "ztunnel"})
    );
    assert_eq!(
        tpl["metadata"]["annotations"],
        json!({"sidecar.istio.io/inject": "false", "prometheus.io/port": "15020", "prometheus.io/scrape": "true"})
    );
    let pod = &tpl["spec"];
    assert_eq!(pod["nodeSelector"], json!({"kubernetes.io/os": "linux"}));
    assert_eq!(pod["priorityClassName"], "system-node-critical");
    assert_eq!(pod["serviceAccountName"], "ztunnel");
    assert_eq!(pod["terminationGracePeriodSeconds"], 30);
    let c = &pod["containers"][0];
    assert_eq!(c["name"], "istio-proxy");
    assert_eq!(c["image"], "localhost/ambit/ambit-ztunnel:0.1.0");
    assert!(c.get("command").is_none());
    assert_eq!(c["args"], json!(["proxy", "ztunnel"]));
    assert_eq!(
        c["ports"],
        json!([{"containerPort": 15020, "name": "ztunnel-stats", "protocol": "TCP"}])
    );
    assert_eq!(
        c["readinessProbe"],
        json!({"httpGet": {"path": "/healthz/ready", "port": 15021}})
    );
    assert_eq!(
        c["resources"],
        json!({"requests": {"cpu": "200m", "memory": "512Mi"}})
    );
    assert_eq!(
        c["securityContext"],
        json!({
            "allowPrivilegeEscalation": true,
            "privileged": false,
            "capabilities": {"drop": ["ALL"], "add": ["NET_ADMIN", "SYS_ADMIN", "NET_RAW"]},
            "readOnlyRootFilesystem": true,
            "runAsGroup": 1337,
            "runAsNonRoot": false,
            "runAsUser": 0
        })
    );
    let spec = zt_container(&r);
    let field = |f: &str| EnvSource::Field(f.into());
    let value = |v: &str| EnvSource::Value(v.into());
    assert_eq!(
        spec.env,
        vec![
            ("CA_ADDRESS".into(), value("istiod.istio-system.svc:15012")),
            ("XDS_ADDRESS".into(), value("istiod.istio-system.svc:15012")),
            ("RUST_LOG".into(), value("info")),
            ("RUST_BACKTRACE".into(), value("1")),
            ("ISTIO_META_CLUSTER_ID".into(), value("Kubernetes")),
            ("INPOD_ENABLED".into(), value("true")),
            ("TERMINATION_GRACE_PERIOD_SECONDS".into(), value("30")),
            ("POD_NAME".into(), field("metadata.name")),
            ("POD_NAMESPACE".into(), field("metadata.namespace")),
            ("NODE_NAME".into(), field("spec.nodeName")),
            ("INSTANCE_IP".into(), field("status.podIP")),
            ("SERVICE_ACCOUNT".into(), field("spec.serviceAccountName")),
            (
                "ZTUNNEL_CPU_LIMIT".into(),
                EnvSource::Resource("limits.cpu".into())
            ),
            ("ZTUNNEL_RESOURCE_CPU_REQUEST".into(), value("200m")),
        ]
    );
    assert_eq!(
        c["volumeMounts"],
        json!([
            {"name": "istiod-ca-cert", "mountPath": "/var/run/secrets/istio"},
            {"name": "istio-token", "mountPath": "/var/run/secrets/tokens"},
            {"name": "cni-ztunnel-sock-dir", "mountPath": "/var/run/ztunnel"},
            {"name": "tmp", "mountPath": "/tmp"}
        ])
    );
    assert_eq!(
        pod["volumes"],
        json!([
            {"name": "istio-token", "projected": {"sources": [{"serviceAccountToken": {"path": "istio-token", "audience": "istio-ca", "expirationSeconds": 43200}}]}},
            {"name": "istiod-ca-cert", "configMap": {"name": "istio-ca-root-cert"}},
            {"name": "cni-ztunnel-sock-dir", "hostPath": {"path": "/var/run/ztunnel", "type": "DirectoryOrCreate"}},
            {"name": "tmp", "emptyDir": {}}
        ])
    );
}

#[test]
fn ztunnel_resource_name_revision_and_addresses() {
    let mut k = Check::default();
    let r = k.ztunnel(&[("resourceName", "ambit-ztunnel")]);
    assert_eq!(
        names(&r),
        kn(&[
            ("ServiceAccount", "ambit-ztunnel"),
            ("DaemonSet", "ambit-ztunnel")
        ])
    );
    let ds = zt_ds(&r, "ambit-ztunnel");
    assert_eq!(
        ds["spec"]["template"]["spec"]["serviceAccountName"],
        "ambit-ztunnel"
    );
    // The selector stays app: ztunnel (the agent recognises ztunnel pods by it).
    assert_eq!(
        ds["spec"]["selector"],
        json!({"matchLabels": {"app": "ztunnel"}})
    );

    let r = k.ztunnel(&[("revision", "canary"), ("istioNamespace", "mesh")]);
    let c = zt_container(&r);
    assert_eq!(
        c.env_value("CA_ADDRESS"),
        Some("istiod-canary.mesh.svc:15012")
    );
    assert_eq!(
        c.env_value("XDS_ADDRESS"),
        Some("istiod-canary.mesh.svc:15012")
    );
    let ds = zt_ds(&r, "ztunnel");
    assert_eq!(
        ds["spec"]["template"]["metadata"]["annotations"]["istio.io/rev"],
        "canary"
    );
    assert_eq!(ds["metadata"]["labels"]["istio.io/rev"], "canary");

    let r = k.ztunnel(&[
        ("caAddress", "ca.example:443"),
        ("xdsAddress", "xds.example:443"),
    ]);
    let c = zt_container(&r);
    assert_eq!(c.env_value("CA_ADDRESS"), Some("ca.example:443"));
    assert_eq!(c.env_value("XDS_ADDRESS"), Some("xds.example:443"));
}

#[test]
fn ztunnel_logging_network_cluster_and_metadata() {
    let mut k = Check::default();
    let r = k.ztunnel(&[
        ("logAsJson", "true"),
        ("logLevel", "debug"),
        ("network", "net1"),
        ("multiCluster.clusterName", "east"),
        ("terminationGracePeriodSeconds", "60"),
    ]);
    let c = zt_container(&r);
    assert_eq!(c.env_value("LOG_FORMAT"), Some("json"));
    assert_eq!(c.env_value("RUST_LOG"), Some("debug"));
    assert_eq!(c.env_value("NETWORK"), Some("net1"));
    assert_eq!(c.env_value("ISTIO_META_CLUSTER_ID"), Some("east"));
    assert_eq!(c.env_value("TERMINATION_GRACE_PERIOD_SECONDS"), Some("60"));
    assert_eq!(
        zt_ds(&r, "ztunnel")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"],
        60
    );

    let r = k.render(
        Render::new("ztunnel")
            .set_string(
                "meshConfig.defaultConfig.proxyMetadata.ISTIO_META_DNS_CAPTURE",
                "true",
            )
            .set_string("env.FOO", "bar")
            .set("resources.limits.cpu", "2"),
    );
    let c = zt_container(&r);
    assert_eq!(c.env_value("ISTIO_META_DNS_CAPTURE"), Some("true"));
    assert_eq!(c.env_value("FOO"), Some("bar"));
    assert_eq!(c.env_value("ZTUNNEL_RESOURCE_CPU_LIMIT"), Some("2"));

    // The ambient profile's HBONE metadata, as Istio's shared profile gives it.
    for key in ["profile", "global.profile"] {
        let r = k.ztunnel(&[(key, "ambient")]);
        assert_eq!(
            zt_container(&r).env_value("ISTIO_META_ENABLE_HBONE"),
            Some("true")
        );
    }
}

#[test]
fn ztunnel_crl_trust_bundle_and_optional_objects() {
    let mut k = Check::default();
    let r = k.ztunnel(&[("peerCaCrl.enabled", "true")]);
    let c = zt_container(&r);
    assert_eq!(
        c.env_value("CRL_PATH"),
        Some("/var/run/secrets/istio/crl/ca-crl.pem")
    );
    let m = c.mount("crl-volume").unwrap();
    assert_eq!(m.path, "/var/run/secrets/istio/crl");
    assert_eq!(m.source, VolumeSource::ConfigMap("istio-ca-crl".into()));

    let r = k.ztunnel(&[("env.ENABLE_CLUSTER_TRUST_BUNDLE_API", "true")]);
    let vols = &zt_ds(&r, "ztunnel")["spec"]["template"]["spec"]["volumes"];
    let ca = vols
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "istiod-ca-cert")
        .unwrap();
    assert_eq!(
        ca["projected"]["sources"][0]["clusterTrustBundle"]["name"],
        "istio.io:istiod-ca:root-cert"
    );

    let r = k.ztunnel(&[
        ("global.networkPolicy.enabled", "true"),
        ("resourceQuotas.enabled", "true"),
        ("platform", "openshift"),
    ]);
    let np = r.get("NetworkPolicy", "ztunnel").unwrap();
    let ports: Vec<(i64, String)> = np["spec"]["ingress"][0]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["port"].as_i64().unwrap(),
                p["protocol"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let want: Vec<(i64, String)> = [15021, 15020, 15000, 15008, 15001, 15006, 15053]
        .into_iter()
        .map(|p| (p, "TCP".to_string()))
        .chain([(15053, "UDP".to_string())])
        .collect();
    assert_eq!(ports, want);
    assert!(r.find("ResourceQuota", "ztunnel-resource-quota").is_some());
    assert_eq!(
        r.get("ClusterRole", "ztunnel").unwrap()["rules"],
        json!([{"apiGroups": ["security.openshift.io"], "resources": ["securitycontextconstraints"], "resourceNames": ["privileged"], "verbs": ["use"]}])
    );
    assert_eq!(
        r.get("ClusterRoleBinding", "ztunnel").unwrap()["subjects"],
        json!([{"kind": "ServiceAccount", "name": "ztunnel", "namespace": "istio-system"}])
    );
}

#[test]
fn defaults_and_unknown_profiles_fail_rendering() {
    for chart in ["cni", "ztunnel"] {
        let err = Render::new(chart).set("defaults.x", "1").fails().unwrap();
        assert!(
            err.contains("values under `defaults` are not supported: set them at the top level"),
            "{chart}: {err}"
        );
        let err = Render::new(chart)
            .set("profile", "nonesuch")
            .fails()
            .unwrap();
        assert!(
            err.contains("profile \"nonesuch\" is not one this chart knows"),
            "{chart}: {err}"
        );
        let err = Render::new(chart)
            .set("platform", "nonesuch")
            .fails()
            .unwrap();
        assert!(
            err.contains("platform \"nonesuch\" is not one this chart knows"),
            "{chart}: {err}"
        );
    }
}

/// The control chart: `ambit control --kubernetes` beside istiod, with exactly the access
/// it uses, its own token for istiod's CA, probes and metrics on the monitoring port.
#[test]
fn control_renders_the_server_beside_istiod_with_the_rbac_it_needs() {
    let mut check = Check::default();
    let r = check.chart("control", &[]);
    assert_eq!(
        names(&r),
        kn(&[
            ("ClusterRole", "ambit-control"),
            ("ClusterRoleBinding", "ambit-control"),
            ("Deployment", "ambit-control"),
            ("Service", "ambit-control"),
            ("ServiceAccount", "ambit-control"),
        ])
    );
    // Exactly what it does with the API.
    let role = r.get("ClusterRole", "ambit-control").unwrap();
    assert_eq!(
        role["rules"],
        json!([
            {"apiGroups": ["security.istio.io"], "resources": ["authorizationpolicies", "requestauthentications"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["networking.istio.io"], "resources": ["destinationrules"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["gateway.networking.k8s.io"], "resources": ["httproutes", "grpcroutes", "gateways", "gatewayclasses"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": [""], "resources": ["services", "namespaces"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
            {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
        ])
    );
    let d = r.get("Deployment", "ambit-control").unwrap();
    let pod = &d["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "ambit-control");
    let c = &pod["containers"][0];
    assert_eq!(c["image"], "localhost/ambit/ambit-waypoint:0.1.0");
    assert_eq!(
        c["args"],
        json!([
            "control",
            "--kubernetes",
            "--listen=[::]:15012",
            "--monitoring=[::]:15020",
            "--trust-domain=cluster.local",
            "--identity=spiffe://cluster.local/ns/istio-system/sa/ambit-control",
        ])
    );
    let env: BTreeMap<String, String> = c["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap().into(),
                e["value"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(env["CA_ADDRESS"], "istiod.istio-system.svc:15012");
    assert_eq!(env["AUTH_TOKEN"], "/var/run/secrets/tokens/istio-token");
    assert_eq!(env["CA_ROOT_CA"], "/var/run/secrets/istio/root-cert.pem");
    assert_eq!(
        c["readinessProbe"]["httpGet"],
        json!({"path": "/ready", "port": 15020})
    );
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(c["securityContext"]["capabilities"]["drop"], json!(["ALL"]));
    let token = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "istio-token")
        .unwrap();
    assert_eq!(
        token["projected"]["sources"][0]["serviceAccountToken"]["audience"],
        "istio-ca"
    );
    // A revision's istiod; another name: its identity follows.
    let r = check.chart("control", &[("revision", "canary"), ("name", "l7")]);
    let c = &r.get("Deployment", "l7").unwrap()["spec"]["template"]["spec"]["containers"][0];
    assert!(c["env"]
        .to_string()
        .contains("istiod-canary.istio-system.svc:15012"));
    assert!(c["args"]
        .to_string()
        .contains("--identity=spiffe://cluster.local/ns/istio-system/sa/l7"));
}

/// The waypoint class: Istio's mesh controller deploys its Gateways, with ambit's image and
/// the way to this server overlaid by the class's defaults ConfigMap.
#[test]
fn control_renders_the_ambit_waypoint_class_and_its_defaults() {
    // GatewayClass is a custom resource: rendered and read, not schema-checked here.
    let r = Render::new("control")
        .set("waypointClass.enabled", "true")
        .set("global.hub", "registry.example/ambit")
        .run()
        .unwrap();
    let class = r.get("GatewayClass", "ambit-waypoint").unwrap();
    assert_eq!(class["spec"]["controllerName"], "istio.io/mesh-controller");
    let cm = r.get("ConfigMap", "ambit-waypoint-defaults").unwrap();
    assert_eq!(cm["metadata"]["namespace"], "istio-system");
    assert_eq!(
        cm["metadata"]["labels"]["gateway.istio.io/defaults-for-class"],
        "ambit-waypoint"
    );
    let overlay: Value = yaml_serde::from_str(cm["data"]["deployment"].as_str().unwrap()).unwrap();
    let proxy = &overlay["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(proxy["name"], "istio-proxy");
    assert_eq!(
        proxy["image"],
        "registry.example/ambit/ambit-waypoint:0.1.0"
    );
    assert_eq!(
        proxy["env"],
        json!([
            {"name": "AMBIT_CONTROL_ADDRESS", "value": "ambit-control.istio-system.svc:15012"},
            {"name": "AMBIT_CONTROL_IDENTITY", "value": "spiffe://cluster.local/ns/istio-system/sa/ambit-control"},
        ])
    );
    // Off by default.
    assert!(Render::new("control")
        .run()
        .unwrap()
        .find("GatewayClass", "ambit-waypoint")
        .is_none());
}
