//! Lease renewal: one scheduler per runtime, batched, with lost detection.
//!
//! Every held lock is an entry with a due time (`lease/3` after its last confirmed write) and a
//! validity (`lease` after the *send* time of its last confirmed write, a conservative bound).
//! The scheduler sleeps until the earliest of those, renews every lock due within a short
//! coalescing window in one backend call per batch, and fires the lost signal when
//! - the engine says the lock is no longer ours, or
//! - the local monotonic clock passes the validity without a confirmed renewal
//!   (engine unreachable). A failed renewal alone is retried, not a loss.
//!
//! With `watchdog(false)` an entry is never renewed: its validity is the hard cap.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::backend::{DynBackend, Renewal};
use crate::events::Observer;
pub(crate) use crate::lost::LostSignal;

mod first_step;
pub(crate) use first_step::publish as publish_first_step;

#[derive(Debug)]
struct Entry {
    /// The owner token then the key, in one allocation (see [`Entry::key`], [`Entry::owner`]).
    owner_key: String,
    owner_len: usize,
    lease: Duration,
    /// Part of the lease not counted on (engine clock drift).
    drift: Duration,
    renew: bool,
    due: Instant,
    valid_until: Instant,
    in_flight: bool,
    lost: Arc<LostSignal>,
}

impl Entry {
    fn key(&self) -> &str {
        self.owner_key.get(self.owner_len..).unwrap_or_default()
    }

    fn owner(&self) -> &str {
        self.owner_key.get(..self.owner_len).unwrap_or_default()
    }

    /// The part of the lease counted on (renewals come every third of it).
    fn effective(&self) -> Duration {
        self.lease.saturating_sub(self.drift)
    }

    /// When the scheduler must look at this entry next.
    fn next_look(&self) -> Instant {
        if self.renew && !self.in_flight {
            self.due.min(self.valid_until)
        } else {
            self.valid_until
        }
    }
}

/// Hashes the scheduler's own entry ids (consecutive numbers, never chosen by a caller):
/// one multiplication instead of SipHash's rounds.
#[derive(Debug, Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    fn write_u64(&mut self, n: u64) {
        // Fibonacci hashing: spreads consecutive ids over the high bits the table reads.
        self.0 = n.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

#[derive(Debug, Default)]
struct State {
    entries: HashMap<u64, Entry, BuildHasherDefault<IdHasher>>,
    next_id: u64,
    /// The instant the scheduler sleeps until (`None`: indefinitely); mirrored in
    /// [`Watchdog::next_look`].
    next_wake: Option<Instant>,
}

/// The renewal scheduler of one runtime.
#[derive(Debug)]
pub(crate) struct Watchdog {
    state: Mutex<State>,
    /// [`State::next_wake`] in nanoseconds since `base` (`u64::MAX`: none), read without the
    /// lock by a body publishing its first step (see [`Watchdog::look_by`]).
    next_look: AtomicU64,
    base: Instant,
    wake: Arc<Notify>,
    closed: AtomicBool,
    /// Told of every renewal, failed renewal and loss.
    observer: Arc<Observer>,
}

/// How early a renewal may go out to join a batch: a twelfth of the lease, so at most about
/// four renewal calls per lock per `lease/3` interval whatever the acquisition pattern.
fn coalesce_window(lease: Duration) -> Duration {
    lease / 12
}

/// Delay before retrying a failed renewal.
fn retry_delay(lease: Duration) -> Duration {
    (lease / 10).max(Duration::from_millis(5))
}

/// What one look at the entries found.
struct Collected {
    /// Due renewals, by entry id.
    batch: Vec<(u64, Renewal)>,
    /// Hard-capped locks whose lease ran out.
    capped: Vec<Renewal>,
    /// When to look again.
    next: Option<Instant>,
}

impl Watchdog {
    pub(crate) fn new(observer: Arc<Observer>) -> Self {
        Self {
            state: Mutex::default(),
            next_look: AtomicU64::new(u64::MAX),
            base: Instant::now(),
            wake: Arc::new(Notify::new()),
            closed: AtomicBool::new(false),
            observer,
        }
    }

    /// `at` in nanoseconds since `base`, for [`Watchdog::next_look`].
    fn nanos(&self, at: Instant) -> u64 {
        let nanos = at.saturating_duration_since(self.base).as_nanos();
        u64::try_from(nanos).unwrap_or(u64::MAX - 1)
    }

    /// Plans the scheduler's next look at `at` (`None`: none), under the lock.
    fn plan(&self, state: &mut State, at: Option<Instant>) {
        state.next_wake = at;
        let nanos = at.map_or(u64::MAX, |at| self.nanos(at));
        self.next_look.store(nanos, Ordering::SeqCst);
    }

