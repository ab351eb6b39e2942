//! The API's request handling without sockets: routing, authorization, and every verb but
//! the streaming part of a watch (which it plans for the server to run).

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use serde_json::{json, Value};

use crate::authn::{self, Tokens};
use crate::error::ApiError;
use crate::ops::{self, CreateStatus, PatchType, Sub};
use crate::rbac::{self, Attributes, User};
use crate::resource::{self, served_as, Resource};
use crate::selector::{FieldSelector, LabelSelector};
use crate::store::{key_of, Event, Store};
use crate::table::{self, IncludeObject};
use crate::watch::WatchFilter;

/// A request, already authenticated.
pub struct Request<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub query: &'a str,
    pub content_type: Option<&'a str>,
    /// The `Accept` header: a Table is served when it asks for one first.
    pub accept: Option<&'a str>,
    pub body: &'a [u8],
    pub user: &'a User,
}

/// A complete response.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub body: Value,
    pub retry_after: Option<u32>,
}

impl From<ApiError> for Response {
    fn from(e: ApiError) -> Response {
        Response {
            status: e.code,
            body: e.to_status(),
            retry_after: e.retry_after,
        }
    }
}

fn ok(status: u16, body: Value) -> Response {
    Response {
        status,
        body,
        retry_after: None,
    }
}

/// Where a watch starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WatchStart {
    /// Synthetic ADDED events for the current objects, then changes.
    Snapshot,
    /// Changes after this resourceVersion.
    After(u64),
}

/// A watch for the server to stream.
#[derive(Debug)]
pub struct WatchPlan {
    pub filter: WatchFilter,
    /// The version asked for: the events' objects show it.
    pub version: &'static str,
    pub start: WatchStart,
    pub bookmarks: bool,
    pub timeout: Option<Duration>,
    /// `sendInitialEvents=true`: a bookmark marks the end of the synthetic ADDED events.
    pub initial_events_end: bool,
    /// Events carry one-row Tables (kubectl's human `--watch`).
    pub table: Option<IncludeObject>,
}

pub enum Handled {
    Done(Response, Vec<Arc<Event>>),
    Watch(WatchPlan),
}

fn done(r: Result<Response, ApiError>) -> Handled {
    match r {
        Ok(r) => Handled::Done(r, Vec::new()),
        Err(e) => Handled::Done(e.into(), Vec::new()),
    }
}

/// Settings the handler needs.
pub struct Settings<'a> {
    pub rbac: bool,
    pub server_url: &'a str,
    /// The bearer tokens, for TokenReviews.
    pub tokens: &'a Tokens,
}

#[derive(Debug, PartialEq, Eq)]
enum Route {
    Version,
    Health,
    Api,
    Apis,
    Group(String),
    Discovery(String, &'static str),
    Resource {
        r: Resource,
        version: &'static str,
        ns: Option<String>,
        name: Option<String>,
        sub: Option<String>,
    },
}

fn route(path: &str) -> Option<Route> {
    let path = path.trim_end_matches('/');
    match path {
        "/version" => return Some(Route::Version),
        "/healthz" | "/readyz" | "/livez" => return Some(Route::Health),
        "/api" => return Some(Route::Api),
        "/apis" => return Some(Route::Apis),
        _ => {}
    }
    let segs: Vec<&str> = path.split('/').skip(1).collect();
    let (group, version, rest) = match segs.as_slice() {
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g] => return resource::api_group(g).map(|_| Route::Group(g.to_string())),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return None,
    };
    let version = resource::served_version(group, version)?;
    let res = |plural: &str| Resource::from_plural(group, plural);
    let own = |s: &&str| Some(s.to_string());
    match rest {
        [] => Some(Route::Discovery(group.to_string(), version)),
        ["namespaces", ns, plural, tail @ ..] if res(plural).is_some_and(|r| r.namespaced()) => {
            let r = res(plural)?;
            match tail {
                [] => Some(Route::Resource {
                    r,
                    version,
                    ns: own(ns),
                    name: None,
                    sub: None,
                }),
                [name] => Some(Route::Resource {
                    r,
                    version,
                    ns: own(ns),
                    name: own(name),
                    sub: None,
                }),
                [name, sub] => Some(Route::Resource {
                    r,
                    version,
                    ns: own(ns),
                    name: own(name),
                    sub: own(sub),
                }),
                _ => None,
            }
        }
        [plural, tail @ ..] => {
            let r = res(plural)?;
            match (tail, r.namespaced()) {
                ([], _) => Some(Route::Resource {
                    r,
                    version,
                    ns: None,
                    name: None,
                    sub: None,
                }),
                ([name], false) => Some(Route::Resource {
                    r,
                    version,
                    ns: None,
                    name: own(name),
                    sub: None,
                }),
                ([name, sub], false) => Some(Route::Resource {
                    r,
                    version,
                    ns: None,
                    name: own(name),
                    sub: own(sub),
                }),
                _ => None,
            }
        }
    }
}

