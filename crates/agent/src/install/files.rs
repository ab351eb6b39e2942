//! The installer's file operations: atomic writes (a temp file in the same directory under
//! an unpredictable name, created exclusively, fsynced, renamed over the target, so the runtime never reads half a config or runs
//! half a binary), the plugin binary copy, and the plugin's kubeconfig (sans IO).

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use base64::Engine;

use super::conflist::{kind_of, ConfFile, MAX_CONF_BYTES};

/// Mode of a new conf file when there is no original to keep.
pub const DEFAULT_CONF_MODE: u32 = 0o644;
/// Mode of the installed plugin binary.
pub const BINARY_MODE: u32 = 0o755;

/// The kubeconfig's names (§4.1).
pub const KUBECONFIG_FILE: &str = "istio-cni-kubeconfig";
pub const KUBECONFIG_CONTEXT: &str = "istio-cni-context";
pub const KUBECONFIG_CLUSTER: &str = "local";
pub const KUBECONFIG_USER: &str = "istio-cni";

/// Largest service-account token or CA bundle read.
pub const MAX_SECRET_BYTES: u64 = 1024 * 1024;

fn with_path(path: &Path, what: &str) -> impl FnOnce(io::Error) -> io::Error {
    let p = path.display().to_string();
    let what = what.to_owned();
    move |e| io::Error::new(e.kind(), format!("cannot {what} {p}: {e}"))
}

/// A new file beside `target`, to be renamed onto it: an unpredictable name, created
/// exclusively (`O_EXCL`: a file or symlink planted there is never opened, let alone
/// followed), with `mode` from the start (the umask may narrow it; the caller sets it
/// exactly before the rename). Removed when dropped unless persisted.
pub fn create_temp(target: &Path, mode: u32) -> io::Result<tempfile::NamedTempFile> {
    let name = target
        .file_name()
        .ok_or_else(|| io::Error::other(format!("{} has no file name", target.display())))?;
    let dir = match target.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut prefix = std::ffi::OsString::from(".");
    prefix.push(name);
    prefix.push(".");
    tempfile::Builder::new()
        .prefix(&prefix)
        .suffix(".tmp")
        .permissions(fs::Permissions::from_mode(mode))
        .tempfile_in(dir)
        .map_err(with_path(target, "create a temp file beside"))
}

/// Sets `tmp`'s exact mode, fsyncs it and renames it onto `target`.
fn finish(tmp: tempfile::NamedTempFile, target: &Path, mode: u32) -> io::Result<()> {
    // The umask may have narrowed the mode at creation.
    tmp.as_file()
        .set_permissions(fs::Permissions::from_mode(mode))
        .map_err(with_path(tmp.path(), "chmod"))?;
    tmp.as_file()
        .sync_all()
        .map_err(with_path(tmp.path(), "fsync"))?;
    tmp.persist(target)
        .map(drop)
        .map_err(|e| with_path(target, "rename a temp file onto")(e.error))
}

/// The mode bits of `path`, `None` if it does not exist.
pub fn mode_of(path: &Path) -> io::Result<Option<u32>> {
    match fs::metadata(path) {
        Ok(m) => Ok(Some(m.permissions().mode() & 0o7777)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(with_path(path, "stat")(e)),
    }
}

/// Replaces `path` with `content` atomically, with `mode` (the temp file has it from its
/// creation: a token is never readable by others, not even for an instant).
pub fn write_atomic(path: &Path, content: &[u8], mode: u32) -> io::Result<()> {
    let mut tmp = create_temp(path, mode)?;
    tmp.write_all(content)
        .map_err(with_path(tmp.path(), "write"))?;
    finish(tmp, path, mode)
}

/// Replaces `path` atomically, keeping its current mode (or `default_mode` if new).
pub fn write_keeping_mode(path: &Path, content: &[u8], default_mode: u32) -> io::Result<()> {
    let mode = mode_of(path)?.unwrap_or(default_mode);
    write_atomic(path, content, mode)
}

/// Reads at most `max` bytes of `path` (more is an error); `None` if it does not exist.
pub fn read_limited(path: &Path, max: u64) -> io::Result<Option<Vec<u8>>> {
    let f = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(with_path(path, "open")(e)),
    };
    let mut buf = Vec::new();
    f.take(max + 1)
        .read_to_end(&mut buf)
        .map_err(with_path(path, "read"))?;
    if buf.len() as u64 > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} is larger than {max} bytes", path.display()),
        ));
    }
    Ok(Some(buf))
}

