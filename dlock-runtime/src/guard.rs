//! The held lock: fence, lost signal, release (awaited or from `Drop`). The first guard of
//! an acquisition ends it, exactly once: by its release, or from its `Drop`.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{Backend, Extension, Released};
use crate::error::LockError;
use crate::handoff;
use crate::held::{Held, Registry};
use crate::lease::any_lost;
use crate::release::{ReleaseOnDrop, end_in_engine};

/// A held distributed lock.
///
/// Released by [`release`](LockGuard::release) (awaited, reports errors) or, if dropped
/// without it (early return, panic, cancellation), by a release scheduled on the runtime's
/// tokio handle right away, so the next waiter gets the lock within milliseconds rather than
/// after the lease.
///
/// Guards of reentrant acquisitions share the hold of the first one, which alone releases it
/// in the engine: a reentrant guard never outlives it. If one is kept past the end of the
/// first (returned from the call chain, or moved to another task), it reports the lock lost
/// from then on ([`is_lost`](LockGuard::is_lost), [`lost`](LockGuard::lost), and its
/// `release` returns [`LockError::Lost`]) instead of keeping the key locked.
///
/// The guard of a multi-key lock ([`lock_all`](crate::lock_all)) holds every key of its set:
/// [`key`](LockGuard::key) and [`fence`](LockGuard::fence) are the first key's (canonical
/// order), [`keys`](LockGuard::keys) and [`fences`](LockGuard::fences) every key's; it counts
/// as lost as soon as any key's lease is, and its release (or drop) releases every key.
#[must_use = "dropping the guard releases the lock at once"]
pub struct LockGuard {
    held: Arc<Held>,
    role: Role,
    active: bool,
    /// The other keys of a multi-key lock, in canonical order (empty for one key).
    more: Vec<LockGuard>,
}

/// How a guard came to hold its lock.
enum Role {
    /// Acquired from the engine; registered in `frame` when taken by a plain `acquire()` in a
    /// call chain. Its exit releases the lock.
    First { frame: Option<Arc<dyn Registry>> },
    /// Re-entered a hold of its call chain; `scope` is the frame of a scoped re-entry.
    Reentrant { scope: Option<u64> },
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut f = f.debug_struct("LockGuard");
        f.field("key", &self.held.key)
            .field("fence", &self.held.fence)
            .field("lost", &self.held.is_lost());
        if !self.more.is_empty() {
            f.field("keys", &self.keys());
            f.field("fences", &self.fences());
        }
        f.finish()
    }
}

impl LockGuard {
    /// The guard of a fresh acquisition (registered in `frame`, if any).
    pub(crate) fn first(held: Arc<Held>, frame: Option<Arc<dyn Registry>>) -> Self {
        Self {
            held,
            role: Role::First { frame },
            active: true,
            more: Vec::new(),
        }
    }

    /// The guard of a re-entry (scoped: it opened the frame `scope`).
    pub(crate) fn reentrant(held: Arc<Held>, scope: Option<u64>) -> Self {
        Self {
            held,
            role: Role::Reentrant { scope },
            active: true,
            more: Vec::new(),
        }
    }

    /// One guard over the guards of every key of a multi-key lock, in canonical order (at
    /// least one).
    pub(crate) fn over(mut guards: Vec<LockGuard>) -> Option<Self> {
        if guards.is_empty() {
            return None;
        }
        let mut first = guards.remove(0);
        first.more = guards;
        Some(first)
    }

    /// The holds of every key (one for a one-key lock), in canonical order.
    pub(crate) fn helds(&self) -> impl Iterator<Item = &Arc<Held>> {
        std::iter::once(&self.held).chain(self.more.iter().map(|g| &g.held))
    }

    /// The holds this guard acquired from the engine (not re-entered), in canonical order.
    pub(crate) fn fresh_holds(&self) -> impl DoubleEndedIterator<Item = &Arc<Held>> {
        std::iter::once(self)
            .chain(self.more.iter())
            .filter(|g| g.is_first())
            .map(|g| &g.held)
    }

    /// Whether this guard acquired from the engine (not a re-entry).
    pub(crate) fn is_first(&self) -> bool {
        matches!(self.role, Role::First { .. })
    }

    pub(crate) fn held(&self) -> &Arc<Held> {
        &self.held
    }

    /// The key (without the runtime's prefix).
    pub fn key(&self) -> &str {
        &self.held.key
    }

