//! ztunnel-format local configuration YAML (`LOCAL_XDS_PATH` / `LOCAL_XDS`).
//!
//! Input: UTF-8 text (other inputs are skipped: the caller reads a `String`).
#![no_main]

use ambit_state::{parse_local_config, ProxyState};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(yaml) = std::str::from_utf8(data) else {
        return;
    };
    let cfg = match parse_local_config("fuzz", yaml) {
        Ok(cfg) => cfg,
        Err(e) => {
            let _ = e.to_string();
            return;
        }
    };
    // `parse_local_config` promises every check of `from_config` has passed.
    let state = ProxyState::from_config(cfg.clone())
        .unwrap_or_else(|e| panic!("parse_local_config accepted what from_config refuses: {e}"));
    let _ = state.dump();
    // The store's lookups agree with what was loaded.
    for w in state.workloads() {
        assert!(state.workload_by_uid(&w.uid).is_some(), "uid {:?}", w.uid);
        let _ = state.policies_for(w);
    }
    for s in state.services() {
        let key = s.key();
        assert!(state.service_by_key(&key).is_some(), "service {key:?}");
        let _ = state.endpoints(&key).count();
        let _ = state.service_by_hostname(&s.hostname);
    }

    // Round trip: the configuration written back as YAML reads as the same configuration.
    let text = yaml_serde::to_string(&cfg)
        .unwrap_or_else(|e| panic!("accepted configuration does not serialize: {e}"));
    match parse_local_config("again", &text) {
        Ok(again) => assert_eq!(again, cfg, "YAML round trip via:\n{text}"),
        Err(e) => panic!("re-serialized configuration refused: {e}\n{text}"),
    }
});