fn unhex(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

/// Percent-decodes a query component (`+` is a space).
fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => match (unhex(b[i + 1]), unhex(b[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h * 16 + l);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

struct Query(Vec<(String, String)>);

impl Query {
    fn parse(q: &str) -> Query {
        Query(
            q.split('&')
                .filter(|p| !p.is_empty())
                .map(|p| match p.split_once('=') {
                    Some((k, v)) => (decode(k), decode(v)),
                    None => (decode(p), String::new()),
                })
                .collect(),
        )
    }

    fn get(&self, k: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.as_str())
    }

    fn flag(&self, k: &str) -> bool {
        matches!(self.get(k), Some("1" | "true" | "True"))
    }
}

fn parse_rv(s: &str) -> Result<u64, ApiError> {
    s.parse()
        .map_err(|_| ApiError::bad_request(format!("invalid resource version {s:?}")))
}

fn decode_body(content_type: Option<&str>, body: &[u8]) -> Result<Value, ApiError> {
    let media = content_type.unwrap_or("application/json");
    if media.starts_with(crate::proto::PROTOBUF) {
        return crate::proto::decode(body);
    }
    if media.contains("yaml") {
        let text = std::str::from_utf8(body)
            .map_err(|_| ApiError::bad_request("the request body is not UTF-8"))?;
        return yaml_serde::from_str(text)
            .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")));
    }
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("error decoding the request body: {e}")))
}

/// Handles one request against `store`.
pub fn handle(store: &mut Store, settings: &Settings, req: &Request) -> Handled {
    let Some(route) = route(req.path) else {
        return done(Err(ApiError::not_found_path()));
    };
    let (r, version, ns, name, sub) = match route {
        Route::Version => return done(Ok(ok(200, resource::version()))),
        Route::Health => return done(Ok(ok(200, json!("ok")))),
        Route::Api => return done(Ok(ok(200, resource::api_versions(settings.server_url)))),
        Route::Apis => return done(Ok(ok(200, resource::api_group_list()))),
        Route::Group(g) => {
            return done(
                resource::api_group(&g)
                    .map(|v| ok(200, v))
                    .ok_or_else(ApiError::not_found_path),
            )
        }
        Route::Discovery(g, v) => {
            return done(
                resource::resource_list(&g, v)
                    .map(|v| ok(200, v))
                    .ok_or_else(ApiError::not_found_path),
            )
        }
        Route::Resource {
            r,
            version,
            ns,
            name,
            sub,
        } => (r, version, ns, name, sub),
    };
    let sub = match sub.as_deref() {
        None => Sub::Main,
        Some("status") if r.has_status() => Sub::Status,
        Some(_) => return done(Err(ApiError::not_found_path())),
    };
    let q = Query::parse(req.query);
    let watch = q.flag("watch");
    let verb = match (req.method, name.is_some()) {
        ("GET", false) if watch => "watch",
        ("GET", false) => "list",
        ("GET", true) if watch => "watch",
        ("GET", true) => "get",
        ("POST", false) => "create",
        ("PUT", true) => "update",
        ("PATCH", true) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        (m, _) => {
            return done(Err(ApiError::method_not_supported(
                r,
                &m.to_ascii_lowercase(),
            )));
        }
    };
    // A namespace's own name is its request namespace, as in Kubernetes' request info.
    let attr_ns = match (&ns, r, &name) {
        (Some(n), _, _) => n.as_str(),
        (None, Resource::Namespaces, Some(n)) => n.as_str(),
        _ => "",
    };
    let sub_name = if sub == Sub::Status { "status" } else { "" };
    let attrs = Attributes {
        verb,
        resource: r,
        subresource: sub_name,
        namespace: attr_ns,
        name: name.as_deref().unwrap_or_default(),
    };
    if settings.rbac && !rbac::allows(store, req.user, &attrs) {
        let why = rbac::forbidden_message(req.user, &attrs);
        return done(Err(ApiError::forbidden(Some(r), attrs.name, &why)));
    }
    if !r.stored() {
        // TokenReviews: the API server routes nothing but a POST of the collection.
        return done(match (name, verb) {
            (Some(_), _) => Err(ApiError::not_found_path()),
            (None, "create") => decode_body(req.content_type, req.body)
                .and_then(|mut body| ops::check_type(r, version, &mut body).map(|()| body))
                .and_then(|body| authn::token_review(settings.tokens, body))
                .map(|answer| ok(201, served_as(r, version, &answer).into_owned())),
            (None, _) => Err(ApiError::method_not_allowed()),
        });
    }
    let ns = ns.as_deref();
    let name = name.as_deref().unwrap_or_default();
    let as_table =
        table::wants_table(req.accept).then(|| IncludeObject::parse(q.get("includeObject")));
    let write = |res: Result<ops::Outcome, ApiError>, status: u16| match res {
        Ok((obj, events)) => {
            Handled::Done(ok(status, served_as(r, version, &obj).into_owned()), events)
        }
        Err(e) => Handled::Done(e.into(), Vec::new()),
    };
    match verb {
        "list" => done(list(store, r, version, ns, &q, as_table)),
        "watch" => match plan_watch(r, version, ns, (!name.is_empty()).then_some(name), &q) {
            Ok(p) => Handled::Watch(WatchPlan { table: as_table, ..p }),
            Err(e) => done(Err(e)),
        },
        "get" => done(
            store
                .get(&key_of(r, ns, name))
                .map(|o| match as_table {
                    Some(include) => {
                        let meta = json!({"resourceVersion": o.pointer("/metadata/resourceVersion").cloned()});
                        ok(200, table::table(r, version, &[(**o).clone()], meta, include, table::now()))
                    }
                    None => ok(200, served_as(r, version, o).into_owned()),
                })
                .ok_or_else(|| ApiError::not_found(r, name)),
        ),
        "create" => match decode_body(req.content_type, req.body) {
            Ok(body) => write(
                ops::create(store, r, version, ns, body, CreateStatus::Reset),
                201,
            ),
            Err(e) => done(Err(e)),
        },
        "update" => match decode_body(req.content_type, req.body) {
            Ok(body) => write(ops::update(store, r, version, ns, name, sub, body), 200),
            Err(e) => done(Err(e)),
        },
        "patch" => match PatchType::from_content_type(req.content_type.unwrap_or_default()) {
            Ok(pt) => write(
                ops::patch(store, r, version, ns, name, sub, pt, req.body),
                200,
            ),
            Err(e) => done(Err(e)),
        },
        "delete" => {
            let options = if req.body.is_empty() {
                None
            } else {
                match decode_body(req.content_type, req.body) {
                    Ok(v) => Some(v),
                    Err(e) => return done(Err(e)),
                }
            };
            match ops::delete(store, r, ns, name, options.as_ref()) {
                // Pods come back as the deleted object, other kinds as a success Status.
                Ok((obj, events)) if r == Resource::Pods => {
                    Handled::Done(ok(200, (*obj).clone()), events)
                }
                Ok((obj, events)) => {
                    let mut details = json!({"name": name, "kind": r.plural()});
                    if !r.group().is_empty() {
                        details["group"] = json!(r.group());
                    }
                    if let Some(uid) = obj.pointer("/metadata/uid") {
                        details["uid"] = uid.clone();
                    }
                    let status = json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
                                        "status": "Success", "details": details});
                    Handled::Done(ok(200, status), events)
                }
                Err(e) => done(Err(e)),
            }
        }
        _ => done(Err(ApiError::method_not_supported(r, verb))),
    }
}

