//! The node proxy process, `ambit ztunnel`: ztunnel's environment read and checked
//! ([`config`]), the process wired for its mode ([`run`]) from the process kit
//! (`ambit-process`: the environment reader, certificates, operator ports, drain, the
//! watched local mesh file), the admin endpoints and `/config_dump` ([`admin`],
//! [`config_dump`]). The data path itself is `ambit-nodeproxy`.
#![forbid(unsafe_code)]
#![recursion_limit = "256"]

pub mod admin;
pub mod config;
pub mod config_dump;
pub mod run;

use std::process::ExitCode;

/// `ambit ztunnel` (and `ztunnel`, `ztunnel proxy ztunnel`): reads the environment, then
/// runs the node proxy until it is told to stop. Exit status 2 for a configuration that
/// does not hold, 1 for a failure while running.
pub fn main() -> ExitCode {
    let (logs, _flush_logs) = match ambit_runtime::logging::init() {
        Ok(h) => h,
        Err(e) => {
            eprintln!("ambit ztunnel: {e}");
            return ExitCode::from(2);
        }
    };
    let cfg = match config::Config::from_process_env() {
        Ok(c) => c,
        Err(e) => {
            tracing::error!("invalid configuration: {e}");
            eprintln!("ambit ztunnel: invalid configuration: {e}");
            return ExitCode::from(2);
        }
    };
    raise_fd_limit();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("ambit-worker")
        .worker_threads(cfg.worker_threads)
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("ambit ztunnel: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run::run(cfg, Some(logs))) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("ambit ztunnel: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Many connections mean many descriptors: lift the soft limit to the hard one.
fn raise_fd_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((_, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
    }
}
