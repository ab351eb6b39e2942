//! Readiness as a set of named pending tasks: ready when none is left.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

#[derive(Clone, Default)]
pub struct Ready(Arc<Mutex<BTreeSet<String>>>);

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

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeSet<String>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for BlockReady {
    fn drop(&mut self) {
        self.ready.lock().remove(&self.name);
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
}
