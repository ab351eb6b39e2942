//! The `local_config` target: ztunnel-format local configuration YAML (`LOCAL_XDS_PATH` /
//! `LOCAL_XDS`), parsed and loaded into the node proxy's store.

use ambit_state::{parse_local_config, ProxyState};

/// What the text came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Not UTF-8 (the caller reads a `String`).
    NotText,
    /// Refused by `parse_local_config` (the error as it reads).
    Refused(String),
    /// Loaded: how many workloads, services and policies the store holds.
    Loaded {
        workloads: usize,
        services: usize,
        policies: usize,
    },
}

/// Input: UTF-8 text (other inputs are skipped).
///
/// Checks: `ProxyState::from_config` accepts whatever `parse_local_config` accepted; the
/// store's lookups agree with what was loaded; the configuration written back as YAML
/// parses to an equal configuration.
pub fn run(data: &[u8]) -> Outcome {
    let Ok(yaml) = std::str::from_utf8(data) else {
        return Outcome::NotText;
    };
    let cfg = match parse_local_config("fuzz", yaml) {
        Ok(cfg) => cfg,
        Err(e) => return Outcome::Refused(e.to_string()),
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
    Outcome::Loaded {
        workloads: state.workloads().count(),
        services: state.services().count(),
        policies: state.policies().count(),
    }
}
