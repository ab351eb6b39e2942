//! `ambit demo`: a whole mesh on this machine in network namespaces (the lab in
//! `ambit-netns-lab`), real traffic through the node proxies over HBONE, and a short report of
//! what crossed the wire. In-pod mode by default ([`shared`]: the node agent, the CNI chain,
//! a service, a policy, DNS, and HTTP through a real waypoint, [`waypoint`], and one
//! started as istiod starts it, its policy applied with kubectl, [`kubernetes`]); dedicated mode
//! with `--dedicated` ([`dedicated`]). Never linked into a node binary: the `ambit` binary
//! has it only with its `demo` feature.
#![forbid(unsafe_code)]

mod dedicated;
mod kubernetes;
mod report;
mod shared;
mod waypoint;

#[derive(clap::Args, Debug)]
pub struct DemoArgs {
    /// Leave the mesh running and print commands to try by hand; Ctrl-C removes it.
    #[arg(long)]
    pub keep: bool,
    /// Run the node proxies in dedicated mode (one workload per node, no agent) instead of
    /// in-pod mode.
    #[arg(long)]
    pub dedicated: bool,
    /// Extra environment for both node proxies, e.g. `RUST_LOG=debug` (repeatable;
    /// dedicated mode).
    #[arg(long = "proxy-env", value_name = "KEY=VALUE", requires = "dedicated", value_parser = ambit_netns_lab::parse_env_pair)]
    pub proxy_env: Vec<(String, String)>,
}

pub fn run(args: DemoArgs) -> anyhow::Result<()> {
    if args.dedicated {
        dedicated::run(args)
    } else {
        shared::run(args.keep)
    }
}
