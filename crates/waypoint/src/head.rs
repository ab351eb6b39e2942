//! What the waypoint makes of a request head before anything decides on it (sans-IO,
//! table-tested): one authority, the hop-by-hop headers gone, the one upgrade it may join,
//! and no identity header a client could forge. Authentication, policy, routing, the
//! metrics and the backend then all see the same request.
//!
//! - **Authority.** One value (RFC 9112 §3.2, §3.2.2; RFC 9113 §8.3.1): an absolute-form
//!   target's authority wins over `Host`, which is rewritten to it; an HTTP/2
//!   `:authority` and a `Host` that differ, more than one `Host`, an HTTP/1.1 request
//!   without one or a `Host` that is not `host[:port]` are 400.
//! - **Hop-by-hop.** `Connection`, what it names (never `Host`), `Keep-Alive`,
//!   `Proxy-Connection`, `Transfer-Encoding`, `Upgrade`, `HTTP2-Settings` and `TE` (but
//!   `TE: trailers`, which gRPC needs end to end) are removed here, before the waypoint
//!   adds headers of its own (`x-request-id`, JWT claims, route modifiers), so a client
//!   cannot name those in `Connection` to strip them.
//! - **Upgrades.** HTTP/1.1 only, and only a protocol in `AMBIT_UPGRADE_TYPES`
//!   (`websocket` by default, as Istio configures Envoy). `h2c` is never joined: its
//!   upgrade headers are dropped and the request is served as HTTP/1.1, as Envoy does,
//!   because a joined h2c connection would carry requests that no policy, route or metric
//!   sees. Any other protocol, and a `CONNECT` inside the tunnel, is 403.
//! - **Identity.** A client's `x-forwarded-client-cert` is removed: only the waypoint may
//!   say who the caller is ([`xfcc_value`], when configured to).

use http::header::{HeaderMap, HeaderName, HeaderValue, CONNECTION, HOST, TE, UPGRADE};
use http::{Method, StatusCode, Uri, Version};

/// `x-forwarded-client-cert`: set only by the waypoint (when asked to, with the caller's
/// identity); a client's own is never forwarded.
pub const XFCC: HeaderName = HeaderName::from_static("x-forwarded-client-cert");

/// The `x-forwarded-client-cert` value naming the caller, as Istio's waypoint writes it
/// when its Gateway opts in (`ambient.istio.io/xfcc-include-client-identity`):
/// `By=<the waypoint's identity>;URI=<the caller's>`.
pub fn xfcc_value(
    waypoint: &ambit_identity::SpiffeId,
    caller: &ambit_identity::SpiffeId,
) -> Option<HeaderValue> {
    HeaderValue::from_str(&format!("By={waypoint};URI={caller}")).ok()
}

/// Headers that describe one hop (RFC 9110 §7.6.1, RFC 9113 §8.2.2), never forwarded.
const HOP_BY_HOP: [&str; 6] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "upgrade",
    "http2-settings",
];

/// The protocols an HTTP/1.1 upgrade may switch to (`AMBIT_UPGRADE_TYPES`), lower case.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpgradeTypes(Vec<String>);

impl Default for UpgradeTypes {
    /// `websocket`, the one Istio configures on its proxies.
    fn default() -> Self {
        UpgradeTypes(vec!["websocket".into()])
    }
}

impl UpgradeTypes {
    /// A comma-separated list of protocol tokens; empty allows none. `h2c` is refused:
    /// a joined h2c connection would carry requests no policy sees.
    pub fn parse(list: &str) -> Result<UpgradeTypes, String> {
        let mut types = Vec::new();
        for t in list.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            if !t.bytes().all(is_token_byte) {
                return Err(format!("{t:?} is not a protocol token"));
            }
            let t = t.to_ascii_lowercase();
            if t == "h2c" {
                return Err(
                    "h2c cannot be allowed: the requests of a joined h2c connection \
                            would pass no policy, route or metric"
                        .into(),
                );
            }
            if !types.contains(&t) {
                types.push(t);
            }
        }
        Ok(UpgradeTypes(types))
    }

    /// Whether `protocol` (an `Upgrade` value) may be joined.
    pub fn allows(&self, protocol: &str) -> bool {
        self.0.iter().any(|t| t.eq_ignore_ascii_case(protocol))
    }

    /// The protocols, for the log and `/config_dump`.
    pub fn names(&self) -> &[String] {
        &self.0
    }
}

/// RFC 9110 §5.6.2 `tchar`.
fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// A head ready for the decisions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    /// The request's one authority (`host[:port]`; empty for an HTTP/2 or HTTP/1.0
    /// request that names none).
    pub authority: String,
    /// An allowed HTTP/1.1 upgrade: the protocol as the client named it.
    pub upgrade: Option<HeaderValue>,
}

/// Why a head is answered here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("more than one Host header")]
    TwoHosts,
    #[error("an HTTP/1.1 request without Host")]
    NoHost,
    #[error("Host {0:?} is not host[:port]")]
    BadHost(String),
    #[error("the target's authority {0:?} is not host[:port]")]
    BadAuthority(String),
    #[error("Host {host:?} differs from :authority {authority:?}")]
    HostNotAuthority { host: String, authority: String },
    #[error("an upgrade to {0:?}, which AMBIT_UPGRADE_TYPES does not allow")]
    Upgrade(String),
    #[error("a CONNECT request inside the tunnel")]
    Connect,
}

