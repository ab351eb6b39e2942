//! The `ipset_save` target: the agent's reader of `ipset save` output
//! (`ambit_agent::ipset::parse_save`): the members of a probe set and their comments (pod
//! UIDs), which decide whether a pod's removal may delete an entry. The sets live in the
//! host netns, shared with whatever else runs there.

use ambit_agent::ipset::{parse_save, Entry};
use ambit_agent::rules::split_words;

/// An entry written as `ipset save` writes it (comments quoted, `"` and `\` escaped).
fn render(name: &str, e: &Entry) -> String {
    match &e.comment {
        Some(c) => {
            let c = c.replace('\\', "\\\\").replace('"', "\\\"");
            format!("add {name} {} comment \"{c}\"\n", e.ip)
        }
        None => format!("add {name} {}\n", e.ip),
    }
}

/// What was read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The set asked for.
    pub set: String,
    /// Its entries.
    pub entries: Vec<Entry>,
}

/// Byte 0 picks the set name (`% 3`: Istio's v4 set, its v6 set, or the second word of the
/// first `add` line, so odd names are reached too); the rest is the text, invalid UTF-8
/// replaced.
///
/// Checks: at most one entry per line; the entries written back the way `ipset save`
/// writes them parse to the same entries.
pub fn run(data: &[u8]) -> Option<Outcome> {
    let (&pick, rest) = data.split_first()?;
    let text = String::from_utf8_lossy(rest);
    let name = match pick % 3 {
        0 => "istio-inpod-probes-v4".to_owned(),
        1 => "istio-inpod-probes-v6".to_owned(),
        _ => text
            .lines()
            .map(split_words)
            .find(|w| w.first().map(String::as_str) == Some("add"))
            .and_then(|w| w.get(1).cloned())
            .unwrap_or_default(),
    };
    let entries = parse_save(&text, &name);
    // No line yields more than one entry.
    assert!(entries.len() <= text.lines().count());
    if !name.is_empty() && !name.contains(|c: char| c.is_whitespace() || c == '"' || c == '\\') {
        // What was read, written back the way ipset writes it, reads the same.
        let written: String = entries.iter().map(|e| render(&name, e)).collect();
        assert_eq!(parse_save(&written, &name), entries, "{written}");
    }
    Some(Outcome { set: name, entries })
}
