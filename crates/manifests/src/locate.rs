//! Field paths (`spec.rules[0].from[1].source`) and finding where a field is written, for
//! refusals found after a document parsed (a target a waypoint cannot have, a CUSTOM
//! policy without a provider), which should still name a line and column.
//!
//! The YAML parser gives every error raised while it reads a node that node's position.
//! So the document is read a second time by a walker that skips everything off the path
//! and raises an error on reaching the node: that error's position is the node's.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use crate::error::Position;

/// One step of a field path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Step {
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

/// A field path, built step by step.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct FieldPath(pub Vec<Step>);

impl FieldPath {
    /// This path with more steps.
    pub fn at(&self, steps: impl IntoIterator<Item = Step>) -> FieldPath {
        let mut p = self.clone();
        p.0.extend(steps);
        p
    }
}

impl IntoIterator for FieldPath {
    type Item = Step;
    type IntoIter = std::vec::IntoIter<Step>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

/// `FieldPath` from steps: `field!["spec", "rules", i]`.
macro_rules! field {
    ($($step:expr),* $(,)?) => {
        $crate::locate::FieldPath(vec![$($crate::locate::Step::from($step)),*])
    };
}
pub(crate) use field;

impl fmt::Display for FieldPath {
    /// As the parser names fields: `a.b[0].c`; a key that holds `.`, `[` or `/` (an
    /// annotation's) in brackets and quotes: `annotations["istio.io/dry-run"]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, step) in self.0.iter().enumerate() {
            match step {
                Step::Index(n) => write!(f, "[{n}]")?,
                Step::Key(k) if k.contains(['.', '[', ']', '/', '"']) => write!(f, "[{k:?}]")?,
                Step::Key(k) if i == 0 => f.write_str(k)?,
                Step::Key(k) => write!(f, ".{k}")?,
            }
        }
        Ok(())
    }
}

/// The position of the node at `path` in the document `yaml`, or of its nearest ancestor
/// that is written (a field left out is refused where its parent is); `None` only for a
/// document that does not parse.
pub(crate) fn locate(yaml: &str, path: &FieldPath) -> Option<Position> {
    (0..=path.0.len())
        .rev()
        .find_map(|n| locate_exact(yaml, &path.0[..n]))
}

fn locate_exact(yaml: &str, path: &[Step]) -> Option<Position> {
    let de = yaml_serde::Deserializer::from_str(yaml);
    match (Walk { path }).deserialize(de) {
        Err(e) if e.to_string().contains(FOUND) => e.location().map(|l| Position {
            line: l.line(),
            column: l.column(),
        }),
        _ => None,
    }
}

/// The error raised on reaching the node (never shown).
const FOUND: &str = "\u{0}the node looked for";

struct Walk<'p> {
    path: &'p [Step],
}

impl Walk<'_> {
    fn here<E: de::Error>(&self) -> Result<(), E> {
        match self.path {
            [] => Err(E::custom(FOUND)),
            _ => Ok(()),
        }
    }
}

impl<'de> DeserializeSeed<'de> for Walk<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

/// A map key as text (`None`: not a scalar, so no path names it).
struct KeyText(Option<String>);

impl<'de> de::Deserialize<'de> for KeyText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = KeyText;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map key")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<KeyText, E> {
                Ok(KeyText(Some(v.to_string())))
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<KeyText, E> {
                Ok(KeyText(Some(v.to_string())))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<KeyText, E> {
                Ok(KeyText(Some(v.to_string())))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<KeyText, E> {
                Ok(KeyText(Some(v.to_string())))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<KeyText, E> {
                Ok(KeyText(None))
            }
            fn visit_unit<E: de::Error>(self) -> Result<KeyText, E> {
                Ok(KeyText(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<KeyText, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(KeyText(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<KeyText, A::Error> {
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
                (Step::Key(want), Some(key)) if *want == key => map.next_value_seed(Walk {
                    path: &self.path[1..],
                })?,
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
            let more = match self.path[0] {
                Step::Index(want) if want == index => seq
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
        v.newtype_variant::<IgnoredAny>().map(drop)
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

    fn at(yaml: &str, path: FieldPath) -> Option<(usize, usize)> {
        locate(yaml, &path).map(|p| (p.line, p.column))
    }

    #[test]
    fn shows_paths_as_the_parser_does() {
        assert_eq!(
            field!["spec", "rules", 0, "from", 1, "source"].to_string(),
            "spec.rules[0].from[1].source"
        );
        assert_eq!(
            field!["metadata", "annotations", "istio.io/dry-run"].to_string(),
            "metadata.annotations[\"istio.io/dry-run\"]"
        );
        assert_eq!(field![].to_string(), "");
    }

    #[test]
    fn finds_nodes_or_their_nearest_written_ancestor() {
        let yaml = "---\nspec:\n  rules:\n  - to: [{operation: {methods: [GET, \"put\"]}}]\n  action: DENY\nmetadata: {annotations: {istio.io/dry-run: \"x\"}}\n";
        assert_eq!(at(yaml, field![]), Some((2, 1)));
        assert_eq!(at(yaml, field!["spec", "action"]), Some((5, 11)));
        assert_eq!(
            at(
                yaml,
                field!["spec", "rules", 0, "to", 0, "operation", "methods", 1]
            ),
            Some((4, 38))
        );
        assert_eq!(
            at(yaml, field!["metadata", "annotations", "istio.io/dry-run"]),
            Some((6, 44))
        );
        // Not written: where its parent is.
        assert_eq!(at(yaml, field!["spec", "provider", "name"]), Some((3, 3)));
        assert_eq!(at(yaml, field!["spec", "rules", 3]), Some((4, 3)));
        // Not YAML: only what comes before the error.
        assert_eq!(at("a: [\nb: 1\n", field!["a"]), Some((1, 4)));
        assert_eq!(at("a: [\nb: 1\n", field!["b"]), Some((1, 1)));
    }
}
