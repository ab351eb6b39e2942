//! Kubernetes' protobuf request bodies (`application/vnd.kubernetes.protobuf`), which
//! kubectl's generators send for built-in kinds (`kubectl create configmap`, `kubectl
//! create namespace`): the `k8s\0` envelope (a `runtime.Unknown` holding the type and the
//! message) and the messages of the kinds implemented here, decoded to the JSON the rest
//! of the server reads. A field this decoder does not know is refused, never dropped.
//! Responses stay JSON, which every client also accepts. Sans IO.

use base64::Engine;
use serde_json::{json, Map, Value};

use crate::error::ApiError;

/// The media type.
pub const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";

const MAGIC: &[u8] = b"k8s\0";

/// One field's value on the wire.
enum Wire<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    /// A fixed 32- or 64-bit value (no Kubernetes field read here uses one).
    Fixed,
}

fn bad(what: impl std::fmt::Display) -> ApiError {
    ApiError::bad_request(format!("error decoding the protobuf request body: {what}"))
}

fn varint(b: &mut &[u8]) -> Result<u64, ApiError> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = b.split_first().ok_or_else(|| bad("truncated varint"))?;
        *b = rest;
        v |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err(bad("varint too long"))
}

/// The fields of a message, in wire order.
fn fields(mut b: &[u8]) -> Result<Vec<(u64, Wire<'_>)>, ApiError> {
    let mut out = Vec::new();
    while !b.is_empty() {
        let key = varint(&mut b)?;
        let value = match key & 7 {
            0 => Wire::Varint(varint(&mut b)?),
            1 | 5 => {
                let n = if key & 7 == 1 { 8 } else { 4 };
                b = b.get(n..).ok_or_else(|| bad("truncated fixed field"))?;
                Wire::Fixed
            }
            2 => {
                let len = usize::try_from(varint(&mut b)?).map_err(|_| bad("length"))?;
                let v = b.get(..len).ok_or_else(|| bad("truncated field"))?;
                b = &b[len..];
                Wire::Bytes(v)
            }
            t => return Err(bad(format!("wire type {t}"))),
        };
        out.push((key >> 3, value));
    }
    Ok(out)
}

fn string(w: &Wire, message: &str, field: u64) -> Result<String, ApiError> {
    match w {
        Wire::Bytes(b) => String::from_utf8(b.to_vec())
            .map_err(|_| bad(format!("{message} field {field} is not UTF-8"))),
        _ => Err(bad(format!("{message} field {field} is not a string"))),
    }
}

fn bytes<'a>(w: &Wire<'a>, message: &str, field: u64) -> Result<&'a [u8], ApiError> {
    match w {
        Wire::Bytes(b) => Ok(b),
        _ => Err(bad(format!("{message} field {field} is not a message"))),
    }
}

fn number(w: &Wire, message: &str, field: u64) -> Result<u64, ApiError> {
    match w {
        Wire::Varint(v) => Ok(*v),
        _ => Err(bad(format!("{message} field {field} is not a number"))),
    }
}

/// A field this decoder does not implement: refused rather than silently lost.
fn unknown(message: &str, field: u64) -> ApiError {
    ApiError::unsupported_media(&format!(
        "{message} field {field} in a protobuf body is not implemented by this test server; \
         send JSON"
    ))
}

/// A `map<string, string>` entry (or `map<string, bytes>` with `binary`).
fn map_entry(b: &[u8], binary: bool) -> Result<(String, Value), ApiError> {
    let (mut k, mut v) = (String::new(), json!(""));
    for (f, w) in fields(b)? {
        match f {
            1 => k = string(&w, "map entry", f)?,
            2 if binary => {
                let raw = bytes(&w, "map entry", f)?;
                v = json!(base64::engine::general_purpose::STANDARD.encode(raw));
            }
            2 => v = json!(string(&w, "map entry", f)?),
            _ => return Err(unknown("map entry", f)),
        }
    }
    Ok((k, v))
}

/// A `metav1.Time` (seconds, nanos) as Kubernetes writes it; `None` for the zero time.
fn time(b: &[u8]) -> Result<Option<String>, ApiError> {
    let mut secs: i64 = 0;
    for (f, w) in fields(b)? {
        match f {
            // Two's complement on the wire, as protobuf's int64.
            1 => secs = number(&w, "Time", f)? as i64,
            2 => {}
            _ => return Err(unknown("Time", f)),
        }
    }
    if secs == 0 {
        return Ok(None);
    }
    let t = time::OffsetDateTime::from_unix_timestamp(secs).map_err(|_| bad("a timestamp"))?;
    Ok(Some(format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )))
}

