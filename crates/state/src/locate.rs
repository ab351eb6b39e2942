//! Finding a node of a YAML document by its field path, for errors found after parsing
//! (a reference to a policy the file does not define, a target a waypoint cannot have)
//! that should still name a line and column: the one locator of the local config and of
//! the Kubernetes-shaped manifests.
//!
//! The YAML parser attaches the position of the node being read to any error raised while
//! reading it. So we walk the document a second time, generically, and raise a marker error
//! on reaching the node: its position is the answer.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// One step of a field path: a map key or a sequence index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    Key(String),
    Index(usize),
}

impl From<&str> for Step {
    fn from(k: &str) -> Step {
        Step::Key(k.to_string())
    }
}

impl From<usize> for Step {
    fn from(i: usize) -> Step {
        Step::Index(i)
    }
}

/// Parses `workloads[2].authorizationPolicies[0]` into steps. Keys are split at `.` and
/// `[`, so a key containing either cannot be named (such paths are not located).
pub fn parse_path(path: &str) -> Option<Vec<Step>> {
    let mut steps = Vec::new();
    for part in path.split('.') {
        let (key, mut rest) = part.split_once('[').map_or((part, ""), |(k, r)| (k, r));
        if key.is_empty() {
            return None;
        }
        steps.push(Step::Key(key.to_string()));
        while !rest.is_empty() {
            let (index, after) = rest.split_once(']')?;
            steps.push(Step::Index(index.parse().ok()?));
            rest = after.strip_prefix('[').unwrap_or(after);
            if !after.is_empty() && !after.starts_with('[') {
                return None;
            }
        }
    }
    Some(steps)
}

/// The 1-based line and column of the node at `path` in `yaml`, when it is there.
pub fn locate(yaml: &str, path: &[Step]) -> Option<(usize, usize)> {
    let de = yaml_serde::Deserializer::from_str(yaml);
    match (Walk { path }).deserialize(de) {
        Ok(()) => None,
        // The parser prefixes the message with its own path, so look inside it.
        Err(e) if e.to_string().contains(FOUND) => e.location().map(|l| (l.line(), l.column())),
        Err(_) => None,
    }
}

/// The marker error raised at the node looked for (never shown to anyone).
const FOUND: &str = "\u{0}ambit: found the node";

/// Walks towards `path`; every node off the path is skipped.
struct Walk<'p> {
    path: &'p [Step],
}

impl<'de> DeserializeSeed<'de> for Walk<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl Walk<'_> {
    /// The target is this node: raise the marker while the parser is still on it.
    fn here<E: de::Error>(&self) -> Result<(), E> {
        if self.path.is_empty() {
            Err(E::custom(FOUND))
        } else {
            Ok(())
        }
    }
}

/// A map key in the text form a path names it by (scalars only).
struct KeyText(Option<String>);

impl<'de> de::Deserialize<'de> for KeyText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'v> Visitor<'v> for V {
            type Value = KeyText;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map key")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<KeyText, E> {
                Ok(KeyText(Some(v.to_string())))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<KeyText, E> {
                Ok(KeyText(Some(v.to_string())))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<KeyText, E> {
                Ok(KeyText(Some(v.to_string())))
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<KeyText, E> {
                Ok(KeyText(Some(v.to_string())))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<KeyText, E> {
                Ok(KeyText(None))
            }
            fn visit_unit<E: de::Error>(self) -> Result<KeyText, E> {
                Ok(KeyText(None))
            }
            fn visit_seq<A: SeqAccess<'v>>(self, mut seq: A) -> Result<KeyText, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(KeyText(None))
            }
            fn visit_map<A: MapAccess<'v>>(self, mut map: A) -> Result<KeyText, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(KeyText(None))
            }
        }
        d.deserialize_any(V)
    }
}

impl<'de> Visitor<'de> for Walk<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML node")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        self.here()?;
        while let Some(KeyText(key)) = map.next_key()? {
            match (&self.path[0], key) {
                (Step::Key(want), Some(key)) if *want == key => {
                    map.next_value_seed(Walk {
                        path: &self.path[1..],
                    })?;
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        self.here()?;
        let mut index = 0;
        loop {
            let more = match &self.path[0] {
                Step::Index(want) if *want == index => seq
                    .next_element_seed(Walk {
                        path: &self.path[1..],
                    })?
                    .is_some(),
                _ => seq.next_element::<IgnoredAny>()?.is_some(),
            };
            if !more {
                return Ok(());
            }
            index += 1;
        }
    }

    fn visit_enum<A: de::EnumAccess<'de>>(self, data: A) -> Result<(), A::Error> {
        use de::VariantAccess;
        self.here()?;
        let (IgnoredAny, v) = data.variant::<IgnoredAny>()?;
        v.newtype_variant::<IgnoredAny>().map(|_| ())
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        self.here()
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        self.here()
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        self.here()
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        self.here()
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        self.here()
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.here()
    }
    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        self.here()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(yaml: &str, path: &str) -> Option<(usize, usize)> {
        locate(yaml, &parse_path(path).unwrap())
    }

    #[test]
    fn paths() {
        use Step::{Index, Key};
        assert_eq!(
            parse_path("workloads[2].authorizationPolicies[0]"),
            Some(vec![
                Key("workloads".into()),
                Index(2),
                Key("authorizationPolicies".into()),
                Index(0)
            ])
        );
        assert_eq!(
            parse_path("rules[0][1]"),
            Some(vec![Key("rules".into()), Index(0), Index(1)])
        );
        for bad in ["", "a..b", "a[x]", "a[1", "a[1]b", "[1]"] {
            assert_eq!(parse_path(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn finds_nodes_in_block_and_flow_style() {
        let yaml = "workloads:\n- name: a\n- name: b\n  authorizationPolicies: [x, \"y\"]\n  services: {ns/h: {80: 8080}}\n  tags: [!Exact t]\n";
        assert_eq!(at(yaml, "workloads"), Some((2, 1)));
        assert_eq!(at(yaml, "workloads[1]"), Some((3, 3)));
        assert_eq!(at(yaml, "workloads[1].name"), Some((3, 9)));
        assert_eq!(
            at(yaml, "workloads[1].authorizationPolicies[1]"),
            Some((4, 30))
        );
        assert_eq!(at(yaml, "workloads[1].services"), Some((5, 13)));
        assert_eq!(at(yaml, "workloads[1].tags[0]"), Some((6, 10)));
        // Not there, or not a valid document.
        assert_eq!(at(yaml, "workloads[2]"), None);
        assert_eq!(at(yaml, "workloads[0].authorizationPolicies[0]"), None);
        assert_eq!(at(yaml, "policies"), None);
        // A syntax error before the node hides it (callers locate in documents that parsed).
        assert_eq!(at("x: [\nworkloads: []\n", "workloads"), None);
    }
}