fn selectors(r: Resource, q: &Query) -> Result<(LabelSelector, FieldSelector), ApiError> {
    let labels = LabelSelector::parse(q.get("labelSelector").unwrap_or_default())
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    let fields = FieldSelector::parse(q.get("fieldSelector").unwrap_or_default(), r)
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    Ok((labels, fields))
}

fn plan_watch(
    r: Resource,
    version: &'static str,
    ns: Option<&str>,
    name: Option<&str>,
    q: &Query,
) -> Result<WatchPlan, ApiError> {
    let (labels, mut fields) = selectors(r, q)?;
    if let Some(n) = name {
        let both = match q.get("fieldSelector").filter(|s| !s.is_empty()) {
            Some(f) => format!("{f},metadata.name={n}"),
            None => format!("metadata.name={n}"),
        };
        fields =
            FieldSelector::parse(&both, r).map_err(|e| ApiError::bad_request(e.to_string()))?;
    }
    let start = match q.get("resourceVersion") {
        None | Some("") | Some("0") => WatchStart::Snapshot,
        Some(v) => WatchStart::After(parse_rv(v)?),
    };
    let timeout = match q.get("timeoutSeconds") {
        Some(t) => Some(Duration::from_secs(t.parse().map_err(|_| {
            ApiError::bad_request(format!("invalid timeoutSeconds {t:?}"))
        })?)),
        None => None,
    };
    let initial = q.flag("sendInitialEvents");
    Ok(WatchPlan {
        filter: WatchFilter {
            resource: r,
            namespace: ns.map(str::to_string),
            labels,
            fields,
        },
        version,
        start: if initial { WatchStart::Snapshot } else { start },
        bookmarks: q.flag("allowWatchBookmarks"),
        timeout,
        initial_events_end: initial,
        table: None,
    })
}

fn list_kind(r: Resource) -> String {
    format!("{}List", r.kind())
}

