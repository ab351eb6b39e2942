//! What the delta client keeps and does per subscribed type, the same for every
//! [`ResourceType`]: the names accepted with their versions and what each holds, and the
//! handling of one response's resources and removals into a batch and its rejections,
//! within the limits and the type's budget (see the module docs of [`crate::delta`]).

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use ambit_proto::Resource;
use ambit_state::Name;

use super::{cut, Limits};
use crate::batch::{Batch, TypedBatch};
use crate::held;
use crate::reject::Rejection;
use crate::resource::{message_name, Holds, Readiness, ResourceType, Slot};

/// What is held under one resource name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Entry {
    /// The version accepted last; `None` once an update was rejected (the store keeps
    /// what was accepted before, and the name is left out of `initial_resource_versions`
    /// so that the control plane sends it again).
    version: Option<Name>,
    /// Estimated bytes held ([`crate::held`]) in each [`Slot`].
    held: [u64; 2],
}

impl Entry {
    fn holds_nothing(&self) -> bool {
        self.version.is_none() && self.held == [0, 0]
    }
}

/// What the client keeps to track `name` at `version`, beside what the type estimates.
pub(super) fn tracking(name: &str, version: &str) -> u64 {
    held::tracking(name.len(), version.len(), std::mem::size_of::<Entry>())
}

fn index(slot: Slot) -> usize {
    match slot {
        Slot::First => 0,
        Slot::Second => 1,
    }
}

/// What handling one response of a type came to.
pub(super) enum Outcome {
    /// Applied: the changes, and the resources rejected alone.
    Applied {
        batch: Batch,
        rejected: Vec<(String, Rejection)>,
    },
    /// Refused whole: nothing applied, nothing of the client's state changed.
    Refused(Rejection),
}

/// One subscribed type, whatever it is.
pub(super) trait Subscribed: Send {
    fn type_url(&self) -> &'static str;
    fn readiness(&self) -> Readiness;
    /// Names accepted, with their versions.
    fn versions(&self) -> BTreeMap<&str, &str>;
    /// The same, as a new stream's `initial_resource_versions`.
    fn initial_versions(&self) -> HashMap<String, String>;
    /// Names tracked (with a version, or something held).
    fn tracked(&self) -> usize;
    /// The sum of the estimates held.
    fn held(&self) -> u64;
    /// Whether `name` is tracked.
    fn is_tracked(&self, name: &str) -> bool;
    /// Stops tracking `names`: the batch that removes them from the store.
    fn forget(&mut self, names: Vec<String>) -> Batch;
    /// Handles the resources and removed names of one response of the type.
    fn handle(
        &mut self,
        resources: Vec<Resource>,
        removed: Vec<String>,
        limits: &Limits,
    ) -> Outcome;
}

impl fmt::Debug for dyn Subscribed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subscription")
            .field("type_url", &self.type_url())
            .field("tracked", &self.tracked())
            .field("held", &self.held())
            .finish()
    }
}

/// The state of one type `T`: what was accepted (for `initial_resource_versions`) and
/// what it holds (for the budget).
pub(super) struct Subscription<T: ResourceType> {
    ty: T,
    /// Resource name → what is held under it (names with a version or something held).
    /// Interned: a name is the store's own uid or key, and versions repeat.
    entries: HashMap<Name, Entry>,
    /// The sum of the entries' estimates.
    held: u64,
}

impl<T: ResourceType> Subscription<T> {
    pub(super) fn new(ty: T) -> Self {
        Subscription {
            ty,
            entries: HashMap::new(),
            held: 0,
        }
    }

    /// The refusal of a response that would leave `after` held, over the type's budget.
    fn over_budget(&self, after: u64) -> Option<Rejection> {
        let budget = self.ty.budget();
        (after > budget).then(|| Rejection::OverBudget {
            message: message_name(T::TYPE_URL),
            estimate: after,
            budget,
            held: self.held,
        })
    }

    /// The checks made before decoding: name, version, payload type, and the body's
    /// shape with its estimate (and the tracking of its name and version).
    fn precheck(
        &self,
        name: &str,
        version: &str,
        any: Option<prost_types::Any>,
        limits: &Limits,
    ) -> Result<Prechecked, Rejection> {
        if name.len() > limits.max_name_len {
            return Err(Rejection::NameTooLong {
                len: name.len(),
                limit: limits.max_name_len,
            });
        }
        if version.len() > limits.max_version_len {
            return Err(Rejection::VersionTooLong {
                len: version.len(),
                limit: limits.max_version_len,
            });
        }
        let any = any.ok_or(Rejection::NoPayload)?;
        if any.type_url != T::TYPE_URL {
            return Err(Rejection::WrongType {
                got: cut(&any.type_url, 256).to_string(),
                want: T::TYPE_URL,
            });
        }
        let measured = self.ty.measure(name, &any.value)?;
        let estimate = measured.estimate.saturating_add(tracking(name, version));
        Ok(Prechecked {
            body: any.value,
            slot: measured.slot,
            estimate,
        })
    }

