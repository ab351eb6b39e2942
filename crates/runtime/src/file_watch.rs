//! Waking when a config file or directory may have changed: at once on the kernel's
//! notification (inotify), and on a slow poll regardless, so that a notification lost or
//! unsupported (some network filesystems, a watch that could not be set up) only delays a
//! change to the next poll. Callers still compare what they read: a wake-up says "look",
//! not "it changed".
//!
//! A file is watched through its directory, since editors and Kubernetes' ConfigMap
//! mounts replace a file (a rename) rather than write into it, which would end a watch on
//! the file itself.

use std::path::Path;
use std::time::Duration;

use futures_util::{FutureExt, StreamExt};
use inotify::{EventStream, Inotify, WatchMask};

/// How long after a notification to look, so that a file being written is read whole
/// (a write is a truncate and one or more writes, each its own event).
pub const SETTLE: Duration = Duration::from_millis(10);

/// The wake-ups for one path.
pub struct FileWatch {
    /// `None` without notifications (polling only).
    events: Option<EventStream<Vec<u8>>>,
    tick: tokio::time::Interval,
}

/// Changes to what a directory holds: writes, replacements, creations, removals.
fn mask() -> WatchMask {
    WatchMask::MODIFY
        | WatchMask::CLOSE_WRITE
        | WatchMask::ATTRIB
        | WatchMask::CREATE
        | WatchMask::DELETE
        | WatchMask::MOVED_FROM
        | WatchMask::MOVED_TO
        | WatchMask::DELETE_SELF
        | WatchMask::MOVE_SELF
}

impl FileWatch {
    /// Watches `path` (a file, or a directory and the files in it), polling every `poll`
    /// besides. Never fails: without notifications it polls only (and logs why). Call it
    /// within a tokio runtime.
    pub fn new(path: &Path, poll: Duration) -> FileWatch {
        let target = if path.is_dir() {
            path.to_path_buf()
        } else {
            path.parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(Path::new("."))
                .to_path_buf()
        };
        let events = Inotify::init().and_then(|inotify| {
            inotify.watches().add(&target, mask())?;
            inotify.into_event_stream(vec![0u8; 4096])
        });
        let events = match events {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(
                    path = %target.display(),
                    "no change notifications ({e}); polling every {poll:?} only"
                );
                None
            }
        };
        let mut tick = tokio::time::interval(poll);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The first tick is immediate; callers read once before they watch.
        tick.reset();
        FileWatch { events, tick }
    }

    /// Resolves when the path may have changed.
    pub async fn changed(&mut self) {
        tokio::select! {
            notified = next_event(&mut self.events) => {
                if !notified {
                    // The stream ended or failed: polling from here on.
                    self.events = None;
                    return;
                }
                tokio::time::sleep(SETTLE).await;
                // Events of the same write, already seen to.
                if let Some(events) = &mut self.events {
                    while let Some(Some(Ok(_))) = events.next().now_or_never() {}
                }
            }
            _ = self.tick.tick() => {}
        }
    }
}

/// True on the next event, false when the stream ends or fails; never resolves without
/// a stream.
async fn next_event(events: &mut Option<EventStream<Vec<u8>>>) -> bool {
    match events {
        Some(s) => matches!(s.next().await, Some(Ok(_))),
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A write, a replacement by rename (as editors and ConfigMap mounts make) and a new
    /// file in a watched directory each wake the watch long before its poll would.
    async fn woke(w: &mut FileWatch) -> bool {
        tokio::time::timeout(Duration::from_secs(20), w.changed())
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn writes_and_replacements_wake_it_before_the_poll() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config.yaml");
        std::fs::write(&file, "a").unwrap();
        let hour = Duration::from_secs(3600);
        let mut watch = FileWatch::new(&file, hour);
        std::fs::write(&file, "b").unwrap();
        assert!(woke(&mut watch).await, "a write");
        let tmp = dir.path().join(".config.yaml.tmp");
        std::fs::write(&tmp, "c").unwrap();
        std::fs::rename(&tmp, &file).unwrap();
        assert!(woke(&mut watch).await, "a replacement");
        // The watch survives the replacement.
        std::fs::write(&file, "d").unwrap();
        assert!(woke(&mut watch).await, "a write after the replacement");

        let mut on_dir = FileWatch::new(dir.path(), hour);
        std::fs::write(dir.path().join("new.yaml"), "x").unwrap();
        assert!(woke(&mut on_dir).await, "a new file in a directory");
    }
}