    /// Every key this guard holds, in canonical order (sorted, without duplicates): one for a
    /// plain lock, the whole set for a [`lock_all`](crate::lock_all).
    pub fn keys(&self) -> Vec<&str> {
        self.helds().map(|h| h.key.as_str()).collect()
    }

    /// The fencing token: greater than the token of every earlier holder of this key. Give it
    /// to the storage you write to, so that it can reject a stale holder. Reentrant guards
    /// carry the outer token. `None` only where the engine cannot guarantee the order.
    ///
    /// For a multi-key lock, the token of the first key in canonical order (the one
    /// [`key`](LockGuard::key) names); [`fences`](LockGuard::fences) gives every key's.
    pub fn fence(&self) -> Option<u64> {
        self.held.fence
    }

    /// The fencing token of every key, in the order of [`keys`](LockGuard::keys): each
    /// greater than the tokens of every earlier holder of that key. One entry for a plain
    /// lock.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), dlock_runtime::LockError> {
    /// # let rt = dlock_runtime::Runtime::from_url("memory://").await?;
    /// let guard = rt.lock_all(["b", "a", "b"]).acquire().await?;
    /// assert_eq!(guard.keys(), ["a", "b"]);
    /// let fences = guard.fences();
    /// assert_eq!(fences[0], guard.fence());
    /// # Ok(()) }
    /// ```
    pub fn fences(&self) -> Vec<Option<u64>> {
        self.helds().map(|h| h.fence).collect()
    }

    /// Resolves when the lease is known lost: the engine says the lock is no longer ours, or
    /// the lease ran out on the local clock without a confirmed renewal (with
    /// `watchdog(false)`: when the lease ends). Never resolves while the lock is safely held.
    /// For a multi-key lock: when the lease of any of its keys is.
    pub async fn lost(&self) {
        if self.more.is_empty() {
            return self.held.lost().wait().await;
        }
        any_lost(self.helds().map(|h| &**h.lost())).await;
    }

    /// How long the lock stays ours if no renewal succeeds from now on: the confirmed
    /// validity of the lease (for Redlock, the lease minus the time the acquisition took and
    /// the clock-drift allowance). Zero once lost. For a multi-key lock, the shortest of its
    /// keys'.
    pub fn valid_for(&self) -> Duration {
        self.helds()
            .map(|h| h.valid_for())
            .min()
            .unwrap_or_default()
    }

    /// Whether the lease is known lost (for a multi-key lock: the lease of any of its keys).
    pub fn is_lost(&self) -> bool {
        self.helds().any(|h| h.is_lost())
    }

    /// Releases this hold and waits for the engine's answer.
    ///
    /// Errors: [`LockError::Lost`] when the lease had been lost (the engine no longer had the
    /// lock as ours); [`LockError::Backend`] when the engine did not answer (the lock then
    /// expires with its lease).
    ///
    /// A multi-key guard releases every key at once, all of them even when one fails, and
    /// answers the first error in canonical order.
    pub async fn release(mut self) -> Result<(), LockError> {
        let more = std::mem::take(&mut self.more);
        if more.is_empty() {
            return self.release_one().await;
        }
        // Every key at once (their requests share the engine's connection).
        let releases = std::iter::once(self)
            .chain(more)
            .map(|guard| Box::pin(guard.release_one()))
            .collect();
        join_all(releases)
            .await
            .into_iter()
            .find(Result::is_err)
            .unwrap_or(Ok(()))
    }

    /// [`release`](LockGuard::release) of this guard's own key.
    async fn release_one(mut self) -> Result<(), LockError> {
        self.active = false;
        let held = self.held.clone();
        let exit = self.leave();
        if exit == Exit::Nothing {
            if held.passed() {
                return Ok(());
            }
            return if held.is_lost() {
                Err(LockError::Lost {
                    key: held.key.clone(),
                })
            } else {
                Ok(())
            };
        }
        // If this future is dropped before the engine answers (or the call fails), finish the
        // release in the background: owner-checked, so a no-op if it did land.
        let core = &held.core;
        let finish = ReleaseOnDrop::new(&core.releaser, &held.key, &held.owner, held.hold_until);
        let result = if exit == Exit::Extend {
            match extend_for_the_next(&held).await {
                Some(result) => result,
                None => {
                    finish.disarm();
                    return Ok(());
                }
            }
        } else {
            end_in_engine(
                core.backend.as_ref(),
                &held.key,
                &held.owner,
                held.hold_until,
            )
            .await
        };
        if result.is_ok() {
            finish.disarm();
        } else {
            drop(finish);
        }
        // The lease itself, not reentrant guards kept past this one (orphaned, not lost).
        if held.lease_lost() {
            // The lease had been lost while held (whatever the release found: what was left of
            // it, nothing, or an engine that expired the session): the caller must know its
            // critical section was not protected.
            core.hub.wake(&held.key);
            return Err(LockError::Lost {
                key: held.key.clone(),
            });
        }
        match result {
            Ok(Released::Freed) => {
                tracing::debug!(key = %held.key, "lock released");
                core.hub.wake(&held.key);
                Ok(())
            }
            Ok(Released::StillHeld) => Ok(()),
            Ok(Released::Kept) => {
                tracing::debug!(key = %held.key, "lock released; its key is kept until its hold ends");
                // Local waiters look again and wait for the hold's end, not the lease's.
                core.hub.wake(&held.key);
                Ok(())
            }
            Ok(Released::NotOwner) => {
                core.observer
                    .lost(&held.key, "the release found the lock no longer ours");
                core.hub.wake(&held.key);
                Err(LockError::Lost {
                    key: held.key.clone(),
                })
            }
            Err(err) => Err(err),
        }
    }

