//! The schema of the local configuration file (`LOCAL_XDS_PATH`) or inline YAML
//! (`LOCAL_XDS`), in ztunnel's format: camelCase fields, unknown fields rejected. Loading
//! it into the store, one bad policy at a time, is [`crate::local`].

use crate::error::{ConfigError, UnknownPolicy};
use crate::local_config::LocalConfig;
use crate::locate;
use crate::store::ProxyState;

/// Parses and checks a local configuration. `source` names where the YAML came from (a
/// file path, or `LOCAL_XDS` for inline YAML) and is quoted in errors, together with the
/// line, column and field path at fault. An empty document is an empty configuration.
///
/// The returned configuration is as written (defaults are applied when it is loaded
/// into a [`ProxyState`]), but every check [`ProxyState::from_config`] makes has passed.
pub fn parse_local_config(source: &str, yaml: &str) -> Result<LocalConfig, ConfigError> {
    if is_empty_document(yaml) {
        return Ok(LocalConfig::default());
    }
    let de = yaml_serde::Deserializer::from_str(yaml);
    let cfg: LocalConfig =
        serde_path_to_error::deserialize(de).map_err(|e| parse_error(source, e))?;
    ProxyState::from_config(cfg.clone())
        .map_err(|e| locate_invalid(e.with_origin(source), yaml))?;
    check_policy_references(source, yaml, &cfg)?;
    Ok(cfg)
}

/// Adds the line and column to an item refused after parsing: of the field the message
/// starts with (`name: must not be empty`), else of the item (`workloads[1]`).
pub(crate) fn locate_invalid(err: ConfigError, yaml: &str) -> ConfigError {
    let ConfigError::Invalid {
        origin,
        item,
        message,
        ..
    } = err
    else {
        return err;
    };
    let index = item.split(' ').next().unwrap_or_default();
    let field = message
        .split_once(": ")
        .map(|(f, _)| f)
        .filter(|f| f.chars().all(|c| c.is_ascii_alphanumeric()));
    let at = |path: &str| locate::parse_path(path).and_then(|steps| locate::locate(yaml, &steps));
    let found = field
        .and_then(|f| at(&format!("{index}.{f}")))
        .or_else(|| at(index));
    ConfigError::Invalid {
        origin,
        line: found.map(|(l, _)| l),
        column: found.map(|(_, c)| c),
        item,
        message,
    }
}

/// Every `authorizationPolicies` entry of a workload names a policy of the file. (Over
/// xDS a reference may arrive before its policy; a local file is complete, so a name that
/// resolves to nothing is a typo that would leave the workload without its policy.)
pub(crate) fn check_policy_references(
    source: &str,
    yaml: &str,
    cfg: &LocalConfig,
) -> Result<(), ConfigError> {
    let defined: std::collections::BTreeSet<String> =
        cfg.policies.iter().map(|p| p.key()).collect();
    for (i, w) in cfg.workloads.iter().enumerate() {
        for (j, name) in w.authorization_policies.iter().enumerate() {
            if defined.contains(name.as_str()) {
                continue;
            }
            let path = format!("workloads[{i}].authorizationPolicies[{j}]");
            let at = locate::parse_path(&path).and_then(|steps| locate::locate(yaml, &steps));
            return Err(ConfigError::UnknownPolicy(Box::new(UnknownPolicy {
                origin: source.to_string(),
                line: at.map(|(l, _)| l),
                column: at.map(|(_, c)| c),
                path,
                workload: format!("{}/{}", w.namespace, w.name),
                policy: name.to_string(),
                suggestion: suggest_policy(name, &w.namespace, cfg),
            })));
        }
    }
    Ok(())
}

