//! The gate: the holders, their standings, and the eviction signal their owners wait on.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::Notify;

use crate::choose::{choose, Full, Held, Limits, Standing, Verdict};

/// How far along its handshake a holder is; the owner numbers its own steps (a higher
/// stage is further along and is evicted later).
pub type Stage = u8;

/// The standing of a holder that has proved itself.
const PROVEN: u64 = u64::MAX;
/// Bits of a packed standing that hold the time.
const SINCE_BITS: u32 = 56;

fn pack(stage: Stage, since_ms: u64) -> u64 {
    (u64::from(stage) << SINCE_BITS) | (since_ms & ((1 << SINCE_BITS) - 1))
}

/// Holders admitted, in total and per source, with the eviction of the stalest unproven
/// one when a share is spent (see the crate's doc).
#[derive(Debug)]
pub struct Gate {
    limits: Limits,
    epoch: Instant,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    next_id: u64,
    holders: HashMap<u64, Arc<Slot>>,
    by_source: HashMap<IpAddr, usize>,
}

impl State {
    fn remove(&mut self, id: u64) -> Option<Arc<Slot>> {
        let slot = self.holders.remove(&id)?;
        if let Some(n) = self.by_source.get_mut(&slot.source) {
            *n -= 1;
            if *n == 0 {
                self.by_source.remove(&slot.source);
            }
        }
        Some(slot)
    }
}

#[derive(Debug)]
struct Slot {
    id: u64,
    source: IpAddr,
    /// Packed stage and time of the last progress, or [`PROVEN`].
    standing: AtomicU64,
    evicted: AtomicBool,
    notify: Notify,
}

impl Slot {
    fn held(&self) -> Held {
        let packed = self.standing.load(Ordering::Acquire);
        Held {
            source: self.source,
            standing: (packed != PROVEN).then_some(Standing {
                stage: (packed >> SINCE_BITS) as Stage,
                since: packed & ((1 << SINCE_BITS) - 1),
                id: self.id,
            }),
        }
    }
}

/// A newcomer let in.
#[derive(Debug)]
pub struct Admitted {
    pub ticket: Ticket,
    /// The source of the holder evicted to make room, if one was.
    pub evicted: Option<IpAddr>,
}

impl Gate {
    pub fn new(limits: Limits) -> Arc<Gate> {
        Arc::new(Gate {
            limits,
            epoch: Instant::now(),
            state: Mutex::new(State::default()),
        })
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // Every critical section leaves the counts consistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Lets a newcomer from `source` in at stage 0, evicting a holder if a share is
    /// spent, or refuses it.
    pub fn admit(self: &Arc<Self>, source: IpAddr) -> Result<Admitted, Full> {
        let mut state = self.state();
        let from_source = state.by_source.get(&source).copied().unwrap_or(0);
        let held: Vec<Held>;
        let verdict =
            if from_source < self.limits.per_source && state.holders.len() < self.limits.total {
                Verdict::Admit
            } else {
                held = state.holders.values().map(|s| s.held()).collect();
                choose(self.limits, source, from_source, state.holders.len(), &held)
            };
        let evicted = match verdict {
            Verdict::Admit => None,
            Verdict::Evict(id) => state.remove(id).map(|victim| {
                victim.evicted.store(true, Ordering::Release);
                victim.notify.notify_one();
                victim.source
            }),
            Verdict::Refuse(full) => return Err(full),
        };
        state.next_id += 1;
        let slot = Arc::new(Slot {
            id: state.next_id,
            source,
            standing: AtomicU64::new(pack(0, self.now_ms())),
            evicted: AtomicBool::new(false),
            notify: Notify::new(),
        });
        state.holders.insert(slot.id, slot.clone());
        *state.by_source.entry(source).or_insert(0) += 1;
        Ok(Admitted {
            ticket: Ticket {
                gate: self.clone(),
                slot,
            },
            evicted,
        })
    }

    /// Holders now.
    pub fn held(&self) -> usize {
        self.state().holders.len()
    }

    /// Holders from `source` now.
    pub fn held_from(&self, source: IpAddr) -> usize {
        self.state().by_source.get(&source).copied().unwrap_or(0)
    }
}

/// One holder's place in the gate; dropping it frees the place.
#[derive(Debug)]
pub struct Ticket {
    gate: Arc<Gate>,
    slot: Arc<Slot>,
}

impl Ticket {
    /// The source it was admitted for.
    pub fn source(&self) -> IpAddr {
        self.slot.source
    }