    /// Drops this guard's hold and says what the engine must be told: nothing (a re-entry, or
    /// the lock went to a waiter of this runtime, see `handoff`), a release, or a
    /// release that may keep the lock for the waiter next in line (its block of tokens used
    /// up; the watchdog entry stays until then).
    fn leave(&mut self) -> Exit {
        match &self.role {
            Role::First { frame } => {
                if let Some(frame) = frame {
                    frame.remove(&self.held);
                }
                self.held.end();
                let observer = &self.held.core.observer;
                if observer.timed() {
                    observer.released(&self.held.key, self.held.acquired_at.elapsed());
                }
                if handoff::pass(&self.held) {
                    self.held.mark_passed();
                    return Exit::Nothing;
                }
                if handoff::wants_extension(&self.held) {
                    return Exit::Extend;
                }
                self.held.unwatch();
                Exit::Release
            }
            Role::Reentrant { scope } => {
                self.held.leave(*scope);
                Exit::Nothing
            }
        }
    }
}

/// What the end of a guard asks of the engine (see [`LockGuard::leave`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Exit {
    Nothing,
    Release,
    Extend,
}

/// Ends `held`, whose block of tokens is used up while a waiter of this runtime wants it
/// next, in one round trip: the engine keeps it with a new block (then it is handed over,
/// `None`) unless another runtime waits (then it is released). Otherwise the release's answer.
async fn extend_for_the_next(held: &Held) -> Option<Result<Released, LockError>> {
    let core = &held.core;
    let lease = held.terms.lease;
    // Renewals stop until the engine answers; a new entry counts from this send.
    held.unwatch();
    let sent_at = Instant::now();
    match core
        .backend
        .release_or_extend(&held.key, &held.owner, lease)
        .await
    {
        Ok(Extension::Extended { last }) => {
            // Checked when the lock was requested; counting on nothing is the safe answer.
            let drift = core.backend.lease_margin(lease).unwrap_or(lease);
            let (id, _) =
                core.watchdog
                    .register(&held.key, &held.owner, lease, drift, true, sent_at, None);
            if handoff::pass_extended(held, last, id) {
                held.mark_passed();
                tracing::trace!(key = %held.key, "lock kept with a new block of fences for the next waiter");
                return None;
            }
            // The waiter left meanwhile.
            core.watchdog.unregister(id);
            Some(core.backend.release(&held.key, &held.owner).await)
        }
        Ok(Extension::Released(released)) => Some(Ok(released)),
        Err(err) => Some(Err(err)),
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.active {
            self.active = false;
            let exit = self.leave();
            if exit == Exit::Extend {
                // No waiting here: released in the background, the next holder attempts.
                self.held.unwatch();
            }
            if exit != Exit::Nothing {
                self.held.core.releaser.release_in_background(
                    self.held.key.clone(),
                    self.held.owner.clone(),
                    self.held.hold_until,
                );
            }
        }
    }
}

/// Runs every future of `futures` at once; their outputs in the same order.
async fn join_all<F: Future + Unpin>(futures: Vec<F>) -> Vec<F::Output> {
    let mut futures: Vec<(F, Option<F::Output>)> = futures.into_iter().map(|f| (f, None)).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (fut, out) in &mut futures {
            if out.is_none() {
                match std::pin::Pin::new(fut).poll(cx) {
                    Poll::Ready(value) => *out = Some(value),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    futures.into_iter().filter_map(|(_, out)| out).collect()
}
