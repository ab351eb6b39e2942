//! A rendered container, read from its DaemonSet: what a runtime must apply to run it as
//! the kubelet would (capabilities, user, read-only root, mounts and their volumes, env).

use serde_json::Value;

use crate::{Error, Result};

/// Where an environment variable's value comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvSource {
    Value(String),
    /// `valueFrom.fieldRef.fieldPath` (downward API).
    Field(String),
    /// `valueFrom.resourceFieldRef.resource`.
    Resource(String),
}

/// The volume behind a mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VolumeSource {
    HostPath { path: String, kind: Option<String> },
    EmptyDir,
    ConfigMap(String),
    Projected,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    pub volume: String,
    pub path: String,
    pub read_only: bool,
    pub propagation: Option<String>,
    pub source: VolumeSource,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerSpec {
    pub name: String,
    pub image: String,
    pub command: Vec<String>,
    pub args: Vec<String>,
    pub cap_add: Vec<String>,
    pub cap_drop: Vec<String>,
    pub run_as_user: Option<i64>,
    pub run_as_group: Option<i64>,
    pub read_only_root: bool,
    pub privileged: bool,
    pub allow_privilege_escalation: Option<bool>,
    pub env: Vec<(String, EnvSource)>,
    /// ConfigMaps loaded whole with `envFrom`.
    pub env_from: Vec<String>,
    pub mounts: Vec<Mount>,
    pub host_network: bool,
}

fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn text(v: &Value, pointer: &str) -> Option<String> {
    v.pointer(pointer)
        .and_then(Value::as_str)
        .map(str::to_string)
}

impl ContainerSpec {
    /// The container `name` of a DaemonSet (or any object with a pod template).
    pub fn from_daemonset(ds: &Value, name: &str) -> Result<Self> {
        let pod = ds
            .pointer("/spec/template/spec")
            .ok_or_else(|| Error::Spec("the object has no pod template".into()))?;
        let c = pod
            .pointer("/containers")
            .and_then(Value::as_array)
            .and_then(|cs| {
                cs.iter()
                    .find(|c| text(c, "/name").as_deref() == Some(name))
            })
            .ok_or_else(|| Error::Spec(format!("the pod template has no container {name}")))?;
        let volumes = pod
            .pointer("/volumes")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let sc = c
            .pointer("/securityContext")
            .cloned()
            .unwrap_or(Value::Null);
        let mut env = Vec::new();
        for e in c
            .pointer("/env")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let key =
                text(e, "/name").ok_or_else(|| Error::Spec("an env entry has no name".into()))?;
            let source = if let Some(v) = text(e, "/value") {
                EnvSource::Value(v)
            } else if let Some(f) = text(e, "/valueFrom/fieldRef/fieldPath") {
                EnvSource::Field(f)
            } else if let Some(r) = text(e, "/valueFrom/resourceFieldRef/resource") {
                EnvSource::Resource(r)
            } else if e.get("value").is_some() {
                return Err(Error::Spec(format!("env {key}: value is not a string")));
            } else {
                EnvSource::Value(String::new())
            };
            env.push((key, source));
        }
        let mut mounts = Vec::new();
        for m in c
            .pointer("/volumeMounts")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let volume =
                text(m, "/name").ok_or_else(|| Error::Spec("a mount has no name".into()))?;
            let path = text(m, "/mountPath")
                .ok_or_else(|| Error::Spec(format!("mount {volume} has no mountPath")))?;
            let v = volumes
                .iter()
                .find(|v| text(v, "/name").as_deref() == Some(volume.as_str()))
                .ok_or_else(|| Error::Spec(format!("mount {volume} has no volume")))?;
            let source = if let Some(p) = text(v, "/hostPath/path") {
                VolumeSource::HostPath {
                    path: p,
                    kind: text(v, "/hostPath/type"),
                }
            } else if v.get("emptyDir").is_some() {
                VolumeSource::EmptyDir
            } else if let Some(n) = text(v, "/configMap/name") {
                VolumeSource::ConfigMap(n)
            } else if v.get("projected").is_some() {
                VolumeSource::Projected
            } else {
                return Err(Error::Spec(format!(
                    "volume {volume}: a kind we do not model"
                )));
            };
            mounts.push(Mount {
                volume,
                path,
                read_only: m
                    .pointer("/readOnly")
                    .and_then(Value::as_bool)
                    .unwrap_or(false),
                propagation: text(m, "/mountPropagation"),
                source,
            });
        }
        Ok(ContainerSpec {
            name: name.to_string(),
            image: text(c, "/image").unwrap_or_default(),
            command: strings(c.pointer("/command")),
            args: strings(c.pointer("/args")),
            cap_add: strings(sc.pointer("/capabilities/add")),
            cap_drop: strings(sc.pointer("/capabilities/drop")),
            run_as_user: sc.pointer("/runAsUser").and_then(Value::as_i64),
            run_as_group: sc.pointer("/runAsGroup").and_then(Value::as_i64),
            read_only_root: sc
                .pointer("/readOnlyRootFilesystem")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            privileged: sc
                .pointer("/privileged")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            allow_privilege_escalation: sc
                .pointer("/allowPrivilegeEscalation")
                .and_then(Value::as_bool),
            env,
            env_from: c
                .pointer("/envFrom")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|e| text(e, "/configMapRef/name"))
                .collect(),
            mounts,
            host_network: pod
                .pointer("/hostNetwork")
                .and_then(Value::as_bool)
                .unwrap_or(false),
        })
    }

    /// The literal value of env `key`, if it has one.
    pub fn env_value(&self, key: &str) -> Option<&str> {
        self.env.iter().find_map(|(k, s)| match s {
            EnvSource::Value(v) if k == key => Some(v.as_str()),
            _ => None,
        })
    }

    pub fn mount(&self, volume: &str) -> Option<&Mount> {
        self.mounts.iter().find(|m| m.volume == volume)
    }
}
