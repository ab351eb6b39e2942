//! Path normalisation: every case under every mode, what each refuses, and that a
//! normalised path normalises to itself.

use super::*;
use PathNormalization::{Base, DecodeAndMergeSlashes as Decode, MergeSlashes as Merge};

const MODES: [PathNormalization; 4] = [PathNormalization::None, Base, Merge, Decode];

/// What a target becomes: (path, query) or the error.
type Want = Result<(&'static str, Option<&'static str>), PathError>;

fn ok(path: &'static str) -> Want {
    Ok((path, None))
}

/// (target, [NONE, BASE, MERGE_SLASHES, DECODE_AND_MERGE_SLASHES]).
fn table() -> Vec<(&'static str, [Want; 4])> {
    let same = |p: &'static str| [ok(p), ok(p), ok(p), ok(p)];
    let all = |e: PathError| [Err(e.clone()), Err(e.clone()), Err(e.clone()), Err(e)];
    let base = |raw: &'static str, p: &'static str| [ok(raw), ok(p), ok(p), ok(p)];
    vec![
        // Dot segments (RFC 3986 §5.2.4), never above the root.
        ("/a/../b", base("/a/../b", "/b")),
        ("/a/./b", base("/a/./b", "/a/b")),
        ("/../a", base("/../a", "/a")),
        ("/../../a/../../b", base("/../../a/../../b", "/b")),
        ("/a/b/..", base("/a/b/..", "/a/")),
        ("/a/b/.", base("/a/b/.", "/a/b/")),
        ("/..", base("/..", "/")),
        ("/.", base("/.", "/")),
        // Not dot segments.
        ("/a/.b/..c/.../", same("/a/.b/..c/.../")),
        ("/.well-known/x", same("/.well-known/x")),
        // Encoded dots are dots.
        ("/a/%2e%2e/b", base("/a/%2e%2e/b", "/b")),
        ("/a/%2E%2e/b", base("/a/%2E%2e/b", "/b")),
        ("/a/%2E/b", base("/a/%2E/b", "/a/b")),
        ("/a/.%2e", base("/a/.%2e", "/")),
        (
            "/%2e%2e/%2e%2e/etc/passwd",
            base("/%2e%2e/%2e%2e/etc/passwd", "/etc/passwd"),
        ),
        // Slashes: merged only by the merging modes, and after dot segments are resolved
        // (the `..` takes the empty segment, not `a`).
        ("//a", [ok("//a"), ok("//a"), ok("/a"), ok("/a")]),
        ("/a//b", [ok("/a//b"), ok("/a//b"), ok("/a/b"), ok("/a/b")]),
        (
            "/a///b//",
            [ok("/a///b//"), ok("/a///b//"), ok("/a/b/"), ok("/a/b/")],
        ),
        (
            "/a//../b",
            [ok("/a//../b"), ok("/a/b"), ok("/a/b"), ok("/a/b")],
        ),
        ("//", [ok("//"), ok("//"), ok("/"), ok("/")]),
        // %2F and %5C: decoded (as '/') only by DECODE_AND_MERGE_SLASHES; the hex of an
        // escape that stays is upper-cased.
        (
            "/a%2Fb",
            [ok("/a%2Fb"), ok("/a%2Fb"), ok("/a%2Fb"), ok("/a/b")],
        ),
        (
            "/a%2fb",
            [ok("/a%2fb"), ok("/a%2Fb"), ok("/a%2Fb"), ok("/a/b")],
        ),
        (
            "/a%5cb",
            [ok("/a%5cb"), ok("/a%5Cb"), ok("/a%5Cb"), ok("/a/b")],
        ),
        (
            "/a%2F%2Fb",
            [
                ok("/a%2F%2Fb"),
                ok("/a%2F%2Fb"),
                ok("/a%2F%2Fb"),
                ok("/a/b"),
            ],
        ),
        (
            "/a/..%2F..%2Fb",
            [
                ok("/a/..%2F..%2Fb"),
                ok("/a/..%2F..%2Fb"),
                ok("/a/..%2F..%2Fb"),
                ok("/b"),
            ],
        ),
        // Decoded once: %25 is never decoded, so %252F stays.
        ("/a%252Fb", same("/a%252Fb")),
        ("/a%2541", same("/a%2541")),
        // Unreserved characters are decoded, in either hex case; others stay escaped.
        ("/%41%7e", base("/%41%7e", "/A~")),
        (
            "/%7E%2D%5F%30%39%5A%61%7A",
            base("/%7E%2D%5F%30%39%5A%61%7A", "/~-_09Zaz"),
        ),
        ("/a%20b", same("/a%20b")),
        ("/%c3%a9", base("/%c3%a9", "/%C3%A9")),
        ("/%3f%23", base("/%3f%23", "/%3F%23")),
        // Backslash is '/', in every mode but NONE.
        ("/a\\b", base("/a\\b", "/a/b")),
        ("/\\a", [ok("/\\a"), ok("//a"), ok("/a"), ok("/a")]),
        ("/a\\..\\b", base("/a\\..\\b", "/b")),
        // Trailing slash and case are kept.
        ("/a/", same("/a/")),
        ("/", same("/")),
        ("/Admin/B", same("/Admin/B")),
        ("/A/%62/..", base("/A/%62/..", "/A/")),
        ("/é/x", same("/é/x")),
        // The query is split off, kept as received, never normalised.
        (
            "/a?x=1",
            [
                Ok(("/a", Some("x=1"))),
                Ok(("/a", Some("x=1"))),
                Ok(("/a", Some("x=1"))),
                Ok(("/a", Some("x=1"))),
            ],
        ),
        (
            "/a/../b?x=/../%2f%zz%00",
            [
                Ok(("/a/../b", Some("x=/../%2f%zz%00"))),
                Ok(("/b", Some("x=/../%2f%zz%00"))),
                Ok(("/b", Some("x=/../%2f%zz%00"))),
                Ok(("/b", Some("x=/../%2f%zz%00"))),
            ],
        ),
        (
            "/?",
            [
                Ok(("/", Some(""))),
                Ok(("/", Some(""))),
                Ok(("/", Some(""))),
                Ok(("/", Some(""))),
            ],
        ),
        // Refused in every mode.
        ("/a%00b", all(PathError::Nul { at: 2 })),
        ("/a/%00", all(PathError::Nul { at: 3 })),
        ("/a%", all(PathError::BadPercent { at: 2 })),
        ("/a%2", all(PathError::BadPercent { at: 2 })),
        ("/a%zz", all(PathError::BadPercent { at: 2 })),
        ("/a%%41", all(PathError::BadPercent { at: 2 })),
        ("/a%g0", all(PathError::BadPercent { at: 2 })),
        ("/a\0", all(PathError::Nul { at: 2 })),
        ("/a b", all(PathError::BadByte { at: 2, byte: b' ' })),
        ("/a#frag", all(PathError::BadByte { at: 2, byte: b'#' })),
        ("/a\tb", all(PathError::BadByte { at: 2, byte: b'\t' })),
        ("/a\x7f", all(PathError::BadByte { at: 2, byte: 0x7f })),
        ("/a?q\r", all(PathError::BadByte { at: 4, byte: b'\r' })),
        (
            "\\a",
            all(PathError::NotOriginForm {
                start: "\\a".into(),
            }),
        ),
        ("", all(PathError::NotOriginForm { start: "".into() })),
        ("*", all(PathError::NotOriginForm { start: "*".into() })),
        (
            "http://example.com/a",
            all(PathError::NotOriginForm {
                start: "http://example.com/a".into(),
            }),
        ),
        (
            "a/../b",
            all(PathError::NotOriginForm {
                start: "a/../b".into(),
            }),
        ),
        (
            "?/a",
            all(PathError::NotOriginForm {
                start: "?/a".into(),
            }),
        ),
    ]
}

