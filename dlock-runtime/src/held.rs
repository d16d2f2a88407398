//! One acquisition in the engine, shared by the guards of its reentrant holds.
//!
//! Its hold count is zero exactly when the acquisition ended: nobody re-enters it then. Only
//! the innermost scoped user of a hold (or a frame it called) may re-enter it, so concurrent
//! branches of one body take turns.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use once_cell::sync::OnceCell;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::backend::Backend;
use crate::backend::mode::Mode;
use crate::baton::Baton;
use crate::core::Core;
use crate::lease::{LostSignal, Validity, hold_left};
use crate::watchdog::{FirstStep, Published, publish_first_step};

/// A level of the call chain, as a hold sees it (`chain::Frame`).
pub(crate) trait Registry: Send + Sync {
    /// Whether the level `id` is this one or one of its callers.
    fn descends_from(&self, id: u64) -> bool;
    /// Forgets the innermost occurrence of `held` among this level's holds.
    fn remove(&self, held: &Arc<Held>);
}

/// One acquisition in the engine, shared by the guards of its reentrant holds.
pub(crate) struct Held {
    pub(crate) core: Arc<Core>,
    pub(crate) key: String,
    pub(crate) owner: String,
    pub(crate) fence: Option<u64>,
    /// The lease state, made when first asked for ([`Held::lost`]): a scoped body that ends
    /// without waiting never needs one.
    signal: OnceCell<Arc<LostSignal>>,
    /// The clock's reading when the hold was registered, and the validity confirmed then (what
    /// the lost signal is made from).
    registered: (Instant, Instant),
    /// The part of the lease counted on (the lease less the engine's clock-drift allowance):
    /// renewals come every third of it.
    pub(crate) effective: Duration,
    /// Its watchdog entry: an id, [`UNTRACKED`] (a scoped hold whose body has not waited yet,
    /// see [`Held::watch`]) or [`UNTRACKED_ENDED`].
    watchdog_id: AtomicU64,
    /// What it was acquired with (a hand-off goes only to a waiter asking the same).
    pub(crate) terms: Terms,
    /// One past the last fencing token reserved for this acquisition (see `handoff`).
    pub(crate) fences_end: u64,
    /// When its acquisition request was sent (a hand-over: when it was handed over).
    pub(crate) acquired_at: Instant,
    /// The frame that acquired it (0: none, outside any call chain).
    frame: u64,
    /// Until when the key stays taken whenever the hold ends ([`Terms::hold`] after the
    /// acquisition's answer arrived); `None` without `hold_at_least`.
    pub(crate) hold_until: Option<Instant>,
    holds: Mutex<Holds>,
    /// Woken when a scoped re-entry ends or the hold ends: a sibling may take its turn.
    turn: Notify,
    /// Handed to another holder of this runtime when it ended (nothing to release).
    passed: AtomicBool,
}

/// [`Held::watchdog_id`] of a hold the watchdog does not track yet.
const UNTRACKED: u64 = 0;
/// [`Held::watchdog_id`] of a hold that ended before the watchdog tracked it.
const UNTRACKED_ENDED: u64 = u64::MAX;

/// The guards of one acquisition.
struct Holds {
    /// Live guards. Zero means released (or being released): nobody may re-enter then.
    count: usize,
    /// Frames of the scoped re-entries in progress, innermost last. Only the innermost (else
    /// the acquiring frame) and the frames it called may re-enter: concurrent branches of one
    /// body take turns.
    nested: Vec<u64>,
}

/// The outcome of asking to re-enter a hold.
pub(crate) enum Reentry {
    /// A hold was added.
    Entered,
    /// A concurrent branch of the chain is inside it: wait for [`Held::turn`].
    Busy,
    /// Released: acquire fresh.
    Ended,
}

/// What an acquisition asks for, besides its key and owner.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Terms {
    pub(crate) lease: Duration,
    /// Whether the watchdog renews the lease.
    pub(crate) renew: bool,
    /// The call-chain frame that will use the hold (0: none).
    pub(crate) frame: u64,
    /// `hold_at_least`: the key stays taken at least this long after the acquisition, even
    /// when the hold ends sooner (zero: released at once).
    pub(crate) hold: Duration,
    /// Exclusive (write), read, or a semaphore permit.
    pub(crate) mode: Mode,
    /// A fair lock (`fair(true)`): never handed to a local waiter out of turn.
    pub(crate) fair: bool,
    /// Tracked by the watchdog only from [`Held::watch`] on: the hold of a scoped run, whose
    /// body most often ends in its first poll, long before a renewal would be due.
    pub(crate) track_on_wait: bool,
}

