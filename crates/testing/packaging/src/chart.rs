//! Rendering the charts in `charts/` with `helm template`, and validating what they render.

use std::io::Write;
use std::path::PathBuf;
use std::process::Command;

use serde::Deserialize;
use serde_json::Value;

use crate::tools::tools;
use crate::{run, workspace, Error, Result};

/// The namespace the charts are rendered into, as Istio installs them.
pub const NAMESPACE: &str = "istio-system";

/// One `helm template` of a chart: `--set`, `--set-string` and values files, in order.
#[derive(Debug, Clone)]
pub struct Render {
    chart: String,
    args: Vec<String>,
    values: Vec<String>,
    kube_version: Option<String>,
}

impl Render {
    /// The chart `charts/<name>` (`cni` or `ztunnel`), released under its own name.
    pub fn new(chart: &str) -> Self {
        Render {
            chart: chart.to_string(),
            args: Vec::new(),
            values: Vec::new(),
            kube_version: None,
        }
    }

    /// `--set key=value` (Helm's typing: `true`, numbers).
    pub fn set(mut self, key: &str, value: &str) -> Self {
        self.args.push("--set".into());
        self.args.push(format!("{key}={value}"));
        self
    }

    /// `--set-string key=value`.
    pub fn set_string(mut self, key: &str, value: &str) -> Self {
        self.args.push("--set-string".into());
        self.args.push(format!("{key}={value}"));
        self
    }

    /// A values file with this YAML.
    pub fn values(mut self, yaml: &str) -> Self {
        self.values.push(yaml.to_string());
        self
    }

    /// The cluster version the templates see (`.Capabilities.KubeVersion`).
    pub fn kube_version(mut self, version: &str) -> Self {
        self.kube_version = Some(version.to_string());
        self
    }

    fn command(&self) -> Result<(Command, Vec<tempfile::NamedTempFile>)> {
        let tools = tools()?;
        let mut cmd = Command::new(&tools.helm);
        cmd.arg("template")
            .arg(&self.chart)
            .arg(self.chart_dir())
            .args(["--namespace", NAMESPACE]);
        if let Some(v) = &self.kube_version {
            cmd.args(["--kube-version", v]);
        }
        let mut files = Vec::new();
        for yaml in &self.values {
            let mut f = tempfile::Builder::new().suffix(".yaml").tempfile()?;
            f.write_all(yaml.as_bytes())?;
            cmd.arg("--values").arg(f.path());
            files.push(f);
        }
        cmd.args(&self.args);
        Ok((cmd, files))
    }

    fn chart_dir(&self) -> PathBuf {
        workspace().join("charts").join(&self.chart)
    }

    fn describe(&self) -> String {
        format!(
            "helm template charts/{} {}",
            self.chart,
            self.args.join(" ")
        )
    }

    /// Renders and parses every object.
    pub fn run(&self) -> Result<Rendered> {
        let (mut cmd, _files) = self.command()?;
        let out = run(&self.describe(), &mut cmd)?;
        let yaml = String::from_utf8(out.stdout).map_err(|e| Error::Output {
            what: self.describe(),
            detail: e.to_string(),
        })?;
        let objects = parse_objects(&yaml).map_err(|detail| Error::Output {
            what: self.describe(),
            detail,
        })?;
        Ok(Rendered { yaml, objects })
    }

    /// Renders, expecting Helm to refuse: returns its error text.
    pub fn fails(&self) -> Result<String> {
        let (mut cmd, _files) = self.command()?;
        let out = cmd.output().map_err(|source| Error::Spawn {
            what: self.describe(),
            source,
        })?;
        if out.status.success() {
            return Err(Error::Output {
                what: self.describe(),
                detail: "rendered, but it should have failed".into(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// The objects of a multi-document YAML stream (empty documents skipped).
pub fn parse_objects(yaml: &str) -> std::result::Result<Vec<Value>, String> {
    let mut objects = Vec::new();
    for doc in yaml_serde::Deserializer::from_str(yaml) {
        let value = Value::deserialize(doc).map_err(|e| e.to_string())?;
        if !value.is_null() {
            objects.push(value);
        }
    }
    Ok(objects)
}

/// What a chart rendered.
#[derive(Debug, Clone)]
pub struct Rendered {
    pub yaml: String,
    pub objects: Vec<Value>,
}

impl Rendered {
    /// `(kind, name)` of every object, in order.
    pub fn kinds_and_names(&self) -> Vec<(String, String)> {
        self.objects
            .iter()
            .map(|o| (str_at(o, "/kind"), str_at(o, "/metadata/name")))
            .collect()
    }

    pub fn find(&self, kind: &str, name: &str) -> Option<&Value> {
        self.objects
            .iter()
            .find(|o| str_at(o, "/kind") == kind && str_at(o, "/metadata/name") == name)
    }

    /// The object, or an error naming what was rendered instead.
    pub fn get(&self, kind: &str, name: &str) -> Result<&Value> {
        self.find(kind, name).ok_or_else(|| {
            Error::Spec(format!(
                "no {kind} {name} among {:?}",
                self.kinds_and_names()
            ))
        })
    }

    /// A ConfigMap's data as string pairs.
    pub fn config_map(&self, name: &str) -> Result<std::collections::BTreeMap<String, String>> {
        let cm = self.get("ConfigMap", name)?;
        let data = cm
            .pointer("/data")
            .and_then(Value::as_object)
            .ok_or_else(|| Error::Spec(format!("ConfigMap {name} has no data")))?;
        data.iter()
            .map(|(k, v)| {
                v.as_str()
                    .map(|s| (k.clone(), s.to_string()))
                    .ok_or_else(|| Error::Spec(format!("ConfigMap {name}: {k} is not a string")))
            })
            .collect()
    }
}

fn str_at(v: &Value, pointer: &str) -> String {
    v.pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

/// Checks rendered YAML against Kubernetes `version`'s schemas with
/// `kubernetes-validate --strict` (unknown fields are errors).
pub fn validate(yaml: &str, version: &str) -> Result<()> {
    let tools = tools()?;
    let mut f = tempfile::Builder::new().suffix(".yaml").tempfile()?;
    f.write_all(yaml.as_bytes())?;
    let what = format!("kubernetes-validate --strict -k {version}");
    let out = Command::new(&tools.kubernetes_validate)
        .args(["--strict", "--quiet", "-k", version])
        .arg(f.path())
        .output()
        .map_err(|source| Error::Spawn {
            what: what.clone(),
            source,
        })?;
    if !out.status.success() {
        return Err(Error::Failed {
            what,
            status: out.status,
            stderr: format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        });
    }
    Ok(())
}
