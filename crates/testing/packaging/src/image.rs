//! Building the images with `scripts/images`, and reading what is in them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::{run, workspace, Error, Result};

/// The `ambit` binary to put in the images: `AMBIT_BIN`, else the one in this test
/// executable's target directory (`target/<profile>/ambit`). When that is missing or older
/// than a source file, this runs `cargo build -p ambit --bin ambit` (`cargo test -p
/// ambit-packaging` builds only this crate and the libraries it uses; `cargo test --workspace`
/// builds the binary, with the workspace's features, and this leaves it alone).
pub fn ambit_bin() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("AMBIT_BIN") {
        let path = PathBuf::from(p);
        if !path.is_file() {
            return Err(Error::Spec(format!(
                "AMBIT_BIN={} is not a file: build ambit or unset AMBIT_BIN",
                path.display()
            )));
        }
        return Ok(path);
    }
    let exe = std::env::current_exe()?;
    // target/<profile>/deps/<test binary>
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .ok_or_else(|| Error::Spec("the test executable has no target directory".into()))?;
    let target = profile_dir
        .parent()
        .ok_or_else(|| Error::Spec("the test executable has no target directory".into()))?;
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => "dev",
        Some(other) => other,
    };
    let bin = profile_dir.join("ambit");
    let built = std::fs::metadata(&bin).and_then(|m| m.modified()).ok();
    if built.is_some_and(|b| newest_source(&workspace().join("crates")).is_none_or(|s| s <= b)) {
        return Ok(bin);
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    run(
        "cargo build -p ambit --bin ambit",
        Command::new(cargo)
            .current_dir(workspace())
            .args([
                "build",
                "--quiet",
                "-p",
                "ambit",
                "--bin",
                "ambit",
                "--profile",
                profile,
            ])
            .arg("--target-dir")
            .arg(target),
    )?;
    Ok(bin)
}

/// When the newest `.rs` or `Cargo.toml` under `dir` changed (test-only directories and
/// the crates ambit does not link, this one and interop, skipped).
fn newest_source(dir: &Path) -> Option<std::time::SystemTime> {
    let mut newest = None;
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            let name = entry.file_name();
            if path.is_dir() {
                let skipped = [
                    "tests", "benches", "examples", "target", "deploy", "interop",
                ];
                if !skipped.iter().any(|n| name == *n) {
                    dirs.push(path);
                }
                continue;
            }
            let source = path.extension().is_some_and(|e| e == "rs") || name == "Cargo.toml";
            if let (true, Ok(t)) = (source, entry.metadata().and_then(|m| m.modified())) {
                newest = newest.max(Some(t));
            }
        }
    }
    newest
}

/// One built image: its OCI layout, the same as an archive, and the name it loads as.
#[derive(Debug, Clone)]
pub struct OciImage {
    pub layout: PathBuf,
    pub archive: PathBuf,
    pub name: String,
    pub tag: String,
}

#[derive(Debug, Clone)]
pub struct Images {
    pub ztunnel: OciImage,
    pub waypoint: OciImage,
    pub cni: OciImage,
}

/// Runs `scripts/images --binary <binary> --out <out> --tag <tag>`.
pub fn build(binary: &Path, out: &Path, tag: &str) -> Result<Images> {
    run(
        "scripts/images",
        Command::new(workspace().join("scripts/images"))
            .arg("--binary")
            .arg(binary)
            .arg("--out")
            .arg(out)
            .args(["--tag", tag]),
    )?;
    let image = |name: &str| OciImage {
        layout: out.join(name),
        archive: out.join(format!("{name}.tar")),
        name: format!("localhost/ambit/{name}:{tag}"),
        tag: tag.to_string(),
    };
    Ok(Images {
        ztunnel: image("ambit-ztunnel"),
        waypoint: image("ambit-waypoint"),
        cni: image("ambit-cni"),
    })
}

/// A file in an image's layers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    File {
        mode: String,
    },
    Dir,
    /// A symbolic link, to this target.
    Symlink(String),
    /// A hard link to this path.
    Link(String),
}

impl OciImage {
    fn blob(&self, digest: &str) -> Result<PathBuf> {
        let (algo, hex) = digest
            .split_once(':')
            .ok_or_else(|| Error::Spec(format!("digest {digest:?} has no algorithm")))?;
        Ok(self.layout.join("blobs").join(algo).join(hex))
    }

    fn json(&self, path: &Path) -> Result<Value> {
        let text = std::fs::read_to_string(path)?;
        serde_json::from_str(&text).map_err(|e| Error::Output {
            what: path.display().to_string(),
            detail: e.to_string(),
        })
    }

    /// The image's manifest (the one its tag names).
    pub fn manifest(&self) -> Result<Value> {
        let index = self.json(&self.layout.join("index.json"))?;
        let m = index
            .pointer("/manifests")
            .and_then(Value::as_array)
            .and_then(|ms| {
                ms.iter().find(|m| {
                    m.pointer("/annotations/org.opencontainers.image.ref.name")
                        .and_then(Value::as_str)
                        == Some(self.tag.as_str())
                })
            })
            .ok_or_else(|| {
                Error::Spec(format!(
                    "{}: no manifest tagged {}",
                    self.layout.display(),
                    self.tag
                ))
            })?;
        let digest = m
            .pointer("/digest")
            .and_then(Value::as_str)
            .unwrap_or_default();
        self.json(&self.blob(digest)?)
    }

    /// The image configuration (`config` holds Entrypoint, Env, WorkingDir, User).
    pub fn config(&self) -> Result<Value> {
        let m = self.manifest()?;
        let digest = m
            .pointer("/config/digest")
            .and_then(Value::as_str)
            .unwrap_or_default();
        self.json(&self.blob(digest)?)
    }

    /// Every path in the layers (relative, no leading "/"), later layers winning.
    pub fn files(&self) -> Result<BTreeMap<String, Entry>> {
        let m = self.manifest()?;
        let mut files = BTreeMap::new();
        for layer in m
            .pointer("/layers")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let digest = layer
                .pointer("/digest")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let out = run(
                "tar -tvzf <layer>",
                Command::new("tar")
                    .args(["--list", "--verbose", "--gzip", "--numeric-owner", "--file"])
                    .arg(self.blob(digest)?),
            )?;
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                // drwxr-xr-x 0/0 0 2026-01-01 00:00 etc/
                let rest = line
                    .split_whitespace()
                    .skip(5)
                    .collect::<Vec<_>>()
                    .join(" ");
                let mode = line
                    .split_whitespace()
                    .next()
                    .unwrap_or_default()
                    .to_string();
                let (name, entry) = if let Some((n, t)) = rest.split_once(" -> ") {
                    (n.to_string(), Entry::Symlink(t.to_string()))
                } else if let Some((n, t)) = rest.split_once(" link to ") {
                    (n.to_string(), Entry::Link(normalize(t)))
                } else if mode.starts_with('d') {
                    (rest, Entry::Dir)
                } else {
                    (rest, Entry::File { mode })
                };
                let name = normalize(&name);
                if !name.is_empty() {
                    files.insert(name, entry);
                }
            }
        }
        Ok(files)
    }
}

fn normalize(path: &str) -> String {
    path.trim_start_matches("./")
        .trim_start_matches('/')
        .trim_end_matches('/')
        .to_string()
}
