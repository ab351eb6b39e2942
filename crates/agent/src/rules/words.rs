//! Shell-style word splitting of rule specs and `ipset save` lines.

/// Splits a rule spec into words, keeping double-quoted strings (with `\"` escapes) whole.
fn words(spec: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut quoted = false;
    let mut chars = spec.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' if quoted => {
                if let Some(n) = chars.next() {
                    cur.push(n);
                }
            }
            '"' => {
                quoted = !quoted;
                in_word = true;
            }
            c if c.is_whitespace() && !quoted => {
                if in_word {
                    out.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            c => {
                cur.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        out.push(cur);
    }
    out
}

/// The `-j`/`--jump`/`-g`/`--goto` target of a rule spec.
pub fn rule_target(spec: &str) -> Option<String> {
    let w = words(spec);
    w.iter()
        .position(|t| matches!(t.as_str(), "-j" | "--jump" | "-g" | "--goto"))
        .and_then(|i| w.get(i + 1).cloned())
}

/// Splits an `ipset save` line into words (quotes honoured); shared with [`crate::ipset`].
pub fn split_words(line: &str) -> Vec<String> {
    words(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoted_words() {
        assert_eq!(
            words(r#"add s 10.0.0.1 comment "a \"b\" c""#),
            ["add", "s", "10.0.0.1", "comment", r#"a "b" c"#]
        );
        assert_eq!(
            rule_target(r#"-m comment --comment "x -j Y" -g ISTIO_Z"#).as_deref(),
            Some("ISTIO_Z")
        );
    }
}
