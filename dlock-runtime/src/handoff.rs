//! Handing a held lock to the next waiter of this runtime, without a round trip.
//!
//! When the last guard of a lock ends while a waiter of this runtime heads the local queue of
//! its key with the same terms (lease, renewal), the hold is not released in the engine: it
//! passes to that waiter, with the next fencing token of the block its acquisition reserved
//! ([`fence_block`](crate::backend::Backend::fence_block)), the same watchdog entry (the
//! renewals go on) and a lost signal of its own. A sale on a hot key then costs the critical
//! section's own round trips and nothing for the lock.
//!
//! The next head may not have taken its place yet when the hold ends (its turn was granted
//! but its task not polled yet: a holder that releases at once): the hold is then parked in
//! the slot for it, under the hub's lock, so that the last waiter leaving the queue finds and
//! releases a hold nobody will take ([`strand`]), and a head asking other terms releases it.
//!
//! Bounded by the block: once its tokens are used up, the engine is asked to end the hold
//! ([`wants_extension`]): when a waiter of this runtime wants the key next and no waiter of
//! another process has flagged it, the engine keeps it with a new block and a renewed lease
//! in the same round trip (`lua/extend.lua`), and it is handed over again; otherwise it is
//! released, and waiters of other processes get their turn (Redis reserves a flagged release
//! for the process first in the key's line, see `lua/release.lua`). Every holder still gets a token above every earlier
//! holder's: each block is reserved by one `INCRBY` while the key is held, after every earlier
//! acquisition's. Not handed over: a
//! lock whose lease is not renewed (its lease runs from the first acquisition), a lock known
//! lost, a read lock or semaphore permit (never handed, nor handed to: the key is shared),
//! and engines whose tokens cannot be reserved in blocks (block of 1).
//!
//! Engines with a queue of their own (etcd, ZooKeeper) do not come here: their waiters queue
//! in the engine, each with an entry of its own whose creation is its fence, and the engine
//! hands a released key to the waiter of this runtime right behind the holder without a round
//! trip (`backend/successor.rs`), in the engine's FIFO order across processes.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use crate::core::{Core, release_in_background};
use crate::held::{Held, Terms};
use crate::wait::KeyQueue;

/// A hold on its way from one holder to the next.
pub(crate) struct Baton {
    core: Arc<Core>,
    pub(crate) owner: String,
    /// The next holder's fencing token.
    pub(crate) fence: u64,
    /// One past the last token of the block.
    pub(crate) fences_end: u64,
    pub(crate) watchdog_id: u64,
    lease: Duration,
    /// The part of the lease counted on (see [`Held::effective`]), the same for the next
    /// holder: a hold is handed only to a waiter asking the same lease.
    pub(crate) effective: Duration,
}

impl std::fmt::Debug for Baton {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Baton")
            .field("fence", &self.fence)
            .field("fences_end", &self.fences_end)
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}

/// Who heads a queue, as far as hand-overs go.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum HeadTerms {
    /// Nobody yet: a hold may be parked for the next head, which checks its terms.
    #[default]
    Vacant,
    /// A head whose lease (this long) is renewed: it takes holds with the same lease.
    Renewed(Duration),
    /// A head that takes no hand-over (its lease is a hard cap).
    None,
}

/// A queue's head waiter (its terms) and the hold handed to it, if any.
#[derive(Debug, Default)]
pub(crate) struct Slot {
    head: HeadTerms,
    baton: Option<Baton>,
}

impl Slot {
    fn fits(&self, lease: Duration) -> bool {
        let head_fits = match self.head {
            HeadTerms::Vacant => true,
            HeadTerms::Renewed(head) => head == lease,
            HeadTerms::None => false,
        };
        head_fits && self.baton.is_none()
    }
}

/// Passes `held` (its last guard just ended) to the head waiter of its key, if one waits with
/// the same terms. `true` when passed: the caller must neither release it in the engine nor
/// stop its renewals.
pub(crate) fn pass(held: &Held) -> bool {
    // Readers and permit holders share their key: theirs is not the key to hand over. A fair
    // lock goes to the first in line across processes, whoever that is.
    if held.terms.mode.is_shared() || held.terms.fair {
        return false;
    }
    // A hold that keeps its key (`hold_at_least`) keeps it from every other holder.
    if held.hold_left().is_some() {
        return false;
    }
    if !held.terms.renew || held.lease_lost() {
        return false;
    }
    let Some(next) = held.fence.and_then(|f| f.checked_add(1)) else {
        return false;
    };
    if next >= held.fences_end {
        return false;
    }
    // Under the hub's lock: the last waiter cannot leave between finding the queue and
    // parking the hold in it (see `strand`).
    // The clock is read, and the baton made, only where a queue of this key exists (a waiter
    // may take the hold): an uncontended release copies nothing.
    held.core
        .hub
        .with_queue(&held.key, |queue| {
            !held.valid_for().is_zero()
                && queue.offer(Baton {
                    core: held.core.clone(),
                    owner: held.owner.clone(),
                    fence: next,
                    fences_end: held.fences_end,
                    watchdog_id: held.watchdog_id(),
                    lease: held.terms.lease,
                    effective: held.effective,
                })
        })
        .unwrap_or(false)
}

