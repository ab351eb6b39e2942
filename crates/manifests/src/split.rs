//! Splitting a multi-document YAML text at its `---` lines, so that each document is
//! parsed alone: a syntax error in one does not stop the parser from reading the next
//! (as one parser over the whole stream would).
//!
//! A line that starts with `---` followed by a space, a tab or its end is a document
//! marker wherever it stands: YAML forbids such a line inside any scalar, so it ends a
//! block scalar and is an error inside a quoted one. Directives (`%YAML`, `%TAG`) belong to
//! the document after them, so they stay with it.

/// One document's text and where it starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Segment<'a> {
    /// The document, from its marker line (or its first directive) on.
    pub text: &'a str,
    /// The 1-based line of the file its first line is.
    pub first_line: usize,
}

/// True for a `---` marker line.
fn is_marker(line: &str) -> bool {
    line.strip_prefix("---")
        .is_some_and(|rest| rest.is_empty() || rest.starts_with([' ', '\t', '\r', '\n']))
}

/// The documents of `text`, in order. Text before the first marker is a document too
/// (often only comments, which parse as an empty document).
pub(crate) fn documents(text: &str) -> Vec<Segment<'_>> {
    // (byte offset, line index) of each line start.
    let mut starts = Vec::new();
    let mut offset = 0;
    for (i, line) in text.split_inclusive('\n').enumerate() {
        starts.push((offset, i, line));
        offset += line.len();
    }
    let mut cuts = vec![(0usize, 0usize)];
    for (k, &(offset, line_no, line)) in starts.iter().enumerate() {
        if k == 0 || !is_marker(line) {
            continue;
        }
        // Directives right above the marker (with blank or comment lines between) go with
        // the document they announce.
        let mut cut = (offset, line_no);
        for &(o, n, l) in starts[..k].iter().rev() {
            let t = l.trim_end();
            if t.starts_with('%') {
                cut = (o, n);
            } else if !(t.is_empty() || t.starts_with('#')) {
                break;
            }
        }
        if cut.0 > cuts.last().map_or(0, |c| c.0) {
            cuts.push(cut);
        }
    }
    cuts.iter()
        .enumerate()
        .map(|(i, &(from, line))| {
            let to = cuts.get(i + 1).map_or(text.len(), |c| c.0);
            Segment {
                text: &text[from..to],
                first_line: line + 1,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(text: &str) -> Vec<(usize, &str)> {
        documents(text)
            .into_iter()
            .map(|s| (s.first_line, s.text))
            .collect()
    }

    #[test]
    fn splits_at_marker_lines_only() {
        let text = "a: 1\n---\nb: 2\n--- # c\nc: |\n  ---x\n  --- not at column 0\n---\n";
        assert_eq!(
            split(text),
            vec![
                (1, "a: 1\n"),
                (2, "---\nb: 2\n"),
                (4, "--- # c\nc: |\n  ---x\n  --- not at column 0\n"),
                (8, "---\n"),
            ]
        );
        // `----` and `---x` are not markers; a leading marker starts the first document.
        assert_eq!(
            split("---\na: ----\n---x: 1\n"),
            vec![(1, "---\na: ----\n---x: 1\n")]
        );
        assert_eq!(
            split("a\r\n---\r\nb\r\n"),
            vec![(1, "a\r\n"), (2, "---\r\nb\r\n")]
        );
        assert_eq!(split(""), vec![(1, "")]);
    }

    #[test]
    fn directives_stay_with_their_document() {
        let text = "a: 1\n...\n%YAML 1.2\n# note\n---\nb: 2\n";
        assert_eq!(
            split(text),
            vec![(1, "a: 1\n...\n"), (3, "%YAML 1.2\n# note\n---\nb: 2\n")]
        );
        // A directive line before the first document keeps the whole text together.
        assert_eq!(
            split("%YAML 1.2\n---\na: 1\n"),
            vec![(1, "%YAML 1.2\n---\na: 1\n")]
        );
    }
}
