//! What a chosen rule's filters do to a request or a response, as the Gateway API
//! specification defines them: header modifiers (`set` replaces every value, `add`
//! appends to the values there, joined with a comma as Istio's waypoint does, `remove`
//! deletes), the path a redirect or rewrite makes (`ReplaceFullPath`,
//! `ReplacePrefixMatch`), and a redirect's `Location` (scheme, host, port and path each
//! kept from the request unless the filter says otherwise; the port left out when it is
//! the scheme's well-known one).

use http::{HeaderMap, HeaderValue};

use crate::model::{HeaderModifier, PathModifier, Redirect};
use crate::path::replace_prefix;

/// Applies `m` to `headers`. A value that is not a valid header value was refused when
/// the route was read, so none is skipped here in practice; one that were would be left
/// out rather than sent malformed.
pub fn apply_headers(m: &HeaderModifier, headers: &mut HeaderMap) {
    for (name, value) in &m.set {
        if let Ok(v) = HeaderValue::from_str(value) {
            headers.insert(name.clone(), v);
        }
    }
    for (name, value) in &m.add {
        // Joined as bytes: a value there that is not text is kept, not dropped.
        let mut joined: Vec<u8> = Vec::new();
        for v in headers.get_all(name) {
            joined.extend_from_slice(v.as_bytes());
            joined.push(b',');
        }
        joined.extend_from_slice(value.as_bytes());
        if let Ok(v) = HeaderValue::from_bytes(&joined) {
            headers.insert(name.clone(), v);
        }
    }
    for name in &m.remove {
        headers.remove(name);
    }
}

/// The path `modifier` makes of `path`. `matched_prefix` is the prefix of the match that
/// chose the rule (required for [`PathModifier::Prefix`]; the route reader refuses a
/// prefix replacement on a rule without exactly one prefix match). `None` when the prefix
/// does not apply to `path`.
pub fn modified_path(
    modifier: &PathModifier,
    matched_prefix: Option<&str>,
    path: &str,
) -> Option<String> {
    match modifier {
        PathModifier::Full(p) => Some(p.clone()),
        PathModifier::Prefix(replacement) => replace_prefix(matched_prefix?, replacement, path),
    }
}

/// The request as a redirect reads it.
#[derive(Debug, Clone, Copy)]
pub struct RedirectSource<'a> {
    /// `http` inside the mesh.
    pub scheme: &'a str,
    /// The request's host (`Host` or `:authority`), without a port.
    pub host: &'a str,
    /// The port the client dialled (the Service port: a mesh route's listener port).
    pub port: u16,
    pub path: &'a str,
    /// The query, without its `?`.
    pub query: Option<&'a str>,
}