    /// Records progress to `stage` now (a proven holder stays proven).
    pub fn advance(&self, stage: Stage) {
        let now = pack(stage, self.gate.now_ms());
        let _ = self
            .slot
            .standing
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| {
                (s != PROVEN).then_some(now)
            });
    }

    /// The holder has proved itself: it is never evicted while it stays so.
    pub fn prove(&self) {
        self.slot.standing.store(PROVEN, Ordering::Release);
    }

    /// The holder may be evicted again, as a newcomer at stage 0 (a keep-alive
    /// connection between requests).
    pub fn unprove(&self) {
        self.slot
            .standing
            .store(pack(0, self.gate.now_ms()), Ordering::Release);
    }

    pub fn is_proven(&self) -> bool {
        self.slot.standing.load(Ordering::Acquire) == PROVEN
    }

    pub fn is_evicted(&self) -> bool {
        self.slot.evicted.load(Ordering::Acquire)
    }

    /// Resolves once the holder is evicted for a newcomer; its owner then closes it.
    pub async fn evicted(&self) {
        if self.is_evicted() {
            return;
        }
        // `notify_one` leaves a permit when nobody waits yet, so an eviction between the
        // check above and this wait is not lost.
        self.slot.notify.notified().await;
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.gate.state().remove(self.slot.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    #[tokio::test]
    async fn a_flooding_source_evicts_its_own_stalest_and_the_progressing_client_stays() {
        let gate = Gate::new(Limits {
            total: 8,
            per_source: 3,
        });
        let stalled: Vec<Ticket> = (0..2).map(|_| gate.admit(ip(1)).unwrap().ticket).collect();
        // The legitimate client, same address, gets further than the stalled ones.
        let client = gate.admit(ip(1)).unwrap().ticket;
        client.advance(1);
        // Each newcomer of the flood takes the place of a stalled connection.
        let flood = gate.admit(ip(1)).unwrap();
        assert_eq!(flood.evicted, Some(ip(1)));
        assert!(stalled[0].is_evicted());
        stalled[0].evicted().await;
        let flood2 = gate.admit(ip(1)).unwrap();
        assert!(stalled[1].is_evicted());
        // Now the stalled holders are the flood's own newcomers, not the client.
        let _flood3 = gate.admit(ip(1)).unwrap();
        assert!(flood.ticket.is_evicted());
        assert!(!client.is_evicted());
        assert_eq!(gate.held_from(ip(1)), 3);
        drop(flood2);
        assert_eq!(gate.held_from(ip(1)), 2);
    }

    #[tokio::test]
    async fn proven_holders_are_kept_and_the_newcomer_refused() {
        let gate = Gate::new(Limits {
            total: 2,
            per_source: 2,
        });
        let a = gate.admit(ip(1)).unwrap().ticket;
        let b = gate.admit(ip(2)).unwrap().ticket;
        a.prove();
        b.prove();
        assert_eq!(gate.admit(ip(3)).unwrap_err(), Full::Total(2));
        // A holder that is idle again may be evicted.
        b.unprove();
        let c = gate.admit(ip(3)).unwrap();
        assert_eq!(c.evicted, Some(ip(2)));
        assert!(b.is_evicted() && !a.is_evicted());
        // Dropping an evicted ticket does not free the newcomer's place.
        drop(b);
        assert_eq!(gate.held(), 2);
        // Advancing a proven holder leaves it proven.
        a.advance(3);
        assert!(a.is_proven());
    }
}