    /// Decodes a body that passed [`Subscription::precheck`], and checks that it
    /// describes the object its resource name names.
    fn decode(&self, name: &str, body: &[u8]) -> Result<T::Op, Rejection> {
        let d = self.ty.decode(body)?;
        if d.key != name {
            return Err(Rejection::NameMismatch {
                what: d.what,
                body: cut(&d.key, 256).to_string(),
            });
        }
        Ok(d.op)
    }
}

/// A resource that passed the checks made before decoding.
struct Prechecked {
    body: Vec<u8>,
    slot: Slot,
    /// Its estimate, with the tracking of its name and version.
    estimate: u64,
}

/// One resource of a response through the checks: its name, version, and either what
/// to hold or why not.
struct Checked<R> {
    name: String,
    version: String,
    result: Result<R, Rejection>,
}

impl<T: ResourceType> Subscribed for Subscription<T> {
    fn type_url(&self) -> &'static str {
        T::TYPE_URL
    }

    fn readiness(&self) -> Readiness {
        self.ty.readiness()
    }

    fn versions(&self) -> BTreeMap<&str, &str> {
        self.entries
            .iter()
            .filter_map(|(k, e)| Some((k.as_str(), e.version.as_deref()?)))
            .collect()
    }

    fn initial_versions(&self) -> HashMap<String, String> {
        self.entries
            .iter()
            .filter_map(|(k, e)| Some((k.to_string(), e.version.as_ref()?.to_string())))
            .collect()
    }

    fn tracked(&self) -> usize {
        self.entries.len()
    }

    fn held(&self) -> u64 {
        self.held
    }

    fn is_tracked(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    fn forget(&mut self, names: Vec<String>) -> Batch {
        let mut batch = TypedBatch::<T>::default();
        for name in names {
            if let Some(e) = self.entries.remove(name.as_str()) {
                self.held = self
                    .held
                    .saturating_sub(e.held[0].saturating_add(e.held[1]));
                batch.ops.push(self.ty.removal(name));
            }
        }
        batch.into()
    }

    /// Each resource checked on its own (a bad one is rejected, the rest applies),
    /// removals, versions, and the budget twice: on the estimates before anything is
    /// decoded, and on what is accepted once converted.
    fn handle(
        &mut self,
        resources: Vec<Resource>,
        removed: Vec<String>,
        limits: &Limits,
    ) -> Outcome {
        // Names over the limit were never accepted: nothing to remove.
        let removed: Vec<String> = removed
            .into_iter()
            .filter(|n| n.len() <= limits.max_name_len)
            .collect();

        // Before decoding: each resource's checks and estimate, then the budget on them.
        let prechecked: Vec<Checked<Prechecked>> = resources
            .into_iter()
            .map(|r| Checked {
                result: self.precheck(&r.name, &r.version, r.resource, limits),
                name: r.name,
                version: r.version,
            })
            .collect();
        let adds = prechecked
            .iter()
            .filter_map(|c| c.result.as_ref().ok())
            .fold(0u64, |sum, p| sum.saturating_add(p.estimate));
        if adds > limits.max_held_per_response {
            return Outcome::Refused(Rejection::ResponseOverBudget {
                estimate: adds,
                limit: limits.max_held_per_response,
            });
        }
        let mut plan = Plan::new(&self.entries);
        for name in &removed {
            plan.remove(&self.ty, name);
        }
        for c in &prechecked {
            if let Ok(p) = &c.result {
                plan.put(&c.name, &c.version, p.slot, p.estimate);
            }
        }
        if let Some(why) = self.over_budget(plan.held_after(self.held)) {
            return Outcome::Refused(why);
        }

        // Decoded and converted; then the budget again, on what was accepted.
        let checked: Vec<Checked<(T::Op, Slot, u64)>> = prechecked
            .into_iter()
            .map(|c| Checked {
                result: c.result.and_then(|p| {
                    self.decode(&c.name, &p.body)
                        .map(|op| (op, p.slot, p.estimate))
                }),
                name: c.name,
                version: c.version,
            })
            .collect();
        let mut plan = Plan::new(&self.entries);
        let mut batch = TypedBatch::<T>::default();
        for name in removed {
            plan.remove(&self.ty, &name);
            batch.ops.push(self.ty.removal(name));
        }
        let mut rejected = Vec::new();
        for c in checked {
            let accepted = c.result.and_then(|held| {
                if !plan.is_tracked(&c.name) && plan.tracked >= limits.max_tracked_per_type {
                    return Err(Rejection::TooManyTracked {
                        limit: limits.max_tracked_per_type,
                    });
                }
                Ok(held)
            });
            match accepted {
                Ok((op, slot, estimate)) => {
                    plan.put(&c.name, &c.version, slot, estimate);
                    batch.ops.push(op);
                }
                Err(reason) => {
                    // Its version is dropped, so the control plane sends it again.
                    plan.reject(&c.name);
                    rejected.push((c.name, reason));
                }
            }
        }
        let held = plan.held_after(self.held);
        if let Some(why) = self.over_budget(held) {
            return Outcome::Refused(why);
        }
        let changes = plan.into_changes();
        commit(changes, &mut self.entries);
        self.held = held;
        Outcome::Applied {
            batch: batch.into(),
            rejected,
        }
    }
}

