//! The Gateway API's `CORS` filter (HTTPRoute, `gateway.networking.k8s.io` v1.2 and
//! later): which origins may call, what a preflight is answered, and what an answer to an
//! allowed origin carries. As Envoy's CORS filter does it for Istio: a preflight from an
//! allowed origin is answered 200 by the proxy, never forwarded; one from another origin,
//! and any request from it, go on untouched (the browser enforces the missing headers).
//! Sans-IO.

use http::header::{HeaderMap, HeaderName, HeaderValue};

/// A `CORS` filter, checked.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Cors {
    pub allow_origins: Vec<OriginPattern>,
    pub allow_credentials: bool,
    /// Upper-case methods, or `*`.
    pub allow_methods: Vec<String>,
    /// Lower-case header names, or `*`.
    pub allow_headers: Vec<String>,
    pub expose_headers: Vec<String>,
    /// `Access-Control-Max-Age` in seconds (the specification's default: 5).
    pub max_age: u32,
}

/// The specification's default `maxAge`.
pub const DEFAULT_MAX_AGE: u32 = 5;

/// An `allowOrigins` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OriginPattern {
    /// `*`: any origin.
    Any,
    /// `scheme://host[:port]`, the host's first label possibly `*` (any labels).
    Origin {
        scheme: String,
        /// Without a leading `*.`: `example.com` for `https://*.example.com`.
        host: String,
        wildcard: bool,
        port: Option<u16>,
    },
}

impl OriginPattern {
    /// Reads an `allowOrigins` entry; the error says why it is not one.
    pub fn parse(s: &str) -> Result<OriginPattern, String> {
        if s == "*" {
            return Ok(OriginPattern::Any);
        }
        let (scheme, rest) = s
            .split_once("://")
            .ok_or_else(|| format!("{s:?} is not an origin (scheme://host[:port], or *)"))?;
        if scheme.is_empty()
            || !scheme
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b))
        {
            return Err(format!("{s:?}: {scheme:?} is not a scheme"));
        }
        let (host, port) = match rest.rsplit_once(':') {
            Some((h, p)) if !h.ends_with(']') || h.starts_with('[') => {
                let port = p
                    .parse::<u16>()
                    .ok()
                    .filter(|p| *p > 0)
                    .ok_or_else(|| format!("{s:?}: {p:?} is not a port"))?;
                (h, Some(port))
            }
            _ => (rest, None),
        };
        let (wildcard, host) = match host.strip_prefix("*.") {
            Some(h) => (true, h),
            None => (false, host),
        };
        let label_ok =
            |l: &str| !l.is_empty() && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
        if host.is_empty() || !host.split('.').all(label_ok) {
            return Err(format!("{s:?}: {host:?} is not a host (path, query and * elsewhere than the first label are not allowed)"));
        }
        Ok(OriginPattern::Origin {
            scheme: scheme.to_ascii_lowercase(),
            host: host.to_ascii_lowercase(),
            wildcard,
            port,
        })
    }

    fn matches(&self, origin: &str) -> bool {
        match self {
            OriginPattern::Any => true,
            OriginPattern::Origin {
                scheme,
                host,
                wildcard,
                port,
            } => {
                let Some((s, rest)) = origin.split_once("://") else {
                    return false;
                };
                if !s.eq_ignore_ascii_case(scheme) {
                    return false;
                }
                let (h, p) = match rest.rsplit_once(':') {
                    Some((h, p)) => match p.parse::<u16>() {
                        Ok(p) => (h, Some(p)),
                        Err(_) => return false,
                    },
                    None => (rest, None),
                };
                // A port left out is the scheme's default.
                let default_port = match scheme.as_str() {
                    "http" => Some(80),
                    "https" => Some(443),
                    _ => None,
                };
                if p.or(default_port) != port.or(default_port) {
                    return false;
                }
                let h = h.to_ascii_lowercase();
                if *wildcard {
                    h.strip_suffix(host.as_str())
                        .is_some_and(|head| head.len() > 1 && head.ends_with('.'))
                } else {
                    h == *host
                }
            }
        }
    }
}