#[test]
fn every_case_under_every_mode() {
    let mut failures = Vec::new();
    for (raw, wants) in table() {
        for (mode, want) in MODES.iter().zip(wants) {
            let got = normalize_path(raw, *mode);
            let got = got
                .as_ref()
                .map(|n| (&*n.path, n.query))
                .map_err(Clone::clone);
            let want = want.as_ref().map(|(p, q)| (*p, *q)).map_err(Clone::clone);
            if got != want {
                failures.push(format!("{raw:?} {mode}: got {got:?}, want {want:?}"));
            }
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

/// A normalised path normalises to itself, and is never longer than what came in.
#[test]
fn normalising_twice_changes_nothing() {
    for (raw, _) in table() {
        for mode in MODES {
            let Ok(once) = normalize_path(raw, mode) else {
                continue;
            };
            assert!(once.path.len() <= raw.len(), "{raw:?} {mode}");
            let again = normalize_path(&once.path, mode).unwrap();
            assert_eq!(again.path, once.path, "{raw:?} {mode}");
        }
    }
}

/// A path that needs no change is handed back, not copied; one that does is new.
#[test]
fn an_unchanged_path_is_borrowed() {
    for (raw, mode, borrowed) in [
        ("/api/v1/items?x=1", Base, true),
        ("/a//b", Base, true),
        ("/a//b", Merge, false),
        ("/a/../b", PathNormalization::None, true),
        ("/a/../b", Base, false),
        ("/a%2Fb", Base, false),
    ] {
        let n = normalize_path(raw, mode).unwrap();
        assert_eq!(
            matches!(n.path, Cow::Borrowed(_)),
            borrowed,
            "{raw:?} {mode}"
        );
    }
}

#[test]
fn forwarded_target_is_path_then_query() {
    let n = normalize_path("/a/./b%2f?q=%2e%2e&r", Base).unwrap();
    assert_eq!(n.path_and_query(), "/a/b%2F?q=%2e%2e&r");
    assert_eq!(n.to_string(), "/a/b%2F?q=%2e%2e&r");
    let n = normalize_path("/a/./b", Base).unwrap();
    assert_eq!(n.path_and_query(), "/a/b");
}

#[test]
fn the_not_origin_form_error_holds_at_most_32_bytes() {
    let long = format!("{}/", "é".repeat(40));
    let Err(PathError::NotOriginForm { start }) = normalize_path(&long, Base) else {
        panic!("accepted");
    };
    assert_eq!(start, "é".repeat(16));
}

#[test]
fn mesh_config_names() {
    assert_eq!(PathNormalization::default(), Base);
    for (name, mode) in [
        ("NONE", PathNormalization::None),
        ("BASE", Base),
        ("DEFAULT", Base),
        ("MERGE_SLASHES", Merge),
        ("DECODE_AND_MERGE_SLASHES", Decode),
    ] {
        assert_eq!(PathNormalization::from_name(name), Some(mode), "{name}");
    }
    assert_eq!(PathNormalization::from_name("base"), None);
    assert_eq!(Merge.to_string(), "MERGE_SLASHES");
}
