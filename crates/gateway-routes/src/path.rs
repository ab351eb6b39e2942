//! Path prefixes as the Gateway API defines them: whole `/`-separated segments, a trailing
//! `/` of the prefix ignored (`/foo` and `/foo/` both match `/foo`, `/foo/` and
//! `/foo/bar`, never `/foobar`), and `ReplacePrefixMatch`, which replaces the matched
//! segments of a path.

/// A prefix as held: without its trailing `/`, except `/` itself.
pub fn normalize_prefix(prefix: &str) -> &str {
    match prefix.trim_end_matches('/') {
        "" => "/",
        p => p,
    }
}

/// True if `path` starts with the whole segments of `prefix` (held as
/// [`normalize_prefix`] gives it).
pub fn prefix_matches(prefix: &str, path: &str) -> bool {
    if prefix == "/" {
        return path.starts_with('/');
    }
    match path.strip_prefix(prefix) {
        Some(rest) => rest.is_empty() || rest.starts_with('/'),
        None => false,
    }
}

/// The path after `ReplacePrefixMatch`: the segments `prefix` matched in `path` replaced by
/// `replacement`, as the specification's table gives it (`/foo/bar` with prefix `/foo` and
/// replacement `/xyz` is `/xyz/bar`; an empty replacement or `/` leaves `/bar`; `/foo/`
/// keeps its trailing `/`: `/xyz/`). `None` when `prefix` does not match `path`.
pub fn replace_prefix(prefix: &str, replacement: &str, path: &str) -> Option<String> {
    let prefix = normalize_prefix(prefix);
    if !prefix_matches(prefix, path) {
        return None;
    }
    let rest = if prefix == "/" {
        path
    } else {
        &path[prefix.len()..]
    };
    let replacement = replacement.trim_end_matches('/');
    let mut out = String::with_capacity(replacement.len() + rest.len() + 1);
    out.push_str(replacement);
    out.push_str(rest);
    if out.is_empty() {
        out.push('/');
    } else if !out.starts_with('/') {
        out.insert(0, '/');
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_match_whole_segments() {
        let table = [
            ("/foo", "/foo", true),
            ("/foo", "/foo/", true),
            ("/foo", "/foo/bar", true),
            ("/foo", "/foobar", false),
            ("/foo", "/fo", false),
            ("/foo", "/", false),
            ("/foo/bar", "/foo/bar/baz", true),
            ("/foo/bar", "/foo/barbaz", false),
            ("/", "/", true),
            ("/", "/anything/at/all", true),
        ];
        for (prefix, path, want) in table {
            assert_eq!(prefix_matches(prefix, path), want, "{prefix} ~ {path}");
        }
        // A prefix written with a trailing slash means the same segments.
        assert_eq!(normalize_prefix("/abc/"), "/abc");
        assert_eq!(normalize_prefix("/"), "/");
        for path in ["/abc", "/abc/", "/abc/def"] {
            assert!(prefix_matches(normalize_prefix("/abc/"), path), "{path}");
        }
        assert!(!prefix_matches(normalize_prefix("/abc/"), "/abcd"));
    }

    /// The table of `ReplacePrefixMatch` in the specification (HTTPPathModifier), row by row.
    #[test]
    fn replace_prefix_as_the_specification_table() {
        let table = [
            ("/foo/bar", "/foo", "/xyz", "/xyz/bar"),
            ("/foo/bar", "/foo", "/xyz/", "/xyz/bar"),
            ("/foo/bar", "/foo/", "/xyz", "/xyz/bar"),
            ("/foo/bar", "/foo/", "/xyz/", "/xyz/bar"),
            ("/foo", "/foo", "/xyz", "/xyz"),
            ("/foo/", "/foo", "/xyz", "/xyz/"),
            ("/foo/bar", "/foo", "", "/bar"),
            ("/foo/", "/foo", "", "/"),
            ("/foo", "/foo", "", "/"),
            ("/foo/", "/foo", "/", "/"),
            ("/foo", "/foo", "/", "/"),
        ];
        for (path, prefix, replacement, want) in table {
            assert_eq!(
                replace_prefix(prefix, replacement, path).as_deref(),
                Some(want),
                "{path} with {prefix} -> {replacement:?}"
            );
        }
        // The root prefix keeps the whole path under the replacement.
        assert_eq!(
            replace_prefix("/", "/v2", "/a/b").as_deref(),
            Some("/v2/a/b")
        );
        assert_eq!(replace_prefix("/foo", "/xyz", "/foobar"), None);
    }
}