/// The `Location` of redirect `r` for a request. `None` when its prefix replacement does
/// not apply to the path (a 500: the rule was chosen by a match it cannot rewrite).
pub fn redirect_location(
    r: &Redirect,
    matched_prefix: Option<&str>,
    req: RedirectSource<'_>,
) -> Option<String> {
    let scheme = r.scheme.as_deref().unwrap_or(req.scheme);
    let host = r.hostname.as_deref().unwrap_or(req.host);
    // The specification: a scheme written without a port takes the scheme's well-known
    // port; neither written keeps the listener's.
    let port = match (r.port, r.scheme.as_deref()) {
        (Some(p), _) => p,
        (None, Some("http")) => 80,
        (None, Some("https")) => 443,
        (None, _) => req.port,
    };
    let path = match &r.path {
        Some(m) => modified_path(m, matched_prefix, req.path)?,
        None => req.path.to_string(),
    };
    let well_known = matches!((scheme, port), ("http", 80) | ("https", 443));
    let authority = match well_known {
        true => host.to_string(),
        false => format!("{host}:{port}"),
    };
    let query = req.query.map_or_else(String::new, |q| format!("?{q}"));
    Some(format!("{scheme}://{authority}{path}{query}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header::HeaderName;

    fn name(s: &str) -> HeaderName {
        HeaderName::from_bytes(s.as_bytes()).unwrap()
    }

    #[test]
    fn header_modifiers() {
        let mut h = HeaderMap::new();
        h.insert("x-set", HeaderValue::from_static("old"));
        h.append("x-add", HeaderValue::from_static("a"));
        h.append("x-add", HeaderValue::from_static("b"));
        h.insert("x-gone", HeaderValue::from_static("1"));
        h.insert("x-kept", HeaderValue::from_static("k"));
        h.insert("x-opaque", HeaderValue::from_bytes(b"caf\xe9").unwrap());
        let m = HeaderModifier {
            set: vec![(name("x-set"), "new".into()), (name("x-fresh"), "f".into())],
            add: vec![
                (name("x-add"), "c".into()),
                (name("x-new"), "n".into()),
                (name("x-opaque"), "d".into()),
            ],
            remove: vec![name("x-gone"), name("x-absent")],
        };
        apply_headers(&m, &mut h);
        let all =
            |n: &str| -> Vec<&str> { h.get_all(n).iter().map(|v| v.to_str().unwrap()).collect() };
        assert_eq!(all("x-set"), ["new"]);
        assert_eq!(all("x-fresh"), ["f"]);
        assert_eq!(all("x-add"), ["a,b,c"]);
        assert_eq!(all("x-new"), ["n"]);
        assert!(all("x-gone").is_empty());
        assert_eq!(all("x-kept"), ["k"]);
        let opaque: Vec<&[u8]> = h.get_all("x-opaque").iter().map(|v| v.as_bytes()).collect();
        assert_eq!(opaque, [b"caf\xe9,d".as_slice()]);
    }

    fn redirect(scheme: Option<&str>, host: Option<&str>, port: Option<u16>) -> Redirect {
        Redirect {
            scheme: scheme.map(str::to_string),
            hostname: host.map(str::to_string),
            path: None,
            port,
            status: 302,
        }
    }

    #[test]
    fn redirect_locations() {
        let req = |port| RedirectSource {
            scheme: "http",
            host: "reviews.shop.svc.cluster.local",
            port,
            path: "/api/v1/books",
            query: Some("page=2"),
        };
        let h = "reviews.shop.svc.cluster.local";
        let cases: &[(Redirect, u16, String)] = &[
            // Nothing changed but the status: the request's own URL, port 80 left out.
            (
                redirect(None, None, None),
                80,
                format!("http://{h}/api/v1/books?page=2"),
            ),
            // The listener port kept when it is not the scheme's.
            (
                redirect(None, None, None),
                9080,
                format!("http://{h}:9080/api/v1/books?page=2"),
            ),
            // A scheme without a port takes its well-known port, left out.
            (
                redirect(Some("https"), None, None),
                9080,
                format!("https://{h}/api/v1/books?page=2"),
            ),
            (
                redirect(Some("https"), None, Some(8443)),
                80,
                format!("https://{h}:8443/api/v1/books?page=2"),
            ),
            // Port 443 under http is not well known for it: written.
            (
                redirect(None, None, Some(443)),
                80,
                format!("http://{h}:443/api/v1/books?page=2"),
            ),
            (
                redirect(None, Some("example.com"), None),
                80,
                "http://example.com/api/v1/books?page=2".into(),
            ),
        ];
        for (r, port, want) in cases {
            assert_eq!(
                redirect_location(r, None, req(*port)).as_deref(),
                Some(want.as_str()),
                "{r:?} at port {port}"
            );
        }
    }

    #[test]
    fn redirect_and_rewrite_paths() {
        let req = RedirectSource {
            scheme: "http",
            host: "h",
            port: 80,
            path: "/api/v1/books",
            query: None,
        };
        let with = |path| Redirect {
            path: Some(path),
            ..redirect(None, None, None)
        };
        assert_eq!(
            redirect_location(&with(PathModifier::Full("/moved".into())), None, req).as_deref(),
            Some("http://h/moved")
        );
        assert_eq!(
            redirect_location(
                &with(PathModifier::Prefix("/v2".into())),
                Some("/api/v1"),
                req
            )
            .as_deref(),
            Some("http://h/v2/books")
        );
        // A prefix replacement needs the prefix that matched.
        assert_eq!(
            redirect_location(&with(PathModifier::Prefix("/v2".into())), None, req),
            None
        );
        assert_eq!(
            modified_path(&PathModifier::Prefix("/".into()), Some("/api"), "/api/x").as_deref(),
            Some("/x")
        );
    }
}