/// What the filter does with a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CorsAction {
    /// Not a cross-origin request this filter allows: nothing changes.
    None,
    /// A preflight from an allowed origin: answered 200 with these headers.
    Preflight(Vec<(HeaderName, HeaderValue)>),
    /// A request from an allowed origin: forwarded, its answer given these headers.
    Annotate(Vec<(HeaderName, HeaderValue)>),
}

fn value(s: &str) -> Option<HeaderValue> {
    HeaderValue::from_str(s).ok()
}

impl Cors {
    /// True when `origin` may call.
    pub fn allows(&self, origin: &str) -> bool {
        self.allow_origins.iter().any(|p| p.matches(origin))
    }

    /// What to do with a request of `method` and `headers`.
    pub fn action(&self, method: &str, headers: &HeaderMap) -> CorsAction {
        let Some(origin) = headers
            .get(http::header::ORIGIN)
            .and_then(|v| v.to_str().ok())
        else {
            return CorsAction::None;
        };
        if !self.allows(origin) {
            return CorsAction::None;
        }
        let any_origin = self.allow_origins.contains(&OriginPattern::Any);
        // With credentials the origin is named, never `*` (browsers refuse that).
        let allow_origin = if any_origin && !self.allow_credentials {
            HeaderValue::from_static("*")
        } else {
            match value(origin) {
                Some(v) => v,
                None => return CorsAction::None,
            }
        };
        let mut out = vec![(http::header::ACCESS_CONTROL_ALLOW_ORIGIN, allow_origin)];
        if self.allow_credentials {
            out.push((
                http::header::ACCESS_CONTROL_ALLOW_CREDENTIALS,
                HeaderValue::from_static("true"),
            ));
        }
        let requested_method = headers.get(http::header::ACCESS_CONTROL_REQUEST_METHOD);
        if method == "OPTIONS" {
            if let Some(requested) = requested_method {
                let methods = self.list(&self.allow_methods, Some(requested));
                let requested_headers = headers.get(http::header::ACCESS_CONTROL_REQUEST_HEADERS);
                let allowed_headers = self.list(&self.allow_headers, requested_headers);
                for (name, v) in [
                    (http::header::ACCESS_CONTROL_ALLOW_METHODS, methods),
                    (http::header::ACCESS_CONTROL_ALLOW_HEADERS, allowed_headers),
                ] {
                    if let Some(v) = v {
                        out.push((name, v));
                    }
                }
                out.push((
                    http::header::ACCESS_CONTROL_MAX_AGE,
                    HeaderValue::from(self.max_age),
                ));
                return CorsAction::Preflight(out);
            }
        }
        if let Some(v) = (!self.expose_headers.is_empty())
            .then(|| value(&self.expose_headers.join(", ")))
            .flatten()
        {
            out.push((http::header::ACCESS_CONTROL_EXPOSE_HEADERS, v));
        }
        CorsAction::Annotate(out)
    }

