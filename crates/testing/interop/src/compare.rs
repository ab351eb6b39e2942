//! Lining up what ambit and Istio's ztunnel show for the same scenario: JSON documents
//! (`/config_dump`) path by path, Prometheus samples label by label, and access log lines
//! field by field. Each comparison returns every difference, not only the first, so one
//! run of the suite lists all there is to fix.

use std::collections::BTreeMap;
use std::fmt;

use serde_json::Value;

/// One place where two documents disagree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Difference {
    /// Only the first document (ambit) has this path.
    OnlyLeft(String, String),
    /// Only the second document (Istio) has this path.
    OnlyRight(String, String),
    /// Both have the path with different values.
    Value(String, String, String),
}

impl Difference {
    pub fn path(&self) -> &str {
        match self {
            Difference::OnlyLeft(p, _)
            | Difference::OnlyRight(p, _)
            | Difference::Value(p, _, _) => p,
        }
    }
}

impl fmt::Display for Difference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Difference::OnlyLeft(p, v) => write!(f, "{p}: only ambit has it ({v})"),
            Difference::OnlyRight(p, v) => write!(f, "{p}: only Istio has it ({v})"),
            Difference::Value(p, a, b) => write!(f, "{p}: ambit {a}, Istio {b}"),
        }
    }
}

/// Every difference between `left` (ambit) and `right` (Istio), by JSON path
/// (`workloads[0].clusterId`). Arrays are compared element by element in order.
pub fn json_diff(left: &Value, right: &Value) -> Vec<Difference> {
    let mut out = Vec::new();
    diff_at("", left, right, &mut out);
    out
}

fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.len() > 120 {
        format!(
            "{}…",
            &s[..s.char_indices().nth(117).map_or(s.len(), |(i, _)| i)]
        )
    } else {
        s
    }
}

fn diff_at(path: &str, left: &Value, right: &Value, out: &mut Vec<Difference>) {
    match (left, right) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, va) in a {
                let p = join(path, k);
                match b.get(k) {
                    Some(vb) => diff_at(&p, va, vb, out),
                    None => out.push(Difference::OnlyLeft(p, short(va))),
                }
            }
            for (k, vb) in b {
                if !a.contains_key(k) {
                    out.push(Difference::OnlyRight(join(path, k), short(vb)));
                }
            }
        }
        (Value::Array(a), Value::Array(b)) => {
            for i in 0..a.len().max(b.len()) {
                let p = format!("{path}[{i}]");
                match (a.get(i), b.get(i)) {
                    (Some(x), Some(y)) => diff_at(&p, x, y, out),
                    (Some(x), None) => out.push(Difference::OnlyLeft(p, short(x))),
                    (None, Some(y)) => out.push(Difference::OnlyRight(p, short(y))),
                    (None, None) => {}
                }
            }
        }
        (a, b) if a != b => out.push(Difference::Value(path.to_string(), short(a), short(b))),
        _ => {}
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// The key paths of a document with every value replaced by its JSON type, for comparing
/// shapes where values are expected to differ (certificates, serial numbers).
pub fn shape(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(m.iter().map(|(k, v)| (k.clone(), shape(v))).collect()),
        Value::Array(a) => Value::Array(a.iter().map(shape).collect()),
        Value::String(_) => Value::String("string".into()),
        Value::Number(_) => Value::String("number".into()),
        Value::Bool(_) => Value::String("bool".into()),
        Value::Null => Value::Null,
    }
}

/// One Prometheus sample: `name{labels} value`.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

impl Sample {
    pub fn label(&self, k: &str) -> Option<&str> {
        self.labels.get(k).map(String::as_str)
    }
}

/// The samples of a Prometheus text exposition (comments and blank lines skipped).
/// Errors name the line that does not parse.
pub fn parse_prometheus(text: &str) -> Result<Vec<Sample>, String> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        out.push(parse_sample(line).map_err(|e| format!("line {}: {e}: {line:?}", n + 1))?);
    }
    Ok(out)
}