/// Whether `held` (its last guard just ended, [`pass`] declined) has used up its block of
/// tokens while a head waiter of this runtime wants it with the same terms: then the engine is
/// asked to keep it with a new block ([`Backend::release_or_extend`]: one round trip, where a
/// release and the head's attempt take two), unless another runtime waits.
///
/// [`Backend::release_or_extend`]: crate::backend::Backend::release_or_extend
pub(crate) fn wants_extension(held: &Held) -> bool {
    if held.terms.mode.is_shared()
        || held.hold_left().is_some()
        || !held.terms.renew
        || held.lease_lost()
        || held.core.backend.fence_block() <= 1
    {
        return false;
    }
    let used_up = held
        .fence
        .and_then(|f| f.checked_add(1))
        .is_some_and(|next| next >= held.fences_end);
    used_up
        && held
            .core
            .hub
            .with_queue(&held.key, |queue| {
                queue.fits(held.terms.lease) && !held.valid_for().is_zero()
            })
            .unwrap_or(false)
}

/// Hands `held`, kept by the engine with a new block of tokens ending at `last` and tracked
/// by the watchdog as `watchdog_id`, to the head waiter (or parks it for the next head).
/// `false` when no waiter takes it now: the caller releases it.
pub(crate) fn pass_extended(held: &Held, last: u64, watchdog_id: u64) -> bool {
    let block = held.core.backend.fence_block();
    let baton = Baton {
        core: held.core.clone(),
        owner: held.owner.clone(),
        fence: last.saturating_sub(block.saturating_sub(1)).max(1),
        fences_end: last.saturating_add(1),
        watchdog_id,
        lease: held.terms.lease,
        effective: held.effective,
    };
    held.core
        .hub
        .with_queue(&held.key, |queue| queue.offer(baton))
        .unwrap_or(false)
}

/// Releases a hold of `key` nobody will take: its watchdog entry ends and the engine is told.
fn release(key: &str, baton: Baton) {
    baton.core.watchdog.unregister(baton.watchdog_id);
    release_in_background(baton.core, key.to_owned(), baton.owner, None);
}

/// The last waiter left `queue` (now out of the hub): a hold parked there is released.
pub(crate) fn strand(queue: &KeyQueue) {
    let parked = queue.slot().baton.take();
    if let Some(baton) = parked {
        release(&queue.key, baton);
    }
}

impl KeyQueue {
    fn slot(&self) -> MutexGuard<'_, Slot> {
        // Plain field updates: a poisoned lock is consistent.
        self.slot.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether a hold with `lease` would be taken by the head waiter, or parked for the next
    /// head: nobody has one yet, and the head (if any) asks for the same terms.
    fn fits(&self, lease: Duration) -> bool {
        self.slot().fits(lease)
    }

    /// Gives `baton` to the head waiter if it waits with the same terms and has none yet, or
    /// parks it for the next head if there is none yet. Called under the hub's lock.
    fn offer(&self, baton: Baton) -> bool {
        let mut slot = self.slot();
        if !slot.fits(baton.lease) {
            return false;
        }
        slot.baton = Some(baton);
        drop(slot);
        self.freed.notify_waiters();
        true
    }
}

/// The head waiter's place in [`Slot`]: while it exists, holders may hand the lock to it.
/// Dropped (acquired, timed out, cancelled), it takes its name off, and releases a hold handed
/// to it that it never took.
pub(crate) struct Head<'a> {
    core: &'a Arc<Core>,
    queue: &'a KeyQueue,
}

impl<'a> Head<'a> {
    /// Registers the head waiter of `queue`, which asks for `terms`. Only renewed leases are
    /// handed over: a hold parked for this head with other terms is released.
    pub(crate) fn new(core: &'a Arc<Core>, queue: &'a KeyQueue, terms: Terms) -> Self {
        let unfit = {
            let mut slot = queue.slot();
            // Only an exclusive waiter takes an exclusive hold.
            slot.head = if terms.renew && !terms.mode.is_shared() {
                HeadTerms::Renewed(terms.lease)
            } else {
                HeadTerms::None
            };
            let fits = slot
                .baton
                .as_ref()
                .is_none_or(|b| slot.head == HeadTerms::Renewed(b.lease));
            if fits { None } else { slot.baton.take() }
        };
        if let Some(baton) = unfit {
            release(&queue.key, baton);
        }
        Self { core, queue }
    }

    /// The hold handed over, as this waiter's, if one was.
    pub(crate) fn take(&self, key: &str, terms: Terms) -> Option<Arc<Held>> {
        let baton = self.queue.slot().baton.take()?;
        // The lease may have been found lost between the hand-off and now.
        match self.core.watchdog.transfer(baton.watchdog_id) {
            Some(lost) => Some(Held::handed(self.core, key.to_owned(), baton, lost, terms)),
            None => {
                release_in_background(self.core.clone(), key.to_owned(), baton.owner, None);
                None
            }
        }
    }
}

impl Drop for Head<'_> {
    fn drop(&mut self) {
        let stranded = {
            let mut slot = self.queue.slot();
            slot.head = HeadTerms::Vacant;
            slot.baton.take()
        };
        if let Some(baton) = stranded {
            release(&self.queue.key, baton);
        }
    }
}

/// The slot of a new queue.
pub(crate) fn slot() -> Mutex<Slot> {
    Mutex::new(Slot::default())
}
