//! The in-pod rule set (reference `istio-cni.md` §2.1, with the §2.2 DNS and ingress
//! variants).

// Istio's ports, marks, table and addresses, shared with the node proxy.
use ambit_wellknown::marks::{MASK as MARK_MASK, PROXY as PROXY_MARK, RETURN as RETURN_MARK};
use ambit_wellknown::ports::{
    DNS as DNS_PORT, HBONE as HBONE_PORT, INBOUND_PLAINTEXT as INBOUND_PLAINTEXT_PORT,
    OUTBOUND as OUTBOUND_PORT,
};

use super::family::Family;
use super::set::{Ownership, Rule, RuleSet, TableRules};

/// In-pod chain hooked to `PREROUTING`.
pub const PRERT_CHAIN: &str = "ISTIO_PRERT";
/// In-pod chain hooked to `OUTPUT`.
pub const OUTPUT_CHAIN: &str = "ISTIO_OUTPUT";
/// Every chain whose name starts with this is ours (and Istio's) inside a pod netns.
pub const OWNED_CHAIN_PREFIX: &str = "ISTIO_";

/// Per-pod choices that change the in-pod rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PodRuleOptions {
    /// Redirect DNS to 15053 and put the proxy's DNS traffic in conntrack zone 1 (`raw`).
    pub dns_capture: bool,
    /// Also install the IPv6 twin (ip6tables, and the v6 return-path rule and route).
    pub ipv6: bool,
    /// "Ingress mode": no inbound capture (no probe accept, no redirect to 15006).
    pub bypass_inbound: bool,
}

impl Default for PodRuleOptions {
    /// Istio's chart defaults: DNS capture on, IPv6 on, inbound captured.
    fn default() -> Self {
        PodRuleOptions {
            dns_capture: true,
            ipv6: true,
            bypass_inbound: false,
        }
    }
}

impl PodRuleOptions {
    /// The families these options install rules for (v4 always, v6 if enabled).
    pub fn families(&self) -> Vec<Family> {
        if self.ipv6 {
            Family::ALL.to_vec()
        } else {
            vec![Family::V4]
        }
    }
}

