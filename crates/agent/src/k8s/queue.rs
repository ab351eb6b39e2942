//! The reconcile work queue, sans IO (time is passed in): per-key dedupe, one worker per key
//! at a time, and per-key exponential backoff for retries (5 ms doubling to 5 s, Istio's
//! per-item limiter), unlimited retries. A key added while it is being processed is run
//! again once the current run is done, so no change is lost.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::hash::Hash;
use std::time::{Duration, Instant};

pub const BACKOFF_BASE: Duration = Duration::from_millis(5);
pub const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// The delay before retry number `failures` (1 = the first retry).
pub fn backoff(failures: u32) -> Duration {
    let shift = failures.saturating_sub(1).min(20);
    BACKOFF_BASE.saturating_mul(1 << shift).min(BACKOFF_MAX)
}

#[derive(Debug)]
pub struct WorkQueue<K> {
    ready: VecDeque<K>,
    /// Keys in `ready` or waiting in `delayed`.
    queued: HashSet<K>,
    processing: HashSet<K>,
    /// Added again while processing: re-queued by [`WorkQueue::done`].
    dirty: HashSet<K>,
    delayed: BTreeSet<(Instant, u64, K)>,
    delay_of: HashMap<K, (Instant, u64)>,
    failures: HashMap<K, u32>,
    seq: u64,
}

impl<K: Clone + Eq + Hash + Ord> Default for WorkQueue<K> {
    fn default() -> Self {
        WorkQueue {
            ready: VecDeque::new(),
            queued: HashSet::new(),
            processing: HashSet::new(),
            dirty: HashSet::new(),
            delayed: BTreeSet::new(),
            delay_of: HashMap::new(),
            failures: HashMap::new(),
            seq: 0,
        }
    }
}

impl<K: Clone + Eq + Hash + Ord> WorkQueue<K> {
    /// Queues `key` now (a no-op if it is already waiting; a delayed key is moved up).
    pub fn add(&mut self, key: K) {
        if self.processing.contains(&key) {
            self.dirty.insert(key);
            return;
        }
        if let Some((at, seq)) = self.delay_of.remove(&key) {
            self.delayed.remove(&(at, seq, key.clone()));
            self.queued.remove(&key);
        }
        if self.queued.insert(key.clone()) {
            self.ready.push_back(key);
        }
    }

    /// Moves delayed keys whose time has come to the ready list and takes the next one.
    pub fn pop(&mut self, now: Instant) -> Option<K> {
        while let Some((at, _, _)) = self.delayed.first() {
            if *at > now {
                break;
            }
            let Some((_, _, key)) = self.delayed.pop_first() else {
                break;
            };
            self.delay_of.remove(&key);
            self.ready.push_back(key);
        }
        let key = self.ready.pop_front()?;
        self.queued.remove(&key);
        self.processing.insert(key.clone());
        Some(key)
    }

    /// The run of `key` succeeded (or failed for good): reset its backoff.
    pub fn done(&mut self, key: &K) {
        self.failures.remove(key);
        self.finish(key);
    }

    /// The run of `key` failed and should be retried: schedules it after its backoff and
    /// returns when.
    pub fn retry(&mut self, key: &K, now: Instant) -> Instant {
        let failures = self.failures.entry(key.clone()).or_insert(0);
        *failures = failures.saturating_add(1);
        let at = now + backoff(*failures);
        self.processing.remove(key);
        self.dirty.remove(key);
        if !self.queued.contains(key) {
            self.seq += 1;
            self.delayed.insert((at, self.seq, key.clone()));
            self.delay_of.insert(key.clone(), (at, self.seq));
            self.queued.insert(key.clone());
        }
        at
    }

    fn finish(&mut self, key: &K) {
        self.processing.remove(key);
        if self.dirty.remove(key) {
            self.add(key.clone());
        }
    }

    /// When the earliest delayed key is due (`None`: nothing delayed).
    pub fn next_due(&self) -> Option<Instant> {
        self.delayed.first().map(|(at, _, _)| *at)
    }

    /// Keys waiting (ready or delayed).
    pub fn len(&self) -> usize {
        self.queued.len()
    }

    pub fn is_empty(&self) -> bool {
        self.queued.is_empty()
    }

    /// Keys with work outstanding: waiting (ready or delayed) or being processed. 0 once
    /// every key added has been processed to the end.
    pub fn pending(&self) -> usize {
        self.queued.len() + self.processing.len()
    }

