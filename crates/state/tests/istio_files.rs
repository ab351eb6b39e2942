//! Local config files that Istio's own ztunnel reads must load in ambit unchanged.

use ambit_state::{parse_local_config, ProxyState};

/// The interop suite hands this file to both ztunnels and compares their `/config_dump`.
const RICH_MESH: &str = include_str!("../../testing/interop/tests/interop/rich_mesh.yaml");

#[test]
fn interop_rich_mesh_loads() {
    let cfg = parse_local_config("rich_mesh.yaml", RICH_MESH).unwrap();
    assert_eq!(
        (cfg.workloads.len(), cfg.services.len(), cfg.policies.len()),
        (3, 3, 2)
    );
    let state = ProxyState::from_config(cfg).unwrap();
    let full = state.workload_by_uid("cluster1//v1/Pod/ns1/full").unwrap();
    let keys: Vec<String> = state.policies_for(&full).iter().map(|p| p.key()).collect();
    assert_eq!(keys, ["/g", "ns1/sel"]);
}