/// The in-pod rule set for one family (§2.1, with the §2.2 DNS and ingress variants).
pub fn pod_rules(family: Family, opts: &PodRuleOptions) -> RuleSet {
    let lo = family.loopback();
    let probe = family.probe_snat().to_string();
    let (m, k) = (PROXY_MARK, MARK_MASK);
    let r = RETURN_MARK;

    let mangle = TableRules {
        table: "mangle".into(),
        new_chains: vec![PRERT_CHAIN.into(), OUTPUT_CHAIN.into()],
        rules: vec![
            Rule::append("PREROUTING", format!("-j {PRERT_CHAIN}")),
            Rule::append("OUTPUT", format!("-j {OUTPUT_CHAIN}")),
            Rule::append(
                PRERT_CHAIN,
                format!("-m mark --mark {m:#x}/{k:#x} -j CONNMARK --set-xmark {r:#x}/{k:#x}"),
            ),
            Rule::append(
                OUTPUT_CHAIN,
                format!(
                    "-m connmark --mark {r:#x}/{k:#x} -j CONNMARK --restore-mark \
                     --nfmask 0xffffffff --ctmask 0xffffffff"
                ),
            ),
        ],
    };

    let mut nat_rules = vec![
        Rule::append("OUTPUT", format!("-j {OUTPUT_CHAIN}")),
        Rule::append("PREROUTING", format!("-j {PRERT_CHAIN}")),
    ];
    if !opts.bypass_inbound {
        nat_rules.push(Rule::append(
            PRERT_CHAIN,
            format!("-s {probe} -p tcp -m tcp -j ACCEPT"),
        ));
    }
    nat_rules.push(Rule::append(
        OUTPUT_CHAIN,
        format!("-d {probe} -p tcp -m tcp -j ACCEPT"),
    ));
    if !opts.bypass_inbound {
        nat_rules.push(Rule::append(
            PRERT_CHAIN,
            format!(
                "! -d {lo} -p tcp ! --dport {HBONE_PORT} -m mark ! --mark {m:#x}/{k:#x} \
                 -j REDIRECT --to-ports {INBOUND_PLAINTEXT_PORT}"
            ),
        ));
    }
    if opts.dns_capture {
        nat_rules.push(Rule::append(
            OUTPUT_CHAIN,
            format!(
                "! -o lo -p udp -m mark ! --mark {m:#x}/{k:#x} -m udp --dport 53 \
                 -j REDIRECT --to-port {DNS_PORT}"
            ),
        ));
        nat_rules.push(Rule::append(
            OUTPUT_CHAIN,
            format!(
                "! -d {lo} -p tcp --dport 53 -m mark ! --mark {m:#x}/{k:#x} \
                 -j REDIRECT --to-ports {DNS_PORT}"
            ),
        ));
    }
    nat_rules.extend([
        Rule::append(
            OUTPUT_CHAIN,
            format!("-p tcp -m mark --mark {r:#x}/{k:#x} -j ACCEPT"),
        ),
        Rule::append(OUTPUT_CHAIN, format!("! -d {lo} -o lo -j ACCEPT")),
        Rule::append(
            OUTPUT_CHAIN,
            format!(
                "! -d {lo} -p tcp -m mark ! --mark {m:#x}/{k:#x} \
                 -j REDIRECT --to-ports {OUTBOUND_PORT}"
            ),
        ),
    ]);
    let nat = TableRules {
        table: "nat".into(),
        new_chains: vec![PRERT_CHAIN.into(), OUTPUT_CHAIN.into()],
        rules: nat_rules,
    };

    let mut tables = vec![mangle, nat];
    if opts.dns_capture {
        tables.push(TableRules {
            table: "raw".into(),
            new_chains: vec![OUTPUT_CHAIN.into(), PRERT_CHAIN.into()],
            rules: vec![
                Rule::append("PREROUTING", format!("-j {PRERT_CHAIN}")),
                Rule::append("OUTPUT", format!("-j {OUTPUT_CHAIN}")),
                Rule::append(
                    OUTPUT_CHAIN,
                    format!("-p udp -m mark --mark {m:#x}/{k:#x} -m udp --dport 53 -j CT --zone 1"),
                ),
                Rule::append(
                    PRERT_CHAIN,
                    format!(
                        "-p udp -m mark ! --mark {m:#x}/{k:#x} -m udp --sport 53 -j CT --zone 1"
                    ),
                ),
            ],
        });
    }
    RuleSet {
        family,
        tables,
        ownership: Ownership::Prefix(OWNED_CHAIN_PREFIX.into()),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    const V4_DNS: &str = "\
*mangle
-N ISTIO_PRERT
-N ISTIO_OUTPUT
-A PREROUTING -j ISTIO_PRERT
-A OUTPUT -j ISTIO_OUTPUT
-A ISTIO_PRERT -m mark --mark 0x539/0xfff -j CONNMARK --set-xmark 0x111/0xfff
-A ISTIO_OUTPUT -m connmark --mark 0x111/0xfff -j CONNMARK --restore-mark --nfmask 0xffffffff --ctmask 0xffffffff
COMMIT
*nat
-N ISTIO_PRERT
-N ISTIO_OUTPUT
-A OUTPUT -j ISTIO_OUTPUT
-A PREROUTING -j ISTIO_PRERT
-A ISTIO_PRERT -s 169.254.7.127 -p tcp -m tcp -j ACCEPT
-A ISTIO_OUTPUT -d 169.254.7.127 -p tcp -m tcp -j ACCEPT
-A ISTIO_PRERT ! -d 127.0.0.1/32 -p tcp ! --dport 15008 -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15006
-A ISTIO_OUTPUT ! -o lo -p udp -m mark ! --mark 0x539/0xfff -m udp --dport 53 -j REDIRECT --to-port 15053
-A ISTIO_OUTPUT ! -d 127.0.0.1/32 -p tcp --dport 53 -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15053
-A ISTIO_OUTPUT -p tcp -m mark --mark 0x111/0xfff -j ACCEPT
-A ISTIO_OUTPUT ! -d 127.0.0.1/32 -o lo -j ACCEPT
-A ISTIO_OUTPUT ! -d 127.0.0.1/32 -p tcp -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15001
COMMIT
*raw
-N ISTIO_OUTPUT
-N ISTIO_PRERT
-A PREROUTING -j ISTIO_PRERT
-A OUTPUT -j ISTIO_OUTPUT
-A ISTIO_OUTPUT -p udp -m mark --mark 0x539/0xfff -m udp --dport 53 -j CT --zone 1
-A ISTIO_PRERT -p udp -m mark ! --mark 0x539/0xfff -m udp --sport 53 -j CT --zone 1
COMMIT
";

    const V4_NO_DNS: &str = "\
*mangle
-N ISTIO_PRERT
-N ISTIO_OUTPUT
-A PREROUTING -j ISTIO_PRERT
-A OUTPUT -j ISTIO_OUTPUT
-A ISTIO_PRERT -m mark --mark 0x539/0xfff -j CONNMARK --set-xmark 0x111/0xfff
-A ISTIO_OUTPUT -m connmark --mark 0x111/0xfff -j CONNMARK --restore-mark --nfmask 0xffffffff --ctmask 0xffffffff
COMMIT
*nat
-N ISTIO_PRERT
-N ISTIO_OUTPUT
-A OUTPUT -j ISTIO_OUTPUT
-A PREROUTING -j ISTIO_PRERT
-A ISTIO_PRERT -s 169.254.7.127 -p tcp -m tcp -j ACCEPT
-A ISTIO_OUTPUT -d 169.254.7.127 -p tcp -m tcp -j ACCEPT
-A ISTIO_PRERT ! -d 127.0.0.1/32 -p tcp ! --dport 15008 -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15006
-A ISTIO_OUTPUT -p tcp -m mark --mark 0x111/0xfff -j ACCEPT
-A ISTIO_OUTPUT ! -d 127.0.0.1/32 -o lo -j ACCEPT
-A ISTIO_OUTPUT ! -d 127.0.0.1/32 -p tcp -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15001
COMMIT
";

    const V6_DNS: &str = "\
*mangle
-N ISTIO_PRERT
-N ISTIO_OUTPUT
-A PREROUTING -j ISTIO_PRERT
-A OUTPUT -j ISTIO_OUTPUT
-A ISTIO_PRERT -m mark --mark 0x539/0xfff -j CONNMARK --set-xmark 0x111/0xfff
-A ISTIO_OUTPUT -m connmark --mark 0x111/0xfff -j CONNMARK --restore-mark --nfmask 0xffffffff --ctmask 0xffffffff
COMMIT
*nat
-N ISTIO_PRERT
-N ISTIO_OUTPUT
-A OUTPUT -j ISTIO_OUTPUT
-A PREROUTING -j ISTIO_PRERT
-A ISTIO_PRERT -s fd16:9254:7127:1337:ffff:ffff:ffff:ffff -p tcp -m tcp -j ACCEPT
-A ISTIO_OUTPUT -d fd16:9254:7127:1337:ffff:ffff:ffff:ffff -p tcp -m tcp -j ACCEPT
-A ISTIO_PRERT ! -d ::1/128 -p tcp ! --dport 15008 -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15006
-A ISTIO_OUTPUT ! -o lo -p udp -m mark ! --mark 0x539/0xfff -m udp --dport 53 -j REDIRECT --to-port 15053
-A ISTIO_OUTPUT ! -d ::1/128 -p tcp --dport 53 -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15053
-A ISTIO_OUTPUT -p tcp -m mark --mark 0x111/0xfff -j ACCEPT
-A ISTIO_OUTPUT ! -d ::1/128 -o lo -j ACCEPT
-A ISTIO_OUTPUT ! -d ::1/128 -p tcp -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15001
COMMIT
*raw
-N ISTIO_OUTPUT
-N ISTIO_PRERT
-A PREROUTING -j ISTIO_PRERT
-A OUTPUT -j ISTIO_OUTPUT
-A ISTIO_OUTPUT -p udp -m mark --mark 0x539/0xfff -m udp --dport 53 -j CT --zone 1
-A ISTIO_PRERT -p udp -m mark ! --mark 0x539/0xfff -m udp --sport 53 -j CT --zone 1
COMMIT
";

    const V6_NO_DNS: &str = "\
*mangle
-N ISTIO_PRERT
-N ISTIO_OUTPUT
-A PREROUTING -j ISTIO_PRERT
-A OUTPUT -j ISTIO_OUTPUT
-A ISTIO_PRERT -m mark --mark 0x539/0xfff -j CONNMARK --set-xmark 0x111/0xfff
-A ISTIO_OUTPUT -m connmark --mark 0x111/0xfff -j CONNMARK --restore-mark --nfmask 0xffffffff --ctmask 0xffffffff
COMMIT
*nat
-N ISTIO_PRERT
-N ISTIO_OUTPUT
-A OUTPUT -j ISTIO_OUTPUT
-A PREROUTING -j ISTIO_PRERT
-A ISTIO_PRERT -s fd16:9254:7127:1337:ffff:ffff:ffff:ffff -p tcp -m tcp -j ACCEPT
-A ISTIO_OUTPUT -d fd16:9254:7127:1337:ffff:ffff:ffff:ffff -p tcp -m tcp -j ACCEPT
-A ISTIO_PRERT ! -d ::1/128 -p tcp ! --dport 15008 -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15006
-A ISTIO_OUTPUT -p tcp -m mark --mark 0x111/0xfff -j ACCEPT
-A ISTIO_OUTPUT ! -d ::1/128 -o lo -j ACCEPT
-A ISTIO_OUTPUT ! -d ::1/128 -p tcp -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15001
COMMIT
";

    const V4_INGRESS_NO_DNS: &str = "\
*mangle
-N ISTIO_PRERT
-N ISTIO_OUTPUT
-A PREROUTING -j ISTIO_PRERT
-A OUTPUT -j ISTIO_OUTPUT
-A ISTIO_PRERT -m mark --mark 0x539/0xfff -j CONNMARK --set-xmark 0x111/0xfff
-A ISTIO_OUTPUT -m connmark --mark 0x111/0xfff -j CONNMARK --restore-mark --nfmask 0xffffffff --ctmask 0xffffffff
COMMIT
*nat
-N ISTIO_PRERT
-N ISTIO_OUTPUT
-A OUTPUT -j ISTIO_OUTPUT
-A PREROUTING -j ISTIO_PRERT
-A ISTIO_OUTPUT -d 169.254.7.127 -p tcp -m tcp -j ACCEPT
-A ISTIO_OUTPUT -p tcp -m mark --mark 0x111/0xfff -j ACCEPT
-A ISTIO_OUTPUT ! -d 127.0.0.1/32 -o lo -j ACCEPT
-A ISTIO_OUTPUT ! -d 127.0.0.1/32 -p tcp -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15001
COMMIT
";

    pub(crate) fn opts(dns_capture: bool, bypass_inbound: bool) -> PodRuleOptions {
        PodRuleOptions {
            dns_capture,
            ipv6: true,
            bypass_inbound,
        }
    }

    #[test]
    fn golden_v4_with_dns() {
        assert_eq!(
            pod_rules(Family::V4, &opts(true, false)).restore_text(),
            V4_DNS
        );
    }

    #[test]
    fn golden_v4_without_dns() {
        assert_eq!(
            pod_rules(Family::V4, &opts(false, false)).restore_text(),
            V4_NO_DNS
        );
    }

    #[test]
    fn golden_v6_with_dns() {
        assert_eq!(
            pod_rules(Family::V6, &opts(true, false)).restore_text(),
            V6_DNS
        );
    }

    #[test]
    fn golden_v6_without_dns() {
        assert_eq!(
            pod_rules(Family::V6, &opts(false, false)).restore_text(),
            V6_NO_DNS
        );
    }

    #[test]
    fn golden_ingress_mode() {
        assert_eq!(
            pod_rules(Family::V4, &opts(false, true)).restore_text(),
            V4_INGRESS_NO_DNS
        );
    }

    #[test]
    fn golden_cleanup_and_check() {
        let set = pod_rules(Family::V4, &opts(true, false));
        assert_eq!(
            set.cleanup_text(),
            "*mangle\n-D PREROUTING -j ISTIO_PRERT\n-D OUTPUT -j ISTIO_OUTPUT\n\
             -F ISTIO_PRERT\n-F ISTIO_OUTPUT\n-X ISTIO_PRERT\n-X ISTIO_OUTPUT\nCOMMIT\n\
             *nat\n-D OUTPUT -j ISTIO_OUTPUT\n-D PREROUTING -j ISTIO_PRERT\n\
             -F ISTIO_PRERT\n-F ISTIO_OUTPUT\n-X ISTIO_PRERT\n-X ISTIO_OUTPUT\nCOMMIT\n\
             *raw\n-D PREROUTING -j ISTIO_PRERT\n-D OUTPUT -j ISTIO_OUTPUT\n\
             -F ISTIO_OUTPUT\n-F ISTIO_PRERT\n-X ISTIO_OUTPUT\n-X ISTIO_PRERT\nCOMMIT\n"
        );
        let check = set.check_text();
        assert_eq!(check.lines().filter(|l| l.starts_with("-C ")).count(), 18);
        assert!(check.contains("-C ISTIO_OUTPUT ! -d 127.0.0.1/32 -o lo -j ACCEPT\n"));
    }

    #[test]
    fn families_follow_options() {
        assert_eq!(opts(true, false).families(), vec![Family::V4, Family::V6]);
        let v4only = PodRuleOptions {
            ipv6: false,
            ..PodRuleOptions::default()
        };
        assert_eq!(v4only.families(), vec![Family::V4]);
        assert_eq!(
            Family::of("::ffff:10.0.0.1".parse().unwrap()),
            Family::V4,
            "mapped addresses are IPv4"
        );
        assert_eq!(Family::of("fd00::1".parse().unwrap()), Family::V6);
    }
}
