//! Readiness as a set of named pending tasks: ready when none is left.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

#[derive(Clone, Default)]
pub struct Ready(Arc<Inner>);

#[derive(Default)]
struct Inner {
    pending: Mutex<BTreeSet<String>>,
    changed: Notify,
}

/// Keeps its task pending until dropped.
pub struct BlockReady {
    ready: Ready,
    name: String,
}

impl Ready {
    pub fn register(&self, name: &str) -> BlockReady {
        self.lock().insert(name.to_string());
        BlockReady {
            ready: self.clone(),
            name: name.to_string(),
        }
    }

    /// The pending tasks, sorted; empty when ready.
    pub fn pending(&self) -> Vec<String> {
        self.lock().iter().cloned().collect()
    }

    /// Waits until nothing but `names` is pending: a proxy that serves nothing before
    /// its configuration is complete waits here with its own task still registered.
    pub async fn until_only(&self, names: &[&str]) {
        loop {
            let changed = self.0.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.lock().iter().all(|p| names.contains(&p.as_str())) {
                return;
            }
            changed.await;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeSet<String>> {
        self.0.pending.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for BlockReady {
    fn drop(&mut self) {
        self.ready.lock().remove(&self.name);
        self.ready.0.changed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_once_every_task_released() {
        let ready = Ready::default();
        let a = ready.register("proxy");
        let b = ready.register("state manager");
        assert_eq!(ready.pending(), vec!["proxy", "state manager"]);
        drop(b);
        assert_eq!(ready.pending(), vec!["proxy"]);
        drop(a);
        assert!(ready.pending().is_empty());
    }

    #[tokio::test]
    async fn until_only_waits_for_the_others() {
        let ready = Ready::default();
        let _proxy = ready.register("proxy");
        let certificate = ready.register("certificate");
        let l7 = ready.register("L7 configuration");
        let waiter = {
            let ready = ready.clone();
            tokio::spawn(async move { ready.until_only(&["proxy"]).await })
        };
        drop(certificate);
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "one block is still pending");
        drop(l7);
        tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
            .await
            .expect("released once only `proxy` is left")
            .unwrap();
    }
}