fn owner_reference(b: &[u8]) -> Result<Value, ApiError> {
    let mut o = Map::new();
    for (f, w) in fields(b)? {
        let key = match f {
            1 => "kind",
            3 => "name",
            4 => "uid",
            5 => "apiVersion",
            6 => "controller",
            7 => "blockOwnerDeletion",
            _ => return Err(unknown("OwnerReference", f)),
        };
        let v = if f >= 6 {
            json!(number(&w, "OwnerReference", f)? != 0)
        } else {
            json!(string(&w, "OwnerReference", f)?)
        };
        o.insert(key.into(), v);
    }
    Ok(Value::Object(o))
}

fn object_meta(b: &[u8]) -> Result<Value, ApiError> {
    let mut m = Map::new();
    let push = |m: &mut Map<String, Value>, key: &str, v: Value| match m
        .entry(key)
        .or_insert_with(|| json!([]))
    {
        Value::Array(a) => a.push(v),
        other => *other = json!([v]),
    };
    for (f, w) in fields(b)? {
        match f {
            // Empty strings and a zero generation are Go's zero values, left out of JSON.
            1..=6 => {
                let key = [
                    "name",
                    "generateName",
                    "namespace",
                    "selfLink",
                    "uid",
                    "resourceVersion",
                ][usize::try_from(f - 1).unwrap_or_default()];
                let v = string(&w, "ObjectMeta", f)?;
                if !v.is_empty() {
                    m.insert(key.into(), json!(v));
                }
            }
            7 => {
                let generation = number(&w, "ObjectMeta", f)? as i64;
                if generation != 0 {
                    m.insert("generation".into(), json!(generation));
                }
            }
            8 | 9 => {
                let key = if f == 8 {
                    "creationTimestamp"
                } else {
                    "deletionTimestamp"
                };
                if let Some(t) = time(bytes(&w, "ObjectMeta", f)?)? {
                    m.insert(key.into(), json!(t));
                }
            }
            10 => {
                let secs = number(&w, "ObjectMeta", f)? as i64;
                m.insert("deletionGracePeriodSeconds".into(), json!(secs));
            }
            11 | 12 => {
                let key = if f == 11 { "labels" } else { "annotations" };
                let (k, v) = map_entry(bytes(&w, "ObjectMeta", f)?, false)?;
                if let Some(map) = m.entry(key).or_insert_with(|| json!({})).as_object_mut() {
                    map.insert(k, v);
                }
            }
            13 => push(
                &mut m,
                "ownerReferences",
                owner_reference(bytes(&w, "ObjectMeta", f)?)?,
            ),
            14 => push(&mut m, "finalizers", json!(string(&w, "ObjectMeta", f)?)),
            _ => return Err(unknown("ObjectMeta", f)),
        }
    }
    Ok(Value::Object(m))
}

fn config_map(b: &[u8]) -> Result<Map<String, Value>, ApiError> {
    let mut o = Map::new();
    for (f, w) in fields(b)? {
        match f {
            1 => {
                o.insert("metadata".into(), object_meta(bytes(&w, "ConfigMap", f)?)?);
            }
            2 | 3 => {
                let key = if f == 2 { "data" } else { "binaryData" };
                let (k, v) = map_entry(bytes(&w, "ConfigMap", f)?, f == 3)?;
                if let Some(map) = o.entry(key).or_insert_with(|| json!({})).as_object_mut() {
                    map.insert(k, v);
                }
            }
            4 => {
                o.insert("immutable".into(), json!(number(&w, "ConfigMap", f)? != 0));
            }
            _ => return Err(unknown("ConfigMap", f)),
        }
    }
    Ok(o)
}

/// `NamespaceSpec` (repeated `finalizers`, 1) or `NamespaceStatus` (`phase`, 1).
fn namespace_part(b: &[u8], message: &str) -> Result<Value, ApiError> {
    let mut values = Vec::new();
    for (f, w) in fields(b)? {
        match f {
            1 => values.push(string(&w, message, f)?),
            _ => return Err(unknown(message, f)),
        }
    }
    Ok(match message {
        "NamespaceStatus" => values
            .pop()
            .map_or_else(|| json!({}), |phase| json!({"phase": phase})),
        _ if values.is_empty() => json!({}),
        _ => json!({"finalizers": values}),
    })
}

fn namespace(b: &[u8]) -> Result<Map<String, Value>, ApiError> {
    let mut o = Map::new();
    for (f, w) in fields(b)? {
        let body = bytes(&w, "Namespace", f)?;
        match f {
            1 => o.insert("metadata".into(), object_meta(body)?),
            2 => o.insert("spec".into(), namespace_part(body, "NamespaceSpec")?),
            3 => o.insert("status".into(), namespace_part(body, "NamespaceStatus")?),
            _ => return Err(unknown("Namespace", f)),
        };
    }
    Ok(o)
}

