//! Request path normalisation, as Istio's MeshConfig `pathNormalization` applies it to every
//! request before policy matching and before forwarding (so that the backend sees the path
//! the policies judged): `%2e%2e`, `\` and `//` cannot walk a request past a path rule.
//!
//! Sans-IO and allocation-free when the path needs no change. A path that cannot be
//! normalised is the client's fault; the caller answers 400.

use std::borrow::Cow;
use std::fmt;

use crate::names::string_enum;

string_enum! {
    /// MeshConfig `pathNormalization.normalization`: what is done to a request path.
    pub enum PathNormalization {
        /// Nothing (the checks every mode makes still apply).
        None = "NONE",
        /// RFC 3986 §5.2.4 dot-segment removal, percent-encoded unreserved characters
        /// decoded, `\` read as `/`. Istio's default (`DEFAULT` is the same).
        Base = "BASE" | "DEFAULT",
        /// [`PathNormalization::Base`], then runs of `/` merged into one.
        MergeSlashes = "MERGE_SLASHES",
        /// `%2F` and `%5C` decoded to `/` first, then [`PathNormalization::MergeSlashes`].
        DecodeAndMergeSlashes = "DECODE_AND_MERGE_SLASHES",
    }
}

impl Default for PathNormalization {
    /// Istio's default.
    fn default() -> Self {
        PathNormalization::Base
    }
}

/// A request target split into its normalised path and its query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Normalized<'a> {
    /// The path, normalised: what policies and routes match, and what is forwarded.
    pub path: Cow<'a, str>,
    /// The query after the first `?` (without it), as received: never normalised, never
    /// matched by a path rule, forwarded as is. `None`: the target had no `?`.
    pub query: Option<&'a str>,
}

impl Normalized<'_> {
    /// The path and query to forward (`path?query`).
    pub fn path_and_query(&self) -> Cow<'_, str> {
        match self.query {
            None => Cow::Borrowed(&*self.path),
            Some(q) => Cow::Owned(format!("{}?{q}", self.path)),
        }
    }
}

/// Why a request path was refused: always the client's fault (answer 400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// The target does not start with `/` (an absolute or asterisk form, or nothing).
    #[error("request target {start:?} is not a path starting with \"/\" (origin form); the client must send one")]
    NotOriginForm {
        /// The target's first bytes (at most 32), for the log.
        start: String,
    },
    /// `%00`, or a raw NUL, in the path.
    #[error("request path has a NUL (%00) at byte {at}; refused, as Istio refuses it")]
    Nul { at: usize },
    /// A `%` not followed by two hex digits.
    #[error(
        "request path has a malformed percent-encoding at byte {at}; '%' must be followed by two hex digits (write a literal '%' as %25)"
    )]
    BadPercent { at: usize },
    /// A byte no request target carries: a control character, a space, or `#` (a
    /// fragment is never sent).
    #[error("request target has byte {byte:#04x} at byte {at}, which a request target may not carry (controls, space, '#')")]
    BadByte { at: usize, byte: u8 },
}

/// Splits `raw` (a request's origin-form target, `path[?query]`) into its path, normalised
/// as `mode` says, and its query, kept as received. Refused in every mode (the client's
/// fault): a target not starting with `/`, `%00` in the path, a malformed percent-encoding in
/// the path, a control byte, space or `#` anywhere.
///
/// Letter case is kept (paths compare case-sensitively); the hex digits of an escape that
/// stays are upper-cased, so `%2f` and `%2F` read alike. Never longer than `raw`'s path.
pub fn normalize_path(raw: &str, mode: PathNormalization) -> Result<Normalized<'_>, PathError> {
    if let Some(at) = raw
        .bytes()
        .position(|b| b <= b' ' || b == 0x7f || b == b'#')
    {
        let byte = raw.as_bytes()[at];
        return Err(if byte == 0 {
            PathError::Nul { at }
        } else {
            PathError::BadByte { at, byte }
        });
    }
    if !raw.starts_with('/') {
        let mut end = raw.len().min(32);
        while !raw.is_char_boundary(end) {
            end -= 1;
        }
        return Err(PathError::NotOriginForm {
            start: raw[..end].to_string(),
        });
    }
    let (path, query) = match raw.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (raw, None),
    };
    check_escapes(path)?;
    let path = if mode == PathNormalization::None || is_normal(path, mode) {
        Cow::Borrowed(path)
    } else {
        Cow::Owned(normalize(path, mode))
    };
    Ok(Normalized { path, query })
}