/// The entries a response changes, over those held: what applying it would leave.
struct Plan<'a> {
    entries: &'a HashMap<Name, Entry>,
    changed: HashMap<Name, Entry>,
    /// Names tracked after the changes so far.
    tracked: usize,
}

impl<'a> Plan<'a> {
    fn new(entries: &'a HashMap<Name, Entry>) -> Self {
        Plan {
            entries,
            changed: HashMap::new(),
            tracked: entries.len(),
        }
    }

    fn entry(&mut self, name: &str) -> &mut Entry {
        if !self.changed.contains_key(name) {
            let e = self.entries.get(name).cloned().unwrap_or_default();
            self.changed.insert(Name::new(name), e);
        }
        self.changed.get_mut(name).expect("just inserted")
    }

    /// Runs `f` on the entry of `name`, keeping the tracked count right.
    fn update(&mut self, name: &str, f: impl FnOnce(&mut Entry)) {
        let e = self.entry(name);
        let was = !e.holds_nothing();
        f(e);
        let is = !e.holds_nothing();
        self.tracked = self.tracked + usize::from(is) - usize::from(was);
    }

    fn is_tracked(&self, name: &str) -> bool {
        match self.changed.get(name) {
            Some(e) => !e.holds_nothing(),
            None => self.entries.contains_key(name),
        }
    }

    /// A removal by name, freeing what the type says it frees.
    fn remove<T: ResourceType>(&mut self, ty: &T, name: &str) {
        self.update(name, |e| {
            e.version = None;
            let holds = Holds {
                first: e.held[0] > 0,
                second: e.held[1] > 0,
            };
            if let Some(slot) = ty.frees(name, holds) {
                e.held[index(slot)] = 0;
            }
        });
    }

    /// A resource accepted with `version`, holding `estimate` in `slot`.
    fn put(&mut self, name: &str, version: &str, slot: Slot, estimate: u64) {
        self.update(name, |e| {
            e.version = Some(Name::new(version));
            e.held[index(slot)] = estimate;
        });
    }

    /// A rejected resource: what was held stays, its version goes.
    fn reject(&mut self, name: &str) {
        self.update(name, |e| e.version = None);
    }

    /// What would be held after the changes, given `held` before.
    fn held_after(&self, held: u64) -> u64 {
        let (mut before, mut after) = (0u64, 0u64);
        for (name, e) in &self.changed {
            let old = self.entries.get(name.as_str()).map_or([0, 0], |e| e.held);
            before = before.saturating_add(old[0] + old[1]);
            after = after.saturating_add(e.held[0].saturating_add(e.held[1]));
        }
        held.saturating_sub(before).saturating_add(after)
    }

    /// The entries changed, to [`commit`].
    fn into_changes(self) -> HashMap<Name, Entry> {
        self.changed
    }
}

/// Writes the changes of a [`Plan`] into the entries.
fn commit(changes: HashMap<Name, Entry>, entries: &mut HashMap<Name, Entry>) {
    for (name, e) in changes {
        if e.holds_nothing() {
            entries.remove(name.as_str());
        } else {
            entries.insert(name, e);
        }
    }
}
