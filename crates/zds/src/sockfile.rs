//! Unix socket files nobody else can reach, not even for an instant.
//!
//! `bind(2)` creates the socket file with the mode `0777 & !umask`; a `chmod` afterwards
//! leaves a window in which another local process may connect. Changing the umask would
//! close it, but the umask is per process and other threads create files concurrently.
//! So [`bind_private`] binds inside a fresh private directory (mode 0700, ours alone), sets
//! the socket's mode there, and renames it into place: the socket appears at its path
//! with its final mode. A listening socket keeps working across the rename (it is bound to
//! the inode; connecting by path resolves the new name).
//!
//! Directories the helpers create are 0700. An existing directory is left as it is: it may
//! be shared (a Kubernetes `hostPath`), and the socket's own mode and the peer check
//! ([`crate::peer`]) guard the socket in it.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// The mode of the directories created for sockets.
pub const PRIVATE_DIR_MODE: u32 = 0o700;
/// The mode of the socket files.
pub const SOCKET_MODE: u32 = 0o600;

fn with_path(path: &Path, what: &str, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
}

/// Creates `dir` (and missing parents) with mode 0700 when it does not exist.
pub fn ensure_dir(dir: &Path) -> io::Result<()> {
    if dir.as_os_str().is_empty() || dir.is_dir() {
        return Ok(());
    }
    fs::DirBuilder::new()
        .recursive(true)
        .mode(PRIVATE_DIR_MODE)
        .create(dir)
        .map_err(|e| with_path(dir, "create socket directory", e))
}

/// Removes a stale socket file at `path`; anything else there (a regular file, a directory)
/// is an error and is left untouched.
pub fn remove_stale_socket(path: &Path) -> io::Result<()> {
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            fs::remove_file(path).map_err(|e| with_path(path, "remove stale socket", e))
        }
        Ok(_) => Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!(
                "{} exists and is not a socket; not touching it",
                path.display()
            ),
        )),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(with_path(path, "inspect", e)),
    }
}

/// Binds a socket at `path` with mode [`SOCKET_MODE`] and no window in which it has any
/// other mode: `bind` is called with a path inside a private temporary directory next to
/// `path`, the socket is chmod'ed there and renamed to `path`. Creates the parent directory
/// (0700) if missing and replaces a stale socket file. `bind` receives the temporary path
/// and returns the bound socket.
pub fn bind_private<T>(path: &Path, bind: impl FnOnce(&Path) -> io::Result<T>) -> io::Result<T> {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let dir = path.parent().unwrap_or(Path::new(""));
    ensure_dir(dir)?;
    remove_stale_socket(path)?;
    // Short names: the temporary path must fit sun_path (108 bytes) like the final one.
    let tmp_dir: PathBuf = dir.join(format!(
        ".b{}.{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    fs::DirBuilder::new()
        .mode(PRIVATE_DIR_MODE)
        .create(&tmp_dir)
        .map_err(|e| with_path(&tmp_dir, "create private bind directory", e))?;
    let tmp_sock = tmp_dir.join("s");
    let result = (|| {
        let bound = bind(&tmp_sock)?;
        fs::set_permissions(&tmp_sock, fs::Permissions::from_mode(SOCKET_MODE))
            .map_err(|e| with_path(&tmp_sock, "chmod", e))?;
        fs::rename(&tmp_sock, path).map_err(|e| with_path(path, "move the socket to", e))?;
        Ok(bound)
    })();
    let _ = fs::remove_file(&tmp_sock);
    let _ = fs::remove_dir(&tmp_dir);
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::{UnixListener, UnixStream};

    fn mode(path: &Path) -> u32 {
        fs::symlink_metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn socket_is_0600_in_a_new_0700_directory_and_reachable() {
        let root = tempfile::tempdir().unwrap();
        let path = root.path().join("a/b/agent.sock");
        let listener = bind_private(&path, |p| UnixListener::bind(p)).unwrap();
        assert_eq!(mode(&path), SOCKET_MODE);
        assert_eq!(mode(&root.path().join("a/b")), PRIVATE_DIR_MODE);
        assert_eq!(mode(&root.path().join("a")), PRIVATE_DIR_MODE);
        // Nothing left behind but the socket.
        let names: Vec<_> = fs::read_dir(root.path().join("a/b"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["agent.sock"]);
        // The renamed socket still accepts.
        let _client = UnixStream::connect(&path).unwrap();
        listener.accept().unwrap();
    }

    #[test]
    fn existing_directory_keeps_its_mode_and_stale_sockets_are_replaced() {
        let root = tempfile::tempdir().unwrap();
        fs::set_permissions(root.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let path = root.path().join("s.sock");
        drop(bind_private(&path, |p| UnixListener::bind(p)).unwrap());
        assert!(path.exists(), "the socket file outlives its listener");
        let _again = bind_private(&path, |p| UnixListener::bind(p)).unwrap();
        assert_eq!(mode(root.path()), 0o755);
        assert_eq!(mode(&path), SOCKET_MODE);
    }

    #[test]
    fn other_files_are_never_replaced_and_failures_clean_up() {
        let root = tempfile::tempdir().unwrap();
        let file = root.path().join("plain");
        fs::write(&file, b"keep me").unwrap();
        let err = bind_private(&file, |p| UnixListener::bind(p)).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AlreadyExists, "{err}");
        assert_eq!(fs::read(&file).unwrap(), b"keep me");

        let path = root.path().join("x.sock");
        let err = bind_private(&path, |_| -> io::Result<()> {
            Err(io::Error::other("boom"))
        })
        .unwrap_err();
        assert_eq!(err.to_string(), "boom");
        let names: Vec<_> = fs::read_dir(root.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["plain"], "temporary directory left behind");
    }
}
