//! Handing a held lock to the next waiter of this runtime, without a round trip (the policy;
//! the hold travels as a [`Baton`]).
//!
//! When the last guard of a lock ends while a waiter of this runtime heads the local queue of
//! its key with the same terms, the hold is not released in the engine: it passes to that
//! waiter with the next fencing token of the block its acquisition reserved, the same watchdog
//! entry and a lost signal of its own. Every holder still gets a token above every earlier
//! holder's: each block is reserved while the key is held, after every earlier acquisition's.
//! Not handed over: unrenewed leases, locks known lost, shared holds (read, permits), fair
//! locks, holds kept by `hold_at_least`, and engines whose block is 1 token.

use std::sync::Arc;

use crate::baton::Baton;
use crate::core::Core;
use crate::held::{Held, Terms};
use crate::wait::{HeadTerms, KeyQueue, Parked};

/// The baton of `held` for the next holder, with the next token `fence` of a block ending
/// before `fences_end`, tracked by the watchdog as `watchdog_id`.
fn baton(held: &Held, fence: u64, fences_end: u64, watchdog_id: u64) -> Baton {
    let core = &held.core;
    Baton {
        releaser: core.releaser.clone(),
        watchdog: core.watchdog.clone(),
        owner: held.owner.clone(),
        fence,
        fences_end,
        watchdog_id,
        lease: held.terms.lease,
        effective: held.effective,
    }
}

/// Whether `held` may go to another holder of this runtime at all.
fn may_pass(held: &Held) -> bool {
    // Readers and permit holders share their key: theirs is not the key to hand over. A fair
    // lock goes to the first in line across processes, whoever that is. A hold that keeps its
    // key (`hold_at_least`) keeps it from every other holder.
    !held.terms.mode.is_shared()
        && !held.terms.fair
        && held.hold_left().is_none()
        && held.terms.renew
        && !held.lease_lost()
}

/// Passes `held` (its last guard just ended) to the head waiter of its key, if one waits with
/// the same terms. `true` when passed: the caller must neither release it in the engine nor
/// stop its renewals.
pub(crate) fn pass(held: &Held) -> bool {
    if !may_pass(held) {
        return false;
    }
    let Some(next) = held.fence.and_then(|f| f.checked_add(1)) else {
        return false;
    };
    if next >= held.fences_end {
        return false;
    }
    // Under the hub's lock: the last waiter cannot leave between finding the queue and
    // parking the hold in it (see `Ticket`'s drop). The clock is read, and the baton made,
    // only where a queue of this key exists: an uncontended release copies nothing.
    held.core
        .hub
        .with_queue(&held.key, |queue| {
            !held.valid_for().is_zero()
                && queue.offer(baton(held, next, held.fences_end, held.watchdog_id()))
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
    if !may_pass(held) || held.core.caps.fence_block <= 1 {
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
                queue.slot().fits(held.terms.lease) && !held.valid_for().is_zero()
            })
            .unwrap_or(false)
}

/// Hands `held`, kept by the engine with a new block of tokens ending at `last` and tracked
/// by the watchdog as `watchdog_id`, to the head waiter (or parks it for the next head).
/// `false` when no waiter takes it now: the caller releases it.
pub(crate) fn pass_extended(held: &Held, last: u64, watchdog_id: u64) -> bool {
    let block = held.core.caps.fence_block;
    let first = last.saturating_sub(block.saturating_sub(1)).max(1);
    let baton = baton(held, first, last.saturating_add(1), watchdog_id);
    held.core
        .hub
        .with_queue(&held.key, |queue| queue.offer(baton))
        .unwrap_or(false)
}

/// The head waiter's place in its queue's slot: while it exists, holders may hand the lock to
/// it. Dropped (acquired, timed out, cancelled), it takes its name off, and releases a hold
/// handed to it that it never took.
pub(crate) struct Head<'a> {
    core: &'a Arc<Core>,
    queue: &'a KeyQueue<Baton>,
}

impl<'a> Head<'a> {
    /// Registers the head waiter of `queue`, which asks for `terms`. Only renewed leases are
    /// handed over: a hold parked for this head with other terms is released.
    pub(crate) fn new(core: &'a Arc<Core>, queue: &'a KeyQueue<Baton>, terms: Terms) -> Self {
        // Only an exclusive waiter takes an exclusive hold.
        let head = if terms.renew && !terms.mode.is_shared() {
            HeadTerms::Renewed(terms.lease)
        } else {
            HeadTerms::None
        };
        let unfit = queue.slot().set_head(head);
        if let Some(baton) = unfit {
            baton.strand(&queue.key);
        }
        Self { core, queue }
    }

    /// The hold handed over, as this waiter's, if one was.
    pub(crate) fn take(&self, key: &str, terms: Terms) -> Option<Arc<Held>> {
        let baton = self.queue.slot().take()?;
        // The lease may have been found lost between the hand-off and now.
        match self.core.watchdog.transfer(baton.watchdog_id) {
            Some(lost) => Some(Held::handed(self.core, key.to_owned(), baton, lost, terms)),
            None => {
                self.core
                    .releaser
                    .release_in_background(key.to_owned(), baton.owner, None);
                None
            }
        }
    }
}

impl Drop for Head<'_> {
    fn drop(&mut self) {
        let stranded = self.queue.slot().vacate();
        if let Some(baton) = stranded {
            baton.strand(&self.queue.key);
        }
    }
}
