//! The held lock: fence, lost signal, release (awaited or from `Drop`).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::LockError;
use crate::backend::{Extension, Released};
use crate::chain::Frame;
use crate::core::{ReleaseOnDrop, end_in_engine, release_in_background};
use crate::held::Held;

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
#[must_use = "dropping the guard releases the lock at once"]
pub struct LockGuard {
    held: Arc<Held>,
    role: Role,
    active: bool,
}

/// How a guard came to hold its lock.
enum Role {
    /// Acquired from the engine; registered in `frame` when taken by a plain `acquire()` in a
    /// call chain. Its exit releases the lock.
    First { frame: Option<Arc<Frame>> },
    /// Re-entered a hold of its call chain; `scope` is the frame of a scoped re-entry.
    Reentrant { scope: Option<u64> },
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("key", &self.held.key)
            .field("fence", &self.held.fence)
            .field("lost", &self.held.lost.is_lost())
            .finish()
    }
}

impl LockGuard {
    /// The guard of a fresh acquisition (registered in `frame`, if any).
    pub(crate) fn first(held: Arc<Held>, frame: Option<Arc<Frame>>) -> Self {
        Self {
            held,
            role: Role::First { frame },
            active: true,
        }
    }

    /// The guard of a re-entry (scoped: it opened the frame `scope`).
    pub(crate) fn reentrant(held: Arc<Held>, scope: Option<u64>) -> Self {
        Self {
            held,
            role: Role::Reentrant { scope },
            active: true,
        }
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

    /// The fencing token: greater than the token of every earlier holder of this key. Give it
    /// to the storage you write to, so that it can reject a stale holder. Reentrant guards
    /// carry the outer token. `None` only where the engine cannot guarantee the order.
    pub fn fence(&self) -> Option<u64> {
        self.held.fence
    }

    /// Resolves when the lease is known lost: the engine says the lock is no longer ours, or
    /// the lease ran out on the local clock without a confirmed renewal (with
    /// `watchdog(false)`: when the lease ends). Never resolves while the lock is safely held.
    pub async fn lost(&self) {
        self.held.lost.wait().await;
    }

    /// How long the lock stays ours if no renewal succeeds from now on: the confirmed
    /// validity of the lease (for Redlock, the lease minus the time the acquisition took and
    /// the clock-drift allowance). Zero once lost.
    pub fn valid_for(&self) -> Duration {
        self.held.lost.valid_for()
    }

    /// Whether the lease is known lost.
    pub fn is_lost(&self) -> bool {
        self.held.lost.is_lost()
    }

    /// Releases this hold and waits for the engine's answer.
    ///
    /// Errors: [`LockError::Lost`] when the lease had been lost (the engine no longer had the
    /// lock as ours); [`LockError::Backend`] when the engine did not answer (the lock then
    /// expires with its lease).
    pub async fn release(mut self) -> Result<(), LockError> {
        self.active = false;
        let held = self.held.clone();
        let exit = self.leave();
        if exit == Exit::Nothing {
            if held.passed() {
                return Ok(());
            }
            return if held.lost.is_lost() {
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
        let finish = ReleaseOnDrop::new(core, &held.key, &held.owner, held.hold_until);
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
        if held.lost.lease_lost() {
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
    /// the lock went to a waiter of this runtime, see [`crate::handoff`]), a release, or a
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
                if crate::handoff::pass(&self.held) {
                    self.held.mark_passed();
                    return Exit::Nothing;
                }
                if crate::handoff::wants_extension(&self.held) {
                    return Exit::Extend;
                }
                self.held.core.watchdog.unregister(self.held.watchdog_id);
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
    core.watchdog.unregister(held.watchdog_id);
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
                    .register(&held.key, &held.owner, lease, drift, true, sent_at);
            if crate::handoff::pass_extended(held, last, id) {
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
                self.held.core.watchdog.unregister(self.held.watchdog_id);
            }
            if exit != Exit::Nothing {
                release_in_background(
                    self.held.core.clone(),
                    self.held.key.clone(),
                    self.held.owner.clone(),
                    self.held.hold_until,
                );
            }
        }
    }
}
