//! The CNI network configuration edits of the installer, sans IO (istio-cni reference §4.1).
//!
//! - [`select_primary`]: which conf file the runtime uses (libcni's rules, as the kubelet
//!   and containerd apply them).
//! - [`chain_into`]: the primary's content with our entry appended (a `.conf` wrapped into
//!   a `.conflist`); [`remove_from`]: the same without it.
//! - [`standalone`]: the file of a non-chained install.
//!
//! Other plugins' JSON is kept byte for byte ([`RawValue`]) and top-level keys keep their
//! order, so the file we write differs from the runtime's only by our entry.

use serde::de::{MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;
use serde_json::Value;

/// Our plugin's `name` and `type`.
pub const PLUGIN_TYPE: &str = "istio-cni";
/// The network name a wrapped single-plugin `.conf` gets.
pub const WRAPPED_NETWORK_NAME: &str = "k8s-pod-network";
/// The `cniVersion` of wrapped and standalone configs.
pub const WRAPPED_CNI_VERSION: &str = "0.3.1";
/// Default name of the istio-owned config; it must sort before the primary.
pub const DEFAULT_OWNED_FILE: &str = "02-istio-cni.conflist";
/// Default name of the standalone (not chained) config.
pub const DEFAULT_STANDALONE_FILE: &str = "YYY-istio-cni.conf";
/// Largest conf file read (peer data: other components write this directory).
pub const MAX_CONF_BYTES: usize = 1024 * 1024;

/// Our entry in the chain: the plugin's configuration keys (§4.1), in Istio's order.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PluginEntry {
    pub name: String,
    #[serde(rename = "type")]
    pub plugin_type: String,
    pub plugin_log_level: String,
    pub cni_agent_run_dir: String,
    pub ambient_enabled: bool,
    /// The enablement selectors as JSON (`[{podSelector, namespaceSelector}]`).
    pub enablement_selectors: Value,
    pub exclude_namespaces: Vec<String>,
    pub pod_namespace: String,
    pub native_nftables: bool,
    pub enable_ambient_detection_retry: bool,
}

impl PluginEntry {
    fn to_raw(&self) -> Box<RawValue> {
        let text = serde_json::to_string(self).expect("a plugin entry always serializes");
        RawValue::from_string(text).expect("serde_json output is JSON")
    }

    fn to_value(&self) -> Value {
        serde_json::to_value(self).expect("a plugin entry always serializes")
    }
}

/// A JSON object that keeps its keys' order and its values' text.
#[derive(Debug, Default)]
struct Object(Vec<(String, Box<RawValue>)>);

impl Object {
    fn get(&self, key: &str) -> Option<&RawValue> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| &**v)
    }

    fn set(&mut self, key: &str, value: Box<RawValue>) {
        match self.0.iter_mut().find(|(k, _)| k == key) {
            Some((_, v)) => *v = value,
            None => self.0.push((key.to_owned(), value)),
        }
    }
}

impl<'de> Deserialize<'de> for Object {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Object;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Object, A::Error> {
                let mut out = Vec::new();
                while let Some((k, v)) = m.next_entry::<String, Box<RawValue>>()? {
                    // A repeated key: the last wins, as in Go's decoder.
                    out.retain(|(o, _): &(String, Box<RawValue>)| *o != k);
                    out.push((k, v));
                }
                Ok(Object(out))
            }
        }
        d.deserialize_map(V)
    }
}

impl Serialize for Object {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            m.serialize_entry(k, v)?;
        }
        m.end()
    }
}

fn raw(text: &str) -> Box<RawValue> {
    RawValue::from_string(text.to_owned()).expect("callers pass JSON")
}

fn raw_string(s: &str) -> Box<RawValue> {
    raw(&Value::String(s.to_owned()).to_string())
}

/// Why a conf file cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfError {
    #[error("{file} is not valid JSON: {why}")]
    Json { file: String, why: String },
    #[error("{file} is a .conflist without \"plugins\" entries")]
    NoPlugins { file: String },
    #[error("{file}: plugin {index} is not an object with a \"type\"")]
    BadPlugin { file: String, index: usize },
    #[error("{file} has no \"type\": not a CNI plugin configuration")]
    NoType { file: String },
    #[error("{file} is larger than {MAX_CONF_BYTES} bytes")]
    TooLarge { file: String },
    #[error("{file} is not a CNI config file (.conf, .conflist or .json)")]
    Extension { file: String },
}

