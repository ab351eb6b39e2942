//! Who is at the other end of a ZDS socket, and whether we talk to them.
//!
//! The ZDS socket hands out pod network namespaces (agent → proxy) and decides which pods
//! are proxied (proxy → agent), so both ends check the kernel's record of the peer
//! (`SO_PEERCRED`: the credentials at `connect`/`listen` time) before trusting it. The file
//! modes ([`crate::sockfile`]) are the first fence; this is the second, for a peer that got
//! past them (a loosened mode, `CAP_DAC_OVERRIDE` without being root).
//!
//! Allowed: uid 0, our own effective uid (such a peer can already do anything we can), and
//! one configured uid.

use std::fmt;

/// The peer's credentials as the kernel recorded them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerCredentials {
    pub pid: i32,
    pub uid: u32,
    pub gid: u32,
}

impl fmt::Display for PeerCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pid {} uid {} gid {}", self.pid, self.uid, self.gid)
    }
}

/// Which end we check: named in errors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerRole {
    /// The agent checks the node proxy that connected.
    NodeProxy,
    /// The node proxy checks the agent it connected to.
    NodeAgent,
}

impl fmt::Display for PeerRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PeerRole::NodeProxy => "node proxy",
            PeerRole::NodeAgent => "node agent",
        })
    }
}

/// A peer we refuse to talk to.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "refusing the {role} at the other end of the ZDS socket ({peer}): only uid 0, uid {own} \
     (ours){configured} may use it; run the {role} as root or allow its uid"
)]
pub struct PeerRefused {
    pub role: PeerRole,
    pub peer: PeerCredentials,
    own: u32,
    configured: String,
}

/// The uids we accept at the other end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerPolicy {
    /// Our own effective uid.
    own_uid: u32,
    /// One more allowed uid (for a peer that runs unprivileged with capabilities).
    extra_uid: Option<u32>,
}

impl PeerPolicy {
    /// Root, our own effective uid, and `extra_uid` if given.
    pub fn new(extra_uid: Option<u32>) -> PeerPolicy {
        PeerPolicy::with_own_uid(nix::unistd::geteuid().as_raw(), extra_uid)
    }

    /// [`PeerPolicy::new`] with our uid given (tests).
    pub fn with_own_uid(own_uid: u32, extra_uid: Option<u32>) -> PeerPolicy {
        PeerPolicy { own_uid, extra_uid }
    }

    /// Whether `peer` may talk to us.
    pub fn check(&self, role: PeerRole, peer: PeerCredentials) -> Result<(), PeerRefused> {
        if peer.uid == 0 || peer.uid == self.own_uid || Some(peer.uid) == self.extra_uid {
            return Ok(());
        }
        Err(PeerRefused {
            role,
            peer,
            own: self.own_uid,
            configured: self
                .extra_uid
                .map(|u| format!(" or the configured uid {u}"))
                .unwrap_or_default(),
        })
    }
}

impl Default for PeerPolicy {
    fn default() -> Self {
        PeerPolicy::new(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(uid: u32) -> PeerCredentials {
        PeerCredentials {
            pid: 42,
            uid,
            gid: uid,
        }
    }

    #[test]
    fn root_own_and_configured_uids_pass_others_are_refused() {
        let policy = PeerPolicy::with_own_uid(1000, Some(1337));
        for (uid, ok) in [
            (0, true),
            (1000, true),
            (1337, true),
            (65534, false),
            (1, false),
        ] {
            assert_eq!(
                policy.check(PeerRole::NodeProxy, peer(uid)).is_ok(),
                ok,
                "uid {uid}"
            );
        }
        let err = policy.check(PeerRole::NodeAgent, peer(65534)).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("node agent") && msg.contains("uid 65534"),
            "{msg}"
        );
        assert!(msg.contains("configured uid 1337"), "{msg}");
        let plain = PeerPolicy::with_own_uid(0, None)
            .check(PeerRole::NodeProxy, peer(7))
            .unwrap_err()
            .to_string();
        assert!(!plain.contains("configured"), "{plain}");
    }
}