impl Held {
    pub(crate) fn new(
        core: &Arc<Core>,
        key: String,
        owner: String,
        fence: Option<u64>,
        terms: Terms,
        sent_at: Instant,
    ) -> Arc<Self> {
        let Terms { lease, renew, .. } = terms;
        let drift = drift(core, lease);
        // One reading of the clock, as the hold is registered: the first step of a scoped
        // body is checked against it (see `LossCheck`).
        let now = Instant::now();
        let valid_until = sent_at + lease.saturating_sub(drift);
        let (watchdog_id, lost) = if terms.track_on_wait {
            (UNTRACKED, None)
        } else {
            let lost = Arc::new(LostSignal::new(now, valid_until));
            let (id, lost) =
                core.watchdog
                    .register(&key, &owner, lease, drift, renew, sent_at, Some(lost));
            (id, Some(lost))
        };
        tracing::debug!(key = %key, ?fence, ?lease, watchdog = renew, "lock acquired");
        let fences_end = fence.map_or(0, |f| f.saturating_add(core.caps.fence_block));
        Self::with(
            core,
            key,
            owner,
            fence,
            fences_end,
            terms,
            (watchdog_id, sent_at),
            (lost, (now, valid_until), lease.saturating_sub(drift)),
        )
    }

    /// A hold handed over by another holder of this runtime (see `handoff`): same engine hold
    /// and watchdog entry, the next fencing token, a lost signal of its own.
    pub(crate) fn handed(
        core: &Arc<Core>,
        key: String,
        baton: Baton,
        lost: Arc<LostSignal>,
        terms: Terms,
    ) -> Arc<Self> {
        tracing::debug!(key = %key, fence = baton.fence, "lock handed over within the runtime");
        let now = Instant::now();
        let effective = baton.effective;
        Self::with(
            core,
            key,
            baton.owner,
            Some(baton.fence),
            baton.fences_end,
            terms,
            (baton.watchdog_id, now),
            (Some(lost), (now, now), effective),
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn with(
        core: &Arc<Core>,
        key: String,
        owner: String,
        fence: Option<u64>,
        fences_end: u64,
        terms: Terms,
        (watchdog_id, acquired_at): (u64, Instant),
        (lost, registered, effective): (Option<Arc<LostSignal>>, (Instant, Instant), Duration),
    ) -> Arc<Self> {
        // Made with its value where there is one: no synchronisation to set it.
        let signal = lost.map_or_else(OnceCell::new, OnceCell::with_value);
        Arc::new(Self {
            acquired_at,
            core: core.clone(),
            key,
            owner,
            fence,
            signal,
            registered,
            effective,
            watchdog_id: AtomicU64::new(watchdog_id),
            terms,
            fences_end,
            frame: terms.frame,
            // Counted from now, after the engine answered: later than the engine's own
            // acquisition, so the key is never kept for less than asked.
            hold_until: (!terms.hold.is_zero()).then(|| Instant::now() + terms.hold),
            holds: Mutex::new(Holds {
                count: 1,
                nested: Vec::new(),
            }),
            turn: Notify::new(),
            passed: AtomicBool::new(false),
        })
    }

    /// Has the watchdog track this hold, if it does not yet: renewals (with `renew`) and the
    /// loss of the lease on the local clock. Every hold is tracked from its acquisition except
    /// that of a scoped run ([`Terms::track_on_wait`]), tracked from the first time its body
    /// waits: a body that ends in its first poll is never tracked. The validity of an
    /// untracked hold is still checked before each step of the body (`LossCheck`), and a
    /// first step that runs until its renewal falls due (a body blocking its thread) is
    /// tracked by the watchdog itself (see `watchdog::first_step`). Whether this call made
    /// the entry.
    pub(crate) fn watch(&self) -> bool {
        if self.watchdog_id.load(Ordering::Acquire) != UNTRACKED {
            return false;
        }
        let core = &self.core;
        let lease = self.terms.lease;
        // As counted in `Held::new`.
        let drift = lease.saturating_sub(self.effective);
        // A fresh hold's `acquired_at` is when its request was sent.
        let (id, _) = core.watchdog.register(
            &self.key,
            &self.owner,
            lease,
            drift,
            self.terms.renew,
            self.acquired_at,
            Some(self.lost().clone()),
        );
        match self
            .watchdog_id
            .compare_exchange(UNTRACKED, id, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => true,
            // Ended meanwhile (or tracked by another caller): this entry is not needed.
            Err(_) => {
                core.watchdog.unregister(id);
                false
            }
        }
    }

    /// Publishes this hold, whose body is about to take its first step untracked, for the
    /// watchdog (see `watchdog::first_step`) while the returned value lives: registered by it
    /// if the step still runs when its first renewal falls due.
    pub(crate) fn publish_first_step(self: &Arc<Self>) -> Option<Published> {
        let published = publish_first_step(self);
        if published.is_some() {
            self.core.watchdog.first_step_published(self.effective);
        } else {
            self.watch();
        }
        published
    }

    /// Whether the watchdog does not track this hold (yet: a scoped hold whose body has not
    /// waited, see [`Held::watch`]).
    pub(crate) fn is_untracked(&self) -> bool {
        self.watchdog_id.load(Ordering::Acquire) == UNTRACKED
    }

    /// When the first renewal of this hold falls due: a third of its effective lease after
    /// the acquisition.
    pub(crate) fn first_due(&self) -> Instant {
        self.acquired_at + self.effective / 3
    }

    /// Its watchdog entry, tracked from now on if it was not (a hand-over passes the entry).
    pub(crate) fn watchdog_id(&self) -> u64 {
        self.watch();
        self.watchdog_id.load(Ordering::Acquire)
    }

    /// Stops tracking this hold (released, or its entry replaced).
    pub(crate) fn unwatch(&self) {
        match self.watchdog_id.swap(UNTRACKED_ENDED, Ordering::AcqRel) {
            UNTRACKED | UNTRACKED_ENDED => {}
            id => self.core.watchdog.unregister(id),
        }
    }

    /// The lease state of this hold, shared by its guards and the watchdog (made now if it was
    /// not yet, from the validity confirmed at the registration).
    pub(crate) fn lost(&self) -> &Arc<LostSignal> {
        self.signal.get_or_init(|| {
            let (now, valid_until) = self.registered;
            Arc::new(LostSignal::new(now, valid_until))
        })
    }

    /// Whether the lease was lost in the engine (or on the local clock); a hold without a lost
    /// signal yet was not (nothing could have told it).
    pub(crate) fn lease_lost(&self) -> bool {
        self.signal.get().is_some_and(|s| s.lease_lost())
    }

    /// Whether the lock no longer protects its guards (see [`LostSignal::is_lost`]); a hold
    /// without a lost signal yet is not lost.
    pub(crate) fn is_lost(&self) -> bool {
        self.signal.get().is_some_and(|s| s.is_lost())
    }

    /// How long the lock stays ours if no renewal succeeds from now on (zero once lost).
    pub(crate) fn valid_for(&self) -> Duration {
        match self.signal.get() {
            Some(signal) => signal.valid_for(),
            None => self.registered.1.saturating_duration_since(Instant::now()),
        }
    }

    fn holds(&self) -> std::sync::MutexGuard<'_, Holds> {
        // Nothing panics while holding it; a poisoned lock still holds consistent data.
        self.holds.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds a reentrant hold for code running in `from`, if it is the innermost user's frame
    /// or called from it. `scope` is the frame a scoped re-entry opens (it becomes the
    /// innermost user until [`leave`](Held::leave) with the same scope).
    pub(crate) fn reenter(&self, from: &dyn Registry, scope: Option<u64>) -> Reentry {
        let mut holds = self.holds();
        if holds.count == 0 {
            return Reentry::Ended;
        }
        let user = holds.nested.last().copied().unwrap_or(self.frame);
        if !from.descends_from(user) {
            return Reentry::Busy;
        }
        holds.count += 1;
        if let Some(scope) = scope {
            holds.nested.push(scope);
        }
        Reentry::Entered
    }

    /// A future that resolves when a concurrent branch may have left the hold. Enabled: a
    /// wake-up between this call and the next [`reenter`](Held::reenter) is not lost.
    pub(crate) fn turn(&self) -> std::pin::Pin<Box<tokio::sync::futures::Notified<'_>>> {
        let mut notified = Box::pin(self.turn.notified());
        notified.as_mut().enable();
        notified
    }

    /// Drops a reentrant hold (and ends the scoped re-entry `scope`).
    pub(crate) fn leave(&self, scope: Option<u64>) {
        let mut holds = self.holds();
        holds.count = holds.count.saturating_sub(1);
        if let Some(scope) = scope {
            if let Some(i) = holds.nested.iter().rposition(|&f| f == scope) {
                holds.nested.remove(i);
            }
            drop(holds);
            self.turn.notify_waiters();
        }
    }

    /// Ends the acquisition (its first guard left): nobody may re-enter, and a reentrant guard
    /// still alive (moved out of the chain) reports the lock lost from now on.
    pub(crate) fn end(&self) {
        let mut holds = self.holds();
        let orphans = holds.count > 1;
        holds.count = 0;
        holds.nested.clear();
        drop(holds);
        if orphans {
            self.lost().orphan();
        }
        self.turn.notify_waiters();
    }

    /// Records that the hold went to another holder of this runtime when it ended.
    pub(crate) fn mark_passed(&self) {
        self.passed.store(true, Ordering::Release);
    }

    /// Whether the hold went to another holder of this runtime when it ended.
    pub(crate) fn passed(&self) -> bool {
        self.passed.load(Ordering::Acquire)
    }

    /// How long the key must still stay taken after this hold ends (`hold_at_least`), if at
    /// all.
    pub(crate) fn hold_left(&self) -> Option<Duration> {
        hold_left(self.hold_until)
    }

    /// Whether the acquisition is still in force.
    pub(crate) fn is_held(&self) -> bool {
        self.holds().count > 0
    }
}

impl Validity for Held {
    fn expired_when_made(&self) -> bool {
        match self.signal.get() {
            Some(signal) => signal.expired_when_made(),
            None => self.registered.1 <= self.registered.0,
        }
    }

