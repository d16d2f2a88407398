//! Waiting by notification, without a herd: the local queue of each key, its subscription,
//! and the slot where a hold waits for the queue's head.
//!
//! Waiters in one process for one key queue locally ([`KeyQueue::turn`], a FIFO async mutex):
//! only the head contends with the engine, so a release wakes one local waiter, not all.
//! Subscriptions are reference-counted per key and changed by one task in order, so a
//! subscribe is never overtaken by an older unsubscribe of the same key. A hold parked in a
//! queue's [`Slot`] is always either taken by a head or handed back ([`Parked::strand`]).

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use tokio::sync::{Notify, mpsc, oneshot};

use crate::backend::{AnyBackend, Backend, Wakeups};
use crate::error::LockError;

/// A hold parked in a queue's [`Slot`] for its head waiter (the hand-over's baton).
pub(crate) trait Parked: Send + 'static {
    /// The lease it was acquired with: it goes only to a head asking the same.
    fn lease(&self) -> Duration;
    /// Nobody will take it (the queue emptied, or its head asks other terms): released.
    fn strand(self, key: &str);
}

/// Who heads a queue, as far as hand-overs go.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HeadTerms {
    /// Nobody yet: a hold may be parked for the next head, which checks its terms.
    #[default]
    Vacant,
    /// A head whose lease (this long) is renewed: it takes holds with the same lease.
    Renewed(Duration),
    /// A head that takes no hand-over (its lease is a hard cap).
    None,
}

/// A queue's head waiter (its terms) and the hold parked for it, if any.
#[derive(Debug)]
pub(crate) struct Slot<P> {
    head: HeadTerms,
    parked: Option<P>,
}

impl<P> Default for Slot<P> {
    fn default() -> Self {
        Self {
            head: HeadTerms::Vacant,
            parked: None,
        }
    }
}

impl<P: Parked> Slot<P> {
    /// Whether a hold with `lease` would be taken by the head, or parked for the next head:
    /// nothing is parked yet, and the head (if any) asks the same terms.
    pub(crate) fn fits(&self, lease: Duration) -> bool {
        let head_fits = match self.head {
            HeadTerms::Vacant => true,
            HeadTerms::Renewed(head) => head == lease,
            HeadTerms::None => false,
        };
        head_fits && self.parked.is_none()
    }

    /// A new head asking `terms`: a parked hold it would not take is handed back.
    pub(crate) fn set_head(&mut self, terms: HeadTerms) -> Option<P> {
        self.head = terms;
        let fits = self
            .parked
            .as_ref()
            .is_none_or(|p| terms == HeadTerms::Renewed(p.lease()));
        if fits { None } else { self.parked.take() }
    }

    /// The head left: the slot is vacant, and a hold parked for it is handed back.
    pub(crate) fn vacate(&mut self) -> Option<P> {
        self.head = HeadTerms::Vacant;
        self.parked.take()
    }

    /// The parked hold, taken.
    pub(crate) fn take(&mut self) -> Option<P> {
        self.parked.take()
    }
}

/// The local queue of one key.
#[derive(Debug)]
pub(crate) struct KeyQueue<P> {
    pub(crate) key: String,
    /// Held by the one waiter of this process that contends with the engine.
    pub(crate) turn: tokio::sync::Mutex<()>,
    /// Woken (all registered, i.e. the head waiter) when the key may be free.
    pub(crate) freed: Notify,
    /// Set by the subscription task once the engine delivers notifications for the key.
    watched: AtomicBool,
    /// A waiter of this queue acquired the key and has not released it yet: the next head
    /// waits for that local release instead of sending an attempt that must fail.
    held_here: AtomicBool,
    /// Lease (ms) of that local holder: bounds the wait if its release is never seen.
    held_lease_ms: AtomicU64,
    /// The head waiter and a hold handed to it.
    slot: Mutex<Slot<P>>,
}

impl<P: Parked> KeyQueue<P> {
    /// The head waiter's slot.
    pub(crate) fn slot(&self) -> MutexGuard<'_, Slot<P>> {
        // Plain field updates: a poisoned lock is consistent.
        self.slot.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Gives `parked` to the head waiter if it waits with the same terms and has none yet, or
    /// parks it for the next head if there is none yet (call under the hub's lock, see
    /// [`WaitHub::with_queue`]). `false` when declined.
    pub(crate) fn offer(&self, parked: P) -> bool {
        let mut slot = self.slot();
        if !slot.fits(parked.lease()) {
            return false;
        }
        slot.parked = Some(parked);
        drop(slot);
        self.freed.notify_waiters();
        true
    }

