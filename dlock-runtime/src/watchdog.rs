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
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::backend::{Backend, Renewal};

/// Resolves the holders of one lock once its lease is known lost.
#[derive(Debug, Default)]
pub(crate) struct LostSignal {
    lost: AtomicBool,
    notify: Arc<Notify>,
}

impl LostSignal {
    pub(crate) fn fire(&self) {
        self.lost.store(true, Ordering::Release);
        self.notify.notify_waiters();
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }

    /// A registered waiter that resolves at the next `fire` (check [`is_lost`] after
    /// registering to close the race with an earlier one).
    ///
    /// [`is_lost`]: LostSignal::is_lost
    pub(crate) fn watch(&self) -> std::pin::Pin<Box<tokio::sync::futures::OwnedNotified>> {
        let mut notified = Box::pin(self.notify.clone().notified_owned());
        notified.as_mut().enable();
        notified
    }

    pub(crate) async fn wait(&self) {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.is_lost() {
                return;
            }
            notified.await;
        }
    }
}

#[derive(Debug)]
struct Entry {
    key: String,
    owner: String,
    lease: Duration,
    renew: bool,
    due: Instant,
    valid_until: Instant,
    in_flight: bool,
    lost: Arc<LostSignal>,
}

impl Entry {
    /// When the scheduler must look at this entry next.
    fn next_look(&self) -> Instant {
        if self.renew && !self.in_flight {
            self.due.min(self.valid_until)
        } else {
            self.valid_until
        }
    }
}

#[derive(Debug, Default)]
struct State {
    entries: HashMap<u64, Entry>,
    next_id: u64,
    /// The instant the scheduler sleeps until (`None`: indefinitely).
    next_wake: Option<Instant>,
}