    fn expired(&self) -> bool {
        match self.signal.get() {
            Some(signal) => signal.expired(),
            None => Instant::now() >= self.registered.1,
        }
    }

    fn is_lost(&self) -> bool {
        Held::is_lost(self)
    }
}

/// The part of `lease` not counted on (engine clock drift). Checked when the lock was
/// requested; counting on nothing is the safe answer otherwise.
fn drift(core: &Core, lease: Duration) -> Duration {
    core.backend.lease_margin(lease).unwrap_or(lease)
}

impl FirstStep for Held {
    fn scheduler(&self) -> u64 {
        self.core.watchdog.id()
    }

    fn is_untracked(&self) -> bool {
        Held::is_untracked(self)
    }

    fn first_due(&self) -> Instant {
        Held::first_due(self)
    }

    fn effective(&self) -> Duration {
        self.effective
    }

    fn watch(&self) {
        Held::watch(self);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::Runtime;

    /// A hold tracked only once its body waits has no lost signal until asked: it is checked
    /// on the clock against the validity confirmed at its registration, and the signal made
    /// later counts from that registration too.
    #[tokio::test(start_paused = true)]
    async fn an_untracked_hold_counts_its_validity_from_its_registration() {
        let rt = Runtime::from_url("memory://").await.expect("memory");
        let mut lock = rt.lock("job").lease(Duration::from_secs(1)).watchdog(false);
        lock.track_on_wait = true;
        let guard = lock.acquire().await.expect("acquire");
        let held = guard.held().clone();
        assert!(held.signal.get().is_none(), "a signal was made unasked");
        assert_eq!(rt.held_count(), 0, "tracked before its body waited");
        assert!(!Validity::expired_when_made(&*held));
        assert!(!Validity::is_lost(&*held));
        tokio::time::advance(Duration::from_millis(1500)).await;
        assert!(Validity::expired(&*held), "valid past its lease");
        assert!(held.valid_for().is_zero());
        assert!(held.signal.get().is_none());
        assert!(
            held.lost().expired(),
            "the signal counts from its own making"
        );
        held.watch();
        assert_eq!(rt.held_count(), 1, "not tracked once asked to be");
        drop(guard);
        assert_eq!(rt.held_count(), 0, "still tracked after its end");
    }
}