/// A `continue` token: the list's resourceVersion and the last key returned.
fn encode_continue(rv: u64, ns: &str, name: &str) -> String {
    let raw = json!({"rv": rv, "ns": ns, "name": name}).to_string();
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw)
}

fn decode_continue(token: &str) -> Result<(u64, String, String), ApiError> {
    let bad = || {
        ApiError::bad_request("continue key is not valid: the token was not issued by this server")
    };
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .map_err(|_| bad())?;
    let v: Value = serde_json::from_slice(&raw).map_err(|_| bad())?;
    Ok((
        v["rv"].as_u64().ok_or_else(bad)?,
        v["ns"].as_str().ok_or_else(bad)?.to_string(),
        v["name"].as_str().ok_or_else(bad)?.to_string(),
    ))
}

fn list(
    store: &Store,
    r: Resource,
    version: &str,
    ns: Option<&str>,
    q: &Query,
    as_table: Option<IncludeObject>,
) -> Result<Response, ApiError> {
    let (labels, fields) = selectors(r, q)?;
    let limit: usize = match q.get("limit") {
        Some(l) if !l.is_empty() => l
            .parse()
            .map_err(|_| ApiError::bad_request(format!("invalid limit {l:?}")))?,
        _ => 0,
    };
    let (rv, after) = match q.get("continue").filter(|c| !c.is_empty()) {
        Some(token) => {
            let (rv, ns, name) = decode_continue(token)?;
            (rv, Some((ns, name)))
        }
        None => {
            let exact = q.get("resourceVersionMatch") == Some("Exact");
            match q.get("resourceVersion") {
                Some(v) if exact && !v.is_empty() => (parse_rv(v)?, None),
                _ => (store.rv(), None),
            }
        }
    };
    if rv > store.rv() {
        return Err(ApiError {
            code: 504,
            reason: "Timeout",
            message: format!("Too large resource version: {rv}, current: {}", store.rv()),
            details: None,
            retry_after: None,
        });
    }
    let snapshot = store.snapshot_at(r, ns, rv).map_err(|e| {
        if after.is_some() {
            ApiError::continue_expired()
        } else {
            e.into()
        }
    })?;
    let filter = WatchFilter {
        resource: r,
        namespace: ns.map(str::to_string),
        labels,
        fields,
    };
    let mut selected = snapshot
        .iter()
        .filter(|(k, _)| {
            after
                .as_ref()
                .is_none_or(|(ans, an)| (&k.1, &k.2) > (ans, an))
        })
        .filter(|(_, o)| filter.matches(o));
    let mut items = Vec::new();
    let mut last = None;
    for (k, o) in selected.by_ref() {
        if limit > 0 && items.len() == limit {
            // One more exists: count the rest and hand out a token.
            let remaining = 1 + selected.count();
            let (ns, name): &(String, String) =
                last.as_ref().ok_or_else(|| ApiError::internal("paging"))?;
            let mut meta = json!({"resourceVersion": rv.to_string()});
            meta["continue"] = json!(encode_continue(rv, ns, name));
            meta["remainingItemCount"] = json!(remaining);
            return Ok(ok(200, list_body(r, version, meta, items, as_table)));
        }
        // Built-in kinds' items leave their type out; custom resources' (unstructured
        // objects) keep it.
        let mut item = served_as(r, version, o).into_owned();
        if let (false, Some(m)) = (r.is_custom(), item.as_object_mut()) {
            m.remove("apiVersion");
            m.remove("kind");
        }
        items.push(item);
        last = Some((k.1.clone(), k.2.clone()));
    }
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if r.is_custom() {
        // An unstructured list carries the empty token too.
        meta["continue"] = json!("");
    }
    Ok(ok(200, list_body(r, version, meta, items, as_table)))
}