/// The kind of a conf file, by extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `.conflist`: a chain.
    List,
    /// `.conf` or `.json`: one plugin.
    Single,
}

/// The kind of `file`, `None` when libcni ignores it.
pub fn kind_of(file: &str) -> Option<Kind> {
    if file.ends_with(".conflist") {
        Some(Kind::List)
    } else if file.ends_with(".conf") || file.ends_with(".json") {
        Some(Kind::Single)
    } else {
        None
    }
}

fn parse(file: &str, content: &[u8]) -> Result<Object, ConfError> {
    if content.len() > MAX_CONF_BYTES {
        return Err(ConfError::TooLarge { file: file.into() });
    }
    serde_json::from_slice(content).map_err(|e| ConfError::Json {
        file: file.into(),
        why: e.to_string(),
    })
}

#[derive(Deserialize)]
struct TypeOnly {
    #[serde(rename = "type", default)]
    plugin_type: Option<String>,
}

fn plugin_type(v: &RawValue) -> Option<String> {
    serde_json::from_str::<TypeOnly>(v.get())
        .ok()
        .map(|t| t.plugin_type.unwrap_or_default())
}

fn plugins(file: &str, obj: &Object) -> Result<Vec<Box<RawValue>>, ConfError> {
    let list: Vec<Box<RawValue>> = obj
        .get("plugins")
        .and_then(|p| serde_json::from_str(p.get()).ok())
        .unwrap_or_default();
    if list.is_empty() {
        return Err(ConfError::NoPlugins { file: file.into() });
    }
    for (index, p) in list.iter().enumerate() {
        if plugin_type(p).is_none() {
            return Err(ConfError::BadPlugin {
                file: file.into(),
                index,
            });
        }
    }
    Ok(list)
}

/// Checks that `content` is a config the runtime would load.
pub fn validate(file: &str, content: &[u8]) -> Result<Kind, ConfError> {
    let kind = kind_of(file).ok_or_else(|| ConfError::Extension { file: file.into() })?;
    let obj = parse(file, content)?;
    match kind {
        Kind::List => {
            plugins(file, &obj)?;
        }
        Kind::Single => {
            // Read the type as a chained entry's is read, so that a file accepted here
            // (one with two `type` keys, say) is still valid once wrapped into a list.
            let t = serde_json::from_slice::<TypeOnly>(content)
                .ok()
                .and_then(|t| t.plugin_type)
                .filter(|t| !t.is_empty());
            if t.is_none() {
                return Err(ConfError::NoType { file: file.into() });
            }
        }
    }
    Ok(kind)
}

/// One file of the conf dir.
#[derive(Debug, Clone)]
pub struct ConfFile {
    pub name: String,
    pub content: Vec<u8>,
}

/// The result of [`select_primary`].
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Selection {
    /// The file the runtime uses, if any.
    pub primary: Option<String>,
    /// Files passed over as invalid, with why (for the log).
    pub skipped: Vec<ConfError>,
}

/// The primary config as libcni picks it: the lexically first valid `.conf`, `.conflist`
/// or `.json` file; files in `ignore` (our own) never count.
pub fn select_primary(files: &[ConfFile], ignore: &[&str]) -> Selection {
    let mut names: Vec<&ConfFile> = files
        .iter()
        .filter(|f| kind_of(&f.name).is_some() && !ignore.contains(&f.name.as_str()))
        .collect();
    names.sort_by(|a, b| a.name.cmp(&b.name));
    let mut out = Selection::default();
    for f in names {
        match validate(&f.name, &f.content) {
            Ok(_) => {
                out.primary = Some(f.name.clone());
                break;
            }
            Err(e) => out.skipped.push(e),
        }
    }
    out
}

/// A file to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    pub name: String,
    pub content: Vec<u8>,
}

fn render(obj: &Object) -> Vec<u8> {
    let mut out = serde_json::to_vec_pretty(obj).expect("raw JSON always serializes");
    out.push(b'\n');
    out
}

/// The `.conflist` name of a `.conf`/`.json` file.
pub fn conflist_name(file: &str) -> String {
    let stem = file
        .strip_suffix(".conf")
        .or_else(|| file.strip_suffix(".json"))
        .unwrap_or(file);
    format!("{stem}.conflist")
}

