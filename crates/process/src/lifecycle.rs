//! A process's life, the one way every ambit process lives it: a metrics registry with the
//! process's own figures, then serving until SIGTERM, SIGINT or `/quitquitquit`
//! ([`Lifecycle::shutdown_requested`]), then a drain bounded by a deadline
//! ([`Lifecycle::drain`]).

use std::time::Duration;

use prometheus_client::registry::Registry;
use tokio::sync::mpsc;

use ambit_runtime::drain::{DrainTrigger, DrainWatcher};

/// A registry holding the process's own metrics (CPU, memory, file descriptors, the async
/// runtime's), as every ambit process reports them. Call it within the tokio runtime.
pub fn registry() -> Registry {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(
        ambit_runtime::process_metrics::ProcessAndRuntime {
            runtime: tokio::runtime::Handle::current(),
        },
    ));
    registry
}

/// How a process is told to stop, and its drain.
pub struct Lifecycle {
    /// What the admin endpoint's `/quitquitquit` sends on.
    pub quit: mpsc::Sender<()>,
    quit_requests: mpsc::Receiver<()>,
    trigger: DrainTrigger,
    /// What every listener and connection watches for the drain.
    pub drain: DrainWatcher,
}

impl Default for Lifecycle {
    fn default() -> Self {
        let (quit, quit_requests) = mpsc::channel(1);
        let (trigger, drain) = ambit_runtime::drain::new();
        Lifecycle {
            quit,
            quit_requests,
            trigger,
            drain,
        }
    }
}

impl Lifecycle {
    /// Resolves on SIGTERM, SIGINT or a `/quitquitquit`.
    pub async fn shutdown_requested(&mut self) {
        ambit_runtime::drain::shutdown_requested(&mut self.quit_requests).await;
    }

    /// Begins the drain (`what`: what may finish, for the log) and waits until every
    /// watcher is done or `deadline` passes: true when it finished cleanly.
    pub async fn drain(self, deadline: Duration, what: &str) -> bool {
        tracing::info!(?deadline, "draining: {what}");
        drop(self.drain);
        let clean = self.trigger.drain(deadline).await;
        if !clean {
            tracing::warn!("drain deadline passed: closed the remaining connections");
        }
        clean
    }
}
