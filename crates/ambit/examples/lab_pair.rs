//! Two lab nodes with a node proxy pair of either implementation, kept up until Ctrl-C, for
//! profiling by hand (`perf record -p`, `strace -c -p`) under the benchmark's workloads.
//!
//! ```text
//! lab_pair --ambit target/release/ambit [--peer ../shared/peers/istio-ztunnel]
//!     [--client ambit|istio] [--server ambit|istio] [--proxy-env K=V]...
//! ```
//!
//! With `--peer` both proxies are Istio's ztunnel unless `--client`/`--server` say otherwise
//! (a mixed pair shows which side a cost belongs to); without it, ambit's. Prints the
//! namespaces, the proxies' pids, and the commands that drive traffic through them (the
//! benchmark's direct and proxied ports); removes everything on Ctrl-C.

mod common;

use std::path::PathBuf;

use ambit_netns_lab::mesh::{TwoNodes, TwoNodesSpec, APP_PORT, SERVER_IP};
use ambit_netns_lab::peer::{IstioZtunnel, NodeProxy};
use anyhow::{bail, Context};
use common::setup::{self, DIRECT_IPERF_PORT, MESH_IPERF_PORT};

fn main() -> anyhow::Result<()> {
    let mut ambit = None;
    let mut peer = None;
    let mut env = Vec::new();
    let mut sides: [Option<String>; 2] = [None, None];
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut val = || it.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--ambit" => ambit = Some(PathBuf::from(val()?)),
            "--peer" => peer = Some(PathBuf::from(val()?)),
            "--proxy-env" => {
                env.push(ambit_netns_lab::parse_env_pair(&val()?).map_err(anyhow::Error::msg)?)
            }
            "--client" => sides[0] = Some(val()?),
            "--server" => sides[1] = Some(val()?),
            other => bail!("unknown argument {other} (see the top of lab_pair.rs)"),
        }
    }
    let ambit = std::fs::canonicalize(ambit.context("--ambit PATH is required")?)?;
    let peer = peer.map(|dir| IstioZtunnel::find(&dir)).transpose()?;
    let pick = |side: &Option<String>| -> anyhow::Result<NodeProxy> {
        match (side.as_deref(), &peer) {
            (Some("ambit"), _) | (None, None) => Ok(NodeProxy::Ambit(ambit.clone())),
            (Some("istio"), Some(p)) | (None, Some(p)) => Ok(NodeProxy::Istio(p.clone())),
            (Some("istio"), None) => bail!("--client/--server istio needs --peer DIR"),
            (Some(other), _) => bail!("--client/--server take ambit or istio, not {other}"),
        }
    };
    let (client, server) = (pick(&sides[0])?, pick(&sides[1])?);
    let env: Vec<(&str, String)> = env.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    let nodes = TwoNodes::launch(TwoNodesSpec {
        env: &env,
        ..TwoNodesSpec::of("pair", client.clone(), server.clone())
    })?;
    ambit_netns_lab::remove_on_signal(nodes.lab.cleanup_handle());
    setup::dedicated_paths(&nodes)?;
    println!(
        "{} client, {} server up.\nclient node {} (proxy pid {}), server node {} (proxy pid {})",
        client.label(),
        server.label(),
        nodes.client_ns,
        nodes.client_proxy.pid,
        nodes.server_ns,
        nodes.server_proxy.pid
    );
    println!(
        "through the proxies: ip netns exec {} iperf3 -c {SERVER_IP} -p {MESH_IPERF_PORT} -t 10\ndirect:              ip netns exec {} iperf3 -c {SERVER_IP} -p {DIRECT_IPERF_PORT} -t 10\necho app through the proxies: {SERVER_IP}:{APP_PORT}\nCtrl-C removes everything.",
        nodes.client_ns, nodes.client_ns
    );
    loop {
        std::thread::park();
    }
}
