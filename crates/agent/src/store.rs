//! The enrolled pods, persisted so that a restarted agent knows them: a JSON file in the
//! state dir (default [`DEFAULT_STATE_DIR`]), keyed by pod UID, replaced atomically on every
//! change (write a temporary file under an unpredictable name, `fsync`, `rename`, `fsync`
//! the directory).
//!
//! Without Kubernetes this file is the agent's source of truth for "which pods are
//! enrolled" (Istio's agent rebuilds the same knowledge from pod annotations).

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{self, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use ambit_cni::api::PodInfo;
use serde::{Deserialize, Serialize};

/// Where the agent keeps its state unless configured otherwise.
pub const DEFAULT_STATE_DIR: &str = ambit_wellknown::paths::AGENT_STATE_DIR;

/// The file name inside the state dir.
pub const STORE_FILE: &str = "pods.json";

const FORMAT_VERSION: u32 = 1;

/// Why the store could not be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    #[error("pod store {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("pod store {path} is not valid (fix or remove it; enrolled pods are then forgotten): {source}")]
    Corrupt {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error(
        "pod store {path} has format version {found}, this agent reads version {FORMAT_VERSION}"
    )]
    Version { path: PathBuf, found: u32 },
}

#[derive(Serialize, Deserialize)]
struct StoreFile {
    version: u32,
    pods: Vec<PodInfo>,
}

/// The enrolled pods, by UID.
#[derive(Debug)]
pub struct PodStore {
    path: PathBuf,
    pods: BTreeMap<String, PodInfo>,
}

