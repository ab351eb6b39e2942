//! Loading (and reloading) the local configuration so that one bad policy does not take
//! the others down, and never turns into "allow".
//!
//! A policy that does not parse (an invalid CIDR, an unknown field, ...) or is not valid
//! (a duplicate, a bad name) is rejected with the same error the strict
//! [`parse_local_config`](crate::parse_local_config) gives (file, line, column, field), and
//! the rest of the file applies. In its place stays, by its `namespace/name`:
//! - its last good version, when the file was loaded before with it (a reload);
//! - else a fail-closed stand-in: an ALLOW policy without rules (it allows nothing, but
//!   its presence means "allow policies exist"), a DENY policy whose one rule matches
//!   everything (it denies all traffic it is attached to).
//!
//! A policy whose name, scope or action cannot be read has no place to keep: the whole
//! file is refused then, as is a file whose workloads or services are bad.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};

use serde::de::{self, Deserializer, IgnoredAny, SeqAccess, Visitor};
use serde::Deserialize;

use crate::error::ConfigError;
use crate::local_schema::{
    check_policy_references, is_empty_document, locate_invalid, parse_error,
};
use crate::policy::{Authorization, PolicyAction, PolicyScope};
use crate::store::ProxyState;
use crate::LocalConfig;

/// A local configuration as loaded, with the policies it rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalLoad {
    /// What to apply: the file's workloads and services, its good policies, and for each
    /// rejected one what stays in its place (see [`KeptVersion`]).
    pub config: LocalConfig,
    /// The rejected policies, in file order.
    pub rejected: Vec<RejectedPolicy>,
}

/// A policy of the file that was rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RejectedPolicy {
    /// `namespace/name`.
    pub key: String,
    /// Why: names the file, line, column and field.
    pub error: ConfigError,
    /// What applies in its place.
    pub kept: KeptVersion,
}

/// What applies in place of a rejected policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeptVersion {
    /// The version of the previous load.
    Previous,
    /// A fail-closed stand-in (allows nothing, or denies everything).
    FailClosed,
}

thread_local! {
    /// Indices of `policies` to skip while deserializing (see [`policies`]), and the
    /// original indices of those read.
    static SKIP: RefCell<BTreeSet<usize>> = const { RefCell::new(BTreeSet::new()) };
    static READ: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

/// serde helper for `LocalConfig::policies`: a sequence (or null), skipping the indices of
/// [`SKIP`] (none outside [`load_local_config`]) and noting the indices read in [`READ`].
pub(crate) fn policies<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Authorization>, D::Error> {
    struct V;
    impl<'de> Visitor<'de> for V {
        type Value = Vec<Authorization>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a sequence")
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(Vec::new())
        }
        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(Vec::new())
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let skip = SKIP.with(|s| s.borrow().clone());
            let mut out = Vec::new();
            let mut read = Vec::new();
            for i in 0.. {
                if skip.contains(&i) {
                    if seq.next_element::<IgnoredAny>()?.is_none() {
                        break;
                    }
                    continue;
                }
                match seq.next_element::<Authorization>()? {
                    Some(p) => {
                        out.push(p);
                        read.push(i);
                    }
                    None => break,
                }
            }
            READ.with(|r| *r.borrow_mut() = read);
            Ok(out)
        }
    }
    d.deserialize_any(V)
}

/// The index `N` of an error path `policies[N]...`.
fn policy_index(path: &str) -> Option<usize> {
    let rest = path.strip_prefix("policies[")?;
    rest.split_once(']')?.0.parse().ok()
}

/// What can be read of a policy that did not parse: enough to keep something in its place.
fn identify(doc: &yaml_serde::Value, index: usize) -> Option<Authorization> {
    let p = doc.get("policies")?.get(index)?;
    let name = p.get("name")?.as_str()?.to_string();
    let namespace = match p.get("namespace") {
        None => String::new(),
        Some(v) => v.as_str()?.to_string(),
    };
    let scope = PolicyScope::deserialize(p.get("scope")?.clone()).ok()?;
    let action = PolicyAction::deserialize(p.get("action")?.clone()).ok()?;
    let dry_run = match p.get("dryRun") {
        None => false,
        // Unreadable: enforced (the stand-in fails closed).
        Some(v) => v.as_bool().unwrap_or(false),
    };
    let mut a = Authorization {
        name,
        namespace,
        scope,
        action,
        rules: Vec::new(),
        dry_run,
    };
    a.normalize().ok()?;
    Some(a)
}

/// The fail-closed stand-in for a rejected policy (see the module docs).
fn stand_in(mut p: Authorization) -> Authorization {
    p.rules = match p.action {
        PolicyAction::Allow => Vec::new(),
        PolicyAction::Deny => vec![Vec::new()],
    };
    p
}

