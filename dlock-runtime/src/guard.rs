//! The held lock: fence, lost signal, release (awaited or from `Drop`).

use std::fmt;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use crate::LockError;
use crate::backend::Released;
use crate::chain::leave_chain;
use crate::core::{ReleaseOnDrop, release_in_background};
use crate::held::Held;

/// A held distributed lock.
///
/// Released by [`release`](LockGuard::release) (awaited, reports errors) or, if dropped
/// without it (early return, panic, cancellation), by a release scheduled on the runtime's
/// tokio handle right away, so the next waiter gets the lock within milliseconds rather than
/// after the lease.
///
/// Guards of reentrant acquisitions share one hold in the engine: only the last one out
/// releases it.
#[must_use = "dropping the guard releases the lock at once"]
pub struct LockGuard {
    held: Arc<Held>,
    /// Registered in the call chain of the task that acquired it.
    in_chain: bool,
    active: bool,
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
    pub(crate) fn new(held: Arc<Held>, in_chain: bool) -> Self {
        Self {
            held,
            in_chain,
            active: true,
        }
    }

    /// Runs `fut` until it completes (`Some`) or the lease is known lost (`None`, `fut`
    /// dropped). Watches the lost signal only once `fut` has to wait, so a body that completes
    /// at once costs nothing extra.
    pub(crate) async fn run_unless_lost<F: std::future::Future>(
        &self,
        fut: F,
    ) -> Option<F::Output> {
        let signal = &self.held.lost;
        tokio::pin!(fut);
        let mut watching = None;
        std::future::poll_fn(|cx| {
            if signal.is_lost() {
                return Poll::Ready(None);
            }
            if let Poll::Ready(out) = fut.as_mut().poll(cx) {
                return Poll::Ready(Some(out));
            }
            let lost = watching.get_or_insert_with(|| signal.watch());
            if lost.as_mut().poll(cx).is_ready() || signal.is_lost() {
                return Poll::Ready(None);
            }
            Poll::Pending
        })
        .await
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
        if !self.leave() {
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
        let finish = ReleaseOnDrop::new(core, &held.key, &held.owner);
        let result = core.backend.release(&held.key, &held.owner).await;
        if result.is_ok() {
            finish.disarm();
        } else {
            drop(finish);
        }
        if held.lost.is_lost() {
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
            Ok(Released::NotOwner) => {
                tracing::warn!(key = %held.key, "release found the lock no longer ours: the lease was lost");
                core.hub.wake(&held.key);
                Err(LockError::Lost {
                    key: held.key.clone(),
                })
            }
            Err(err) => Err(err),
        }
    }

    /// Drops this guard's hold; `true` when it was the last (the engine must be told).
    fn leave(&mut self) -> bool {
        if self.in_chain {
            leave_chain(&self.held);
        }
        let last = self.held.drop_hold();
        if last {
            self.held.core.watchdog.unregister(self.held.watchdog_id);
        }
        last
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.active {
            self.active = false;
            if self.leave() {
                release_in_background(
                    self.held.core.clone(),
                    self.held.key.clone(),
                    self.held.owner.clone(),
                );
            }
        }
    }
}
