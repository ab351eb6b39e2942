//! Whether the network namespace a `/cmdadd` names may be captured for its pod, sans IO:
//! the `/proc` scan's rules ([`super::procscan`]) applied to a path the plugin sends.
//!
//! - Never the node's own netns (compared by device and inode with the agent's, the host
//!   `/proc`'s init's and the configured host netns): capture rules there would take the
//!   node's traffic.
//! - Never a netns the agent already captured for another pod.
//! - When the API server has the pod's IPs, the netns must hold one of them, and only they
//!   go into the host probe ipset (an IP there makes the node's traffic to it bypass the
//!   node proxy); the request's other IPs are dropped.
//! - At a pod's first ADD the API server has no IPs for it yet (the kubelet writes them
//!   once the sandbox is up, after the CNI call): then every IP of the request must be on
//!   the netns and none may be another live pod's.

use std::net::IpAddr;

/// What the agent found out about the request and the netns it names.
#[derive(Debug, Clone, Copy)]
pub struct Facts<'a> {
    /// The pod's IPs as the API server has them (`status.podIPs`).
    pub pod_ips: &'a [IpAddr],
    /// The request's IPs (the CNI result), unmapped.
    pub request_ips: &'a [IpAddr],
    /// The netns is the node's own.
    pub is_host: bool,
    /// Another pod (`namespace/name`) the agent holds in this same netns.
    pub captured_for: Option<&'a str>,
    /// The addresses on the netns's interfaces.
    pub addresses: &'a [IpAddr],
}

/// Why the netns is refused. Each names what is wrong; the plugin (or whoever called) sent
/// a netns that is not the pod's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error(
        "it is the node's own network namespace; capture rules there would take the node's traffic"
    )]
    Host,
    #[error("the node agent already captured pod {0} in it")]
    OtherPod(String),
    #[error(
        "it holds none of the pod's IPs {pod_ips:?} (from the API server); it is not the pod's"
    )]
    NoPodIp { pod_ips: Vec<IpAddr> },
    #[error("the request carries no IP and the API server has none for the pod: nothing ties the netns to the pod")]
    NoIps,
    #[error("it does not hold the request's IP {0}")]
    RequestIpMissing(IpAddr),
    #[error("the request's IP {ip} is pod {owner}'s")]
    IpOfOtherPod { ip: IpAddr, owner: String },
}

/// The IPs to enroll the pod with (its probe ipset entries), or why the netns is refused.
/// `owner_of(ip)` names another live pod that has `ip` (`None`: no other pod has it).
pub fn check(
    facts: &Facts<'_>,
    owner_of: impl Fn(IpAddr) -> Option<String>,
) -> Result<Vec<IpAddr>, Refusal> {
    if facts.is_host {
        return Err(Refusal::Host);
    }
    if let Some(other) = facts.captured_for {
        return Err(Refusal::OtherPod(other.to_owned()));
    }
    if !facts.pod_ips.is_empty() {
        if !facts.pod_ips.iter().any(|ip| facts.addresses.contains(ip)) {
            return Err(Refusal::NoPodIp {
                pod_ips: facts.pod_ips.to_vec(),
            });
        }
        return Ok(facts.pod_ips.to_vec());
    }
    if facts.request_ips.is_empty() {
        return Err(Refusal::NoIps);
    }
    for &ip in facts.request_ips {
        if !facts.addresses.contains(&ip) {
            return Err(Refusal::RequestIpMissing(ip));
        }
        if let Some(owner) = owner_of(ip) {
            return Err(Refusal::IpOfOtherPod { ip, owner });
        }
    }
    Ok(facts.request_ips.to_vec())
}

