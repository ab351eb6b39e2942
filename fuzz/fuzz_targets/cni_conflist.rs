//! The installer's edit of the host's CNI configuration (files other components write):
//! `ambit_agent::install::conflist`. Whatever a file holds, adding our entry either fails
//! with an error or yields a valid conflist that has the entry, is installed, and loses the
//! entry again on removal.
//!
//! Input: byte 0 picks the file name (`.conf`, `.conflist`, `.json`), the rest is its content.
#![no_main]

use ambit_agent::install::conflist::{
    chain_into, has_entry, is_installed, remove_from, validate, PluginEntry, PLUGIN_TYPE,
};
use libfuzzer_sys::fuzz_target;

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

fuzz_target!(|data: &[u8]| {
    let Some((&pick, content)) = data.split_first() else {
        return;
    };
    let name = ["10-net.conf", "10-net.conflist", "10-net.json"][pick as usize % 3];
    let _ = validate(name, content);
    let entry = entry();
    if let Ok(out) = chain_into(name, content, &entry) {
        assert!(
            validate(&out.name, &out.content).is_ok(),
            "our output is valid"
        );
        assert!(has_entry(&out.name, &out.content));
        assert!(is_installed(&out.name, &out.content, &entry));
        if let Ok(Some(removed)) = remove_from(&out.name, &out.content) {
            assert!(!has_entry(&out.name, &removed));
        }
    }
});