    /// Makes sure the scheduler looks by `at` (a scoped hold published in its first step
    /// falls due then, see `first_step`). The body publishes before it reads the look planned;
    /// the scheduler plans before it reads the published holds: one of them sees the other.
    pub(crate) fn look_by(&self, at: Instant) {
        if self.next_look.load(Ordering::SeqCst) <= self.nanos(at) {
            return;
        }
        let mut state = self.state();
        if state.next_wake.is_none_or(|w| at < w) {
            self.plan(&mut state, Some(at));
            drop(state);
            self.wake_scheduler();
        }
    }

    /// Wakes the scheduler task. On a worker of a multi-thread runtime, a task woken goes to
    /// that worker's own next slot, which no other worker takes from: a caller that then blocks
    /// its thread (a body's synchronous call) would keep the scheduler from running. So there
    /// it is woken from a thread of the blocking pool, as from outside the runtime.
    fn wake_scheduler(&self) {
        match tokio::runtime::Handle::try_current() {
            Ok(handle) if handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
                let wake = self.wake.clone();
                drop(handle.spawn_blocking(move || wake.notify_one()));
            }
            _ => self.wake.notify_one(),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Every critical section leaves `State` consistent; a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Tracks a freshly acquired lock whose acquire request was sent at `sent_at`, with the
    /// lease state `lost` if it has one already (validity `sent_at + lease - drift`), else a
    /// new one. Its id and lease state.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn register(
        &self,
        key: &str,
        owner: &str,
        lease: Duration,
        drift: Duration,
        renew: bool,
        sent_at: Instant,
        lost: Option<Arc<LostSignal>>,
    ) -> (u64, Arc<LostSignal>) {
        let valid_until = sent_at + lease.saturating_sub(drift);
        let lost = lost.unwrap_or_else(|| Arc::new(LostSignal::new(Instant::now(), valid_until)));
        let mut owner_key = String::with_capacity(owner.len() + key.len());
        owner_key.push_str(owner);
        owner_key.push_str(key);
        let entry = Entry {
            owner_key,
            owner_len: owner.len(),
            lease,
            drift,
            renew,
            due: sent_at + lease.saturating_sub(drift) / 3,
            valid_until,
            in_flight: false,
            lost: lost.clone(),
        };
        let look = entry.next_look();
        let mut state = self.state();
        state.next_id += 1;
        let id = state.next_id;
        state.entries.insert(id, entry);
        let sooner = state.next_wake.is_none_or(|w| look < w);
        if sooner {
            self.plan(&mut state, Some(look));
        }
        drop(state);
        if sooner {
            self.wake_scheduler();
        }
        (id, lost)
    }

    /// Gives the lock tracked as `id` a fresh lost signal (the lock passed to another holder of
    /// this runtime: the previous holder's guards must not see its later fate), with the
    /// validity confirmed so far. `None` when it is no longer tracked (found lost meanwhile).
    pub(crate) fn transfer(&self, id: u64) -> Option<Arc<LostSignal>> {
        let mut state = self.state();
        let entry = state.entries.get_mut(&id)?;
        let lost = Arc::new(LostSignal::new(Instant::now(), entry.valid_until));
        entry.lost = lost.clone();
        Some(lost)
    }

    /// Stops tracking a lock (released or abandoned).
    pub(crate) fn unregister(&self, id: u64) {
        self.state().entries.remove(&id);
    }

    /// Number of locks tracked now.
    pub(crate) fn len(&self) -> usize {
        self.state().entries.len()
    }