/// Decodes a protobuf request body into the object's JSON.
pub fn decode(body: &[u8]) -> Result<Value, ApiError> {
    let envelope = body
        .strip_prefix(MAGIC)
        .ok_or_else(|| bad("no k8s protobuf envelope"))?;
    let (mut api_version, mut kind, mut raw) = (String::new(), String::new(), None);
    for (f, w) in fields(envelope)? {
        match f {
            1 => {
                for (tf, tw) in fields(bytes(&w, "Unknown", f)?)? {
                    match tf {
                        1 => api_version = string(&tw, "TypeMeta", tf)?,
                        2 => kind = string(&tw, "TypeMeta", tf)?,
                        _ => return Err(unknown("TypeMeta", tf)),
                    }
                }
            }
            2 => raw = Some(bytes(&w, "Unknown", f)?),
            // contentEncoding, contentType: empty in requests.
            3 | 4 => {}
            _ => return Err(unknown("Unknown", f)),
        }
    }
    let raw = raw.unwrap_or_default();
    let mut obj = match (api_version.as_str(), kind.as_str()) {
        ("v1", "ConfigMap") => config_map(raw)?,
        ("v1", "Namespace") => namespace(raw)?,
        _ => {
            return Err(ApiError::unsupported_media(&format!(
                "protobuf bodies of {api_version} {kind} are not implemented by this test \
                 server; send JSON"
            )))
        }
    };
    obj.insert("apiVersion".into(), json!(api_version));
    obj.insert("kind".into(), json!(kind));
    Ok(Value::Object(obj))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// kubectl 1.32's `create configmap settings --from-literal=log=info
    /// --from-literal=mode=ambient`, as it sent it.
    const KUBECTL_CONFIGMAP: &[u8] = b"k8s\0\n\x0f\n\x02v1\x12\tConfigMap\x128\n\x18\n\x08settings\x12\0\x1a\0\"\0*\x002\08\0B\0\x12\x0b\n\x03log\x12\x04info\x12\x0f\n\x04mode\x12\x07ambient\x1a\0\"\0";

    #[test]
    fn kubectls_config_map() {
        let v = decode(KUBECTL_CONFIGMAP).unwrap();
        assert_eq!(
            v,
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings"},
                   "data": {"log": "info", "mode": "ambient"}})
        );
    }

    fn len_field(n: u8, body: &[u8]) -> Vec<u8> {
        let mut v = vec![n << 3 | 2, u8::try_from(body.len()).unwrap()];
        v.extend_from_slice(body);
        v
    }

    fn envelope(kind: &str, raw: &[u8]) -> Vec<u8> {
        let mut type_meta = len_field(1, b"v1");
        type_meta.extend(len_field(2, kind.as_bytes()));
        let mut b = MAGIC.to_vec();
        b.extend(len_field(1, &type_meta));
        b.extend(len_field(2, raw));
        b
    }

    #[test]
    fn metadata_maps_binary_data_and_namespaces() {
        let mut meta = len_field(1, b"ns1");
        meta.extend(len_field(
            11,
            &[len_field(1, b"a"), len_field(2, b"b")].concat(),
        ));
        meta.extend(len_field(14, b"kubernetes"));
        let created = [0x08, 0x80, 0xf2, 0xd6, 0xca, 0x06]; // seconds 1767225600
        meta.extend(len_field(8, &created));
        let mut spec = len_field(1, b"kubernetes");
        spec.extend(len_field(1, b"other"));
        let mut raw = len_field(1, &meta);
        raw.extend(len_field(2, &spec));
        let v = decode(&envelope("Namespace", &raw)).unwrap();
        assert_eq!(v["metadata"]["name"], "ns1");
        assert_eq!(v["metadata"]["labels"], json!({"a": "b"}));
        assert_eq!(v["metadata"]["finalizers"], json!(["kubernetes"]));
        assert_eq!(v["metadata"]["creationTimestamp"], "2026-01-01T00:00:00Z");
        assert_eq!(v["spec"]["finalizers"], json!(["kubernetes", "other"]));
        let mut raw = len_field(3, &[len_field(1, b"k"), len_field(2, &[0, 255])].concat());
        raw.extend([4 << 3, 1]);
        let v = decode(&envelope("ConfigMap", &raw)).unwrap();
        assert_eq!(v["binaryData"], json!({"k": "AP8="}));
        assert_eq!(v["immutable"], true);
    }

    #[test]
    fn what_is_not_implemented_is_refused() {
        let e = decode(&envelope("Pod", b"")).unwrap_err();
        assert_eq!(e.code, 415);
        assert!(
            e.message
                .contains("protobuf bodies of v1 Pod are not implemented"),
            "{}",
            e.message
        );
        let e = decode(&envelope("ConfigMap", &len_field(9, b"x"))).unwrap_err();
        assert_eq!(e.code, 415);
        assert!(e.message.starts_with("ConfigMap field 9"), "{}", e.message);
        let e = decode(&envelope("ConfigMap", &[0x0a, 0x05, 0x01])).unwrap_err();
        assert_eq!(e.code, 400);
        assert_eq!(decode(b"{}").unwrap_err().code, 400);
    }
}