/// The policy a dangling name probably meant: the one of that name in the workload's
/// namespace when the namespace was left out, else the only policy of that name.
fn suggest_policy(written: &str, namespace: &str, cfg: &LocalConfig) -> Option<String> {
    let name = written.rsplit('/').next().unwrap_or(written);
    let same_name: Vec<String> = cfg
        .policies
        .iter()
        .filter(|p| p.name == name)
        .map(|p| p.key())
        .collect();
    let own = format!("{namespace}/{name}");
    if same_name.contains(&own) {
        return Some(own);
    }
    match same_name.as_slice() {
        [only] => Some(only.clone()),
        _ => None,
    }
}

/// True for YAML with no content (nothing, comments only, a bare `---`, or `null`).
pub(crate) fn is_empty_document(yaml: &str) -> bool {
    matches!(
        yaml_serde::from_str::<yaml_serde::Value>(yaml),
        Ok(yaml_serde::Value::Null)
    )
}

pub(crate) fn parse_error(
    origin: &str,
    err: serde_path_to_error::Error<yaml_serde::Error>,
) -> ConfigError {
    let path = match err.path().to_string() {
        p if p == "." => String::new(),
        p => p,
    };
    let inner = err.inner();
    let location = inner.location();
    let mut message = inner.to_string();
    // yaml_serde's message carries its own path prefix and location suffix; we report
    // both as separate fields, so strip them from the text.
    if let Some(loc) = &location {
        let at = format!(" at line {} column {}", loc.line(), loc.column());
        message = message.replacen(&at, "", 1);
    }
    if let Some((prefix, rest)) = message.split_once(": ") {
        if !prefix.is_empty()
            && !prefix.contains(char::is_whitespace)
            && (prefix == path || path.starts_with(prefix) || prefix.starts_with(path.as_str()))
        {
            message = rest.to_string();
        }
    }
    ConfigError::Parse {
        origin: origin.to_string(),
        line: location.as_ref().map(|l| l.line()),
        column: location.as_ref().map(|l| l.column()),
        path,
        message,
    }
}

