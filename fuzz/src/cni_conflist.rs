//! The `cni_conflist` target: the installer's edit of the host's CNI configuration (files
//! other components write), `ambit_agent::install::conflist`.

use ambit_agent::install::conflist::{
    chain_into, has_entry, is_installed, remove_from, validate, PluginEntry, PLUGIN_TYPE,
};

fn entry() -> PluginEntry {
    PluginEntry {
        name: PLUGIN_TYPE.into(),
        plugin_type: PLUGIN_TYPE.into(),
        plugin_log_level: "info".into(),
        cni_agent_run_dir: "/var/run/istio-cni".into(),
        ambient_enabled: true,
        enablement_selectors: serde_json::json!([]),
        exclude_namespaces: vec!["kube-system".into()],
        pod_namespace: "istio-system".into(),
        native_nftables: false,
        enable_ambient_detection_retry: false,
    }
}

/// The file names byte 0 picks from.
pub const NAMES: [&str; 3] = ["10-net.conf", "10-net.conflist", "10-net.json"];

/// What the file came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Our entry was chained in (into the file named), and removed again.
    Chained { into: String },
    /// Refused by the check of the file (the error's variant).
    Refused(String),
    /// No input.
    Empty,
}

/// Byte 0 picks the file name (`% 3`: `.conf`, `.conflist`, `.json`), the rest is its
/// content.
///
/// Checks: adding our entry either fails with an error (exactly when the check of the file
/// fails) or yields a valid conflist that has the entry, is installed, and loses the entry
/// again on removal.
pub fn run(data: &[u8]) -> Outcome {
    let Some((&pick, content)) = data.split_first() else {
        return Outcome::Empty;
    };
    let name = NAMES[pick as usize % 3];
    let valid = validate(name, content);
    let entry = entry();
    let out = match chain_into(name, content, &entry) {
        Ok(out) => out,
        Err(e) => return Outcome::Refused(crate::variant(valid.as_ref().err().unwrap_or(&e))),
    };
    assert!(valid.is_ok(), "chained into a file its check refuses");
    assert!(
        validate(&out.name, &out.content).is_ok(),
        "our output is valid"
    );
    assert!(has_entry(&out.name, &out.content));
    assert!(is_installed(&out.name, &out.content, &entry));
    match remove_from(&out.name, &out.content) {
        Ok(Some(removed)) => assert!(!has_entry(&out.name, &removed)),
        other => panic!("our entry is not removed again: {other:?}"),
    }
    Outcome::Chained { into: out.name }
}
