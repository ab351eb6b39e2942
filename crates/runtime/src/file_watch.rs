//! Noticing that a config file or directory changed, the one way every ambit process does:
//! [`Watched`] wakes at once on the kernel's notification (inotify) and on a slow poll
//! regardless, so that a notification lost or unsupported (some network filesystems, a
//! watch that could not be set up) only delays a change to the next poll; and it reports a
//! change only when the path's [`Stamp`] moved (device, inode, size and modification time of
//! the file, or of every file of the directory), so a wake-up that changed nothing reloads
//! nothing and a replacement by rename is always seen.
//!
//! A file is watched through its directory, since editors and Kubernetes' ConfigMap
//! mounts replace a file (a rename) rather than write into it, which would end a watch on
//! the file itself.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

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

/// What identifies a version of a file (device, inode, size, modification time), or of a
/// directory (the same of each file in it, by name): equal stamps, nothing to read again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stamp(Vec<(OsString, u64, u64, u64, Option<SystemTime>)>);

impl Stamp {
    /// The stamp of `path` now; `None` when it cannot be read (missing, say).
    pub fn of(path: &Path) -> Option<Stamp> {
        use std::os::unix::fs::MetadataExt;
        let one = |name: OsString, m: std::fs::Metadata| {
            (name, m.dev(), m.ino(), m.len(), m.modified().ok())
        };
        let meta = std::fs::metadata(path).ok()?;
        if !meta.is_dir() {
            return Some(Stamp(vec![one(OsString::new(), meta)]));
        }
        let mut entries: Vec<_> = std::fs::read_dir(path)
            .ok()?
            .filter_map(|e| {
                let e = e.ok()?;
                // Following links, as a ConfigMap mount's files are.
                let m = std::fs::metadata(e.path()).ok()?;
                Some(one(e.file_name(), m))
            })
            .collect();
        entries.sort();
        Some(Stamp(entries))
    }
}

/// A file or directory watched for changes (see the module docs).
pub struct Watched {
    path: PathBuf,
    watch: FileWatch,
    last: Option<Stamp>,
}

impl Watched {
    /// Watches `path`, polling every `poll` besides; what it is now is the version the
    /// first change is told from (read it before watching). Call it within a tokio runtime.
    pub fn new(path: &Path, poll: Duration) -> Watched {
        Watched {
            path: path.to_path_buf(),
            watch: FileWatch::new(path, poll),
            last: Stamp::of(path),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Resolves once the path's stamp differs from the last one seen (a path that appears,
    /// disappears or changes).
    pub async fn changed(&mut self) {
        loop {
            self.watch.changed().await;
            let now = Stamp::of(&self.path);
            if now != self.last {
                self.last = now;
                return;
            }
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

    /// Only a change of what the path holds moves its stamp: a neighbour written in the
    /// same directory does not; a rewrite, a replacement of the same size, a removal and a
    /// file added to or rewritten in a directory do.
    #[test]
    fn the_stamp_moves_only_with_what_the_path_holds() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("mesh.yaml");
        std::fs::write(&file, "a").unwrap();
        let mut last = Stamp::of(&file);
        assert!(last.is_some());
        let mut step = |what: &str, change: &dyn Fn(), moves: bool| {
            change();
            let now = Stamp::of(&file);
            assert_eq!(now != last, moves, "{what}");
            last = now;
        };
        step(
            "a neighbour",
            &|| std::fs::write(dir.path().join("other"), "x").unwrap(),
            false,
        );
        step("a rewrite", &|| std::fs::write(&file, "bb").unwrap(), true);
        step(
            "a replacement of the same size",
            &|| {
                let tmp = dir.path().join(".mesh.tmp");
                std::fs::write(&tmp, "bb").unwrap();
                std::fs::rename(&tmp, &file).unwrap();
            },
            true,
        );
        step("a removal", &|| std::fs::remove_file(&file).unwrap(), true);
        step("still gone", &|| {}, false);

        let sub = dir.path().join("mesh.d");
        std::fs::create_dir(&sub).unwrap();
        std::fs::write(sub.join("a.yaml"), "a").unwrap();
        let before = Stamp::of(&sub);
        std::fs::write(sub.join("b.yaml"), "b").unwrap();
        let added = Stamp::of(&sub);
        assert_ne!(before, added, "a file added");
        std::fs::write(sub.join("a.yaml"), "aa").unwrap();
        assert_ne!(Stamp::of(&sub), added, "a file rewritten");
    }

    /// A change is reported on the notification, long before the hour-long poll.
    #[tokio::test]
    async fn a_change_is_reported_on_the_notification() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("mesh.yaml");
        std::fs::write(&file, "a").unwrap();
        let mut watched = Watched::new(&file, Duration::from_secs(3600));
        std::fs::write(&file, "b").unwrap();
        // A guard against a hang, not a measure of time.
        tokio::time::timeout(Duration::from_secs(20), watched.changed())
            .await
            .expect("the rewrite was reported");
    }

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
