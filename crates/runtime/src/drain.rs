//! Graceful shutdown. A [`DrainTrigger`] tells every [`DrainWatcher`] to stop taking new
//! work, then waits until all watchers are gone or a deadline passes, after which it
//! tells the remaining ones to close at once.

use std::time::Duration;

use tokio::sync::{mpsc, watch};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Phase {
    Running,
    Draining,
    Forced,
}

pub struct DrainTrigger {
    phase: watch::Sender<Phase>,
    done: mpsc::Receiver<()>,
    // Kept until drain() so `done` cannot report "all gone" before it was asked.
    _guard: Option<mpsc::Sender<()>>,
}

/// Held by everything that must finish before shutdown completes.
#[derive(Clone)]
pub struct DrainWatcher {
    phase: watch::Receiver<Phase>,
    _alive: mpsc::Sender<()>,
}

pub fn new() -> (DrainTrigger, DrainWatcher) {
    let (phase_tx, phase_rx) = watch::channel(Phase::Running);
    let (alive_tx, alive_rx) = mpsc::channel(1);
    (
        DrainTrigger {
            phase: phase_tx,
            done: alive_rx,
            _guard: Some(alive_tx.clone()),
        },
        DrainWatcher {
            phase: phase_rx,
            _alive: alive_tx,
        },
    )
}

impl DrainTrigger {
    /// Starts draining and waits until every watcher is dropped, or `deadline` passed (then
    /// forces the rest closed and waits briefly for them). Returns whether all finished in time.
    pub async fn drain(mut self, deadline: Duration) -> bool {
        self._guard = None;
        let _ = self.phase.send(Phase::Draining);
        if tokio::time::timeout(deadline, self.done.recv())
            .await
            .is_ok()
        {
            return true;
        }
        let _ = self.phase.send(Phase::Forced);
        let _ = tokio::time::timeout(Duration::from_secs(1), self.done.recv()).await;
        false
    }

    /// Forces every watcher closed at once (an in-pod workload that is gone).
    pub async fn drain_now(self) {
        self.drain(Duration::ZERO).await;
    }

    /// Another watcher, for work started after the trigger was made.
    pub fn watcher(&self) -> Option<DrainWatcher> {
        self._guard.as_ref().map(|alive| DrainWatcher {
            phase: self.phase.subscribe(),
            _alive: alive.clone(),
        })
    }
}

impl DrainWatcher {
    /// Resolves when draining starts: stop accepting new work.
    pub async fn draining(&self) {
        let mut rx = self.phase.clone();
        let _ = rx.wait_for(|p| *p >= Phase::Draining).await;
    }

    /// Resolves when the deadline passed: close what is still open.
    pub async fn forced(&self) {
        let mut rx = self.phase.clone();
        let _ = rx.wait_for(|p| *p >= Phase::Forced).await;
    }

    /// A `watch` that turns true when draining starts (for the HBONE server's GOAWAY).
    pub fn draining_signal(&self) -> watch::Receiver<bool> {
        let (tx, rx) = watch::channel(false);
        let mut phase = self.phase.clone();
        tokio::spawn(async move {
            let _ = phase.wait_for(|p| *p >= Phase::Draining).await;
            let _ = tx.send(true);
        });
        rx
    }
}

/// Resolves on SIGTERM, SIGINT or a message on `quit` (the admin `/quitquitquit`); after
/// it, a second SIGINT exits at once, skipping the drain.
pub async fn shutdown_requested(quit: &mut mpsc::Receiver<()>) {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).ok();
    let mut int = signal(SignalKind::interrupt()).ok();
    let term_fut = async {
        match term.as_mut() {
            Some(s) => {
                s.recv().await;
            }
            None => std::future::pending::<()>().await,
        }
    };
    let int_fut = async {
        match int.as_mut() {
            Some(s) => {
                s.recv().await;
            }
            None => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = term_fut => tracing::info!("received SIGTERM"),
        _ = int_fut => tracing::info!("received SIGINT"),
        _ = quit.recv() => tracing::info!("shutdown requested through /quitquitquit"),
    }
    // A second Ctrl-C means "now": skip the rest of the drain.
    tokio::spawn(async {
        if let Ok(mut int) = signal(SignalKind::interrupt()) {
            int.recv().await;
            tracing::warn!("second SIGINT: exiting without waiting for open connections");
            std::process::exit(1);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn drain_waits_for_watchers_then_forces() {
        let (trigger, watcher) = new();
        let worker = tokio::spawn(async move {
            watcher.draining().await;
            // Pretend to finish a connection that outlives the deadline.
            watcher.forced().await;
            "forced"
        });
        let finished_in_time = trigger.drain(Duration::from_millis(50)).await;
        assert!(!finished_in_time);
        assert_eq!(worker.await.unwrap(), "forced");
    }

    #[tokio::test]
    async fn drain_completes_when_watchers_finish() {
        let (trigger, watcher) = new();
        tokio::spawn(async move {
            watcher.draining().await;
            drop(watcher);
        });
        assert!(trigger.drain(Duration::from_secs(5)).await);
    }
}