    /// A list header's value: the list, or, for `*` with credentials (where a browser
    /// takes `*` literally), what the preflight asked for.
    fn list(&self, list: &[String], requested: Option<&HeaderValue>) -> Option<HeaderValue> {
        if list.is_empty() {
            return None;
        }
        if list.iter().any(|m| m == "*") {
            return match (self.allow_credentials, requested) {
                (false, _) => Some(HeaderValue::from_static("*")),
                (true, Some(r)) => Some(r.clone()),
                (true, None) => None,
            };
        }
        value(&list.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cors(origins: &[&str], credentials: bool) -> Cors {
        Cors {
            allow_origins: origins
                .iter()
                .map(|o| OriginPattern::parse(o).unwrap())
                .collect(),
            allow_credentials: credentials,
            allow_methods: vec!["GET".into(), "PUT".into()],
            allow_headers: vec!["x-user".into()],
            expose_headers: vec!["x-trace".into(), "x-cost".into()],
            max_age: 600,
        }
    }

    #[test]
    fn origins() {
        let c = cors(
            &[
                "https://app.example.com",
                "https://*.shop.example",
                "http://localhost:8080",
            ],
            false,
        );
        let table = [
            ("https://app.example.com", true),
            ("https://app.example.com:443", true),
            ("HTTPS://APP.EXAMPLE.COM", true),
            ("http://app.example.com", false),
            ("https://app.example.com:8443", false),
            ("https://a.shop.example", true),
            ("https://a.b.shop.example", true),
            ("https://shop.example", false),
            ("https://evilshop.example", false),
            ("http://localhost:8080", true),
            ("http://localhost", false),
            ("null", false),
            ("https://app.example.com.evil.io", false),
        ];
        for (origin, allowed) in table {
            assert_eq!(c.allows(origin), allowed, "{origin}");
        }
        assert!(cors(&["*"], false).allows("https://anything.io"));
        for bad in [
            "app.example.com",
            "https://",
            "https://a/b",
            "https://a:0",
            "https://a.*.b",
            "ht tp://a",
        ] {
            assert!(OriginPattern::parse(bad).is_err(), "{bad}");
        }
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    fn shown(a: &CorsAction) -> (String, Vec<String>) {
        let (kind, list) = match a {
            CorsAction::None => return ("none".into(), vec![]),
            CorsAction::Preflight(l) => ("preflight", l),
            CorsAction::Annotate(l) => ("annotate", l),
        };
        (
            kind.into(),
            list.iter()
                .map(|(k, v)| format!("{k}: {}", v.to_str().unwrap()))
                .collect(),
        )
    }

    #[test]
    fn preflights_and_answers() {
        let c = cors(&["https://app.example.com"], true);
        let pre = headers(&[
            ("origin", "https://app.example.com"),
            ("access-control-request-method", "PUT"),
            ("access-control-request-headers", "x-user"),
        ]);
        assert_eq!(
            shown(&c.action("OPTIONS", &pre)),
            (
                "preflight".into(),
                vec![
                    "access-control-allow-origin: https://app.example.com".into(),
                    "access-control-allow-credentials: true".into(),
                    "access-control-allow-methods: GET, PUT".into(),
                    "access-control-allow-headers: x-user".into(),
                    "access-control-max-age: 600".into(),
                ]
            )
        );
        // An actual request: the origin and the exposed headers.
        let get = headers(&[("origin", "https://app.example.com")]);
        assert_eq!(
            shown(&c.action("GET", &get)),
            (
                "annotate".into(),
                vec![
                    "access-control-allow-origin: https://app.example.com".into(),
                    "access-control-allow-credentials: true".into(),
                    "access-control-expose-headers: x-trace, x-cost".into(),
                ]
            )
        );
        // Another origin, no origin, an OPTIONS that is no preflight: untouched.
        let other = headers(&[
            ("origin", "https://evil.io"),
            ("access-control-request-method", "PUT"),
        ]);
        assert_eq!(c.action("OPTIONS", &other), CorsAction::None);
        assert_eq!(c.action("GET", &HeaderMap::new()), CorsAction::None);
        assert_eq!(
            shown(&c.action("OPTIONS", &get)).0,
            "annotate",
            "an OPTIONS without Access-Control-Request-Method is a request"
        );
        // `*` everywhere without credentials: `*`; with credentials: what was asked.
        let mut any = cors(&["*"], false);
        any.allow_methods = vec!["*".into()];
        any.allow_headers = vec!["*".into()];
        any.expose_headers = vec![];
        assert_eq!(
            shown(&any.action("OPTIONS", &pre)).1,
            [
                "access-control-allow-origin: *",
                "access-control-allow-methods: *",
                "access-control-allow-headers: *",
                "access-control-max-age: 600"
            ]
        );
        any.allow_credentials = true;
        assert_eq!(
            shown(&any.action("OPTIONS", &pre)).1,
            [
                "access-control-allow-origin: https://app.example.com",
                "access-control-allow-credentials: true",
                "access-control-allow-methods: PUT",
                "access-control-allow-headers: x-user",
                "access-control-max-age: 600"
            ]
        );
    }
}
