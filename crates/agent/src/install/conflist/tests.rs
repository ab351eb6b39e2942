use super::*;
use serde_json::json;

fn entry() -> PluginEntry {
    PluginEntry {
        name: PLUGIN_TYPE.into(),
        plugin_type: PLUGIN_TYPE.into(),
        plugin_log_level: "info".into(),
        cni_agent_run_dir: "/var/run/istio-cni".into(),
        ambient_enabled: true,
        enablement_selectors: json!([{"podSelector": {"matchLabels": {"istio.io/dataplane-mode": "ambient"}}}]),
        exclude_namespaces: vec!["kube-system".into()],
        pod_namespace: "istio-system".into(),
        native_nftables: false,
        enable_ambient_detection_retry: false,
    }
}

fn file(name: &str, content: &str) -> ConfFile {
    ConfFile {
        name: name.into(),
        content: content.as_bytes().to_vec(),
    }
}

const BRIDGE: &str = r#"{
  "cniVersion": "1.0.0",
  "name": "bridge-net",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "ipam": {"type": "host-local", "zeta": 1, "alpha": 2}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ],
  "zz": true,
  "aa": false
}"#;

#[test]
fn the_primary_is_the_first_valid_file_in_lexical_order() {
    let ok_list = r#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"bridge"}]}"#;
    let ok_conf = r#"{"cniVersion":"0.3.1","name":"n","type":"flannel"}"#;
    let cases: Vec<(&str, Vec<ConfFile>, Option<&str>, usize)> = vec![
        ("empty dir", vec![], None, 0),
        (
            "lexical order, not creation order",
            vec![file("20-b.conflist", ok_list), file("10-a.conf", ok_conf)],
            Some("10-a.conf"),
            0,
        ),
        (
            "json counts",
            vec![file("30-c.json", ok_conf), file("40-d.conf", ok_conf)],
            Some("30-c.json"),
            0,
        ),
        (
            "other extensions are not configs",
            vec![
                file("00-a.txt", ok_conf),
                file("00-b.conf.bak", ok_conf),
                file("50-e.conflist", ok_list),
            ],
            Some("50-e.conflist"),
            0,
        ),
        (
            "invalid json is skipped",
            vec![file("00-bad.conf", "{"), file("10-ok.conflist", ok_list)],
            Some("10-ok.conflist"),
            1,
        ),
        (
            "a chain without plugins is skipped",
            vec![
                file("00-empty.conflist", r#"{"name":"n","plugins":[]}"#),
                file("10-ok.conf", ok_conf),
            ],
            Some("10-ok.conf"),
            1,
        ),
        (
            "a conf without type is skipped",
            vec![
                file("00-x.conf", r#"{"name":"n"}"#),
                file("10-ok.conf", ok_conf),
            ],
            Some("10-ok.conf"),
            1,
        ),
        (
            "a plugin that is not an object is skipped",
            vec![
                file("00-x.conflist", r#"{"plugins":[1]}"#),
                file("10-ok.conf", ok_conf),
            ],
            Some("10-ok.conf"),
            1,
        ),
        (
            "our own file is never the primary",
            vec![
                file("02-istio-cni.conflist", ok_list),
                file("10-ok.conf", ok_conf),
            ],
            Some("10-ok.conf"),
            0,
        ),
        ("nothing valid", vec![file("00-bad.conf", "[]")], None, 1),
    ];
    for (what, files, want, skipped) in cases {
        let got = select_primary(&files, &[DEFAULT_OWNED_FILE]);
        assert_eq!(got.primary.as_deref(), want, "{what}");
        assert_eq!(got.skipped.len(), skipped, "{what}: {:?}", got.skipped);
    }
}

#[test]
fn a_conflist_gets_our_entry_last_and_keeps_everything_else() {
    let out = chain_into("10-bridge.conflist", BRIDGE.as_bytes(), &entry()).unwrap();
    assert_eq!(out.name, "10-bridge.conflist");
    let text = String::from_utf8(out.content.clone()).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    let orig: Value = serde_json::from_str(BRIDGE).unwrap();
    assert_eq!(v["plugins"][0], orig["plugins"][0]);
    assert_eq!(v["plugins"][1], orig["plugins"][1]);
    assert_eq!(v["plugins"][2], serde_json::to_value(entry()).unwrap());
    assert_eq!(v["plugins"].as_array().unwrap().len(), 3);
    // Other plugins' text and the top-level key order survive.
    assert!(text.contains(r#"{"type": "bridge", "bridge": "cni0", "ipam": {"type": "host-local", "zeta": 1, "alpha": 2}}"#), "{text}");
    let keys: Vec<usize> = [
        "\"cniVersion\"",
        "\"name\"",
        "\"plugins\"",
        "\"zz\"",
        "\"aa\"",
    ]
    .iter()
    .map(|k| text.find(k).unwrap())
    .collect();
    assert!(keys.windows(2).all(|w| w[0] < w[1]), "{text}");
    // Our entry's keys in Istio's order.
    let ours = text.rfind("\"name\":\"istio-cni\"").unwrap();
    let order = [
        "\"type\"",
        "\"plugin_log_level\"",
        "\"cni_agent_run_dir\"",
        "\"ambient_enabled\"",
        "\"enablement_selectors\"",
        "\"exclude_namespaces\"",
        "\"pod_namespace\"",
        "\"native_nftables\"",
        "\"enable_ambient_detection_retry\"",
    ];
    let mut at = ours;
    for k in order {
        let p = at
            + text[at..]
                .find(k)
                .unwrap_or_else(|| panic!("{k} in {text}"));
        at = p;
    }
    assert!(is_installed(&out.name, &out.content, &entry()));
    assert!(!is_installed(
        "10-bridge.conflist",
        BRIDGE.as_bytes(),
        &entry()
    ));
}

#[test]
fn chaining_twice_is_a_fixed_point_and_an_old_entry_is_replaced() {
    let once = chain_into("10-bridge.conflist", BRIDGE.as_bytes(), &entry()).unwrap();
    let twice = chain_into(&once.name, &once.content, &entry()).unwrap();
    assert_eq!(once, twice);

    // An older entry in the middle (another version, other settings) moves to the end.
    let mut old = entry();
    old.plugin_log_level = "debug".into();
    let stale = format!(
        r#"{{"name":"n","plugins":[{{"type":"bridge"}},{},{{"type":"portmap"}}]}}"#,
        serde_json::to_string(&old).unwrap()
    );
    assert!(!is_installed("a.conflist", stale.as_bytes(), &entry()));
    let out = chain_into("a.conflist", stale.as_bytes(), &entry()).unwrap();
    let v: Value = serde_json::from_slice(&out.content).unwrap();
    let types: Vec<&str> = v["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["type"].as_str().unwrap())
        .collect();
    assert_eq!(types, ["bridge", "portmap", "istio-cni"]);
    assert_eq!(v["plugins"][2]["plugin_log_level"], "info");
}

#[test]
fn a_single_plugin_conf_is_wrapped_and_renamed() {
    let conf = r#"{"cniVersion":"0.3.1","name":"cbr0","type":"flannel","delegate":{"isDefaultGateway":true}}"#;
    for name in ["10-flannel.conf", "10-flannel.json"] {
        let out = chain_into(name, conf.as_bytes(), &entry()).unwrap();
        assert_eq!(out.name, "10-flannel.conflist");
        let v: Value = serde_json::from_slice(&out.content).unwrap();
        assert_eq!(v["name"], WRAPPED_NETWORK_NAME);
        assert_eq!(v["cniVersion"], WRAPPED_CNI_VERSION);
        assert_eq!(
            v["plugins"][0],
            serde_json::from_str::<Value>(conf).unwrap()
        );
        assert_eq!(v["plugins"][1]["type"], PLUGIN_TYPE);
        assert!(String::from_utf8(out.content).unwrap().contains(conf));
    }
}

#[test]
fn removal_restores_the_original_chain() {
    let out = chain_into("10-bridge.conflist", BRIDGE.as_bytes(), &entry()).unwrap();
    let removed = remove_from(&out.name, &out.content).unwrap().unwrap();
    assert_eq!(
        serde_json::from_slice::<Value>(&removed).unwrap(),
        serde_json::from_str::<Value>(BRIDGE).unwrap()
    );
    assert!(!has_entry(&out.name, &removed));
    assert_eq!(remove_from(&out.name, &removed).unwrap(), None);
    assert!(remove_from("x.conflist", b"{").is_err());
}

#[test]
fn invalid_primaries_are_refused_with_the_file_named() {
    let err = chain_into("10-x.conflist", b"{\"plugins\":[]}", &entry()).unwrap_err();
    assert!(err.to_string().contains("10-x.conflist"), "{err}");
    assert!(chain_into("10-x.txt", b"{}", &entry()).is_err());
    let big = vec![b' '; MAX_CONF_BYTES + 1];
    assert!(matches!(
        chain_into("10-x.conf", &big, &entry()),
        Err(ConfError::TooLarge { .. })
    ));
}

#[test]
fn the_standalone_file_is_our_entry_with_a_version() {
    let out = standalone(DEFAULT_STANDALONE_FILE, &entry());
    assert_eq!(out.name, "YYY-istio-cni.conf");
    let v: Value = serde_json::from_slice(&out.content).unwrap();
    let mut want = serde_json::to_value(entry()).unwrap();
    want["cniVersion"] = json!("0.3.1");
    assert_eq!(v, want);
    assert!(validate(&out.name, &out.content).is_ok());
}

#[test]
fn files_sorting_before_the_owned_file_are_reported() {
    let ok = r#"{"name":"n","type":"bridge"}"#;
    let files = vec![
        file("01-other.conf", ok),
        file("00-bad.conf", "nope"),
        file("02-istio-cni.conflist", ok),
        file("10-bridge.conf", ok),
    ];
    assert_eq!(
        outranking(&files, DEFAULT_OWNED_FILE),
        vec!["01-other.conf"]
    );
}

/// Found by the `cni_conflist` fuzz target: a `.conf` with two `type` keys passed the check
/// but made a conflist whose first plugin could not be read.
#[test]
fn a_conf_with_two_type_keys_is_refused_as_a_list_entry_would_be() {
    let conf = br#"{"cniVersion":"0.3.1","type":"bridge","type":"bri0","name":"n"}"#;
    assert!(matches!(
        validate("10-net.conf", conf),
        Err(ConfError::NoType { .. })
    ));
    assert!(chain_into("10-net.conf", conf, &entry()).is_err());
}
