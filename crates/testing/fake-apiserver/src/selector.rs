//! Label and field selectors: Kubernetes' grammar, parsing and matching, sans IO.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::resource::Resource;

/// A selector the client wrote that we could not parse (a 400 for the client to fix).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    #[error("unable to parse requirement: {0}")]
    Label(String),
    #[error("invalid selector: '{0}'; can't understand '{1}'")]
    Field(String, String),
    #[error("field label not supported: {0}")]
    UnsupportedField(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum LabelOp {
    Eq(String),
    NotEq(String),
    In(BTreeSet<String>),
    NotIn(BTreeSet<String>),
    Exists,
    NotExists,
}

/// A parsed label selector: every requirement must hold (comma is AND).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabelSelector {
    reqs: Vec<(String, LabelOp)>,
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.'
}

/// A label name part or value: up to 63 of `[A-Za-z0-9._-]`, alphanumeric at both ends.
fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.chars().all(is_name_char)
        && s.starts_with(|c: char| c.is_ascii_alphanumeric())
        && s.ends_with(|c: char| c.is_ascii_alphanumeric())
}

fn check_key(key: &str) -> Result<(), SelectorError> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    let prefix_ok = prefix.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|l| {
                !l.is_empty()
                    && l.chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                    && !l.starts_with('-')
                    && !l.ends_with('-')
            })
    });
    if prefix_ok && valid_name(name) {
        Ok(())
    } else {
        Err(SelectorError::Label(format!(
            "invalid label key {key:?}: name part must consist of alphanumeric characters, \
             '-', '_' or '.', and must start and end with an alphanumeric character"
        )))
    }
}

fn check_value(v: &str) -> Result<(), SelectorError> {
    if v.is_empty() || valid_name(v) {
        Ok(())
    } else {
        Err(SelectorError::Label(format!(
            "invalid label value: {v:?}: a valid label must be an empty string or consist of \
             alphanumeric characters, '-', '_' or '.', and must start and end with an \
             alphanumeric character"
        )))
    }
}

/// Splits at commas outside parentheses.
fn split_top(s: &str) -> Result<Vec<&str>, SelectorError> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
        if !(0..=1).contains(&depth) {
            return Err(SelectorError::Label(format!(
                "unbalanced parentheses in {s:?}"
            )));
        }
    }
    if depth != 0 {
        return Err(SelectorError::Label(format!(
            "unbalanced parentheses in {s:?}"
        )));
    }
    parts.push(&s[start..]);
    Ok(parts)
}

fn parse_set(rest: &str) -> Result<BTreeSet<String>, SelectorError> {
    let inner = rest
        .trim()
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| SelectorError::Label(format!("found {rest:?}, expected: '('")))?;
    let mut set = BTreeSet::new();
    for v in inner.split(',') {
        let v = v.trim();
        check_value(v)?;
        set.insert(v.to_string());
    }
    Ok(set)
}

fn parse_requirement(req: &str) -> Result<(String, LabelOp), SelectorError> {
    let req = req.trim();
    if req.is_empty() {
        return Err(SelectorError::Label(
            "found '', expected: !, identifier, or 'end of string'".into(),
        ));
    }
    if let Some(key) = req.strip_prefix('!') {
        let key = key.trim();
        check_key(key)?;
        return Ok((key.to_string(), LabelOp::NotExists));
    }
    let end = req
        .find(|c: char| c.is_whitespace() || "!=(),<>".contains(c))
        .unwrap_or(req.len());
    let (key, rest) = req.split_at(end);
    check_key(key)?;
    let rest = rest.trim_start();
    let op = if rest.is_empty() {
        LabelOp::Exists
    } else if let Some(v) = rest.strip_prefix("==").or_else(|| rest.strip_prefix('=')) {
        let v = v.trim();
        check_value(v)?;
        LabelOp::Eq(v.to_string())
    } else if let Some(v) = rest.strip_prefix("!=") {
        let v = v.trim();
        check_value(v)?;
        LabelOp::NotEq(v.to_string())
    } else if let Some(s) = rest.strip_prefix("notin") {
        LabelOp::NotIn(parse_set(s)?)
    } else if let Some(s) = rest.strip_prefix("in") {
        LabelOp::In(parse_set(s)?)
    } else {
        return Err(SelectorError::Label(format!(
            "found {rest:?}, expected: in, notin, =, ==, !=, or 'end of string'"
        )));
    };
    Ok((key.to_string(), op))
}

