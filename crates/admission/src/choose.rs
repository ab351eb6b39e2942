//! The admission decision: admit, evict one holder for the newcomer, or refuse. Pure:
//! the caller passes the counts and, when a share is spent, the holders to pick from.

use std::net::IpAddr;

/// The shares of a gate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Holders at once.
    pub total: usize,
    /// Holders from one source IP at once.
    pub per_source: usize,
}

impl Limits {
    /// `total` holders, a quarter of them per source (at least one): one source cannot
    /// take more than a quarter, so four are needed to fill the gate.
    pub fn quarter_per_source(total: usize) -> Limits {
        Limits {
            total,
            per_source: (total / 4).max(1),
        }
    }
}

/// How far an unproven holder has got, and since when. Orders from stalest (evicted
/// first) to freshest: a lower stage first, then the longer without progress, then the
/// older admission.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Standing {
    /// How far along its handshake (higher is further).
    pub stage: u8,
    /// When it last made progress, in any monotonic unit.
    pub since: u64,
    /// Its admission number (a tie-break: older first).
    pub id: u64,
}

/// One holder, as the decision sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Held {
    pub source: IpAddr,
    /// `None` once it has proved itself: it is never evicted.
    pub standing: Option<Standing>,
}

/// Which share was spent when a newcomer is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Full {
    /// The source already holds this many, all proven.
    Source(usize),
    /// The gate already holds this many, all proven.
    Total(usize),
}

impl std::fmt::Display for Full {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Full::Source(n) => write!(f, "this source already holds {n} connections"),
            Full::Total(n) => write!(f, "{n} connections are already held"),
        }
    }
}

/// What to do with a newcomer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Admit,
    /// Admit it, and evict the holder with this id.
    Evict(u64),
    Refuse(Full),
}

/// Decides a newcomer from `source`, given what the gate holds: `from_source` of
/// `total` holders are from that source, and `held` lists every holder (read only when
/// a share is spent).
///
/// A spent source share evicts that source's stalest unproven holder; a spent total
/// evicts the stalest unproven holder of all. Either refuses when there is none.
pub fn choose<'a>(
    limits: Limits,
    source: IpAddr,
    from_source: usize,
    total: usize,
    held: impl IntoIterator<Item = &'a Held>,
) -> Verdict {
    let source_full = from_source >= limits.per_source;
    if !source_full && total < limits.total {
        return Verdict::Admit;
    }
    let stalest = held
        .into_iter()
        .filter(|h| !source_full || h.source == source)
        .filter_map(|h| h.standing)
        .min();
    match stalest {
        Some(s) => Verdict::Evict(s.id),
        None if source_full => Verdict::Refuse(Full::Source(limits.per_source)),
        None => Verdict::Refuse(Full::Total(limits.total)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    fn unproven(source: u8, stage: u8, since: u64, id: u64) -> Held {
        Held {
            source: ip(source),
            standing: Some(Standing { stage, since, id }),
        }
    }

    fn proven(source: u8) -> Held {
        Held {
            source: ip(source),
            standing: None,
        }
    }

    const LIMITS: Limits = Limits {
        total: 4,
        per_source: 2,
    };

    #[test]
    fn decisions() {
        struct Case {
            name: &'static str,
            held: Vec<Held>,
            from: u8,
            want: Verdict,
        }
        let cases = [
            Case {
                name: "room in both shares",
                held: vec![unproven(1, 0, 5, 1)],
                from: 1,
                want: Verdict::Admit,
            },
            Case {
                name: "source full: its stalest goes, not another source's staler one",
                held: vec![
                    unproven(2, 0, 1, 1),
                    unproven(1, 0, 9, 2),
                    unproven(1, 0, 7, 3),
                ],
                from: 1,
                want: Verdict::Evict(3),
            },
            Case {
                name: "a holder further along outranks an older stalled one",
                held: vec![unproven(1, 1, 1, 1), unproven(1, 0, 8, 2)],
                from: 1,
                want: Verdict::Evict(2),
            },
            Case {
                name: "same stage and time: the older admission goes",
                held: vec![unproven(1, 2, 5, 7), unproven(1, 2, 5, 6)],
                from: 1,
                want: Verdict::Evict(6),
            },
            Case {
                name: "source full of proven holders: refused even with room elsewhere",
                held: vec![proven(1), proven(1), unproven(2, 0, 0, 3)],
                from: 1,
                want: Verdict::Refuse(Full::Source(2)),
            },
            Case {
                name: "total full: the stalest of any source goes",
                held: vec![
                    unproven(1, 1, 3, 1),
                    proven(2),
                    unproven(3, 0, 4, 3),
                    unproven(4, 1, 1, 4),
                ],
                from: 5,
                want: Verdict::Evict(3),
            },
            Case {
                name: "total full of proven holders: refused",
                held: vec![proven(1), proven(2), proven(3), proven(4)],
                from: 5,
                want: Verdict::Refuse(Full::Total(4)),
            },
        ];
        for c in cases {
            let from_source = c.held.iter().filter(|h| h.source == ip(c.from)).count();
            let got = choose(LIMITS, ip(c.from), from_source, c.held.len(), &c.held);
            assert_eq!(got, c.want, "{}", c.name);
        }
    }

    #[test]
    fn a_quarter_per_source() {
        assert_eq!(Limits::quarter_per_source(64).per_source, 16);
        assert_eq!(Limits::quarter_per_source(3).per_source, 1);
    }
}
