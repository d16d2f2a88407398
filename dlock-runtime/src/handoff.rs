//! Handing a held lock to the next waiter of this runtime, without a round trip.
//!
//! When the last guard of a lock ends while a waiter of this runtime heads the local queue of
//! its key with the same terms (lease, renewal), the hold is not released in the engine: it
//! passes to that waiter, with the next fencing token of the block its acquisition reserved
//! ([`fence_block`](crate::backend::Backend::fence_block)), the same watchdog entry (the
//! renewals go on) and a lost signal of its own. A sale on a hot key then costs the critical
//! section's own round trips and nothing for the lock.
//!
//! Bounded by the block: once its tokens are used up, the lock is released in the engine,
//! where waiters of other processes get their turn (Redis reserves a flagged release for
//! them, see `lua/release.lua`). Every holder still gets a token above every earlier holder's:
//! the block was reserved by one `INCRBY` after every earlier acquisition's. Not handed over: a
//! lock whose lease is not renewed (its lease runs from the first acquisition), a lock known
//! lost, and engines whose tokens cannot be reserved in blocks (block of 1).

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use crate::core::{Core, release_in_background};
use crate::held::{Held, Terms};
use crate::wait::KeyQueue;

/// A hold on its way from one holder to the next.
#[derive(Debug)]
pub(crate) struct Baton {
    pub(crate) owner: String,
    /// The next holder's fencing token.
    pub(crate) fence: u64,
    /// One past the last token of the block.
    pub(crate) fences_end: u64,
    pub(crate) watchdog_id: u64,
    lease: Duration,
}

/// A queue's head waiter (its terms) and the hold handed to it, if any.
#[derive(Debug, Default)]
pub(crate) struct Slot {
    head: Option<Duration>,
    baton: Option<Baton>,
}

/// Passes `held` (its last guard just ended) to the head waiter of its key, if one waits with
/// the same terms. `true` when passed: the caller must neither release it in the engine nor
/// stop its renewals.
pub(crate) fn pass(held: &Held) -> bool {
    // A hold that keeps its key (`hold_at_least`) keeps it from every other holder.
    if held.hold_left().is_some() {
        return false;
    }
    if !held.terms.renew || held.lost.lease_lost() || held.lost.valid_for().is_zero() {
        return false;
    }
    let Some(next) = held.fence.and_then(|f| f.checked_add(1)) else {
        return false;
    };
    if next >= held.fences_end {
        return false;
    }
    let Some(queue) = held.core.hub.queue(&held.key) else {
        return false;
    };
    let baton = Baton {
        owner: held.owner.clone(),
        fence: next,
        fences_end: held.fences_end,
        watchdog_id: held.watchdog_id,
        lease: held.terms.lease,
    };
    queue.offer(baton)
}

impl KeyQueue {
    fn slot(&self) -> MutexGuard<'_, Slot> {
        // Plain field updates: a poisoned lock is consistent.
        self.slot.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Gives `baton` to the head waiter if it waits with the same terms and has none yet.
    fn offer(&self, baton: Baton) -> bool {
        let mut slot = self.slot();
        if slot.head != Some(baton.lease) || slot.baton.is_some() {
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
    /// handed over.
    pub(crate) fn new(core: &'a Arc<Core>, queue: &'a KeyQueue, terms: Terms) -> Self {
        if terms.renew {
            queue.slot().head = Some(terms.lease);
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
            slot.head = None;
            slot.baton.take()
        };
        if let Some(baton) = stranded {
            self.core.watchdog.unregister(baton.watchdog_id);
            release_in_background(self.core.clone(), self.queue.key.clone(), baton.owner, None);
        }
    }
}

/// The slot of a new queue.
pub(crate) fn slot() -> Mutex<Slot> {
    Mutex::new(Slot::default())
}
