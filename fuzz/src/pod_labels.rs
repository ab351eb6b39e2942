//! The `pod_labels` target: a pod's labels or annotations as the kubelet writes them into a
//! downward-API volume (the waypoint reads its Gateway's name and class there).

use std::collections::BTreeMap;

use ambit_k8s::downward::parse_downward;

/// Input: the file's text; invalid UTF-8 is replaced. Returns the keys and values, or the
/// error's variant.
///
/// Checks: what was read, written back as the kubelet writes it (Go's `%q`), reads back
/// the same.
pub fn run(data: &[u8]) -> Result<BTreeMap<String, String>, String> {
    let text = String::from_utf8_lossy(data);
    let read = match parse_downward(&text) {
        Ok(read) => read,
        Err(e) => {
            let _ = e.to_string();
            return Err(crate::variant(&e));
        }
    };
    let written: String = read
        .iter()
        .map(|(k, v)| format!("{k}={}\n", quote(v)))
        .collect();
    if written.len() <= ambit_k8s::downward::MAX_FILE_BYTES {
        assert_eq!(
            parse_downward(&written).as_ref(),
            Ok(&read),
            "{text:?} written back as {written:?}"
        );
    }
    Ok(read)
}

/// Go's `strconv.Quote`, near enough: `\\`, `\"`, the named control escapes, `\xHH` for
/// other control bytes; printable characters as they are.
fn quote(value: &str) -> String {
    let mut out = String::from("\"");
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}
