//! The pinned helm and kubernetes-validate, installed by `scripts/charts tools`.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use crate::{run, workspace, Error, Result};

/// Where the tools are, and the Kubernetes versions the charts are validated against (the
/// oldest and newest within the charts' `kubeVersion` that kubernetes-validate has schemas for).
#[derive(Debug, Clone)]
pub struct Tools {
    pub helm: PathBuf,
    pub kubernetes_validate: PathBuf,
    pub kube_versions: Vec<String>,
}

/// Installs the tools on first use (a download the first time, then a lookup in
/// `target/tools`), once per test process.
pub fn tools() -> Result<&'static Tools> {
    static TOOLS: OnceLock<std::result::Result<Tools, String>> = OnceLock::new();
    TOOLS
        .get_or_init(|| install().map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|e| Error::Output {
            what: "scripts/charts tools".into(),
            detail: e.clone(),
        })
}

fn install() -> Result<Tools> {
    let script = workspace().join("scripts/charts");
    let out = run("scripts/charts tools", Command::new(&script).arg("tools"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .map(str::to_string)
            .ok_or_else(|| Error::Output {
                what: "scripts/charts tools".into(),
                detail: format!("no {key}= line in {text:?}"),
            })
    };
    Ok(Tools {
        helm: field("HELM")?.into(),
        kubernetes_validate: field("KUBERNETES_VALIDATE")?.into(),
        kube_versions: field("KUBE_VERSIONS")?
            .split_whitespace()
            .map(str::to_string)
            .collect(),
    })
}

/// Installs one of scripts/tools.sh's tool lists (e.g. `IMAGE_TOOLS`) with its `need`: the
/// Debian packages, as root on Debian; elsewhere an error naming what is missing.
pub fn need(list: &str) -> Result<()> {
    if !list.chars().all(|c| c.is_ascii_uppercase() || c == '_') {
        return Err(Error::Spec(format!("{list:?} is not a tool list's name")));
    }
    run(
        &format!("scripts/tools.sh need {list}"),
        Command::new("bash")
            .current_dir(workspace())
            .arg("-c")
            .arg(format!(". scripts/tools.sh && need \"${{{list}[@]}}\"")),
    )?;
    Ok(())
}