    /// Ends the scheduler task.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.wake.notify_one();
    }

    /// Fires the lost entries, marks the due ones in flight and returns them, the hard-capped
    /// locks whose lease ran out (to release in the engine), and the instant to look again.
    fn collect(&self, now: Instant) -> Collected {
        let mut state = self.state();
        let mut batch = Vec::new();
        let mut capped = Vec::new();
        let mut next: Option<Instant> = None;
        state.entries.retain(|&id, e| {
            if now >= e.valid_until {
                if e.renew {
                    self.observer
                        .lost(e.key(), "no confirmed renewal before it ran out");
                } else {
                    self.observer
                        .lost(e.key(), "the hard-capped lease ran out while held");
                    capped.push(Renewal {
                        key: e.key().to_owned(),
                        owner: e.owner().to_owned(),
                        lease: e.lease,
                    });
                }
                e.lost.fire();
                return false;
            }
            if e.renew && !e.in_flight && e.due <= now + coalesce_window(e.effective()) {
                e.in_flight = true;
                batch.push((
                    id,
                    Renewal {
                        key: e.key().to_owned(),
                        owner: e.owner().to_owned(),
                        lease: e.lease,
                    },
                ));
            }
            let look = e.next_look();
            next = Some(next.map_or(look, |n| n.min(look)));
            true
        });
        if next.is_none() {
            // Nothing tracked: keep the look already planned while it is ahead. A lock
            // registered meanwhile that is due after it needs no wake-up (the scheduler looks
            // then anyway), so taking and releasing locks in a row does not wake the scheduler
            // each time.
            next = state.next_wake.filter(|&at| at > now);
        }
        self.plan(&mut state, next);
        Collected {
            batch,
            capped,
            next,
        }
    }

    /// Applies the outcome of one renewal call sent at `sent_at`.
    fn settle(
        &self,
        ids: &[u64],
        sent_at: Instant,
        outcome: Result<Vec<Option<bool>>, crate::LockError>,
    ) {
        let now = Instant::now();
        if let Ok(renewed) = &outcome {
            tracing::trace!(locks = renewed.len(), "leases renewed");
        }
        let mut state = self.state();
        for (i, id) in ids.iter().enumerate() {
            let Some(entry) = state.entries.get_mut(id) else {
                continue; // released meanwhile
            };
            entry.in_flight = false;
            match outcome.as_ref().map(|r| r.get(i).copied().flatten()) {
                Ok(Some(true)) => {
                    self.observer.renewed(entry.key());
                    entry.valid_until = sent_at + entry.effective();
                    entry.due = sent_at + entry.effective() / 3;
                    entry.lost.set_valid_until(entry.valid_until);
                }
                Ok(Some(false)) => {
                    self.observer
                        .lost(entry.key(), "the engine says the lock is no longer ours");
                    entry.lost.fire();
                    state.entries.remove(id);
                }
                // Not determined (engine error, or too few nodes answered): retry soon; the
                // local clock declares the loss if no renewal is confirmed before the validity
                // ends. Visible: a failover or restart shows here before any loss.
                Ok(None) | Err(_) => {
                    let retry_in = retry_delay(entry.effective());
                    let valid_for = entry.valid_until.saturating_duration_since(now);
                    match &outcome {
                        Err(err) => {
                            tracing::warn!(key = %entry.key(), error = %err, ?retry_in, ?valid_for, "renewal failed; retrying");
                            self.observer
                                .renewal_failed(entry.key(), || err.to_string());
                        }
                        Ok(_) => {
                            tracing::warn!(key = %entry.key(), ?retry_in, ?valid_for, "renewal failed: too few nodes answered; retrying");
                            self.observer.renewal_failed(entry.key(), || {
                                "too few nodes answered".to_owned()
                            });
                        }
                    }
                    entry.due = now + retry_in;
                }
            }
        }
        drop(state);
        self.wake.notify_one();
    }

    /// The scheduler loop. Holds the backend weakly: the runtime's drop ends it.
    pub(crate) async fn run(self: Arc<Self>, backend: Weak<dyn DynBackend>, batch_limit: usize) {
        loop {
            if self.closed.load(Ordering::Acquire) {
                return;
            }
            let now = Instant::now();
            // Bodies still in a first step that is due: registered, so collected below.
            first_step::sweep(&self, now);
            let Collected {
                batch,
                capped,
                mut next,
            } = self.collect(now);
            // Planned (by `collect`) before the published first steps are read again.
            if let (_, Some(due)) = first_step::sweep(&self, now) {
                let mut state = self.state();
                let planned = state.next_wake.map_or(due, |w| w.min(due));
                self.plan(&mut state, Some(planned));
                next = Some(planned);
            }
            if !capped.is_empty() {
                let Some(backend) = backend.upgrade() else {
                    return;
                };
                // A hard cap frees the key at the lease on every engine: where the engine does
                // not expire it by itself (a ZooKeeper node lives as long as the session), the
                // holder's node is removed now. Owner-checked, so a no-op where it expired.
                for item in capped {
                    let backend = backend.clone();
                    tokio::spawn(async move {
                        if let Err(err) = backend.release(&item.key, &item.owner).await {
                            tracing::debug!(key = %item.key, error = %err, "release at the hard cap failed");
                        }
                    });
                }
            }
            if !batch.is_empty() {
                let Some(backend) = backend.upgrade() else {
                    return;
                };
                // One call per partition (hash slot on Cluster) and per `batch_limit` locks,
                // each settled on its own: a slow shard never costs the locks of the others.
                let mut groups: std::collections::HashMap<u16, Vec<(u64, Renewal)>> =
                    std::collections::HashMap::new();
                for (id, item) in batch {
                    groups
                        .entry(backend.renew_partition(&item.key))
                        .or_default()
                        .push((id, item));
                }
                for mut group in groups.into_values() {
                    while !group.is_empty() {
                        let rest = group.split_off(group.len().min(batch_limit));
                        let chunk = std::mem::replace(&mut group, rest);
                        let (ids, items): (Vec<u64>, Vec<Renewal>) = chunk.into_iter().unzip();
                        let backend = backend.clone();
                        let this = self.clone();
                        tokio::spawn(async move {
                            let sent_at = Instant::now();
                            let outcome = backend.renew(&items).await;
                            this.settle(&ids, sent_at, outcome);
                        });
                    }
                }
            }
            match next {
                Some(at) => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(at) => {}
                        _ = self.wake.notified() => {}
                    }
                }
                None => self.wake.notified().await,
            }
        }
    }
}

#[cfg(test)]
mod tests;