/// Every `%` is followed by two hex digits, and none encodes NUL.
fn check_escapes(path: &str) -> Result<(), PathError> {
    let b = path.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            match (b.get(i + 1).and_then(hex), b.get(i + 2).and_then(hex)) {
                (Some(0), Some(0)) => return Err(PathError::Nul { at: i }),
                (Some(_), Some(_)) => i += 3,
                _ => return Err(PathError::BadPercent { at: i }),
            }
        } else {
            i += 1;
        }
    }
    Ok(())
}

fn hex(b: &u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// RFC 3986 §2.3: ALPHA, DIGIT, `-`, `.`, `_`, `~`.
fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// True if normalising would change nothing (the common case: no allocation). Conservative:
/// a `%`, `\`, `/.` or (when merging) `//` takes the full path.
fn is_normal(path: &str, mode: PathNormalization) -> bool {
    let merge = mode != PathNormalization::Base;
    !(path.contains(['%', '\\']) || path.contains("/.") || merge && path.contains("//"))
}

/// The full normalisation of a checked path (see [`normalize_path`]).
fn normalize(path: &str, mode: PathNormalization) -> String {
    let decoded = decode(path, mode == PathNormalization::DecodeAndMergeSlashes);
    let resolved = remove_dot_segments(&decoded);
    if mode == PathNormalization::Base {
        return resolved;
    }
    let mut merged = String::with_capacity(resolved.len());
    for c in resolved.chars() {
        if !(c == '/' && merged.ends_with('/')) {
            merged.push(c);
        }
    }
    merged
}

/// Decodes escapes of unreserved characters (and, with `slashes`, of `/` and `\`, as `/`),
/// upper-cases the hex of the others, and reads `\` as `/`. Decoding is one pass over the
/// received text: what it yields is never decoded again (`%252F` stays `%252F`).
fn decode(path: &str, slashes: bool) -> String {
    let b = path.as_bytes();
    let mut out = String::with_capacity(path.len());
    let mut run = 0; // start of the bytes not yet copied
    let mut i = 0;
    while i < b.len() {
        let (with, len) = match b[i] {
            b'\\' => (Replacement::Char('/'), 1),
            b'%' => {
                // Checked by `check_escapes`: two hex digits follow.
                let (hi, lo) = (b[i + 1], b[i + 2]);
                let v = hex(&hi).unwrap_or(0) << 4 | hex(&lo).unwrap_or(0);
                let with = if is_unreserved(v) {
                    Replacement::Char(char::from(v))
                } else if slashes && (v == b'/' || v == b'\\') {
                    Replacement::Char('/')
                } else {
                    Replacement::Escape(hi.to_ascii_uppercase(), lo.to_ascii_uppercase())
                };
                (with, 3)
            }
            _ => {
                i += 1;
                continue;
            }
        };
        // `\` and `%` are ASCII, so `run..i` ends at a character boundary.
        out.push_str(&path[run..i]);
        match with {
            Replacement::Char(c) => out.push(c),
            Replacement::Escape(hi, lo) => {
                out.push('%');
                out.push(char::from(hi));
                out.push(char::from(lo));
            }
        }
        i += len;
        run = i;
    }
    out.push_str(&path[run..]);
    out
}

/// What one `\` or escape of the input becomes.
enum Replacement {
    Char(char),
    Escape(u8, u8),
}

/// RFC 3986 §5.2.4 for an absolute path: `.` segments dropped, `..` drops the segment before
/// it (never above the root); a path ending in `.` or `..` keeps its trailing `/`. Empty
/// segments are segments (`/a//..` is `/a/`), as the RFC's algorithm treats them.
fn remove_dot_segments(path: &str) -> String {
    let rest = path.strip_prefix('/').unwrap_or(path);
    let mut kept: Vec<&str> = Vec::new();
    let mut segments = rest.split('/').peekable();
    while let Some(seg) = segments.next() {
        let last = segments.peek().is_none();
        match seg {
            "." => {}
            ".." => {
                kept.pop();
            }
            s => {
                kept.push(s);
                continue;
            }
        }
        if last {
            kept.push("");
        }
    }
    let mut out = String::with_capacity(path.len());
    for seg in &kept {
        out.push('/');
        out.push_str(seg);
    }
    if out.is_empty() {
        out.push('/');
    }
    out
}

impl fmt::Display for Normalized<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.path_and_query())
    }
}

#[cfg(test)]
mod tests;