    /// Failures so far of `key`.
    pub fn failures(&self, key: &K) -> u32 {
        self.failures.get(key).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_5ms_to_5s() {
        let ms = |n| backoff(n).as_millis();
        assert_eq!([ms(1), ms(2), ms(3), ms(4)], [5, 10, 20, 40]);
        assert_eq!(ms(10), 2560);
        assert_eq!(ms(11), 5000);
        assert_eq!(ms(1000), 5000);
    }

    #[test]
    fn keys_are_deduplicated_and_served_in_order() {
        let t = Instant::now();
        let mut q = WorkQueue::default();
        q.add("a");
        q.add("b");
        q.add("a");
        assert_eq!(q.len(), 2);
        assert_eq!(q.pop(t), Some("a"));
        assert_eq!(q.pop(t), Some("b"));
        assert_eq!(q.pop(t), None);
    }

    #[test]
    fn pending_counts_waiting_and_running_keys_until_done() {
        let t = Instant::now();
        let mut q = WorkQueue::default();
        assert_eq!(q.pending(), 0);
        q.add("a");
        q.add("b");
        assert_eq!(q.pending(), 2);
        assert_eq!(q.pop(t), Some("a"));
        assert_eq!(q.pending(), 2, "a running, b waiting");
        q.add("a");
        assert_eq!(q.pending(), 2, "a again once done: still one key");
        q.done(&"a");
        assert_eq!(q.pending(), 2, "a queued again");
        assert_eq!(q.pop(t), Some("b"));
        q.retry(&"b", t);
        assert_eq!(q.pending(), 2, "b waiting for its retry");
        assert_eq!(q.pop(t), Some("a"));
        q.done(&"a");
        assert_eq!(q.pop(t + BACKOFF_MAX), Some("b"));
        assert_eq!(q.pending(), 1);
        q.done(&"b");
        assert_eq!(q.pending(), 0);
    }

    #[test]
    fn an_add_during_processing_runs_the_key_again_afterwards() {
        let t = Instant::now();
        let mut q = WorkQueue::default();
        q.add("a");
        assert_eq!(q.pop(t), Some("a"));
        q.add("a");
        q.add("a");
        assert_eq!(q.pop(t), None, "one run per key at a time");
        q.done(&"a");
        assert_eq!(q.pop(t), Some("a"));
        q.done(&"a");
        assert_eq!(q.pop(t), None);
    }

    #[test]
    fn retries_back_off_on_the_injected_clock_and_reset_on_success() {
        let t0 = Instant::now();
        let mut q = WorkQueue::default();
        q.add("a");
        let mut now = t0;
        let mut delays = Vec::new();
        for _ in 0..4 {
            assert_eq!(q.pop(now), Some("a"));
            let at = q.retry(&"a", now);
            delays.push((at - now).as_millis());
            assert_eq!(q.next_due(), Some(at));
            assert_eq!(
                q.pop(at - Duration::from_micros(1)),
                None,
                "not before its time"
            );
            now = at;
        }
        assert_eq!(delays, [5, 10, 20, 40]);
        assert_eq!(q.failures(&"a"), 4);
        assert_eq!(q.pop(now), Some("a"));
        q.done(&"a");
        assert_eq!(q.failures(&"a"), 0);
        q.add("a");
        assert_eq!(q.pop(now), Some("a"));
        assert_eq!(q.retry(&"a", now) - now, BACKOFF_BASE);
    }

    #[test]
    fn a_fresh_add_overrides_a_pending_backoff() {
        let t = Instant::now();
        let mut q = WorkQueue::default();
        q.add("a");
        assert_eq!(q.pop(t), Some("a"));
        q.retry(&"a", t);
        assert_eq!(q.pop(t), None);
        q.add("a");
        assert_eq!(q.pop(t), Some("a"), "a change is acted on at once");
        assert_eq!(q.next_due(), None);
        assert!(q.is_empty());
    }

    #[test]
    fn other_keys_are_not_held_up_by_a_failing_one() {
        let t = Instant::now();
        let mut q = WorkQueue::default();
        q.add("bad");
        q.add("good");
        assert_eq!(q.pop(t), Some("bad"));
        q.retry(&"bad", t);
        assert_eq!(q.pop(t), Some("good"));
        q.done(&"good");
        assert_eq!(q.pop(t), None);
        assert_eq!(q.pop(t + BACKOFF_BASE), Some("bad"));
    }
}