/// Loads a local configuration, rejecting bad policies one by one (see the module docs).
/// `previous` is the configuration of the last load (its [`LocalLoad::config`]), whose
/// versions of rejected policies stay. An error refuses the whole file.
pub fn load_local_config(
    source: &str,
    yaml: &str,
    previous: Option<&LocalConfig>,
) -> Result<LocalLoad, ConfigError> {
    if is_empty_document(yaml) {
        return Ok(LocalLoad {
            config: LocalConfig::default(),
            rejected: Vec::new(),
        });
    }
    // The document as a tree, to identify a policy that did not parse: read only then, as
    // a tree of a big mesh is many times the size of its text.
    let mut doc: Option<Option<yaml_serde::Value>> = None;
    let previous_policy =
        |key: &str| previous.and_then(|c| c.policies.iter().find(|p| p.key() == key).cloned());
    // Original index → (error, identity) of each rejected policy.
    let mut rejected: BTreeMap<usize, (ConfigError, Authorization)> = BTreeMap::new();
    let reset = || {
        SKIP.with(|s| s.borrow_mut().clear());
        READ.with(|r| r.borrow_mut().clear());
    };
    let parsed = loop {
        SKIP.with(|s| *s.borrow_mut() = rejected.keys().copied().collect());
        let de = yaml_serde::Deserializer::from_str(yaml);
        let result: Result<LocalConfig, _> = serde_path_to_error::deserialize(de);
        match result {
            Ok(cfg) => break cfg,
            Err(e) => {
                let path = e.path().to_string();
                let err = parse_error(source, e);
                let Some(index) = policy_index(&path).filter(|i| !rejected.contains_key(i)) else {
                    reset();
                    return Err(err);
                };
                let tree = doc.get_or_insert_with(|| yaml_serde::from_str(yaml).ok());
                let Some(identity) = tree.as_ref().and_then(|d| identify(d, index)) else {
                    reset();
                    return Err(err);
                };
                rejected.insert(index, (err, identity));
            }
        }
    };
    let read = READ.with(|r| std::mem::take(&mut *r.borrow_mut()));
    reset();

    // Workloads and services: all or nothing, as the strict parser.
    let LocalConfig {
        workloads,
        services,
        policies,
    } = parsed;
    let base = LocalConfig {
        workloads,
        services,
        policies: Vec::new(),
    };
    ProxyState::check_config(&base).map_err(|e| locate_invalid(e.with_origin(source), yaml))?;

    // Policies one by one: invalid ones and duplicates are rejected.
    let mut good: BTreeMap<usize, Authorization> = BTreeMap::new();
    let mut first_of: BTreeMap<String, usize> = BTreeMap::new();
    for (i, p) in read.into_iter().zip(policies) {
        let key = p.key();
        let item = format!("policies[{i}] ({key})");
        let mut checked = p.clone();
        let problem = match checked.normalize() {
            Err(m) => Some(m),
            Ok(()) => first_of
                .get(&key)
                .map(|first| format!("duplicate of policies[{first}]")),
        };
        match problem {
            None => {
                first_of.insert(key, i);
                good.insert(i, p);
            }
            Some(message) => {
                let err = locate_invalid(
                    ConfigError::invalid(item, message).with_origin(source),
                    yaml,
                );
                // A duplicate keeps the first; anything else has its key to stand for.
                if checked.normalize().is_err() {
                    return Err(err);
                }
                rejected.insert(i, (err, checked));
            }
        }
    }
    let mut out = Vec::new();
    let mut kept_keys: BTreeSet<String> = good.values().map(Authorization::key).collect();
    let mut all: BTreeMap<usize, Authorization> = good;
    for (i, (error, identity)) in &rejected {
        let key = identity.key();
        if kept_keys.contains(&key) {
            // A duplicate of a good policy: that one stays.
            out.push(RejectedPolicy {
                key,
                error: error.clone(),
                kept: KeptVersion::Previous,
            });
            continue;
        }
        let (policy, kept) = match previous_policy(&key) {
            Some(p) => (p, KeptVersion::Previous),
            None => (stand_in(identity.clone()), KeptVersion::FailClosed),
        };
        kept_keys.insert(key.clone());
        all.insert(*i, policy);
        out.push(RejectedPolicy {
            key,
            error: error.clone(),
            kept,
        });
    }
    let config = LocalConfig {
        policies: all.into_values().collect(),
        ..base
    };
    check_policy_references(source, yaml, &config)?;
    Ok(LocalLoad {
        config,
        rejected: out,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local_file::LocalFile;
    use crate::parse_local_config;

    const GOOD: &str = "workloads:\n- {name: a, namespace: default, workloadIps: [\"10.0.0.1\"], authorizationPolicies: [default/sel]}\nservices:\n- {name: s, namespace: default, hostname: s.default, vips: [\"/10.96.0.1\"]}\npolicies:\n";

    fn file(policies: &[&str]) -> String {
        let mut s = GOOD.to_string();
        for p in policies {
            s.push_str("- ");
            s.push_str(p);
            s.push('\n');
        }
        s
    }

    const SEL: &str = "{name: sel, namespace: default, scope: WorkloadSelector, action: Allow, rules: [[[{destinationPorts: [80]}]]]}";
    const DENY: &str = "{name: d, namespace: default, scope: Namespace, action: Deny, rules: [[[{namespaces: [{exact: evil}]}]]]}";

    #[test]
    fn good_file_is_the_strict_parse() {
        let yaml = file(&[SEL, DENY]);
        let load = load_local_config("f.yaml", &yaml, None).unwrap();
        assert!(load.rejected.is_empty());
        assert_eq!(load.config, parse_local_config("f.yaml", &yaml).unwrap());
    }

    #[test]
    fn bad_policies_rejected_others_apply() {
        let bad_cidr = "{name: d, namespace: default, scope: Namespace, action: Deny, rules: [[[{sourceIps: [\"10.0.0.0/33\"]}]]]}";
        let unknown_field = "{name: sel, namespace: default, scope: WorkloadSelector, action: Allow, rules: [[[{sourceIp: [\"10.0.0.0/8\"]}]]]}";
        let other = "{name: ok, namespace: default, scope: Namespace, action: Allow, rules: [[[{destinationPorts: [81]}]]]}";
        let yaml = file(&[unknown_field, bad_cidr, other]);
        let load = load_local_config("f.yaml", &yaml, None).unwrap();
        let errors: Vec<String> = load.rejected.iter().map(|r| r.error.to_string()).collect();
        assert_eq!(
            errors,
            [
                "f.yaml: line 6, column 86: policies[0].rules[0][0][0].sourceIp: unknown field `sourceIp`, expected one of `namespaces`, `notNamespaces`, `serviceAccounts`, `notServiceAccounts`, `principals`, `notPrincipals`, `sourceIps`, `notSourceIps`, `destinationIps`, `notDestinationIps`, `destinationPorts`, `notDestinationPorts`, `paths`, `notPaths`, `methods`, `notMethods`, `hosts`, `notHosts`, `requestPrincipals`, `notRequestPrincipals`, `headers`, `notHeaders`, `remoteIps`, `notRemoteIps`, `when`",
                "f.yaml: line 7, column 88: policies[1].rules[0][0][0].sourceIps[0]: \"10.0.0.0/33\" is not an IP address or CIDR",
            ]
        );
        assert!(load
            .rejected
            .iter()
            .all(|r| r.kept == KeptVersion::FailClosed));
        // Workloads, services and the good policy apply; the bad ones fail closed.
        let s = ProxyState::from_config(load.config).unwrap();
        assert_eq!(s.workloads().count(), 1);
        assert_eq!(s.services().count(), 1);
        let keys: Vec<String> = s.policies().map(|p| p.key()).collect();
        assert_eq!(keys, ["default/d", "default/ok", "default/sel"]);
        assert!(s.policy_by_key("default/sel").unwrap().rules.is_empty());
        assert_eq!(
            s.policy_by_key("default/d").unwrap().rules,
            vec![Vec::<crate::Clause>::new()]
        );
        // The strict parser refuses the same file with the first error.
        assert_eq!(
            parse_local_config("f.yaml", &yaml).unwrap_err().to_string(),
            errors[0]
        );
    }

    /// A bad L7 value is a bad policy like any other: rejected alone, with the field
    /// named, its stand-in failing closed (or its last good version kept).
    #[test]
    fn a_bad_l7_value_rejects_its_policy_alone() {
        let allow = "{name: sel, namespace: default, scope: WorkloadSelector, action: Allow, rules: [[[{methods: [get]}]]]}";
        let deny = "{name: d, namespace: default, scope: Namespace, action: Deny, rules: [[[{when: [{key: destination.port, values: [\"0\"]}]}]]]}";
        let load = load_local_config("f.yaml", &file(&[allow, deny]), None).unwrap();
        let errors: Vec<String> = load.rejected.iter().map(|r| r.error.to_string()).collect();
        assert_eq!(
            errors,
            [
                "f.yaml: line 6, column 96: policies[0].rules[0][0][0].methods[0]: method \"get\" is not upper case; methods are compared case-sensitively and a request whose method is not upper case is refused, so it can never match; write \"GET\"",
                "f.yaml: line 7, column 116: policies[1].rules[0][0][0].when[0].values[0]: \"0\" is not a port number (1-65535)",
            ]
        );
        let s = ProxyState::from_config(load.config).unwrap();
        assert!(s.policy_by_key("default/sel").unwrap().rules.is_empty());
        assert_eq!(
            s.policy_by_key("default/d").unwrap().rules,
            vec![Vec::<crate::Clause>::new()]
        );
        // On a reload, the last good version stays.
        let first = load_local_config("f.yaml", &file(&[SEL, DENY]), None).unwrap();
        let second =
            load_local_config("f.yaml", &file(&[allow, DENY]), Some(&first.config)).unwrap();
        assert_eq!(second.rejected[0].kept, KeptVersion::Previous);
        assert_eq!(second.config, first.config);
    }

    #[test]
    fn reload_keeps_the_last_good_version() {
        let first = load_local_config("f.yaml", &file(&[SEL, DENY]), None).unwrap();
        let broken_sel = "{name: sel, namespace: default, scope: WorkloadSelector, action: Allow, rules: [[[{destinationPorts: [eighty]}]]]}";
        let second =
            load_local_config("f.yaml", &file(&[broken_sel, DENY]), Some(&first.config)).unwrap();
        assert_eq!(second.rejected.len(), 1);
        assert_eq!(second.rejected[0].key, "default/sel");
        assert_eq!(second.rejected[0].kept, KeptVersion::Previous);
        assert_eq!(second.config, first.config);
    }

    #[test]
    fn invalid_and_duplicate_policies() {
        let dup = "{name: d, namespace: default, scope: Global, action: Allow}";
        let ns_less = "{name: n, scope: Namespace, action: Deny}";
        let yaml = file(&[SEL, DENY, dup]);
        let load = load_local_config("f.yaml", &yaml, None).unwrap();
        assert_eq!(
            load.rejected[0].error.to_string(),
            "f.yaml: line 8, column 3: policies[2] (default/d): duplicate of policies[1]"
        );
        assert_eq!(load.config.policies.len(), 2);
        assert_eq!(load.config.policies[1].action, PolicyAction::Deny);
        // A policy that cannot stand for anything refuses the file.
        let err = load_local_config("f.yaml", &file(&[SEL, ns_less]), None).unwrap_err();
        assert_eq!(
            err.to_string(),
            "f.yaml: line 7, column 3: policies[1] (/n): namespace: a Namespace-scoped policy needs a namespace"
        );
        let nameless =
            "{namespace: default, scope: Global, action: Deny, rules: [[[{sourceIps: [x]}]]]}";
        assert!(load_local_config("f.yaml", &file(&[SEL, nameless]), None).is_err());
        // Bad workloads refuse the file.
        let bad = "workloads:\n- {name: a, namespace: default, workloadIps: [\"10.0.0.300\"]}\n";
        assert!(load_local_config("f.yaml", bad, None).is_err());
    }

    #[test]
    fn null_and_empty_policy_sections() {
        for yaml in ["policies:\n", "policies: ~\n", "policies: []\n"] {
            let load = load_local_config("f", yaml, None).unwrap();
            assert!(load.config.policies.is_empty(), "{yaml}");
            assert!(parse_local_config("f", yaml).unwrap().policies.is_empty());
        }
        let err = parse_local_config("f", "policies: 3\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("expected a sequence"), "{err}");
        assert!(load_local_config("f", "policies: 3\n", None).is_err());
    }

    #[test]
    fn apply_local_change_diffs() {
        let (old, mut live) =
            LocalFile::build(load_local_config("f", &file(&[SEL, DENY]), None).unwrap()).unwrap();
        // Something from xDS that the file does not name.
        live.insert_policy(Authorization {
            name: "x".into(),
            namespace: "xds".into(),
            scope: PolicyScope::Global,
            action: PolicyAction::Allow,
            rules: Vec::new(),
            dry_run: false,
        })
        .unwrap();
        let generation = live.policy_generation();
        // Unchanged: nothing touched.
        live.apply_local_change(&old, &old);
        assert_eq!(live.policy_generation(), generation);
        let (new, _) =
            LocalFile::build(load_local_config("f", &file(&[SEL]), None).unwrap()).unwrap();
        live.apply_local_change(&old, &new);
        let keys: Vec<String> = live.policies().map(|p| p.key()).collect();
        assert_eq!(keys, ["default/sel", "xds/x"]);
        assert!(live.policy_generation() > generation);
    }
}
