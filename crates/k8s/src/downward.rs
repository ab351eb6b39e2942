//! A pod's labels or annotations as the kubelet writes them into a downward-API volume
//! (Istio mounts them at `/etc/istio/pod/labels` and `/etc/istio/pod/annotations`): one
//! `key="value"` per line, the value quoted as Go's `%q` quotes a string.

use std::collections::BTreeMap;

/// The most a file may hold: labels and annotations together are capped at 256 KiB by the
/// API server, so anything larger is not the kubelet's.
pub const MAX_FILE_BYTES: usize = 256 * 1024;

/// Why a downward-API file was refused; `line` counts from 1.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DownwardError {
    #[error(
        "{bytes} bytes, more than the {MAX_FILE_BYTES} a pod's labels and annotations can hold"
    )]
    TooLarge { bytes: usize },
    #[error("line {line}: expected key=\"value\", found {found:?}")]
    NotKeyValue { line: usize, found: String },
    #[error("line {line}: the value of {key:?} is not a quoted string: {reason}")]
    BadValue {
        line: usize,
        key: String,
        reason: &'static str,
    },
}

/// Reads a downward-API file into its keys and values. A key listed twice keeps its last
/// value, as a map would have been written.
pub fn parse_downward(text: &str) -> Result<BTreeMap<String, String>, DownwardError> {
    if text.len() > MAX_FILE_BYTES {
        return Err(DownwardError::TooLarge { bytes: text.len() });
    }
    let mut out = BTreeMap::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        if raw.trim().is_empty() {
            continue;
        }
        let not_key_value = || DownwardError::NotKeyValue {
            line,
            found: raw.chars().take(80).collect(),
        };
        let (key, quoted) = raw.split_once('=').ok_or_else(not_key_value)?;
        if key.is_empty() || key.trim() != key {
            return Err(not_key_value());
        }
        let value = unquote(quoted).map_err(|reason| DownwardError::BadValue {
            line,
            key: key.to_string(),
            reason,
        })?;
        out.insert(key.to_string(), value);
    }
    Ok(out)
}

/// Undoes Go's `strconv.Quote`: the escapes `\a \b \f \n \r \t \v \\ \"`, `\xHH`, `\NNN`
/// (octal), `\uHHHH` and `\UHHHHHHHH`. Bytes that do not make UTF-8 are refused.
fn unquote(quoted: &str) -> Result<String, &'static str> {
    let inner = quoted
        .strip_prefix('"')
        .and_then(|q| q.strip_suffix('"'))
        .filter(|_| quoted.len() >= 2)
        .ok_or("it is not between double quotes")?;
    let mut bytes = Vec::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => return Err("an unescaped double quote inside it"),
            '\\' => {
                let escape = chars.next().ok_or("it ends in a lone backslash")?;
                match escape {
                    'a' => bytes.push(0x07),
                    'b' => bytes.push(0x08),
                    'f' => bytes.push(0x0c),
                    'n' => bytes.push(b'\n'),
                    'r' => bytes.push(b'\r'),
                    't' => bytes.push(b'\t'),
                    'v' => bytes.push(0x0b),
                    '\\' => bytes.push(b'\\'),
                    '"' => bytes.push(b'"'),
                    '\'' => bytes.push(b'\''),
                    'x' => bytes.push(digits(&mut chars, 2, 16)? as u8),
                    '0'..='7' => {
                        let rest = digits(&mut chars, 2, 8)?;
                        let value = (escape as u32 - '0' as u32) * 64 + rest;
                        bytes.push(u8::try_from(value).map_err(|_| "an octal escape above \\377")?);
                    }
                    'u' | 'U' => {
                        let n = if escape == 'u' { 4 } else { 8 };
                        let c = char::from_u32(digits(&mut chars, n, 16)?)
                            .ok_or("a \\u escape that is not a Unicode scalar value")?;
                        let mut buf = [0; 4];
                        bytes.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                    }
                    _ => return Err("an unknown escape"),
                }
            }
            c => {
                let mut buf = [0; 4];
                bytes.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
    String::from_utf8(bytes).map_err(|_| "its escapes do not make UTF-8")
}

fn digits(chars: &mut std::str::Chars<'_>, n: usize, radix: u32) -> Result<u32, &'static str> {
    let mut value = 0u32;
    for _ in 0..n {
        let d = chars
            .next()
            .and_then(|c| c.to_digit(radix))
            .ok_or("an escape with too few digits")?;
        value = value * radix + d;
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_the_kubelet_writes() {
        let text = "gateway.networking.k8s.io/gateway-class-name=\"istio-waypoint\"\n\
                    gateway.networking.k8s.io/gateway-name=\"waypoint\"\n\
                    note=\"a \\\"quoted\\\" line\\nand \\u00e9\\xc3\\xa9\\303\\251 \\\\\"\n";
        let m = parse_downward(text).unwrap();
        assert_eq!(m["gateway.networking.k8s.io/gateway-name"], "waypoint");
        assert_eq!(
            m["gateway.networking.k8s.io/gateway-class-name"],
            "istio-waypoint"
        );
        assert_eq!(m["note"], "a \"quoted\" line\nand ééé \\");
        assert!(parse_downward("").unwrap().is_empty());
        // An empty value and a value holding '='.
        let m = parse_downward("a=\"\"\nb=\"x=y\"\n").unwrap();
        assert_eq!((m["a"].as_str(), m["b"].as_str()), ("", "x=y"));
    }

    #[test]
    fn refusals_name_the_line_and_why() {
        let cases: &[(&str, &str)] = &[
            ("a=\"1\"\nnovalue\n", "line 2: expected key=\"value\""),
            ("=\"x\"", "line 1: expected key=\"value\""),
            (
                "a=x",
                "line 1: the value of \"a\" is not a quoted string: it is not between",
            ),
            ("a=\"", "not between double quotes"),
            ("a=\"x\"y\"", "an unescaped double quote"),
            ("a=\"x\\\"", "ends in a lone backslash"),
            ("a=\"\\q\"", "an unknown escape"),
            ("a=\"\\x4\"", "too few digits"),
            ("a=\"\\400\"", "above \\377"),
            ("a=\"\\xff\"", "do not make UTF-8"),
            ("a=\"\\ud800\"", "not a Unicode scalar value"),
        ];
        for (text, want) in cases {
            let e = parse_downward(text).unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: {e}");
        }
        let big = "a=\"b\"\n".repeat(MAX_FILE_BYTES / 6 + 1);
        assert!(matches!(
            parse_downward(&big),
            Err(DownwardError::TooLarge { .. })
        ));
    }
}
