//! The `request_authz` target: what a waypoint does with a request's outside bytes before
//! it forwards them: the request target through `ambit_state::normalize_path` (under each
//! MeshConfig mode), then the request (method, host, headers, path) through
//! `ambit_state::authorize_request` against a small set of policies that use every kind of
//! L7 attribute.

use std::cell::Cell;
use std::net::IpAddr;
use std::sync::OnceLock;

use ambit_identity::SpiffeId;
use ambit_state::{
    authorize_observed, authorize_request, normalize_path, parse_local_config, Allowed,
    Authorization, PathNormalization, PolicyAction, RbacContext, RequestAttributes, RequestAuth,
};
use http::{HeaderMap, HeaderName, HeaderValue};

/// The policies (all in `default`, all Global); byte 1 of the input picks which apply.
const POLICIES: &str = r#"
policies:
- name: deny-admin
  namespace: default
  scope: Global
  action: Deny
  rules: [[[{paths: ["/admin/{**}", "*/secret"]}]], [[{hosts: ["admin.*"]}]]]
- name: deny-header
  namespace: default
  scope: Global
  action: Deny
  rules: [[[{when: [{key: "request.headers[x-block]", values: ["*"]}]}]]]
- name: allow-reads
  namespace: default
  scope: Global
  action: Allow
  rules:
  - [[{methods: [GET, HEAD], paths: ["/api/{*}/items", "/public*"]}], [{hosts: ["*.example.com", "example.com"]}]]
- name: allow-admins
  namespace: default
  scope: Global
  action: Allow
  rules: [[[{requestPrincipals: ["*"], when: [{key: "request.auth.claims[groups]", values: [admin]}]}]]]
- name: dry-allow
  namespace: default
  scope: Global
  action: Allow
  dryRun: true
  rules: [[[{notPaths: ["/api/*"]}]]]
- name: deny-prod-outside
  namespace: default
  scope: Global
  action: Deny
  rules: [[[{notRemoteIps: ["10.0.0.0/8", "fd00::/8"], headers: {x-env: "prod*"}}]]]
- name: allow-mesh
  namespace: default
  scope: Global
  action: Allow
  rules:
  - [[{namespaces: [{exact: default}], when: [{key: "experimental.envoy.filters.a.b[c]", values: [x]}]}]]
  - - - notMethods: [DELETE]
        when:
        - {key: source.serviceAccount, values: ["default/*"]}
        - {key: destination.port, notValues: ["9090"]}
        - {key: connection.sni, notValues: ["*.internal"]}
    - - principals: [{suffix: /sa/client}]
- name: dry-deny
  namespace: default
  scope: Global
  action: Deny
  dryRun: true
  rules: [[[{methods: [DELETE]}, {headers: {":authority": "*:8080"}}]]]
"#;

fn policies() -> &'static [Authorization] {
    static P: OnceLock<Vec<Authorization>> = OnceLock::new();
    P.get_or_init(|| {
        parse_local_config("fuzz", POLICIES)
            .unwrap_or_else(|e| panic!("the target's policies: {e}"))
            .policies
    })
}

/// What the request came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The normalised path, or the refusal's variant (the waypoint answers 400).
    pub path: Result<String, String>,
    /// The verdict: allowed, or Envoy's response code details.
    pub verdict: Result<(), String>,
}

