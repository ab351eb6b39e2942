//! The host probe ipsets (reference §2.3), through the `ipset` tool.
//!
//! `istio-inpod-probes-v4` (`hash:ip family inet comment`) and `-v6` (`family inet6`) hold
//! the enrolled pods' IPs, each with the pod UID as its comment. Adds overwrite (an IP
//! reused by a new pod takes the new UID); removes delete an entry only when its comment is
//! the pod's UID, so reordered add/remove events for a reused IP are safe.
//!
//! Blocking: call from `spawn_blocking`.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use crate::exec::{self, ExecError};
use crate::iptables::ProbeSetNames;
use crate::rules::{split_words, unmap, Family};

/// One set member.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub ip: IpAddr,
    pub comment: Option<String>,
}

/// What [`ProbeSets::remove`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RemoveOutcome {
    /// The entry was there with this UID and is gone.
    Removed,
    /// No entry for the IP (or its family is disabled).
    NotPresent,
    /// The IP belongs to another pod now (its comment); the entry was kept.
    OtherOwner(String),
}

/// The probe sets of one netns.
#[derive(Clone, Debug)]
pub struct ProbeSets {
    pub names: ProbeSetNames,
    /// The netns the sets live in (`None`: the agent's own).
    pub netns: Option<PathBuf>,
    /// Whether the v6 set is managed.
    pub ipv6: bool,
}

impl ProbeSets {
    pub fn new(names: ProbeSetNames, netns: Option<PathBuf>, ipv6: bool) -> ProbeSets {
        ProbeSets { names, netns, ipv6 }
    }

    fn families(&self) -> Vec<Family> {
        if self.ipv6 {
            Family::ALL.to_vec()
        } else {
            vec![Family::V4]
        }
    }

    fn run(&self, args: &[&str]) -> Result<String, ExecError> {
        exec::run(self.netns.as_deref(), "ipset", args, None)
    }

    fn netns(&self) -> Option<&Path> {
        self.netns.as_deref()
    }

    /// Creates the sets if missing (`-exist`).
    pub fn ensure(&self) -> Result<(), ExecError> {
        for f in self.families() {
            self.run(&[
                "create",
                self.names.for_family(f),
                "hash:ip",
                "family",
                f.ipset_family(),
                "comment",
                "-exist",
            ])?;
        }
        Ok(())
    }

    /// Empties the sets.
    pub fn flush(&self) -> Result<(), ExecError> {
        for f in self.families() {
            self.run(&["flush", self.names.for_family(f)])?;
        }
        Ok(())
    }

    /// Destroys the sets (full uninstall). Missing sets are fine; a set still referenced by
    /// a rule cannot be destroyed (remove the host rules first).
    pub fn destroy(&self) -> Result<(), ExecError> {
        for f in Family::ALL {
            match self.run(&["destroy", self.names.for_family(f)]) {
                Ok(_) => {}
                Err(e) if e.stderr().contains("does not exist") => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Whether the family of `ip` is managed; logs when it is not.
    fn managed(&self, ip: IpAddr) -> Option<Family> {
        let family = Family::of(ip);
        if family == Family::V6 && !self.ipv6 {
            tracing::debug!(%ip, "IPv6 disabled: not in the probe sets");
            return None;
        }
        Some(family)
    }

    /// Adds (or re-owns) `ip` with comment `uid`.
    pub fn add(&self, ip: IpAddr, uid: &str) -> Result<(), ExecError> {
        let ip = unmap(ip);
        let Some(family) = self.managed(ip) else {
            return Ok(());
        };
        let ip = ip.to_string();
        self.run(&[
            "add",
            self.names.for_family(family),
            &ip,
            "comment",
            uid,
            "-exist",
        ])
        .map(drop)
    }

    /// The members of the `family` set.
    pub fn entries(&self, family: Family) -> Result<Vec<Entry>, ExecError> {
        let name = self.names.for_family(family);
        let text = self.run(&["save", name])?;
        Ok(parse_save(&text, name))
    }

    /// Removes `ip` if (and only if) its comment is `uid`.
    pub fn remove(&self, ip: IpAddr, uid: &str) -> Result<RemoveOutcome, ExecError> {
        let ip = unmap(ip);
        let Some(family) = self.managed(ip) else {
            return Ok(RemoveOutcome::NotPresent);
        };
        let Some(entry) = self.entries(family)?.into_iter().find(|e| e.ip == ip) else {
            return Ok(RemoveOutcome::NotPresent);
        };
        match entry.comment {
            Some(c) if c == uid => {}
            other => {
                let owner = other.unwrap_or_default();
                tracing::warn!(
                    %ip, uid, owner = %owner,
                    netns = %exec::netns_label(self.netns()),
                    "probe set entry belongs to another pod (IP reused?); kept"
                );
                return Ok(RemoveOutcome::OtherOwner(owner));
            }
        }
        let ip_s = ip.to_string();
        match self.run(&["del", self.names.for_family(family), &ip_s]) {
            Ok(_) => Ok(RemoveOutcome::Removed),
            // Removed concurrently.
            Err(e) if e.stderr().contains("not added") => Ok(RemoveOutcome::NotPresent),
            Err(e) => Err(e),
        }
    }

    /// Flushes the sets and fills them with `members` (`(ip, uid)`): the startup resync.
    pub fn refill<'a>(
        &self,
        members: impl IntoIterator<Item = (IpAddr, &'a str)>,
    ) -> Result<(), ExecError> {
        self.flush()?;
        for (ip, uid) in members {
            self.add(ip, uid)?;
        }
        Ok(())
    }
}

/// Parses `ipset save <name>` output: the `add <name> <ip> [comment "..."]` lines. Other
/// lines and other sets' members are ignored (so `ipset save` of every set works too).
pub fn parse_save(text: &str, name: &str) -> Vec<Entry> {
    text.lines()
        .filter_map(|line| {
            let w = split_words(line);
            if w.len() < 3 || w[0] != "add" || w[1] != name {
                return None;
            }
            let ip: IpAddr = w[2].parse().ok()?;
            // Options follow the member; a set named `comment` is not one.
            let options = &w[3..];
            let comment = options
                .iter()
                .position(|t| t == "comment")
                .and_then(|i| options.get(i + 1).cloned());
            Some(Entry { ip, comment })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_save_lines() {
        let text =
            "create s hash:ip family inet hashsize 1024 maxelem 65536 comment bucketsize 12\n\
                    add s 10.1.2.3 comment \"uid-1\"\n\
                    add s 10.1.2.4 comment \"uid 2\"\n\
                    add other 10.9.9.9 comment \"x\"\n\
                    add s 10.1.2.5\n";
        // A set called `comment`: its name is not the option.
        assert_eq!(
            parse_save("add comment 10.0.0.9 timeout 5\n", "comment"),
            vec![Entry {
                ip: "10.0.0.9".parse().unwrap(),
                comment: None
            }]
        );
        assert_eq!(
            parse_save(text, "s"),
            vec![
                Entry {
                    ip: "10.1.2.3".parse().unwrap(),
                    comment: Some("uid-1".into())
                },
                Entry {
                    ip: "10.1.2.4".parse().unwrap(),
                    comment: Some("uid 2".into())
                },
                Entry {
                    ip: "10.1.2.5".parse().unwrap(),
                    comment: None
                },
            ]
        );
    }
}