fn list_body(
    r: Resource,
    version: &str,
    meta: Value,
    items: Vec<Value>,
    as_table: Option<IncludeObject>,
) -> Value {
    match as_table {
        Some(include) => table::table(r, version, &items, meta, include, table::now()),
        None => json!({"kind": list_kind(r), "apiVersion": r.api_version_in(version),
                       "metadata": meta, "items": items}),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req<'a>(
        method: &'a str,
        path: &'a str,
        query: &'a str,
        body: &'a [u8],
        user: &'a User,
    ) -> Request<'a> {
        Request {
            method,
            path,
            query,
            content_type: Some("application/json"),
            accept: None,
            body,
            user,
        }
    }

    fn call(s: &mut Store, rbac: bool, r: Request) -> Response {
        call_with(s, rbac, &Tokens::default(), r)
    }

    fn call_with(s: &mut Store, rbac: bool, tokens: &Tokens, r: Request) -> Response {
        match handle(
            s,
            &Settings {
                rbac,
                server_url: "127.0.0.1:1",
                tokens,
            },
            &r,
        ) {
            Handled::Done(resp, _) => resp,
            Handled::Watch(_) => panic!("a watch"),
        }
    }

    fn setup() -> Store {
        let mut s = Store::new(100);
        let admin = User::admin();
        for ns in ["default", "b"] {
            let body = json!({"metadata": {"name": ns}}).to_string();
            assert_eq!(
                call(
                    &mut s,
                    false,
                    req("POST", "/api/v1/namespaces", "", body.as_bytes(), &admin)
                )
                .status,
                201
            );
        }
        for (ns, name, app) in [
            ("default", "a1", "x"),
            ("default", "a2", "y"),
            ("b", "b1", "x"),
            ("default", "a3", "x"),
        ] {
            let body = json!({"metadata": {"name": name, "labels": {"app": app}}, "spec": {"nodeName": "n1"}}).to_string();
            let path = format!("/api/v1/namespaces/{ns}/pods");
            assert_eq!(
                call(
                    &mut s,
                    false,
                    req("POST", &path, "", body.as_bytes(), &admin)
                )
                .status,
                201
            );
        }
        s
    }

    fn names(resp: &Response) -> Vec<String> {
        resp.body["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["metadata"]["name"].as_str().unwrap().to_string())
            .collect()
    }

    #[test]
    fn routes() {
        assert_eq!(
            route("/api/v1/namespaces/x/pods/p/status"),
            Some(Route::Resource {
                version: "v1",
                r: Resource::Pods,
                ns: Some("x".into()),
                name: Some("p".into()),
                sub: Some("status".into())
            })
        );
        assert_eq!(
            route("/api/v1/namespaces/x"),
            Some(Route::Resource {
                version: "v1",
                r: Resource::Namespaces,
                ns: None,
                name: Some("x".into()),
                sub: None
            })
        );
        assert_eq!(
            route("/api/v1/pods"),
            Some(Route::Resource {
                version: "v1",
                r: Resource::Pods,
                ns: None,
                name: None,
                sub: None
            })
        );
        assert_eq!(
            route("/apis/apps/v1/namespaces/k/daemonsets"),
            Some(Route::Resource {
                version: "v1",
                r: Resource::DaemonSets,
                ns: Some("k".into()),
                name: None,
                sub: None
            })
        );
        assert_eq!(
            route("/apis/apps/v1"),
            Some(Route::Discovery("apps".into(), "v1"))
        );
        assert_eq!(route("/apis/apps"), Some(Route::Group("apps".into())));
        assert_eq!(
            route("/api/v1/pods/p"),
            None,
            "a namespaced item needs its namespace"
        );
        assert_eq!(route("/apis/batch/v1/jobs"), None);
        assert_eq!(route("/api/v1/secrets"), None);
        assert_eq!(
            route("/apis/security.istio.io/v1beta1/namespaces/x/authorizationpolicies/p"),
            Some(Route::Resource {
                version: "v1beta1",
                r: Resource::AuthorizationPolicies,
                ns: Some("x".into()),
                name: Some("p".into()),
                sub: None
            })
        );
        assert_eq!(
            route("/apis/security.istio.io/v1beta1"),
            Some(Route::Discovery("security.istio.io".into(), "v1beta1"))
        );
        assert_eq!(route("/apis/security.istio.io/v1alpha1"), None);
        assert_eq!(
            route("/apis/gateway.networking.k8s.io/v1beta1/gateways"),
            None
        );
        assert_eq!(route("/api/v2/pods"), None);
        assert_eq!(
            route("/apis/gateway.networking.k8s.io/v1/gatewayclasses/istio/status"),
            Some(Route::Resource {
                version: "v1",
                r: Resource::GatewayClasses,
                ns: None,
                name: Some("istio".into()),
                sub: Some("status".into())
            })
        );
        assert_eq!(
            route("/apis/authentication.k8s.io/v1/namespaces/x/tokenreviews"),
            None,
            "cluster-scoped"
        );
        assert_eq!(decode("a%3Db+c%2"), "a=b c%2");
    }

    #[test]
    fn lists_select_and_page() {
        let mut s = setup();
        let admin = User::admin();
        let all = call(&mut s, false, req("GET", "/api/v1/pods", "", b"", &admin));
        // Sorted by key (namespace, name), as etcd lists.
        assert_eq!(names(&all), ["b1", "a1", "a2", "a3"]);
        assert_eq!(all.body["kind"], "PodList");
        assert!(all.body["items"][0].get("kind").is_none());
        assert_eq!(all.body["metadata"]["resourceVersion"], s.rv().to_string());
        let sel = call(
            &mut s,
            false,
            req(
                "GET",
                "/api/v1/namespaces/default/pods",
                "labelSelector=app%3Dx&fieldSelector=spec.nodeName%3Dn1",
                b"",
                &admin,
            ),
        );
        assert_eq!(names(&sel), ["a1", "a3"]);
        let bad = call(
            &mut s,
            false,
            req(
                "GET",
                "/api/v1/pods",
                "fieldSelector=spec.foo%3Dx",
                b"",
                &admin,
            ),
        );
        assert_eq!(
            (bad.status, bad.body["message"].as_str().unwrap()),
            (400, "field label not supported: spec.foo")
        );
        // Paging: a consistent snapshot across pages even when objects change between them.
        let p1 = call(
            &mut s,
            false,
            req("GET", "/api/v1/pods", "limit=2", b"", &admin),
        );
        assert_eq!(names(&p1), ["b1", "a1"]);
        assert_eq!(p1.body["metadata"]["remainingItemCount"], 2);
        let token = p1.body["metadata"]["continue"]
            .as_str()
            .unwrap()
            .to_string();
        call(
            &mut s,
            false,
            req(
                "DELETE",
                "/api/v1/namespaces/default/pods/a2",
                "",
                b"",
                &admin,
            ),
        );
        let p2 = call(
            &mut s,
            false,
            req(
                "GET",
                "/api/v1/pods",
                &format!("limit=2&continue={token}"),
                b"",
                &admin,
            ),
        );
        assert_eq!(names(&p2), ["a2", "a3"]);
        assert!(p2.body["metadata"].get("continue").is_none());
        assert_eq!(
            p2.body["metadata"]["resourceVersion"],
            p1.body["metadata"]["resourceVersion"]
        );
        s.compact();
        let gone = call(
            &mut s,
            false,
            req(
                "GET",
                "/api/v1/pods",
                &format!("limit=2&continue={token}"),
                b"",
                &admin,
            ),
        );
        assert_eq!(gone.status, 410);
        let exact = call(
            &mut s,
            false,
            req(
                "GET",
                "/api/v1/pods",
                "resourceVersion=3&resourceVersionMatch=Exact",
                b"",
                &admin,
            ),
        );
        assert_eq!(
            (exact.status, exact.body["reason"].as_str().unwrap()),
            (410, "Expired")
        );
        let any = call(
            &mut s,
            false,
            req("GET", "/api/v1/pods", "resourceVersion=3", b"", &admin),
        );
        assert_eq!(any.status, 200);
    }

    #[test]
    fn rbac_denies_with_kubernetes_messages() {
        let mut s = setup();
        let sa = User::service_account("istio-system", "istio-cni");
        let r = call(
            &mut s,
            true,
            req(
                "PATCH",
                "/api/v1/namespaces/default/pods/a1/status",
                "",
                b"{}",
                &sa,
            ),
        );
        assert_eq!(r.status, 403);
        assert_eq!(r.body["message"], "pods \"a1\" is forbidden: User \"system:serviceaccount:istio-system:istio-cni\" cannot patch resource \"pods/status\" in API group \"\" in the namespace \"default\"");
        let r = call(&mut s, true, req("GET", "/api/v1/nodes", "", b"", &sa));
        assert_eq!(r.body["message"], "nodes is forbidden: User \"system:serviceaccount:istio-system:istio-cni\" cannot list resource \"nodes\" in API group \"\" at the cluster scope");
        let r = call(
            &mut s,
            true,
            req("GET", "/api/v1/namespaces/b", "", b"", &sa),
        );
        assert!(r.body["message"].as_str().unwrap().ends_with(
            "cannot get resource \"namespaces\" in API group \"\" in the namespace \"b\""
        ));
        assert_eq!(
            call(&mut s, true, req("GET", "/api/v1", "", b"", &sa)).status,
            200,
            "discovery is open"
        );
    }

    #[test]
    fn verbs_and_errors() {
        let mut s = setup();
        let admin = User::admin();
        let r = call(
            &mut s,
            false,
            req("GET", "/api/v1/namespaces/default/pods/zz", "", b"", &admin),
        );
        assert_eq!(r.body["message"], "pods \"zz\" not found");
        let r = call(
            &mut s,
            false,
            req("GET", "/api/v1/namespaces/default/secrets", "", b"", &admin),
        );
        assert_eq!(
            (r.status, r.body["kind"].as_str().unwrap()),
            (404, "Status")
        );
        let mut r = req(
            "PATCH",
            "/api/v1/namespaces/default/pods/a1",
            "",
            b"{}",
            &admin,
        );
        r.content_type = Some("application/apply-patch+yaml");
        assert_eq!(call(&mut s, false, r).status, 415);
        let r = call(
            &mut s,
            false,
            req("DELETE", "/api/v1/nodes", "", b"", &admin),
        );
        assert_eq!(r.status, 405);
        let r = call(
            &mut s,
            false,
            req(
                "DELETE",
                "/api/v1/namespaces/default/pods/a1",
                "",
                b"",
                &admin,
            ),
        );
        assert_eq!(r.body["kind"], "Pod");
        let r = call(
            &mut s,
            false,
            req("DELETE", "/api/v1/namespaces/b", "", b"", &admin),
        );
        assert_eq!(r.body["status"], "Success");
        let plan = handle(
            &mut s,
            &Settings {
                rbac: false,
                server_url: "",
                tokens: &Tokens::default(),
            },
            &req(
                "GET",
                "/api/v1/pods",
                "watch=1&resourceVersion=5&allowWatchBookmarks=true&timeoutSeconds=3",
                b"",
                &admin,
            ),
        );
        match plan {
            Handled::Watch(p) => {
                assert_eq!(p.start, WatchStart::After(5));
                assert!(p.bookmarks);
                assert_eq!(p.timeout, Some(Duration::from_secs(3)));
            }
            Handled::Done(r, _) => panic!("{r:?}"),
        }
    }

    fn status_of(r: &Response) -> (u16, &str) {
        (r.status, r.body["message"].as_str().unwrap_or_default())
    }

    const APS: &str = "/apis/security.istio.io/v1/namespaces/default/authorizationpolicies";
    const APS_BETA: &str =
        "/apis/security.istio.io/v1beta1/namespaces/default/authorizationpolicies";

    #[test]
    fn custom_resources_read_through_either_version() {
        let mut s = setup();
        let admin = User::admin();
        let body = json!({"apiVersion": "security.istio.io/v1beta1", "kind": "AuthorizationPolicy",
                          "metadata": {"name": "deny"}, "spec": {"action": "DENY"}})
        .to_string();
        let created = call(
            &mut s,
            false,
            req("POST", APS_BETA, "", body.as_bytes(), &admin),
        );
        assert_eq!(created.status, 201, "{:?}", created.body);
        assert_eq!(created.body["apiVersion"], "security.istio.io/v1beta1");
        // The same body through the other version is refused, as kube-apiserver words it.
        let refused = call(&mut s, false, req("POST", APS, "", body.as_bytes(), &admin));
        assert_eq!(status_of(&refused), (400, "the API version in the data (security.istio.io/v1beta1) does not match the expected API version (security.istio.io/v1)"));
        assert_eq!(refused.body["reason"], "BadRequest");
        for (base, version) in [(APS, "v1"), (APS_BETA, "v1beta1")] {
            let api_version = format!("security.istio.io/{version}");
            let got = call(
                &mut s,
                false,
                req("GET", &format!("{base}/deny"), "", b"", &admin),
            );
            assert_eq!(got.body["apiVersion"], api_version);
            assert_eq!(got.body["spec"]["action"], "DENY");
            let list = call(&mut s, false, req("GET", base, "", b"", &admin));
            assert_eq!(list.body["apiVersion"], api_version);
            assert_eq!(list.body["kind"], "AuthorizationPolicyList");
            // Unstructured lists keep their items' type, and the empty continue token.
            assert_eq!(list.body["items"][0]["apiVersion"], api_version);
            assert_eq!(list.body["items"][0]["kind"], "AuthorizationPolicy");
            assert_eq!(list.body["metadata"]["continue"], "");
            let sel = call(
                &mut s,
                false,
                req(
                    "GET",
                    "/apis/security.istio.io/v1beta1/authorizationpolicies",
                    "fieldSelector=metadata.namespace%3Ddefault,metadata.name%3Ddeny",
                    b"",
                    &admin,
                ),
            );
            assert_eq!(names(&sel), ["deny"]);
            let plan = handle(
                &mut s,
                &Settings {
                    rbac: false,
                    server_url: "",
                    tokens: &Tokens::default(),
                },
                &req("GET", base, "watch=1", b"", &admin),
            );
            match plan {
                Handled::Watch(p) => assert_eq!(p.version, version),
                Handled::Done(r, _) => panic!("{r:?}"),
            }
        }
        let none = call(
            &mut s,
            false,
            req(
                "GET",
                APS_BETA,
                "fieldSelector=metadata.name%3Dother",
                b"",
                &admin,
            ),
        );
        assert!(names(&none).is_empty());
        // Writes answer in the version they were sent to.
        let patched = call(
            &mut s,
            false,
            Request {
                content_type: Some("application/merge-patch+json"),
                ..req(
                    "PATCH",
                    &format!("{APS_BETA}/deny/status"),
                    "",
                    br#"{"status":{"x":"y"}}"#,
                    &admin,
                )
            },
        );
        assert_eq!(patched.body["apiVersion"], "security.istio.io/v1beta1");
        assert_eq!(patched.body["status"]["x"], "y");
        let mut table = req("GET", APS_BETA, "", b"", &admin);
        table.accept = Some("application/json;as=Table;v=v1;g=meta.k8s.io");
        let t = call(
            &mut s,
            false,
            Request {
                query: "includeObject=Object",
                ..table
            },
        );
        assert_eq!(
            t.body["rows"][0]["object"]["apiVersion"],
            "security.istio.io/v1beta1"
        );
        assert_eq!(t.body["rows"][0]["cells"][0], "deny");
        let gone = call(
            &mut s,
            false,
            req("DELETE", &format!("{APS}/deny"), "", b"", &admin),
        );
        assert_eq!(
            gone.body["details"],
            json!({"name": "deny", "group": "security.istio.io",
            "kind": "authorizationpolicies", "uid": created.body["metadata"]["uid"]})
        );
        let missing = call(
            &mut s,
            false,
            req("GET", &format!("{APS_BETA}/deny"), "", b"", &admin),
        );
        assert_eq!(
            status_of(&missing),
            (
                404,
                "authorizationpolicies.security.istio.io \"deny\" not found"
            )
        );
    }

    #[test]
    fn token_reviews_are_answered_never_stored() {
        let mut s = setup();
        let mut tokens = Tokens::default();
        tokens.insert(
            "pod-token",
            User::service_account("default", "app"),
            &["istio-ca"],
        );
        let reviewer = User::service_account("istio-system", "istiod");
        let path = "/apis/authentication.k8s.io/v1/tokenreviews";
        let body = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                          "spec": {"token": "pod-token", "audiences": ["istio-ca"]}})
        .to_string();
        let denied = call_with(
            &mut s,
            true,
            &tokens,
            req("POST", path, "", body.as_bytes(), &reviewer),
        );
        assert_eq!(status_of(&denied), (403, "tokenreviews.authentication.k8s.io is forbidden: User \"system:serviceaccount:istio-system:istiod\" cannot create resource \"tokenreviews\" in API group \"authentication.k8s.io\" at the cluster scope"));
        // istiod's grant: create tokenreviews (the auth-delegator role's rule).
        for (kind, obj) in [
            (
                "clusterroles",
                json!({"metadata": {"name": "delegator"}, "rules": [
                {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]}]}),
            ),
            (
                "clusterrolebindings",
                json!({"metadata": {"name": "delegator"},
                "roleRef": {"kind": "ClusterRole", "name": "delegator"},
                "subjects": [{"kind": "ServiceAccount", "name": "istiod", "namespace": "istio-system"}]}),
            ),
        ] {
            let path = format!("/apis/rbac.authorization.k8s.io/v1/{kind}");
            let r = call(
                &mut s,
                false,
                req(
                    "POST",
                    &path,
                    "",
                    obj.to_string().as_bytes(),
                    &User::admin(),
                ),
            );
            assert_eq!(r.status, 201, "{:?}", r.body);
        }
        let rv = s.rv();
        let answer = call_with(
            &mut s,
            true,
            &tokens,
            req("POST", path, "", body.as_bytes(), &reviewer),
        );
        assert_eq!(answer.status, 201, "{:?}", answer.body);
        assert_eq!(answer.body["kind"], "TokenReview");
        assert_eq!(answer.body["status"]["authenticated"], true);
        assert_eq!(
            answer.body["status"]["user"]["username"],
            "system:serviceaccount:default:app"
        );
        assert_eq!(answer.body["status"]["audiences"], json!(["istio-ca"]));
        assert_eq!(s.rv(), rv, "nothing stored");
        // Only creation is routed; the other verbs are refused by the router (after RBAC).
        let list = call_with(&mut s, true, &tokens, req("GET", path, "", b"", &reviewer));
        assert_eq!(status_of(&list), (403, "tokenreviews.authentication.k8s.io is forbidden: User \"system:serviceaccount:istio-system:istiod\" cannot list resource \"tokenreviews\" in API group \"authentication.k8s.io\" at the cluster scope"));
        let admin = User::admin();
        let list = call_with(&mut s, true, &tokens, req("GET", path, "", b"", &admin));
        assert_eq!(list.body, ApiError::method_not_allowed().to_status());
        assert_eq!(
            status_of(&list),
            (
                405,
                "the server does not allow this method on the requested resource"
            )
        );
        let del = call_with(&mut s, false, &tokens, req("DELETE", path, "", b"", &admin));
        assert_eq!(del.status, 405);
        let named = call_with(
            &mut s,
            false,
            &tokens,
            req("GET", &format!("{path}/x"), "", b"", &admin),
        );
        assert_eq!(
            status_of(&named),
            (404, "the server could not find the requested resource")
        );
        let wrong = body.replace("authentication.k8s.io/v1", "authentication.k8s.io/v1beta1");
        let r = call_with(
            &mut s,
            false,
            &tokens,
            req("POST", path, "", wrong.as_bytes(), &admin),
        );
        assert_eq!(status_of(&r), (400, "the API version in the data (authentication.k8s.io/v1beta1) does not match the expected API version (authentication.k8s.io/v1)"));
    }
}
