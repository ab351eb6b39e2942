//! Build information for `ambit version` and `/config_dump`'s `version`: the git revision
//! and whether the tree had changes (when built from a git checkout: tracked files that
//! differ from HEAD, as of the last commit, checkout or `git add`), and rustc's version.

use std::path::Path;
use std::process::Command;

fn output(cmd: &mut Command) -> Option<String> {
    let out = cmd.output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() {
    let manifest = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default();
    // `safe.directory`: a checkout owned by another user (a root build of a user's tree)
    // still tells its revision.
    let git = |args: &[&str]| {
        output(
            Command::new("git")
                .args(["-c", "safe.directory=*", "-C"])
                .arg(&manifest)
                .args(args),
        )
    };
    let revision = git(&["rev-parse", "HEAD"]).filter(|r| !r.is_empty());
    let status = revision.as_ref().and_then(|_| {
        git(&["status", "--porcelain", "--untracked-files=no"]).map(|s| {
            if s.is_empty() {
                "Clean"
            } else {
                "Modified"
            }
        })
    });
    if let Some(dir) = git(&["rev-parse", "--absolute-git-dir"]) {
        let dir = Path::new(&dir);
        for f in ["HEAD", "index"] {
            println!("cargo:rerun-if-changed={}", dir.join(f).display());
        }
        if let Some(head_ref) = git(&["symbolic-ref", "-q", "HEAD"]) {
            println!("cargo:rerun-if-changed={}", dir.join(head_ref).display());
        }
    }
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let rust_version = output(Command::new(rustc).arg("--version"))
        .and_then(|v| v.split_whitespace().nth(1).map(str::to_string));
    println!(
        "cargo:rustc-env=AMBIT_GIT_REVISION={}",
        revision.as_deref().unwrap_or("unknown")
    );
    println!(
        "cargo:rustc-env=AMBIT_BUILD_STATUS={}",
        status.unwrap_or("unknown")
    );
    println!(
        "cargo:rustc-env=AMBIT_RUST_VERSION={}",
        rust_version.as_deref().unwrap_or("unknown")
    );
    println!("cargo:rerun-if-changed=build.rs");
}