/// Removes `path`; `false` if it was not there.
pub fn remove_if_exists(path: &Path) -> io::Result<bool> {
    match fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(with_path(path, "remove")(e)),
    }
}

/// The CNI config files of `dir` (by extension), each read up to the size limit plus one
/// byte, so an oversized file is refused by the parser rather than read whole.
pub fn list_conf_dir(dir: &Path) -> io::Result<Vec<ConfFile>> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).map_err(with_path(dir, "list"))? {
        let entry = entry.map_err(with_path(dir, "list"))?;
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        if kind_of(&name).is_none() || !entry.file_type().map(|t| !t.is_dir()).unwrap_or(false) {
            continue;
        }
        let mut content = Vec::new();
        match File::open(entry.path()) {
            Ok(f) => {
                f.take(MAX_CONF_BYTES as u64 + 1)
                    .read_to_end(&mut content)
                    .map_err(with_path(&entry.path(), "read"))?;
            }
            // Removed while we listed.
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(with_path(&entry.path(), "open")(e)),
        }
        out.push(ConfFile { name, content });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

fn same_content(a: &Path, b: &Path) -> io::Result<bool> {
    let (ma, mb) = match (fs::metadata(a), fs::metadata(b)) {
        (Ok(ma), Ok(mb)) => (ma, mb),
        (_, Err(e)) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        (Err(e), _) => return Err(with_path(a, "stat")(e)),
        (_, Err(e)) => return Err(with_path(b, "stat")(e)),
    };
    if ma.len() != mb.len() {
        return Ok(false);
    }
    let (mut fa, mut fb) = (
        File::open(a).map_err(with_path(a, "open"))?,
        File::open(b).map_err(with_path(b, "open"))?,
    );
    let (mut ba, mut bb) = (vec![0u8; 64 * 1024], vec![0u8; 64 * 1024]);
    loop {
        let n = read_full(&mut fa, &mut ba).map_err(with_path(a, "read"))?;
        let m = read_full(&mut fb, &mut bb).map_err(with_path(b, "read"))?;
        if n != m || ba[..n] != bb[..m] {
            return Ok(false);
        }
        if n == 0 {
            return Ok(true);
        }
    }
}

fn read_full(f: &mut File, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

/// Installs `source` as `target` (executable) unless it is already identical; returns
/// whether it copied. The copy goes to a temp file first, so a runtime starting the
/// plugin meanwhile runs the old binary or the new one, never a torn one.
pub fn install_binary(source: &Path, target: &Path) -> io::Result<bool> {
    if same_content(source, target)? {
        return Ok(false);
    }
    let mut src = File::open(source).map_err(with_path(source, "open"))?;
    let mut tmp = create_temp(target, BINARY_MODE)?;
    io::copy(&mut src, &mut tmp).map_err(with_path(tmp.path(), "copy the plugin binary to"))?;
    finish(tmp, target, BINARY_MODE)?;
    Ok(true)
}

/// How the plugin's client checks the API server's certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerTrust {
    /// PEM bundle (the service account's `ca.crt` or `KUBE_CA_FILE`).
    Ca(Vec<u8>),
    /// `SKIP_TLS_VERIFY=true`.
    Insecure,
}

/// The plugin's kubeconfig (YAML): one cluster `local`, one user `istio-cni` with the
/// service account's token, one context.
pub fn kubeconfig(server: &str, trust: &ServerTrust, token: &str) -> String {
    let mut cluster = serde_json::Map::new();
    cluster.insert("server".into(), server.into());
    match trust {
        ServerTrust::Ca(pem) => {
            cluster.insert(
                "certificate-authority-data".into(),
                base64::engine::general_purpose::STANDARD.encode(pem).into(),
            );
        }
        ServerTrust::Insecure => {
            cluster.insert("insecure-skip-tls-verify".into(), true.into());
        }
    }
    let doc = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": KUBECONFIG_CLUSTER, "cluster": cluster}],
        "users": [{"name": KUBECONFIG_USER, "user": {"token": token}}],
        "contexts": [{"name": KUBECONFIG_CONTEXT,
                      "context": {"cluster": KUBECONFIG_CLUSTER, "user": KUBECONFIG_USER}}],
        "current-context": KUBECONFIG_CONTEXT,
    });
    yaml_serde::to_string(&doc).expect("a JSON document always converts to YAML")
}