fn parse_sample(line: &str) -> Result<Sample, String> {
    let name_end = line
        .find(|c: char| c == '{' || c.is_whitespace())
        .ok_or("no value")?;
    let name = &line[..name_end];
    let mut rest = &line[name_end..];
    let mut labels = BTreeMap::new();
    if let Some(mut body) = rest.strip_prefix('{') {
        loop {
            body = body.trim_start_matches([',', ' ']);
            if let Some(after) = body.strip_prefix('}') {
                rest = after;
                break;
            }
            let eq = body.find('=').ok_or("a label without =")?;
            let key = body[..eq].trim();
            let quoted = body[eq + 1..]
                .strip_prefix('"')
                .ok_or_else(|| format!("label {key} has no quoted value"))?;
            let mut value = String::new();
            let mut end = None;
            let mut escaped = false;
            for (i, c) in quoted.char_indices() {
                if escaped {
                    value.push(if c == 'n' { '\n' } else { c });
                    escaped = false;
                } else if c == '\\' {
                    escaped = true;
                } else if c == '"' {
                    end = Some(i);
                    break;
                } else {
                    value.push(c);
                }
            }
            let end = end.ok_or_else(|| format!("label {key}: unterminated value"))?;
            labels.insert(key.to_string(), value);
            body = &quoted[end + 1..];
            if !body.starts_with([',', '}']) {
                return Err("expected , or } after a label".into());
            }
        }
    }
    let value = rest
        .split_whitespace()
        .next()
        .ok_or("no value")?
        .parse::<f64>()
        .map_err(|e| format!("value: {e}"))?;
    Ok(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

/// The samples whose name is `name`, each as its labels plus `value`, sorted, so two sets
/// of samples of one family compare with [`json_diff`].
pub fn family(samples: &[Sample], name: &str) -> Value {
    let mut rows: Vec<Value> = samples
        .iter()
        .filter(|s| s.name == name)
        .map(|s| {
            let mut m: serde_json::Map<String, Value> = s
                .labels
                .iter()
                .map(|(k, v)| (k.clone(), Value::String(v.clone())))
                .collect();
            m.insert("value".into(), serde_json::json!(s.value));
            Value::Object(m)
        })
        .collect();
    rows.sort_by_key(|r| r.to_string());
    Value::Array(rows)
}

/// One access log line (target `access`): its level, message and fields in order, each
/// value as written (quotes kept, so a quoted and an unquoted value differ).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogLine {
    pub level: String,
    pub target: String,
    pub message: String,
    pub fields: Vec<(String, String)>,
}

impl LogLine {
    pub fn field(&self, k: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.as_str())
    }

    pub fn names(&self) -> Vec<&str> {
        self.fields.iter().map(|(n, _)| n.as_str()).collect()
    }
}

/// Parses a log line in ztunnel's plain format: `time<TAB>level<TAB>target<TAB>message
/// k=v k="v" …`. `None` for a line in another format.
pub fn parse_log_line(line: &str) -> Option<LogLine> {
    let mut parts = line.splitn(4, '\t');
    let _time = parts.next()?;
    let level = parts.next()?.to_string();
    let target = parts.next()?.to_string();
    let rest = parts.next()?;
    let (message, fields) = match rest.split_once('\t') {
        Some((m, f)) => (m.to_string(), f),
        None => (rest.trim_end().to_string(), ""),
    };
    Some(LogLine {
        level,
        target,
        message,
        fields: split_fields(fields),
    })
}

/// `k=v k="quoted value" …`: a quoted value may hold spaces and escaped quotes.
fn split_fields(s: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = s.trim_start();
    while !rest.is_empty() {
        let Some(eq) = rest.find('=') else { break };
        let key = rest[..eq].trim().to_string();
        let after = &rest[eq + 1..];
        let (value, next) = if after.starts_with('"') {
            let mut end = None;
            let mut escaped = false;
            for (i, c) in after.char_indices().skip(1) {
                match (escaped, c) {
                    (true, _) => escaped = false,
                    (false, '\\') => escaped = true,
                    (false, '"') => {
                        end = Some(i);
                        break;
                    }
                    _ => {}
                }
            }
            match end {
                Some(i) => (&after[..=i], &after[i + 1..]),
                None => (after, ""),
            }
        } else {
            match after.find(' ') {
                Some(i) => (&after[..i], &after[i..]),
                None => (after, ""),
            }
        };
        out.push((key, value.to_string()));
        rest = next.trim_start();
    }
    out
}

/// `ip:port` with the port masked (`ip:*`): the client's ephemeral ports differ from run to
/// run. A value without a port is returned as it is.
pub fn mask_port(addr: &str) -> String {
    match addr.rsplit_once(':') {
        Some((ip, port)) if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => {
            format!("{ip}:*")
        }
        _ => addr.to_string(),
    }
}

/// A `forwarded` header value with the port of its `for="ip:port"` masked.
pub fn forwarded_masked(v: &str) -> String {
    v.split(';')
        .map(|part| {
            match part
                .strip_prefix("for=\"")
                .and_then(|r| r.strip_suffix('"'))
            {
                Some(addr) => format!("for=\"{}\"", mask_port(addr)),
                None => part.to_string(),
            }
        })
        .collect::<Vec<_>>()
        .join(";")
}

/// A W3C `traceparent` as HBONE clients send it: `00-<32 hex>-<16 hex>-00`, lower case,
/// neither id all zeros.
pub fn is_traceparent(v: &str) -> bool {
    let parts: Vec<&str> = v.split('-').collect();
    let hex = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    };
    parts.len() == 4
        && parts[0] == "00"
        && hex(parts[1], 32)
        && hex(parts[2], 16)
        && parts[3] == "00"
        && parts[1].bytes().any(|b| b != b'0')
        && parts[2].bytes().any(|b| b != b'0')
}

