//! The connections one proxy instance has open, for `/config_dump`'s `workloadState`
//! (`connections: {inbound: [...], outbound: [...]}`, as ztunnel lists them): each entry
//! lives while its [`Tracked`] guard does.
//!
//! Inbound connections that policy allowed are also kept with what they were authorized
//! on, so that when the policies change they are checked again and the ones now denied
//! are closed ([`OpenConnections::recheck`]), as ztunnel does.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use ambit_state::{authorize_observed, Denied, ProxyState, RbacContext, RbacObserver, Workload};
use serde::Serialize;
use tokio::sync::watch;

/// How a connection is carried.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Protocol {
    #[serde(rename = "HBONE")]
    Hbone,
    #[serde(rename = "TCP")]
    Tcp,
}

/// One open connection as ztunnel shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Connection {
    /// The client: the app's socket outbound, the HBONE or plaintext peer inbound.
    pub src: SocketAddr,
    /// What the app dialed (outbound only).
    pub original_dst: Option<SocketAddr>,
    /// Where we send it: the next hop outbound, the app inbound.
    pub actual_dst: SocketAddr,
    pub protocol: Protocol,
}

impl Connection {
    pub fn new(
        src: SocketAddr,
        original_dst: Option<SocketAddr>,
        actual_dst: SocketAddr,
        protocol: Protocol,
    ) -> Connection {
        Connection {
            src,
            original_dst,
            actual_dst,
            protocol,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    Inbound,
    Outbound,
}

struct Entry {
    direction: Direction,
    connection: Connection,
    policy: Option<Arc<PolicyWatch>>,
}

/// What an open inbound connection was authorized on, and how to revoke it.
struct PolicyWatch {
    ctx: RbacContext,
    /// The destination as last authorized against, and the policy generation then: while
    /// neither changed, the verdict cannot have changed either.
    checked: Mutex<(Arc<Workload>, u64)>,
    revoke: watch::Sender<Option<Denied>>,
}

#[derive(Default)]
struct Inner {
    next: u64,
    open: BTreeMap<u64, Entry>,
}

/// The open connections of one proxy instance, in the order they opened.
#[derive(Default)]
pub struct OpenConnections(Mutex<Inner>);

/// Removes its connection from the list when dropped.
pub struct Tracked {
    owner: Arc<OpenConnections>,
    id: u64,
}

#[derive(Debug, PartialEq, Eq, Serialize)]
pub struct ConnectionsDump {
    pub inbound: Vec<Connection>,
    pub outbound: Vec<Connection>,
}

impl OpenConnections {
    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn track(self: &Arc<Self>, direction: Direction, c: Connection) -> Tracked {
        let mut inner = self.inner();
        let id = inner.next;
        inner.next += 1;
        inner.open.insert(
            id,
            Entry {
                direction,
                connection: c,
                policy: None,
            },
        );
        Tracked {
            owner: self.clone(),
            id,
        }
    }

    pub fn dump(&self) -> ConnectionsDump {
        let inner = self.inner();
        let of = |d: Direction| {
            inner
                .open
                .values()
                .filter(|e| e.direction == d)
                .map(|e| e.connection.clone())
                .collect()
        };
        ConnectionsDump {
            inbound: of(Direction::Inbound),
            outbound: of(Direction::Outbound),
        }
    }
}

impl OpenConnections {
    /// Authorizes again, against `state`, every watched connection whose destination or
    /// policies changed since it was last authorized; each one now denied is told so (its
    /// relay closes it) and returned. `rbac` is told of the dry-run policies that match,
    /// as at the first authorization.
    pub fn recheck(
        &self,
        state: &ProxyState,
        rbac: &dyn RbacObserver,
    ) -> Vec<(Connection, Denied)> {
        // Copied out, so that connections opening and closing never wait for the checks.
        let watched: Vec<(Connection, Arc<PolicyWatch>)> = self
            .inner()
            .open
            .values()
            .filter_map(|e| Some((e.connection.clone(), e.policy.clone()?)))
            .collect();
        let generation = state.policy_generation();
        // Connections to one destination share its policies.
        let mut policies: std::collections::HashMap<String, Vec<Arc<ambit_state::Authorization>>> =
            std::collections::HashMap::new();
        let mut denied = Vec::new();
        for (connection, watch) in watched {
            if watch.revoke.borrow().is_some() {
                continue;
            }
            let mut checked = watch.checked.lock().unwrap_or_else(|p| p.into_inner());
            // A destination that left the state keeps its connections: what removal of a
            // workload means for them is not a policy decision.
            let Some(dst) = state.workload_by_uid(&checked.0.uid) else {
                continue;
            };
            if Arc::ptr_eq(&dst, &checked.0) && checked.1 == generation {
                continue;
            }
            let applying = policies
                .entry(dst.uid.to_string())
                .or_insert_with(|| state.policies_for(&dst));
            let verdict = authorize_observed(applying, &watch.ctx, rbac);
            *checked = (dst, generation);
            if let Err(d) = verdict {
                watch.revoke.send_replace(Some(d.clone()));
                denied.push((connection, d));
            }
        }
        denied
    }
}

impl Tracked {
    /// Keeps the connection's authorization inputs so a change of its destination or of
    /// the policies re-checks it; the returned [`Revoked`] completes if it is denied then.
    /// `policy_generation` is the state's when `ctx` was authorized against `dst`.
    pub fn watch_policy(
        &self,
        ctx: RbacContext,
        dst: Arc<Workload>,
        policy_generation: u64,
    ) -> Revoked {
        let (tx, rx) = watch::channel(None);
        if let Some(entry) = self.owner.inner().open.get_mut(&self.id) {
            entry.policy = Some(Arc::new(PolicyWatch {
                ctx,
                checked: Mutex::new((dst, policy_generation)),
                revoke: tx,
            }));
        }
        Revoked(rx)
    }
}

/// Completes when a policy change denied the connection.
pub struct Revoked(watch::Receiver<Option<Denied>>);

impl Revoked {
    pub async fn denied(mut self) -> Denied {
        let denied = match self.0.wait_for(Option::is_some).await {
            Ok(d) => d.clone(),
            Err(_) => None,
        };
        match denied {
            Some(d) => d,
            // The entry is gone: the connection is closing anyway.
            None => std::future::pending().await,
        }
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.owner.inner().open.remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_live_as_long_as_their_guard() {
        let open = Arc::new(OpenConnections::default());
        let c = |src: &str, protocol| Connection {
            src: src.parse().unwrap(),
            original_dst: None,
            actual_dst: "10.0.0.2:8080".parse().unwrap(),
            protocol,
        };
        let a = open.track(Direction::Outbound, c("10.0.0.1:1", Protocol::Hbone));
        let b = open.track(Direction::Inbound, c("10.0.0.3:2", Protocol::Tcp));
        let d = open.track(Direction::Outbound, c("10.0.0.1:3", Protocol::Tcp));
        let dump = open.dump();
        assert_eq!(dump.outbound.len(), 2);
        assert_eq!(dump.outbound[0].src.port(), 1, "in the order they opened");
        assert_eq!(dump.inbound, vec![c("10.0.0.3:2", Protocol::Tcp)]);
        drop(a);
        assert_eq!(open.dump().outbound, vec![c("10.0.0.1:3", Protocol::Tcp)]);
        drop((b, d));
        assert_eq!(
            serde_json::to_value(open.dump()).unwrap(),
            serde_json::json!({"inbound": [], "outbound": []})
        );
        let one = serde_json::to_value(c("10.0.0.1:1", Protocol::Hbone)).unwrap();
        assert_eq!(
            one,
            serde_json::json!({"src": "10.0.0.1:1", "originalDst": null, "actualDst": "10.0.0.2:8080", "protocol": "HBONE"})
        );
    }

    #[tokio::test]
    async fn a_policy_change_revokes_only_the_connections_it_denies() {
        let yaml = r#"
workloads:
- uid: server
  name: server
  namespace: shop
  workloadIps: [10.0.0.2]
  protocol: HBONE
"#;
        let cfg = ambit_state::parse_local_config("t", yaml).unwrap();
        let mut state = ProxyState::from_config(cfg).unwrap();
        let open = Arc::new(OpenConnections::default());
        let ctx = |sa: &str| RbacContext {
            source_identity: Some(
                ambit_identity::SpiffeId::parse(&format!("spiffe://cluster.local/ns/shop/sa/{sa}"))
                    .unwrap(),
            ),
            source_ip: "10.0.0.1".parse().unwrap(),
            destination: "10.0.0.2:8080".parse().unwrap(),
        };
        let conn = |port: u16| {
            Connection::new(
                SocketAddr::from(([10, 0, 0, 1], port)),
                None,
                "10.0.0.2:8080".parse().unwrap(),
                Protocol::Hbone,
            )
        };
        let bad = open.track(Direction::Inbound, conn(1));
        let server = state.workload_by_uid("server").unwrap();
        let bad_revoked = bad.watch_policy(ctx("bad"), server.clone(), state.policy_generation());
        let good = open.track(Direction::Inbound, conn(2));
        let good_revoked = good.watch_policy(ctx("good"), server, state.policy_generation());
        // Not watched (an outbound connection): never re-checked.
        let _out = open.track(Direction::Outbound, conn(3));

        assert!(
            open.recheck(&state, &ambit_state::Unobserved).is_empty(),
            "no policy yet: all allowed"
        );
        let deny: ambit_state::LocalConfig = ambit_state::parse_local_config(
            "t",
            r#"
policies:
- name: deny-bad
  namespace: shop
  scope: Namespace
  action: Deny
  rules:
  - - - principals: [!Exact "cluster.local/ns/shop/sa/bad"]
"#,
        )
        .unwrap();
        for p in deny.policies {
            state.insert_policy(p).unwrap();
        }
        let denied = open.recheck(&state, &ambit_state::Unobserved);
        assert_eq!(denied.len(), 1, "{denied:?}");
        assert_eq!(denied[0].0, conn(1));
        assert_eq!(denied[0].1.policy.as_deref(), Some("shop/deny-bad"));
        let d = tokio::time::timeout(std::time::Duration::from_secs(5), bad_revoked.denied())
            .await
            .expect("the denied connection is told");
        assert!(d.reason.contains("shop/deny-bad"), "{d:?}");
        // Told once; the allowed one is never told.
        assert!(open.recheck(&state, &ambit_state::Unobserved).is_empty());
        let still =
            tokio::time::timeout(std::time::Duration::from_millis(50), good_revoked.denied()).await;
        assert!(still.is_err(), "the allowed connection stays open");
    }

    /// A re-check tells the observer it is given of the dry-run policies that match, as
    /// the first authorization does.
    #[tokio::test]
    async fn a_recheck_tells_its_observer_of_dry_run_matches() {
        let yaml = r#"
workloads:
- {uid: server, name: server, namespace: shop, workloadIps: [10.0.0.2], protocol: HBONE}
"#;
        let mut state = ProxyState::from_yaml("t", yaml).unwrap();
        let open = Arc::new(OpenConnections::default());
        let ctx = RbacContext {
            source_identity: None,
            source_ip: "10.0.0.1".parse().unwrap(),
            destination: "10.0.0.2:8080".parse().unwrap(),
        };
        let c = Connection::new(
            "10.0.0.1:1".parse().unwrap(),
            None,
            "10.0.0.2:8080".parse().unwrap(),
            Protocol::Tcp,
        );
        let tracked = open.track(Direction::Inbound, c);
        let server = state.workload_by_uid("server").unwrap();
        let _revoked = tracked.watch_policy(ctx, server, state.policy_generation());
        let dry = ambit_state::parse_local_config(
            "t",
            "policies:\n- {name: audit, namespace: shop, scope: Namespace, action: Deny, dryRun: true, rules: [[]]}\n",
        )
        .unwrap();
        for p in dry.policies {
            state.insert_policy(p).unwrap();
        }
        let seen = Mutex::new(Vec::new());
        let observer = |p: &ambit_state::Authorization| seen.lock().unwrap().push(p.key());
        assert!(open.recheck(&state, &observer).is_empty(), "not enforced");
        assert_eq!(*seen.lock().unwrap(), ["shop/audit"]);
    }

    #[tokio::test]
    async fn a_changed_destination_is_rechecked_with_unchanged_policies() {
        // A WORKLOAD_SELECTOR deny that no workload selects yet.
        let yaml = r#"
workloads:
- uid: server
  name: server
  namespace: shop
  workloadIps: [10.0.0.2]
  protocol: HBONE
policies:
- name: deny-all
  namespace: shop
  scope: WorkloadSelector
  action: Deny
  rules:
  - - - namespaces: [!Exact "shop"]
"#;
        let cfg = ambit_state::parse_local_config("t", yaml).unwrap();
        let mut state = ProxyState::from_config(cfg.clone()).unwrap();
        let open = Arc::new(OpenConnections::default());
        let ctx = RbacContext {
            source_identity: Some(
                ambit_identity::SpiffeId::parse("spiffe://cluster.local/ns/shop/sa/client")
                    .unwrap(),
            ),
            source_ip: "10.0.0.1".parse().unwrap(),
            destination: "10.0.0.2:8080".parse().unwrap(),
        };
        let conn = open.track(
            Direction::Inbound,
            Connection::new(
                "10.0.0.1:1".parse().unwrap(),
                None,
                "10.0.0.2:8080".parse().unwrap(),
                Protocol::Hbone,
            ),
        );
        let server = state.workload_by_uid("server").unwrap();
        let revoked = conn.watch_policy(ctx, server, state.policy_generation());
        let policies = state.policy_generation();
        assert!(
            open.recheck(&state, &ambit_state::Unobserved).is_empty(),
            "nothing selects the deny yet"
        );
        // The server now selects the policy: the policies are the same, the workload not.
        let mut selecting = cfg.workloads[0].clone();
        selecting.authorization_policies = vec!["shop/deny-all".into()];
        state.insert_workload(selecting).unwrap();
        assert_eq!(state.policy_generation(), policies);
        let denied = open.recheck(&state, &ambit_state::Unobserved);
        assert_eq!(denied.len(), 1, "{denied:?}");
        let d = tokio::time::timeout(std::time::Duration::from_secs(5), revoked.denied())
            .await
            .expect("the connection is told");
        assert_eq!(d.policy.as_deref(), Some("shop/deny-all"));
    }
}
