//! Kubernetes label selectors (`matchLabels` and `matchExpressions`), checked once and then
//! evaluated without IO.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// A selector that does not follow the API's rules; the message names the part.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid label selector: {0}")]
pub struct InvalidSelector(pub String);

/// A validated selector.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Selector {
    labels: BTreeMap<String, String>,
    expressions: Vec<Expression>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Expression {
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

impl Selector {
    /// Checks `selector` as the API server would: known operators, values for `In` and
    /// `NotIn` only, non-empty keys.
    pub fn new(selector: &LabelSelector) -> Result<Selector, InvalidSelector> {
        let labels = selector.match_labels.clone().unwrap_or_default();
        if labels.keys().any(String::is_empty) {
            return Err(InvalidSelector("matchLabels has an empty key".into()));
        }
        let mut expressions = Vec::new();
        for (i, req) in selector.match_expressions.iter().flatten().enumerate() {
            let at = |what: &str| InvalidSelector(format!("matchExpressions[{i}]: {what}"));
            if req.key.is_empty() {
                return Err(at("empty key"));
            }
            let values = req.values.clone().unwrap_or_default();
            let key = req.key.clone();
            expressions.push(match req.operator.as_str() {
                "In" | "NotIn" if values.is_empty() => {
                    return Err(at(&format!("operator {} needs values", req.operator)))
                }
                "In" => Expression::In(key, values),
                "NotIn" => Expression::NotIn(key, values),
                "Exists" | "DoesNotExist" if !values.is_empty() => {
                    return Err(at(&format!("operator {} takes no values", req.operator)))
                }
                "Exists" => Expression::Exists(key),
                "DoesNotExist" => Expression::DoesNotExist(key),
                other => {
                    return Err(at(&format!(
                        "unknown operator {other:?} (In, NotIn, Exists, DoesNotExist)"
                    )))
                }
            });
        }
        Ok(Selector {
            labels,
            expressions,
        })
    }

    /// Whether the selector selects nothing in particular (and so matches everything).
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.expressions.is_empty()
    }

    /// Whether an object with `labels` is selected: every requirement holds.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.labels.iter().all(|(k, v)| labels.get(k) == Some(v))
            && self.expressions.iter().all(|e| match e {
                Expression::In(k, vs) => labels.get(k).is_some_and(|v| vs.contains(v)),
                Expression::NotIn(k, vs) => labels.get(k).is_none_or(|v| !vs.contains(v)),
                Expression::Exists(k) => labels.contains_key(k),
                Expression::DoesNotExist(k) => !labels.contains_key(k),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn expr(key: &str, op: &str, values: &[&str]) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: (!values.is_empty()).then(|| values.iter().map(|v| v.to_string()).collect()),
        }
    }

    fn selector(ml: &[(&str, &str)], exprs: Vec<LabelSelectorRequirement>) -> Selector {
        Selector::new(&LabelSelector {
            match_labels: (!ml.is_empty()).then(|| labels(ml)),
            match_expressions: (!exprs.is_empty()).then_some(exprs),
        })
        .unwrap()
    }

    #[test]
    fn every_operator_against_present_absent_and_other_values() {
        let a = labels(&[("mode", "ambient")]);
        let n = labels(&[("mode", "none")]);
        let none = labels(&[]);
        let cases: &[(Selector, [bool; 3])] = &[
            (
                selector(&[("mode", "ambient")], vec![]),
                [true, false, false],
            ),
            (
                selector(&[], vec![expr("mode", "In", &["ambient", "x"])]),
                [true, false, false],
            ),
            (
                selector(&[], vec![expr("mode", "NotIn", &["none"])]),
                [true, false, true],
            ),
            (
                selector(&[], vec![expr("mode", "Exists", &[])]),
                [true, true, false],
            ),
            (
                selector(&[], vec![expr("mode", "DoesNotExist", &[])]),
                [false, false, true],
            ),
            (Selector::default(), [true, true, true]),
            (
                selector(
                    &[("mode", "ambient")],
                    vec![expr("mode", "NotIn", &["ambient"])],
                ),
                [false, false, false],
            ),
        ];
        for (i, (s, want)) in cases.iter().enumerate() {
            let got = [s.matches(&a), s.matches(&n), s.matches(&none)];
            assert_eq!(&got, want, "case {i}: {s:?}");
        }
    }

    #[test]
    fn invalid_selectors_name_the_expression() {
        let bad = |e: LabelSelectorRequirement| {
            Selector::new(&LabelSelector {
                match_labels: None,
                match_expressions: Some(vec![expr("ok", "Exists", &[]), e]),
            })
            .unwrap_err()
            .to_string()
        };
        assert!(bad(expr("k", "In", &[])).contains("matchExpressions[1]: operator In needs values"));
        assert!(bad(expr("k", "Exists", &["v"])).contains("takes no values"));
        assert!(bad(expr("k", "Equals", &["v"])).contains("unknown operator \"Equals\""));
        assert!(bad(expr("", "Exists", &[])).contains("empty key"));
    }
}