    /// Records that a waiter of this queue now holds the key.
    pub(crate) fn mark_held(&self, lease: Duration) {
        let ms = u64::try_from(lease.as_millis()).unwrap_or(u64::MAX);
        self.held_lease_ms.store(ms, Ordering::Relaxed);
        self.held_here.store(true, Ordering::Release);
    }

    /// If a waiter of this queue holds the key, its lease (the longest the head should wait
    /// for its release).
    pub(crate) fn held_here(&self) -> Option<Duration> {
        self.held_here
            .load(Ordering::Acquire)
            .then(|| Duration::from_millis(self.held_lease_ms.load(Ordering::Relaxed)))
    }

    /// Forgets the local holder (its release was seen, or waiting for it timed out).
    pub(crate) fn clear_held(&self) {
        self.held_here.store(false, Ordering::Release);
    }
}

enum SubOp<P> {
    Watch(Arc<KeyQueue<P>>, oneshot::Sender<Result<(), LockError>>),
    Done(Arc<KeyQueue<P>>),
}

/// Key -> (queue, number of waiters holding a ticket).
type Queues<P> = HashMap<String, (Arc<KeyQueue<P>>, usize)>;

/// The local queues of one runtime, and their subscriptions.
#[derive(Debug)]
pub(crate) struct WaitHub<P> {
    queues: Mutex<Queues<P>>,
    /// How many keys have a queue (changed under the `queues` lock): lookups skip the lock
    /// while nobody in this process waits, the common case of every acquisition and release.
    queued: AtomicUsize,
    ops: mpsc::UnboundedSender<SubOp<P>>,
}

impl<P> std::fmt::Debug for SubOp<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Watch(q, _) => write!(f, "Watch({})", q.key),
            Self::Done(q) => write!(f, "Done({})", q.key),
        }
    }
}

impl<P: Parked> WaitHub<P> {
    /// A hub and the receiving end its subscription task reads (see [`WaitHub::run_subscriptions`]).
    pub(crate) fn new() -> (Arc<Self>, SubscriptionOps<P>) {
        let (ops, rx) = mpsc::unbounded_channel();
        let hub = Arc::new(Self {
            queues: Mutex::new(HashMap::new()),
            queued: AtomicUsize::new(0),
            ops,
        });
        (hub, SubscriptionOps(rx))
    }

    fn queues(&self) -> MutexGuard<'_, Queues<P>> {
        // Map operations cannot be interrupted half-way, so a poisoned lock is consistent.
        self.queues.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether some waiter of this process is queued on `key` (newcomers then queue behind it
    /// instead of barging in).
    pub(crate) fn has_waiters(&self, key: &str) -> bool {
        self.anybody_waits() && self.queues().contains_key(key)
    }

    /// Whether any key has a queue. Without the lock: a queue made at this very moment is as
    /// if made just after the call, which every caller allows for (the newcomer's own attempt
    /// or notification follows).
    fn anybody_waits(&self) -> bool {
        self.queued.load(Ordering::Acquire) > 0
    }

    /// Runs `f` on the local queue of `key`, if anybody waits, under the hub's lock: no waiter
    /// joins or leaves meanwhile.
    pub(crate) fn with_queue<T>(&self, key: &str, f: impl FnOnce(&KeyQueue<P>) -> T) -> Option<T> {
        if !self.anybody_waits() {
            return None;
        }
        self.queues().get(key).map(|(queue, _)| f(queue))
    }

    /// Joins the local queue of `key`.
    pub(crate) fn join(self: &Arc<Self>, key: &str) -> Ticket<P> {
        let mut queues = self.queues();
        let queue = match queues.entry(key.to_owned()) {
            Entry::Occupied(mut e) => {
                e.get_mut().1 += 1;
                e.get().0.clone()
            }
            Entry::Vacant(e) => {
                let queue = Arc::new(KeyQueue {
                    key: key.to_owned(),
                    turn: tokio::sync::Mutex::new(()),
                    freed: Notify::new(),
                    watched: AtomicBool::new(false),
                    held_here: AtomicBool::new(false),
                    held_lease_ms: AtomicU64::new(0),
                    slot: Mutex::default(),
                });
                e.insert((queue.clone(), 1));
                self.queued.fetch_add(1, Ordering::AcqRel);
                queue
            }
        };
        drop(queues);
        Ticket {
            hub: self.clone(),
            queue,
        }
    }

    /// The key may be free: wake its head waiter.
    pub(crate) fn wake(&self, key: &str) {
        if !self.anybody_waits() {
            return;
        }
        if let Some((queue, _)) = self.queues().get(key) {
            queue.clear_held();
            queue.freed.notify_waiters();
        }
    }

    /// Notifications may have been missed (a reconnect): every head waiter retries.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn wake_all(&self) {
        for (queue, _) in self.queues().values() {
            queue.clear_held();
            queue.freed.notify_waiters();
        }
    }