/// `protocol://host:port`, an IPv6 host in brackets.
pub fn server_url(protocol: &str, host: &str, port: &str) -> String {
    let host = if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]")
    } else {
        host.to_owned()
    };
    format!("{protocol}://{host}:{port}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kubeconfig_has_istios_names_and_reads_back() {
        let text = kubeconfig(
            "https://10.96.0.1:443",
            &ServerTrust::Ca(b"PEM".to_vec()),
            "tok",
        );
        let v: serde_json::Value = yaml_serde::from_str(&text).unwrap();
        assert_eq!(v["current-context"], "istio-cni-context");
        assert_eq!(v["contexts"][0]["context"]["cluster"], "local");
        assert_eq!(v["contexts"][0]["context"]["user"], "istio-cni");
        assert_eq!(v["clusters"][0]["name"], "local");
        assert_eq!(
            v["clusters"][0]["cluster"]["server"],
            "https://10.96.0.1:443"
        );
        assert_eq!(
            v["clusters"][0]["cluster"]["certificate-authority-data"],
            "UEVN"
        );
        assert_eq!(v["users"][0]["user"]["token"], "tok");
        let insecure = kubeconfig("https://h:1", &ServerTrust::Insecure, "t");
        let v: serde_json::Value = yaml_serde::from_str(&insecure).unwrap();
        assert_eq!(
            v["clusters"][0]["cluster"]["insecure-skip-tls-verify"],
            true
        );
        assert!(v["clusters"][0]["cluster"]
            .get("certificate-authority-data")
            .is_none());
        // kube-rs reads it.
        kube::config::Kubeconfig::from_yaml(&text).unwrap();
    }

    #[test]
    fn server_urls() {
        assert_eq!(
            server_url("https", "10.0.0.1", "443"),
            "https://10.0.0.1:443"
        );
        assert_eq!(
            server_url("https", "fd00::1", "6443"),
            "https://[fd00::1]:6443"
        );
        assert_eq!(server_url("http", "[fd00::1]", "80"), "http://[fd00::1]:80");
    }

    /// The temp file has its mode from the moment it exists (never wider than asked, the
    /// umask can only narrow it), under a fresh name each time.
    #[test]
    fn temp_files_have_their_mode_from_creation_and_fresh_names() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join(KUBECONFIG_FILE);
        for mode in [0o600, 0o640, 0o400] {
            let a = create_temp(&target, mode).unwrap();
            let b = create_temp(&target, mode).unwrap();
            let got = fs::symlink_metadata(a.path()).unwrap().permissions().mode() & 0o7777;
            assert_eq!(got & !mode, 0, "{got:o} is wider than {mode:o}");
            assert_eq!(got & 0o700, mode & 0o700, "the owner's bits, {got:o}");
            assert_ne!(a.path(), b.path());
            let name = a.path().file_name().unwrap().to_str().unwrap().to_owned();
            assert!(
                name.starts_with(".istio-cni-kubeconfig.") && name.ends_with(".tmp"),
                "{name}"
            );
            assert!(!name.contains(&std::process::id().to_string()), "{name}");
        }
        assert_eq!(
            fs::read_dir(dir.path()).unwrap().count(),
            0,
            "dropped temps go"
        );
    }

    #[test]
    fn atomic_writes_keep_the_mode_and_binaries_copy_once() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("10-x.conflist");
        write_atomic(&p, b"one", 0o600).unwrap();
        assert_eq!(mode_of(&p).unwrap(), Some(0o600));
        write_keeping_mode(&p, b"two", 0o644).unwrap();
        assert_eq!(mode_of(&p).unwrap(), Some(0o600));
        assert_eq!(fs::read(&p).unwrap(), b"two");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1, "no temp left");

        let src = dir.path().join("src");
        fs::write(&src, b"\x7fELF...").unwrap();
        let dst = dir.path().join("istio-cni");
        assert!(install_binary(&src, &dst).unwrap());
        assert!(!install_binary(&src, &dst).unwrap());
        assert_eq!(mode_of(&dst).unwrap(), Some(0o755));
        fs::write(&src, b"\x7fELF,,,").unwrap();
        assert!(install_binary(&src, &dst).unwrap());
        assert_eq!(fs::read(&dst).unwrap(), b"\x7fELF,,,");

        assert_eq!(read_limited(&dir.path().join("none"), 10).unwrap(), None);
        assert!(read_limited(&src, 3).is_err());
    }
}
