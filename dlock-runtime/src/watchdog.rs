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
use std::hash::BuildHasherDefault;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::backend::{AnyBackend, Backend, Renewal};
use crate::error::LockError;
use crate::events::Observer;
use crate::lease::LostSignal;

mod clock;
mod entry;
mod first_step;
use entry::{Entry, IdHasher};
pub(crate) use first_step::{FirstStep, Published, publish as publish_first_step};

/// Ids of watchdogs, one per runtime (0 is none).
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

#[derive(Debug, Default)]
struct State {
    entries: HashMap<u64, Entry, BuildHasherDefault<IdHasher>>,
    next_id: u64,
    /// The instant the scheduler sleeps until (`None`: indefinitely).
    next_wake: Option<Instant>,
    /// The look a body publishing its first step asked for since the scheduler last read the
    /// slots (see [`Watchdog::cover_first_step`]).
    first_step_look: Option<Instant>,
}

/// The renewal scheduler of one runtime.
#[derive(Debug)]
pub(crate) struct Watchdog {
    /// Unique in the process: names this watchdog to the holds published in their first step.
    id: u64,
    state: Mutex<State>,
    /// Whether the scheduler looks at the scoped holds published in their first step at least
    /// once every `first_step_period` (see `first_step`).
    first_steps: AtomicBool,
    /// That period, in nanoseconds.
    first_step_period: AtomicU64,
    wake: Notify,
    /// The thread that wakes the scheduler task at each look it plans (see [`clock`]).
    clock: OnceLock<std::thread::Thread>,
    closed: AtomicBool,
    /// Told of every renewal, failed renewal and loss.
    observer: Arc<Observer>,
}

/// `d` in nanoseconds (saturating).
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
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
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            state: Mutex::default(),
            first_steps: AtomicBool::new(false),
            first_step_period: AtomicU64::new(u64::MAX),
            wake: Notify::new(),
            clock: OnceLock::new(),
            closed: AtomicBool::new(false),
            observer,
        }
    }

    /// Unique in the process (see [`FirstStep::scheduler`]).
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// A scoped hold whose renewals come every third of `effective` was published in its
    /// first step: the scheduler must look at it by then. Two loads when it looks often enough
    /// already.
    pub(crate) fn first_step_published(&self, effective: Duration) {
        let interval = nanos(effective / 3);
        if self.first_steps.load(Ordering::SeqCst)
            && self.first_step_period.load(Ordering::Relaxed) <= interval
        {
            return;
        }
        self.cover_first_step(interval);
    }

    /// Has the scheduler look at the first steps at least every `interval` nanoseconds, the
    /// first time within that long.
    #[cold]
    fn cover_first_step(&self, interval: u64) {
        self.first_step_period
            .fetch_min(interval, Ordering::Relaxed);
        let at = Instant::now() + Duration::from_nanos(interval);
        let mut state = self.state();
        self.first_steps.store(true, Ordering::SeqCst);
        // Kept apart from `next_wake`, which the scheduler recomputes: its next look counts it.
        state.first_step_look = Some(state.first_step_look.map_or(at, |l| l.min(at)));
        if state.next_wake.is_none_or(|w| at < w) {
            self.plan(&mut state, Some(at));
            drop(state);
            self.wake_scheduler();
        }
    }

    /// Plans the scheduler's next look at `at` (`None`: none), telling the clock thread when
    /// that changes it.
    fn plan(&self, state: &mut State, at: Option<Instant>) {
        if state.next_wake != at {
            state.next_wake = at;
            if let Some(clock) = self.clock.get() {
                clock.unpark();
            }
        }
    }

    /// Has the scheduler task look at the plan again, now sooner. On a multi-thread runtime
    /// that is the clock thread's work ([`clock`]): a task woken from a worker waits in that
    /// worker's own next slot, which no other worker takes from, so a caller that then blocks
    /// its thread (a body's synchronous call) would keep the scheduler from running. Woken from
    /// outside the runtime, it runs on another worker, which then drives the runtime's timers
    /// and sockets if the blocked one did. Elsewhere (a current-thread runtime, tests on a
    /// paused clock) the task is woken at once.
    fn wake_scheduler(&self) {
        let multi_thread = tokio::runtime::Handle::try_current()
            .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
        if !multi_thread || self.clock.get().is_none() {
            self.wake.notify_one();
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
        if let Some(clock) = self.clock.get() {
            clock.unpark();
        }
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
        if let Some(asked) = state.first_step_look {
            next = Some(next.map_or(asked, |n| n.min(asked)));
        }
        self.plan(&mut state, next);
        Collected {
            batch,
            capped,
            next,
        }
    }

    /// Applies the outcome of one renewal call sent at `sent_at`.
    fn settle(&self, ids: &[u64], sent_at: Instant, outcome: Result<Vec<Option<bool>>, LockError>) {
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
    pub(crate) async fn run(self: Arc<Self>, backend: Weak<AnyBackend>, batch_limit: usize) {
        self.start_clock();
        loop {
            if self.closed.load(Ordering::Acquire) {
                return;
            }
            let now = Instant::now();
            // Cleared before the slots are read: a body publishing afterwards has it set again
            // (see `first_step`). The first steps due are registered, so collected below.
            {
                let mut state = self.state();
                state.first_step_look = None;
                self.first_steps.store(false, Ordering::SeqCst);
            }
            let first_steps = first_step::sweep(self.id, now);
            let Collected {
                batch,
                capped,
                mut next,
            } = self.collect(now);
            if let Some(period) = first_steps.period {
                // Bodies still in their first step: looked at again within the period.
                self.first_step_period
                    .store(nanos(period), Ordering::Relaxed);
                self.first_steps.store(true, Ordering::SeqCst);
                let look = first_steps
                    .earliest
                    .unwrap_or(now + period)
                    .min(now + period);
                let mut state = self.state();
                let planned = state.next_wake.map_or(look, |w| w.min(look));
                self.plan(&mut state, Some(planned));
                next = Some(planned);
            } else {
                self.first_step_period.store(u64::MAX, Ordering::Relaxed);
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