impl LabelSelector {
    /// Parses Kubernetes' label selector syntax; the empty string selects everything.
    pub fn parse(s: &str) -> Result<LabelSelector, SelectorError> {
        if s.trim().is_empty() {
            return Ok(LabelSelector::default());
        }
        let reqs = split_top(s)?
            .into_iter()
            .map(parse_requirement)
            .collect::<Result<_, _>>()?;
        Ok(LabelSelector { reqs })
    }

    /// Whether an object's `metadata.labels` (absent = none) satisfy every requirement.
    pub fn matches(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels");
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.reqs.iter().all(|(k, op)| match op {
            LabelOp::Eq(v) => get(k) == Some(v.as_str()),
            LabelOp::NotEq(v) => get(k) != Some(v.as_str()),
            LabelOp::In(set) => get(k).is_some_and(|v| set.contains(v)),
            LabelOp::NotIn(set) => get(k).is_none_or(|v| !set.contains(v)),
            LabelOp::Exists => get(k).is_some(),
            LabelOp::NotExists => get(k).is_none(),
        })
    }

    pub fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }
}

/// A parsed field selector, checked against the fields a resource supports.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldSelector {
    /// (field, value, equal?)
    terms: Vec<(String, String, bool)>,
}

/// Splits at an unescaped `sep`, unescaping `\\`, `\,` and `\=`.
fn split_escaped(s: &str, sep: char) -> Vec<String> {
    let mut parts = vec![String::new()];
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let Some(n) = chars.next() {
                    if let Some(p) = parts.last_mut() {
                        if n != sep {
                            p.push('\\');
                        }
                        p.push(n);
                    }
                }
            }
            c if c == sep => parts.push(String::new()),
            c => {
                if let Some(p) = parts.last_mut() {
                    p.push(c)
                }
            }
        }
    }
    parts
}