/// The config `file` (`content`) with our entry as the last plugin: any earlier
/// `istio-cni` entry is dropped; a single-plugin config is wrapped as a chain (and the
/// output is named `.conflist`).
pub fn chain_into(file: &str, content: &[u8], entry: &PluginEntry) -> Result<Output, ConfError> {
    let kind = validate(file, content)?;
    let mut obj = parse(file, content)?;
    let (name, mut list) = match kind {
        Kind::List => (file.to_owned(), plugins(file, &obj)?),
        Kind::Single => {
            // Keep the plugin's own text; the chain takes over name and version.
            let original = raw(std::str::from_utf8(content)
                .map_err(|e| ConfError::Json {
                    file: file.into(),
                    why: e.to_string(),
                })?
                .trim());
            obj = Object(vec![
                ("name".into(), raw_string(WRAPPED_NETWORK_NAME)),
                ("cniVersion".into(), raw_string(WRAPPED_CNI_VERSION)),
            ]);
            (conflist_name(file), vec![original])
        }
    };
    list.retain(|p| plugin_type(p).as_deref() != Some(PLUGIN_TYPE));
    list.push(entry.to_raw());
    obj.set(
        "plugins",
        serde_json::value::to_raw_value(&list).expect("raw JSON always serializes"),
    );
    Ok(Output {
        name,
        content: render(&obj),
    })
}

/// Whether `content` (a `.conflist`) already ends with exactly `entry` and holds no other
/// `istio-cni` entry: then nothing needs writing.
pub fn is_installed(file: &str, content: &[u8], entry: &PluginEntry) -> bool {
    let Ok(Kind::List) = validate(file, content) else {
        return false;
    };
    let Ok(list) = parse(file, content).and_then(|o| plugins(file, &o)) else {
        return false;
    };
    let ours = list
        .iter()
        .filter(|p| plugin_type(p).as_deref() == Some(PLUGIN_TYPE))
        .count();
    let last = list
        .last()
        .and_then(|p| serde_json::from_str::<Value>(p.get()).ok());
    ours == 1 && last == Some(entry.to_value())
}

/// Whether `content` holds an `istio-cni` entry at all.
pub fn has_entry(file: &str, content: &[u8]) -> bool {
    parse(file, content)
        .and_then(|o| plugins(file, &o))
        .map(|l| {
            l.iter()
                .any(|p| plugin_type(p).as_deref() == Some(PLUGIN_TYPE))
        })
        .unwrap_or(false)
}

/// `content` without our entries, or `None` when it has none (nothing to write).
/// A chain we wrapped stays a chain, of the original plugin alone.
pub fn remove_from(file: &str, content: &[u8]) -> Result<Option<Vec<u8>>, ConfError> {
    let mut obj = parse(file, content)?;
    let mut list = plugins(file, &obj)?;
    let before = list.len();
    list.retain(|p| plugin_type(p).as_deref() != Some(PLUGIN_TYPE));
    if list.len() == before {
        return Ok(None);
    }
    obj.set(
        "plugins",
        serde_json::value::to_raw_value(&list).expect("raw JSON always serializes"),
    );
    Ok(Some(render(&obj)))
}

/// The standalone config of a non-chained install (Multus chains it itself).
pub fn standalone(name: &str, entry: &PluginEntry) -> Output {
    let mut obj = Object(vec![("cniVersion".into(), raw_string(WRAPPED_CNI_VERSION))]);
    let entry: Object =
        serde_json::from_str(entry.to_raw().get()).expect("a plugin entry is an object");
    obj.0.extend(entry.0);
    Output {
        name: name.to_owned(),
        content: render(&obj),
    }
}

/// For the istio-owned file `owned`: the valid conf files that sort before it, which the
/// runtime would use instead (a warning, not an error: the admin must rename them).
pub fn outranking(files: &[ConfFile], owned: &str) -> Vec<String> {
    let mut out: Vec<String> = files
        .iter()
        .filter(|f| f.name.as_str() < owned && validate(&f.name, &f.content).is_ok())
        .map(|f| f.name.clone())
        .collect();
    out.sort();
    out
}

#[cfg(test)]
mod tests;
