//! Field paths (`spec.rules[0].from[1].source`) as the manifests name them, and where a
//! field is written, for refusals found after a document parsed (a target a waypoint
//! cannot have, a CUSTOM policy without a provider), which should still name a line and
//! column. The walker that finds a node is the state crate's, the one locator of the
//! project.

use std::fmt;

pub(crate) use ambit_state::locate::Step;

use crate::error::Position;

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
    ambit_state::locate::locate(yaml, path).map(|(line, column)| Position { line, column })
}
