//! The waypoint's data path on worker threads that each run their own event loop, as
//! Envoy's workers do: an accepted HBONE connection is handed to one worker and lives
//! there, with every task it spawns (the inner HTTP connections) and the onward
//! connections it uses (each worker has its own pools, [`crate::Waypoint::upstream`]).
//! A request then wakes no other thread.
//!
//! Why: on tokio's work-stealing runtime a request's five hops (the inbound HTTP/2
//! connection, the inner HTTP server, the onward HTTP client, the onward HTTP/2 connection
//! and back) were spread over both threads; a profile at 1000 requests/s put 46 % of the
//! waypoint's CPU in the kernel, most of it in waking and switching threads, and one
//! worker thread served 23k requests/s per core against 19k for two
//! (benchmarks/history/2026-12-07-issue-32-waypoint-request-path.md).
//!
//! Accepting, admission, the control plane and the operator ports stay on the process's
//! main runtime.

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::JoinHandle;

thread_local! {
    /// The worker this thread is, `None` off the workers.
    static WORKER: Cell<Option<usize>> = const { Cell::new(None) };
}

/// The worker running the calling thread, if it is one.
pub fn current() -> Option<usize> {
    WORKER.with(Cell::get)
}

/// The running workers.
pub struct Workers {
    handles: Vec<tokio::runtime::Handle>,
    stops: Vec<tokio::sync::oneshot::Sender<()>>,
    threads: Vec<JoinHandle<()>>,
    next: AtomicUsize,
}

impl std::fmt::Debug for Workers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Workers")
            .field("count", &self.handles.len())
            .finish()
    }
}

impl Workers {
    /// Starts `count` workers (at least one), named `ambit-waypoint-<n>`.
    pub fn start(count: usize) -> std::io::Result<Workers> {
        let count = count.max(1);
        let mut workers = Workers {
            handles: Vec::with_capacity(count),
            stops: Vec::with_capacity(count),
            threads: Vec::with_capacity(count),
            next: AtomicUsize::new(0),
        };
        for index in 0..count {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            workers.handles.push(runtime.handle().clone());
            workers.stops.push(stop);
            let thread = std::thread::Builder::new()
                .name(format!("ambit-waypoint-{index}"))
                .spawn(move || {
                    WORKER.with(|w| w.set(Some(index)));
                    runtime.block_on(async {
                        let _ = stopped.await;
                    });
                    // Dropping the runtime cancels what is left: the drain has run.
                })?;
            workers.threads.push(thread);
        }
        Ok(workers)
    }

    pub fn count(&self) -> usize {
        self.handles.len()
    }

    /// Runs `task` on the next worker, in turn.
    pub fn spawn<F>(&self, task: F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        let at = self.next.fetch_add(1, Ordering::Relaxed) % self.handles.len();
        self.handles[at].spawn(task);
    }

    /// Stops every worker (what still runs there is dropped) and waits for its thread.
    pub fn stop(mut self) {
        for stop in self.stops.drain(..) {
            let _ = stop.send(());
        }
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for stop in self.stops.drain(..) {
            let _ = stop.send(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tasks_run_in_turn_on_their_own_threads_and_stay_there() {
        let workers = Workers::start(2).unwrap();
        assert_eq!(workers.count(), 2);
        let (tx, rx) = std::sync::mpsc::channel();
        for _ in 0..4 {
            let tx = tx.clone();
            workers.spawn(async move {
                let first = (current(), std::thread::current().id());
                // A task it spawns, and the task after an await, are on the same thread.
                let inner = tokio::spawn(async { (current(), std::thread::current().id()) })
                    .await
                    .unwrap();
                tokio::task::yield_now().await;
                let after = (current(), std::thread::current().id());
                tx.send((first, inner, after)).unwrap();
            });
        }
        let mut seen = Vec::new();
        for _ in 0..4 {
            let (first, inner, after) = rx.recv().unwrap();
            assert_eq!(first, inner);
            assert_eq!(first, after);
            seen.push(first.0.expect("on a worker"));
        }
        seen.sort_unstable();
        assert_eq!(seen, [0, 0, 1, 1], "handed out in turn");
        assert_eq!(current(), None, "the test's thread is no worker");
        workers.stop();
    }
}