impl PodStore {
    /// Opens (creating the directory, mode 0700, if needed) and loads the store in
    /// `state_dir`. A missing file is an empty store.
    pub fn open(state_dir: &Path) -> Result<PodStore, StoreError> {
        let path = state_dir.join(STORE_FILE);
        let io_err = |source| StoreError::Io {
            path: path.clone(),
            source,
        };
        create_private_dir(state_dir).map_err(io_err)?;
        let pods = match fs::read(&path) {
            Ok(bytes) => {
                let file: StoreFile =
                    serde_json::from_slice(&bytes).map_err(|source| StoreError::Corrupt {
                        path: path.clone(),
                        source,
                    })?;
                if file.version != FORMAT_VERSION {
                    return Err(StoreError::Version {
                        path,
                        found: file.version,
                    });
                }
                file.pods.into_iter().map(|p| (p.uid.clone(), p)).collect()
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => return Err(io_err(e)),
        };
        Ok(PodStore { path, pods })
    }

    /// The store file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The pod with `uid`.
    pub fn get(&self, uid: &str) -> Option<&PodInfo> {
        self.pods.get(uid)
    }

    /// Every pod, by UID order.
    pub fn pods(&self) -> impl Iterator<Item = &PodInfo> {
        self.pods.values()
    }

    pub fn len(&self) -> usize {
        self.pods.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }

    /// Inserts or replaces `pod` and persists. On a write error the in-memory store is
    /// unchanged.
    pub fn upsert(&mut self, pod: PodInfo) -> Result<(), StoreError> {
        let old = self.pods.insert(pod.uid.clone(), pod.clone());
        if let Err(e) = self.persist() {
            match old {
                Some(o) => self.pods.insert(o.uid.clone(), o),
                None => self.pods.remove(&pod.uid),
            };
            return Err(e);
        }
        Ok(())
    }

    /// Removes the pod `uid` and persists; returns it if it was there.
    pub fn remove(&mut self, uid: &str) -> Result<Option<PodInfo>, StoreError> {
        let Some(old) = self.pods.remove(uid) else {
            return Ok(None);
        };
        if let Err(e) = self.persist() {
            self.pods.insert(old.uid.clone(), old);
            return Err(e);
        }
        Ok(Some(old))
    }

    /// Writes the whole store atomically.
    pub fn persist(&self) -> Result<(), StoreError> {
        let file = StoreFile {
            version: FORMAT_VERSION,
            pods: self.pods.values().cloned().collect(),
        };
        let mut bytes = serde_json::to_vec_pretty(&file).map_err(|e| StoreError::Io {
            path: self.path.clone(),
            source: io::Error::other(e),
        })?;
        bytes.push(b'\n');
        write_atomic(&self.path, &bytes).map_err(|source| StoreError::Io {
            path: self.path.clone(),
            source,
        })
    }
}

/// Creates `dir` and its parents; a newly created leaf gets mode 0700.
pub(crate) fn create_private_dir(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    if dir.is_dir() {
        return Ok(());
    }
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// Replaces `path` with `bytes`: a temp file beside it (an unpredictable name, created
/// exclusively and 0600, so nothing planted there is opened or followed), fsynced, renamed.
fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .suffix(".tmp")
        .permissions(fs::Permissions::from_mode(0o600))
        .tempfile_in(dir)?;
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    // Make the rename durable.
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(uid: &str, ip: &str) -> PodInfo {
        PodInfo {
            uid: uid.into(),
            name: format!("name-{uid}"),
            namespace: "ns".into(),
            service_account: "sa".into(),
            netns: format!("/var/run/netns/{uid}"),
            ips: vec![ip.parse().unwrap()],
            container_id: "c0ffee".into(),
        }
    }

    #[test]
    fn round_trip_and_atomic_replace() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("a/b");
        let mut store = PodStore::open(&state).unwrap();
        assert!(store.is_empty());
        assert!(!store.path().exists(), "nothing written until a change");

        store.upsert(pod("u1", "10.0.0.1")).unwrap();
        store.upsert(pod("u2", "fd00::2")).unwrap();
        store.upsert(pod("u1", "10.0.0.9")).unwrap();
        assert_eq!(store.len(), 2);

        let reopened = PodStore::open(&state).unwrap();
        assert_eq!(reopened.len(), 2);
        assert_eq!(reopened.get("u1"), Some(&pod("u1", "10.0.0.9")));
        assert_eq!(reopened.get("u2"), Some(&pod("u2", "fd00::2")));
        let uids: Vec<_> = reopened.pods().map(|p| p.uid.as_str()).collect();
        assert_eq!(uids, ["u1", "u2"]);

        let mut store = reopened;
        assert_eq!(store.remove("u1").unwrap().unwrap().uid, "u1");
        assert_eq!(store.remove("u1").unwrap(), None);
        let reopened = PodStore::open(&state).unwrap();
        assert_eq!(reopened.len(), 1);

        // No temporary files left behind.
        let names: Vec<_> = fs::read_dir(&state)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, [STORE_FILE]);
    }

    /// The store used to write through `.pods.json.tmp.<pid>`, opened without `O_EXCL`:
    /// a symlink planted there had the pod list written wherever it pointed.
    #[test]
    fn a_file_planted_at_the_old_temp_name_is_not_followed() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        fs::write(&victim, "precious").unwrap();
        let state = dir.path().join("state");
        let mut store = PodStore::open(&state).unwrap();
        let trap = state.join(format!(".{STORE_FILE}.tmp.{}", std::process::id()));
        std::os::unix::fs::symlink(&victim, &trap).unwrap();
        store.upsert(pod("u1", "10.0.0.1")).unwrap();
        assert_eq!(fs::read_to_string(&victim).unwrap(), "precious");
        assert_eq!(fs::read_link(&trap).unwrap(), victim);
        let file = state.join(STORE_FILE);
        let meta = fs::symlink_metadata(&file).unwrap();
        assert!(meta.file_type().is_file());
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(PodStore::open(&state).unwrap().len(), 1);
    }

    #[test]
    fn corrupt_and_future_files_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(STORE_FILE), b"{not json").unwrap();
        let err = PodStore::open(dir.path()).unwrap_err();
        assert!(matches!(err, StoreError::Corrupt { .. }), "{err}");
        assert!(err.to_string().contains(STORE_FILE), "{err}");

        fs::write(dir.path().join(STORE_FILE), br#"{"version":9,"pods":[]}"#).unwrap();
        let err = PodStore::open(dir.path()).unwrap_err();
        assert!(matches!(err, StoreError::Version { found: 9, .. }), "{err}");
    }

    #[test]
    fn failed_write_leaves_memory_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = PodStore::open(dir.path()).unwrap();
        store.upsert(pod("u1", "10.0.0.1")).unwrap();
        // Make the directory unwritable by replacing the store path with a directory.
        fs::remove_file(dir.path().join(STORE_FILE)).unwrap();
        fs::create_dir(dir.path().join(STORE_FILE)).unwrap();
        store.upsert(pod("u2", "10.0.0.2")).unwrap_err();
        assert_eq!(store.len(), 1);
        store.remove("u1").unwrap_err();
        assert_eq!(store.len(), 1);
    }
}
