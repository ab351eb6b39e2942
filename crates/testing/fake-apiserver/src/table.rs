//! Server-side printing: the `meta.k8s.io/v1` Table kubectl asks for (`Accept:
//! application/json;as=Table;...`) when it prints for humans, with the columns Kubernetes
//! prints for each kind (pods' and events' wide columns too; other built-in kinds'
//! wide-only columns are left out). Custom resources get the columns kube-apiserver gives
//! a CustomResourceDefinition that declares none: Name and Age. Sans IO.

use serde_json::{json, Value};

use crate::resource::{served_as, Resource};

/// What a Table row carries besides its cells (`includeObject`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IncludeObject {
    None,
    Metadata,
    Object,
}

impl IncludeObject {
    pub fn parse(q: Option<&str>) -> IncludeObject {
        match q {
            Some("None") => IncludeObject::None,
            Some("Object") => IncludeObject::Object,
            _ => IncludeObject::Metadata,
        }
    }
}

/// Whether an `Accept` header asks for a Table first.
pub fn wants_table(accept: Option<&str>) -> bool {
    accept
        .and_then(|a| a.split(',').next())
        .is_some_and(|first| first.replace(' ', "").contains(";as=Table"))
}

/// Kubernetes' short human durations (`45s`, `3m20s`, `5h`, `2d3h`, `1y20d`).
pub fn human_duration(secs: i64) -> String {
    if secs < -1 {
        return "<invalid>".into();
    }
    let s = secs.max(0);
    if s < 120 {
        return format!("{s}s");
    }
    let (m, h) = (s / 60, s / 3600);
    let both = |a: i64, ua: &str, b: i64, ub: &str| {
        if b == 0 {
            format!("{a}{ua}")
        } else {
            format!("{a}{ua}{b}{ub}")
        }
    };
    match () {
        _ if m < 10 => both(m, "m", s % 60, "s"),
        _ if m < 180 => format!("{m}m"),
        _ if h < 8 => both(h, "h", m % 60, "m"),
        _ if h < 48 => format!("{h}h"),
        _ if h < 24 * 8 => both(h / 24, "d", h % 24, "h"),
        _ if h < 24 * 365 * 2 => format!("{}d", h / 24),
        _ if h < 24 * 365 * 8 => both(h / 24 / 365, "y", (h / 24) % 365, "d"),
        _ => format!("{}y", h / 24 / 365),
    }
}

/// Seconds since the epoch of a `2026-01-02T03:04:05Z` timestamp.
fn parse_timestamp(s: &str) -> Option<i64> {
    let n = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let (y, mo, d, h, mi, se) = (
        n(0..4)?,
        n(5..7)?,
        n(8..10)?,
        n(11..13)?,
        n(14..16)?,
        n(17..19)?,
    );
    let month = time::Month::try_from(u8::try_from(mo).ok()?).ok()?;
    let date = time::Date::from_calendar_date(i32::try_from(y).ok()?, month, u8::try_from(d).ok()?)
        .ok()?;
    let t = time::Time::from_hms(
        u8::try_from(h).ok()?,
        u8::try_from(mi).ok()?,
        u8::try_from(se).ok()?,
    )
    .ok()?;
    Some(
        time::PrimitiveDateTime::new(date, t)
            .assume_utc()
            .unix_timestamp(),
    )
}

fn age(obj: &Value, now: i64) -> String {
    match obj
        .pointer("/metadata/creationTimestamp")
        .and_then(Value::as_str)
        .and_then(parse_timestamp)
    {
        Some(t) => human_duration(now - t),
        None => "<unknown>".into(),
    }
}

fn s<'a>(obj: &'a Value, pointer: &str) -> &'a str {
    obj.pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_default()
}

fn int(obj: &Value, pointer: &str) -> i64 {
    obj.pointer(pointer).and_then(Value::as_i64).unwrap_or(0)
}