    /// Applies subscription changes in order. Runs as a task until the hub is dropped; holds the
    /// backend weakly so the runtime's drop ends it.
    pub(crate) async fn run_subscriptions(mut ops: SubscriptionOps<P>, backend: Weak<AnyBackend>) {
        let mut counts: HashMap<String, usize> = HashMap::new();
        while let Some(op) = ops.0.recv().await {
            let Some(backend) = backend.upgrade() else {
                return;
            };
            match op {
                SubOp::Watch(queue, ack) => {
                    if queue.watched.load(Ordering::Acquire) {
                        let _ = ack.send(Ok(()));
                        continue;
                    }
                    let count = counts.entry(queue.key.clone()).or_insert(0);
                    let result = if *count == 0 {
                        backend.watch(&queue.key).await
                    } else {
                        Ok(())
                    };
                    if result.is_ok() {
                        *count += 1;
                        queue.watched.store(true, Ordering::Release);
                    } else if *count == 0 {
                        counts.remove(&queue.key);
                    }
                    let _ = ack.send(result);
                }
                SubOp::Done(queue) => {
                    if !queue.watched.load(Ordering::Acquire) {
                        continue;
                    }
                    if let Some(count) = counts.get_mut(&queue.key) {
                        *count -= 1;
                        if *count == 0 {
                            counts.remove(&queue.key);
                            if let Err(err) = backend.unwatch(&queue.key).await {
                                tracing::debug!(key = %queue.key, error = %err, "unsubscribe failed");
                            }
                        }
                    }
                }
            }
        }
    }
}

impl<P: Parked> Wakeups for WaitHub<P> {
    fn wake(&self, key: &str) {
        WaitHub::wake(self, key);
    }

    fn wake_all(&self) {
        WaitHub::wake_all(self);
    }
}

/// The receiving end of the hub's subscription changes.
#[derive(Debug)]
pub(crate) struct SubscriptionOps<P>(mpsc::UnboundedReceiver<SubOp<P>>);

/// A waiter's place in the local queue of one key; leaving (drop) unsubscribes the key when it
/// was the last waiter.
#[derive(Debug)]
pub(crate) struct Ticket<P: Parked> {
    hub: Arc<WaitHub<P>>,
    queue: Arc<KeyQueue<P>>,
}

impl<P: Parked> Ticket<P> {
    /// Whether no other waiter of this runtime is queued for the key.
    pub(crate) fn alone(&self) -> bool {
        self.hub
            .queues()
            .get(&self.queue.key)
            .is_some_and(|(queue, users)| Arc::ptr_eq(queue, &self.queue) && *users == 1)
    }

    pub(crate) fn queue(&self) -> &KeyQueue<P> {
        &self.queue
    }

    /// Makes sure the engine delivers notifications for this key before the next attempt.
    pub(crate) async fn ensure_watched(&self) -> Result<(), LockError> {
        if self.queue.watched.load(Ordering::Acquire) {
            return Ok(());
        }
        let (ack, done) = oneshot::channel();
        if self
            .hub
            .ops
            .send(SubOp::Watch(self.queue.clone(), ack))
            .is_err()
        {
            return Err(LockError::backend(
                Some(&self.queue.key),
                "the runtime's subscription task has stopped",
                None,
            ));
        }
        done.await.unwrap_or_else(|_| {
            Err(LockError::backend(
                Some(&self.queue.key),
                "the runtime's subscription task has stopped",
                None,
            ))
        })
    }
}

impl<P: Parked> Drop for Ticket<P> {
    fn drop(&mut self) {
        let mut queues = self.hub.queues();
        let last = match queues.get_mut(&self.queue.key) {
            Some((queue, users)) if Arc::ptr_eq(queue, &self.queue) => {
                *users -= 1;
                *users == 0
            }
            _ => false,
        };
        if last {
            queues.remove(&self.queue.key);
            self.hub.queued.fetch_sub(1, Ordering::AcqRel);
            drop(queues);
            // A hold parked for a next head that will never come.
            let parked = self.queue.slot().take();
            if let Some(parked) = parked {
                parked.strand(&self.queue.key);
            }
            // Sent even when not watched: ordered after any Watch of this queue, so the task
            // decides with the final `watched` state.
            let _ = self.hub.ops.send(SubOp::Done(self.queue.clone()));
        }
    }
}
