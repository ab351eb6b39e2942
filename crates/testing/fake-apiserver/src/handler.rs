//! The API's request handling without sockets: routing, authorization, and every verb but
//! the streaming part of a watch (which it plans for the server to run).

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::ops::{self, CreateStatus, PatchType, Sub};
use crate::rbac::{self, Attributes, User};
use crate::resource::{self, Resource};
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
}

#[derive(Debug, PartialEq, Eq)]
enum Route {
    Version,
    Health,
    Api,
    Apis,
    Group(String),
    Discovery(String),
    Resource {
        r: Resource,
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
    let (group, rest) = match segs.as_slice() {
        ["api", "v1", rest @ ..] => ("", rest),
        ["apis", g] => return resource::api_group(g).map(|_| Route::Group(g.to_string())),
        ["apis", g, "v1", rest @ ..] => (*g, rest),
        _ => return None,
    };
    resource::resource_list(group)?;
    let res = |plural: &str| Resource::from_plural(group, plural);
    let own = |s: &&str| Some(s.to_string());
    match rest {
        [] => Some(Route::Discovery(group.to_string())),
        ["namespaces", ns, plural, tail @ ..] if res(plural).is_some_and(|r| r.namespaced()) => {
            let r = res(plural)?;
            match tail {
                [] => Some(Route::Resource {
                    r,
                    ns: own(ns),
                    name: None,
                    sub: None,
                }),
                [name] => Some(Route::Resource {
                    r,
                    ns: own(ns),
                    name: own(name),
                    sub: None,
                }),
                [name, sub] => Some(Route::Resource {
                    r,
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
                    ns: None,
                    name: None,
                    sub: None,
                }),
                ([name], false) => Some(Route::Resource {
                    r,
                    ns: None,
                    name: own(name),
                    sub: None,
                }),
                ([name, sub], false) => Some(Route::Resource {
                    r,
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
    let (r, ns, name, sub) = match route {
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
        Route::Discovery(g) => {
            return done(
                resource::resource_list(&g)
                    .map(|v| ok(200, v))
                    .ok_or_else(ApiError::not_found_path),
            )
        }
        Route::Resource { r, ns, name, sub } => (r, ns, name, sub),
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
    let ns = ns.as_deref();
    let name = name.as_deref().unwrap_or_default();
    let as_table =
        table::wants_table(req.accept).then(|| IncludeObject::parse(q.get("includeObject")));
    let write = |res: Result<ops::Outcome, ApiError>, status: u16| match res {
        Ok((obj, events)) => Handled::Done(ok(status, (*obj).clone()), events),
        Err(e) => Handled::Done(e.into(), Vec::new()),
    };
    match verb {
        "list" => done(list(store, r, ns, &q, as_table)),
        "watch" => match plan_watch(r, ns, (!name.is_empty()).then_some(name), &q) {
            Ok(p) => Handled::Watch(WatchPlan { table: as_table, ..p }),
            Err(e) => done(Err(e)),
        },
        "get" => done(
            store
                .get(&key_of(r, ns, name))
                .map(|o| match as_table {
                    Some(include) => {
                        let meta = json!({"resourceVersion": o.pointer("/metadata/resourceVersion").cloned()});
                        ok(200, table::table(r, &[(**o).clone()], meta, include, table::now()))
                    }
                    None => ok(200, (**o).clone()),
                })
                .ok_or_else(|| ApiError::not_found(r, name)),
        ),
        "create" => match decode_body(req.content_type, req.body) {
            Ok(body) => write(ops::create(store, r, ns, body, CreateStatus::Reset), 201),
            Err(e) => done(Err(e)),
        },
        "update" => match decode_body(req.content_type, req.body) {
            Ok(body) => write(ops::update(store, r, ns, name, sub, body), 200),
            Err(e) => done(Err(e)),
        },
        "patch" => match PatchType::from_content_type(req.content_type.unwrap_or_default()) {
            Ok(pt) => write(ops::patch(store, r, ns, name, sub, pt, req.body), 200),
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
            return Ok(ok(200, list_body(r, meta, items, as_table)));
        }
        let mut item = (**o).clone();
        if let Some(m) = item.as_object_mut() {
            m.remove("apiVersion");
            m.remove("kind");
        }
        items.push(item);
        last = Some((k.1.clone(), k.2.clone()));
    }
    Ok(ok(
        200,
        list_body(
            r,
            json!({"resourceVersion": rv.to_string()}),
            items,
            as_table,
        ),
    ))
}

fn list_body(
    r: Resource,
    meta: Value,
    items: Vec<Value>,
    as_table: Option<IncludeObject>,
) -> Value {
    match as_table {
        Some(include) => table::table(r, &items, meta, include, table::now()),
        None => {
            json!({"kind": list_kind(r), "apiVersion": r.api_version(), "metadata": meta, "items": items})
        }
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
        match handle(
            s,
            &Settings {
                rbac,
                server_url: "127.0.0.1:1",
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
                r: Resource::Pods,
                ns: Some("x".into()),
                name: Some("p".into()),
                sub: Some("status".into())
            })
        );
        assert_eq!(
            route("/api/v1/namespaces/x"),
            Some(Route::Resource {
                r: Resource::Namespaces,
                ns: None,
                name: Some("x".into()),
                sub: None
            })
        );
        assert_eq!(
            route("/api/v1/pods"),
            Some(Route::Resource {
                r: Resource::Pods,
                ns: None,
                name: None,
                sub: None
            })
        );
        assert_eq!(
            route("/apis/apps/v1/namespaces/k/daemonsets"),
            Some(Route::Resource {
                r: Resource::DaemonSets,
                ns: Some("k".into()),
                name: None,
                sub: None
            })
        );
        assert_eq!(
            route("/apis/apps/v1"),
            Some(Route::Discovery("apps".into()))
        );
        assert_eq!(route("/apis/apps"), Some(Route::Group("apps".into())));
        assert_eq!(
            route("/api/v1/pods/p"),
            None,
            "a namespaced item needs its namespace"
        );
        assert_eq!(route("/apis/batch/v1/jobs"), None);
        assert_eq!(route("/api/v1/services"), None);
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
            req(
                "GET",
                "/api/v1/namespaces/default/services",
                "",
                b"",
                &admin,
            ),
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
}