/// The IPs to look for in `/proc` when a request names no netns (the scan then ties the
/// netns to the pod by its processes' cgroup): the API server's, else the request's, none
/// of them another live pod's.
pub fn ips_without_netns(
    pod_ips: &[IpAddr],
    request_ips: &[IpAddr],
    owner_of: impl Fn(IpAddr) -> Option<String>,
) -> Result<Vec<IpAddr>, Refusal> {
    if !pod_ips.is_empty() {
        return Ok(pod_ips.to_vec());
    }
    if request_ips.is_empty() {
        return Err(Refusal::NoIps);
    }
    for &ip in request_ips {
        if let Some(owner) = owner_of(ip) {
            return Err(Refusal::IpOfOtherPod { ip, owner });
        }
    }
    Ok(request_ips.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ips(list: &[&str]) -> Vec<IpAddr> {
        list.iter().map(|s| s.parse().unwrap()).collect()
    }

    #[test]
    fn the_rules_in_order() {
        let pod = ips(&["10.0.0.5"]);
        let dual = ips(&["10.0.0.5", "fd00::5"]);
        let other = ips(&["10.0.0.9"]);
        let lo = ips(&["127.0.0.1"]);
        let netns_pod = ips(&["127.0.0.1", "10.0.0.5", "fd00::5"]);
        let netns_other = ips(&["127.0.0.1", "10.0.0.9"]);
        let none: Vec<IpAddr> = Vec::new();
        let v4_only = ips(&["10.0.0.5"]);
        let pod_and_other = ips(&["10.0.0.5", "10.0.0.9"]);
        let owner = |ip: IpAddr| (ip == other[0]).then(|| "shop/db".to_owned());
        type Want = Result<Vec<IpAddr>, Refusal>;
        let f = |pod_ips, request_ips, is_host, captured_for, addresses| Facts {
            pod_ips,
            request_ips,
            is_host,
            captured_for,
            addresses,
        };
        let cases: Vec<(&str, Facts, Want)> = vec![
            (
                "the host netns, even holding the pod's IP",
                f(&pod, &pod, true, None, &netns_pod),
                Err(Refusal::Host),
            ),
            (
                "another pod's capture",
                f(&pod, &pod, false, Some("shop/db"), &netns_pod),
                Err(Refusal::OtherPod("shop/db".into())),
            ),
            (
                "API IPs known: the netns holds one",
                f(&dual, &pod, false, None, &v4_only),
                Ok(dual.clone()),
            ),
            (
                "API IPs known: request IPs that are not the pod's are dropped",
                f(&pod, &pod_and_other, false, None, &netns_pod),
                Ok(pod.clone()),
            ),
            (
                "API IPs known: a netns without them is refused, whatever the request says",
                f(&pod, &other, false, None, &netns_other),
                Err(Refusal::NoPodIp {
                    pod_ips: pod.clone(),
                }),
            ),
            (
                "first ADD: the request's IPs, all on the netns",
                f(&none, &dual, false, None, &netns_pod),
                Ok(dual.clone()),
            ),
            (
                "first ADD: a request IP missing from the netns",
                f(&none, &dual, false, None, &v4_only),
                Err(Refusal::RequestIpMissing("fd00::5".parse().unwrap())),
            ),
            (
                "first ADD: another live pod's IP (its netns named)",
                f(&none, &other, false, None, &netns_other),
                Err(Refusal::IpOfOtherPod {
                    ip: other[0],
                    owner: "shop/db".into(),
                }),
            ),
            (
                "first ADD: no IP anywhere",
                f(&none, &none, false, None, &lo),
                Err(Refusal::NoIps),
            ),
        ];
        for (what, facts, want) in cases {
            assert_eq!(check(&facts, owner), want, "{what}");
        }
    }

    #[test]
    fn without_a_netns_the_api_servers_ips_win() {
        let pod = ips(&["10.0.0.5"]);
        let other = ips(&["10.0.0.9"]);
        let owner = |ip: IpAddr| (ip == other[0]).then(|| "shop/db".to_owned());
        assert_eq!(ips_without_netns(&pod, &other, owner), Ok(pod.clone()));
        assert_eq!(ips_without_netns(&[], &pod, owner), Ok(pod.clone()));
        assert_eq!(
            ips_without_netns(&[], &other, owner),
            Err(Refusal::IpOfOtherPod {
                ip: other[0],
                owner: "shop/db".into()
            })
        );
        assert_eq!(ips_without_netns(&[], &[], owner), Err(Refusal::NoIps));
    }

    #[test]
    fn refusals_say_what_is_wrong() {
        let text = Refusal::NoPodIp {
            pod_ips: ips(&["10.0.0.5"]),
        }
        .to_string();
        assert!(
            text.contains("10.0.0.5") && text.contains("API server"),
            "{text}"
        );
        assert!(Refusal::Host.to_string().contains("node's own"));
    }
}