fn unescape(s: &str) -> String {
    let mut out = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            if let Some(n) = chars.next() {
                out.push(n);
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The value of `field` on `obj` for field selection, or `None` when `resource` does not
/// support selecting on it (a missing field reads as "").
pub fn field_value(resource: Resource, obj: &Value, field: &str) -> Option<String> {
    let s = |p: &str| {
        obj.pointer(p)
            .map(|v| match v {
                Value::String(s) => s.clone(),
                Value::Bool(b) => b.to_string(),
                _ => String::new(),
            })
            .unwrap_or_default()
    };
    let supported = match field {
        "metadata.name" | "metadata.namespace" => true,
        _ => match resource {
            Resource::Pods => matches!(
                field,
                "spec.nodeName"
                    | "spec.restartPolicy"
                    | "spec.schedulerName"
                    | "spec.serviceAccountName"
                    | "spec.hostNetwork"
                    | "status.phase"
                    | "status.podIP"
                    | "status.nominatedNodeName"
            ),
            Resource::Namespaces => field == "status.phase",
            Resource::Nodes => field == "spec.unschedulable",
            Resource::Events => matches!(
                field,
                "involvedObject.kind"
                    | "involvedObject.namespace"
                    | "involvedObject.name"
                    | "involvedObject.uid"
                    | "involvedObject.apiVersion"
                    | "involvedObject.resourceVersion"
                    | "involvedObject.fieldPath"
                    | "reason"
                    | "reportingComponent"
                    | "source"
                    | "type"
            ),
            _ => false,
        },
    };
    if !supported {
        return None;
    }
    if resource == Resource::Events && field == "source" {
        // The source's component, else the reporting controller.
        let component = s("/source/component");
        return Some(if component.is_empty() {
            s("/reportingComponent")
        } else {
            component
        });
    }
    let pointer = format!("/{}", field.replace('.', "/"));
    let value = s(&pointer);
    // Unset booleans select as "false", as Kubernetes' field sets do.
    if value.is_empty() && matches!(field, "spec.hostNetwork" | "spec.unschedulable") {
        return Some("false".into());
    }
    Some(value)
}

impl FieldSelector {
    /// Parses `a=b,c!=d` (`==` too) and checks every field against `resource`.
    pub fn parse(s: &str, resource: Resource) -> Result<FieldSelector, SelectorError> {
        let mut terms = Vec::new();
        if s.trim().is_empty() {
            return Ok(FieldSelector::default());
        }
        for raw in split_escaped(s, ',') {
            // Re-escaped commas were consumed; find the operator in the raw term.
            let (field, value, eq) = if let Some((f, v)) = split_op(&raw, "!=") {
                (f, v, false)
            } else if let Some((f, v)) = split_op(&raw, "==") {
                (f, v, true)
            } else if let Some((f, v)) = split_op(&raw, "=") {
                (f, v, true)
            } else {
                return Err(SelectorError::Field(s.to_string(), raw));
            };
            let field = field.trim().to_string();
            let probe = Value::Object(Default::default());
            if field_value(resource, &probe, &field).is_none() {
                return Err(SelectorError::UnsupportedField(field));
            }
            terms.push((field, unescape(value.trim()), eq));
        }
        Ok(FieldSelector { terms })
    }

    pub fn matches(&self, resource: Resource, obj: &Value) -> bool {
        self.terms.iter().all(|(f, v, eq)| {
            let actual = field_value(resource, obj, f).unwrap_or_default();
            (actual == *v) == *eq
        })
    }

    /// The value an `metadata.name=` term pins, for RBAC's resourceNames on watches.
    pub fn pinned_name(&self) -> Option<&str> {
        self.terms
            .iter()
            .find(|(f, _, eq)| f == "metadata.name" && *eq)
            .map(|(_, v, _)| v.as_str())
    }
}

/// Splits `term` at the first unescaped `op`.
fn split_op<'a>(term: &'a str, op: &str) -> Option<(&'a str, &'a str)> {
    let bytes = term.as_bytes();
    let mut i = 0;
    while i + op.len() <= term.len() {
        if bytes[i] == b'\\' {
            i += 2;
            continue;
        }
        if term.is_char_boundary(i) && term[i..].starts_with(op) {
            // "!=" must not be read as "=" preceded by "!".
            if op == "=" && i > 0 && bytes[i - 1] == b'!' {
                i += 1;
                continue;
            }
            return Some((&term[..i], &term[i + op.len()..]));
        }
        i += 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(labels: Value) -> Value {
        json!({"metadata": {"name": "p", "namespace": "ns1", "labels": labels},
               "spec": {"nodeName": "n1"}, "status": {"phase": "Running"}})
    }

    #[test]
    fn label_selector_grammar() {
        let o = obj(json!({"app": "x", "tier": "web", "k8s.io/role": "a"}));
        let cases: &[(&str, bool)] = &[
            ("", true),
            ("app=x", true),
            ("app==x", true),
            ("app = x", true),
            ("app=y", false),
            ("app!=y", true),
            ("missing!=y", true),
            ("app!=x", false),
            ("app in (x, y)", true),
            ("app in (y,z)", false),
            ("app notin (y)", true),
            ("missing notin (y)", true),
            ("app notin (x)", false),
            ("missing in (x)", false),
            ("app", true),
            ("missing", false),
            ("!missing", true),
            ("!app", false),
            ("app=x,tier=web", true),
            ("app=x,tier=db", false),
            ("app in (x),!missing,tier", true),
            ("k8s.io/role=a", true),
            ("tier in (web,),app", true),
        ];
        for (sel, want) in cases {
            let s = LabelSelector::parse(sel).unwrap_or_else(|e| panic!("{sel}: {e}"));
            assert_eq!(s.matches(&o), *want, "{sel}");
        }
        let no_labels = json!({"metadata": {"name": "p"}});
        assert!(LabelSelector::parse("a!=b").unwrap().matches(&no_labels));
        assert!(!LabelSelector::parse("a").unwrap().matches(&no_labels));
    }

    #[test]
    fn label_selector_errors() {
        for bad in [
            "app=x,",
            ",",
            "app in x",
            "app in (x",
            "app=x y",
            "-app=x",
            "app=(x)",
            "app > 3",
            "app=x)",
            "a/b/c=d",
            "!",
        ] {
            let e = LabelSelector::parse(bad).expect_err(bad);
            assert!(
                e.to_string().starts_with("unable to parse requirement: "),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn field_selectors() {
        let o = obj(json!({}));
        let cases: &[(&str, bool)] = &[
            ("metadata.name=p", true),
            ("metadata.name==p", true),
            ("metadata.name!=p", false),
            ("metadata.namespace=ns1,spec.nodeName=n1", true),
            ("spec.nodeName=n2", false),
            ("spec.nodeName!=n2", true),
            ("status.phase=Running", true),
            ("status.podIP=", true),
            ("spec.hostNetwork=false", true),
        ];
        for (sel, want) in cases {
            let s = FieldSelector::parse(sel, Resource::Pods).unwrap();
            assert_eq!(s.matches(Resource::Pods, &o), *want, "{sel}");
        }
        assert_eq!(
            FieldSelector::parse("spec.foo=a", Resource::Pods),
            Err(SelectorError::UnsupportedField("spec.foo".into()))
        );
        assert_eq!(
            FieldSelector::parse("spec.nodeName=a", Resource::Namespaces)
                .unwrap_err()
                .to_string(),
            "field label not supported: spec.nodeName"
        );
        assert_eq!(
            FieldSelector::parse("metadata.name", Resource::Pods)
                .unwrap_err()
                .to_string(),
            "invalid selector: 'metadata.name'; can't understand 'metadata.name'"
        );
        let esc = FieldSelector::parse(r"metadata.name=a\,b", Resource::Pods).unwrap();
        assert_eq!(esc.pinned_name(), Some("a,b"));
    }

    #[test]
    fn event_and_custom_resource_fields() {
        let ev = json!({"metadata": {"name": "e", "namespace": "ns1"},
            "involvedObject": {"kind": "Pod", "name": "web", "namespace": "ns1"},
            "reason": "Scheduled", "type": "Normal", "reportingComponent": "scheduler"});
        for (sel, want) in [
            ("involvedObject.kind=Pod,involvedObject.name=web", true),
            ("reason=Scheduled,type=Normal", true),
            ("type=Warning", false),
            // No source.component: the reporting controller is the source.
            ("source=scheduler", true),
            ("reportingComponent=scheduler", true),
            ("metadata.namespace=ns1", true),
        ] {
            let f = FieldSelector::parse(sel, Resource::Events).unwrap();
            assert_eq!(f.matches(Resource::Events, &ev), want, "{sel}");
        }
        let mut sourced = ev.clone();
        sourced["source"] = json!({"component": "kubelet"});
        let f = FieldSelector::parse("source=kubelet", Resource::Events).unwrap();
        assert!(f.matches(Resource::Events, &sourced));
        assert!(FieldSelector::parse("reason=x", Resource::ConfigMaps).is_err());
        let gw = json!({"metadata": {"name": "g", "namespace": "ns1"}});
        for r in [
            Resource::Gateways,
            Resource::AuthorizationPolicies,
            Resource::ConfigMaps,
        ] {
            let f = FieldSelector::parse("metadata.name=g,metadata.namespace=ns1", r).unwrap();
            assert!(f.matches(r, &gw), "{r:?}");
            assert!(FieldSelector::parse("spec.gatewayClassName=x", r).is_err());
        }
    }
}