impl Refused {
    /// 400 for a head HTTP does not allow; 403 for an upgrade this waypoint does not join
    /// (Envoy's answer to an upgrade its route does not allow).
    pub fn status(&self) -> StatusCode {
        match self {
            Refused::Upgrade(_) | Refused::Connect => StatusCode::FORBIDDEN,
            _ => StatusCode::BAD_REQUEST,
        }
    }

    /// The response-code details of the access log.
    pub fn details(&self) -> &'static str {
        match self {
            Refused::Upgrade(_) | Refused::Connect => "upgrade_failed",
            Refused::TwoHosts => "too_many_hosts",
            Refused::NoHost => "missing_host_header",
            _ => "invalid_authority",
        }
    }
}

/// Prepares a request head (see the module docs): the headers are edited in place.
pub fn prepare(
    version: Version,
    method: &Method,
    uri: &Uri,
    headers: &mut HeaderMap,
    upgrades: &UpgradeTypes,
) -> Result<Head, Refused> {
    if method == Method::CONNECT {
        return Err(Refused::Connect);
    }
    let authority = authority(version, uri, headers)?;
    let upgrade = upgrade(version, headers, upgrades)?;
    strip_hop_by_hop(headers);
    headers.remove(XFCC);
    if version == Version::HTTP_2 {
        // `:authority` carries it.
        headers.remove(HOST);
    } else if !authority.is_empty() {
        if let Ok(v) = HeaderValue::from_str(&authority) {
            headers.insert(HOST, v);
        }
    }
    Ok(Head { authority, upgrade })
}

/// The request's one authority.
fn authority(version: Version, uri: &Uri, headers: &HeaderMap) -> Result<String, Refused> {
    let mut hosts = headers.get_all(HOST).iter();
    let host = hosts.next();
    if hosts.next().is_some() {
        return Err(Refused::TwoHosts);
    }
    let host = match host {
        Some(v) => {
            let text = String::from_utf8_lossy(v.as_bytes());
            if !is_host_port(&text) {
                return Err(Refused::BadHost(text.into_owned()));
            }
            Some(text.into_owned())
        }
        None => None,
    };
    match (uri.authority(), host) {
        (Some(target), host) => {
            let target = target.as_str();
            if !is_host_port(target) {
                return Err(Refused::BadAuthority(target.to_string()));
            }
            if version == Version::HTTP_2 {
                if let Some(host) = host.filter(|h| !h.eq_ignore_ascii_case(target)) {
                    return Err(Refused::HostNotAuthority {
                        host,
                        authority: target.to_string(),
                    });
                }
            } else if host.is_none() && version == Version::HTTP_11 {
                // RFC 9112 §3.2: even with an absolute-form target.
                return Err(Refused::NoHost);
            }
            Ok(target.to_string())
        }
        (None, Some(host)) => Ok(host),
        (None, None) if version == Version::HTTP_11 => Err(Refused::NoHost),
        (None, None) => Ok(String::new()),
    }
}

/// `uri-host [":" port]` with no user information: what `Host` may hold.
fn is_host_port(text: &str) -> bool {
    !text.contains('@')
        && text
            .parse::<http::uri::Authority>()
            .is_ok_and(|a| !a.host().is_empty())
}

/// Whether an HTTP/1.1 request asks to switch protocols (`Connection: upgrade` and an
/// `Upgrade` header). Unless it is switched, its connection is closed after the answer: the
/// client may already be speaking the other protocol, which must never be read as HTTP.
pub fn asks_upgrade(version: Version, headers: &HeaderMap) -> bool {
    version == Version::HTTP_11
        && headers.contains_key(UPGRADE)
        && connection_tokens(headers).any(|t| t.eq_ignore_ascii_case("upgrade"))
}

/// The upgrade an HTTP/1.1 request asks for and may have; `h2c` is dropped.
fn upgrade(
    version: Version,
    headers: &HeaderMap,
    upgrades: &UpgradeTypes,
) -> Result<Option<HeaderValue>, Refused> {
    if !asks_upgrade(version, headers) {
        return Ok(None);
    }
    let mut values = headers.get_all(UPGRADE).iter();
    let (Some(value), None) = (values.next(), values.next()) else {
        return Err(Refused::Upgrade("several Upgrade headers".into()));
    };
    let protocol = String::from_utf8_lossy(value.as_bytes()).trim().to_string();
    if protocol.eq_ignore_ascii_case("h2c") {
        return Ok(None);
    }
    if !upgrades.allows(&protocol) {
        return Err(Refused::Upgrade(protocol));
    }
    Ok(HeaderValue::from_str(&protocol).ok())
}

/// The tokens of every `Connection` header.
fn connection_tokens(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|t| !t.is_empty())
}

/// Removes the hop-by-hop headers (see the module docs).
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = connection_tokens(headers)
        .filter_map(|n| HeaderName::from_bytes(n.as_bytes()).ok())
        .filter(|n| *n != HOST)
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
    let trailers_only = {
        let mut te = headers.get_all(TE).iter();
        matches!((te.next(), te.next()), (Some(v), None) if v.as_bytes().eq_ignore_ascii_case(b"trailers"))
    };
    if !trailers_only {
        headers.remove(TE);
    }
}

#[cfg(test)]
mod tests;
