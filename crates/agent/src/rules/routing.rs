//! The return-path policy routing inside a pod, sans IO (reference `istio-cni.md` §0, §1.3).
//!
//! The node proxy answers inbound connections from the client's own address (a spoofed
//! source); the in-pod rules connmark them `0x111` and restore it as the fwmark of the
//! replies, which an `ip rule` sends to a table whose only route is `local` default via `lo`,
//! so the replies reach the proxy instead of leaving the pod. [`crate::netlink`] installs
//! this plan; here it is only described, and rendered the way `ip` prints it.

use ambit_wellknown::marks::{MASK as MARK_MASK, RETURN as RETURN_MARK};
use ambit_wellknown::routing::{RETURN_RULE_PRIORITY, RETURN_TABLE};

use super::family::Family;

/// The policy rule and the route of one family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReturnRouting {
    pub family: Family,
    /// The fwmark the rule matches, under `fwmask`.
    pub fwmark: u32,
    pub fwmask: u32,
    /// The rule's priority (`pref`).
    pub priority: u32,
    /// The table the rule selects and the route lives in.
    pub table: u32,
}

impl ReturnRouting {
    /// Istio's: `fwmark 0x111/0xfff pref 32764 lookup 100`, `local <any> dev lo table 100`.
    pub fn new(family: Family) -> ReturnRouting {
        ReturnRouting {
            family,
            fwmark: RETURN_MARK,
            fwmask: MARK_MASK,
            priority: RETURN_RULE_PRIORITY,
            table: RETURN_TABLE,
        }
    }

    /// The rule as `ip rule add` takes it (for messages).
    pub fn rule_text(&self) -> String {
        format!(
            "{} rule fwmark {:#x}/{:#x} pref {} lookup {}",
            self.family.ip_flag(),
            self.fwmark,
            self.fwmask,
            self.priority,
            self.table
        )
    }

    /// The route as `ip route add` takes it (for messages).
    pub fn route_text(&self) -> String {
        format!(
            "{} route local {} dev lo table {}",
            self.family.ip_flag(),
            self.family.any_route(),
            self.table
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_return_routing() {
        let v4 = ReturnRouting::new(Family::V4);
        assert_eq!(
            v4.rule_text(),
            "-4 rule fwmark 0x111/0xfff pref 32764 lookup 100"
        );
        assert_eq!(v4.route_text(), "-4 route local 0.0.0.0/0 dev lo table 100");
        let v6 = ReturnRouting::new(Family::V6);
        assert_eq!(
            v6.rule_text(),
            "-6 rule fwmark 0x111/0xfff pref 32764 lookup 100"
        );
        assert_eq!(v6.route_text(), "-6 route local ::/0 dev lo table 100");
        assert_eq!(
            (v6.fwmark, v6.fwmask, v6.priority, v6.table),
            (0x111, 0xfff, 32764, 100)
        );
    }
}