impl ProxyState {
    /// A store from a local config's YAML text (`source` names it in errors): what a test
    /// fixture, a one-file mesh or a fuzz target starts from. One bad policy refuses the
    /// whole text here; a watched file is loaded policy by policy instead
    /// ([`crate::load_local_config`]).
    pub fn from_yaml(source: &str, yaml: &str) -> Result<ProxyState, ConfigError> {
        ProxyState::from_config(parse_local_config(source, yaml)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{PolicyAction, PolicyScope, StringMatch};
    use crate::service::{LoadBalancerMode, Visibility};
    use crate::workload::Workload;
    use crate::workload::{GatewayDestination, TunnelProtocol};

    const FULL: &str = r#"
workloads:
- uid: cluster1//v1/Pod/default/client
  name: client
  namespace: default
  serviceAccount: client
  trustDomain: ""
  workloadIps: ["10.0.0.2", "fd00::2"]
  protocol: HBONE
  node: node1
  network: ""
  clusterId: ""
  canonicalName: client
  canonicalRevision: v1
  workloadName: client
  workloadType: deployment
  status: Healthy
  locality: {region: r1, zone: z1, subzone: s1}
  capacity: 2
  authorizationPolicies: ["default/allow-client"]
  nativeTunnel: false
  networkMode: Standard
  waypoint: {destination: "/10.0.0.9", hboneMtlsPort: 15008}
  networkGateway: {destination: {namespace: gw, hostname: gw.example}, hbonePort: 15009}
  applicationTunnel: {protocol: PROXY, port: 15088}
  services:
    default/echo.default.svc.cluster.local: {80: 8080}
- name: server
  namespace: default
  workloadIps: ["10.0.0.3"]
services:
- name: echo
  namespace: default
  hostname: echo.default.svc.cluster.local
  vips: ["/10.96.0.10"]
  ports: {80: 8080, 90: 0}
  subjectAltNames: ["spiffe://cluster.local/ns/default/sa/echo"]
  loadBalancer: {routingPreference: [Network, Region], mode: Failover, healthPolicy: AllowAll}
  ipFamilies: IPv4
  canonical: true
  visibility: Namespace
policies:
- name: allow-client
  namespace: default
  scope: WorkloadSelector
  action: Allow
  dryRun: false
  rules:
  - - - namespaces: [{exact: default}]
        principals: [{prefix: "cluster.local/"}, {Suffix: "/sa/client"}, {presence: {}}]
        notPrincipals: [{Exact: "x"}]
        serviceAccounts: [{namespace: default, serviceAccount: client}]
        notServiceAccounts: [{namespace: x, serviceAccount: y}]
        sourceIps: ["10.0.0.0/8", "10.1.2.3"]
        notSourceIps: ["fd00::/64"]
        destinationIps: ["10.0.0.3/32"]
        notDestinationIps: []
        destinationPorts: [8080]
        notDestinationPorts: [9090]
        notNamespaces: [{suffix: "-test"}]
"#;

    #[test]
    fn parses_full_example() {
        let cfg = parse_local_config("test.yaml", FULL).unwrap();
        assert_eq!(cfg.workloads.len(), 2);
        let w = &cfg.workloads[0];
        assert_eq!(w.protocol, TunnelProtocol::Hbone);
        assert_eq!(w.workload_ips.len(), 2);
        assert_eq!(w.capacity, 2);
        assert_eq!(
            w.services["default/echo.default.svc.cluster.local"][&80],
            8080
        );
        assert!(matches!(
            w.network_gateway.as_ref().unwrap().destination,
            GatewayDestination::Hostname(_)
        ));
        assert_eq!(w.network_gateway.as_ref().unwrap().hbone_mtls_port, 15009);
        assert_eq!(cfg.workloads[1].capacity, 1);
        assert_eq!(cfg.workloads[1].protocol, TunnelProtocol::Tcp);
        let s = &cfg.services[0];
        assert_eq!(s.ports[&90], 0);
        assert_eq!(s.visibility, Visibility::Namespace);
        assert_eq!(s.lb_mode(), LoadBalancerMode::Failover);
        let p = &cfg.policies[0];
        assert_eq!(p.scope, PolicyScope::WorkloadSelector);
        assert_eq!(p.action, PolicyAction::Allow);
        let m = &p.rules[0][0][0];
        assert_eq!(m.principals[1], StringMatch::Suffix("/sa/client".into()));
        assert_eq!(m.principals[2], StringMatch::Presence);
        assert_eq!(m.source_ips.len(), 2);
        assert_eq!(m.source_ips[1].to_string(), "10.1.2.3/32");
    }

    #[test]
    fn empty_documents() {
        for doc in [
            "",
            "  \n",
            "# nothing\n",
            "---\n",
            "null",
            "{}",
            "workloads:\n",
        ] {
            assert_eq!(
                parse_local_config("LOCAL_XDS", doc).unwrap(),
                LocalConfig::default(),
                "{doc:?}"
            );
        }
    }

    #[test]
    fn only_some_sections() {
        let cfg = parse_local_config(
            "LOCAL_XDS",
            "workloads:\n- name: a\n  namespace: b\n  workloadIps: [\"10.0.0.1\"]\n",
        )
        .unwrap();
        assert_eq!(cfg.workloads.len(), 1);
        assert!(cfg.services.is_empty() && cfg.policies.is_empty());
    }

    #[test]
    fn round_trip_through_yaml() {
        let cfg = parse_local_config("test.yaml", FULL).unwrap();
        let text = yaml_serde::to_string(&cfg).unwrap();
        let again = parse_local_config("again", &text).unwrap();
        assert_eq!(cfg, again);
    }

    /// Every way a configuration can be refused, with the text the user sees.
    #[test]
    fn error_table() {
        const W: &str = "workloads:\n- name: a\n  namespace: default\n";
        let cases: &[(&str, String, &str)] = &[
            // Syntax and schema errors: source, line, column, path.
            (
                "bad protocol",
                "workloads:\n- name: a\n  namespace: b\n- name: c\n  namespace: d\n  protocol: HBONEE\n".into(),
                "f.yaml: line 6, column 13: workloads[1].protocol: unknown variant `HBONEE`, expected one of `HBONE`, `TCP`, `LEGACY_ISTIO_MTLS`",
            ),
            (
                "unknown top-level field",
                "workload: []\n".into(),
                "f.yaml: line 1, column 1: workload: unknown field `workload`, expected one of `workloads`, `services`, `policies`",
            ),
            (
                "old singular workloadIp",
                format!("{W}  workloadIp: 10.0.0.1\n"),
                "f.yaml: line 4, column 3: workloads[0].workloadIp: unknown field `workloadIp`, expected one of `uid`, `name`, `namespace`, `serviceAccount`, `trustDomain`, `node`, `network`, `clusterId`, `canonicalName`, `canonicalRevision`, `workloadName`, `workloadType`, `hostname`, `workloadIps`, `protocol`, `networkMode`, `status`, `locality`, `capacity`, `authorizationPolicies`, `nativeTunnel`, `waypoint`, `networkGateway`, `applicationTunnel`, `services`",
            ),
            (
                "bad ip",
                format!("{W}  workloadIps: [\"10.0.0.1\", \"10.0.0.300\"]\n"),
                "f.yaml: line 4, column 29: workloads[0].workloadIps[1]: \"10.0.0.300\" is not an IP address",
            ),
            (
                "ip not a string",
                format!("{W}  workloadIps: [[1]]\n"),
                "f.yaml: line 4, column 17: workloads[0].workloadIps[0]: invalid type: sequence, expected an IP address",
            ),
            (
                "missing name",
                "workloads:\n- namespace: default\n".into(),
                "f.yaml: line 2, column 3: workloads[0]: missing field `name`",
            ),
            (
                "bad status",
                format!("{W}  status: Sick\n"),
                "f.yaml: line 4, column 11: workloads[0].status: unknown variant `Sick`, expected `Healthy` or `Unhealthy`",
            ),
            (
                "bad network mode",
                format!("{W}  networkMode: Host\n"),
                "f.yaml: line 4, column 16: workloads[0].networkMode: unknown variant `Host`, expected `Standard` or `HostNetwork`",
            ),
            (
                "capacity negative",
                format!("{W}  capacity: -1\n"),
                "f.yaml: line 4, column 13: workloads[0].capacity: invalid type: integer `-1`, expected u32",
            ),
            (
                "service port out of range",
                format!("{W}  services:\n    default/x: {{70000: 80}}\n"),
                "f.yaml: line 5, column 17: workloads[0].services.default/x.70000: invalid value: integer `70000`, expected u16",
            ),
            (
                "gateway without destination",
                format!("{W}  waypoint: {{hboneMtlsPort: 15008}}\n"),
                "f.yaml: line 4, column 13: workloads[0].waypoint: missing field `destination`",
            ),
            (
                "gateway bad address",
                format!("{W}  waypoint: {{destination: \"nope\"}}\n"),
                "f.yaml: line 4, column 27: workloads[0].waypoint.destination: \"nope\" is not a \"<network>/<ip>\" address, nor a \"<namespace>/<hostname>\"",
            ),
            (
                "gateway hostname unknown key",
                format!("{W}  waypoint: {{destination: {{ns: a, hostname: b}}}}\n"),
                "f.yaml: line 4, column 28: workloads[0].waypoint.destination.ns: unknown field `ns`, expected `namespace` or `hostname`",
            ),
            (
                "bad app tunnel protocol",
                format!("{W}  applicationTunnel: {{protocol: HTTP}}\n"),
                "f.yaml: line 4, column 33: workloads[0].applicationTunnel.protocol: unknown variant `HTTP`, expected `NONE` or `PROXY`",
            ),
            (
                "bad vip",
                "services:\n- name: s\n  namespace: n\n  hostname: h\n  vips: [\"10.0.0.300\"]\n".into(),
                "f.yaml: line 5, column 10: services[0].vips[0]: \"10.0.0.300\" is not a \"<network>/<ip>\" address",
            ),
            (
                "bad lb mode",
                "services:\n- name: s\n  namespace: n\n  hostname: h\n  loadBalancer: {mode: Random}\n".into(),
                "f.yaml: line 5, column 24: services[0].loadBalancer.mode: unknown variant `Random`, expected one of `Standard`, `Strict`, `Failover`, `Passthrough`",
            ),
            (
                "bad visibility",
                "services:\n- name: s\n  namespace: n\n  hostname: h\n  visibility: Private\n".into(),
                "f.yaml: line 5, column 15: services[0].visibility: unknown variant `Private`, expected `Public` or `Namespace`",
            ),
            (
                "bad policy scope",
                "policies:\n- name: p\n  namespace: n\n  scope: Cluster\n  action: Allow\n".into(),
                "f.yaml: line 4, column 10: policies[0].scope: unknown variant `Cluster`, expected one of `Global`, `Namespace`, `WorkloadSelector`",
            ),
            (
                "policy missing action",
                "policies:\n- name: p\n  namespace: n\n  scope: Global\n".into(),
                "f.yaml: line 2, column 3: policies[0]: missing field `action`",
            ),
            (
                "bad string match",
                "policies:\n- name: p\n  namespace: n\n  scope: Global\n  action: Allow\n  rules: [[[{principals: [{regex: x}]}]]]\n".into(),
                "f.yaml: line 6, column 28: policies[0].rules[0][0][0].principals[0].regex: unknown variant `regex`, expected one of `exact`, `prefix`, `suffix`, `presence`",
            ),
            (
                "bad cidr",
                "policies:\n- name: p\n  namespace: n\n  scope: Global\n  action: Allow\n  rules: [[[{sourceIps: [\"10.0.0.0/33\"]}]]]\n".into(),
                "f.yaml: line 6, column 26: policies[0].rules[0][0][0].sourceIps[0]: \"10.0.0.0/33\" is not an IP address or CIDR",
            ),
            (
                "unknown match field",
                "policies:\n- name: p\n  namespace: n\n  scope: Global\n  action: Allow\n  rules: [[[{sourceIp: [\"10.0.0.0/8\"]}]]]\n".into(),
                "f.yaml: line 6, column 14: policies[0].rules[0][0][0].sourceIp: unknown field `sourceIp`, expected one of `namespaces`, `notNamespaces`, `serviceAccounts`, `notServiceAccounts`, `principals`, `notPrincipals`, `sourceIps`, `notSourceIps`, `destinationIps`, `notDestinationIps`, `destinationPorts`, `notDestinationPorts`, `paths`, `notPaths`, `methods`, `notMethods`, `hosts`, `notHosts`, `requestPrincipals`, `notRequestPrincipals`, `headers`, `notHeaders`, `remoteIps`, `notRemoteIps`, `when`",
            ),
            (
                "yaml syntax",
                "workloads: [\n".into(),
                "f.yaml: line 2, column 1: workloads: did not find expected node content, while parsing a flow node",
            ),
            (
                "not a map",
                "- a\n".into(),
                "f.yaml: line 1, column 1: invalid type: sequence, expected struct LocalConfig",
            ),
            // IPv4-mapped IPv6 addresses never match (the data path sees plain IPv4):
            // refused in IPs, VIPs, CIDRs and gateway addresses alike.
            (
                "mapped workload ip",
                format!("{W}  workloadIps: [\"10.0.0.1\", \"::ffff:10.0.0.2\"]\n"),
                "f.yaml: line 4, column 29: workloads[0].workloadIps[1]: \"::ffff:10.0.0.2\" is an IPv4-mapped IPv6 address, which never matches: connections from and to IPv4 addresses are seen as plain IPv4; write \"10.0.0.2\"",
            ),
            (
                "mapped vip",
                "services:\n- name: s\n  namespace: n\n  hostname: h\n  vips: [\"/::ffff:10.96.0.1\"]\n".into(),
                "f.yaml: line 5, column 10: services[0].vips[0]: \"/::ffff:10.96.0.1\" is an IPv4-mapped IPv6 address, which never matches: connections from and to IPv4 addresses are seen as plain IPv4; write \"/10.96.0.1\"",
            ),
            (
                "mapped vip range",
                "services:\n- name: s\n  namespace: n\n  hostname: h\n  vips: [\"net1/::ffff:10.96.0.0/112\"]\n".into(),
                "f.yaml: line 5, column 10: services[0].vips[0]: \"net1/::ffff:10.96.0.0/112\" is an IPv4-mapped IPv6 address, which never matches: connections from and to IPv4 addresses are seen as plain IPv4; write \"net1/10.96.0.0/16\"",
            ),
            (
                "mapped waypoint",
                format!("{W}  waypoint: {{destination: \"/::ffff:10.0.0.9\"}}\n"),
                "f.yaml: line 4, column 27: workloads[0].waypoint.destination: \"/::ffff:10.0.0.9\" is an IPv4-mapped IPv6 address, which never matches: connections from and to IPv4 addresses are seen as plain IPv4; write \"/10.0.0.9\"",
            ),
            (
                "mapped source cidr",
                "policies:\n- name: p\n  namespace: n\n  scope: Global\n  action: Allow\n  rules: [[[{sourceIps: [\"::ffff:10.0.0.0/104\"]}]]]\n".into(),
                "f.yaml: line 6, column 26: policies[0].rules[0][0][0].sourceIps[0]: \"::ffff:10.0.0.0/104\" is an IPv4-mapped IPv6 address, which never matches: connections from and to IPv4 addresses are seen as plain IPv4; write \"10.0.0.0/8\"",
            ),
            (
                "mapped destination ip",
                "policies:\n- name: p\n  namespace: n\n  scope: Global\n  action: Allow\n  rules: [[[{notDestinationIps: [\"::FFFF:a00:3\"]}]]]\n".into(),
                "f.yaml: line 6, column 34: policies[0].rules[0][0][0].notDestinationIps[0]: \"::FFFF:a00:3\" is an IPv4-mapped IPv6 address, which never matches: connections from and to IPv4 addresses are seen as plain IPv4; write \"10.0.0.3\"",
            ),
            // A principal written as a SPIFFE URI never matches.
            (
                "principal with scheme",
                "policies:\n- name: p\n  namespace: n\n  scope: Global\n  action: Allow\n  rules:\n  - - - principals: [{exact: \"spiffe://cluster.local/ns/n/sa/a\"}]\n".into(),
                "f.yaml: line 7, column 22: policies[0].rules[0][0][0].principals[0]: principal \"spiffe://cluster.local/ns/n/sa/a\" starts with \"spiffe://\", but principals are compared without the scheme, so it can never match; drop the prefix: \"cluster.local/ns/n/sa/a\"",
            ),
            (
                "not-principal prefix with scheme",
                "policies:\n- name: p\n  namespace: n\n  scope: Global\n  action: Allow\n  rules: [[[{notPrincipals: [!prefix \"SPIFFE://cluster.local/\"]}]]]\n".into(),
                "f.yaml: line 6, column 30: policies[0].rules[0][0][0].notPrincipals[0]: principal \"SPIFFE://cluster.local/\" starts with \"spiffe://\", but principals are compared without the scheme, so it can never match; drop the prefix: \"cluster.local/\"",
            ),
            // A workload names a policy the file does not define.
            (
                "unknown policy",
                "workloads:\n- name: a\n  namespace: default\n- name: b\n  namespace: default\n  authorizationPolicies:\n  - default/p\n  - default/typo\npolicies:\n- {name: p, namespace: default, scope: WorkloadSelector, action: Allow}\n".into(),
                "f.yaml: line 8, column 5: workloads[1].authorizationPolicies[1]: workload default/b names policy \"default/typo\", but no entry of `policies` has that \"<namespace>/<name>\", so the workload would run without it; define the policy or remove the entry",
            ),
            (
                "policy without its namespace",
                "workloads:\n- {name: a, namespace: default, authorizationPolicies: [p]}\npolicies:\n- {name: p, namespace: default, scope: WorkloadSelector, action: Allow}\n".into(),
                "f.yaml: line 2, column 57: workloads[0].authorizationPolicies[0]: workload default/a names policy \"p\", but no entry of `policies` has that \"<namespace>/<name>\", so the workload would run without it; did you mean \"default/p\"?",
            ),
            (
                "policy in another namespace",
                "workloads:\n- {name: a, namespace: default, authorizationPolicies: [\"default/p\"]}\npolicies:\n- {name: p, namespace: other, scope: WorkloadSelector, action: Allow}\n".into(),
                "f.yaml: line 2, column 57: workloads[0].authorizationPolicies[0]: workload default/a names policy \"default/p\", but no entry of `policies` has that \"<namespace>/<name>\", so the workload would run without it; did you mean \"other/p\"?",
            ),
            (
                "policy and no policies at all",
                "workloads:\n- {name: a, namespace: default, authorizationPolicies: [\"default/p\"]}\n".into(),
                "f.yaml: line 2, column 57: workloads[0].authorizationPolicies[0]: workload default/a names policy \"default/p\", but no entry of `policies` has that \"<namespace>/<name>\", so the workload would run without it; define the policy or remove the entry",
            ),
            // Semantic errors: source, item, field.
            (
                "empty name",
                "workloads:\n- name: \"\"\n  namespace: default\n".into(),
                "f.yaml: line 2, column 9: workloads[0] (default/): name: must not be empty",
            ),
            (
                "duplicate uid",
                "workloads:\n- name: a\n  namespace: default\n- uid: Kubernetes//v1/Pod/default/a\n  name: b\n  namespace: default\n".into(),
                "f.yaml: line 4, column 8: workloads[1] (uid Kubernetes//v1/Pod/default/a): uid: duplicate of workloads[0]",
            ),
            (
                "bad trust domain",
                format!("{W}  trustDomain: Bad_Domain!\n"),
                "f.yaml: line 2, column 3: workloads[0] (default/a): identity (trustDomain/namespace/serviceAccount): SPIFFE trust domain has 'B' at byte 0; only lower-case letters, digits, '.', '-' and '_' are allowed",
            ),
            (
                "bad service account",
                format!("{W}  serviceAccount: \"a b\"\n"),
                "f.yaml: line 2, column 3: workloads[0] (default/a): identity (trustDomain/namespace/serviceAccount): SPIFFE service account has ' ' at byte 1; a SPIFFE path segment allows only ASCII letters, digits, '.', '-' and '_' (no percent-encoding)",
            ),
            (
                "service account outside the SPIFFE character set",
                format!("{W}  serviceAccount: \"a~b\"\n"),
                "f.yaml: line 2, column 3: workloads[0] (default/a): identity (trustDomain/namespace/serviceAccount): SPIFFE service account has '~' at byte 1; a SPIFFE path segment allows only ASCII letters, digits, '.', '-' and '_' (no percent-encoding)",
            ),
            (
                "bad services key",
                format!("{W}  services:\n    echo: {{80: 8080}}\n"),
                "f.yaml: line 5, column 5: workloads[0] (default/a): services: key \"echo\" is not \"<namespace>/<hostname>\"",
            ),
            (
                "gateway port zero",
                format!("{W}  networkGateway: {{destination: \"/10.0.0.1\", hboneMtlsPort: 0}}\n"),
                "f.yaml: line 4, column 19: workloads[0] (default/a): networkGateway: hboneMtlsPort: must not be 0",
            ),
            (
                "duplicate service",
                "services:\n- {name: s, namespace: n, hostname: h}\n- {name: s2, namespace: n, hostname: h}\n".into(),
                "f.yaml: line 3, column 3: services[1] (n/h): duplicate of services[0]",
            ),
            (
                "service without hostname",
                "services:\n- {name: s, namespace: n, hostname: \"\"}\n".into(),
                "f.yaml: line 2, column 37: services[0] (n/): hostname: must be non-empty and contain no '/'",
            ),
            (
                "duplicate policy",
                "policies:\n- {name: p, namespace: n, scope: Global, action: Allow}\n- {name: p, namespace: n, scope: Namespace, action: Deny}\n".into(),
                "f.yaml: line 3, column 3: policies[1] (n/p): duplicate of policies[0]",
            ),
            (
                "namespace policy without namespace",
                "policies:\n- {name: p, scope: Namespace, action: Deny}\n".into(),
                "f.yaml: line 2, column 3: policies[0] (/p): namespace: a Namespace-scoped policy needs a namespace",
            ),
        ];
        let mut failures = Vec::new();
        for (name, yaml, want) in cases {
            match parse_local_config("f.yaml", yaml) {
                Ok(_) => failures.push(format!("{name}: parsed, want error {want:?}")),
                Err(e) if e.to_string() != *want => failures.push(format!(
                    "{name}:\n   got {:?}\n  want {want:?}",
                    e.to_string()
                )),
                Err(_) => {}
            }
        }
        assert!(failures.is_empty(), "\n{}", failures.join("\n"));
    }

    #[test]
    fn string_match_forms() {
        let yaml = "policies:\n- name: p\n  scope: Global\n  action: Allow\n  rules: [[[{principals: [!exact a, !Prefix b, {Presence: null}, {suffix: c}]}]]]\n";
        let cfg = parse_local_config("t", yaml).unwrap();
        assert_eq!(
            cfg.policies[0].rules[0][0][0].principals,
            [
                StringMatch::Exact("a".into()),
                StringMatch::Prefix("b".into()),
                StringMatch::Presence,
                StringMatch::Suffix("c".into()),
            ]
        );
        let two = "policies:\n- name: p\n  scope: Global\n  action: Allow\n  rules: [[[{principals: [{exact: a, prefix: b}]}]]]\n";
        let err = parse_local_config("t", two).unwrap_err().to_string();
        assert!(
            err.contains("exactly one of exact, prefix, suffix, presence"),
            "{err}"
        );
        let none = "policies:\n- name: p\n  scope: Global\n  action: Allow\n  rules: [[[{principals: [{}]}]]]\n";
        assert!(parse_local_config("t", none).is_err());
    }

    #[test]
    fn from_config_errors_without_origin() {
        let mut cfg = LocalConfig::default();
        cfg.workloads.push(Workload::new("", "default"));
        let err = ProxyState::from_config(cfg).unwrap_err();
        assert_eq!(
            err.to_string(),
            "workloads[0] (default/): name: must not be empty"
        );
        assert_eq!(
            err.with_origin("x.yaml").to_string(),
            "x.yaml: workloads[0] (default/): name: must not be empty"
        );
    }

    #[test]
    fn parse_error_fields() {
        let err = parse_local_config(
            "LOCAL_XDS",
            "workloads:\n- name: a\n  namespace: b\n  protocol: X\n",
        )
        .unwrap_err();
        match err {
            ConfigError::Parse {
                origin,
                line,
                column,
                path,
                ..
            } => {
                assert_eq!(origin, "LOCAL_XDS");
                assert_eq!(line, Some(4));
                assert_eq!(column, Some(13));
                assert_eq!(path, "workloads[0].protocol");
            }
            other => panic!("unexpected {other:?}"),
        }
        // A reference checked after parsing still has its line and column.
        let err = parse_local_config(
            "mesh.yaml",
            "workloads:\n- name: a\n  namespace: b\n  authorizationPolicies:\n    - b/p\n",
        )
        .unwrap_err();
        match err {
            ConfigError::UnknownPolicy(u) => {
                assert_eq!((u.line, u.column), (Some(5), Some(7)));
                assert_eq!(u.path, "workloads[0].authorizationPolicies[0]");
                assert_eq!(u.policy, "b/p");
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}