/// A column definition: name, type, format, priority (1: only with `-o wide`).
struct Col(&'static str, &'static str, &'static str, u8);

const NAME: Col = Col("Name", "string", "name", 0);

fn col(name: &'static str) -> Col {
    Col(name, "string", "", 0)
}

fn int_col(name: &'static str) -> Col {
    Col(name, "integer", "", 0)
}

fn wide(name: &'static str) -> Col {
    Col(name, "string", "", 1)
}

fn columns(r: Resource) -> Vec<Col> {
    match r {
        Resource::Pods => vec![
            NAME,
            col("Ready"),
            col("Status"),
            int_col("Restarts"),
            col("Age"),
            wide("IP"),
            wide("Node"),
            wide("Nominated Node"),
            wide("Readiness Gates"),
        ],
        Resource::Namespaces => vec![NAME, col("Status"), col("Age")],
        Resource::Nodes => vec![
            NAME,
            col("Status"),
            col("Roles"),
            col("Age"),
            col("Version"),
        ],
        Resource::ConfigMaps => vec![NAME, col("Data"), col("Age")],
        Resource::Services => vec![
            NAME,
            col("Type"),
            col("Cluster-IP"),
            col("External-IP"),
            col("Port(s)"),
            col("Age"),
            wide("Selector"),
        ],
        Resource::Events => vec![
            col("Last Seen"),
            col("Type"),
            col("Reason"),
            col("Object"),
            wide("Subobject"),
            wide("Source"),
            col("Message"),
            wide("First Seen"),
            wide("Count"),
            Col("Name", "string", "name", 1),
        ],
        Resource::DaemonSets => vec![
            NAME,
            int_col("Desired"),
            int_col("Current"),
            int_col("Ready"),
            int_col("Up-to-date"),
            int_col("Available"),
            col("Node Selector"),
            col("Age"),
        ],
        // The default printer.
        Resource::ClusterRoles | Resource::Roles | Resource::TokenReviews => {
            vec![NAME, Col("Created At", "string", "date-time", 0)]
        }
        Resource::ClusterRoleBindings | Resource::RoleBindings => {
            vec![NAME, col("Role"), col("Age")]
        }
        Resource::AuthorizationPolicies
        | Resource::RequestAuthentications
        | Resource::DestinationRules
        | Resource::GatewayClasses
        | Resource::Gateways
        | Resource::HttpRoutes
        | Resource::GrpcRoutes => vec![NAME, Col("Age", "date", "", 0)],
    }
}

/// `translateTimestampSince`: a timestamp's age, `<unknown>` when unset.
fn since(obj: &Value, pointer: &str, now: i64) -> Option<String> {
    let t = obj.pointer(pointer).and_then(Value::as_str)?;
    Some(match parse_timestamp(t) {
        Some(t) => human_duration(now - t),
        None => "<unknown>".into(),
    })
}

/// An event's row, as kubectl's event printer fills it.
fn event_cells(obj: &Value, now: i64) -> Vec<Value> {
    let unknown = || "<unknown>".to_string();
    let first = since(obj, "/firstTimestamp", now)
        .or_else(|| since(obj, "/eventTime", now))
        .unwrap_or_else(unknown);
    let mut last = since(obj, "/lastTimestamp", now).unwrap_or_else(|| first.clone());
    let mut count = int(obj, "/count");
    if obj.get("series").is_some_and(|v| !v.is_null()) {
        last = since(obj, "/series/lastObservedTime", now).unwrap_or_else(unknown);
        count = int(obj, "/series/count");
    } else if count == 0 {
        count = 1;
    }
    let kind = s(obj, "/involvedObject/kind").to_ascii_lowercase();
    let target = match s(obj, "/involvedObject/name") {
        "" => kind,
        n => format!("{kind}/{n}"),
    };
    let first_non_empty = |a: &'static str, b: &'static str| {
        let v = s(obj, a);
        if v.is_empty() {
            s(obj, b)
        } else {
            v
        }
    };
    let component = first_non_empty("/source/component", "/reportingComponent");
    let instance = first_non_empty("/source/host", "/reportingInstance");
    let source = if instance.is_empty() {
        component.to_string()
    } else {
        format!("{component}, {instance}")
    };
    vec![
        json!(last),
        json!(s(obj, "/type")),
        json!(s(obj, "/reason")),
        json!(target),
        json!(s(obj, "/involvedObject/fieldPath")),
        json!(source),
        json!(s(obj, "/message").trim()),
        json!(first),
        json!(count),
        json!(s(obj, "/metadata/name")),
    ]
}

/// A Service's row as kubectl prints it: `80/TCP,443/TCP`, `<none>` where empty.
fn service_cells(obj: &Value, now: i64) -> Vec<Value> {
    let ports: Vec<String> = obj
        .pointer("/spec/ports")
        .and_then(Value::as_array)
        .map(|ports| {
            ports
                .iter()
                .map(|p| {
                    format!(
                        "{}/{}",
                        p["port"].as_u64().unwrap_or(0),
                        p["protocol"].as_str().unwrap_or("TCP")
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let selector: Vec<String> = obj
        .pointer("/spec/selector")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                .collect()
        })
        .unwrap_or_default();
    let none_if_empty = |v: String| {
        if v.is_empty() {
            "<none>".to_string()
        } else {
            v
        }
    };
    vec![
        json!(s(obj, "/metadata/name")),
        json!(match s(obj, "/spec/type") {
            "" => "ClusterIP",
            kind => kind,
        }),
        json!(none_if_empty(s(obj, "/spec/clusterIP").to_string())),
        json!("<none>"),
        json!(none_if_empty(ports.join(","))),
        json!(age(obj, now)),
        json!(none_if_empty(selector.join(","))),
    ]
}

fn cells(r: Resource, obj: &Value, now: i64) -> Vec<Value> {
    let name = json!(s(obj, "/metadata/name"));
    match r {
        Resource::Pods => {
            let statuses = obj
                .pointer("/status/containerStatuses")
                .and_then(Value::as_array);
            let total = obj
                .pointer("/spec/containers")
                .and_then(Value::as_array)
                .map_or(0, Vec::len);
            let ready = statuses.map_or(0, |c| c.iter().filter(|c| c["ready"] == true).count());
            let restarts: i64 = statuses.map_or(0, |c| {
                c.iter()
                    .map(|c| c["restartCount"].as_i64().unwrap_or(0))
                    .sum()
            });
            let status = if obj.pointer("/metadata/deletionTimestamp").is_some() {
                "Terminating"
            } else if !s(obj, "/status/reason").is_empty() {
                s(obj, "/status/reason")
            } else {
                s(obj, "/status/phase")
            };
            let or_none = |v: &str| json!(if v.is_empty() { "<none>" } else { v });
            let gates = obj
                .pointer("/spec/readinessGates")
                .and_then(Value::as_array)
                .filter(|g| !g.is_empty())
                .map(|g| format!("0/{}", g.len()))
                .unwrap_or_default();
            vec![
                name,
                json!(format!("{ready}/{total}")),
                json!(status),
                json!(restarts),
                json!(age(obj, now)),
                or_none(s(obj, "/status/podIP")),
                or_none(s(obj, "/spec/nodeName")),
                or_none(s(obj, "/status/nominatedNodeName")),
                or_none(&gates),
            ]
        }
        Resource::Namespaces => vec![name, json!(s(obj, "/status/phase")), json!(age(obj, now))],
        Resource::ConfigMaps => {
            let len = |f: &str| obj.get(f).and_then(Value::as_object).map_or(0, |m| m.len());
            vec![
                name,
                json!(len("data") + len("binaryData")),
                json!(age(obj, now)),
            ]
        }
        Resource::Events => event_cells(obj, now),
        Resource::Services => service_cells(obj, now),
        Resource::Nodes => {
            let ready = obj
                .pointer("/status/conditions")
                .and_then(Value::as_array)
                .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
                .map(|c| {
                    if c["status"] == "True" {
                        "Ready"
                    } else {
                        "NotReady"
                    }
                })
                .unwrap_or("Unknown");
            let mut roles: Vec<&str> = obj
                .pointer("/metadata/labels")
                .and_then(Value::as_object)
                .map(|l| {
                    l.keys()
                        .filter_map(|k| k.strip_prefix("node-role.kubernetes.io/"))
                        .collect()
                })
                .unwrap_or_default();
            roles.sort_unstable();
            let roles = if roles.is_empty() {
                "<none>".to_string()
            } else {
                roles.join(",")
            };
            vec![
                name,
                json!(ready),
                json!(roles),
                json!(age(obj, now)),
                json!(s(obj, "/status/nodeInfo/kubeletVersion")),
            ]
        }
        Resource::DaemonSets => {
            let selector = obj
                .pointer("/spec/template/spec/nodeSelector")
                .and_then(Value::as_object)
                .filter(|m| !m.is_empty())
                .map(|m| {
                    m.iter()
                        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                        .collect::<Vec<_>>()
                        .join(",")
                })
                .unwrap_or_else(|| "<none>".into());
            vec![
                name,
                json!(int(obj, "/status/desiredNumberScheduled")),
                json!(int(obj, "/status/currentNumberScheduled")),
                json!(int(obj, "/status/numberReady")),
                json!(int(obj, "/status/updatedNumberScheduled")),
                json!(int(obj, "/status/numberAvailable")),
                json!(selector),
                json!(age(obj, now)),
            ]
        }
        Resource::ClusterRoles | Resource::Roles | Resource::TokenReviews => {
            vec![name, json!(s(obj, "/metadata/creationTimestamp"))]
        }
        Resource::ClusterRoleBindings | Resource::RoleBindings => vec![
            name,
            json!(format!(
                "{}/{}",
                s(obj, "/roleRef/kind"),
                s(obj, "/roleRef/name")
            )),
            json!(age(obj, now)),
        ],
        Resource::AuthorizationPolicies
        | Resource::RequestAuthentications
        | Resource::DestinationRules
        | Resource::GatewayClasses
        | Resource::Gateways
        | Resource::HttpRoutes
        | Resource::GrpcRoutes => vec![name, json!(age(obj, now))],
    }
}

fn row(r: Resource, version: &str, obj: &Value, include: IncludeObject, now: i64) -> Value {
    let mut row = json!({"cells": cells(r, obj, now)});
    match include {
        IncludeObject::None => {}
        IncludeObject::Metadata => {
            row["object"] = json!({
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": obj.get("metadata").cloned().unwrap_or_else(|| json!({})),
            })
        }
        IncludeObject::Object => {
            let mut o = obj.clone();
            o["kind"] = json!(r.kind());
            o["apiVersion"] = json!(r.api_version());
            row["object"] = served_as(r, version, &o).into_owned();
        }
    }
    row
}

/// A Table of `objects` (as read through `version`) with the list's `metadata`
/// (resourceVersion, continue).
pub fn table(
    r: Resource,
    version: &str,
    objects: &[Value],
    list_meta: Value,
    include: IncludeObject,
    now: i64,
) -> Value {
    let defs: Vec<Value> = columns(r)
        .into_iter()
        .map(|Col(name, kind, format, priority)| {
            json!({"name": name, "type": kind, "format": format, "description": "", "priority": priority})
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": list_meta,
        "columnDefinitions": defs,
        "rows": objects.iter().map(|o| row(r, version, o, include, now)).collect::<Vec<_>>(),
    })
}

/// Seconds since the epoch now.
pub fn now() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_durations() {
        for (secs, want) in [
            (-5, "<invalid>"),
            (-1, "0s"),
            (5, "5s"),
            (119, "119s"),
            (120, "2m"),
            (200, "3m20s"),
            (600, "10m"),
            (3 * 3600 + 60, "3h1m"),
            (9 * 3600, "9h"),
            (50 * 3600, "2d2h"),
            (30 * 86400, "30d"),
            (3 * 365 * 86400 + 86400, "3y1d"),
            (9 * 365 * 86400, "9y"),
        ] {
            assert_eq!(human_duration(secs), want, "{secs}");
        }
    }

    #[test]
    fn pod_rows_and_accept_headers() {
        let pod = json!({"metadata": {"name": "a", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"containers": [{"name": "c"}, {"name": "d"}]},
            "status": {"phase": "Running", "containerStatuses": [{"ready": true, "restartCount": 2}, {"ready": false, "restartCount": 1}]}});
        let now = parse_timestamp("2026-01-01T00:00:30Z").unwrap();
        let t = table(
            Resource::Pods,
            "v1",
            &[pod],
            json!({"resourceVersion": "3"}),
            IncludeObject::Metadata,
            now,
        );
        assert_eq!(
            t["rows"][0]["cells"],
            json!(["a", "1/2", "Running", 3, "30s", "<none>", "<none>", "<none>", "<none>"])
        );
        assert_eq!(t["columnDefinitions"][4]["priority"], 0);
        assert_eq!(t["columnDefinitions"][5]["priority"], 1);
        assert_eq!(t["rows"][0]["object"]["kind"], "PartialObjectMetadata");
        assert_eq!(t["columnDefinitions"][0]["name"], "Name");
        assert!(wants_table(Some(
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
        )));
        assert!(!wants_table(Some("application/json")));
        assert!(!wants_table(None));
    }

    #[test]
    fn service_rows_as_kubectl_prints_them() {
        let now = parse_timestamp("2026-01-01T00:01:00Z").unwrap();
        let svc = json!({"metadata": {"name": "web", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"clusterIP": "10.96.0.7", "selector": {"app": "web"},
                     "ports": [{"port": 80, "protocol": "TCP"}, {"port": 53, "protocol": "UDP"}]}});
        let t = table(
            Resource::Services,
            "v1",
            &[svc],
            json!({}),
            IncludeObject::None,
            now,
        );
        assert_eq!(
            t["rows"][0]["cells"],
            json!([
                "web",
                "ClusterIP",
                "10.96.0.7",
                "<none>",
                "80/TCP,53/UDP",
                "60s",
                "app=web"
            ])
        );
        let bare = json!({"metadata": {"name": "x", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"type": "NodePort"}});
        let t = table(
            Resource::Services,
            "v1",
            &[bare],
            json!({}),
            IncludeObject::None,
            now,
        );
        assert_eq!(
            t["rows"][0]["cells"],
            json!(["x", "NodePort", "<none>", "<none>", "<none>", "60s", "<none>"])
        );
    }

    #[test]
    fn config_map_event_and_custom_resource_rows() {
        let now = parse_timestamp("2026-01-01T00:10:00Z").unwrap();
        let created = json!({"name": "x", "creationTimestamp": "2026-01-01T00:00:00Z"});
        let cm =
            json!({"metadata": created, "data": {"a": "1", "b": "2"}, "binaryData": {"c": ""}});
        let t = table(
            Resource::ConfigMaps,
            "v1",
            &[cm],
            json!({}),
            IncludeObject::None,
            now,
        );
        let names: Vec<&Value> = t["columnDefinitions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| &c["name"])
            .collect();
        assert_eq!(names, ["Name", "Data", "Age"]);
        assert_eq!(t["rows"][0]["cells"], json!(["x", 3, "10m"]));
        let gw = json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway", "metadata": created});
        let t = table(
            Resource::Gateways,
            "v1",
            &[gw],
            json!({}),
            IncludeObject::None,
            now,
        );
        assert_eq!(
            t["columnDefinitions"],
            json!([{"name": "Name", "type": "string", "format": "name", "description": "", "priority": 0},
                   {"name": "Age", "type": "date", "format": "", "description": "", "priority": 0}])
        );
        assert_eq!(t["rows"][0]["cells"], json!(["x", "10m"]));
        let ev = json!({"metadata": {"name": "web.1", "namespace": "default"},
            "involvedObject": {"kind": "Pod", "name": "web", "fieldPath": "spec.containers{app}"},
            "reason": "Pulled", "type": "Normal", "message": "pulled  ", "count": 3,
            "source": {"component": "kubelet", "host": "n1"},
            "firstTimestamp": "2026-01-01T00:00:00Z", "lastTimestamp": "2026-01-01T00:09:00Z"});
        let t = table(
            Resource::Events,
            "v1",
            &[ev],
            json!({}),
            IncludeObject::None,
            now,
        );
        assert_eq!(
            t["rows"][0]["cells"],
            json!([
                "60s",
                "Normal",
                "Pulled",
                "pod/web",
                "spec.containers{app}",
                "kubelet, n1",
                "pulled",
                "10m",
                3,
                "web.1"
            ])
        );
        let priorities: Vec<&Value> = t["columnDefinitions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| &c["priority"])
            .collect();
        assert_eq!(priorities, [0, 0, 0, 0, 1, 1, 0, 1, 1, 1]);
        // A new-style event: eventTime, the reporting controller, a series.
        let ev = json!({"metadata": {"name": "e"}, "involvedObject": {"kind": "Node"},
            "eventTime": "2026-01-01T00:05:00.000000Z", "reportingComponent": "ambit",
            "series": {"count": 7, "lastObservedTime": "2026-01-01T00:09:30.000000Z"}});
        let t = table(
            Resource::Events,
            "v1",
            &[ev],
            json!({}),
            IncludeObject::None,
            now,
        );
        assert_eq!(
            t["rows"][0]["cells"],
            json!(["30s", "", "", "node", "", "ambit", "", "5m", 7, "e"])
        );
        let bare = json!({"metadata": {"name": "b"}});
        let t = table(
            Resource::Events,
            "v1",
            &[bare],
            json!({}),
            IncludeObject::None,
            now,
        );
        assert_eq!(t["rows"][0]["cells"][0], "<unknown>");
        assert_eq!(t["rows"][0]["cells"][8], 1, "a singleton event counts 1");
    }
}