/// The renewal scheduler of one runtime.
#[derive(Debug, Default)]
pub(crate) struct Watchdog {
    state: Mutex<State>,
    wake: Notify,
    closed: AtomicBool,
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

impl Watchdog {
    fn state(&self) -> MutexGuard<'_, State> {
        // Every critical section leaves `State` consistent; a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Tracks a freshly acquired lock whose acquire request was sent at `sent_at`.
    pub(crate) fn register(
        &self,
        key: &str,
        owner: &str,
        lease: Duration,
        renew: bool,
        sent_at: Instant,
    ) -> (u64, Arc<LostSignal>) {
        let lost = Arc::new(LostSignal::default());
        let valid_until = sent_at + lease;
        let entry = Entry {
            key: key.to_owned(),
            owner: owner.to_owned(),
            lease,
            renew,
            due: sent_at + lease / 3,
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
            state.next_wake = Some(look);
        }
        drop(state);
        if sooner {
            self.wake.notify_one();
        }
        (id, lost)
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

    /// Fires the lost entries, marks the due ones in flight and returns them with the instant
    /// to look again.
    fn collect(&self, now: Instant) -> (Vec<(u64, Renewal)>, Option<Instant>) {
        let mut state = self.state();
        let mut batch = Vec::new();
        let mut next: Option<Instant> = None;
        state.entries.retain(|&id, e| {
            if now >= e.valid_until {
                if e.renew {
                    tracing::warn!(key = %e.key, "lease lost: no confirmed renewal before it ran out");
                }
                e.lost.fire();
                return false;
            }
            if e.renew && !e.in_flight && e.due <= now + coalesce_window(e.lease) {
                e.in_flight = true;
                batch.push((
                    id,
                    Renewal {
                        key: e.key.clone(),
                        owner: e.owner.clone(),
                        lease: e.lease,
                    },
                ));
            }
            let look = e.next_look();
            next = Some(next.map_or(look, |n| n.min(look)));
            true
        });
        state.next_wake = next;
        (batch, next)
    }

    /// Applies the outcome of one renewal call sent at `sent_at`.
    fn settle(&self, ids: &[u64], sent_at: Instant, outcome: Result<Vec<bool>, crate::LockError>) {
        let now = Instant::now();
        let mut state = self.state();
        for (i, id) in ids.iter().enumerate() {
            let Some(entry) = state.entries.get_mut(id) else {
                continue; // released meanwhile
            };
            entry.in_flight = false;
            match &outcome {
                Ok(renewed) if renewed.get(i).copied().unwrap_or(false) => {
                    entry.valid_until = sent_at + entry.lease;
                    entry.due = sent_at + entry.lease / 3;
                }
                Ok(_) => {
                    tracing::warn!(key = %entry.key, "lease lost: the engine says the lock is no longer ours");
                    entry.lost.fire();
                    state.entries.remove(id);
                }
                Err(err) => {
                    tracing::debug!(key = %entry.key, error = %err, "renewal failed; retrying");
                    entry.due = now + retry_delay(entry.lease);
                }
            }
        }
        drop(state);
        self.wake.notify_one();
    }

    /// The scheduler loop. Holds the backend weakly: the runtime's drop ends it.
    pub(crate) async fn run(self: Arc<Self>, backend: Weak<dyn Backend>, batch_limit: usize) {
        loop {
            if self.closed.load(Ordering::Acquire) {
                return;
            }
            let now = Instant::now();
            let (batch, next) = self.collect(now);
            if !batch.is_empty() {
                let Some(backend) = backend.upgrade() else {
                    return;
                };
                let mut batch = batch;
                while !batch.is_empty() {
                    let rest = batch.split_off(batch.len().min(batch_limit));
                    let chunk = std::mem::replace(&mut batch, rest);
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
mod tests {
    use super::*;
    use crate::backend::memory::MemoryBackend;
    use crate::backend::{Attempt, Backend};

    async fn setup() -> (Arc<Watchdog>, Arc<dyn Backend>) {
        let wd = Arc::new(Watchdog::default());
        let backend: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
        let weak = Arc::downgrade(&backend);
        tokio::spawn(wd.clone().run(weak, 512));
        (wd, backend)
    }

    #[tokio::test(start_paused = true)]
    async fn renews_every_third_of_the_lease_and_keeps_the_lock() {
        let (wd, backend) = setup().await;
        let lease = Duration::from_secs(3);
        let sent = Instant::now();
        backend.try_acquire("k", "a", lease).await.ok();
        let (_id, lost) = wd.register("k", "a", lease, true, sent);
        tokio::time::sleep(Duration::from_secs(20)).await;
        assert!(!lost.is_lost());
        let busy = backend.try_acquire("k", "b", lease).await.ok();
        assert!(matches!(busy, Some(Attempt::Busy { .. })), "{busy:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn hard_cap_fires_lost_at_the_lease() {
        let (wd, backend) = setup().await;
        let lease = Duration::from_secs(2);
        let sent = Instant::now();
        backend.try_acquire("k", "a", lease).await.ok();
        let (_id, lost) = wd.register("k", "a", lease, false, sent);
        tokio::time::sleep(Duration::from_millis(1990)).await;
        assert!(!lost.is_lost());
        tokio::time::timeout(Duration::from_millis(20), lost.wait())
            .await
            .expect("lost resolves at the lease");
    }

    #[tokio::test(start_paused = true)]
    async fn deleted_lock_is_lost_within_a_renewal_interval() {
        let (wd, backend) = setup().await;
        let lease = Duration::from_secs(3);
        let sent = Instant::now();
        backend.try_acquire("k", "a", lease).await.ok();
        let (_id, lost) = wd.register("k", "a", lease, true, sent);
        backend.force_unlock("k").await.ok();
        tokio::time::timeout(lease / 3 + Duration::from_millis(10), lost.wait())
            .await
            .expect("lost within lease/3");
    }

    #[tokio::test(start_paused = true)]
    async fn batches_locks_due_together() {
        let (wd, backend) = setup().await;
        let lease = Duration::from_secs(3);
        for i in 0..100 {
            let key = format!("k{i}");
            backend.try_acquire(&key, "a", lease).await.ok();
            wd.register(&key, "a", lease, true, Instant::now());
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // 100 locks acquired over one second are renewed in a handful of batches.
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(wd.len(), 100);
    }
}