/// Input: byte 0: bits 0-1 the normalisation (NONE, BASE, MERGE_SLASHES,
/// DECODE_AND_MERGE_SLASHES), bit 2 a peer identity (`default/client`), bit 3 a JWT, bit 4
/// its `groups` claim holds `admin`, bit 5 an SNI (`api.internal`), bits 6-7 the remote
/// address (the peer's, 192.168.1.7, an IPv4-mapped 10.1.2.3, fd00::9); byte 1: which of the
/// eight policies apply (bit i: policy i); the rest: text (invalid UTF-8 replaced), lines
/// split on `\n`: the request target, the method, the host, then `name: value` headers
/// (those `http` refuses are skipped).
///
/// Checks: a normalised path starts with `/`, is no longer than the target's path, has no
/// `\`, no lower-case escape, no `.`/`..` segment (and, when merging, no `//`), and
/// normalises to itself; the query is the target's, untouched. The verdict names a DENY rule
/// that exists, or an ALLOW policy that applies; dry-run policies never change it; the node
/// proxy's L4 evaluation of the same policies never allows what this denies (it fails
/// closed on what it cannot see).
pub fn run(data: &[u8]) -> Outcome {
    let (flags, mask, text) = match data {
        [f, m, rest @ ..] => (*f, *m, String::from_utf8_lossy(rest)),
        [f] => (*f, 0xff, Default::default()),
        [] => (0, 0xff, Default::default()),
    };
    let mode = [
        PathNormalization::None,
        PathNormalization::Base,
        PathNormalization::MergeSlashes,
        PathNormalization::DecodeAndMergeSlashes,
    ][usize::from(flags & 3)];
    let mut lines = text.split('\n');
    let target = lines.next().unwrap_or_default();
    let method = lines.next().unwrap_or_default();
    let host = lines.next().unwrap_or_default();
    let mut headers = HeaderMap::new();
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(name.trim().as_bytes()),
            HeaderValue::from_bytes(value.trim().as_bytes()),
        ) {
            headers.append(n, v);
        }
    }

    let normalized = normalize_path(target, mode);
    let path = match &normalized {
        Ok(n) => {
            check_normalized(target, mode, &n.path, n.query);
            Ok(n.path.to_string())
        }
        Err(e) => {
            let _ = e.to_string();
            Err(crate::variant(e))
        }
    };
    // A refused target is answered 400 before authorization; the evaluator is still fed
    // its raw path, which it must take without panicking.
    let (eval_path, query) = match &normalized {
        Ok(n) => (&*n.path, n.query),
        Err(_) => match target.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (target, None),
        },
    };

    let identity = (flags & 4 != 0)
        .then(|| SpiffeId::parse("spiffe://cluster.local/ns/default/sa/client").ok())
        .flatten();
    let source_ip: IpAddr = [10, 0, 0, 2].into();
    let remote_ip: IpAddr = match flags >> 6 {
        0 => source_ip,
        1 => [192, 168, 1, 7].into(),
        2 => "::ffff:10.1.2.3".parse().unwrap_or(source_ip),
        _ => "fd00::9".parse().unwrap_or(source_ip),
    };
    let auth = (flags & 8 != 0).then(|| {
        let groups = if flags & 16 != 0 { "admin" } else { "dev" };
        let claims = serde_json::json!({"sub": "alice", "groups": [groups]});
        RequestAuth {
            principal: "https://issuer.example/alice".into(),
            audiences: vec!["shop".into()],
            presenter: None,
            claims: claims.as_object().cloned().unwrap_or_default(),
        }
    });
    let ctx = RbacContext {
        source_identity: identity,
        source_ip,
        destination: (IpAddr::from([10, 0, 0, 3]), 8080).into(),
    };
    let attrs = RequestAttributes {
        method,
        path: eval_path,
        query,
        host,
        headers: &headers,
        remote_ip,
        auth: auth.as_ref(),
        sni: (flags & 32 != 0).then_some("api.internal"),
    };
    let applying: Vec<&Authorization> = policies()
        .iter()
        .enumerate()
        .filter(|(i, _)| mask & (1 << i) != 0)
        .map(|(_, p)| p)
        .collect();

    let dry_runs = Cell::new(0usize);
    let verdict = authorize_request(&applying, &ctx, &attrs, &|p: &Authorization| {
        assert!(p.dry_run, "{} told as a dry run", p.key());
        dry_runs.set(dry_runs.get() + 1);
    });
    assert!(
        dry_runs.get() <= applying.iter().filter(|p| p.dry_run).count(),
        "a dry-run policy told twice"
    );
    let enforced = |action| applying.iter().any(|p| !p.dry_run && p.action == action);
    match &verdict {
        Ok(Allowed::NoAllowPolicy) => assert!(!enforced(PolicyAction::Allow)),
        Ok(Allowed::ByRule(r)) => assert!(applying.iter().any(|p| {
            !p.dry_run
                && p.action == PolicyAction::Allow
                && p.key() == r.key()
                && r.rule < p.rules.len()
        })),
        Err(d) => match &d.matched_rule {
            Some(r) => assert!(applying.iter().any(|p| {
                !p.dry_run
                    && p.action == PolicyAction::Deny
                    && p.key() == r.key()
                    && r.rule < p.rules.len()
            })),
            None => assert!(enforced(PolicyAction::Allow), "denied with no ALLOW"),
        },
    }
    // Dry runs are never enforced.
    let enforced_only: Vec<&Authorization> =
        applying.iter().copied().filter(|p| !p.dry_run).collect();
    let without_dry = authorize_request(&enforced_only, &ctx, &attrs, &|_: &Authorization| {
        panic!("no dry-run policy left")
    });
    assert_eq!(verdict, without_dry, "dry-run policies changed the verdict");
    // The node proxy fails closed on what it cannot see: it never allows what this denies.
    let l4 = authorize_observed(&applying, &ctx, &|_: &Authorization| {});
    if verdict.is_err() {
        assert!(l4.is_err(), "L4 allows what the request evaluation denies");
    }

    Outcome {
        path,
        verdict: verdict.map(drop).map_err(|d| d.details()),
    }
}

/// The promises of a normalised path (see [`run`]).
fn check_normalized(target: &str, mode: PathNormalization, path: &str, query: Option<&str>) {
    let (raw_path, raw_query) = match target.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (target, None),
    };
    assert_eq!(query, raw_query, "{target:?}: the query changed");
    assert!(path.starts_with('/'), "{target:?} {mode}: {path:?}");
    assert!(path.len() <= raw_path.len(), "{target:?} {mode}: {path:?}");
    if mode == PathNormalization::None {
        assert_eq!(path, raw_path, "{target:?}: NONE changed the path");
        return;
    }
    assert!(!path.contains('\\'), "{target:?} {mode}: {path:?}");
    assert!(
        !path.split('/').any(|s| s == "." || s == ".."),
        "{target:?} {mode}: dot segment in {path:?}"
    );
    for (i, _) in path.match_indices('%') {
        let hex = path.as_bytes().get(i + 1..i + 3).unwrap_or_default();
        assert!(
            hex.len() == 2 && hex.iter().all(|c| matches!(c, b'0'..=b'9' | b'A'..=b'F')),
            "{target:?} {mode}: escape at {i} of {path:?}"
        );
    }
    if mode != PathNormalization::Base {
        assert!(!path.contains("//"), "{target:?} {mode}: {path:?}");
    }
    // Idempotent: a normalised path normalises to itself.
    match normalize_path(path, mode) {
        Ok(again) => assert_eq!(again.path, path, "{target:?} {mode}: not idempotent"),
        Err(e) => panic!("{target:?} {mode}: {path:?} refused when normalised again: {e}"),
    }
}