/// The access log lines (target `access`) of a log.
pub fn access_lines(log: &str) -> Vec<LogLine> {
    log.lines()
        .filter_map(parse_log_line)
        .filter(|l| l.target == "access")
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn json_diff_lists_every_difference_by_path() {
        let a = json!({"w": [{"x": 1, "y": "a", "only": true}], "s": {}});
        let b = json!({"w": [{"x": 2, "y": "a"}, {"x": 3}], "s": {"k": null}});
        let d = json_diff(&a, &b);
        let text: Vec<String> = d.iter().map(|d| d.to_string()).collect();
        assert_eq!(
            text,
            vec![
                "s.k: only Istio has it (null)",
                "w[0].only: only ambit has it (true)",
                "w[0].x: ambit 1, Istio 2",
                "w[1]: only Istio has it ({\"x\":3})",
            ]
        );
        assert!(json_diff(&a, &a).is_empty());
        assert_eq!(
            shape(&json!({"a": [1, "x", null]})),
            json!({"a": ["number", "string", null]})
        );
    }

    #[test]
    fn prometheus_samples_parse_with_escapes_and_without_labels() {
        let text = "# HELP x y\n# TYPE x counter\nx_total{a=\"1\",b=\"q\\\"uote\"} 3\nup 1\nz{} 2\nw{a=\"x,y}\",} 4.5\n";
        let s = parse_prometheus(text).unwrap();
        assert_eq!(s.len(), 4);
        assert_eq!(s[0].name, "x_total");
        assert_eq!(s[0].label("b"), Some("q\"uote"));
        assert_eq!(s[0].value, 3.0);
        assert_eq!(s[1].name, "up");
        assert!(s[1].labels.is_empty());
        assert!(s[2].labels.is_empty());
        assert_eq!(s[3].label("a"), Some("x,y}"));
        assert_eq!(s[3].value, 4.5);
        assert!(parse_prometheus("x{a=1} 2").is_err());
        assert!(parse_prometheus("x{a=\"1} 2").is_err());
        assert!(parse_prometheus("x").is_err());
        assert_eq!(
            family(&s, "x_total"),
            json!([{"a": "1", "b": "q\"uote", "value": 3.0}])
        );
    }

    #[test]
    fn ports_masked_and_traceparents_checked() {
        assert_eq!(mask_port("10.0.0.1:4000"), "10.0.0.1:*");
        assert_eq!(mask_port("[fd00::1]:4000"), "[fd00::1]:*");
        assert_eq!(mask_port("\"quoted\""), "\"quoted\"");
        assert_eq!(mask_port("host"), "host");
        assert_eq!(
            forwarded_masked("for=\"[::1]:80\";host=x"),
            "for=\"[::1]:*\";host=x"
        );
        assert_eq!(forwarded_masked("for=\"10.0.0.1:1\""), "for=\"10.0.0.1:*\"");
        assert!(is_traceparent(
            "00-145c8ce016d2dd7fe14a255fb466bb1e-6fee1f850ca699ca-00"
        ));
        assert!(!is_traceparent(
            "00-145C8CE016D2DD7FE14A255FB466BB1E-6fee1f850ca699ca-00"
        ));
        assert!(!is_traceparent(
            "00-00000000000000000000000000000000-6fee1f850ca699ca-00"
        ));
        assert!(!is_traceparent(
            "01-145c8ce016d2dd7fe14a255fb466bb1e-6fee1f850ca699ca-00"
        ));
        assert!(!is_traceparent(
            "00-145c8ce016d2dd7fe14a255fb466bb1e-6fee1f850ca699ca"
        ));
    }

    #[test]
    fn access_lines_in_ztunnel_plain_format() {
        let log = "2026-12-01T09:44:24.256353Z\terror\taccess\tconnection complete\tsrc.addr=10.78.0.1:60466 src.workload=\"client\" dst.identity=\"spiffe://a b\\\"c\" duration=\"10000ms\" error=\"connection failed: deadline\"\n\
                   2026-12-01T09:43:56.877683Z\tinfo\treadiness\tmarking server ready\t\n\
                   not a log line\n";
        let lines = access_lines(log);
        assert_eq!(lines.len(), 1);
        let l = &lines[0];
        assert_eq!(l.level, "error");
        assert_eq!(l.message, "connection complete");
        assert_eq!(
            l.names(),
            [
                "src.addr",
                "src.workload",
                "dst.identity",
                "duration",
                "error"
            ]
        );
        assert_eq!(l.field("src.addr"), Some("10.78.0.1:60466"));
        assert_eq!(l.field("dst.identity"), Some("\"spiffe://a b\\\"c\""));
        assert_eq!(l.field("error"), Some("\"connection failed: deadline\""));
        let ready = parse_log_line("t\tinfo\treadiness\tmarking server ready\t").unwrap();
        assert_eq!(ready.message, "marking server ready");
        assert!(ready.fields.is_empty());
    }
}
